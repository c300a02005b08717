"""Level 0: the transformer in pure Python (nested lists of floats, ``math``, loops).

What it adds: the ladder's first rung and its exact reference. Every number is
a Python float (IEEE float64) and every step is a loop you can read, so at tiny
sizes this level is the ground truth the faster levels are checked against.
It is slow by design. Inference only: ``config.dropout`` is not applied.

How it is built (docs/level0_loops.md tells the story):

* ``ops.py``: the array primitives (``linear``, ``layer_norm``, ``gelu``,
  ``rope``, ``attention``, ``split_heads``, ...) on nested lists, importing only
  the standard library;
* ``pieces.py`` and ``models.py``: the architecture (``MultiHeadAttention``,
  ``EncoderLayer``, ``DecoderLayer``, both models, the KV cache), written against
  an ops namespace so that level 1 reuses it unchanged with numpy ops;
* ``bind.py``: makes the classes of a level by attaching its ops;
* ``convert.py``: ``asarray`` / ``to_numpy``, the only module here that imports numpy.
"""

from __future__ import annotations

from . import convert, ops
from .bind import INTERFACE, bind
from .convert import asarray, to_numpy
from .models import KVCache
from .ops import attention

# LayerNorm, FeedForward, MultiHeadAttention, EncoderLayer, DecoderLayer,
# DecoderOnlyTransformer and Seq2SeqTransformer: the architecture computing with this level's ops.
globals().update(bind(ops, convert, __name__))


def describe() -> str:
    return "pure Python loops over nested lists, float64"


__all__ = [*INTERFACE, "KVCache", "asarray", "attention", "describe", "to_numpy"]
