"""Stage 5, the block: level 1's, taken by ``ladder rung new --take block``.

The classes run level 1's calls with this rung's arithmetic (your attention, RoPE and
norms). To write your own, add the two ``__call__`` methods ``ladder rung new`` writes
here (docs/your_rung.md, stage 5).
"""

from levels.level1_numpy import models as level1

from . import ops


class MultiHeadAttention(level1.MultiHeadAttention):
    """Level 1's self-attention, computing with this rung's arithmetic."""

    ops = ops


class EncoderLayer(level1.EncoderLayer):
    """Level 1's pre-norm block, computing with this rung's arithmetic."""

    ops = ops
    Attention = MultiHeadAttention
