"""Both models of every level against the float64 reference (``tests/reference.py``);
level 1 against level 2 in float64 at larger sizes (two independent codebases);
plus the torch levels' parameter names.

Batches are right-padded with rows of different lengths, so the masks and the
"zero logits at padding" rule are always exercised.
"""

from __future__ import annotations

import numpy as np
import pytest
import reference as ref
from _helpers import GEMMA_OPTIONS, LLAMA_OPTIONS, random_tokens, right_padded

from levels import TransformerConfig, init_params, param_shapes

pytestmark = pytest.mark.no_lowp

# Two configurations per size class: RoPE with biases, and no positions without biases.
TINY = dict(vocab_size=13, d_model=8, n_heads=2, d_ff=12, n_layers=1, max_seq_len=16)
SMALL = dict(vocab_size=37, d_model=24, n_heads=3, d_ff=40, n_layers=2, max_seq_len=64)
VARIANTS = {
    "rope-bias": dict(positional="rope", bias=True),
    "none-nobias": dict(positional="none", bias=False),
    # The models people run: Llama / Qwen2-style blocks (RMSNorm, SwiGLU, multi-query
    # attention, q/k/v bias only, unscaled and untied embeddings) ...
    "llama": LLAMA_OPTIONS,
    # ... and Mistral's sliding window (shorter than the sequences, over padded batches).
    "window": dict(window=3, n_kv_heads=1, out_bias=False),
    # Gemma 3's: heads wider than D / H, QK-norm, a norm after each sublayer as well,
    # GeGLU, gains stored as offsets from 1, local (windowed) and global layers with RoPE
    # bases of their own, and a score scale of its own (Gemma 3 27B's is not 1/sqrt(Dh)).
    "gemma": dict(GEMMA_OPTIONS, n_layers=2, attn_scale=0.3),  # layer 0 local, 1 global
}


def model_config(case_or_tiny, variant="rope-bias") -> TransformerConfig:
    tiny = case_or_tiny if isinstance(case_or_tiny, bool) else case_or_tiny.tiny
    return TransformerConfig(**((TINY if tiny else SMALL) | VARIANTS[variant]))


def decoder_batch(config, tiny, seed=0):
    """tokens (B,T) and valid (B,T): three rows, right-padded to lengths T, T-2, 1."""
    rng = np.random.default_rng(seed)
    T = 5 if tiny else 11
    valid = right_padded([T, T - 2, 1], T)
    return random_tokens(rng, config, 3, T, valid=valid), valid


def seq2seq_batch(config, tiny, seed=0):
    """src (B,S), tgt (B,T) and their valid masks; S != T, rows right-padded."""
    rng = np.random.default_rng(seed)
    S, T = (6, 4) if tiny else (13, 9)
    src_valid = right_padded([S, 2, S - 1], S)
    tgt_valid = right_padded([T - 1, T, 1], T)
    src = random_tokens(rng, config, 3, S, valid=src_valid)
    tgt = random_tokens(rng, config, 3, T, valid=tgt_valid)
    return src, tgt, src_valid, tgt_valid


def run_decoder_only(case, config, params, tokens, valid=None):
    model = case.build("DecoderOnlyTransformer", config, params)
    kwargs = {} if valid is None else {"valid": case.arr(valid)}
    return case.np(model.forward(case.arr(tokens), **kwargs))


def run_seq2seq(case, config, params, src, tgt, src_valid=None, tgt_valid=None):
    model = case.build("Seq2SeqTransformer", config, params)
    kwargs = {}
    if src_valid is not None:
        kwargs = {"src_valid": case.arr(src_valid), "tgt_valid": case.arr(tgt_valid)}
    return case.np(model.forward(case.arr(src), case.arr(tgt), **kwargs))


@pytest.mark.stage("decoder", variant=("rope-bias", "none-nobias", "llama", "window"))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_decoder_only_matches_reference(case, variant):
    config = model_config(case, variant)
    params = init_params(config, "decoder_only", seed=11, scheme="random")
    tokens, valid = decoder_batch(config, case.tiny)
    out = run_decoder_only(case, config, params, tokens, valid)
    expected = ref.decoder_only_forward(config, params, tokens, valid=valid)
    case.assert_close(out, expected, what=f"decoder-only logits ({variant})")
    assert (out[~valid] == 0).all(), "logits at padded positions must be exactly zero"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_seq2seq_matches_reference(case, variant):
    config = model_config(case, variant)
    params = init_params(config, "seq2seq", seed=12, scheme="random")
    src, tgt, src_valid, tgt_valid = seq2seq_batch(config, case.tiny)
    out = run_seq2seq(case, config, params, src, tgt, src_valid, tgt_valid)
    expected = ref.seq2seq_forward(
        config, params, src, tgt, src_valid=src_valid, tgt_valid=tgt_valid
    )
    case.assert_close(out, expected, what=f"seq2seq logits ({variant})")
    assert (out[~tgt_valid] == 0).all(), "logits at padded target positions must be exactly zero"


@pytest.mark.best_dtype
def test_logits_are_forward_without_the_zeroing(case):
    """``logits`` (what a training loss reads) is ``forward`` before the padded positions are
    zeroed, with ``valid`` back as a numpy ``(B,T)`` bool array, at every level: the public
    methods are one code."""
    config = model_config(case)
    params = init_params(config, "decoder_only", seed=15, scheme="random")
    tokens, valid = decoder_batch(config, case.tiny, seed=5)
    model = case.build("DecoderOnlyTransformer", config, params)
    logits, rows = model.logits(case.arr(tokens), valid=case.arr(valid))
    out = case.np(logits)
    expected = ref.decoder_only_forward(config, params, tokens, valid=valid)
    case.assert_close(out[valid], expected[valid], what="decoder-only logits at real positions")
    assert isinstance(rows, np.ndarray) and rows.dtype == bool and np.array_equal(rows, valid)
    assert (out[~valid] != 0).any(), "logits leaves the padded positions as computed"

    params = init_params(config, "seq2seq", seed=16, scheme="random")
    src, tgt, src_valid, tgt_valid = seq2seq_batch(config, case.tiny, seed=6)
    model = case.build("Seq2SeqTransformer", config, params)
    logits, rows = model.logits(
        case.arr(src), case.arr(tgt), src_valid=case.arr(src_valid), tgt_valid=case.arr(tgt_valid)
    )
    out = case.np(logits)
    expected = ref.seq2seq_forward(
        config, params, src, tgt, src_valid=src_valid, tgt_valid=tgt_valid
    )
    case.assert_close(out[tgt_valid], expected[tgt_valid], what="seq2seq logits at real targets")
    assert isinstance(rows, np.ndarray) and np.array_equal(rows, tgt_valid)


@pytest.mark.best_dtype
def test_valid_defaults_to_every_token_real(case):
    """Without ``valid`` every token is real, ``pad_id`` included: padding is never inferred
    from token values (real models' ``pad_id`` is their EOS, which chat prompts contain)."""
    config = model_config(case)
    params = init_params(config, "decoder_only", seed=13, scheme="random")
    tokens, valid = decoder_batch(config, case.tiny, seed=3)  # pad_id in every short row
    assert (tokens[~valid] == config.pad_id).all() and not valid.all()
    out = run_decoder_only(case, config, params, tokens)
    every = np.ones(tokens.shape, dtype=bool)
    expected = ref.decoder_only_forward(config, params, tokens, valid=every)
    case.assert_close(out, expected, what="decoder-only logits, default valid")
    assert (out[~valid] != 0).any(), "pad_id tokens must be computed as real tokens"

    params = init_params(config, "seq2seq", seed=14, scheme="random")
    src, tgt, src_valid, tgt_valid = seq2seq_batch(config, case.tiny, seed=4)
    out = run_seq2seq(case, config, params, src, tgt)
    expected = ref.seq2seq_forward(
        config,
        params,
        src,
        tgt,
        src_valid=np.ones(src.shape, dtype=bool),
        tgt_valid=np.ones(tgt.shape, dtype=bool),
    )
    case.assert_close(out, expected, what="seq2seq logits, default valid")


# ---------------------------------------------------------------------------
# Against another implementation at larger sizes: level 1 (numpy, level 0's
# architecture) against level 2 (torch modules, written separately), both in
# float64. Every level is also held to the float64 reference above; this pair
# checks two independent codebases against each other where the reference's
# sizes are small.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["decoder_only", "seq2seq"])
def test_level1_matches_level2_in_float64_at_larger_sizes(reference_level, kind):
    L1, L2 = reference_level("level1_numpy"), reference_level("level2_torch_manual")
    T, S, D = 24, 21, 32
    config = TransformerConfig(
        vocab_size=50, d_model=D, n_heads=4, d_ff=2 * D, n_layers=2, max_seq_len=64
    )
    params = init_params(config, kind, seed=22, scheme="random")
    rng = np.random.default_rng(7)
    if kind == "decoder_only":
        valid = right_padded([T, T - 7, T // 2, 1], T)
        tokens = random_tokens(rng, config, 4, T, valid=valid)
        out = run_decoder_only(L1, config, params, tokens, valid)
        expected = run_decoder_only(L2, config, params, tokens, valid)
    else:
        src_valid = right_padded([S, 5, S - 7], S)
        tgt_valid = right_padded([T - 4, T, 2], T)
        src = random_tokens(rng, config, 3, S, valid=src_valid)
        tgt = random_tokens(rng, config, 3, T, valid=tgt_valid)
        out = run_seq2seq(L1, config, params, src, tgt, src_valid, tgt_valid)
        expected = run_seq2seq(L2, config, params, src, tgt, src_valid, tgt_valid)
    L1.assert_close(out, expected, what=f"{kind} logits, level 1 vs level 2 (float64)")


# ---------------------------------------------------------------------------
# Torch levels: state_dict() uses the canonical names, so weights move by name.
# ---------------------------------------------------------------------------


@pytest.mark.best_dtype
@pytest.mark.torch_only
@pytest.mark.parametrize("variant", ["rope-bias", "llama", "gemma"])
@pytest.mark.parametrize("kind", ["decoder_only", "seq2seq"])
def test_state_dict_uses_canonical_names(case, kind, variant):
    # RoPE on: cos/sin tables or causal masks kept as buffers must not leak in.
    config = model_config(case, variant)
    params = init_params(config, kind, seed=23, scheme="random")
    cls = "DecoderOnlyTransformer" if kind == "decoder_only" else "Seq2SeqTransformer"
    model = case.build(cls, config, params)
    state = {k: v.detach().cpu().double().numpy() for k, v in model.state_dict().items()}
    assert set(state) == set(param_shapes(config, kind))
    for name, value in params.items():
        case.assert_close(state[name], value, what=f"state_dict[{name!r}]")
