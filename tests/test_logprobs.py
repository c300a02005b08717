"""Log-probabilities, penalties and ``logit_bias`` in the engine (engine/step.py), on the
discriminating toy model in float64 (level 2), against an independent float64 reference:
``tests/reference.py``'s forward of the whole sequence and ``numpy.logaddexp.reduce`` for
the normaliser (the engine shifts by the max and sums ``exp``; the two differ by rounding).

Each token's log-probability is the model's own, over the whole vocabulary, before
temperature, top-k/p, bias, penalties and masks (SPEC.md, 2026-12-07); the prompt's come
with ``echo``, the first None, and ``max_tokens`` 0 scores the prompt without generating.
"""

from __future__ import annotations

import numpy as np
import pytest
import reference
import torch
from _helpers import discriminating_params

import levels
from engine import Engine, ModelDraft, Request
from levels import TransformerConfig
from levels.common.logprobs import entries, log_softmax, top_tokens
from levels.common.sampling import Sampling, penalized

# float64 both sides, the same arithmetic in another order over D = 16 and V = 40: measured
# about 1e-14 on logits up to 30; 1e-10 leaves room, and a float32 step would cost 1e-7.
FLOAT64_ATOL = 1e-10

CONFIG = TransformerConfig(vocab_size=40, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2,
                           d_ff=32, max_seq_len=48, tie_embeddings=False)  # fmt: skip


@pytest.fixture(scope="module")
def model():
    level = levels.load("level2_torch_manual")
    return level.DecoderOnlyTransformer(CONFIG, discriminating_params(CONFIG), dtype=torch.float64)


def _truth(tokens: list[int]) -> np.ndarray:
    """``(T, V)`` log-probabilities of the token after each position, independently."""
    logits = reference.decoder_only_forward(CONFIG, discriminating_params(CONFIG), np.array([tokens]))[0]  # fmt: skip
    return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)


def _check(seq, top: int) -> None:
    truth = _truth(seq.tokens)
    for i, e in zip(range(seq.prompt, len(seq.tokens)), seq.logprobs, strict=True):
        assert e.token == seq.tokens[i]
        assert abs(e.logprob - truth[i - 1, e.token]) < FLOAT64_ATOL
        assert [t for t, _ in e.top] == list(np.argsort(-truth[i - 1], kind="stable")[:top])
        assert all(abs(lp - truth[i - 1, t]) < FLOAT64_ATOL for t, lp in e.top)
    if seq.scored is not None:
        assert seq.scored[0] is None and len(seq.scored) == seq.prompt
        for i in range(1, seq.prompt):
            assert abs(seq.scored[i].logprob - truth[i - 1, seq.tokens[i]]) < FLOAT64_ATOL


SETTINGS = [
    Sampling(0.0),
    Sampling(0.7, top_k=5, top_p=0.9, seed=3),  # what chose the token changes no report
    Sampling(1.3, seed=4, frequency_penalty=1.5, presence_penalty=-0.5, logit_bias=((7, 4.0),)),
]


# (Without a cache a pass feeds a sequence whole: no room for guesses, no speculation.)
@pytest.mark.parametrize("cache, draft", [("level", None), ("paged", None), ("none", None),
                                          ("level", "itself"), ("paged", "itself")])  # fmt: skip
def test_each_token_reports_the_model_s_own_log_probability(model, cache, draft):
    """Greedy, sampled with top-k/p, and with penalties and a bias, in a batch of three, over
    each cache, with and without speculation: every generated token's log-probability and
    its top 4 are the reference's, and an echoed prompt's too."""
    requests = [Request([5, 9, 11, 20, 7, 5, 9], 9, s, logprobs=4, echo=i == 0,
                        draft=ModelDraft(model) if draft else None, draft_tokens=3)
                for i, s in enumerate(SETTINGS)]  # fmt: skip
    seqs = Engine(model, cache=cache, max_batch=3).generate(requests)
    if draft:  # guesses made and kept: the rows of a verifying pass reported from
        assert sum(s.counts.accepted for s in seqs) > 0
    for seq in seqs:
        assert len(seq.logprobs) == len(seq.generated) > 0
        _check(seq, 4)


def test_echo_with_no_tokens_scores_the_prompt_even_where_the_prefix_cache_holds_it(model):
    """``max_tokens`` 0 with ``echo``: the prompt scored, nothing generated, ``length``; a
    second prompt sharing its blocks is computed whole to be scored (the cache has keys,
    not log-probabilities), and a one-token prompt has nothing to score."""
    engine = Engine(model, cache="paged", max_batch=2, block_size=4)
    prompt = [3, 8, 13, 21, 34, 5, 9, 14, 23, 37]
    first, second = engine.generate([Request(prompt, 0, logprobs=2, echo=True)] * 2)
    (plain,) = engine.generate([Request(prompt + [6], 1)])
    assert plain.found == 8  # the blocks were there to find
    for seq in (first, second):
        assert seq.finish == "length" and seq.generated == [] and seq.found == 0
        _check(seq, 2)
    (one,) = engine.generate([Request([4], 0, echo=True)])
    assert one.finish == "length" and one.scored == [None]


def test_top_tokens_rank_by_value_then_by_id_on_exact_ties():
    """By hand: equal values rank lowest id first, also across the k-th place."""
    row = np.array([-1.0, -0.5, -2.0, -0.5, -1.0, -1.0, -3.0])
    assert top_tokens(row, 3).tolist() == [1, 3, 0]
    assert top_tokens(row, 5).tolist() == [1, 3, 0, 4, 5]
    assert top_tokens(row, 0).tolist() == []
    assert top_tokens(row, 99).tolist() == [1, 3, 0, 4, 5, 2, 6]
    (e,) = entries(np.array([[0.0, 0.0, np.log(2.0)]]), [1], 2)  # p = 1/4, 1/4, 1/2
    assert e.top[0][0] == 2 and e.top[1][0] == 0  # the tie 0, 1: id 0 first
    assert e.logprob == pytest.approx(np.log(0.25), abs=1e-15)


def test_log_softmax_keeps_a_large_logit_finite():
    """Logits of 1e4 (``exp`` overflows float64 at 709.8): shifted by the max, exact."""
    lsm = log_softmax(np.array([[1e4, 1e4 - np.log(3.0)]]))
    assert np.allclose(np.exp(lsm), [[0.75, 0.25]], atol=1e-15)


def test_penalties_and_bias_follow_openai_s_definition_by_hand():
    """``logit - count * frequency - (count > 0) * presence + bias``, the counts over the
    generated tokens and, row by row, the guesses before the row."""
    s = Sampling(1.0, frequency_penalty=0.5, presence_penalty=0.25, logit_bias=((0, -100.0), (3, 2.0)))  # fmt: skip
    rows = penalized(np.zeros((2, 4)), s, generated=[1, 1, 2], guesses=[2])
    assert rows.tolist() == [[-100.0, -1.25, -0.75, 2.0], [-100.0, -1.25, -1.25, 2.0]]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        penalized(np.zeros((1, 4)), Sampling(logit_bias=((4, 1.0),)), [])
    for bad in ({"frequency_penalty": 2.5}, {"presence_penalty": True},
                {"logit_bias": ((1, 101),)}, {"logit_bias": ((-1, 1),)}):  # fmt: skip
        with pytest.raises(ValueError):
            Sampling(**bad)


@pytest.mark.parametrize("level_name", ["level0_loops", "level1_numpy", "level3_sdpa_flash"])
def test_a_bias_and_a_penalty_act_at_every_level(level_name):
    """The one sampler at every rung: a bias of 100 forces its token, greedy and sampled, and
    a frequency penalty's greedy text is level 2's (float64 at each, as the levels agree)."""
    level = levels.load(level_name)
    kind = {"numpy": {"dtype": np.float64}, "torch": {"dtype": torch.float64}}.get(level.FACTS.array, {})  # fmt: skip
    other = level.DecoderOnlyTransformer(CONFIG, discriminating_params(CONFIG), **kind)
    for t in (0.0, 1.0):
        (seq,) = Engine(other).generate([Request([5, 9], 4, Sampling(t, seed=1, logit_bias=((17, 100.0),)))])  # fmt: skip
        assert seq.generated == [17] * 4
    penalty = Request([5, 9], 8, Sampling(frequency_penalty=2.0, presence_penalty=0.5))
    want = Engine(_level2()).generate([penalty])[0].generated
    assert want != Engine(_level2()).generate([Request([5, 9], 8)])[0].generated  # it acts
    assert Engine(other).generate([penalty])[0].generated == want


def _level2():
    level = levels.load("level2_torch_manual")
    return level.DecoderOnlyTransformer(CONFIG, discriminating_params(CONFIG), dtype=torch.float64)


def test_a_bias_forces_or_bans_a_token_at_every_temperature(model):
    """Greedy and sampled: a bias of 100 on a token makes every token it (the toy model's
    logits span less than 100); -100 on the greedy token moves greedy decoding off it."""
    for t in (0.0, 1.0):
        (seq,) = Engine(model).generate([Request([5, 9], 6, Sampling(t, seed=1, logit_bias=((17, 100.0),)))])  # fmt: skip
        assert seq.generated == [17] * 6
    (plain,) = Engine(model).generate([Request([5, 9], 1)])
    ban = ((plain.generated[0], -100.0),)
    (banned,) = Engine(model).generate([Request([5, 9], 1, Sampling(logit_bias=ban), logprobs=1)])
    assert banned.generated != plain.generated
    # The report is the model's own: the banned token is still the likeliest there.
    assert banned.logprobs[0].top[0][0] == plain.generated[0]


def test_a_frequency_penalty_breaks_a_repetition(model):
    """The toy model's greedy text repeats a token; a strong frequency penalty lowers that
    token each time it comes, so greedy decoding moves to others."""
    (plain,) = Engine(model).generate([Request([5, 9], 12)])
    (penalized_,) = Engine(model).generate([Request([5, 9], 12, Sampling(frequency_penalty=2.0))])  # fmt: skip
    most = max(np.bincount(plain.generated))
    assert most >= 3  # the plain text repeats (else this test tells nothing)
    assert max(np.bincount(penalized_.generated)) < most
