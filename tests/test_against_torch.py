"""Every level against PyTorch's own modules loaded with the same parameters by name.

``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``,
``nn.TransformerDecoderLayer`` and ``nn.Transformer`` (``norm_first=True``,
GELU, ``batch_first=True``, no dropout) have no rotary positions, so these
tests use ``positional="none"``. PyTorch's float64 result on the CPU is the
expected value; in float16 / bfloat16 (``--device cuda``) the level is held to
at most twice PyTorch's own error in the same dtype.

Mask conventions differ: ours is True = may attend; PyTorch's boolean
``attn_mask`` / ``tgt_mask`` is True = NOT allowed and ``key_padding_mask`` is
True = ignore this key. SDPA's boolean mask is True = may attend, like ours.
"""

from __future__ import annotations

import numpy as np
import pytest
import reference as ref
import torch
from _helpers import (
    random_mask,
    random_tokens,
    right_padded,
    torch_bottom_right_disallowed,
    torch_decoder_layer,
    torch_decoder_only_logits,
    torch_encoder_layer,
    torch_feed_forward,
    torch_layer_norm,
    torch_mha,
    torch_model,
    torch_sdpa_math,
    torch_seq2seq_logits,
)

from levels import TransformerConfig, init_params

BIAS = pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])


def torch_config(tiny, *, bias=True) -> TransformerConfig:
    if tiny:
        return TransformerConfig(
            vocab_size=13, d_model=8, n_heads=2, d_ff=12, n_layers=1, bias=bias, positional="none"
        )
    return TransformerConfig(
        vocab_size=29, d_model=24, n_heads=4, d_ff=40, n_layers=2, bias=bias, positional="none"
    )


def _torch_in(case, fn):
    """PyTorch's float64 CPU result, and its result in the case's dtype when that is low precision."""
    expected = fn(torch.float64, "cpu")
    baseline = fn(case.torch_dtype, case.device) if case.low_precision else None
    return expected, baseline


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


# ---------------------------------------------------------------------------
# The reference itself against PyTorch: if these fail, fix tests/reference.py.
# ---------------------------------------------------------------------------


@BIAS
def test_reference_matches_torch_models(bias):
    """reference.py agrees with nn.Transformer and a causal encoder-layer stack."""
    config = torch_config(False, bias=bias)
    rng = np.random.default_rng(0)
    src_valid, tgt_valid = right_padded([9, 4], 9), right_padded([6, 3], 6)
    src = random_tokens(rng, config, 2, 9, valid=src_valid)
    tgt = random_tokens(rng, config, 2, 6, valid=tgt_valid)
    params = init_params(config, "seq2seq", seed=1, scheme="random")
    got = ref.seq2seq_forward(config, params, src, tgt, src_valid=src_valid, tgt_valid=tgt_valid)
    want = torch_seq2seq_logits(config, params, src, tgt, src_valid, tgt_valid, dtype=torch.float64)
    # Two float64 implementations of the same maths: summation-order differences only.
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    params = init_params(config, "decoder_only", seed=2, scheme="random")
    got = ref.decoder_only_forward(config, params, tgt, valid=tgt_valid)
    want = torch_decoder_only_logits(config, params, tgt, tgt_valid, dtype=torch.float64)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_reference_attention_matches_sdpa_math():
    rng = np.random.default_rng(1)
    q, k, v = (
        rng.normal(size=(2, 3, 7, 8)),
        rng.normal(size=(2, 3, 13, 8)),
        rng.normal(size=(2, 3, 13, 5)),
    )
    mask = random_mask(rng, (2, 3, 7, 13))
    for causal in (False, True):
        got = ref.attention(q, k, v, causal=causal, mask=mask)
        want = torch_sdpa_math(q, k, v, causal=causal, mask=mask, dtype=torch.float64)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)  # float64 vs float64


def test_reference_rope_gelu_layer_norm():
    """The reference's small pieces, checked by hand and against PyTorch's functions."""
    # Dh = 4, base 100, position 2: pair 0 turns by 2 * 100^0 = 2 rad, pair 1 by
    # 2 * 100^(-2/4) = 0.2 rad; (a, b) -> (a cos - b sin, a sin + b cos).
    x = np.array([[1.0, 0.0, 0.0, 1.0]])  # (T=1, Dh=4)
    want = [np.cos(2.0), np.sin(2.0), -np.sin(0.2), np.cos(0.2)]
    np.testing.assert_allclose(ref.rope(x, [2], base=100.0)[0], want, rtol=0, atol=1e-15)
    rng = np.random.default_rng(3)
    z = 3.0 * rng.normal(size=(4, 6))
    exact_gelu = torch.nn.functional.gelu(torch.as_tensor(z), approximate="none").numpy()
    np.testing.assert_allclose(ref.gelu(z), exact_gelu, rtol=1e-14, atol=1e-15)  # float64 erf
    w, b = rng.normal(size=6), rng.normal(size=6)
    torch_ln = torch.nn.functional.layer_norm(
        torch.as_tensor(z), (6,), torch.as_tensor(w), torch.as_tensor(b), 1e-5
    ).numpy()
    np.testing.assert_allclose(ref.layer_norm(z, w, b, 1e-5), torch_ln, rtol=1e-13, atol=1e-13)


# ---------------------------------------------------------------------------
# Levels against PyTorch
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_vs_sdpa_math(case, causal):
    B, H, T, S, Dh = (1, 2, 5, 9, 4) if case.tiny else (2, 4, 13, 33, 12)
    rng = np.random.default_rng(2)
    q, k, v = (
        rng.normal(size=(B, H, T, Dh)),
        rng.normal(size=(B, H, S, Dh)),
        rng.normal(size=(B, H, S, Dh)),
    )
    mask = random_mask(rng, (B, 1, T, S))
    mask[..., np.arange(T), np.arange(T) + (S - T)] = True  # no row empty under causality
    expected, baseline = _torch_in(
        case,
        lambda dt, dev: torch_sdpa_math(q, k, v, causal=causal, mask=mask, dtype=dt, device=dev),
    )
    out = case.module.attention(
        case.arr(q), case.arr(k), case.arr(v), causal=causal, mask=case.arr(mask)
    )
    case.assert_close(out, expected, what="attention vs SDPA math", baseline=baseline)


@BIAS
def test_layer_norm_and_feed_forward_vs_torch(case, bias):
    config = torch_config(case.tiny, bias=bias)
    params = init_params(config, "seq2seq", seed=9, scheme="random")
    rng = np.random.default_rng(9)
    x = 2.0 + 3.0 * rng.normal(size=(2, 5, config.d_model))  # off-centre, wide: both stats matter

    def run_torch(build, prefix):
        def run(dt, dev):
            return _np(
                build(config, params, prefix, dtype=dt, device=dev)(
                    torch.as_tensor(x, dtype=dt, device=dev)
                )
            )

        return run

    expected, baseline = _torch_in(case, run_torch(torch_layer_norm, "decoder.layers.0.norm2."))
    ln = case.build("LayerNorm", config, params, prefix="decoder.layers.0.norm2.")
    case.assert_close(
        ln(case.arr(x)), expected, what="LayerNorm vs nn.LayerNorm", baseline=baseline
    )

    expected, baseline = _torch_in(case, run_torch(torch_feed_forward, "decoder.layers.0."))
    ff = case.build("FeedForward", config, params, prefix="decoder.layers.0.")
    case.assert_close(
        ff(case.arr(x)), expected, what="FeedForward vs nn.Linear/GELU", baseline=baseline
    )


@BIAS
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_mha_vs_nn_multihead_attention(case, cross, bias):
    config = torch_config(case.tiny, bias=bias)
    params = init_params(config, "seq2seq", seed=3, scheme="random")
    B, T, S = (2, 3, 5) if case.tiny else (3, 7, 11)
    S = S if cross else T
    rng = np.random.default_rng(3)
    x = rng.normal(size=(B, T, config.d_model))
    kv = rng.normal(size=(B, S, config.d_model)) if cross else x
    key_valid = right_padded([S, S - 2, 1][:B], S)  # (B,S)
    attn_allowed = random_mask(rng, (T, S))  # (T,S)
    attn_allowed[:, 0] = True  # key 0 is real in every row: no empty row
    prefix = "decoder.layers.0.multihead_attn." if cross else "decoder.layers.0.self_attn."

    def run_torch(dt, dev):
        m = torch_mha(config, params, prefix, dtype=dt, device=dev)
        xt, kvt = (torch.as_tensor(a, dtype=dt, device=dev) for a in (x, kv))
        out, _ = m(
            xt,
            kvt,
            kvt,
            attn_mask=~torch.as_tensor(attn_allowed, device=dev),  # True = NOT allowed
            key_padding_mask=~torch.as_tensor(key_valid, device=dev),  # True = ignore
            need_weights=False,
        )
        return _np(out)

    expected, baseline = _torch_in(case, run_torch)
    mask = attn_allowed[None, None] & key_valid[:, None, None, :]  # (B,1,T,S), True = may attend
    mha = case.build("MultiHeadAttention", config, params, prefix=prefix)
    out = case.attention(mha, x, kv if cross else None, mask=mask)
    case.assert_close(out, expected, what="MHA vs nn.MultiheadAttention", baseline=baseline)


@BIAS
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_encoder_layer_vs_torch(case, causal, bias):
    config = torch_config(case.tiny, bias=bias)
    params = init_params(config, "seq2seq", seed=4, scheme="random")
    B, T = (2, 4) if case.tiny else (3, 9)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(B, T, config.d_model))
    valid = right_padded([T, T - 1, 2][:B], T)
    prefix = "encoder.layers.0."

    def run_torch(dt, dev):
        layer = torch_encoder_layer(config, params, prefix, dtype=dt, device=dev)
        out = layer(
            torch.as_tensor(x, dtype=dt, device=dev),
            src_mask=torch_bottom_right_disallowed(T, T, dev) if causal else None,
            src_key_padding_mask=~torch.as_tensor(valid, device=dev),
        )
        return _np(out)

    expected, baseline = _torch_in(case, run_torch)
    layer = case.build("EncoderLayer", config, params, prefix=prefix)
    out = case.np(layer(case.arr(x), *case.sees(valid, config.window, causal=causal)))
    # Padded positions of a layer's output are unspecified: compare real ones.
    case.assert_close(
        out[valid],
        expected[valid],
        what="EncoderLayer vs nn.TransformerEncoderLayer",
        baseline=None if baseline is None else baseline[valid],
    )


@BIAS
def test_decoder_layer_vs_torch(case, bias):
    config = torch_config(case.tiny, bias=bias)
    params = init_params(config, "seq2seq", seed=5, scheme="random")
    B, T, S = (2, 3, 5) if case.tiny else (3, 8, 12)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(B, T, config.d_model))
    memory = rng.normal(size=(B, S, config.d_model))
    valid = right_padded([T, 1, T - 1][:B], T)
    memory_valid = right_padded([S - 1, S, 3][:B], S)
    prefix = "decoder.layers.0."

    def run_torch(dt, dev):
        layer = torch_decoder_layer(config, params, prefix, dtype=dt, device=dev)
        out = layer(
            torch.as_tensor(x, dtype=dt, device=dev),
            torch.as_tensor(memory, dtype=dt, device=dev),
            tgt_mask=torch_bottom_right_disallowed(T, T, dev),
            tgt_key_padding_mask=~torch.as_tensor(valid, device=dev),
            memory_key_padding_mask=~torch.as_tensor(memory_valid, device=dev),
        )
        return _np(out)

    expected, baseline = _torch_in(case, run_torch)
    layer = case.build("DecoderLayer", config, params, prefix=prefix)
    positions, mask = case.sees(valid, config.window)
    out = case.np(
        layer(case.arr(x), positions, mask, case.arr(memory), case.cross(valid, memory_valid))
    )
    case.assert_close(
        out[valid],
        expected[valid],
        what="DecoderLayer vs nn.TransformerDecoderLayer",
        baseline=None if baseline is None else baseline[valid],
    )


def _seq2seq_inputs(config, tiny, seed):
    rng = np.random.default_rng(seed)
    S, T = (5, 4) if tiny else (12, 9)
    src_valid = right_padded([S, 2, S - 1], S)
    tgt_valid = right_padded([T - 2, T, 1], T)
    src = random_tokens(rng, config, 3, S, valid=src_valid)
    tgt = random_tokens(rng, config, 3, T, valid=tgt_valid)
    return src, tgt, src_valid, tgt_valid


@BIAS
def test_seq2seq_vs_nn_transformer(case, bias):
    config = torch_config(case.tiny, bias=bias)
    params = init_params(config, "seq2seq", seed=6, scheme="random")
    src, tgt, src_valid, tgt_valid = _seq2seq_inputs(config, case.tiny, 6)
    expected, baseline = _torch_in(
        case,
        lambda dt, dev: torch_seq2seq_logits(
            config, params, src, tgt, src_valid, tgt_valid, dtype=dt, device=dev
        ),
    )
    model = case.build("Seq2SeqTransformer", config, params)
    out = model.forward(
        case.arr(src), case.arr(tgt), src_valid=case.arr(src_valid), tgt_valid=case.arr(tgt_valid)
    )
    case.assert_close(out, expected, what="seq2seq vs nn.Transformer", baseline=baseline)


@pytest.mark.stage("decoder")
@BIAS
def test_decoder_only_vs_torch_encoder_stack(case, bias):
    config = torch_config(case.tiny, bias=bias)
    params = init_params(config, "decoder_only", seed=7, scheme="random")
    rng = np.random.default_rng(7)
    T = 5 if case.tiny else 10
    valid = right_padded([T, 3, 1], T)
    tokens = random_tokens(rng, config, 3, T, valid=valid)
    expected, baseline = _torch_in(
        case,
        lambda dt, dev: torch_decoder_only_logits(
            config, params, tokens, valid, dtype=dt, device=dev
        ),
    )
    model = case.build("DecoderOnlyTransformer", config, params)
    out = model.forward(case.arr(tokens), valid=case.arr(valid))
    case.assert_close(out, expected, what="decoder-only vs causal encoder stack", baseline=baseline)


# ---------------------------------------------------------------------------
# Gradients (torch levels): the same loss, differentiated by the level and by
# PyTorch's modules, must give the same gradient for every parameter.
# ---------------------------------------------------------------------------


@pytest.mark.no_lowp
@pytest.mark.torch_only
@pytest.mark.parametrize("kind", ["decoder_only", "seq2seq"])
def test_gradients_match_torch(case, kind):
    config = torch_config(case.tiny)
    params = init_params(config, kind, seed=8, scheme="random")
    rng = np.random.default_rng(8)
    if kind == "seq2seq":
        inputs = _seq2seq_inputs(config, case.tiny, 8)
        T = inputs[1].shape[1]
    else:
        T = 5 if case.tiny else 9
        valid = right_padded([T, 2, T - 1], T)
        inputs = (random_tokens(rng, config, 3, T, valid=valid), valid)
    weights = rng.normal(size=(3, T, config.vocab_size))  # a random linear loss on the logits

    # PyTorch's modules in float64.
    ref_model = torch_model(config, params, kind)
    t_inputs = [
        torch.as_tensor(a, dtype=torch.long if a.dtype != bool else torch.bool) for a in inputs
    ]
    (ref_model(*t_inputs) * torch.as_tensor(weights)).sum().backward()
    expected = {n: p.grad.numpy() for n, p in ref_model.named_parameters()}

    cls = "DecoderOnlyTransformer" if kind == "decoder_only" else "Seq2SeqTransformer"
    model = case.build(cls, config, params)
    if kind == "seq2seq":
        src, tgt, src_valid, tgt_valid = inputs
        logits = model.forward(
            case.arr(src),
            case.arr(tgt),
            src_valid=case.arr(src_valid),
            tgt_valid=case.arr(tgt_valid),
        )
    else:
        logits = model.forward(case.arr(inputs[0]), valid=case.arr(inputs[1]))
    (logits * case.arr(weights)).sum().backward()
    got = {n: p.grad for n, p in model.named_parameters()}
    assert set(got) == set(expected), f"parameter names differ: {set(got) ^ set(expected)}"
    for name, grad in expected.items():
        assert got[name] is not None, f"no gradient reached {name}"
        case.assert_close(got[name], grad, what=f"d loss / d {name}")
