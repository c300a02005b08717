"""The runner: a pass's inputs made, the model's plain pass called, its logits back.

The one place a decoding loop calls a model. Each row feeds a list of tokens (its
``todo``, then its draft's guesses) from ``start``, how many of its tokens the cache holds:
the runner makes ``ids (B,T)``, right-padded, and ``positions (B,T)`` (``start, start + 1,
...``, ``-1`` at padding), calls ``model.transformer(ids, positions, cache, last)`` and
hands back float64 numpy. Where keys and values live is a cache's business, behind one
interface (``cache`` for a pass, ``keep`` after it):

* ``LevelCache``: the level's own (``model.new_cache``) for a fixed batch that starts
  together: every pass feeds every row (an ended one, padding), one length for all rows;
* ``PagedCache``: the level's paged cache over a ``BlockPool`` (levels 2 to 4), a table of
  blocks a sequence, so that sequences join and leave between passes;
* ``NoCache``: none; every pass feeds each row all its tokens (``use_cache=False``).
"""

from __future__ import annotations

import numpy as np

from levels.common.semantics import positions_of

from .blocks import BLOCK_SIZE, BlockPool
from .protocols import Model
from .request import Sequence


class Runner:
    """Passes of ``model`` (decoder-only; or seq2seq, whose rows come with ``memory``)."""

    def __init__(self, model: Model):
        self.model, self.seq2seq = model, hasattr(model, "memory")

    def inputs(self, fed: list[list[int]], starts: list[int], width: int) -> tuple:
        """``ids (B,T)`` and ``positions (B,T)`` of rows ``fed`` from ``starts``, ``T = width``."""
        real = np.arange(width)[None, :] < np.array([len(f) for f in fed])[:, None]  # (B,T)
        ids = np.full(real.shape, self.model.config.pad_id, dtype=np.int64)
        ids[real] = [t for f in fed for t in f]
        native = self.model.arrays.asarray
        device = self.model.device
        return native(ids, device=device), native(positions_of(real, np.array(starts)), device=device)  # fmt: skip

    def logits(self, fed, starts, cache, *, width: int, last: bool, memory=None) -> np.ndarray:
        """The pass -> logits ``(B,T,V)`` float64, or ``(B,1,V)`` with ``last`` (each row's
        last fed token); ``memory``: a seq2seq model's ``(memory, its positions)``."""
        model, arrays = self.model, self.model.arrays
        ids, positions = self.inputs(fed, starts, width)
        with arrays.inference():
            if not self.seq2seq:
                return arrays.to_numpy(model.transformer(ids, positions, cache, last=last)).astype(np.float64)  # fmt: skip
            out = arrays.to_numpy(model.transformer(ids, positions, *memory, cache)).astype(np.float64)  # fmt: skip
        at = np.maximum([len(f) - 1 for f in fed], 0)  # (B,) each row's last fed token
        return out[np.arange(len(fed)), at][:, None] if last else out

    def memory(self, sources: list[list[int]]) -> tuple:
        """A seq2seq batch's sources encoded -> ``(memory (B,S,D), positions (B,S))``."""
        src, positions = self.inputs(sources, [0] * len(sources), max(map(len, sources)))
        with self.model.arrays.inference():
            return self.model.memory(src, positions), positions


class LevelCache:
    """The level's own cache for a fixed batch; ``open(seqs)`` gives each its row."""

    fixed = True

    def __init__(self, model: Model):
        self.model, self.kv = model, None

    def open(self, seqs: list[Sequence]) -> None:
        self.kv = self.model.new_cache(len(seqs))
        for row, seq in enumerate(seqs):
            seq.row = row

    def close(self, seqs: list[Sequence]) -> None:
        self.kv = None

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
        and keeps ``kept[b]`` of them (None: all, and the padding after). The cache keeps
        ``L + m`` slots, ``m`` the fewest any row keeps, and row ``b`` has ``min(m, kept[b])``
        more of its tokens cached: what it kept past ``m`` it feeds again."""
        m = min((k for k in kept if k is not None), default=width)
        self.kv.rollback(self.kv.length - width + m)
        for seq, n, k in zip(seqs, fed, kept, strict=True):
            seq.cached += min(m, n if k is None else k)


class NoCache(LevelCache):
    """No cache: each pass feeds each row all its tokens (``cached`` stays 0)."""

    def cache(self, seqs, width) -> None:
        return None

    def keep(self, seqs, fed, kept, width) -> None:
        pass


class PagedCache:
    """The level's paged cache (``kernels.paged_kv_cache``) over a pool of ``blocks`` blocks
    (default: the whole context for each of ``rows`` sequences); ``prefix_cache``: full
    blocks are filed by their tokens and found by later prompts."""

    fixed = False

    def __init__(self, model, rows: int, blocks=None, block_size=None, prefix_cache=True):
        self.model, self.prefix_cache, size = model, prefix_cache, block_size or BLOCK_SIZE
        self.paged = model.kernels.paged_kv_cache
        blocks = blocks or rows * -(-model.config.max_seq_len // size)
        storage = self.paged.storage(model.config, blocks, size, device=model.device, dtype=model.dtype)  # fmt: skip
        self.pool = BlockPool(*storage, blocks, size)

    def admit(self, seq: Sequence) -> bool:
        """Give ``seq`` the published blocks its tokens begin with, if the pool has room for
        the rest -> whether it has (else it holds nothing). Its last token is always
        computed: its logits choose the next one."""
        found = self.prefix_cache and not seq.scoring  # a prompt to score is computed whole
        table = self.pool.match(seq.tokens[:-1] if found else [])
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

    def width(self, T: int, k: int) -> int:
        return T

    def cache(self, seqs: list[Sequence], width: int):
        """The pass's cache, its blocks taken (``OutOfBlocks``: none taken)."""
        self.pool.reserve([s.blocks for s in seqs], width)
        return self.paged(self.pool, [s.blocks for s in seqs], self.model.config)

    def keep(self, seqs: list[Sequence], fed: list[int], kept: list, width: int) -> None:
        """Each sequence's count set to what it kept, the blocks past it given back, its full
        blocks filed for later prompts."""
        for seq, n, k in zip(seqs, fed, kept, strict=True):
            seq.cached += n if k is None else k
            seq.blocks.count = seq.cached
            self.pool.trim(seq.blocks)
            if self.prefix_cache:
                self.pool.publish(seq.blocks, seq.tokens)
