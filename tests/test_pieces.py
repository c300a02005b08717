"""Each piece of every level (LayerNorm, RMSNorm, FeedForward with GELU or SwiGLU,
MultiHeadAttention with or without grouped-query heads, EncoderLayer,
DecoderLayer, with and without a sliding window) against the float64 reference.

Parameters come from ``init_params(..., scheme="random")`` so biases and norm
parameters are not the trivial 0 / 1 a forgotten term would also produce.
Pieces are built from the full seq2seq dict with a prefix, as the models build them.
"""

from __future__ import annotations

import numpy as np
import pytest
import reference as ref
from _helpers import random_mask, right_padded

from levels import TransformerConfig, init_params
from levels.common import semantics

pytestmark = pytest.mark.no_lowp


def piece_config(case, *, bias=True, positional="rope", **options) -> TransformerConfig:
    """Dh = 4 for the slow levels, an awkward Dh = 6 elsewhere; ``options`` are the
    architecture options of ``TransformerConfig`` (n_kv_heads, window, norm, ffn, ...)."""
    if case.tiny:
        sizes = dict(vocab_size=11, d_model=8, n_heads=2, d_ff=12, n_layers=1)
    else:
        sizes = dict(vocab_size=11, d_model=18, n_heads=3, d_ff=28, n_layers=1)
    return TransformerConfig(**(sizes | dict(bias=bias, positional=positional) | options))


def _sizes(case):
    """(B, T, S): one odd-length batch of two, T != S."""
    return (2, 3, 5) if case.tiny else (2, 7, 13)


def _mha_case(case, config, kind: str, seed: int, **options):
    """A ``MultiHeadAttention`` of ``kind`` (``MHA_CASES``) at the level, its parameters
    (seeded ``seed``) and its inputs: ``x (B,T,D)``, ``kv (B,S,D)`` where it attends across,
    a random ``mask (B,1,T,S)`` where masked, and the parameters' prefix; ``options`` go to
    the layer's constructor."""
    cross, _, masked, rope, _ = MHA_CASES[kind]
    params = init_params(config, "seq2seq", seed=seed, scheme="random")
    rng = np.random.default_rng(seed - 1)
    B, T, S = _sizes(case)
    S = S if cross else T
    x = rng.normal(size=(B, T, config.d_model))
    kv = rng.normal(size=(B, S, config.d_model)) if cross else None
    mask = random_mask(rng, (B, 1, T, S)) if masked else None
    prefix = "decoder.layers.0.multihead_attn." if cross else "decoder.layers.0.self_attn."
    mha = case.build("MultiHeadAttention", config, params, prefix=prefix, rope=rope, **options)
    return params, x, kv, mask, prefix, mha


def test_array_converters_and_describe(case):
    """asarray keeps integer and boolean kinds; dtype applies to floats; to_numpy inverts it."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3))
    ids = rng.integers(0, 9, (2, 3))
    flags = rng.random((2, 3)) < 0.5
    back = case.module.to_numpy(case.arr(x))
    assert np.issubdtype(np.asarray(back).dtype, np.floating)
    case.assert_close(np.asarray(back, dtype=np.float64), x, what="float round trip")
    back_ids = np.asarray(case.module.to_numpy(case.arr(ids)))
    assert np.issubdtype(back_ids.dtype, np.integer)
    np.testing.assert_array_equal(back_ids, ids)
    back_flags = np.asarray(case.module.to_numpy(case.arr(flags)))
    assert back_flags.dtype == np.bool_
    np.testing.assert_array_equal(back_flags, flags)
    text = case.module.describe()
    assert isinstance(text, str) and text.strip() and "\n" not in text.strip()


BIAS = pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])


@pytest.mark.stage("norms")
@BIAS
def test_layer_norm(case, bias):
    config = piece_config(case, bias=bias)
    params = init_params(config, "seq2seq", seed=1, scheme="random")
    rng = np.random.default_rng(0)
    B, T, _ = _sizes(case)
    # An offset and a spread far from 0 / 1, so mean and variance both matter.
    x = 3.0 + 2.5 * rng.normal(size=(B, T, config.d_model))
    ln = case.build("LayerNorm", config, params, prefix="encoder.norm.")
    expected = ref.layer_norm(
        x, params["encoder.norm.weight"], params.get("encoder.norm.bias"), config.norm_eps
    )
    case.assert_close(ln(case.arr(x)), expected, what="LayerNorm")


@BIAS
def test_feed_forward(case, bias):
    config = piece_config(case, bias=bias)
    params = init_params(config, "seq2seq", seed=2, scheme="random")
    rng = np.random.default_rng(1)
    B, T, _ = _sizes(case)
    x = rng.normal(size=(B, T, config.d_model))
    prefix = "decoder.layers.0."
    ff = case.build("FeedForward", config, params, prefix=prefix)
    case.assert_close(ff(case.arr(x)), ref.feed_forward(params, prefix, x), what="FeedForward")


def _attention(case, mha, x, kv, *, causal, mask, offset=0):
    """``mha`` on ``x (B,T,D)``: self-attention at positions ``offset + t``, what each query
    may see made from them (causal) and ``mask``; or cross-attention to ``kv`` under ``mask``."""
    if kv is not None:
        return case.attention(mha, x, kv, mask=mask)
    B, T = x.shape[:2]
    positions = offset + np.arange(T)[None].repeat(B, 0)  # (B,T)
    seen = semantics.visible(positions, positions) if causal else None  # (B,1,T,T)
    if mask is not None:
        seen = mask if seen is None else seen & mask
    return case.attention(mha, x, mask=seen, positions=positions)


MHA_CASES = {
    # name: (cross, causal, masked, rope, position_offset)
    "self": (False, False, False, False, 0),
    "self-causal-rope": (False, True, False, True, 0),
    # RoPE scores depend only on i - j, so an offset applied to q and k alike
    # must leave the output unchanged; the KV-cache tests check that decoding
    # really continues from the cache length.
    "self-rope-offset": (False, True, False, True, 5),
    "self-mask": (False, False, True, False, 0),
    "cross-mask": (True, False, True, False, 0),
}


# A learner's rung writes self-attention (its block's); the cross-attention is level 1's.
@pytest.mark.stage("block", kind=("self", "self-causal-rope", "self-rope-offset", "self-mask"))
@BIAS
@pytest.mark.parametrize("kind", list(MHA_CASES))
def test_multi_head_attention(case, kind, bias):
    cross, causal, masked, rope, offset = MHA_CASES[kind]
    config = piece_config(case, bias=bias)
    params, x, kv, mask, prefix, mha = _mha_case(case, config, kind, seed=3)
    expected = ref.mha(
        params,
        prefix,
        x,
        kv,
        n_heads=config.n_heads,
        mask=mask,
        causal=causal,
        rope_base=config.rope_base if rope else None,
        position_offset=offset,
    )
    out = _attention(case, mha, x, kv, causal=causal, mask=mask, offset=offset)
    case.assert_close(out, expected, what=f"MultiHeadAttention {kind}")


@pytest.mark.stage("block")
@BIAS
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_encoder_layer(case, causal, bias):
    config = piece_config(case, bias=bias)
    params = init_params(config, "seq2seq", seed=4, scheme="random")
    rng = np.random.default_rng(3)
    B, T, _ = _sizes(case)
    x = rng.normal(size=(B, T, config.d_model))
    valid = right_padded([T, T - 2], T)
    layer = case.build("EncoderLayer", config, params, prefix="encoder.layers.0.")
    out = case.np(layer(case.arr(x), *case.sees(valid, config.window, causal=causal)))
    expected = ref.encoder_layer(config, params, "encoder.layers.0.", x, valid=valid, causal=causal)
    # Padded positions of a layer's output are not specified (only the models
    # promise zeros there), so only real positions are compared.
    case.assert_close(out[valid], expected[valid], what="EncoderLayer (real positions)")


@BIAS
def test_decoder_layer(case, bias):
    config = piece_config(case, bias=bias)
    params = init_params(config, "seq2seq", seed=5, scheme="random")
    rng = np.random.default_rng(4)
    B, T, S = _sizes(case)
    x = rng.normal(size=(B, T, config.d_model))
    memory = rng.normal(size=(B, S, config.d_model))
    valid = right_padded([T, T - 1], T)
    memory_valid = right_padded([S - 2, S], S)
    layer = case.build("DecoderLayer", config, params, prefix="decoder.layers.0.")
    positions, mask = case.sees(valid, config.window)
    out = case.np(
        layer(case.arr(x), positions, mask, case.arr(memory), case.cross(valid, memory_valid))
    )
    expected = ref.decoder_layer(
        config, params, "decoder.layers.0.", x, memory, valid=valid, memory_valid=memory_valid
    )
    case.assert_close(out[valid], expected[valid], what="DecoderLayer (real positions)")


@pytest.mark.stage("block")
def test_encoder_layer_without_positions(case):
    """positional="none": the layer must not rotate anything."""
    config = piece_config(case, positional="none")
    params = init_params(config, "seq2seq", seed=6, scheme="random")
    rng = np.random.default_rng(5)
    B, T, _ = _sizes(case)
    x = rng.normal(size=(B, T, config.d_model))
    layer = case.build("EncoderLayer", config, params, prefix="encoder.layers.0.")
    expected = ref.encoder_layer(config, params, "encoder.layers.0.", x)
    case.assert_close(layer(case.arr(x)), expected, what="EncoderLayer positional=none")


@pytest.mark.stage("norms")
def test_rms_norm(case):
    config = piece_config(case, norm="rmsnorm")
    params = init_params(config, "seq2seq", seed=7, scheme="random")
    assert "encoder.norm.bias" not in params  # RMSNorm has no bias
    rng = np.random.default_rng(6)
    B, T, _ = _sizes(case)
    x = 3.0 + 2.5 * rng.normal(size=(B, T, config.d_model))  # an offset RMSNorm keeps
    norm = case.build("RMSNorm", config, params, prefix="encoder.norm.")
    expected = ref.rms_norm(x, params["encoder.norm.weight"], config.norm_eps)
    case.assert_close(norm(case.arr(x)), expected, what="RMSNorm")


@BIAS
def test_swiglu_feed_forward(case, bias):
    config = piece_config(case, bias=bias, ffn="swiglu")
    params = init_params(config, "seq2seq", seed=8, scheme="random")
    rng = np.random.default_rng(7)
    B, T, _ = _sizes(case)
    x = 2.0 * rng.normal(size=(B, T, config.d_model))
    prefix = "decoder.layers.0."
    ff = case.build("FeedForward", config, params, prefix=prefix)
    expected = ref.feed_forward(params, prefix, x, "swiglu")
    case.assert_close(ff(case.arr(x)), expected, what="FeedForward (SwiGLU)")


@pytest.mark.stage("block", kind=("self-causal-rope",))
@pytest.mark.parametrize("kind", ["self-causal-rope", "cross-mask"])
def test_grouped_query_attention(case, kind):
    """One key/value head for all query heads (multi-query), q/k/v bias without an
    output bias (Qwen2's layout)."""
    cross, causal, masked, rope, offset = MHA_CASES[kind]
    config = piece_config(case, bias=False, qkv_bias=True, n_kv_heads=1)
    params, x, kv, mask, prefix, mha = _mha_case(case, config, kind, seed=9)
    expected = ref.mha(
        params, prefix, x, kv, n_heads=config.n_heads, n_kv_heads=1, mask=mask, causal=causal,
        rope_base=config.rope_base if rope else None,
    )  # fmt: skip
    out = _attention(case, mha, x, kv, causal=causal, mask=mask)
    case.assert_close(out, expected, what=f"grouped-query MultiHeadAttention {kind}")


@pytest.mark.parametrize("causal", [False, True], ids=["band", "causal"])
def test_layers_with_a_sliding_window(case, causal):
    """A window shorter than the sequence, over a padded batch (the padded rows' windows
    may hold no real key: the layer must still run), grouped heads, RMSNorm and SwiGLU."""
    config = piece_config(case, window=2, n_kv_heads=1, norm="rmsnorm", ffn="swiglu")
    params = init_params(config, "seq2seq", seed=10, scheme="random")
    rng = np.random.default_rng(9)
    B, T, S = _sizes(case)
    x = rng.normal(size=(B, T, config.d_model))
    valid = right_padded([T, 1], T)  # the second row: one real token, then padding
    layer = case.build("EncoderLayer", config, params, prefix="encoder.layers.0.")
    out = case.np(layer(case.arr(x), *case.sees(valid, config.window, causal=causal)))
    expected = ref.encoder_layer(config, params, "encoder.layers.0.", x, valid=valid, causal=causal)
    case.assert_close(
        out[valid], expected[valid], what="EncoderLayer with a window (real positions)"
    )
    memory = rng.normal(size=(B, S, config.d_model))
    layer = case.build("DecoderLayer", config, params, prefix="decoder.layers.0.")
    positions, mask = case.sees(valid, config.window)
    full = np.ones((B, S), dtype=bool)  # every source token real
    out = case.np(layer(case.arr(x), positions, mask, case.arr(memory), case.cross(valid, full)))
    expected = ref.decoder_layer(config, params, "decoder.layers.0.", x, memory, valid=valid)
    case.assert_close(
        out[valid], expected[valid], what="DecoderLayer with a window (real positions)"
    )


# ---------------------------------------------------------------------------
# Gemma 3's options, piece by piece
# ---------------------------------------------------------------------------


def gemma_config(case, **options) -> TransformerConfig:
    """Heads of ``head_dim`` != D / H (6 against 4, 8 against 6), QK-norm, post-norms, GeGLU,
    gains as offsets from 1, local layers with a RoPE base of their own, a score scale."""
    gemma = dict(
        bias=False, head_dim=6 if case.tiny else 8, n_kv_heads=1, norm="rmsnorm", ffn="geglu",
        qk_norm=True, post_norms=True, norm_weight_offset=1.0, window=2, window_pattern=2,
        rope_local_base=50.0, attn_scale=0.4,
    )  # fmt: skip
    return piece_config(case, **(gemma | options))


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_norms_with_gains_stored_as_offsets_over_a_head(case, norm):
    """Gemma's gain convention (``offset + weight``), over ``D`` and over one head's ``Dh``
    (QK-norm's width), for both norms."""
    config = gemma_config(case, norm=norm, bias=True)
    params = init_params(config, "seq2seq", seed=11, scheme="random")
    rng = np.random.default_rng(10)
    B, T, _ = _sizes(case)
    cls = "RMSNorm" if norm == "rmsnorm" else "LayerNorm"
    for prefix, width in (("encoder.norm.", config.d_model), ("encoder.layers.0.self_attn.q_norm.", config.d_head)):  # fmt: skip
        x = 3.0 + 2.5 * rng.normal(size=(B, 2, T, width))  # (B, H, T, N): a norm per head
        piece = case.build(cls, config, params, prefix=prefix, width=width)
        expected = ref.norm(config, params, prefix, x)
        case.assert_close(piece(case.arr(x)), expected, what=f"{cls} over {width}, offset 1")
    # Gains start at 1 either way, so with an offset of 1 the weights start near 0.
    assert np.abs(params["encoder.norm.weight"]).max() < 0.5


def test_geglu_feed_forward(case):
    config = gemma_config(case)
    params = init_params(config, "seq2seq", seed=12, scheme="random")
    rng = np.random.default_rng(11)
    B, T, _ = _sizes(case)
    x = 2.0 * rng.normal(size=(B, T, config.d_model))
    prefix = "decoder.layers.0."
    ff = case.build("FeedForward", config, params, prefix=prefix)
    expected = ref.feed_forward(params, prefix, x, "geglu")
    case.assert_close(ff(case.arr(x)), expected, what="FeedForward (GeGLU, tanh GELU)")
    swiglu = ref.feed_forward(params, prefix, x, "swiglu")
    assert np.abs(expected - swiglu).max() > 1e-3  # the gate's activation is decided


@pytest.mark.parametrize("kind", ["self-causal-rope", "self-rope-offset", "cross-mask"])
def test_attention_with_wide_heads_qk_norm_and_a_scale(case, kind):
    """``head_dim`` != D / H (q is H Dh wide, out_proj maps it back to D), QK-norm before RoPE,
    a RoPE base of the layer's own, ``attn_scale`` for 1 / sqrt(Dh)."""
    cross, causal, masked, rope, offset = MHA_CASES[kind]
    config = gemma_config(case)
    base = config.rope_local_base
    params, x, kv, mask, prefix, mha = _mha_case(case, config, kind, seed=13, rope_base=base)
    expected = ref.mha(
        params, prefix, x, kv, mask=mask, causal=causal, position_offset=offset,
        rope_base=base if rope else None, **ref._attention_options(config, params, prefix),
    )  # fmt: skip
    out = _attention(case, mha, x, kv, causal=causal, mask=mask, offset=offset)
    case.assert_close(out, expected, what=f"MultiHeadAttention, Gemma's options, {kind}")


@pytest.mark.parametrize("layer", [0, 1], ids=["local", "global"])
def test_blocks_with_post_norms_local_and_global(case, layer):
    """Gemma's blocks: a norm before and after each sublayer; layer 0 of the pattern is local
    (window 2, RoPE base 50), layer 1 global (no window, base 1e4), over a padded batch."""
    config = gemma_config(case, n_layers=2)
    params = init_params(config, "seq2seq", seed=14, scheme="random")
    rng = np.random.default_rng(13)
    B, T, S = _sizes(case)
    x = rng.normal(size=(B, T, config.d_model))
    valid = right_padded([T, 1], T)
    window = config.layer_windows[layer]
    base = {"rope_base": config.rope_base_of(window)}
    sees = case.sees(valid, window)
    prefix = f"encoder.layers.{layer}."
    block = case.build("EncoderLayer", config, params, prefix=prefix, **base)
    out = case.np(block(case.arr(x), *sees))
    expected = ref.encoder_layer(config, params, prefix, x, valid=valid, causal=True, layer=layer)
    case.assert_close(out[valid], expected[valid], what=f"EncoderLayer {prefix} (post-norms)")
    memory = rng.normal(size=(B, S, config.d_model))
    memory_valid = right_padded([S - 2, S], S)
    prefix = f"decoder.layers.{layer}."
    block = case.build("DecoderLayer", config, params, prefix=prefix, **base)
    out = case.np(block(case.arr(x), *sees, case.arr(memory), case.cross(valid, memory_valid)))
    expected = ref.decoder_layer(
        config, params, prefix, x, memory, valid=valid, memory_valid=memory_valid, layer=layer
    )
    case.assert_close(out[valid], expected[valid], what=f"DecoderLayer {prefix} (post-norms)")
