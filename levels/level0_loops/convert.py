"""The boundary between numpy and level 0's nested Python lists.

This is the only module of level 0 that imports numpy: the arithmetic in
``ops.py`` sees nothing but lists, floats, ints and bools.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Nested = Any  # nested lists of float / int / bool, or one such scalar


def check_device(device: object) -> None:
    """Level 0 runs on the CPU in the Python interpreter; ``None`` and ``"cpu"`` mean that."""
    if device not in (None, "cpu"):
        raise ValueError(f"level 0 runs on the CPU only; got device={device!r}")


def asarray(np_array: Any, *, device: object = None, dtype: object = None) -> Nested:
    """A numpy array (or anything ``np.asarray`` accepts) as nested Python lists.

    Floats become Python floats (float64), integers Python ints, booleans
    Python bools, so token ids stay integers and masks stay boolean. Level 0
    computes in float64 only, so ``dtype`` must be ``None``.
    """
    check_device(device)
    if dtype is not None:
        raise ValueError(f"level 0 computes in float64 only; dtype must be None, got {dtype!r}")
    arr = np.asarray(np_array)
    # copy=False: a float64 array is read as it is (a real model's 262k x 640 embedding
    # would otherwise be copied, 1.3 GB, on its way to becoming Python floats).
    if arr.dtype.kind == "f":
        arr = arr.astype(np.float64, copy=False)
    elif arr.dtype.kind in "iu":
        arr = arr.astype(np.int64, copy=False)
    elif arr.dtype.kind != "b":
        raise TypeError(
            f"level 0 holds floats, integers and booleans; cannot convert dtype {arr.dtype}"
        )
    return arr.tolist()


def to_numpy(x: Nested) -> np.ndarray:
    """Nested lists back to numpy: float64, int64 or bool, as the leaves are.

    A ragged nested list (rows of different lengths) is a ``ValueError``.
    """
    try:
        return np.asarray(x)
    except ValueError as exc:  # numpy: "setting an array element with a sequence" / inhomogeneous
        raise ValueError(f"not a rectangular array (rows of different lengths?): {exc}") from None
