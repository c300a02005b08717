"""Level-agnostic pieces: configuration, canonical parameters, input checks,
the greedy generation loop, toy tasks and length bucketing.

Nothing here does a level's arithmetic; every level imports from here so that
names, shapes and errors are identical up and down the ladder.
"""

from .config import TransformerConfig
from .params import check_params, init_params, param_shapes

__all__ = ["TransformerConfig", "check_params", "init_params", "param_shapes"]
