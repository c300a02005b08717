"""The paged KV cache: keys and values in fixed-size blocks of one pool, found through a
block table per sequence, as an inference server keeps them (vLLM's PagedAttention).

A static cache (``cache.py``) gives every row the whole context up front; a server
decoding many requests of unknown lengths would hold ``B x C`` positions to use a few
hundred. Here memory is handed out ``bs`` positions (a block) at a time::

    pool      k, v  (L, N, Hkv, bs, Dh)      N blocks, shared by every sequence
    table     [7, 2, 9], count 37            positions  0-15 in block 7
                                                       16-31 in block 2
                                                       32-36 in block 9 (11 slots free)

Which block goes where (handed out, shared by prefix, given back) is the engine's block
manager's business (engine/blocks.py); this is the level's side: the storage
(``PagedKVCache.storage``) and a pass's keys and values written into a batch's blocks
and read back. A sequence's blocks need not be adjacent or in order; rows join and leave
a batch without moving a byte (``PagedKVCache`` is a batch of tables, made for one pass).

Attention reads a sequence's keys by gathering its blocks into ``(B,Hkv,S,Dh)``: a
copy per layer and step, the traffic level 2's concatenating cache has, so levels 2 and
3 attend over it as over any cache. (Level 4's decode steps read the blocks where they
lie instead: levels/level4_triton_kernel/paged_decode.py.) In the gathered layout each
row's ``count`` filled slots come first, at positions ``0 .. count - 1`` (a sequence
is never padded), then slots of position ``-1`` up to the longest row's, which no query
sees, then the step's new ones: so a row decodes as it would alone.
"""

from __future__ import annotations

import collections.abc as abc

import numpy as np
import torch

from ..common.config import TransformerConfig
from .arrays import zeros


class PagedKVCache:
    """A batch of ``sequences`` (block tables: ``table``, ``count``) in ``pool`` (the engine's
    ``BlockPool``: ``k``, ``v``, ``block_size``, ``reserve``), for one pass: a pass over ``T``
    new tokens a row appends them to each sequence, in its own blocks.

    ``extend(positions)`` (once a pass) takes the blocks the pass needs, all or none, and
    advances each sequence's ``count`` by its real new tokens; ``update`` writes a layer's
    new keys and values into the blocks and returns the batch's keys and values
    gathered, ``(B,Hkv,S,Dh)``. A pass's padding must trail its real tokens (right-padded),
    as every public method's input is.
    """

    @staticmethod
    def storage(
        config: TransformerConfig, blocks: int, block_size: int, *, device=None, dtype=None
    ):
        """The pool's keys and values, ``k, v (L,N,Hkv,bs,Dh)``: zeros that cost nothing until
        written (``arrays.zeros``; most blocks of a large pool never are). A slot past a
        sequence's count is masked, never read."""
        shape = (config.n_layers, blocks, config.kv_heads, block_size, config.d_head)
        kw = {"device": device, "dtype": dtype or torch.float32}
        return zeros(shape, **kw), zeros(shape, **kw)

    def __init__(self, pool, sequences: abc.Sequence, config: TransformerConfig):
        self.pool, self.sequences = pool, list(sequences)
        self.capacity, self.batch, self.device = (
            config.max_seq_len,
            len(self.sequences),
            pool.k.device,
        )
        self._starts: list[int] = []  # each sequence's count before the pass: its new slots' start
        self._where: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def length(self) -> int:
        """The slots of the gathered layout: the longest sequence's count."""
        return max(s.count for s in self.sequences)

    def next_positions(self):
        """Each row's next position, ``(B,)`` numpy: its count (a sequence is never padded)."""
        return np.array([s.count for s in self.sequences])

    def extend(self, positions: torch.Tensor) -> torch.Tensor:
        """Take the pass's new slots at ``positions (B,T)`` -> every key's position in the
        gathered layout, ``(B, S)``: each row's ``count`` positions, ``-1`` up to the longest
        row's, then the new ones. ``OutOfBlocks`` before anything is written."""
        self.pool.reserve(self.sequences, positions.shape[1])
        self._starts, self._where = [s.count for s in self.sequences], None
        past = max(self._starts)
        slots = torch.arange(past, device=positions.device)  # (S_past,)
        counts = torch.tensor(self._starts, device=positions.device)[:, None]  # (B,1)
        old = torch.where(slots < counts, slots, -1)  # (B, S_past): a slot is its position
        for sequence, n in zip(self.sequences, (positions >= 0).sum(dim=1).tolist(), strict=True):
            sequence.count += n  # its real new tokens
        return torch.cat([old, positions], dim=1)  # (B, S_past + T)

    def update(self, index: int, k_new: torch.Tensor, v_new: torch.Tensor):
        """Write ``k_new, v_new (B,Hkv,T,Dh)`` after each sequence's filled slots, in layer
        ``index`` -> the keys and values ``(B,Hkv,S,Dh)``: each row's filled slots, padding
        to the longest, then the new ones."""
        tables = self.write(index, k_new, v_new)
        past = max(self._starts)
        if past == 0:
            return k_new, v_new
        k_pool, v_pool = self.pool.k[index], self.pool.v[index]  # (N,Hkv,bs,Dh)
        return (
            self._gathered(k_pool, tables, past, k_new),
            self._gathered(v_pool, tables, past, v_new),
        )

    def write(self, index: int, k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
        """Write ``k_new, v_new (B,Hkv,T,Dh)`` after each sequence's filled slots in layer
        ``index``'s blocks -> the tables ``(B,M)`` of the slots filled before the pass."""
        blocks, offsets, tables = self._places(k_new.shape[2], k_new.device)
        # Slot t of row b goes to block blocks[b,t] at offsets[b,t]; padding is written
        # too (past the count, never read), so each row's write is one run of slots.
        self.pool.k[index][blocks, :, offsets] = k_new.transpose(1, 2)  # (B,T,Hkv,Dh)
        self.pool.v[index][blocks, :, offsets] = v_new.transpose(1, 2)
        return tables

    @staticmethod
    def _gathered(pool: torch.Tensor, tables: torch.Tensor, past: int, new: torch.Tensor):
        B, M = tables.shape
        _, H, bs, Dh = pool.shape
        old = pool[tables]  # (B,M,Hkv,bs,Dh): each row's blocks, in order
        old = old.transpose(1, 2).reshape(B, H, M * bs, Dh)[:, :, :past]
        return torch.cat([old, new], dim=2)  # (B,Hkv,past+T,Dh)

    def _places(self, T: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where each new slot goes, ``blocks, offsets (B,T)``, and the tables ``(B,M)`` of the
        slots filled before the pass (a short row's padded with its first block: masked)."""
        if self._where is None:
            bs, starts = self.pool.block_size, self._starts
            places = [range(n, n + T) for n in starts]
            blocks = [
                [s.table[p // bs] for p in r] for s, r in zip(self.sequences, places, strict=True)
            ]
            offsets = [[p % bs for p in r] for r in places]
            tables = self.tables(self.pool.blocks_for(max(starts)))
            self._where = tuple(
                torch.tensor(x, dtype=torch.long, device=device) for x in (blocks, offsets, tables)
            )
        return self._where

    def tables(self, M: int) -> list[list[int]]:
        """Each row's first ``M`` blocks, ``(B,M)``: a short row's padded with its first block,
        whose entries there lie past its count (masked, or never read)."""
        return [s.table[:M] + [s.table[0]] * (M - len(s.table[:M])) for s in self.sequences]

    def rollback(self, length: int) -> None:
        raise ValueError(
            "a paged cache is not rolled back: free its sequences and match them again"
        )
