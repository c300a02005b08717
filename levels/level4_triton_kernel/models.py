"""Level 4's modules: level 2's, with the attention core and the norms swapped for kernels.

Nothing of the architecture is repeated here. Level 2's modules read the parts
a faster level may replace from a ``Kernels`` record (level2/kernels.py); this
module builds level 4's record and subclasses each public module only to point
its ``kernels`` attribute at it. Parameter loading, RoPE, the FFN, the transformer
and the public methods (``levels.common.public``) are level 2's code.

The KV cache is level 3's static one (allocated once, written in place): the
attention kernel takes any strides, so it reads the cache's filled prefix as a
view, without the copy level 2's concatenating cache makes at every step. A
server's paged cache (``PagedKVCache``) hands a decode step's attention the blocks
where they lie (``Pages``), and ``paged_decode.py`` reads them through the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import level2_torch_manual as level2
from ..level2_torch_manual import paged
from ..level3_sdpa_flash.models import StaticKVCache
from .flash_attention import attend
from .fused_layer_norm import layer_norm, rms_norm
from .paged_decode import paged_decode


@dataclass(frozen=True)
class Pages:
    """One layer's keys (or values) of a decode step, left where the paged cache keeps them:
    ``pool (N,Hkv,BS,Dh)``, each row's ``tables (B,M)`` and ``counts (B,)`` (int32, the new
    position included), and the layer's ``window``."""

    pool: torch.Tensor
    tables: torch.Tensor
    counts: torch.Tensor
    window: int | None


class PagedKVCache(paged.PagedKVCache):
    """Level 2's paged cache, whose decode steps hand the attention kernel the blocks where
    they lie (``Pages``) instead of gathering them: ``paged_decode.py`` reads them through
    the table, each row's window by position (a sequence's slot is its position). A pass
    of several positions (a prompt), or one that tracks gradients, gathers as level 2's does."""

    def __init__(self, pool, sequences, config):
        super().__init__(pool, sequences, config)
        self.windows = config.layer_windows  # each layer's: the kernel applies it by position
        self._pages: tuple[torch.Tensor, torch.Tensor] | None = None

    def extend(self, positions: torch.Tensor) -> torch.Tensor:
        self._pages = None  # a new pass: its blocks and counts are read again
        return super().extend(positions)

    def update(self, index: int, k_new: torch.Tensor, v_new: torch.Tensor):
        if k_new.shape[2] != 1 or torch.is_grad_enabled():
            return super().update(index, k_new, v_new)
        self.write(index, k_new, v_new)
        if self._pages is None:  # once a pass: every layer reads the same blocks
            tables = self.tables(max(len(s.table) for s in self.sequences))
            counts = [s.count for s in self.sequences]  # the new position included
            self._pages = tuple(
                torch.tensor(x, dtype=torch.int32, device=k_new.device) for x in (tables, counts)
            )
        window = self.windows[index]
        return (
            Pages(self.pool.k[index], *self._pages, window),
            Pages(self.pool.v[index], *self._pages, window),
        )


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
    if isinstance(k, Pages):  # a decode step over the paged cache: read through its tables
        return paged_decode(q, k.pool, v.pool, k.tables, k.counts, scale=scale, window=k.window)
    if dropout_p > 0.0:
        raise NotImplementedError(
            "level 4's attention kernel has no attention dropout; train with "
            "config.dropout = 0.0 (the default) or use a lower level"
        )
    return attend(q, k, v, causal=causal, mask=mask, scale=scale, window=window)


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
    attention=kernel_attention,
    layer_norm=LayerNorm,
    rms_norm=RMSNorm,
    kv_cache=StaticKVCache,
    paged_kv_cache=PagedKVCache,
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
