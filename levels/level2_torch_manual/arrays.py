"""Converters between numpy and torch, the level's native array type."""

from __future__ import annotations

import numpy as np
import torch

DEFAULT_DTYPE = torch.float32  # the torch levels compute in float32 unless told otherwise


def asarray(np_array, *, device=None, dtype=None) -> torch.Tensor:
    """A numpy array (or anything ``np.asarray`` accepts) as a torch tensor on ``device``.

    Integer and boolean arrays keep their kind, so token ids stay integers and
    masks stay boolean; ``dtype`` (default float32) applies to floating arrays
    only. Complex and other dtypes are a ``TypeError`` (nothing is silently
    dropped). The result never shares memory with the input.
    """
    array = np.asarray(np_array)
    if array.dtype.kind in "biu":
        return torch.as_tensor(array).to(device=device, copy=True)
    if array.dtype.kind != "f":
        raise TypeError(f"the torch levels hold real numbers; cannot convert dtype {array.dtype}")
    return torch.as_tensor(array).to(device=device, dtype=dtype or DEFAULT_DTYPE, copy=True)


def to_numpy(x) -> np.ndarray:
    """A tensor back to numpy (detached, on the CPU). bfloat16, which numpy lacks, comes back as float32."""
    if not isinstance(x, torch.Tensor):
        return np.asarray(x)
    x = x.detach().cpu()
    if x.dtype == torch.bfloat16:
        x = x.float()
    return x.numpy()


def dtype_kind(dtype: torch.dtype) -> str:
    """numpy's one-letter kind of a torch dtype: ``b`` bool, ``i``/``u`` integer, ``f``, ``c``."""
    if dtype == torch.bool:
        return "b"
    if dtype.is_complex:
        return "c"
    if dtype.is_floating_point:
        return "f"
    return "u" if dtype == torch.uint8 else "i"
