"""Level 1: the same transformer, vectorised with numpy, and trained with a hand-written backward.

What it adds over level 0: speed, by turning each loop nest into one array
operation (``x @ W.T`` instead of a dot product per output, one batched
``(B,H,T,S)`` score tensor instead of a softmax per query row), and training.
Only the arithmetic changes, so only the arithmetic is new here:

* ``ops.py``: level 0's primitives in numpy, with shape comments;
* ``models.py``: ``LayerNorm``, ``RMSNorm``, ``FeedForward``, ``MultiHeadAttention``,
  ``EncoderLayer``, ``DecoderLayer``, ``DecoderOnlyTransformer`` and
  ``Seq2SeqTransformer``: level 0's classes with ``ops`` set to ``ops.py``;
* ``convert.py``: ``asarray`` / ``to_numpy`` (float64 by default, ``dtype=np.float32`` accepted);
* ``backward.py``: the gradient of every op, derived in comments, recorded on a
  ``Tape`` that is itself an ops namespace;
* ``training.py``: the masked cross-entropy and ``loss_and_grads`` on both models;
* ``optim.py``: AdamW and global-norm clipping, as ``torch.optim.AdamW`` and
  ``torch.nn.utils.clip_grad_norm_`` compute them.

On float64 inputs this level is the reference at sizes level 0 is too slow
for. ``config.dropout`` is not applied (and training refuses a config with
dropout). The chapter is docs/level1_numpy.md.
"""

from __future__ import annotations

from ..common.facts import Facts
from ..level0_loops.models import KVCache
from . import optim
from .backward import attention_grads
from .convert import asarray, to_numpy
from .models import (
    DecoderLayer,
    DecoderOnlyTransformer,
    EncoderLayer,
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    RMSNorm,
    Seq2SeqTransformer,
)
from .ops import attend, attention, merge_attention

# What the harness and the tests read about this level (docs/conventions.md, "Levels").
FACTS = Facts(
    array="numpy",
    gradients="hand-written",  # backward.py; models.loss_and_grads, attention_grads, optim
    interpreted=False,
    dtypes=("float64", "float32", "float16"),  # numpy has no bfloat16
    devices=("cpu",),
    description="numpy (vectorised), float64 by default; hand-written backward",
)
describe = FACTS.describe
