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
