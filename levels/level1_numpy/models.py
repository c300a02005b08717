"""Level 1's classes: level 0's architecture, computing with numpy.

Each class is level 0's (``levels/level0_loops/layers.py`` and ``models.py``)
with one line changed: ``ops`` is this level's numpy module instead of level
0's loops, and every module hands it down to the modules it builds. That is
the whole difference between the two rungs above the arithmetic, in the same
way that level 3 is level 2 with its ``kernels`` swapped. The two models add
training (``parameters()`` and ``loss_and_grads``, from ``training.py``).
"""

from __future__ import annotations

from ..level0_loops import layers as loops
from ..level0_loops import models as loop_models
from . import ops
from .training import DecoderOnlyTraining, Seq2SeqTraining


class LayerNorm(loops.LayerNorm):
    __doc__ = loops.LayerNorm.__doc__
    ops = ops


class RMSNorm(loops.RMSNorm):
    __doc__ = loops.RMSNorm.__doc__
    ops = ops


class FeedForward(loops.FeedForward):
    __doc__ = loops.FeedForward.__doc__
    ops = ops


class MultiHeadAttention(loops.MultiHeadAttention):
    __doc__ = loops.MultiHeadAttention.__doc__
    ops = ops


class EncoderLayer(loops.EncoderLayer):
    __doc__ = loops.EncoderLayer.__doc__
    ops = ops


class DecoderLayer(loops.DecoderLayer):
    __doc__ = loops.DecoderLayer.__doc__
    ops = ops


class DecoderOnlyTransformer(DecoderOnlyTraining, loop_models.DecoderOnlyTransformer):
    """Level 0's decoder-only transformer in numpy, plus ``parameters()`` and
    ``loss_and_grads(inputs, targets)`` (the hand-written backward of ``backward.py``)."""

    ops = ops


class Seq2SeqTransformer(Seq2SeqTraining, loop_models.Seq2SeqTransformer):
    """Level 0's encoder-decoder transformer in numpy, plus ``parameters()`` and
    ``loss_and_grads(src, tgt_in, tgt_out)`` (the hand-written backward of ``backward.py``)."""

    ops = ops
