"""The KV cache of level 2: it grows by concatenation, one step at a time.

Simple and obviously right, but every step copies the whole cache (quadratic
traffic over a generation); level 3 replaces it with a buffer allocated once.
Any replacement (``Kernels.kv_cache``) implements the same small interface,
which the models call in this order for every step of ``T`` new positions:

1. ``check_room(T)``: raise before anything is written, so an overflow leaves
   the cache unchanged;
2. ``key_valid(valid_new (B,T)) -> (B, length + T)`` bool, the validity of the
   filled keys followed by the new ones;
3. ``append(index, k_new, v_new)`` once per layer ``index``, with ``(B,H,T,Dh)``
   keys and values, returning the layer's keys and values over the filled
   prefix plus the new positions, ``(B,H,length + T,Dh)``;
4. ``advance(valid_new)``: only now ``length`` grows by ``T``.

After a prefill of prompts of different lengths, ``position_offset()`` is
each row's next position, ``(B,)`` (``levels.common.positions``).

Entries past ``length`` are never read, so a step that fails half-way (an
error in a later layer) leaves the cache logically unchanged.
``cross[index]`` holds a seq2seq decoder layer's cross-attention ``(k, v)``,
computed once at prefill; ``memory_valid (B,S)`` the source's validity.
"""

from __future__ import annotations

import torch

from ..common.checks import check_cache_room
from ..common.config import TransformerConfig
from ..common.positions import RowPositions


class KVCache(RowPositions):
    """Per-layer keys and values of the positions decoded so far; capacity ``max_seq_len``."""

    def __init__(self, config: TransformerConfig, batch: int, *, device=None, dtype=None):
        self.capacity = config.max_seq_len
        self.batch = batch
        self.length = 0  # filled positions, shared by every layer
        self._k: list[torch.Tensor | None] = [None] * config.n_layers  # (B,Hkv,length,Dh) each
        self._v: list[torch.Tensor | None] = [None] * config.n_layers  # (B,Hkv,length,Dh) each
        self._valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)  # (B, length)
        self.cross: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * config.n_layers
        self.memory_valid: torch.Tensor | None = None  # (B, S), seq2seq only

    def check_room(self, adding: int) -> None:
        check_cache_room(self.length, adding, self.capacity)

    def key_valid(self, valid_new: torch.Tensor) -> torch.Tensor:
        return torch.cat([self._valid[:, : self.length], valid_new], dim=1)  # (B, length + T)

    def append(
        self, index: int, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        past_k, past_v = self._k[index], self._v[index]
        if past_k is None:
            k, v = k_new, v_new  # (B,H,T,Dh)
        else:
            # Slicing to `length` drops anything a failed step left behind.
            k = torch.cat([past_k[:, :, : self.length], k_new], dim=2)  # (B,H,length+T,Dh)
            v = torch.cat([past_v[:, :, : self.length], v_new], dim=2)  # (B,H,length+T,Dh)
        self._k[index], self._v[index] = k, v
        return k, v

    def advance(self, valid_new: torch.Tensor) -> None:
        self._count_real(valid_new)
        self._valid = self.key_valid(valid_new)  # (B, length + T)
        self.length += valid_new.shape[1]
