"""The block manager: a paged KV cache's blocks, handed out, shared, and given back.

A level's paged cache (levels/level2_torch_manual/paged.py) keeps keys and values in ``N``
blocks of ``bs`` positions, ``k, v (L,N,Hkv,bs,Dh)``, a sequence's found by its ``Table``::

    table [7, 2, 9], count 37      positions 0-15 in block 7, 16-31 in 2, 32-36 in 9

``BlockPool`` decides which block goes where: ``reserve`` takes blocks for a pass (all or
none), ``free`` and ``trim`` give them back, a reference count says who holds each. A
full block is also found by what it holds: ``publish`` files it under the hash of its
tokens and of every token before them, and ``match`` hands a later prompt that begins the
same way those blocks by reference. A block nobody holds keeps its digest until the pool
needs it, least recently freed first; a sequence gives its blocks back tail first, so the
head of a prefix, where every match starts, is the last to go.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

BLOCK_SIZE = 16  # positions per block: vLLM's default; a prefix is shared in whole blocks


class OutOfBlocks(ValueError):
    """A pass needs more free blocks than the pool has (nothing was taken)."""


@dataclass
class Table:
    """One sequence's blocks, in position order, the ``count`` of positions filled, and the
    ``digests`` of its first full blocks (filed in the pool's prefix index, or found there)."""

    table: list[int] = field(default_factory=list)
    count: int = 0
    digests: list[bytes] = field(default_factory=list)

    def next_digest(self, tokens: Sequence[int], block_size: int) -> bytes:
        """The digest of its next full block, of ``tokens`` (all of its tokens): that block's
        tokens and the digest of the blocks before it."""
        i = len(self.digests)
        parent = self.digests[-1] if self.digests else b""
        block = array("q", tokens[i * block_size : (i + 1) * block_size]).tobytes()
        return hashlib.sha256(parent + block).digest()


class BlockPool:
    """``blocks`` blocks of ``block_size`` positions over the storage ``k, v`` (a level's,
    ``(L,N,Hkv,bs,Dh)``), with a reference count per block and the prefix index."""

    def __init__(self, k: Any, v: Any, blocks: int, block_size: int = BLOCK_SIZE):
        if blocks < 1 or block_size < 1:
            raise ValueError(f"a pool needs blocks >= 1 and block_size >= 1, got {blocks}, {block_size}")  # fmt: skip
        self.k, self.v, self.blocks, self.block_size = k, v, blocks, block_size
        self.refs = [0] * blocks
        self.free_blocks = deque(range(blocks))  # held by nobody, holding no published prefix
        self.idle: OrderedDict[int, bytes] = OrderedDict()  # held by nobody, still published
        self.index: dict[bytes, int] = {}  # digest -> the block filed under it

    @property
    def available(self) -> int:
        """Blocks a sequence may take now: the free ones and the idle published ones."""
        return len(self.free_blocks) + len(self.idle)

    def blocks_for(self, positions: int) -> int:
        return -(-positions // self.block_size)

    def needed(self, tables: Sequence[Table], adding: int) -> int:
        """The blocks ``tables`` lack for ``adding`` more positions each."""
        return sum(max(self.blocks_for(t.count + adding) - len(t.table), 0) for t in tables)

    def reserve(self, tables: Sequence[Table], adding: int) -> None:
        """Blocks for ``adding`` more positions in each table, all or none."""
        total = self.needed(tables, adding)
        if total > self.available:
            raise OutOfBlocks(f"this pass needs {total} more KV blocks and the pool has {self.available} free")  # fmt: skip
        for t in tables:
            t.table.extend(self._take() for _ in range(self.needed([t], adding)))

    def _take(self) -> int:
        """A block to write: a never-published one first, else the least recently idle one
        (its prefix is forgotten)."""
        if self.free_blocks:
            block = self.free_blocks.popleft()
        else:
            block, digest = self.idle.popitem(last=False)
            del self.index[digest]
        self.refs[block] = 1
        return block

    def free(self, t: Table) -> None:
        """Give back every block of ``t``."""
        self._give_back(t, 0)
        t.table, t.count, t.digests = [], 0, []

    def trim(self, t: Table) -> None:
        """Give back the blocks past ``t.count`` (a pass's rejected guesses)."""
        keep = self.blocks_for(t.count)
        self._give_back(t, keep)
        del t.table[keep:]

    def _give_back(self, t: Table, start: int) -> None:
        """Drop ``t``'s hold on its blocks from ``start`` on, the last first: a block no one
        holds becomes idle if published (findable until taken), else free."""
        for i in reversed(range(start, len(t.table))):
            block = t.table[i]
            self.refs[block] -= 1
            if self.refs[block] == 0:
                digest = t.digests[i] if i < len(t.digests) else None
                if digest is not None and self.index.get(digest) == block:
                    self.idle[block] = digest
                else:
                    self.free_blocks.append(block)

    def match(self, tokens: Sequence[int]) -> Table:
        """A new table holding the longest run of published blocks that begins ``tokens``
        (whole blocks; each one's reference counted)."""
        t = Table()
        for _ in range(len(tokens) // self.block_size):
            digest = t.next_digest(tokens, self.block_size)
            block = self.index.get(digest)
            if block is None:
                break
            if self.refs[block] == 0:
                del self.idle[block]
            self.refs[block] += 1
            t.table.append(block)
            t.digests.append(digest)
            t.count += self.block_size
        return t

    def publish(self, t: Table, tokens: Sequence[int]) -> None:
        """File each full block of ``t`` not filed yet under its digest (``tokens``: its
        tokens, at least ``count``). A digest filed already (the same prefix computed twice
        at once) keeps its first block."""
        for i in range(len(t.digests), t.count // self.block_size):
            digest = t.next_digest(tokens, self.block_size)
            self.index.setdefault(digest, t.table[i])
            t.digests.append(digest)
