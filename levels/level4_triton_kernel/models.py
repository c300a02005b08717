"""Level 4's modules: level 2's, with the attention core and the norms swapped for kernels.

Nothing of the architecture is repeated here. Level 2's modules read the parts
a faster level may replace from a ``Kernels`` record (level2/kernels.py); this
module builds level 4's record and subclasses each public module only to point
its ``kernels`` attribute at it. Parameter loading, the checks, RoPE, the FFN,
the KV-cache protocol, prefill / decode_step and generation are level 2's code.

The KV cache is level 3's static one (allocated once, written in place): the
attention kernel takes any strides, so it reads the cache's filled prefix as a
view, without the copy level 2's concatenating cache makes at every step.
"""

from __future__ import annotations

import torch

from .. import level2_torch_manual as level2
from ..level2_torch_manual.cache import StaticKVCache
from .flash_attention import attention
from .fused_layer_norm import layer_norm, rms_norm


def kernel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    window: int | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """The ``Kernels.attention`` hook: the flash kernel, which has no attention dropout.

    Level 2 passes ``dropout_p`` only in training mode with ``config.dropout > 0``;
    rather than silently training without it, that combination is refused.
    """
    if dropout_p > 0.0:
        raise NotImplementedError(
            "level 4's attention kernel has no attention dropout; train with "
            "config.dropout = 0.0 (the default) or use a lower level"
        )
    return attention(q, k, v, causal=causal, mask=mask, scale=scale, window=window)


def kernel_gain(norm: level2.LayerNorm | level2.RMSNorm) -> torch.Tensor:
    """The gain the fused kernel multiplies by: ``weight``, or Gemma's ``offset + weight``
    added beforehand in float32 (one ``(N,)`` vector; autograd carries its gradient back
    to ``weight``)."""
    return norm.weight if norm.offset == 0.0 else norm.gain(torch.float32)


class LayerNorm(level2.LayerNorm):
    """Level 2's LayerNorm (same parameters and state dict) computed by the fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, kernel_gain(self), self.bias, self.eps)  # (..., N) -> (..., N)


class RMSNorm(level2.RMSNorm):
    """Level 2's RMSNorm (same parameter and state dict) computed by the fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, kernel_gain(self), self.eps)  # (..., N) -> (..., N)


KERNELS = level2.Kernels(
    attention=kernel_attention, layer_norm=LayerNorm, rms_norm=RMSNorm, kv_cache=StaticKVCache
)


class FeedForward(level2.FeedForward):
    """Level 2's feed-forward network: its matmuls are PyTorch's, already fused GEMMs."""


class MultiHeadAttention(level2.MultiHeadAttention):
    kernels = KERNELS


class EncoderLayer(level2.EncoderLayer):
    kernels = KERNELS


class DecoderLayer(level2.DecoderLayer):
    kernels = KERNELS


class DecoderOnlyTransformer(level2.DecoderOnlyTransformer):
    kernels = KERNELS


class Seq2SeqTransformer(level2.Seq2SeqTransformer):
    kernels = KERNELS
