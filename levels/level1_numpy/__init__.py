"""Level 1: the same transformer, vectorised with numpy, and trained with a hand-written backward.

What it adds over level 0: speed, by turning each loop nest into one array
operation (``x @ W.T`` instead of a dot product per output, one batched
``(B,H,T,S)`` score tensor instead of a softmax per query row), and training.
Only the arithmetic changes, so only the arithmetic is new here:

* ``ops.py``: level 0's primitives in numpy, with shape comments;
* ``convert.py``: ``asarray`` / ``to_numpy`` (float64 by default, ``dtype=np.float32`` accepted);
* ``backward.py``: the gradient of every op, derived in comments, recorded on a
  ``Tape`` that is itself an ops namespace;
* ``training.py``: the masked cross-entropy and ``loss_and_grads`` on both models;
* ``optim.py``: AdamW and global-norm clipping, as ``torch.optim.AdamW`` and
  ``torch.nn.utils.clip_grad_norm_`` compute them.

The architecture (pieces, models, the KV cache, incremental decoding) is level
0's, bound to these ops by ``levels.level0_loops.bind``; the models add
``parameters()`` and ``loss_and_grads``. On float64 inputs this level is the
reference at sizes level 0 is too slow for. ``config.dropout`` is not applied
(and training refuses a config with dropout). The chapter is docs/level1_numpy.md.
"""

from __future__ import annotations

from ..level0_loops.bind import INTERFACE, bind
from ..level0_loops.models import KVCache
from . import convert, ops
from .backward import attention_grads
from .convert import asarray, to_numpy
from .ops import attention
from .training import DecoderOnlyTraining, Seq2SeqTraining

# LayerNorm, FeedForward, MultiHeadAttention, EncoderLayer, DecoderLayer:
# the architecture computing with this level's ops.
_bound = bind(ops, convert, __name__)
globals().update(_bound)


class DecoderOnlyTransformer(DecoderOnlyTraining, _bound["DecoderOnlyTransformer"]):
    __doc__ = _bound["DecoderOnlyTransformer"].__doc__ + (
        "\n    Level 1 adds ``parameters()`` and ``loss_and_grads(inputs, targets)``.\n"
    )


class Seq2SeqTransformer(Seq2SeqTraining, _bound["Seq2SeqTransformer"]):
    __doc__ = _bound["Seq2SeqTransformer"].__doc__ + (
        "\n    Level 1 adds ``parameters()`` and ``loss_and_grads(src, tgt_in, tgt_out)``.\n"
    )


def describe() -> str:
    return "numpy (vectorised), float64 by default; hand-written backward"


__all__ = [*INTERFACE, "KVCache", "asarray", "attention", "attention_grads", "describe", "to_numpy"]
