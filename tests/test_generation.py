"""Generation as users run it: sampling, prompts of different lengths in one batch, EOS.

The sampler (``levels.common.sampling``) is checked on its own first, against
sets written out by brute force and against the softmax it draws from. Then
every level: a batch of right-padded prompts equals each row generated alone
(greedy and sampled, cached and uncached, with the models people run), the
sampled tokens equal the float64 reference model's with the same draws, and
decoder-only rows stop at EOS.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import reference as ref
from _helpers import GEMMA_OPTIONS, random_tokens, right_padded, small_config

from levels import init_params
from levels.common.sampling import Sampling, keep_mask, pick

pytestmark = pytest.mark.no_lowp

# ---------------------------------------------------------------------------
# The sampler
# ---------------------------------------------------------------------------


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def brute_force_keep(z: np.ndarray, top_k, top_p) -> set[int]:
    """The tokens top-k then top-p keep, by enumerating candidate sets (one row)."""
    ids = range(len(z))
    kept = set(ids)
    if top_k is not None:
        kth = sorted(z, reverse=True)[min(top_k, len(z)) - 1]
        kept = {i for i in ids if z[i] >= kth}
    if top_p is not None:
        p = np.zeros(len(z))
        p[list(kept)] = _softmax(z[list(kept)])
        # Smallest threshold set {i: p_i >= t} (t one of the probabilities) with mass >= top_p.
        for t in sorted({p[i] for i in kept}, reverse=True):
            candidate = {i for i in kept if p[i] >= t}
            if sum(p[i] for i in candidate) >= top_p:
                kept = candidate
                break
    return kept


@pytest.mark.parametrize(
    "top_k,top_p", [(None, None), (1, None), (3, None), (None, 0.5), (None, 0.95), (4, 0.6)]
)
def test_top_k_and_top_p_keep_the_sets_written_out(top_k, top_p):
    rng = np.random.default_rng(0)
    z = rng.standard_normal((20, 9))
    z[0, [2, 5]] = z[0].max() + 1.0  # a tie at the top
    z[1, [1, 3, 4]] = 0.25  # a tie in the middle
    keep = keep_mask(z, top_k, top_p)
    for row in range(len(z)):
        assert set(np.flatnonzero(keep[row])) == brute_force_keep(z[row], top_k, top_p), row


def test_draws_follow_the_kept_softmax():
    logits = np.array([1.0, 0.2, -0.5, 2.0, 0.0, -3.0])
    sampling = Sampling(temperature=0.7, top_k=5, seed=3)
    n = 40_000
    rows = np.repeat(logits[None, :], n, axis=0)  # n rows, n independent generators
    drawn = pick(rows, sampling, sampling.generators(n))
    z = logits / 0.7
    want = _softmax(np.where(z >= np.sort(z)[-5], z, -np.inf))  # token 5 is outside the top 5
    counts = np.bincount(drawn, minlength=len(logits))
    assert counts[5] == 0
    # Each count is binomial(n, p): 5 standard deviations (a failure by chance ~ 1e-6).
    sd = np.sqrt(n * want * (1 - want))
    assert (np.abs(counts - n * want) <= 5 * sd + 1).all(), (counts, n * want)


def test_temperature_zero_is_the_argmax_and_draws_nothing():
    logits = np.array([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 5.0, 5.0]])
    assert Sampling().generators(2) is None
    assert pick(logits, Sampling(), None).tolist() == [1, 0]  # lowest id on a tie


def test_a_row_draws_from_its_own_generator():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((4, 7))
    sampling = Sampling(temperature=1.3, top_p=0.9, seed=11)
    batch = pick(logits, sampling, sampling.generators(4))
    for b in range(4):
        alone = Sampling(temperature=1.3, top_p=0.9, seed=11 + b)
        assert pick(logits[b : b + 1], alone, alone.generators(1))[0] == batch[b]
    listed = Sampling(temperature=1.3, top_p=0.9, seed=[11, 12, 13, 14])
    assert (pick(logits, listed, listed.generators(4)) == batch).all()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.5},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"temperature": "1"},
        {"top_k": 0},
        {"top_k": 2.5},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_p": True},
        {"seed": -1},
        {"seed": [1, -2]},
        {"seed": 1.5},
    ],
    ids=str,
)
def test_bad_sampling_values_are_value_errors(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Sampling(**kwargs)


def test_a_seed_list_needs_one_seed_per_row():
    with pytest.raises(ValueError, match="seed has 2 entries for a batch of 3"):
        Sampling(temperature=1.0, seed=[1, 2]).generators(3)


# ---------------------------------------------------------------------------
# Every level
# ---------------------------------------------------------------------------

VARIANTS = {
    "default": {},
    # The models people run, with a window shorter than the longest row.
    "llama-window": dict(
        n_kv_heads=1, window=3, norm="rmsnorm", ffn="swiglu", scale_embeddings=False, bias=False
    ),
    "no-positions": dict(positional="none"),
    # Gemma 3's: local (window 3) and global layers with RoPE bases of their own, wide
    # heads, QK-norm, post-norms, GeGLU and gains stored as offsets from 1.
    "gemma": dict(GEMMA_OPTIONS, n_layers=2),
}
MODES = {
    "greedy": {},
    "sampled": dict(temperature=0.9, top_k=8, top_p=0.95, seed=5),
    "hot": dict(temperature=2.0, seed=[3, 1, 4]),
}


def _alone(mode: dict, b: int) -> dict:
    """Row ``b``'s sampling arguments when generated by itself."""
    seed = mode.get("seed")
    if seed is None:
        return mode
    return mode | {"seed": seed[b] if isinstance(seed, list) else seed + b}


def _problem(case, variant, seed=0):
    config = small_config(case.tiny, **VARIANTS[variant])
    params = init_params(config, "decoder_only", seed=seed, scheme="random")
    P, n = (4, 3) if case.tiny else (7, 6)
    lengths = [P - 2, P, 1]
    valid = right_padded(lengths, P)
    prefix = random_tokens(np.random.default_rng(seed), config, 3, P, valid=valid)
    return config, params, prefix, valid, lengths, n


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("variant", list(VARIANTS))
# Level 4's interpreted sampled runs (8 cases, 14 s) and Gemma's greedy one (3 s): extended;
# its other greedy ones stay (test_properties.py decodes Gemma's options at level 4 too).
@pytest.mark.interpreter_extended("sampled", "hot", "gemma")
def test_batched_prompts_of_different_lengths_equal_each_row_alone(case, variant, mode):
    config, params, prefix, valid, lengths, n = _problem(case, variant)
    model = case.build("DecoderOnlyTransformer", config, params)
    P = prefix.shape[1]
    for use_cache in (True, False):
        out = case.np(
            model.generate(
                case.arr(prefix), n, valid=case.arr(valid), use_cache=use_cache, **MODES[mode]
            )
        )
        assert out.shape == (3, P + n)
        for b, L in enumerate(lengths):
            alone = case.np(
                model.generate(
                    case.arr(prefix[b : b + 1, :L]),
                    n,
                    use_cache=use_cache,
                    **_alone(MODES[mode], b),
                )
            )[0]
            np.testing.assert_array_equal(out[b, : L + n], alone, err_msg=f"row {b}, {use_cache=}")
            assert (out[b, L + n :] == config.pad_id).all()  # then padding


def reference_generate(config, params, prefix, n, lengths, sampling, eos_id=None):
    """Each row alone with the float64 reference model, tokens chosen by ``pick``."""
    rows = []
    for b, L in enumerate(lengths):
        one = Sampling(**{**sampling.__dict__, "seed": _alone(sampling.__dict__, b)["seed"]})
        gens = one.generators(1)
        tokens = list(prefix[b, :L])
        for _ in range(n):
            logits = ref.decoder_only_forward(
                config, params, np.array([tokens]), valid=np.ones((1, len(tokens)), bool)
            )
            tokens.append(int(pick(logits[:, -1], one, gens)[0]))
            if tokens[-1] == eos_id:
                break
        rows.append(tokens + [config.pad_id] * (prefix.shape[1] + n - len(tokens)))
    return np.array(rows)


@pytest.mark.parametrize("mode", ["sampled", "hot"])
def test_sampled_tokens_equal_the_reference_models(case, mode):
    config, params, prefix, valid, lengths, n = _problem(case, "llama-window", seed=1)
    model = case.build("DecoderOnlyTransformer", config, params)
    got = case.np(model.generate(case.arr(prefix), n, valid=case.arr(valid), **MODES[mode]))
    want = reference_generate(config, params, prefix, n, lengths, Sampling(**MODES[mode]))
    np.testing.assert_array_equal(got, want)


def test_the_sampled_runs_differ_from_greedy():
    """The premise of the two tests above: these sampling settings change the tokens."""
    config, params, prefix, valid, lengths, n = _problem(_Tiny(), "llama-window", seed=1)
    greedy = reference_generate(config, params, prefix, n, lengths, Sampling())
    for mode in ("sampled", "hot"):
        sampled = reference_generate(config, params, prefix, n, lengths, Sampling(**MODES[mode]))
        assert (sampled != greedy).any(), mode


class _Tiny:
    tiny = True


def eos_decoder_problem(tiny: bool):
    """A decoder-only model and prompts for which some rows produce EOS early (checked
    by ``test_the_eos_problem_stops_some_rows``, so the EOS test cannot go vacuous)."""
    config = small_config(tiny, vocab_size=5)
    for seed in itertools.count():
        params = init_params(config, "decoder_only", seed=seed, scheme="random")
        prefix = np.array([[3, 4, 3], [4, 4, 0], [3, 0, 0]])
        valid = prefix != 0
        lengths = valid.sum(1).tolist()
        out = reference_generate(config, params, prefix, 6, lengths, Sampling(), config.eos_id)
        stopped = [config.eos_id in row[L:] for row, L in zip(out, lengths, strict=True)]
        if any(stopped) and not all(stopped):
            return config, params, prefix, valid, lengths, out


def test_decoder_only_rows_stop_at_eos(case):
    config, params, prefix, valid, lengths, want = eos_decoder_problem(case.tiny)
    model = case.build("DecoderOnlyTransformer", config, params)
    for use_cache in (True, False):
        got = model.generate(
            case.arr(prefix), 6, valid=case.arr(valid), eos_id=config.eos_id, use_cache=use_cache
        )
        np.testing.assert_array_equal(case.np(got), want)


def test_seq2seq_samples_with_a_seed_and_rows_stay_independent(case):
    config = small_config(case.tiny)
    params = init_params(config, "seq2seq", seed=4, scheme="random")
    model = case.build("Seq2SeqTransformer", config, params)
    S = 4 if case.tiny else 7
    src_valid = right_padded([S, 2], S)
    src = random_tokens(np.random.default_rng(4), config, 2, S, valid=src_valid)
    kw = dict(temperature=1.5, top_k=6, seed=9, max_new_tokens=4)
    out = case.np(model.generate(case.arr(src), src_valid=case.arr(src_valid), **kw))
    again = case.np(model.generate(case.arr(src), src_valid=case.arr(src_valid), **kw))
    np.testing.assert_array_equal(out, again)  # the seed decides
    for b in range(2):
        row = case.arr(src[b : b + 1, : int(src_valid[b].sum())])
        alone = case.np(model.generate(row, **kw | {"seed": 9 + b}))[0]
        np.testing.assert_array_equal(out[b, : len(alone)], alone)
        assert (out[b, len(alone) :] == config.pad_id).all()


# ---------------------------------------------------------------------------
# Refusals, the same at every level
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"temperature": -1.0}, ValueError, "temperature"),
        ({"top_p": 2.0}, ValueError, "top_p"),
        ({"temperature": 1.0, "seed": [1, 2, 3]}, ValueError, "seed has 3 entries"),
        ({"eos_id": 99}, ValueError, "eos_id 99 is outside"),
        ({"eos_id": "2"}, TypeError, "eos_id"),
        (
            {"valid": np.array([[True, False, True], [True, True, True]])},
            ValueError,
            r"right-padded.*\(row\(s\) \[0\]\)",
        ),
        ({"valid": np.zeros((2, 3), bool)}, ValueError, "valid"),
        ({"valid": np.ones((2, 2), bool)}, ValueError, "shape"),
        ({"colour": "red"}, TypeError, "colour"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_generate_refuses_bad_arguments_before_any_work(level, kwargs, error, match):
    config = small_config(True)
    model = level.build("DecoderOnlyTransformer", config, init_params(config, "decoder_only", 0))
    if "valid" in kwargs:
        kwargs = kwargs | {"valid": level.arr(kwargs["valid"])}
    with pytest.raises(error, match=match):
        model.generate(level.arr(np.array([[3, 4, 5], [6, 7, 8]])), 2, **kwargs)


def test_position_offset_moves_rope_but_not_what_attention_sees(case):
    """RoPE scores depend on distances only, so one sequence placed at position 5 gives the
    same logits to rounding (its effect shows when a shard attends to other shards' keys,
    tests/test_parallel.py); out-of-range offsets are refused."""
    config = small_config(case.tiny)
    model = case.build("DecoderOnlyTransformer", config, init_params(config, "decoder_only", 2))
    tokens = case.arr(random_tokens(np.random.default_rng(2), config, 2, 4))
    here = case.np(model.forward(tokens))
    there = case.np(model.forward(tokens, position_offset=5))
    case.assert_close(there, here, what="logits at offset 5")
    for bad, error in ((-1, ValueError), (config.max_seq_len, ValueError), (1.0, TypeError)):
        with pytest.raises(error, match="position_offset"):
            model.forward(tokens, position_offset=bad)


@pytest.mark.best_dtype
def test_stream_is_generate_one_token_at_a_time(case):
    """``stream`` yields ``generate``'s tokens (greedy and sampled), and stops after a stop id."""
    config = small_config(case.tiny)
    params = init_params(config, "decoder_only", seed=31, scheme="random")
    model = case.build("DecoderOnlyTransformer", config, params)
    prompt = random_tokens(np.random.default_rng(32), config, 1, 4)
    for options in ({}, {"temperature": 0.9, "top_p": 0.8, "seed": 5}):
        full = case.np(model.generate(case.arr(prompt), 6, **options))[0, 4:].tolist()
        assert list(model.stream(prompt[0].tolist(), 6, **options)) == full, options
    stop = full[2]
    got = list(model.stream(prompt[0].tolist(), 6, stop_ids=(stop,), **options))
    assert got == full[: full.index(stop) + 1]  # ends with the stop id itself


@pytest.mark.best_dtype
def test_a_prompt_in_pieces_gives_the_tokens_of_one_pass_and_reports_each_piece(case):
    """``stream(..., prefill_piece=k)`` (``ladder chat`` at the slow rungs, to show the
    prompt advance) runs the prompt ``k`` positions at a time against the cache: the
    tokens of one pass, and ``on_prefill`` after each piece, the last one with the first
    token. A piece of one, of the whole prompt and of more than it are the edges."""
    from levels.common.speculative import commands_ngram

    config = small_config(case.tiny)
    params = init_params(config, "decoder_only", seed=33, scheme="random")
    model = case.build("DecoderOnlyTransformer", config, params)
    prompt = random_tokens(np.random.default_rng(34), config, 1, 5)[0].tolist()
    whole = list(model.stream(prompt, 3))
    for piece, reports in ((1, [1, 2, 3, 4, 5]), (2, [2, 4, 5]), (5, [5]), (9, [5])):
        done: list[int] = []
        assert list(model.stream(prompt, 3, prefill_piece=piece, on_prefill=done.append)) == whole
        assert done == reports, piece
    for bad, error in ((0, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="prefill_piece"):
            list(model.stream(prompt, 3, prefill_piece=bad))
    with pytest.raises(ValueError, match="prefill_piece is for plain decoding"):
        list(model.stream(prompt, 3, prefill_piece=2, draft=commands_ngram()))


@pytest.mark.best_dtype
def test_a_rolled_back_cache_decodes_as_if_the_later_positions_never_were(case):
    """Setting a cache's length back (what speculative decoding does with a rejected guess)
    forgets the slots after it, also in a ragged batch, whose short row holds padding."""
    config = small_config(case.tiny)
    params = init_params(config, "decoder_only", seed=33, scheme="random")
    model = case.build("DecoderOnlyTransformer", config, params)
    prompt = random_tokens(np.random.default_rng(34), config, 2, 4)
    for valid in (None, np.array([[True] * 4, [True, True, False, False]])):
        kw = {} if valid is None else {"valid": case.arr(valid)}
        _, cache = model.prefill(case.arr(prompt), **kw)
        first = case.np(model.decode_step(case.arr(np.array([5, 6])), cache))
        model.decode_step(case.arr(np.array([7, 8])), cache)
        model.decode_step(case.arr(np.array([9, 1])), cache)
        cache.rollback(4)
        assert cache.length == 4
        again = case.np(model.decode_step(case.arr(np.array([5, 6])), cache))
        np.testing.assert_array_equal(again, first)  # the same arithmetic on the same numbers
        for bad in (9, -1, 2.0, True):
            with pytest.raises(ValueError, match="cannot roll a cache of 5 slots back"):
                cache.rollback(bad)
