"""LayerNorm written out (level 4 swaps in a fused kernel through ``Kernels.layer_norm``)."""

from __future__ import annotations

import torch
from torch import nn

from ..common.config import TransformerConfig
from .parameters import fetch


class LayerNorm(nn.Module):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis: ``(..., D) -> (..., D)``.

    Reads ``{prefix}weight`` and, when ``config.bias``, ``{prefix}bias``; the
    state-dict names are ``weight`` and ``bias``, as in ``nn.LayerNorm``.
    """

    def __init__(
        self, config: TransformerConfig, params, *, prefix: str = "", device=None, dtype=None
    ):
        super().__init__()
        D = config.d_model
        self.eps = config.norm_eps
        self.weight = fetch(params, f"{prefix}weight", (D,), device=device, dtype=dtype)
        if config.bias:
            self.bias = fetch(params, f"{prefix}bias", (D,), device=device, dtype=dtype)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in at least float32: a half-precision sum of D squares loses
        # digits fast. The variance is the biased one (divide by D), as nn.LayerNorm.
        acc = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(acc)  # (..., D)
        mean = xf.mean(dim=-1, keepdim=True)  # (..., 1)
        centred = xf - mean  # (..., D)
        var = (centred * centred).mean(dim=-1, keepdim=True)  # (..., 1)
        y = centred * torch.rsqrt(var + self.eps) * self.weight  # (..., D)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)
