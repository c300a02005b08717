"""Level 1's classes: level 0's architecture, computing with numpy.

Each class is level 0's (``levels/level0_loops/layers.py`` and ``models.py``)
with one line changed: ``ops`` is this level's numpy module instead of level
0's loops, and every module hands it down to the modules it builds. That is
the whole difference between the two rungs above the arithmetic, in the same
way that level 3 is level 2 with its ``kernels`` swapped. The two models add
training (``parameters()`` and ``loss_and_grads``, from ``training.py``).
"""

from __future__ import annotations

from ..level0_loops import layers as level0_layers
from ..level0_loops import models as level0_models
from . import ops
from .training import DecoderOnlyTraining, Seq2SeqTraining


class LayerNorm(level0_layers.LayerNorm):
    __doc__ = level0_layers.LayerNorm.__doc__
    ops = ops


class RMSNorm(level0_layers.RMSNorm):
    __doc__ = level0_layers.RMSNorm.__doc__
    ops = ops


class FeedForward(level0_layers.FeedForward):
    __doc__ = level0_layers.FeedForward.__doc__
    ops = ops


class MultiHeadAttention(level0_layers.MultiHeadAttention):
    __doc__ = level0_layers.MultiHeadAttention.__doc__
    ops = ops


class EncoderLayer(level0_layers.EncoderLayer):
    __doc__ = level0_layers.EncoderLayer.__doc__
    ops = ops


class DecoderLayer(level0_layers.DecoderLayer):
    __doc__ = level0_layers.DecoderLayer.__doc__
    ops = ops


class DecoderOnlyTransformer(DecoderOnlyTraining, level0_models.DecoderOnlyTransformer):
    """Level 0's decoder-only transformer in numpy, plus ``parameters()`` and
    ``loss_and_grads(inputs, targets)`` (the hand-written backward of ``backward.py``)."""

    ops = ops


class Seq2SeqTransformer(Seq2SeqTraining, level0_models.Seq2SeqTransformer):
    """Level 0's encoder-decoder transformer in numpy, plus ``parameters()`` and
    ``loss_and_grads(src, tgt_in, tgt_out)`` (the hand-written backward of ``backward.py``)."""

    ops = ops
