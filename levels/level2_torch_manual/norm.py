"""LayerNorm and RMSNorm written out (level 4 swaps in fused kernels through ``Kernels``)."""

from __future__ import annotations

import torch
from torch import nn

from ..common.config import TransformerConfig
from .parameters import fetch


def _statistics_dtype(x: torch.Tensor) -> torch.Tensor:
    """``x`` in at least float32: float16 and bfloat16 promoted, float32 and float64 as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)


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
        if config.has_norm_bias:
            self.bias = fetch(params, f"{prefix}bias", (D,), device=device, dtype=dtype)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in at least float32: a half-precision sum of D squares loses
        # digits fast. The variance is the biased one (divide by D), as nn.LayerNorm.
        xf = _statistics_dtype(x)  # (..., D)
        mean = xf.mean(dim=-1, keepdim=True)  # (..., 1)
        centred = xf - mean  # (..., D)
        var = (centred * centred).mean(dim=-1, keepdim=True)  # (..., 1)
        y = centred * torch.rsqrt(var + self.eps) * self.weight  # (..., D)
        if self.bias is not None:
            y = y + self.bias
        return y if y.dtype == x.dtype else y.to(x.dtype)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis: ``(..., D) -> (..., D)``.

    Reads ``{prefix}weight``; no bias and no centring (Zhang & Sennrich 2019), as
    Llama, Mistral and Qwen2 use it. The state-dict name is ``weight``.
    """

    def __init__(
        self, config: TransformerConfig, params, *, prefix: str = "", device=None, dtype=None
    ):
        super().__init__()
        self.eps = config.norm_eps
        self.weight = fetch(
            params, f"{prefix}weight", (config.d_model,), device=device, dtype=dtype
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The mean of squares in at least float32, as LayerNorm's statistics above.
        xf = _statistics_dtype(x)  # (..., D)
        y = xf * torch.rsqrt((xf * xf).mean(dim=-1, keepdim=True) + self.eps) * self.weight
        return y if y.dtype == x.dtype else y.to(x.dtype)  # (..., D)
