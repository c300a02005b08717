"""The arithmetic this rung's pieces compute with: level 1's, with your functions in place.

Level 0's classes call their arithmetic by name through ``self.ops`` (``ops.linear``,
``ops.attend``, ``ops.rope``, ...); level 1 is those classes with ``ops`` set to numpy's
functions, and this rung is level 1's classes with ``ops`` set to this module: level 1's
numpy for what the stages do not ask of you, yours for the rest. Nothing to write here.
"""

from levels.level1_numpy.ops import (  # level 1's: the pieces no stage asks you to write
    add,
    asarray,
    at_positions,
    concat,
    embed,
    gelu,
    gelu_tanh,
    inference,
    last_position,
    last_slots,
    linear,
    merge_heads,
    mul,
    next_positions,
    prefix,
    silu,
    split_heads,
    to_numpy,
    visible,
    zero_padded,
)

from .attention import attention as attend  # what the blocks call: your attention
from .norms import layer_norm, rms_norm
from .rope import rope
from .softmax import softmax
