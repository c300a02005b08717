"""A rung of the attention ladder, written by you, in numpy (float64 unless asked).

Write the stages in this order, each in its own file, and after each one run the ladder's
own test suite on this folder: ``ladder rung test <this folder>`` (docs/your_rung.md
walks through every stage, and says what the suite answers at each):

1. ``attention.py``  ``attention(q, k, v, *, causal, mask, scale)``
2. ``softmax.py``    ``softmax(scores)``, and the row that sees no key
3. ``rope.py``       ``rope(x, positions, base)``
4. ``norms.py``      ``layer_norm``, ``rms_norm``
5. ``block.py``      ``MultiHeadAttention.__call__``, ``EncoderLayer.__call__``
6. ``cache.py``      ``KVCache.extend``, ``KVCache.update``
7. ``model.py``      ``DecoderOnlyTransformer.transformer``

A stage not written raises ``NotImplementedError`` and the suite skips it. A stage you
would rather not write can be level 1's: the end of each file says how, and
``ladder rung new DIR --take rope,norms`` writes those files so. Nothing to write here:
this file names what a rung offers the suite and the bench (docs/conventions.md, "A
learner's rung"), level 1's pieces computing with your functions (``ops.py``).
"""

from levels.common.facts import Facts
from levels.level1_numpy import models as level1

from . import ops
from .attention import attention
from .block import EncoderLayer, MultiHeadAttention
from .cache import KVCache
from .model import DecoderOnlyTransformer
from .norms import layer_norm, rms_norm
from .ops import asarray, attend, to_numpy
from .rope import rope
from .softmax import softmax

# What the suite and the bench read about this rung, as about every level.
FACTS = Facts(
    array="numpy",
    gradients=None,  # inference only
    interpreted=False,
    dtypes=("float64", "float32"),
    devices=("cpu",),
    description="a learner's rung: numpy, level 1's pieces computing with the learner's functions",
)
describe = FACTS.describe


class LayerNorm(level1.LayerNorm):
    """Level 1's ``LayerNorm`` piece, computing with your ``layer_norm``."""

    ops = ops


class RMSNorm(level1.RMSNorm):
    """Level 1's ``RMSNorm`` piece, computing with your ``rms_norm``."""

    ops = ops


class FeedForward(level1.FeedForward):
    """Level 1's feed-forward piece (its GELU, SwiGLU and GeGLU are level 1's)."""

    ops = ops
