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
rejection yields the argmax, so the tokens are plain greedy decoding's.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .sampling import Sampling, distribution, draw, pick

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


# ----------------------------------------------------------------------------- drafts


class Draft(Protocol):
    """What proposes tokens: ``propose(context, k, row=0, sampling=None) -> (tokens, q_rows)``,
    at most ``k`` tokens continuing ``context`` (row ``row`` of a batch: a draft with a
    model keeps a cache a row) and the ``(len(tokens), V)`` processed distributions they
    were drawn from (under ``sampling``, the target's), or None when they were chosen
    deterministically (one-hot)."""

    def propose(
        self, context: list[int], k: int, row: int = 0, sampling: Sampling | None = None
    ) -> tuple[list[int], np.ndarray | None]: ...


@dataclass(frozen=True)
class NGramDraft:
    """Prompt lookup: find the context's last ``n`` tokens earlier in the context and
    propose what followed them. No model, no randomness (``q`` one-hot).

    ``n`` runs from ``max_n`` down to ``min_n``; the first ``n`` with a match wins, since a
    longer match is better evidence. Among several matches of that ``n`` the latest
    wins: text repeats what it said last (a loop, a list going on, the line being
    copied), and the rule is deterministic. The tokens that followed are copied as
    LZ77 copies: a match close to the end overlaps what it proposes, so the copy reads
    its own proposals and a repeating pattern goes on for ``k`` tokens (``a b a b`` ->
    ``a b a ..``). No match: no tokens, and the step is plain decoding.
    """

    max_n: int = 3
    min_n: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.min_n, int) and isinstance(self.max_n, int)):
            raise TypeError(f"min_n and max_n must be integers, got {self.min_n!r}, {self.max_n!r}")
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(
                f"need 1 <= min_n <= max_n, got min_n={self.min_n}, max_n={self.max_n}"
            )

    def propose(
        self, context: list[int], k: int, row: int = 0, sampling=None
    ) -> tuple[list[int], None]:
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
            # Every n-gram that has a token after it: those starting at 0 .. T - n - 1
            # (the last n tokens themselves, at T - n, are left out).
            windows = sliding_window_view(ids[: T - 1], n)  # (T - n, n)
            hits = np.flatnonzero((windows == ids[T - n :]).all(axis=1))
            if hits.size:
                return int(hits[-1]) + n
        return None


def commands_ngram() -> NGramDraft:
    """The n-gram draft ``--speculate ngram`` names (``ladder chat``/``generate``, a server's
    request, the bench): matches of two to four tokens, since one matching token is weak
    evidence and a wrong guess costs a pass."""
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


def estimate_acceptance(accepted: Sequence[int], drafted: Sequence[int]) -> float:
    """``a`` from a run: tokens kept over tokens tested. A pass that kept ``n`` of ``d``
    drafted tokens tested ``n + 1`` of them when it rejected one (``n < d``) and ``d``
    when it kept all; the tokens after a rejection were never tested. NaN: none tested."""
    tested = sum(n + (n < d) for n, d in zip(accepted, drafted, strict=True))
    return sum(accepted) / tested if tested else float("nan")


# ----------------------------------------------------------------------------- drafts with a model


class ModelDraft:
    """A draft that is a model: any level's of the same vocabulary, a cheaper copy of the
    target (level 3's int8 or int4 weights), or the target's first layers (``first_layers``).

    It proposes ``k`` tokens one pass at a time, each drawn (with a generator of its own,
    seeded by ``seed`` and the row) from its processed distribution under the target's
    sampling, which it reports as ``q``: greedy, its argmax. It keeps a cache for each
    row and, before proposing, brings it to the row's context: the longest prefix it
    holds is kept (a rollback drops the rest, its own rejected guesses among them), the
    context's rest runs in one pass.
    """

    def __init__(self, model, *, seed: int | None = None):
        self.model, self.seed = model, seed
        self._rows: dict[int, tuple[object, list[int], np.random.Generator]] = {}

    def propose(self, context: list[int], k: int, row: int = 0, sampling: Sampling | None = None):
        sampling = sampling or Sampling()
        cache, held, rng = self._rows.get(row) or self._new_row(row)
        common = _common_prefix(held, context[:-1])  # keep what matches; its last is re-run
        cache.rollback(common)
        tokens, rows, new = [], [], context[common:]  # (the context's rest, then each guess)
        with self.model.arrays.inference():
            for _ in range(k):
                logits = self._pass(new, common, cache)  # (1, V) after the last token fed
                q = distribution(logits, sampling)  # (1, V)
                x = (
                    int(pick(logits, sampling, None)[0])
                    if sampling.greedy
                    else draw(q[0], rng.random())
                )
                common += len(new)
                tokens.append(x)
                rows.append(q[0])
                new = [x]
        self._rows[row] = (cache, (context + tokens)[:common], rng)
        return tokens, np.array(rows) if rows else None

    def open(self, row: int, seed: int | None) -> None:
        """Start row ``row`` afresh, its draws seeded by ``seed`` (a server's request: its own
        seed, so that a seeded request's guesses, and so its answer, repeat)."""
        self._rows[row] = self._fresh(seed)

    def forget(self, row: int) -> None:
        """Let row ``row``'s cache go (a server's request that ended)."""
        self._rows.pop(row, None)

    def _new_row(self, row: int):
        return self._fresh(None if self.seed is None else [self.seed, row])

    def _fresh(self, seed):
        """A row's state before its first guess: an empty cache, no context, its generator."""
        return self.model.new_cache(1), [], np.random.default_rng(seed)

    def _pass(self, ids: list[int], start: int, cache) -> np.ndarray:
        """The draft's logits ``(1, V)`` after ``ids`` at positions ``start ...`` into ``cache``."""
        native = self.model.arrays.asarray
        device = getattr(self.model, "device", None)
        ids_, positions = (
            native(np.array([a]), device=device) for a in (ids, range(start, start + len(ids)))
        )
        logits = self.model.transformer(ids_, positions, cache, last=True)  # (1, 1, V)
        return self.model.arrays.to_numpy(logits)[:, -1].astype(np.float64)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def first_layers(model, n: int):
    """The target's first ``n`` layers and its own final norm and head, as a model of its own
    (the same parameters, not copies): the layer-skip draft (Elhoushi et al. 2024's
    self-speculation, without the early-exit training)."""
    if not 1 <= n < model.config.n_layers:
        raise ValueError(f"layers:N drafts with 1 <= N < {model.config.n_layers} layers, got {n}")
    draft = copy.copy(model)  # a new object over the same parameters
    if hasattr(model, "_modules"):  # a torch module: its own table of submodules
        draft.__dict__["_modules"] = dict(model._modules)
    draft.__dict__.pop("transformer", None)  # the plain pass (not a compiled step of all layers)
    draft.layers = model.layers[:n]
    draft.windows = model.windows[:n]
    draft.config = dataclasses.replace(model.config, n_layers=n)  # what its caches hold
    return draft


# ----------------------------------------------------------------------------- the loop over a model


@dataclass
class Counts:
    """What speculation did in a generation: target passes, tokens drafted, and kept, in all
    and for each row's pass (``guessed``, ``kept``: what ``estimate_acceptance`` reads)."""

    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    guessed: list[int] = dataclasses.field(default_factory=list)
    kept: list[int] = dataclasses.field(default_factory=list)

    @property
    def acceptance(self) -> float:
        """``a``: the share of the tested guesses that were kept (NaN when none was tested)."""
        return estimate_acceptance(self.kept, self.guessed)


def speculate(model, prompts: np.ndarray, lengths: np.ndarray, steps: int, *, draft: Draft,
              k: int, sampling: Sampling, generators, stop_ids: tuple[int, ...] = (),
              counts: Counts | None = None, constraints=None) -> Iterator[list[list[int]]]:  # fmt: skip
    """Speculative decoding of ``steps`` tokens after each row's prompt (``prompts (B, P)``,
    right-padded, ``lengths (B,)`` real tokens): yields, after each target pass, the new
    tokens of every row (a finished row's: none). Every pass, each row's draft proposes up
    to ``k`` tokens, one target pass scores them all, and ``verify`` keeps a prefix and
    adds one token of the target's: the tokens are plain decoding's (greedy) or follow the
    target's law exactly (sampling). A row stops after a token of ``stop_ids``; ``counts``
    (``Counts``) adds up the passes and the tokens drafted and kept. ``constraints`` (one a
    row, ``constrained.Constraint``): the target's distributions are the masked ones, each
    after the guesses before it, so that a guess the language refuses has ``p = 0`` and is
    rejected by the rule itself; the text then stays in the language, with the law of
    masked decoding one token at a time.

    Rows keep their own positions, and the cache one length for all: after a pass it keeps
    the slots every row kept (the fewest any row kept); what a row kept beyond them is fed
    again in its next pass (its keys computed again, at the same positions), so no slot is
    ever left behind, and a row with a backlog drafts less meanwhile (``k + 1`` tokens a
    pass at most). A model that compiles its passes (level 3's ``compile=True``) runs them
    compiled where ``model.prepare_decode(B, k + 1)`` prepared that shape.
    """
    counts = counts if counts is not None else Counts()
    B, pad = len(prompts), model.config.pad_id
    native = lambda a: model.arrays.asarray(np.asarray(a), device=model.device)  # noqa: E731
    scores = lambda logits: model.arrays.to_numpy(logits).astype(np.float64)  # noqa: E731
    real = np.arange(prompts.shape[1])[None, :] < lengths[:, None]  # (B, P)
    cache = model.new_cache(B)
    with model.arrays.inference():  # the prompt, and each row's first token from it
        logits = model.transformer(native(prompts), native(np.where(real, real.cumsum(1) - 1, -1)), cache, last=True)  # fmt: skip
    first = scores(logits)[:, -1]  # (B, V)
    if constraints is not None:
        first = np.concatenate(
            [c.apply(row[None]) for c, row in zip(constraints, first, strict=True)]
        )
    made = [[int(t)] for t in pick(first, sampling, generators)]  # each row's new
    for b in range(B if constraints is not None else 0):
        constraints[b].advance(made[b][0])
    yield [list(m) for m in made]
    cached = lengths.copy()  # each row's tokens in the cache
    done = np.array([steps <= 1 or m[-1] in stop_ids for m in made])
    while not done.all():
        context = [list(prompts[b, : lengths[b]]) + made[b] for b in range(B)]
        backlog = [context[b][cached[b] :] for b in range(B)]  # taken, not in the cache yet
        room = [max(0, min(k + 1 - len(backlog[b]), steps - len(made[b]) - 1)) for b in range(B)]
        guesses = [([], None) if done[b] else draft.propose(context[b], room[b], row=b, sampling=sampling)
                   for b in range(B)]  # fmt: skip
        fed = [[] if done[b] else backlog[b] + guesses[b][0] for b in range(B)]
        # A pass with guesses is k + 1 tokens a row where the cache has room (padding at
        # position -1, rolled back with the rest), one shape, which a compiled pass of k + 1
        # tokens takes; a pass with none is the one-token decode step (a draft that found
        # nothing to guess costs nothing more than plain decoding).
        T = max(map(len, fed))
        if T > 1:
            T = max(T, min(k + 1, cache.capacity - cache.length))
        ids = [f + [pad] * (T - len(f)) for f in fed]  # (B, T), a finished row all padding
        positions = [[cached[b] + t if t < len(fed[b]) else -1 for t in range(T)] for b in range(B)]
        before = cache.length
        with model.arrays.inference():
            logits = scores(model.transformer(native(ids), native(positions), cache))  # (B, T, V)
        counts.passes += 1
        new, kept = [[] for _ in range(B)], []
        for b in np.flatnonzero(~done):
            tokens, q_rows = guesses[b]
            at = len(backlog[b]) - 1  # the logits after the row's last token before its guesses
            rows = logits[b, at : at + len(tokens) + 1]  # (n + 1, V)
            if constraints is not None:
                rows = masked(rows, tokens, constraints[b])
            p_rows = distribution(rows, sampling)  # (n + 1, V)
            n, t = verify(p_rows, q_rows, tokens, None if sampling.greedy else generators[b])
            counts.drafted, counts.accepted = counts.drafted + len(tokens), counts.accepted + n
            counts.guessed.append(len(tokens))
            counts.kept.append(n)
            for token in [*tokens[:n], t]:
                new[b].append(token)
                if constraints is not None:
                    constraints[b].advance(token)
                if token in stop_ids or len(made[b]) + len(new[b]) == steps:
                    done[b] = True
                    break
            made[b] += new[b]
            kept.append(len(backlog[b]) + n)
        cache.rollback(before + min(kept))  # the slots every row kept
        cached += min(kept)
        yield new


def masked(rows: np.ndarray, tokens: list[int], constraint) -> np.ndarray:
    """``rows (n + 1, V)``, row ``i`` masked by the language after the guesses ``tokens[:i]``
    (``constraint``'s state, copied: the row's own moves on by what is kept). After a guess
    the language refuses, the rows are that guess's own: it has ``p = 0`` and is rejected
    there, so no later row is read."""
    state, out = copy.copy(constraint), []
    for i in range(len(rows)):
        out.append(state.apply(rows[i][None])[0])
        if i < len(tokens):
            try:
                state.advance(tokens[i])
            except ValueError:  # refused: p(tokens[i]) = 0 in the row just masked
                out += [out[-1]] * (len(rows) - 1 - i)
                break
    return np.array(out)
