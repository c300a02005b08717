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

from ..level0_loops.bind import bind
from ..level0_loops.models import KVCache
from . import convert, ops
from .convert import asarray, to_numpy
from .ops import attention

_classes = bind(ops, convert, __name__)
LayerNorm = _classes.LayerNorm
FeedForward = _classes.FeedForward
MultiHeadAttention = _classes.MultiHeadAttention
EncoderLayer = _classes.EncoderLayer
DecoderLayer = _classes.DecoderLayer
DecoderOnlyTransformer = _classes.DecoderOnlyTransformer
Seq2SeqTransformer = _classes.Seq2SeqTransformer


def describe() -> str:
    return "numpy (vectorised), float64 by default"


__all__ = [
    "DecoderLayer",
    "DecoderOnlyTransformer",
    "EncoderLayer",
    "FeedForward",
    "KVCache",
    "LayerNorm",
    "MultiHeadAttention",
    "Seq2SeqTransformer",
    "asarray",
    "attention",
    "describe",
    "to_numpy",
]
