"""The boundary between canonical numpy arrays and level 1's arrays (also numpy).

Level 1 computes in the float dtype of its arrays: float64 by default (the
reference at sizes level 0 is too slow for), float32 when asked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..level0_loops.convert import check_device

DEFAULT_DTYPE = np.float64


def asarray(np_array: Any, *, device: object = None, dtype: object = None) -> np.ndarray:
    """A numpy array: floats as ``dtype`` (default float64), integers as int64, bools kept.

    Like ``np.asarray``, an array that already has the wanted dtype comes back
    as it is, not copied: the pieces read their parameters this way, so a model
    and the parameter dict it owns (``model.parameters()``) share memory and an
    optimiser's in-place update is what the next forward sees. The models copy
    the caller's dict once, so training never writes into it.
    """
    check_device(device)
    arr = np.asarray(np_array)
    if arr.dtype.kind == "f":
        dtype = np.dtype(DEFAULT_DTYPE if dtype is None else dtype)
        if dtype.kind != "f":
            raise ValueError(f"dtype must be a floating type, got {dtype}")
        return arr.astype(dtype, copy=False)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=False)
    if arr.dtype.kind == "b":
        return arr
    raise TypeError(f"cannot convert an array of dtype {arr.dtype} for level 1")


def to_numpy(x: np.ndarray) -> np.ndarray:
    return np.asarray(x)


__all__ = ["asarray", "check_device", "to_numpy"]
