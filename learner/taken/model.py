"""Stage 7, the decoder: level 1's, taken by ``ladder rung new --take decoder``.

The model runs level 1's pass with this rung's blocks, cache and arithmetic. To write
your own, add the method ``ladder rung new`` writes here (docs/your_rung.md, stage 7).
"""

from levels.level1_numpy import models as level1

from . import ops
from .block import EncoderLayer
from .cache import KVCache


class DecoderOnlyTransformer(level1.DecoderOnlyTransformer):
    """Level 1's decoder-only model, with this rung's blocks, cache and arithmetic."""

    ops = ops
    Block = EncoderLayer
    Cache = KVCache
