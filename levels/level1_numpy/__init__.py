"""Level 1: the same transformer, vectorised with numpy.

What it adds over level 0: speed, by turning each loop nest into one array
operation (``x @ W.T`` instead of a dot product per output, one batched
``(B,H,T,S)`` score tensor instead of a softmax per query row). Only the
arithmetic changes, so only the arithmetic is new here:

* ``ops.py``: level 0's primitives in numpy, with shape comments;
* ``convert.py``: ``asarray`` / ``to_numpy`` (float64 by default, ``dtype=np.float32`` accepted).

The architecture (pieces, models, the KV cache, incremental decoding) is level
0's, bound to these ops by ``levels.level0_loops.bind``. On float64 inputs this
level is the reference at sizes level 0 is too slow for. Inference only:
``config.dropout`` is not applied. The chapter is docs/level1_numpy.md.
"""

from __future__ import annotations

from ..level0_loops.bind import INTERFACE, bind
from ..level0_loops.models import KVCache
from . import convert, ops
from .convert import asarray, to_numpy
from .ops import attention

# LayerNorm, FeedForward, MultiHeadAttention, EncoderLayer, DecoderLayer,
# DecoderOnlyTransformer and Seq2SeqTransformer: the architecture computing with this level's ops.
globals().update(bind(ops, convert, __name__))


def describe() -> str:
    return "numpy (vectorised), float64 by default"


__all__ = [*INTERFACE, "KVCache", "asarray", "attention", "describe", "to_numpy"]
