"""Level 0: the transformer in pure Python (nested lists of floats, ``math``, loops).

What it adds: the ladder's first rung and its exact reference. Every number is
a Python float (IEEE float64) and every step is a loop you can read, so at tiny
sizes this level is the ground truth the faster levels are checked against.
It is slow by design. Inference only: ``config.dropout`` is not applied.

Where to read it (docs/level0_loops.md tells the story):

* ``ops.py``: the arithmetic (``linear``, ``layer_norm``, ``gelu``, ``rope``,
  ``attention``, ``split_heads``, ...) on nested lists, standard library only;
* ``layers.py``: ``LayerNorm``, ``RMSNorm``, ``FeedForward``, ``MultiHeadAttention``,
  ``EncoderLayer``, ``DecoderLayer``, computing through ``self.ops``;
* ``models.py``: ``DecoderOnlyTransformer``, ``Seq2SeqTransformer`` and the
  ``KVCache``; their public methods check the inputs;
* ``convert.py``: ``asarray`` / ``to_numpy``, the only module here that imports numpy.

Level 1 subclasses these classes with numpy's ops: the architecture is
written once, here.
"""

from __future__ import annotations

from ..common.facts import Facts
from .convert import asarray, to_numpy
from .layers import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    RMSNorm,
)
from .models import DecoderOnlyTransformer, KVCache, Seq2SeqTransformer
from .ops import attend, attention, merge_attention

# What the harness and the tests read about this level (docs/conventions.md, "Levels").
FACTS = Facts(
    array="python",  # nested lists of Python floats, ints and bools
    gradients=None,  # inference only: no backward pass
    interpreted=False,
    dtypes=("float64",),  # every float is a Python float
    devices=("cpu",),  # the Python interpreter
    description="pure Python loops over nested lists, float64",
)
describe = FACTS.describe
