"""The KV caches: level 2's, grown by concatenation, and the static one of levels 3 and 4.

Any cache (``Kernels.kv_cache``) is a ``levels.common.boundary.CacheBook`` (the
length, each slot's validity, the positions, ``check`` and ``commit``: the same
at every level) with one method of its own, which each layer calls once per
step: ``append(index, k_new, v_new)`` with ``(B,Hkv,T,Dh)`` keys and values,
returning the layer's keys and values over the filled prefix plus the new
positions, ``(B,Hkv,length + T,Dh)``. Only the model's ``commit`` makes them
count: entries past ``length`` are never read, so a step that fails half-way
(an error in a later layer) leaves the cache logically unchanged.

``KVCache`` (level 2's) grows by concatenation, one step at a time: simple and
obviously right, but every step copies the whole cache (``O(N^2)`` traffic over
``N`` steps). ``StaticKVCache`` (levels 3 and 4) allocates each layer's keys and
values once, to capacity ``C = max_seq_len``; a step writes its ``T`` new
positions into slots ``[length, length + T)`` and attention reads the filled
prefix ``[:length + T]`` as a view (no copy). It lives here, beside the cache it
replaces, so that level 4 takes it without importing level 3.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..common.boundary import CacheBook
from ..common.config import TransformerConfig
from .arrays import zeros


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

    def per_layer(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values, ``(B,Hkv,S,Dh)`` with ``S >= length``."""
        return list(zip(self._k, self._v, strict=True))


class StaticKVCache(CacheBook):
    """Keys and values ``(n_layers, B, Hkv, C, Dh)``, preallocated; the rest is ``CacheBook``'s.

    ``Hkv`` is the model's key/value heads: grouped-query attention shrinks the
    cache by ``H / Hkv`` (``levels.common.params.kv_bytes_per_token``).
    """

    def __init__(self, config: TransformerConfig, batch: int, *, device=None, dtype=None):
        super().__init__(config, batch)
        L, H, Dh, C = config.n_layers, config.kv_heads, config.d_head, config.max_seq_len
        # Zeros rather than empty: slots past `length` are never read, but
        # deterministic contents make the cache comparable bit for bit. Zeros that cost
        # nothing until a slot is written (`zeros`): most of the context never is.
        kw = {"device": device, "dtype": dtype or torch.float32}
        self.k = zeros((L, batch, H, C, Dh), **kw)  # (L,B,Hkv,C,Dh)
        self.v = zeros((L, batch, H, C, Dh), **kw)  # (L,B,Hkv,C,Dh)

    def append(
        self, index: int, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k_new, v_new (B,Hkv,T,Dh)`` into layer ``index`` -> views ``(B,Hkv,length+T,Dh)``."""
        T, k, v = k_new.shape[2], self.k[index], self.v[index]  # (B,Hkv,C,Dh) views
        k.narrow(2, self.length, T).copy_(k_new)  # (B,Hkv,T,Dh) into slots [length, length+T)
        v.narrow(2, self.length, T).copy_(v_new)
        # Views of the filled prefix: strided along C, contiguous in Dh, which SDPA accepts.
        end = self.length + T
        return k.narrow(2, 0, end), v.narrow(2, 0, end)  # (B,Hkv,length+T,Dh)

    def per_layer(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values, ``(B,Hkv,C,Dh)``."""
        return list(zip(self.k, self.v, strict=True))


def regroup(parts: Sequence[tuple[CacheBook, int]], config: TransformerConfig) -> KVCache:
    """A cache of row ``r`` of each ``(cache, r)`` in ``parts`` (any of the caches above),
    in that order: each row's real slots moved to its front, zeros after them, the book
    saying so. A server calls it between decode steps, when requests join the running
    batch (their prefilled caches) and leave it; a row's positions are its real count, so
    it decodes on as it would alone. The result is level 2's cache, sized to the longest
    row: a static one holds the whole context for every row, and writing a few slots into
    each row's stretch of it faulted in 1.8 s of zeroed pages for eight rows of SmolLM2."""
    rows = []  # per row, per layer: its real keys and values, (Hkv,n,Dh) each
    for cache, r in parts:
        layers = cache.per_layer()
        keep = torch.tensor(cache.valid[r], dtype=torch.bool, device=layers[0][0].device)
        rows.append([(k[r, :, : cache.length][:, keep], v[r, :, : cache.length][:, keep])
                     for k, v in layers])  # fmt: skip
    counts = [layers[0][0].shape[1] for layers in rows]
    k0 = rows[0][0][0]  # (Hkv,n,Dh)
    merged = KVCache(config, len(rows), device=k0.device, dtype=k0.dtype)
    shape = (len(rows), k0.shape[0], max(counts), k0.shape[2])  # (B,Hkv,S,Dh)
    for i in range(config.n_layers):
        merged._k[i] = torch.zeros(shape, dtype=k0.dtype, device=k0.device)
        merged._v[i] = torch.zeros(shape, dtype=k0.dtype, device=k0.device)
        for b, layers in enumerate(rows):
            k, v = layers[i]
            merged._k[i][b, :, : k.shape[1]], merged._v[i][b, :, : v.shape[1]] = k, v
    merged._left_aligned(counts)
    return merged
