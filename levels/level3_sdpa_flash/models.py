"""Level 3's modules: level 2's, with SDPA for attention and a static KV cache.

Each class is level 2's, re-parameterised through its ``Kernels`` hook (no
model code is copied): ``KERNELS`` names level 3's attention core
(``attention.py``), PyTorch's fused norms, and the cache (``cache.py``);
``backend=`` on any module or model narrows SDPA to one of its backends, and
``weights="int8"`` on a model holds its matrices in int8 (``quant.py``).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch
import torch.nn.functional as F

from .. import level2_torch_manual as level2
from ..level2_torch_manual import Kernels
from .attention import attention, check_backend
from .cache import StaticKVCache
from .quant import quantize_


class LayerNorm(level2.LayerNorm):
    """Level 2's LayerNorm (same parameters) computed by PyTorch's fused ``F.layer_norm``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in at least float32, as level 2's: a half-precision input is widened.
        xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
        w = self.gain(xf.dtype)  # weight, or Gemma's offset + weight
        b = None if self.bias is None else self.bias.to(xf.dtype)
        return F.layer_norm(xf, (xf.shape[-1],), w, b, self.eps).to(x.dtype)  # (..., D)


class RMSNorm(level2.RMSNorm):
    """Level 2's RMSNorm computed by PyTorch's fused ``F.rms_norm``: one call instead of
    six tensor operations, which is what a decode step, 61 norms of one row, pays for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
        y = F.rms_norm(xf, (xf.shape[-1],), self.gain(xf.dtype), self.eps)
        return y.to(x.dtype)  # (..., D)


class FeedForward(level2.FeedForward):
    """Level 2's feed-forward network, unchanged."""


KERNELS = Kernels(
    attention=attention, layer_norm=LayerNorm, rms_norm=RMSNorm, kv_cache=StaticKVCache
)


def kernels_for(backend: str = "auto") -> Kernels:
    """Level 3's kernels with SDPA restricted to ``backend`` (``"auto"``: SDPA chooses)."""
    if check_backend(backend) == "auto":
        return KERNELS
    return replace(KERNELS, attention=partial(attention, backend=backend))


class _ChoosesBackend:
    """Adds ``backend=`` to a level 2 class: it becomes ``kernels=kernels_for(backend)``."""

    def __init__(self, *args, backend: str = "auto", kernels: Kernels | None = None, **kwargs):
        super().__init__(*args, kernels=kernels or kernels_for(backend), **kwargs)
        self.backend = backend


WEIGHT_FORMATS = ("float", "int8")


class _ChoosesWeights(_ChoosesBackend):
    """Adds ``weights=`` to a model: ``"float"`` (the dtype's, the default) or ``"int8"``, every
    matrix weight-only int8 with a scale per row (``quant.py``; inference only)."""

    def __init__(self, *args, weights: str = "float", **kwargs):
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {weights!r}")
        super().__init__(*args, **kwargs)
        self.weights = weights
        if weights == "int8":
            quantize_(self)


class MultiHeadAttention(_ChoosesBackend, level2.MultiHeadAttention):
    __doc__ = level2.MultiHeadAttention.__doc__
    kernels = KERNELS


class EncoderLayer(_ChoosesBackend, level2.EncoderLayer):
    __doc__ = level2.EncoderLayer.__doc__
    kernels = KERNELS


class DecoderLayer(_ChoosesBackend, level2.DecoderLayer):
    __doc__ = level2.DecoderLayer.__doc__
    kernels = KERNELS


class DecoderOnlyTransformer(_ChoosesWeights, level2.DecoderOnlyTransformer):
    __doc__ = level2.DecoderOnlyTransformer.__doc__
    kernels = KERNELS


class Seq2SeqTransformer(_ChoosesWeights, level2.Seq2SeqTransformer):
    __doc__ = level2.Seq2SeqTransformer.__doc__
    kernels = KERNELS
