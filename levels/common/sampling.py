"""Choosing the next token from logits: greedy, or sampled with temperature, top-k, top-p.

Written once, in numpy and float64, for every level: a level hands over its
logits ``(B, V)`` and gets token ids back, so the same logits give the same
tokens at every rung, and a seed gives the same draws.

The rule, per row, for ``temperature > 0``:

1. ``z = logits / temperature`` (in float64, whatever the level computed in);
2. ``top_k``: keep the tokens whose ``z`` is at least the ``k``-th largest
   (all of a tie at the ``k``-th value are kept, so no tie is broken by id);
3. ``top_p``: keep the smallest set of most probable tokens whose
   probabilities sum to at least ``top_p`` (again with all of a tie at the
   boundary), the nucleus of Holtzman et al.;
4. draw ``u`` uniform in ``[0, 1)`` from the row's generator and take the
   first token id whose cumulative probability, in id order, exceeds
   ``u`` times the kept total: inverse-CDF sampling, one draw per row and step.

Before step 1, where a request asks for them (OpenAI's definitions, on the logits, at
every temperature, greedy included): ``logit_bias`` adds its value to its token's logit
(-100 bans a token in practice, 100 all but forces it), and for each token the sequence
has generated ``c`` times so far (its prompt not counted, as vLLM counts), the logit
loses ``c * frequency_penalty + presence_penalty`` (``penalized``).

Steps 1 to 3 give the *processed distribution*, ``distribution(logits,
sampling)``, written once: ``pick`` draws from it (step 4 is ``draw``), and
speculative decoding (``levels.common.speculative``) tests draft tokens
against it. ``temperature = 0`` is greedy: the argmax, the lowest id on a
tie, and no draw (its distribution is one-hot at that token).

Each row has its own generator, ``numpy.random.default_rng(seed + b)`` for
row ``b`` (or the ``b``-th of a list of seeds), so a row's tokens do not
depend on the other rows of the batch: row ``b`` of a batch equals that row
generated alone with seed ``seed + b``.

In float64 the levels' logits agree to about 1e-15, so a draw lands on a
different token only when ``u`` falls within that of a boundary of the
cumulative distribution. In float32 they agree to about 1e-6, and a near-tie
(two tokens within that of the argmax, or of the top-k or top-p boundary, or
a ``u`` that close to a boundary) may resolve differently at different levels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class Sampling:
    """How ``generate`` picks tokens; checked on construction (``ValueError``, ``TypeError``)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | Sequence[int] | None = None
    frequency_penalty: float = 0.0  # in [-2, 2]: times each generated occurrence of a token
    presence_penalty: float = 0.0  # in [-2, 2]: once a token has been generated at all
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, value in [-100, 100]) pairs

    def __post_init__(self) -> None:
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not -2 <= v <= 2:
                raise ValueError(f"{name} must be a number in [-2, 2], got {v!r}")
        for pair in self.logit_bias:
            ok = len(pair) == 2 and _is_int(pair[0]) and pair[0] >= 0
            v = pair[1] if ok else None
            if not ok or isinstance(v, bool) or not isinstance(v, int | float) or not -100 <= v <= 100:  # fmt: skip
                raise ValueError(f"logit_bias must map token ids >= 0 to numbers in [-100, 100], got {pair!r}")  # fmt: skip
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1):
            raise ValueError(f"top_k must be a positive integer (or None), got {k!r}")
        p = self.top_p
        if p is not None and (
            isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 < p <= 1.0
        ):
            raise ValueError(f"top_p must be a number in (0, 1] (or None), got {p!r}")
        if self.seed is not None:
            seeds = [self.seed] if _is_int(self.seed) else self.seed
            if not isinstance(seeds, Sequence | np.ndarray) or not all(
                _is_int(s) and s >= 0 for s in seeds
            ):
                raise ValueError(
                    f"seed must be a non-negative integer or a sequence of them, got {self.seed!r}"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def adjusts(self) -> bool:
        """Whether a bias or a penalty moves the logits before the rule."""
        return bool(self.logit_bias) or self.frequency_penalty != 0 or self.presence_penalty != 0

    def generators(self, batch: int) -> list[np.random.Generator] | None:
        """One generator per row (None when greedy): ``default_rng(seed + b)``, or the
        ``b``-th seed of a list (which must have one per row); no seed: fresh entropy."""
        if self.greedy:
            return None
        if self.seed is None:
            return [np.random.default_rng() for _ in range(batch)]
        if _is_int(self.seed):
            return [np.random.default_rng(int(self.seed) + b) for b in range(batch)]
        if len(self.seed) != batch:
            raise ValueError(f"seed has {len(self.seed)} entries for a batch of {batch} rows")
        return [np.random.default_rng(int(s)) for s in self.seed]

    def rows(self, batch: int) -> list[Sampling]:
        """The settings of each of ``batch`` rows, each drawing alone: row ``b`` seeded ``seed +
        b``, or by the ``b``-th of a list of seeds (one per row); no seed, or greedy: these."""
        if self.greedy or self.seed is None:
            return [self] * batch
        seeds = [int(self.seed) + b for b in range(batch)] if _is_int(self.seed) else self.seed
        if len(seeds) != batch:
            raise ValueError(f"seed has {len(seeds)} entries for a batch of {batch} rows")
        return [replace(self, seed=int(s)) for s in seeds]


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def penalized(logits: np.ndarray, sampling: Sampling, generated, guesses=()) -> np.ndarray:
    """``logits (n, V)`` with ``sampling``'s logit bias and penalties -> ``(n, V)`` float64; row
    ``i`` follows ``generated`` then ``guesses[:i]`` (a pass of speculative decoding's rows)."""
    if not sampling.adjusts:
        return np.asarray(logits, dtype=np.float64)
    rows = np.array(logits, dtype=np.float64)  # (n, V), a copy
    V = rows.shape[-1]
    for token, value in sampling.logit_bias:
        if token >= V:
            raise ValueError(f"logit_bias names token {token}, outside the vocabulary of {V}")
        rows[:, token] += value
    counts = np.bincount(np.asarray(list(generated), dtype=np.int64), minlength=V).astype(np.float64)  # fmt: skip
    for i in range(len(rows)):
        rows[i] -= sampling.frequency_penalty * counts + sampling.presence_penalty * (counts > 0)
        if i < len(guesses):
            counts[guesses[i]] += 1
    return rows


def keep_mask(z: np.ndarray, top_k: int | None, top_p: float | None) -> np.ndarray:
    """``z (B, V)`` scaled logits -> ``(B, V)`` bool, the tokens top-k and top-p keep."""
    keep = np.isfinite(z)  # (B, V); a -inf logit is never drawn
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.sort(z, axis=-1)[:, -top_k][:, None]  # (B, 1): the k-th largest
        keep &= z >= kth
    if top_p is not None and top_p < 1.0:
        probs = _softmax(np.where(keep, z, -np.inf))  # (B, V)
        order = np.argsort(-probs, axis=-1, kind="stable")  # (B, V) most probable first
        ranked = np.take_along_axis(probs, order, axis=-1)  # (B, V) descending
        before = np.cumsum(ranked, axis=-1) - ranked  # (B, V) mass of the more probable
        # The last kept rank is the first whose cumulative mass reaches top_p; every token
        # at least as probable as it is kept, ties included.
        last = np.argmax(before + ranked >= top_p, axis=-1)  # (B,)
        threshold = ranked[np.arange(len(ranked)), last][:, None]  # (B, 1)
        keep &= probs >= threshold
    return keep


def _softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64 (rows of -inf stay 0 where -inf)."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def distribution(logits: np.ndarray, sampling: Sampling) -> np.ndarray:
    """The processed distribution ``(B, V)`` float64 of ``logits (B, V)``: what ``pick`` draws from.

    Temperature, then top-k and top-p (``keep_mask``), then the softmax of what is kept;
    every other token has probability exactly 0. Greedy (``temperature = 0``): one-hot at
    the argmax (the lowest id on a tie), the distribution that always gives ``pick``'s token.
    """
    logits = np.asarray(logits, dtype=np.float64)  # (B, V)
    if sampling.greedy:
        onehot = np.zeros_like(logits)  # (B, V)
        onehot[np.arange(len(logits)), logits.argmax(axis=-1)] = 1.0
        return onehot
    z = logits / sampling.temperature  # (B, V)
    keep = keep_mask(z, sampling.top_k, sampling.top_p)  # (B, V)
    return np.where(keep, _softmax(np.where(keep, z, -np.inf)), 0.0)  # (B, V)


def draw(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF sampling: the first id of ``probs (V,)`` whose cumulative probability, in
    id order, exceeds ``u`` (uniform in ``[0, 1)``) times the total."""
    cdf = np.cumsum(probs)  # (V,)
    # u < 1, but u * total may round up to the total: then the last token of positive mass.
    last = int(np.flatnonzero(probs)[-1])
    return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), last)


def pick(
    logits: np.ndarray,
    sampling: Sampling,
    generators: list[np.random.Generator] | None,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """Next tokens ``(B,)`` int64 from ``logits (B, V)``; only ``rows`` (bool ``(B,)``,
    default all) draw from their generators, the others take the greedy choice."""
    logits = np.asarray(logits, dtype=np.float64)  # (B, V)
    greedy = logits.argmax(axis=-1).astype(np.int64)  # (B,) lowest id on a tie
    if sampling.greedy:
        return greedy
    probs = distribution(logits, sampling)  # (B, V)
    out = greedy.copy()
    for b in np.flatnonzero(np.ones(len(logits), bool) if rows is None else rows):
        out[b] = draw(probs[b], generators[b].random())
    return out
