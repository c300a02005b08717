"""Drafts: what guesses a sequence's next tokens for speculative decoding.

A draft's ``propose(context, k, row, sampling) -> (tokens, q_rows)`` gives at most ``k``
tokens continuing ``context`` and the distributions they were drawn from (``q``; None for
a draft that chooses deterministically). The step (``step.py``) checks them against the
model's own distributions in one pass; what a draft guesses changes the speed, never the
tokens' law.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from levels.common.sampling import Sampling, distribution, draw

from .runner import Runner


@dataclass(frozen=True)
class NGramDraft:
    """Prompt lookup: find the context's last ``n`` tokens earlier in the context and
    propose what followed them. No model, no randomness (``q`` one-hot).

    ``n`` runs from ``max_n`` down to ``min_n``; the first ``n`` with a match wins, since a
    longer match is better evidence, and among its matches the latest (text repeats what
    it said last: a loop, a list going on, a line being copied). The tokens that followed
    are copied as LZ77 copies: a match close to the end overlaps what it proposes, so the
    copy reads its own proposals and ``a b a b`` goes on ``a b ..`` for ``k`` tokens. No
    match: no tokens, and the pass is plain decoding.
    """

    max_n: int = 3
    min_n: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.min_n, int) and isinstance(self.max_n, int)):
            raise TypeError(f"min_n and max_n must be integers, got {self.min_n!r}, {self.max_n!r}")
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}")  # fmt: skip

    def propose(self, context: list[int], k: int, row: int = 0, sampling=None):
        """Up to ``k`` tokens copied from after the latest longest match (``row`` and
        ``sampling`` play no part: the proposal is a lookup, one-hot)."""
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0:
            raise ValueError(f"k must be an integer >= 0, got {k!r}")
        ids = np.asarray(context, dtype=np.int64)  # (T,)
        start = self.source(ids)
        if start is None:
            return [], None
        T, tokens = len(ids), []
        for j in range(k):
            i = start + j  # past the context's end, a token this proposal already made
            tokens.append(int(ids[i]) if i < T else tokens[i - T])
        return tokens, None

    def source(self, ids: np.ndarray) -> int | None:
        """Where the proposal is copied from: the position after the chosen match of the
        last ``n`` tokens of ``ids (T,)``, or None."""
        T = len(ids)
        for n in range(min(self.max_n, T - 1), self.min_n - 1, -1):
            # Every n-gram with a token after it: those starting at 0 .. T - n - 1.
            windows = sliding_window_view(ids[: T - 1], n)  # (T - n, n)
            hits = np.flatnonzero((windows == ids[T - n :]).all(axis=1))
            if hits.size:
                return int(hits[-1]) + n
        return None


def commands_ngram() -> NGramDraft:
    """The n-gram draft ``--speculate ngram`` names (the commands, a server's request, the
    bench): matches of two to four tokens, since one matching token is weak evidence and a
    wrong guess costs a pass."""
    return NGramDraft(max_n=4, min_n=2)


DRAFT_STREAM = 0xD4AF7  # what sets a draft's stream apart from its sequence's, same seed


class ModelDraft:
    """A draft that is a model: any level's of the same vocabulary, a cheaper copy of the
    target (level 3's int8 or int4 weights), or the target's first layers
    (``model.first_layers(n)``).

    It guesses ``k`` tokens a pass at a time (the engine's runner, one token a row), each
    drawn from its processed distribution under the target's sampling, which it reports as
    ``q``: greedy, its argmax. It keeps a cache for each sequence (``row``) and, before
    guessing, brings it to the context: the longest prefix it holds is kept (a rollback
    drops the rest, its own rejected guesses among them), the context's rest runs in one
    pass. Its draws come from the sequence's seed (``open``), or ``seed`` and the row.
    """

    def __init__(self, model, *, seed: int | None = None):
        self.model, self.seed, self.runner = model, seed, Runner(model)
        self._rows: dict[int, tuple[object, list[int], np.random.Generator]] = {}

    def open(self, row: int, seed: int | None = None) -> None:
        """Start sequence ``row`` afresh, its draws seeded by ``seed`` (its request's), in a
        stream of their own: a draft drawing the very uniforms the rule then tests its
        guesses with would make the two agree too often, and the tokens' law would no
        longer be the model's."""
        entropy = [seed, DRAFT_STREAM] if seed is not None else (None if self.seed is None else [self.seed, row])  # fmt: skip
        self._rows[row] = (self.model.new_cache(1), [], np.random.default_rng(entropy))

    def forget(self, row: int) -> None:
        self._rows.pop(row, None)

    def propose(self, context: list[int], k: int, row: int = 0, sampling: Sampling | None = None):
        sampling = sampling or Sampling()
        if row not in self._rows:
            self.open(row)
        cache, held, rng = self._rows[row]
        common = _common_prefix(held, context[:-1])  # keep what matches; its last is re-run
        cache.rollback(common)
        tokens, rows, new = [], [], context[common:]  # the context's rest, then each guess
        for _ in range(k):
            logits = self.runner.logits([new], [common], cache, width=len(new), last=True)
            q = distribution(logits[:, -1], sampling)  # (1, V)
            tokens.append(int(q[0].argmax()) if sampling.greedy else draw(q[0], rng.random()))
            rows.append(q[0])
            common, new = common + len(new), tokens[-1:]
        self._rows[row] = (cache, (context + tokens)[:common], rng)
        return tokens, np.array(rows) if rows else None


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
