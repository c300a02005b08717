"""Quick self-checks of levels 0 and 1 against PyTorch float64 and against each other.

Sizes are tiny because level 0 is pure Python. The shared suite covers the
rest of the contract; these pin down the numerics the two levels own.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import levels
from levels.common.params import subset

LEVELS = ("level0_loops", "level1_numpy")
# float64 end to end on both sides; the only differences are summation order
# and libm rounding, a few ulps amplified by at most a few dozen operations.
TOL = dict(rtol=1e-10, atol=1e-12)
# PyTorch's layers configured as this project's: pre-norm, exact GELU, no dropout, float64.
TORCH_LAYER = dict(
    dropout=0.0, activation="gelu", batch_first=True, norm_first=True, dtype=torch.float64
)


def level(name):
    return levels.load(name)


def config(**overrides):
    sizes = dict(vocab_size=13, d_model=12, n_heads=3, d_ff=20, n_layers=2, max_seq_len=9)
    return levels.TransformerConfig(**(sizes | overrides))


def setup(name, seed, kind="decoder_only", **overrides):
    """The level module, a config and random canonical parameters (biases and norms too)."""
    cfg = config(**overrides)
    return level(name), cfg, levels.init_params(cfg, kind, seed, scheme="random")


def torch_state(params, prefix):
    return {k: torch.from_numpy(v) for k, v in subset(params, prefix).items()}


def native(L, array):
    return L.asarray(array)


@pytest.mark.parametrize("name", LEVELS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,S", [(3, 3), (2, 5)])
def test_attention_matches_sdpa(name, causal, T, S):
    L = level(name)
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 2, n, 3)) for n in (T, S, S))
    mask = rng.random((2, 1, T, S)) < 0.7
    mask[..., -1] = True  # every row keeps its last key, which causal also allows
    got = L.to_numpy(
        L.attention(*(native(L, a) for a in (q, k, v)), causal=causal, mask=native(L, mask))
    )
    allowed = torch.from_numpy(mask)
    if causal:  # bottom-right: key j allowed for query i iff j <= i + S - T
        allowed = allowed & torch.ones(T, S, dtype=torch.bool).tril(S - T)
    want = F.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), attn_mask=allowed
    )
    np.testing.assert_allclose(got, want.numpy(), **TOL)


@pytest.mark.parametrize("name", LEVELS)
def test_attention_empty_row_and_mask_errors(name):
    L = level(name)
    q = native(L, np.zeros((1, 1, 3, 2)))
    kv = native(L, np.zeros((1, 1, 2, 2)))
    with pytest.raises(ValueError, match="no key"):
        L.attention(q, kv, kv, causal=True)  # T > S: the first query sees nothing
    with pytest.raises(TypeError):
        L.attention(q, kv, kv, mask=native(L, np.ones((1, 1, 3, 2))))
    with pytest.raises(ValueError, match="broadcastable"):
        L.attention(q, kv, kv, mask=native(L, np.ones((1, 1, 3, 3), bool)))


@pytest.mark.parametrize("name", LEVELS)
def test_multihead_attention_matches_torch(name):
    L, cfg, params = setup(name, 1)
    mha = L.MultiHeadAttention(cfg, params, prefix="layers.0.self_attn.")
    ref = torch.nn.MultiheadAttention(12, 3, batch_first=True, dtype=torch.float64)
    ref.load_state_dict(torch_state(params, "layers.0.self_attn."))
    rng = np.random.default_rng(1)
    x, kv = rng.normal(size=(2, 4, 12)), rng.normal(size=(2, 5, 12))
    got = L.to_numpy(mha(native(L, x), native(L, kv)))
    want = ref(*(torch.from_numpy(a) for a in (x, kv, kv)), need_weights=False)[0]
    np.testing.assert_allclose(got, want.detach().numpy(), **TOL)


def rope_reference(x, offset, base):
    """Rotary embedding of ``x (B,H,T,Dh)`` as complex multiplication: pair (a, b) is a + ib."""
    T, Dh = x.shape[-2:]
    z = x[..., 0::2] + 1j * x[..., 1::2]  # (B,H,T,Dh/2)
    angle = np.outer(offset + np.arange(T), base ** (-np.arange(0, Dh, 2) / Dh))  # (T, Dh/2)
    z = z * np.exp(1j * angle)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


@pytest.mark.parametrize("name", LEVELS)
def test_rope_self_attention_matches_reference(name):
    L, cfg, params = setup(name, 7, rope_base=50.0)  # a small base makes every pair turn visibly
    mha = L.MultiHeadAttention(cfg, params, prefix="layers.0.self_attn.", rope=True)
    x = np.random.default_rng(7).normal(size=(2, 4, 12))
    got = L.to_numpy(mha(native(L, x), causal=True, position_offset=3))

    w, b = params["layers.0.self_attn.in_proj_weight"], params["layers.0.self_attn.in_proj_bias"]
    q, k, v = ((x @ w[i * 12 : (i + 1) * 12].T + b[i * 12 : (i + 1) * 12]) for i in range(3))
    q, k, v = (a.reshape(2, 4, 3, 4).transpose(0, 2, 1, 3) for a in (q, k, v))  # (B,H,T,Dh)
    q, k = rope_reference(q, 3, 50.0), rope_reference(k, 3, 50.0)
    heads = F.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), is_causal=True
    )
    merged = heads.numpy().transpose(0, 2, 1, 3).reshape(2, 4, 12)
    want = merged @ params["layers.0.self_attn.out_proj.weight"].T
    want = want + params["layers.0.self_attn.out_proj.bias"]
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("name", LEVELS)
def test_encoder_layer_matches_torch(name):
    L, cfg, params = setup(name, 2, positional="none")  # torch's layer has no RoPE
    layer = L.EncoderLayer(cfg, params, prefix="layers.1.")
    ref = torch.nn.TransformerEncoderLayer(12, 3, 20, **TORCH_LAYER).eval()
    ref.load_state_dict(torch_state(params, "layers.1."))
    x = np.random.default_rng(2).normal(size=(2, 5, 12))
    valid = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    got = L.to_numpy(layer(native(L, x), valid=native(L, valid)))
    want = ref(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(~valid)).detach().numpy()
    # Padded query rows are free to differ (torch's fast path may zero them).
    np.testing.assert_allclose(got[valid], want[valid], **TOL)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor:UserWarning")
@pytest.mark.parametrize("name", LEVELS)
def test_seq2seq_matches_torch_transformer(name):
    L, cfg, params = setup(
        name, 3, "seq2seq", positional="none"
    )  # nn.Transformer has no rotary positions
    model = L.Seq2SeqTransformer(cfg, params)
    ref = torch.nn.Transformer(12, 3, 2, 2, 20, **TORCH_LAYER).eval()
    state = {
        k: torch.from_numpy(v) for k, v in params.items() if k.startswith(("encoder.", "decoder."))
    }
    ref.load_state_dict(state)
    src = np.array([[3, 4, 5, 6], [7, 8, 9, 0]])
    tgt = np.array([[1, 5, 6], [1, 7, 0]])
    got = L.to_numpy(model.forward(native(L, src), native(L, tgt)))
    scale = math.sqrt(12)
    emb_s, emb_t = params["source_embedding.weight"], params["target_embedding.weight"]
    hidden = ref(
        torch.from_numpy(emb_s[src] * scale),
        torch.from_numpy(emb_t[tgt] * scale),
        tgt_mask=torch.ones(3, 3, dtype=torch.bool).triu(1),  # torch: True = may NOT attend
        src_key_padding_mask=torch.from_numpy(src == 0),
        tgt_key_padding_mask=torch.from_numpy(tgt == 0),
        memory_key_padding_mask=torch.from_numpy(src == 0),
    )
    want = hidden.detach().numpy() @ params["output_projection.weight"].T
    valid = tgt != 0
    np.testing.assert_allclose(got[valid], want[valid], **TOL)
    assert (got[~valid] == 0).all()


@pytest.mark.parametrize("name", LEVELS)
@pytest.mark.parametrize("kind", ["decoder_only", "seq2seq"])
def test_cache_matches_forward_and_generation(name, kind):
    L = level(name)
    cfg = config()
    params = levels.init_params(cfg, kind, 4, scheme="random")
    tokens = np.array([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 3, 4]])
    if kind == "decoder_only":
        model = L.DecoderOnlyTransformer(cfg, params)
        full = L.to_numpy(model.forward(native(L, tokens)))
        logits, cache = model.prefill(native(L, tokens[:, :3]))
        steps = [L.to_numpy(model.decode_step(native(L, tokens[:, t]), cache)) for t in range(3, 6)]
        gen = [
            L.to_numpy(model.generate(native(L, tokens[:, :2]), 5, use_cache=c))
            for c in (True, False)
        ]
    else:
        model = L.Seq2SeqTransformer(cfg, params)
        src = native(L, np.array([[5, 6, 7, 0], [8, 9, 10, 11]]))
        full = L.to_numpy(model.forward(src, native(L, tokens)))
        logits, cache = model.prefill(src, native(L, tokens[:, :3]))
        steps = [L.to_numpy(model.decode_step(native(L, tokens[:, t]), cache)) for t in range(3, 6)]
        gen = [
            L.to_numpy(model.generate(src, max_new_tokens=6, use_cache=c)) for c in (True, False)
        ]
    assert cache.length == 6
    np.testing.assert_allclose(L.to_numpy(logits), full[:, :3], **TOL)
    np.testing.assert_allclose(np.stack(steps, axis=1), full[:, 3:], **TOL)
    np.testing.assert_array_equal(gen[0], gen[1])
    with pytest.raises(ValueError, match="overflow"):
        for t in range(4):
            model.decode_step(native(L, tokens[:, t]), cache)
    assert cache.length == cfg.max_seq_len  # the failing step left the cache as it was


@pytest.mark.parametrize("name", LEVELS)
def test_input_errors(name):
    L = level(name)
    cfg = config()
    model = L.DecoderOnlyTransformer(cfg, levels.init_params(cfg, "decoder_only", 5))
    with pytest.raises(ValueError, match="outside"):
        model.forward(native(L, np.array([[3, 13]])))
    with pytest.raises(ValueError, match="max_seq_len"):
        model.forward(native(L, np.full((1, 10), 3)))
    with pytest.raises(ValueError, match="no valid token"):
        model.forward(native(L, np.array([[3, 4], [0, 0]])))
    params = levels.init_params(cfg, "decoder_only", 5)
    del params["norm.weight"]
    with pytest.raises(ValueError, match="norm.weight"):
        L.DecoderOnlyTransformer(cfg, params)


def test_level0_and_level1_agree():
    L0, L1 = level("level0_loops"), level("level1_numpy")
    cfg = config(bias=False)
    params = levels.init_params(cfg, "decoder_only", 6, scheme="random")
    tokens = np.array([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]])
    out0 = L0.to_numpy(L0.DecoderOnlyTransformer(cfg, params).forward(L0.asarray(tokens)))
    out1 = L1.to_numpy(L1.DecoderOnlyTransformer(cfg, params).forward(L1.asarray(tokens)))
    np.testing.assert_allclose(out0, out1, **TOL)


def test_level1_float32():
    L1 = level("level1_numpy")
    cfg = config()
    params = levels.init_params(cfg, "seq2seq", 8, scheme="random")
    src, tgt = np.array([[3, 4, 5, 0]]), np.array([[1, 6, 7]])
    ref = L1.Seq2SeqTransformer(cfg, params).forward(L1.asarray(src), L1.asarray(tgt))
    out = L1.Seq2SeqTransformer(cfg, params, dtype=np.float32).forward(
        L1.asarray(src), L1.asarray(tgt)
    )
    assert out.dtype == np.float32
    # float32 rounding (eps 6e-8) accumulated over ~20 dependent operations of O(1) values.
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
