"""The pieces a higher level may swap, and the record that names them: ``Kernels``.

The norms are written out here (levels 3 and 4 swap in fused ones); the
attention core is ``attention.py``. The KV cache grows by concatenation, one
step at a time: simple and obviously right, but every step copies the whole cache (quadratic
traffic over a generation); level 3 replaces it with a buffer allocated once.
Any replacement (``Kernels.kv_cache``) is a ``levels.common.boundary.CacheBook``
(the length, each slot's validity, the positions, ``check`` and ``commit``:
the same at every level) with one method of its own, which each layer calls
once per step: ``append(index, k_new, v_new)`` with ``(B,Hkv,T,Dh)`` keys and
values, returning the layer's keys and values over the filled prefix plus the
new positions, ``(B,Hkv,length + T,Dh)``. Only the model's ``commit`` makes
them count: entries past ``length`` are never read, so a step that fails
half-way (an error in a later layer) leaves the cache logically unchanged.
``cross[index]`` holds a seq2seq decoder layer's cross-attention ``(k, v)``,
computed once at prefill.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..common.boundary import CacheBook
from ..common.config import TransformerConfig
from .arrays import fetch
from .attention import attention


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
        super().__init__(config, params, prefix=prefix, width=width, device=device, dtype=dtype)
        if config.has_norm_bias:
            kw = {"device": device, "dtype": dtype}
            self.bias = fetch(params, f"{prefix}bias", (self.width,), **kw)
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


class KVCache(CacheBook):
    """Per-layer keys and values of the positions decoded so far; capacity ``max_seq_len``."""

    def __init__(self, config: TransformerConfig, batch: int, *, device=None, dtype=None):
        super().__init__(config, batch)
        self._k: list[torch.Tensor | None] = [None] * config.n_layers  # (B,Hkv,length,Dh) each
        self._v: list[torch.Tensor | None] = [None] * config.n_layers  # (B,Hkv,length,Dh) each

    def append(
        self, index: int, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        past_k, past_v = self._k[index], self._v[index]
        if past_k is None:
            k, v = k_new, v_new  # (B,Hkv,T,Dh)
        else:
            # Slicing to `length` drops anything a failed step left behind.
            k = torch.cat([past_k[:, :, : self.length], k_new], dim=2)  # (B,Hkv,length+T,Dh)
            v = torch.cat([past_v[:, :, : self.length], v_new], dim=2)  # (B,Hkv,length+T,Dh)
        self._k[index], self._v[index] = k, v
        return k, v


@dataclass(frozen=True)
class Kernels:
    """What the modules of this level call for the parts a faster level replaces.

    - ``attention(q, k, v, *, causal, mask, window, scale=..., dropout_p=...)`` with
      the semantics of ``attention.attention``; ``dropout_p`` is passed only in
      training mode with ``config.dropout > 0``, and ``scale`` only when
      ``config.attn_scale`` is set, so a kernel without them works for inference
      of the other models;
    - ``layer_norm`` and ``rms_norm``: classes built as ``cls(config, params, *,
      prefix, width, device, dtype)`` (``width`` None: ``D``; QK-norm's is ``Dh``),
      ``nn.Module``s whose state dict is ``weight`` (and ``bias`` for a LayerNorm
      with bias), their gain ``config.norm_weight_offset + weight``; ``norm(config)``
      picks ``config.norm``'s;
    - ``kv_cache``: a class built as ``kv_cache(config, batch, *, device, dtype)``
      with the interface described at the top of this module;
    - ``linear(x, w, bias=None)``: ``x @ w.T + bias`` for the matrices a module holds as
      its own attributes (the fused q/k/v rows, the tied head): ``F.linear``, or a product
      that takes the form a faster level holds them in (level 3's int8 and int4).
    """

    attention: Callable = attention
    layer_norm: type = LayerNorm
    kv_cache: type = KVCache
    rms_norm: type = RMSNorm
    linear: Callable = F.linear

    def norm(self, config) -> type:
        """The norm class of ``config.norm``."""
        return self.rms_norm if config.norm == "rmsnorm" else self.layer_norm


LEVEL2_KERNELS = Kernels()
