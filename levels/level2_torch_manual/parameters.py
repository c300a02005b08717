"""Turning canonical numpy parameters into ``nn.Parameter``s under their canonical names."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from .arrays import DEFAULT_DTYPE


def fetch(
    params: Mapping[str, object], name: str, shape: tuple[int, ...], *, device=None, dtype=None
) -> nn.Parameter:
    """``params[name]`` as a fresh parameter (a copy: training never writes into ``params``).

    A missing or mis-shaped entry is a ``ValueError`` naming it; the models
    check the whole dict up front with ``check_params``, the pieces rely on this.
    """
    if name not in params:
        raise ValueError(f"bad parameters: missing: {name}")
    value = torch.as_tensor(params[name])
    if value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"bad parameters: not real numbers: {name} ({value.dtype})")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(
            f"bad parameters: mis-shaped: {name}: expected {tuple(shape)}, got {tuple(value.shape)}"
        )
    return nn.Parameter(value.to(device=device, dtype=dtype or DEFAULT_DTYPE, copy=True))


def linear(
    params: Mapping[str, object],
    prefix: str,
    n_out: int,
    n_in: int,
    *,
    bias: bool,
    device=None,
    dtype=None,
) -> nn.Linear:
    """An ``nn.Linear`` (``x @ W.T + b``) loaded from ``{prefix}weight (n_out, n_in)`` and ``{prefix}bias``."""
    layer = nn.Linear(n_in, n_out, bias=bias, device="meta")  # no throwaway init
    layer.weight = fetch(params, f"{prefix}weight", (n_out, n_in), device=device, dtype=dtype)
    if bias:
        layer.bias = fetch(params, f"{prefix}bias", (n_out,), device=device, dtype=dtype)
    return layer
