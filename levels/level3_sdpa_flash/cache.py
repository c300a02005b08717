"""A static KV cache: allocated once to ``max_seq_len``, written in place.

Level 2's cache concatenates at every step, so decoding ``N`` tokens copies
``O(N^2)`` keys and values and reallocates each step. Here each layer's keys
and values live in one buffer of capacity ``C = max_seq_len`` allocated at
construction; a step writes its ``T`` new positions into slots
``[length, length + T)`` and attention reads the filled prefix ``[:length + T]``
as a view (no copy). The same interface as level 2's ``KVCache``.
"""

from __future__ import annotations

import torch

from ..common.boundary import CacheBook
from ..common.config import TransformerConfig
from ..level2_torch_manual.arrays import zeros


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
