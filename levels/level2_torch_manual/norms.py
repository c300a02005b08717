"""LayerNorm and RMSNorm, written out, with their statistics in at least float32.

Levels 3 and 4 swap in fused ones (``Kernels.layer_norm``, ``Kernels.rms_norm``)
with these parameters and state dicts.
"""

from __future__ import annotations

import torch
from torch import nn

from ..common.config import TransformerConfig
from .arrays import fetch


def _statistics_dtype(x: torch.Tensor) -> torch.Tensor:
    """``x`` in at least float32: float16 and bfloat16 promoted, float32 and float64 as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)


class _Norm(nn.Module):
    """What both norms share: ``eps``, ``weight (N,)`` from ``{prefix}weight`` and the gain.

    ``N`` is ``width``: ``D`` by default, ``Dh`` for QK-norm. The gain is ``weight``, or
    ``norm_weight_offset + weight`` (Gemma's gains are offsets from 1), which is added
    in the statistics' dtype, as transformers adds Gemma's 1 in float32.
    """

    def __init__(
        self,
        config: TransformerConfig,
        params,
        *,
        prefix: str = "",
        width: int | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.width = config.d_model if width is None else width
        # option norm_weight_offset: the gain is offset + weight (Gemma stores offsets from 1)
        self.eps, self.offset = config.norm_eps, config.norm_weight_offset
        self.weight = fetch(params, f"{prefix}weight", (self.width,), device=device, dtype=dtype)

    def gain(self, dtype: torch.dtype) -> torch.Tensor:
        """``weight``, or ``offset + weight``, in ``dtype`` (the statistics' dtype): ``(N,)``."""
        weight = self.weight.to(dtype)  # the parameter itself when it has that dtype
        return weight if self.offset == 0.0 else self.offset + weight


class LayerNorm(_Norm):
    """``(x - mean) / sqrt(var + eps) * gain + bias`` over the last axis: ``(..., N) -> (..., N)``.

    Reads ``{prefix}weight`` and, when ``config.bias``, ``{prefix}bias``; the
    state-dict names are ``weight`` and ``bias``, as in ``nn.LayerNorm``.
    """

    def __init__(self, config: TransformerConfig, params, *, prefix: str = "", **kw):
        super().__init__(config, params, prefix=prefix, **kw)  # width, device, dtype
        if config.has_norm_bias:  # on the weight's device, in its dtype
            w = self.weight
            self.bias = fetch(
                params, f"{prefix}bias", (self.width,), device=w.device, dtype=w.dtype
            )
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in at least float32: a half-precision sum of D squares loses
        # digits fast. The variance is the biased one (divide by D), as nn.LayerNorm.
        xf = _statistics_dtype(x)  # (..., N)
        mean = xf.mean(dim=-1, keepdim=True)  # (..., 1)
        centred = xf - mean  # (..., N)
        var = (centred * centred).mean(dim=-1, keepdim=True)  # (..., 1)
        y = centred * torch.rsqrt(var + self.eps) * self.gain(xf.dtype)  # (..., N)
        if self.bias is not None:
            y = y + self.bias
        return y if y.dtype == x.dtype else y.to(x.dtype)


class RMSNorm(_Norm):
    """``x / sqrt(mean(x^2) + eps) * gain`` over the last axis: ``(..., N) -> (..., N)``.

    Reads ``{prefix}weight``; no bias and no centring (Zhang & Sennrich 2019), as
    Llama, Mistral, Qwen2 and Gemma use it. The state-dict name is ``weight``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The mean of squares in at least float32, as LayerNorm's statistics above.
        xf = _statistics_dtype(x)  # (..., N)
        y = xf * torch.rsqrt((xf * xf).mean(dim=-1, keepdim=True) + self.eps) * self.gain(xf.dtype)
        return y if y.dtype == x.dtype else y.to(x.dtype)  # (..., N)
