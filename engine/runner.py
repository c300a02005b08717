"""The runner: a pass's inputs made, the model's plain pass called, its logits back.

This is the one place a decoding loop calls a model. Each row of a pass feeds a list of
tokens (its ``todo``, then its draft's guesses) from ``start``, the count of its tokens the
cache holds already; the runner makes ``ids (B,T)``, right-padded, and ``positions (B,T)``,
``start, start + 1, ...`` and ``-1`` at the padding, in the model's own arrays, and calls
``model.transformer(ids, positions, cache, last)``. It gets float64 numpy back: every
choice after it is made in numpy, alike at every level.

Where the keys and values live is the cache's business, one of three behind one
interface (``open``, ``cache``, ``keep``):

* ``LevelCache``: the level's own (``model.new_cache``), for a fixed batch of rows that
  all start together: every pass feeds every row (a finished one, padding), one length
  for all of them, and after a pass the cache keeps the slots every row kept;
* ``PagedCache``: the level's paged cache over a ``BlockPool``, a table of blocks a
  sequence, so that sequences join and leave between passes (levels 2 to 4);
* ``NoCache``: none; every pass feeds each row all its tokens (``use_cache=False``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from levels.common.semantics import positions_of

from .blocks import BLOCK_SIZE, BlockPool
from .protocols import Model
from .request import Sequence


class Runner:
    """Passes of ``model`` (decoder-only, or seq2seq: ``memory`` comes with the rows)."""

    def __init__(self, model: Model):
        self.model, self.seq2seq = model, hasattr(model, "memory")

    def native(self, array: np.ndarray):
        return self.model.arrays.asarray(array, device=self.model.device)

    def inputs(self, fed: list[list[int]], starts: list[int], width: int) -> tuple:
        """``ids (B,T)`` and ``positions (B,T)`` of rows ``fed`` from ``starts``, ``T = width``."""
        real = np.arange(width)[None, :] < np.array([len(f) for f in fed])[:, None]  # (B,T)
        ids = np.full(real.shape, self.model.config.pad_id, dtype=np.int64)
        ids[real] = [t for f in fed for t in f]
        return self.native(ids), self.native(positions_of(real, np.array(starts)))

    def logits(self, fed, starts, cache, *, width: int, last: bool, memory=None) -> np.ndarray:
        """The pass -> logits ``(B,T,V)`` float64 (``(B,1,V)`` with ``last``: each row's last
        fed token); ``memory``: a seq2seq model's ``(memory, its positions)``."""
        model = self.model
        ids, positions = self.inputs(fed, starts, width)
        with model.arrays.inference():
            if not self.seq2seq:
                out = model.transformer(ids, positions, cache, last=last)  # (B,T,V) or (B,1,V)
                return model.arrays.to_numpy(out).astype(np.float64)
            out = model.transformer(ids, positions, *memory, cache)  # (B,T,V)
        out = model.arrays.to_numpy(out).astype(np.float64)
        if not last:
            return out
        at = np.maximum([len(f) - 1 for f in fed], 0)  # (B,) each row's last fed token
        return out[np.arange(len(fed)), at][:, None]  # (B,1,V)

    def memory(self, sources: list[list[int]]) -> tuple:
        """A seq2seq batch's encoded sources -> ``(memory (B,S,D), positions (B,S))``."""
        width = max(map(len, sources))
        src, positions = self.inputs(sources, [0] * len(sources), width)
        with self.model.arrays.inference():
            return self.model.memory(src, positions), positions


class LevelCache:
    """The level's own cache for a fixed batch: ``open(seqs)`` gives each its row."""

    fixed = True

    def __init__(self, model: Model):
        self.model, self.kv = model, None

    def open(self, seqs: list[Sequence]) -> None:
        self.kv = self.model.new_cache(len(seqs))
        for row, seq in enumerate(seqs):
            seq.row = row

    def width(self, T: int, k: int) -> int:
        """A pass of guesses takes ``k + 1`` positions a row where the cache has room: one
        shape, which a compiled pass of ``k + 1`` tokens takes."""
        return max(T, min(k + 1, self.kv.capacity - self.kv.length)) if T > 1 and k else T

    def cache(self, seqs: list[Sequence], width: int):
        if self.kv.length + width > self.kv.capacity:
            raise ValueError(f"KV cache overflow: {self.kv.length} + {width} > {self.kv.capacity}")  # fmt: skip
        return self.kv

    def keep(self, seqs: list[Sequence], fed: list[int], kept: list, width: int) -> None:
        """After a pass of ``width`` slots a row from slot ``L``: row ``b`` fed ``fed[b]`` tokens
        and keeps ``kept[b]`` of them (None: all, and the padding after); the cache keeps
        ``L + m`` slots, ``m`` the fewest any row keeps, and row ``b`` has ``min(m, kept[b])``
        more of its tokens cached (what it kept past ``m`` it feeds again)."""
        start = self.kv.length - width
        m = min((k for k in kept if k is not None), default=width)
        self.kv.rollback(start + m)
        for seq, n, k in zip(seqs, fed, kept, strict=True):
            seq.cached += min(m, n if k is None else k)

    def close(self, seqs: list[Sequence]) -> None:
        self.kv = None


class NoCache(LevelCache):
    """No cache: each pass feeds each row all its tokens (``cached`` stays 0)."""

    def open(self, seqs: list[Sequence]) -> None:
        for row, seq in enumerate(seqs):
            seq.row = row

    def cache(self, seqs, width):
        return None

    def keep(self, seqs, fed, kept, width) -> None:
        pass


class PagedCache:
    """The level's paged cache (``kernels.paged_kv_cache``) over a ``BlockPool`` of
    ``blocks`` blocks (default: the whole context for each of ``rows`` sequences)."""

    fixed = False

    def __init__(self, model: Any, rows: int, blocks=None, block_size=None, prefix_cache=True):
        self.model, self.prefix_cache, size = model, prefix_cache, block_size or BLOCK_SIZE
        self.paged = model.kernels.paged_kv_cache  # levels 2 to 4
        blocks = blocks or rows * -(-model.config.max_seq_len // size)
        storage = self.paged.storage(model.config, blocks, size, device=model.device, dtype=model.dtype)  # fmt: skip
        self.pool = BlockPool(*storage, blocks, size)

    def cache(self, seqs: list[Sequence], width: int):
        """The pass's cache, its blocks taken (``OutOfBlocks``: none taken)."""
        self.pool.reserve([s.blocks for s in seqs], width)
        return self.paged(self.pool, [s.blocks for s in seqs], self.model.config)

    def width(self, T: int, k: int) -> int:
        return T

    def keep(self, seqs: list[Sequence], fed: list[int], kept: list, width: int) -> None:
        """Each sequence's count set to what it kept, the blocks past it given back, its full
        blocks filed for later prompts (``prefix_cache``)."""
        for seq, n, k in zip(seqs, fed, kept, strict=True):
            seq.cached += n if k is None else k
            seq.blocks.count = seq.cached
            self.pool.trim(seq.blocks)
            if self.prefix_cache:
                self.pool.publish(seq.blocks, seq.tokens)

    def admit(self, seq: Sequence) -> bool:
        """Give ``seq`` the published blocks its tokens begin with, if the pool has room for
        the rest -> whether it has (else it holds nothing). The last token is always
        computed: its logits choose the next one."""
        table = self.pool.match(seq.tokens[:-1] if self.prefix_cache else [])
        if self.pool.needed([table], len(seq.tokens) - table.count) > self.pool.available:
            self.pool.free(table)
            return False
        seq.blocks, seq.cached = table, table.count
        seq.found = table.count if seq.found is None else seq.found
        return True

    def release(self, seq: Sequence) -> None:
        if seq.blocks is not None:
            self.pool.free(seq.blocks)
        seq.blocks, seq.cached = None, 0
