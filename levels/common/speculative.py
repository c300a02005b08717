"""Speculative decoding, the part that needs no model: the rule, a draft, the arithmetic.

A decode step reads every weight of the model to make one token (docs/decoding.md).
A pass over ``k + 1`` tokens reads the weights once too and does ``k + 1`` times the
arithmetic, which costs little while a step is bound by its bytes. Speculative
decoding (Leviathan et al. 2023, Chen et al. 2023) spends that: a cheap *draft*
proposes ``k`` tokens, the *target* model scores all of them in one pass, and the
rule below keeps a prefix of them and adds one token of the target's own, so that
the tokens come out with exactly the law of the target sampled one token at a time.

The rule, for one row. The draft proposed ``x_0 .. x_{k-1}``, drawing ``x_i`` from
``q_i``; ``p_i`` is the target's distribution of the token after the context and
``x_0 .. x_{i-1}``. Both are *processed* distributions, after temperature, top-k and
top-p (``levels.common.sampling.distribution``), and ``q_i`` must be the one ``x_i``
was really drawn from. For ``i = 0, 1, ..``:

1. keep ``x_i`` with probability ``min(1, p_i(x_i) / q_i(x_i))`` (``acceptance``);
2. on the first rejection, draw the next token from ``norm(max(p_i - q_i, 0))``,
   over the whole vocabulary (``residual``), and stop;
3. when all ``k`` are kept, draw one more token from ``p_k``.

Why it is exact, in one line: a token ``t`` comes out of step ``i`` either as the
draft's, with probability ``q(t) min(1, p(t)/q(t)) = min(p(t), q(t))``, or from the
residual after a rejection, with probability ``(1 - sum min(p, q)) r(t)``, and
``r(t) = max(p(t) - q(t), 0) / (1 - sum min(p, q))``: the two add up to ``p(t)``.
``tests/test_speculative.py`` enumerates every path with ``fractions.Fraction`` and
finds the law equal to ``p``; ``acceptance``, ``residual`` and ``outcome_law`` run on
arrays of ``Fraction`` for that, ``verify`` on float64 with a generator.

Greedy decoding is the case of one-hot ``p`` (``distribution`` at temperature 0: the
argmax, lowest id on a tie): a draft token is kept iff it is the argmax, and a
rejection yields the argmax, so the tokens are plain greedy decoding's. And plain
decoding is the case of no guess: one draw from ``p_0``. The engine's step
(engine/step.py) runs this rule for every token the ladder writes; a draft that is a
model is the engine's (engine/drafts.py), the n-gram draft here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .sampling import draw

# ----------------------------------------------------------------------------- the rule


def acceptance(p: np.ndarray, q: np.ndarray, x: int):
    """``min(1, p[x] / q[x])``: the probability that ``x``, drawn from ``q (V,)``, is kept
    against ``p (V,)``. ``q[x] > 0``, since ``x`` was drawn from ``q``."""
    return min(1, p[x] / q[x])


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``norm(max(p - q, 0))`` over the whole vocabulary ``(V,)``: the law of the token that
    replaces a rejected draft token. Where ``p <= q`` everywhere (``p == q``, or within
    rounding in floats) a rejection has probability 0 (or of rounding's order): then ``p``."""
    r = np.maximum(p - q, 0)  # (V,)
    total = r.sum()
    return r / total if total > 0 else p


def draft_row(q_rows: np.ndarray | None, drafted: Sequence[int], i: int, like: np.ndarray):
    """``q_i (V,)``: row ``i`` of ``q_rows``, or, for a draft that proposes its tokens
    deterministically (``q_rows=None``), one-hot at ``drafted[i]``, of ``like``'s dtype
    (so that ``Fraction`` rows get ``Fraction``-compatible ones)."""
    if q_rows is not None:
        return q_rows[i]
    q = np.zeros_like(like)  # (V,)
    q[drafted[i]] = 1
    return q


def outcome_law(p_rows: np.ndarray, q_rows: np.ndarray | None, drafted: Sequence[int]) -> dict:
    """The exact law of ``verify``'s ``(n_accepted, next_token)`` for these drafted tokens:
    ``{(n, token): probability}`` over the outcomes of positive probability.

    ``p_rows (k + 1, V)``, ``q_rows (k, V)`` or None (one-hot at the drafted tokens),
    ``drafted (k,)``; on ``Fraction`` rows the probabilities are exact."""
    law: dict[tuple[int, int], object] = {}
    kept = 1  # the probability that x_0 .. x_{i-1} were all kept
    for i, x in enumerate(drafted):
        q = draft_row(q_rows, drafted, i, p_rows[i])  # (V,)
        a = acceptance(p_rows[i], q, x)
        if a < 1:
            for t, r in enumerate(residual(p_rows[i], q)):
                if r > 0:
                    law[i, t] = kept * (1 - a) * r
        kept = kept * a
        if kept == 0:  # x_i is never kept: no outcome goes further
            return law
    k = len(drafted)
    for t, pt in enumerate(p_rows[k]):
        if pt > 0:
            law[k, t] = kept * pt
    return law


def verify(
    p_rows: np.ndarray,
    q_rows: np.ndarray | None,
    drafted: Sequence[int],
    rng: np.random.Generator | None,
) -> tuple[int, int]:
    """One row's verification: ``(n_accepted, next_token)``; the row emits
    ``drafted[:n_accepted]`` then ``next_token``.

    ``p_rows (k + 1, V)``: the target's processed distributions, row ``i`` after the
    context and ``drafted[:i]`` (``sampling.distribution`` of the pass's logits).
    ``q_rows (k, V)``: the distributions the drafted tokens were drawn from, or None for
    a draft that proposes them deterministically (one-hot ``q``). ``drafted (k,)``,
    ``k >= 0``.

    The randomness comes from the row's own generator ``rng``, in this order: one
    uniform per drafted token tested, in order, until the first rejection; then one
    for the token drawn after (from the residual or from ``p_rows[k]``, by
    ``sampling.draw``). That is ``n_accepted + 2`` draws after a rejection and ``k + 1``
    when all are kept. A draft that samples draws its tokens from its own generator,
    before this. ``rng=None`` is greedy: ``p_rows`` must be one-hot (temperature 0),
    which decides every test and the last draw whatever the uniform: none is drawn,
    and ``u = 0`` stands for each.
    """
    p_rows = np.asarray(p_rows, dtype=np.float64)  # (k + 1, V)
    q_rows = None if q_rows is None else np.asarray(q_rows, dtype=np.float64)  # (k, V)
    _check(p_rows, q_rows, drafted, greedy=rng is None)

    def uniform() -> float:
        return 0.0 if rng is None else rng.random()

    for i, x in enumerate(drafted):
        q = draft_row(q_rows, drafted, i, p_rows[i])  # (V,)
        if not uniform() < acceptance(p_rows[i], q, x):
            return i, draw(residual(p_rows[i], q), uniform())
    return len(drafted), draw(p_rows[-1], uniform())


def masked_rows(rows: np.ndarray, guesses: list[int], constraint) -> np.ndarray:
    """``rows (n + 1, V)``, row ``i`` masked by the language after ``guesses[:i]`` (on a copy
    of ``constraint``: the sequence's own moves on by what is kept). After a guess the
    language refuses, the rows are that guess's own: it has ``p = 0`` and is rejected
    there, so no later row is read."""
    state, out = copy.copy(constraint), []
    for i in range(len(rows)):
        out.append(state.apply(rows[i][None])[0])
        if i < len(guesses):
            try:
                state.advance(guesses[i])
            except ValueError:  # refused: p(guesses[i]) = 0 in the row just masked
                out += [out[-1]] * (len(rows) - 1 - i)
                break
    return np.array(out)


def _check(p_rows: np.ndarray, q_rows, drafted: Sequence[int], *, greedy: bool) -> None:
    """``verify``'s inputs: the shapes, drafted ids in range and of positive ``q``, and
    one-hot target rows where there is no generator."""
    k = len(drafted)
    if p_rows.ndim != 2 or len(p_rows) != k + 1:
        raise ValueError(f"p_rows must be (k + 1, V) = ({k + 1}, V), got {p_rows.shape}")
    V = p_rows.shape[1]
    if any(not 0 <= x < V for x in drafted):
        raise ValueError(f"drafted tokens must be ids in [0, {V}), got {list(drafted)}")
    if q_rows is not None:
        if q_rows.shape != (k, V):
            raise ValueError(f"q_rows must be (k, V) = ({k}, {V}), got {q_rows.shape}")
        if any(q_rows[i, x] <= 0 for i, x in enumerate(drafted)):
            raise ValueError("a drafted token has probability 0 in the q it was drawn from")
    if greedy and not (((p_rows == 1).sum(-1) == 1) & ((p_rows == 0).sum(-1) == V - 1)).all():
        raise ValueError("without a generator (greedy) the target rows must be one-hot")


# ----------------------------------------------------------------------------- a draft


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
        """Where to copy from: after the chosen match of ``ids (T,)``'s last ``n``, or None."""
        T = len(ids)
        for n in range(min(self.max_n, T - 1), self.min_n - 1, -1):
            windows = sliding_window_view(ids[: T - 1], n)  # (T - n, n): each with a token after
            hits = np.flatnonzero((windows == ids[T - n :]).all(axis=1))
            if hits.size:
                return int(hits[-1]) + n
        return None


def commands_ngram() -> NGramDraft:
    """The n-gram draft ``--speculate ngram`` names (the commands, a server's request, the
    bench): matches of two to four tokens, since one matching token is weak evidence and a
    wrong guess costs a pass."""
    return NGramDraft(max_n=4, min_n=2)


# ----------------------------------------------------------------------------- the arithmetic


def acceptance_rate(p: np.ndarray, q: np.ndarray):
    """``sum(min(p, q))``: the probability that a token drawn from ``q`` is kept against
    ``p`` (one minus their total variation distance), Leviathan et al.'s ``beta``."""
    return np.minimum(p, q).sum()


def expected_tokens(a: float, k: int) -> float:
    """Tokens a pass emits on average when each of ``k`` drafted tokens is kept with
    probability ``a``, independently: ``1 + a + .. + a^k = (1 - a^(k+1)) / (1 - a)``."""
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def speedup(a: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Decoding time without speculation over time with it (Leviathan et al. 2023):
    a pass costs ``k`` draft steps of ``c`` target steps each plus the verification,
    ``verify_cost`` target steps (1 while a ``k + 1``-token pass is bound by the bytes
    it reads, as a one-token step is), and emits ``expected_tokens(a, k)``."""
    return expected_tokens(a, k) / (k * c + verify_cost)


def paced_guesses(acceptances: Sequence[float], others: int, k_max: int,
                  seconds: Callable[[int], float], guess_seconds: float) -> int:  # fmt: skip
    """How many guesses a pass should make: the ``k`` in ``0 .. k_max`` whose expected tokens a
    second are the most (the fewest guesses on a tie). The drafting rows keep guesses with
    probabilities ``acceptances``, ``others`` rows take one token whatever ``k``; a pass of
    ``1 + k`` tokens a row takes ``seconds(k)``, each guess ``guess_seconds`` of drafting.
    ``k = 0`` is plain decoding: speculation that does not pay is not made."""

    def rate(k: int) -> float:
        tokens = others + sum(expected_tokens(a, k) for a in acceptances)
        return tokens / (seconds(k) + k * len(acceptances) * guess_seconds)

    return max(range(k_max + 1), key=rate)


PACED = 4  # the most guesses a paced pass makes
PROBE = 16  # paced passes without a guess before one guesses again, to see what a draft keeps


class Pace:
    """When speculation pays, from what it costs here: the seconds of a pass of ``rows`` rows
    of ``width`` tokens, and of a guess, each averaged as the machine goes (a tenth for each
    new time; a shape's first pass, which pays its one-time costs, not counted). ``guesses``
    chooses a pass's (``paced_guesses``): a width not timed yet is taken on the line from a
    step's time to the nearest wider pass timed, or as cheap as a step where none is, so
    it is tried; after ``PROBE`` passes without a guess, one guesses again."""

    def __init__(self):
        self.seconds: dict[tuple[int, int], float] = {}
        self.guess_s: float | None = None
        self._seen: set[tuple[int, int]] = set()
        self._plain = 0

    def passed(self, rows: int, width: int, seconds: float) -> None:
        if (rows, width) in self._seen:
            self.seconds[rows, width] = _averaged(self.seconds.get((rows, width)), seconds)
        self._seen.add((rows, width))

    def guessed(self, seconds: float) -> None:
        self.guess_s = _averaged(self.guess_s, seconds)

    def for_counts(self, counts: Sequence[Counts], others: int, width: Callable[[int], int]) -> int:  # fmt: skip
        """``guesses`` for rows whose drafts' ``counts`` say how many they kept over their
        last 8 passes (a prior of one kept in two); none without such a row."""
        rates = [estimate_acceptance(c.kept[-8:] + [1], c.guessed[-8:] + [2]) for c in counts]
        return self.guesses(rates, others, width) if counts else 0

    def guesses(self, acceptances: Sequence[float], others: int, width: Callable[[int], int]) -> int:  # fmt: skip
        """Guesses for this pass of ``len(acceptances) + others`` rows, the drafting rows'
        acceptances given; ``width(k)``: the pass's width with ``k`` guesses a row."""
        rows = len(acceptances) + others
        plain = self.seconds.get((rows, 1))
        if not acceptances or plain is None:
            return 0 if plain is None else PACED  # a step timed first, then a guess tried
        k = paced_guesses(acceptances, others, PACED, lambda k: self._time(rows, width(k), plain),
                          self.guess_s or 0.0)  # fmt: skip
        self._plain = self._plain + 1 if k == 0 else 0
        if self._plain > PROBE:  # a probe: what does the draft keep now?
            self._plain, k = 0, PACED
        return k

    def _time(self, rows: int, width: int, plain: float) -> float:
        if (rows, width) in self.seconds:  # never below a step: a wider pass reads the same
            return max(plain, self.seconds[rows, width])  # weights and does more (noise aside)
        wider = min((w for r, w in self.seconds if r == rows and w > width), default=None)
        if wider is None:
            return plain
        return plain + (self.seconds[rows, wider] - plain) * (width - 1) / (wider - 1)


def _averaged(old: float | None, new: float) -> float:
    return new if old is None else 0.9 * old + 0.1 * new


def estimate_acceptance(accepted: Sequence[int], drafted: Sequence[int]) -> float:
    """``a`` from a run: tokens kept over tokens tested. A pass that kept ``n`` of ``d``
    drafted tokens tested ``n + 1`` of them when it rejected one (``n < d``) and ``d``
    when it kept all; the tokens after a rejection were never tested. NaN: none tested."""
    tested = sum(n + (n < d) for n, d in zip(accepted, drafted, strict=True))
    return sum(accepted) / tested if tested else float("nan")


@dataclass
class Counts:
    """What speculation did: target passes, tokens guessed and kept, in all and for each
    pass (``guessed``, ``kept``: what ``estimate_acceptance`` reads)."""

    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    guessed: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)

    def add(self, guessed: int, kept: int) -> None:
        self.drafted, self.accepted = self.drafted + guessed, self.accepted + kept
        self.guessed.append(guessed)
        self.kept.append(kept)

    @property
    def acceptance(self) -> float:
        """``a``: the share of the tested guesses that were kept (NaN when none was tested)."""
        return estimate_acceptance(self.kept, self.guessed)
