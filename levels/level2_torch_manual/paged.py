"""The paged KV cache: keys and values in fixed-size blocks of one pool, found through a
block table per sequence, as an inference server keeps them (vLLM's PagedAttention).

A static cache (``cache.py``) gives every row the whole context up front; a server
decoding many requests of unknown lengths would hold ``B x C`` positions to use a few
hundred. Here memory is handed out ``bs`` positions (a block) at a time::

    pool      k, v  (L, N, Hkv, bs, Dh)      N blocks, shared by every sequence
    Sequence  table [7, 2, 9], count 37      positions  0-15 in block 7
                                                       16-31 in block 2
                                                       32-36 in block 9 (11 slots free)

A sequence's blocks need not be adjacent or in order; rows join and leave a batch
without moving a byte (``PagedKVCache`` is a batch of sequences, made for one step);
a finished sequence's blocks go back to the pool for the next request.

A full block is also found by what it holds: ``BlockPool.publish`` files it under the
hash of its tokens and of every token before them (a chain: block ``i``'s digest covers
block ``i - 1``'s), and ``BlockPool.match`` hands a later prompt that starts the same
way (a system prompt, the earlier turns of a chat) those blocks by reference instead of
computing them again. A shared block is full and never written again: a sequence writes
only past its ``count``, which is always in a block of its own. A block nobody holds
keeps its contents and its digest until the pool needs it back (least recently freed
first), so a prefix outlives the request that computed it.

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
import hashlib
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np
import torch

from ..common.config import TransformerConfig
from .arrays import zeros

BLOCK_SIZE = 16  # positions per block: vLLM's default; a prefix is shared in whole blocks


class OutOfBlocks(ValueError):
    """A step needs more free blocks than the pool has (nothing was written)."""


@dataclass
class Sequence:
    """One sequence's place in the pool: its ``table`` of blocks, in position order, the
    ``count`` of positions filled, and the ``digests`` of its first full blocks, those
    filed in the pool's prefix index (or found there)."""

    table: list[int] = field(default_factory=list)
    count: int = 0
    digests: list[bytes] = field(default_factory=list)

    def _next_digest(self, tokens: abc.Sequence[int], block_size: int) -> bytes:
        """The digest of its next full block, whose tokens come from ``tokens`` (all of its
        tokens): that block's tokens and the digest of the blocks before it."""
        i = len(self.digests)
        parent = self.digests[-1] if self.digests else b""
        block = array("q", tokens[i * block_size : (i + 1) * block_size]).tobytes()
        return hashlib.sha256(parent + block).digest()


class BlockPool:
    """``blocks`` blocks of ``block_size`` positions for every layer's keys and values,
    ``k, v (L, N, Hkv, bs, Dh)``, with a reference count per block and the prefix index."""

    def __init__(
        self,
        config: TransformerConfig,
        blocks: int,
        *,
        block_size: int = BLOCK_SIZE,
        device=None,
        dtype=None,
    ):
        if blocks < 1 or block_size < 1:
            raise ValueError(
                f"a pool needs blocks >= 1 and block_size >= 1, got {blocks}, {block_size}"
            )
        L, H, Dh = config.n_layers, config.kv_heads, config.d_head
        kw = {"device": device, "dtype": dtype or torch.float32}
        # Zeros that cost nothing until written (`zeros`): most blocks of a large pool
        # are never used. A slot past a sequence's count is masked, never read.
        self.k = zeros((L, blocks, H, block_size, Dh), **kw)  # (L,N,Hkv,bs,Dh)
        self.v = zeros((L, blocks, H, block_size, Dh), **kw)  # (L,N,Hkv,bs,Dh)
        self.blocks, self.block_size = blocks, block_size
        self.refs = [0] * blocks
        self._free = deque(range(blocks))  # held by nobody, holding no published prefix
        self._idle: OrderedDict[int, bytes] = OrderedDict()  # held by nobody, still published
        self._index: dict[bytes, int] = {}  # digest -> the block filed under it

    @property
    def nbytes(self) -> int:
        """The pool's bytes, keys and values of every layer."""
        return self.k.nbytes + self.v.nbytes

    @property
    def available(self) -> int:
        """Blocks a sequence may take now: the free ones and the idle published ones."""
        return len(self._free) + len(self._idle)

    def blocks_for(self, positions: int) -> int:
        """The blocks that hold ``positions`` positions."""
        return -(-positions // self.block_size)

    def needed(self, sequences: abc.Sequence[Sequence], adding: int) -> int:
        """The blocks ``sequences`` lack for ``adding`` more positions each."""
        return sum(max(self.blocks_for(s.count + adding) - len(s.table), 0) for s in sequences)

    def reserve(self, sequences: abc.Sequence[Sequence], adding: int) -> None:
        """Blocks for ``adding`` more positions in each sequence, all or none: ``OutOfBlocks``
        before anything is taken."""
        total = self.needed(sequences, adding)
        if total > self.available:
            raise OutOfBlocks(
                f"this step needs {total} more KV blocks and the pool has {self.available} free"
            )
        for sequence in sequences:
            sequence.table.extend(self._take() for _ in range(self.needed([sequence], adding)))

    def _take(self) -> int:
        """A block for writing: a never-published one first, else the least recently idle
        published one (its prefix is forgotten)."""
        if self._free:
            block = self._free.popleft()
        else:
            block, digest = self._idle.popitem(last=False)
            del self._index[digest]
        self.refs[block] = 1
        return block

    def free(self, sequence: Sequence) -> None:
        """Give back every block of ``sequence`` (a published one stays findable while idle)."""
        self._give_back(sequence, 0)
        sequence.table, sequence.count, sequence.digests = [], 0, []

    def trim(self, sequence: Sequence) -> None:
        """Give back the blocks past ``sequence``'s count (taken for a pass whose last
        positions it did not keep: a speculative step's rejected guesses)."""
        keep = self.blocks_for(sequence.count)
        self._give_back(sequence, keep)
        del sequence.table[keep:]

    def _give_back(self, sequence: Sequence, start: int) -> None:
        """Drop ``sequence``'s reference to its blocks from ``start`` on: a block no one holds
        becomes idle if published (findable until taken), else free."""
        for i in range(start, len(sequence.table)):
            block = sequence.table[i]
            self.refs[block] -= 1
            if self.refs[block] == 0:
                digest = sequence.digests[i] if i < len(sequence.digests) else None
                if digest is not None and self._index.get(digest) == block:
                    self._idle[block] = digest
                else:
                    self._free.append(block)

    def match(self, tokens: abc.Sequence[int]) -> Sequence:
        """A new sequence holding the longest run of published blocks that begins ``tokens``
        (whole blocks only; each one's reference counted)."""
        sequence = Sequence()
        for _ in range(len(tokens) // self.block_size):
            digest = sequence._next_digest(tokens, self.block_size)
            block = self._index.get(digest)
            if block is None:
                break
            if self.refs[block] == 0:
                del self._idle[block]
            self.refs[block] += 1
            sequence.table.append(block)
            sequence.digests.append(digest)
            sequence.count += self.block_size
        return sequence

    def publish(self, sequence: Sequence, tokens: abc.Sequence[int]) -> None:
        """File each full block of ``sequence`` not filed yet under its digest; ``tokens``
        are the sequence's tokens (at least its ``count``). A block whose digest is filed
        already (the same prefix computed twice at once) stays unfiled."""
        for i in range(len(sequence.digests), sequence.count // self.block_size):
            digest = sequence._next_digest(tokens, self.block_size)
            self._index.setdefault(digest, sequence.table[i])
            sequence.digests.append(digest)


class PagedKVCache:
    """A batch of ``sequences`` in ``pool``, for the passes of one batch: a pass over ``T``
    new tokens a row appends them to each sequence, in its own blocks.

    ``extend(positions)`` (once a pass) takes the blocks the pass needs, all or none, and
    advances each sequence's ``count`` by its real new tokens; ``update`` writes a layer's
    new keys and values into the blocks and returns the batch's keys and values
    gathered, ``(B,Hkv,S,Dh)``. A pass's padding must trail its real tokens (right-padded),
    as every public method's input is.
    """

    def __init__(
        self, pool: BlockPool, sequences: abc.Sequence[Sequence], config: TransformerConfig
    ):
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
