"""Speculative decoding's rule, drafts and arithmetic (``levels.common.speculative``), no model.

* The processed distribution (``sampling.distribution``) and the inverse-CDF ``draw``
  at their boundaries.
* Exactness, proved: every draft/accept path enumerated with ``fractions.Fraction`` on
  a toy vocabulary, for ``(p, q)`` pairs with truncated supports both ways, one-hot
  drafts and greedy targets; the first token's law is ``p`` exactly, and over several
  passes the emitted tokens have the law of sampling from ``p`` step by step.
* The anchors' bugs fail the same check: a draft that reports a ``q`` other than the
  processed one it drew from, and a residual over top-N candidate lists subtracted
  position by position.
* ``verify`` against its exact law (chi-square, fixed seeds), its order of draws and its
  thresholds; greedy verification gives plain greedy's tokens.
* The n-gram draft on hand-made contexts; the expected tokens and speed-up formulas.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import chisquare

from engine import NGramDraft
from levels.common.sampling import Sampling, distribution, draw, keep_mask, pick
from levels.common.speculative import (
    acceptance,
    acceptance_rate,
    estimate_acceptance,
    expected_tokens,
    outcome_law,
    residual,
    speedup,
    verify,
)


def exact(probs) -> np.ndarray:
    """A float distribution ``(V,)`` as exact ``Fraction``s summing to exactly 1 (each float
    is a dyadic rational; dividing by their exact sum removes the rounding of the total).
    Zeros stay exactly 0, so a truncation stays a truncation."""
    f = [Fraction(float(x)) for x in probs]
    total = sum(f)
    return np.array([x / total for x in f], dtype=object)


def processed(logits, **sampling) -> np.ndarray:
    """The exact processed distribution ``(V,)`` of one row of logits."""
    return exact(distribution(np.asarray(logits, float)[None], Sampling(**sampling))[0])


# ----------------------------------------------------------------------------- the processed distribution


def test_the_processed_distribution_is_the_kept_softmax():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 9))
    logits[0, [1, 4]] = logits[0].max() + 1  # a tie at the top
    for sampling in (Sampling(0.7), Sampling(1.3, top_k=3), Sampling(0.9, top_p=0.6)):
        probs = distribution(logits, sampling)
        z = logits / sampling.temperature
        keep = keep_mask(z, sampling.top_k, sampling.top_p)
        assert (probs[~keep] == 0).all() and (probs[keep] > 0).all()
        for row in range(len(z)):
            e = np.exp(z[row, keep[row]] - z[row, keep[row]].max())
            np.testing.assert_allclose(probs[row, keep[row]], e / e.sum(), rtol=1e-15)


def test_the_greedy_distribution_is_one_hot_at_the_lowest_tied_argmax():
    logits = np.array([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 5.0, 5.0]])
    assert distribution(logits, Sampling()).tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]
    assert pick(logits, Sampling(), None).tolist() == [1, 0]


def test_draw_at_the_boundaries_of_the_cumulative_distribution():
    probs = np.array([0.25, 0.0, 0.25, 0.5])  # cdf 0.25, 0.25, 0.5, 1
    assert draw(probs, 0.0) == 0  # u = 0: the first token of positive probability
    assert draw(probs, np.nextafter(0.25, 0)) == 0
    assert draw(probs, 0.25) == 2  # exactly on a boundary: the next token; 1 has no mass
    assert draw(probs, 0.5) == 3
    assert draw(np.array([0.0, 0.0, 1.0]), 0.0) == 2
    # u * total rounding up to the total falls on the last token of positive probability,
    # never on a token of probability 0 after it.
    assert draw(np.array([0.5, 0.5, 0.0]), 1.0) == 1


def test_pick_draws_from_the_processed_distribution_with_one_uniform_a_row():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, 11))
    sampling = Sampling(0.8, top_k=6, top_p=0.9, seed=5)
    probs = distribution(logits, sampling)
    by_hand = [np.random.default_rng(5 + b) for b in range(4)]
    want = [draw(probs[b], by_hand[b].random()) for b in range(4)]
    assert pick(logits, sampling, sampling.generators(4)).tolist() == want


# ----------------------------------------------------------------------------- the proof


V = 5
LOGITS = {  # a target's and a draft's logits over a toy vocabulary of five tokens
    "target": [1.2, 0.3, -0.4, 2.0, 0.0],
    "draft": [0.1, 1.5, -0.2, 1.1, -2.0],
    "peaked": [4.0, -1.0, 0.5, 0.0, 3.2],
    "other": [-1.0, 1.0, 0.8, -0.5, 0.2],
    "halves": [np.log(4), 0.0, 0.0, np.log(0.5), np.log(0.5)],  # 4 : 1 : 1 : 1/2 : 1/2
}
PAIRS = {  # name: (p, q), both processed, as exact fractions
    "full supports": (processed(LOGITS["target"], temperature=1.0), processed(LOGITS["draft"], temperature=0.7)),
    "q zero where p is not (draft top-k)": (
        processed(LOGITS["target"], temperature=1.0),
        processed(LOGITS["draft"], temperature=1.0, top_k=2),
    ),
    "p zero where q is not (target top-p)": (
        processed(LOGITS["peaked"], temperature=1.0, top_p=0.8),
        processed(LOGITS["draft"], temperature=1.5),
    ),
    "both truncated, disjoint supports": (
        processed(LOGITS["target"], temperature=0.5, top_k=2),
        processed(LOGITS["other"], temperature=0.5, top_k=2),
    ),
    # top-p reaching 5/7 = 4/7 + 1/7 inside a tie at 1/7: both tied tokens are kept.
    "top-p exactly on its boundary": (
        processed(LOGITS["halves"], temperature=1.0, top_p=5 / 7),
        processed(LOGITS["target"], temperature=2.0, top_k=3, top_p=0.9),
    ),
    "p equal to q": (processed(LOGITS["draft"], temperature=0.7),) * 2,
    "greedy target, sampled draft": (
        processed(LOGITS["target"], temperature=0),
        processed(LOGITS["draft"], temperature=1.0),
    ),
}  # fmt: skip


def test_the_pairs_are_what_their_names_say():
    """The fixtures themselves: the truncations and ties the proof relies on are there."""
    p, q = PAIRS["q zero where p is not (draft top-k)"]
    assert (q == 0).sum() == 3 and (p > 0).all()
    p, q = PAIRS["p zero where q is not (target top-p)"]
    assert (p == 0).any() and (q > 0).all()
    p, q = PAIRS["both truncated, disjoint supports"]
    assert not ((p > 0) & (q > 0)).any()
    p, _ = PAIRS["top-p exactly on its boundary"]
    assert np.flatnonzero(p).tolist() == [0, 1, 2] and p[1] == p[2]  # the tie kept whole


def first_token_law(p, q_drawn, q_told=None, residual_of=residual) -> np.ndarray:
    """The exact law ``(V,)`` of the first token one pass of ``k = 1`` emits, the draft
    token drawn from ``q_drawn``, the rule applied with ``q_told`` (what the draft
    reported) and ``residual_of``. With the defaults this is the rule; the anchors' bugs
    substitute one piece."""
    q_told = q_drawn if q_told is None else q_told
    law = np.zeros(len(p), dtype=object)
    for x in np.flatnonzero(q_drawn):
        a = acceptance(p, q_told, x)
        law[x] += q_drawn[x] * a
        if a < 1:
            law += q_drawn[x] * (1 - a) * residual_of(p, q_told)
    return law


def law_by_enumeration(p_rows, q_rows) -> tuple[np.ndarray, int]:
    """The exact law of the first emitted token, and the number of paths: every drafted
    sequence ``x`` of positive probability under ``q_rows (k, V)`` (context-free rows),
    times every outcome ``verify`` can give for it (``outcome_law``)."""
    law, paths = np.zeros(p_rows.shape[1], dtype=object), 0
    supports = [np.flatnonzero(q) for q in q_rows]
    for drafted in itertools.product(*supports):
        q_prob = np.prod([q_rows[i][x] for i, x in enumerate(drafted)])
        for (n, t), o in outcome_law(p_rows, q_rows, drafted).items():
            law[drafted[0] if n > 0 else t] += q_prob * o
            paths += 1
    return law, paths


@pytest.mark.parametrize("name", list(PAIRS))
def test_the_first_token_has_the_law_p_exactly(name):
    p, q = PAIRS[name]
    assert sum(p) == 1 and sum(q) == 1
    assert (first_token_law(p, q) == p).all()
    # The same through outcome_law, k = 1 and k = 3 (the later rows: another pair), every path.
    p2, q2 = PAIRS["full supports"]
    for k in (1, 3):
        p_rows = np.array([p] + [p2] * k, dtype=object)  # (k + 1, V)
        q_rows = np.array([q] + [q2] * (k - 1), dtype=object)  # (k, V)
        law, paths = law_by_enumeration(p_rows, q_rows)
        assert (law == p).all(), (k, law - p)
        assert paths >= (q > 0).sum()


@pytest.mark.parametrize("name", list(PAIRS))
def test_a_deterministic_draft_any_token_keeps_the_law_p(name):
    """A one-hot ``q`` (the n-gram draft): whatever token it proposes, even one of
    probability 0 under ``p``, the first token's law is ``p``."""
    p, _ = PAIRS[name]
    for x in range(V):
        law = np.zeros(V, dtype=object)
        for (n, t), o in outcome_law(np.array([p, p], dtype=object), None, [x]).items():
            law[x if n > 0 else t] += o
        assert (law == p).all(), (x, law)


@pytest.mark.parametrize("name", list(PAIRS))
def test_the_law_of_n_accepted_and_the_acceptance_rate(name):
    """``P(kept) = sum(min(p, q))``, and ``outcome_law`` is a law (sums to 1)."""
    p, q = PAIRS[name]
    kept = sum(q[x] * acceptance(p, q, x) for x in np.flatnonzero(q))
    assert kept == acceptance_rate(p, q) == sum(min(a, b) for a, b in zip(p, q, strict=True))
    for x in np.flatnonzero(q):
        assert sum(outcome_law(np.array([p, p], dtype=object), np.array([q]), [x]).values()) == 1


def toy(salt: int, temperature: float, **truncation):
    """A toy model over three tokens: context -> exact processed distribution, its logits
    a fixed function of the context (``SeedSequence`` of the ids)."""

    def model(context: tuple[int, ...]) -> np.ndarray:
        logits = 2 * np.random.default_rng([salt, *context]).standard_normal(3)
        return processed(logits, temperature=temperature, **truncation)

    return model


def speculative_law(target, draft, context, m, k):
    """The exact law of the first ``m`` tokens speculative decoding emits from
    ``context``, and how many complete paths (every draft and accept/reject choice of
    every pass) lead there. ``draft(ctx, k)`` lists ``(tokens, probability, q_rows)``,
    each drafted sequence of positive probability; emitted prefixes with the same tokens
    are merged (the process depends on the context only), their path counts added."""
    law: dict = {}
    frontier = {(): (Fraction(1), 1)}  # emitted so far -> (probability, paths)
    while frontier:
        nxt: dict = {}
        for emitted, (prob, count) in frontier.items():
            ctx = context + emitted
            for drafted, q_prob, q_rows in draft(ctx, k):
                p_rows = np.array([target(ctx + drafted[:i]) for i in range(len(drafted) + 1)])
                for (n, t), o in outcome_law(p_rows, q_rows, drafted).items():
                    out = (emitted + drafted[:n] + (t,))[:m]
                    into = law if len(out) == m else nxt
                    p0, c0 = into.get(out, (0, 0))
                    into[out] = (p0 + prob * q_prob * o, c0 + count)
        frontier = nxt
    return {s: pc[0] for s, pc in law.items()}, sum(pc[1] for pc in law.values())


def autoregressive_law(target, context, m):
    """The law of ``m`` tokens sampled from the target one at a time."""
    law = {(): Fraction(1)}
    for _ in range(m):
        law = {
            s + (t,): prob * pt
            for s, prob in law.items()
            for t, pt in enumerate(target(context + s))
            if pt > 0
        }
    return law


def sampled_drafts(model):
    """Every ``k``-token draft a sampling draft model can make, with its probability and
    the ``q`` rows it drew from."""

    def draft(ctx, k):
        found = [((), Fraction(1), [])]
        for _ in range(k):
            found = [
                (toks + (x,), prob * q[x], rows + [q])
                for toks, prob, rows in found
                for q in [model(ctx + toks)]
                for x in np.flatnonzero(q)
            ]
        return [(toks, prob, np.array(rows, dtype=object)) for toks, prob, rows in found]

    return draft


def ngram_drafts(ctx, k):
    tokens, q = NGramDraft(max_n=2).propose(list(ctx), k)
    return [(tuple(tokens), Fraction(1), q)]


TARGET = toy(1, temperature=0.8, top_k=2)
DRAFTS = {
    "sampled, another support": sampled_drafts(toy(2, temperature=1.3, top_p=0.7)),
    "sampled, full support": sampled_drafts(toy(3, temperature=1.0)),
    "n-gram (one-hot)": ngram_drafts,
}


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("draft", list(DRAFTS))
def test_several_passes_emit_the_law_of_sampling_step_by_step(draft, k):
    """The joint law of the first four emitted tokens (one to four passes) equals
    sampling the target four times, exactly, for every draft and ``k``."""
    context, m = (0, 1, 0, 1), 4
    law, paths = speculative_law(TARGET, DRAFTS[draft], context, m, k)
    want = autoregressive_law(TARGET, context, m)
    assert law == want
    assert sum(law.values()) == 1 and paths > len(want)


# ----------------------------------------------------------------------------- the anchors' bugs


def test_a_draft_reporting_q_before_its_own_processing_is_not_exact():
    """The draft drew from its processed distribution (temperature 0.7, top-k 2) and
    reported the raw softmax, as the candidate generators of ``transformers`` did: the
    acceptance ratio is inflated by 1 / (the raw mass top-k keeps), so too many draft
    tokens pass and the law moves towards the draft's."""
    p = processed(LOGITS["target"], temperature=1.0)
    q_drawn = processed(LOGITS["draft"], temperature=0.7, top_k=2)
    assert (first_token_law(p, q_drawn) == p).all()  # reported as drawn: exact
    for q_told in (
        processed(LOGITS["draft"], temperature=1.0),  # before temperature and top-k
        processed(LOGITS["draft"], temperature=0.7),  # before top-k only
        processed(LOGITS["draft"], temperature=1.0, top_k=2),  # before temperature only
    ):
        law = first_token_law(p, q_drawn, q_told)
        assert sum(law) == 1 and (law != p).any()
        assert sum(abs(law - p)) / 2 > Fraction(1, 100)  # total variation over 1%


def top_n_residual(n: int):
    """llama.cpp ``speculative.cpp``'s residual: each model keeps its ``n`` most probable
    tokens as ``(id, p)`` candidates, both lists are sorted by id, and the draft's
    probabilities are subtracted from the target's position by position, whether or not
    position ``i`` holds the same token in both lists."""

    def top(probs):
        return sorted(sorted(range(len(probs)), key=lambda t: -probs[t])[:n])  # ids, ascending

    def residual_of(p, q):
        r = np.zeros(len(p), dtype=object)
        for t, u in zip(top(p), top(q), strict=True):
            r[t] = max(p[t] - q[u], 0)  # right only where t == u
        return r / sum(r)

    return residual_of


def test_a_residual_over_misaligned_candidate_lists_is_not_exact():
    # The target keeps three tokens, {0, 1, 3}; so does one draft, and the other keeps
    # {0, 2, 4}. Lists of three hold every token of positive probability.
    p = processed(LOGITS["target"], temperature=1.0, top_k=3)
    aligned = processed(LOGITS["draft"], temperature=1.0, top_k=3)
    misaligned = processed(LOGITS["peaked"], temperature=1.0, top_k=3)
    assert np.flatnonzero(p).tolist() == np.flatnonzero(aligned).tolist() == [0, 1, 3]
    assert np.flatnonzero(misaligned).tolist() == [0, 2, 4]
    # The same tokens in both lists: position i is one token, the subtraction is the rule's.
    assert (first_token_law(p, aligned, residual_of=top_n_residual(3)) == p).all()
    # Different tokens: p[1] - q[2] and p[3] - q[4] are subtracted, not exact.
    law = first_token_law(p, misaligned, residual_of=top_n_residual(3))
    assert sum(law) == 1 and (law != p).any()
    assert sum(abs(law - p)) / 2 > Fraction(1, 100)
    # The whole vocabulary as the list is always aligned: exact.
    assert (first_token_law(p, misaligned, residual_of=top_n_residual(V)) == p).all()


# ----------------------------------------------------------------------------- verify


def processed_float(name: str, temperature: float, **truncation) -> np.ndarray:
    """The float64 processed distribution ``(V,)`` of one of ``LOGITS``."""
    logits = np.array([LOGITS[name]])  # (1, V)
    return distribution(logits, Sampling(temperature, **truncation))[0]


class Uniforms:
    """A stand-in generator: hands out the given uniforms in order and counts them."""

    def __init__(self, *values: float):
        self.values, self.drawn = list(values), 0

    def random(self) -> float:
        self.drawn += 1
        return self.values.pop(0)


P_ROWS = np.array([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.4, 0.4], [0.25, 0.25, 0.25, 0.25]])
Q_ROWS = np.array([[0.2, 0.6, 0.2, 0.0], [0.0, 0.0, 0.5, 0.5]])


def test_verify_keeps_a_token_iff_the_uniform_is_below_the_ratio():
    # x_0 = 1: ratio 0.3 / 0.6 = 0.5; x_1 = 2: ratio 0.4 / 0.5 = 0.8.
    assert verify(P_ROWS, Q_ROWS, [1, 2], Uniforms(0.5, 0.0)) == (0, 0)  # u = ratio: rejected
    # Rejected at 0: the residual max(p - q, 0) is (0.3, 0, 0, 0): token 0, whatever u.
    assert verify(P_ROWS, Q_ROWS, [1, 2], Uniforms(0.4999, 0.7999, 0.6)) == (2, 2)
    assert verify(P_ROWS, Q_ROWS, [1, 2], Uniforms(0.4999, 0.8, 0.99)) == (1, 1)
    # Rejected at 1: residual (0.1, 0.1, 0, 0) / 0.2; u = 0.99 lands on token 1.


def test_verify_draws_in_its_documented_order():
    """One uniform per token tested until the first rejection, then one for the next token:
    n + 2 draws after a rejection, k + 1 when all are kept."""
    for uniforms, n, drawn in (
        ((0.9, 0.5), 0, 2),
        ((0.1, 0.9, 0.5), 1, 3),
        ((0.1, 0.1, 0.5), 2, 3),
    ):
        rng = Uniforms(*uniforms)
        assert verify(P_ROWS, Q_ROWS, [1, 2], rng)[0] == n
        assert rng.drawn == drawn == len(uniforms)
    rng = Uniforms(0.3)
    assert verify(P_ROWS[:1], Q_ROWS[:0], [], rng) == (0, 0) and rng.drawn == 1  # k = 0: p's draw


def test_verify_and_its_exact_law_agree_by_chi_square():
    """10,000 verifications of the same drafted tokens, one seeded generator: the outcome
    counts against ``outcome_law``. The seed is fixed, so the statistic is too (p = 0.23
    here); the same counts against the law of a draft that misreports q reject at
    p < 1e-12, so the test can tell."""
    p_rows = np.stack([processed_float("target", 1.0), processed_float("other", 1.0)])
    p_rows = np.vstack([p_rows, processed_float("target", 1.5, top_k=4)])  # (3, V)
    q_rows = np.stack([processed_float("draft", 1.0), processed_float("target", 1.0)])  # (2, V)
    drafted = [1, 3]
    law = outcome_law(p_rows, q_rows, drafted)
    rng = np.random.default_rng(2024)
    n = 10_000
    seen = [verify(p_rows, q_rows, drafted, rng) for _ in range(n)]
    outcomes = sorted(law)
    assert set(seen) <= set(outcomes)
    counts = [seen.count(o) for o in outcomes]
    expected = np.array([law[o] for o in outcomes]) * n
    assert expected.min() >= 5  # chi-square's rule of thumb for every cell
    assert chisquare(counts, expected * n / expected.sum()).pvalue > 1e-3
    wrong_q = q_rows.copy()
    wrong_q[0] = processed_float("draft", 2.0)
    wrong = outcome_law(p_rows, wrong_q, drafted)
    wrong_expected = np.array([wrong.get(o, 0) for o in outcomes]) * n
    assert chisquare(counts, wrong_expected * n / wrong_expected.sum()).pvalue < 1e-12


# The p-values with these seeds: 0.52 sampled; one-hot q, 0.62 drafting token 2 (which p
# gives 0) and 0.50 drafting token 3 (p's most probable).
@pytest.mark.parametrize("drafted", ["sampled", 2, 3])
def test_a_draft_then_verify_emits_p_by_chi_square(drafted):
    """End to end with floats: a draft token (drawn from q with the row's generator, or
    a fixed one with one-hot q), verified with that generator; the first emitted token's
    counts against p. Fixed seeds, so the p-values are fixed (above)."""
    p = processed_float("target", 0.9, top_k=4)  # p(2) = 0
    q = processed_float("draft", 1.2, top_p=0.9)  # q(4) = 0
    rng = np.random.default_rng(7)
    n = 20_000
    first = []
    for _ in range(n):
        x = draw(q, rng.random()) if drafted == "sampled" else drafted
        q_rows = q[None] if drafted == "sampled" else None
        accepted, nxt = verify(np.stack([p, p]), q_rows, [x], rng)
        first.append(x if accepted else nxt)
    counts = np.bincount(first, minlength=V)
    assert counts[p == 0].sum() == 0  # top-k's excluded token never comes out
    kept = p > 0
    assert chisquare(counts[kept], n * p[kept]).pvalue > 1e-3


def test_verify_refuses_what_it_cannot_verify():
    with pytest.raises(ValueError, match=r"p_rows must be \(k \+ 1, V\)"):
        verify(P_ROWS[:2], Q_ROWS, [1, 2], Uniforms())
    with pytest.raises(ValueError, match=r"q_rows must be \(k, V\)"):
        verify(P_ROWS, Q_ROWS[:1], [1, 2], Uniforms())
    with pytest.raises(ValueError, match="drafted tokens must be ids"):
        verify(P_ROWS, None, [1, 4], Uniforms())
    with pytest.raises(ValueError, match="probability 0 in the q"):
        verify(P_ROWS, Q_ROWS, [3, 2], Uniforms())  # q_0(3) = 0: not drawn from q_0
    with pytest.raises(ValueError, match="must be one-hot"):
        verify(P_ROWS, None, [1, 2], None)  # no generator, but a sampled target


# ----------------------------------------------------------------------------- greedy


def toy_logits(context) -> np.ndarray:
    """A deterministic toy model over seven tokens with ties everywhere: small integer
    logits, a fixed function of the context."""
    return np.random.default_rng([9, *context]).integers(0, 3, 7).astype(float)


def greedy_decode(context, n):
    out = list(context)
    for _ in range(n):
        out.append(int(pick(toy_logits(out)[None], Sampling(), None)[0]))
    return out


def speculative_decode(context, n, draft, k):
    """Greedy decoding with a draft, every pass verified against the toy model's rows."""
    out = list(context)
    while len(out) < len(context) + n:
        tokens, q_rows = draft.propose(out, k)
        logits = np.stack([toy_logits(out + tokens[:i]) for i in range(len(tokens) + 1)])
        accepted, nxt = verify(distribution(logits, Sampling()), q_rows, tokens, None)
        out += tokens[:accepted] + [nxt]
    return out[: len(context) + n]


class Oracle:
    """Proposes plain greedy's own next tokens: always right."""

    def propose(self, context, k):
        return greedy_decode(context, k)[len(context) :], None


class Wrong:
    """Proposes a token greedy never picks next (the argmax + 1 among the tied or not):
    always wrong."""

    def propose(self, context, k):
        tokens = []
        for _ in range(k):
            best = int(toy_logits(context + tokens).argmax())
            tokens.append((best + 1) % 7)
        return tokens, None


class TiedHigher:
    """Proposes the highest id among the tokens tied at the maximum: right only where
    the maximum is not tied; greedy takes the lowest id."""

    def propose(self, context, k):
        tokens = []
        for _ in range(k):
            z = toy_logits(context + tokens)
            tokens.append(int(np.flatnonzero(z == z.max())[-1]))
        return tokens, None


class Sampler:
    """A sampling draft with a generator of its own, reporting the q it drew from."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def propose(self, context, k):
        tokens, rows = [], []
        for _ in range(k):
            q = distribution(toy_logits(context + tokens)[None] * 0.7, Sampling(1.0))[0]
            tokens.append(draw(q, self.rng.random()))
            rows.append(q)
        return tokens, np.array(rows).reshape(len(tokens), 7)


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize(
    "draft", [Oracle(), Wrong(), TiedHigher(), NGramDraft(), Sampler(0)], ids=type
)
def test_greedy_verification_gives_plain_greedy_tokens(draft, k):
    context = [1, 2, 3]
    want = greedy_decode(context, 24)
    assert speculative_decode(context, 24, draft, k) == want


def test_the_greedy_fixtures_are_what_their_names_say():
    """Ties happen on the path, the always-wrong draft is never right, the oracle always is."""
    out = greedy_decode([1, 2, 3], 24)
    ties = sum((toy_logits(out[:i]) == toy_logits(out[:i]).max()).sum() > 1 for i in range(3, 27))
    assert ties >= 5
    for draft, always in ((Oracle(), 1), (Wrong(), 0)):
        tokens, _ = draft.propose(out[:3], 8)
        assert [t == g for t, g in zip(tokens, out[3:11], strict=True)] == [bool(always)] * 8


def test_greedy_rejects_a_tied_higher_id_and_emits_the_lowest():
    z = np.array([[1.0, 3.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    p_rows = distribution(z, Sampling())
    assert verify(p_rows, None, [3], None) == (0, 1)
    assert verify(p_rows, None, [1], None) == (1, 0)  # then the all-tied row's lowest id


# ----------------------------------------------------------------------------- the n-gram draft


@pytest.mark.parametrize(
    "context,k,want",
    [
        ([], 4, []),  # nothing to match
        ([7], 4, []),  # one token: no earlier occurrence of anything
        ([1, 2, 3, 4], 4, []),  # no token repeats
        ([5, 6, 5], 0, []),  # k = 0
        # A longer match wins over a later, shorter one: (4, 1, 2) at 0 beats (1, 2) at 5.
        ([4, 1, 2, 5, 6, 1, 2, 7, 4, 1, 2], 3, [5, 6, 1]),
        # Of two matches as long, the latest wins: (1, 2) at 3 -> 6, not at 0 -> 5.
        ([1, 2, 5, 1, 2, 6, 1, 2], 3, [6, 1, 2]),
        # k shorter than what follows: the first k.
        ([8, 9, 1, 2, 3, 4, 8, 9], 2, [1, 2]),
        # k longer than what follows: the copy reads its own proposals (1 2 3 1 2 ...).
        ([1, 2, 3, 1, 2], 6, [3, 1, 2, 3, 1, 2]),
        # The match at the very end, overlapping the last tokens: (3, 3) at 1 -> 3 3 3 ...
        ([9, 3, 3, 3], 4, [3, 3, 3, 3]),
        # The last tokens are never their own match: (6) occurs only at the end.
        ([5, 6], 3, []),
        # Only a unigram matches: (2) at 1 -> 7.
        ([1, 2, 7, 3, 2], 2, [7, 3]),
    ],
)
def test_the_ngram_draft_on_hand_made_contexts(context, k, want):
    before = list(context)
    assert NGramDraft(max_n=3).propose(context, k) == (want, None)
    assert context == before  # the context is read, never changed


def test_the_ngram_draft_respects_min_n_and_max_n():
    context = [1, 2, 7, 3, 2]  # only the unigram (2) repeats
    assert NGramDraft(max_n=3, min_n=2).propose(context, 2) == ([], None)
    # max_n = 1 matches the last token only: (2) at 1 wins, though (4, 1, 2) is longer.
    assert NGramDraft(max_n=1).propose([4, 1, 2, 5, 6, 1, 2, 7, 4, 1, 2], 2) == ([7, 4], None)
    with pytest.raises(ValueError, match="min_n <= max_n"):
        NGramDraft(max_n=2, min_n=3)
    with pytest.raises(ValueError, match="k must be"):
        NGramDraft().propose([1, 2, 1], -1)


# ----------------------------------------------------------------------------- the arithmetic


def test_expected_tokens_and_speedup_by_hand():
    assert expected_tokens(0.0, 4) == 1  # every draft rejected: the target's own token
    assert expected_tokens(1.0, 4) == 5  # every draft kept, plus one
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    # a = 0.8, k = 4, c = 0.05: (1 - 0.32768) / 0.2 = 3.3616 tokens, a pass costs 1.2 steps.
    assert speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert speedup(0.8, 4, 0.05, verify_cost=1.5) == pytest.approx(3.3616 / 1.7)
    assert speedup(0.0, 3, 0.0) == 1  # a free draft that is never right costs nothing


def test_expected_tokens_is_the_rule_s_mean_exactly():
    """With the same (p, q) at every position, the rule's mean tokens per pass, over every
    draft and outcome (Fractions), is ``expected_tokens(sum(min(p, q)), k)``."""
    p, q = PAIRS["full supports"]
    a = acceptance_rate(p, q)
    for k in (1, 2, 3):
        mean = 0
        for drafted in itertools.product(*[np.flatnonzero(q)] * k):
            q_prob = np.prod([q[x] for x in drafted])
            law = outcome_law(np.array([p] * (k + 1)), np.array([q] * k), drafted)
            mean += q_prob * sum(prob * (n + 1) for (n, _), prob in law.items())
        assert mean == expected_tokens(a, k)


def test_estimate_acceptance_counts_only_tested_tokens():
    # Passes that kept 2 of 4 (3 tested), 4 of 4 (4 tested), 0 of 3 (1 tested): 6 of 8.
    assert estimate_acceptance([2, 4, 0], [4, 4, 3]) == 0.75
    assert np.isnan(estimate_acceptance([0], [0]))  # nothing drafted, nothing tested
    rng = np.random.default_rng(0)  # i.i.d. acceptance 0.6, k = 5: recovered to 1%
    kept = [int(np.argmin(np.append(rng.random(5) < 0.6, False))) for _ in range(20_000)]
    assert estimate_acceptance(kept, [5] * len(kept)) == pytest.approx(0.6, abs=0.01)
