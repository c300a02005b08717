"""Hugging Face checkpoints in and out of the ladder (the levels.hf package).

Tiny random models are built with ``transformers`` itself (nothing is
downloaded): Llama with grouped-query attention and an untied head, Llama
with every bias and multi-query attention, Mistral with a sliding window
shorter than the test sequences, Qwen2 with q/k/v biases and tied embeddings,
GPT-NeoX with sequential residual and full rotary, Gemma 3 with a local
(windowed) and a global layer, heads wider than D / H, QK-norm, post-norms and
its own score scale. Their weights are redrawn
so that every norm gain and bias differs from its initial 1 or 0: a converter
that dropped one, or put a row in the wrong place, could not pass.

The conversion is proved twice: by ``reference_logits`` below, a float64
numpy forward of the canonical model written from its definition, against
transformers' own logits; and by every level against the same logits.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from hf_peer import make_exact
from scipy.special import erf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import levels
from levels import hf
from levels.common.config import TransformerConfig
from levels.common.params import init_params

SIZES = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=64,
)
FAMILIES = {
    "llama": (transformers.LlamaConfig, dict(num_key_value_heads=2, tie_word_embeddings=False)),
    "llama_biases": (
        transformers.LlamaConfig,
        dict(num_key_value_heads=1, attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    ),
    "mistral": (transformers.MistralConfig, dict(num_key_value_heads=2, sliding_window=4)),
    "qwen2": (transformers.Qwen2Config, dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "gpt_neox": (
        transformers.GPTNeoXConfig,
        dict(use_parallel_residual=False, rotary_pct=1.0, tie_word_embeddings=False),
    ),
    # Layer 0 local (a window of 4, RoPE base 1e4), layer 1 global (base 1e6); heads of 16
    # (D / H = 8); scores scaled by 12 ** -0.5, not 1 / sqrt(16).
    "gemma3_text": (
        transformers.Gemma3TextConfig,
        dict(
            num_key_value_heads=1,
            head_dim=16,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=12,
            pad_token_id=0,
        ),
    ),
}
FAMILY_NAMES = list(FAMILIES)

# Longer than Mistral's window of 4, so the window decides some scores.
TOKENS = np.array([[5, 17, 3, 60, 22, 9, 41, 0, 33, 12], [1, 2, 63, 7, 7, 30, 18, 44, 25, 6]])

# transformers computes two steps in float32 even in a float64 model: RoPE's inverse
# frequencies and angles (LlamaRotaryEmbedding.forward: `position_ids.float() *
# inv_freq.float()`, then cos/sin cast to float64) and, in the Llama family, RMSNorm
# (LlamaRMSNorm.forward: `hidden_states.to(torch.float32)`); the ladder computes both in
# float64. float32 rounding (eps 1.2e-7) in the angles and the normalised stream moves the
# logits by a few 1e-7 relative (measured: at most 9e-7 absolute on logits up to 3.5);
# 1e-5 leaves a 10x margin and is still far below what a misplaced row costs (> 1e-2).
STOCK_ATOL = STOCK_RTOL = 1e-5
# Against transformers with those two steps patched to float64 (`exact=True`), both sides
# compute the same float64 arithmetic in different orders: at most 3e-15 observed, so 1e-12
# (~500 ulps of O(1) logits, tests/conftest.py's float64 rule) catches an eps in the wrong place.
EXACT_TOL = 1e-12
# Level 4 runs in float32: eps 1.2e-7 through sums over D, F and two layers (transformers'
# own float32 model is 1.8e-6 off its float64 one here); tests/conftest.py's float32
# tolerance, 2e-5, plus the float32 steps of the float64 model above.
FLOAT32_TOL = 3e-5


# ---------------------------------------------------------------------------
# Tiny checkpoints
# ---------------------------------------------------------------------------


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Redraw every parameter: matrices N(0, 1/fan_in), vectors (gains, biases) moved by N(0, 0.1)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # tied weights appear once
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if p.ndim == 1:
                p.add_(0.1 * noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[1]))


def _build(family: str, seed: int = 0) -> torch.nn.Module:
    config_class, extra = FAMILIES[family]
    config = config_class(**SIZES, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config)
    _randomize(model, seed)
    return model.eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Each family saved once by ``save_pretrained`` (float32 safetensors)."""
    root = tmp_path_factory.mktemp("hf")
    paths = {}
    for seed, family in enumerate(FAMILY_NAMES):
        paths[family] = root / family
        _build(family, seed).save_pretrained(paths[family])
    return paths


@cache
def _hf_model(path: str, dtype=torch.float64, exact: bool = False) -> torch.nn.Module:
    """``from_pretrained(path)`` in ``dtype``, with PyTorch's SDPA (float64 softmax; the eager
    attention takes its softmax in float32). ``exact``: also RoPE's tables and RMSNorm in
    float64, the two steps transformers computes in float32 even in a float64 model."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="sdpa"
    )
    return (make_exact(model) if exact else model).eval()


def hf_logits(path: Path, tokens: np.ndarray, dtype=torch.float64, *, exact=False) -> np.ndarray:
    with torch.no_grad():
        out = _hf_model(str(path), dtype, exact)(torch.as_tensor(tokens)).logits
    return out.double().numpy()


@cache
def _hf_generate(path: str, prefix: tuple, n: int) -> tuple:
    with torch.no_grad():
        out = _hf_model(path).generate(
            torch.tensor([prefix]),
            attention_mask=torch.ones(1, len(prefix), dtype=torch.long),
            do_sample=False,
            max_new_tokens=n,
            eos_token_id=None,  # no early stop: the ladder always generates n tokens
            pad_token_id=0,
        )
    assert out.shape == (1, len(prefix) + n), "transformers stopped early"
    return tuple(out[0].tolist())


def hf_generate(path: Path, prefix: list[int], n: int) -> list[int]:
    return list(_hf_generate(str(path), tuple(prefix), n))


def _edit_config(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    edit(raw)
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


# ---------------------------------------------------------------------------
# The canonical model in numpy, from its definition
# ---------------------------------------------------------------------------


def rope_tables(T: int, d_head: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin (T, Dh/2)`` in float64, angle of pair i at position p: ``p * base^(-2i/Dh)``."""
    inv_freq = base ** (-np.arange(0, d_head, 2, dtype=np.float64) / d_head)  # (Dh/2,)
    angles = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]  # (T, Dh/2)
    return np.cos(angles), np.sin(angles)


def reference_logits(config: TransformerConfig, params: dict, tokens: np.ndarray) -> np.ndarray:
    """Logits ``(B,T,V)`` of the canonical decoder-only model, float64, every position valid.

    Pre-norm blocks ``x += attn(norm1(x)); x += ffn(norm2(x))``, final norm, logits; with
    Gemma's options, ``x += post_norm1(attn(norm1(x)))`` and so on, q and k normed per head,
    the gains ``1 + weight``, every ``window_pattern``-th layer global (the others windowed,
    with RoPE base ``rope_local_base``), GeGLU's tanh GELU.
    """
    B, T = tokens.shape
    H, Hkv, Dh = config.n_heads, config.kv_heads, config.d_head
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    scale = config.attn_scale if config.attn_scale is not None else 1 / math.sqrt(Dh)

    def get(name):
        return params.get(name, 0.0)  # an absent bias adds nothing

    def norm(x, prefix):
        if config.norm == "rmsnorm":
            x = x / np.sqrt((x**2).mean(-1, keepdims=True) + config.norm_eps)
        else:
            mu = x.mean(-1, keepdims=True)
            x = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + config.norm_eps)
        gain = params[prefix + "weight"] + config.norm_weight_offset
        return x * gain + get(prefix + "bias")

    def linear(x, prefix):
        return x @ params[prefix + "weight"].T + get(prefix + "bias")

    def rope(x, base):  # (B,h,T,Dh): adjacent pairs (a, b) -> (a cos - b sin, b cos + a sin)
        cos, sin = rope_tables(T, Dh, base)  # (T, Dh/2)
        a, b = x[..., 0::2], x[..., 1::2]  # (B,h,T,Dh/2)
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
        return out

    def post(x, prefix):  # a norm after the sublayer, with Gemma's post_norms
        return norm(x, prefix) if config.post_norms else x

    x = params["token_embedding.weight"][tokens] * config.embedding_scale  # (B,T,D)
    for layer in range(config.n_layers):
        p = f"layers.{layer}."
        pattern = config.window_pattern
        window = None if pattern and (layer + 1) % pattern == 0 else config.window
        base = config.rope_local_base if window and config.rope_local_base else config.rope_base
        allowed = j <= i  # (T, T) causal
        if window is not None:
            allowed &= i - j < window  # the W most recent keys, itself included
        qkv = norm(x, p + "norm1.") @ params[p + "self_attn.in_proj_weight"].T  # (B,T,HDh+2Dkv)
        qkv = qkv + get(p + "self_attn.in_proj_bias")
        Dq = H * Dh
        q = qkv[..., :Dq].reshape(B, T, H, Dh).transpose(0, 2, 1, 3)  # (B,H,T,Dh)
        k = qkv[..., Dq : Dq + Hkv * Dh].reshape(B, T, Hkv, Dh).transpose(0, 2, 1, 3)
        v = qkv[..., Dq + Hkv * Dh :].reshape(B, T, Hkv, Dh).transpose(0, 2, 1, 3)  # (B,Hkv,T,Dh)
        if config.qk_norm:  # each head's features, before RoPE
            q, k = norm(q, p + "self_attn.q_norm."), norm(k, p + "self_attn.k_norm.")
        q, k = rope(q, base), rope(k, base)
        k = np.repeat(k, H // Hkv, axis=1)  # (B,H,T,Dh): query head h reads kv head h // (H/Hkv)
        v = np.repeat(v, H // Hkv, axis=1)  # (B,H,T,Dh)
        scores = np.where(allowed, q @ k.swapaxes(-1, -2) * scale, -np.inf)  # (B,H,T,T)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        heads = (weights @ v).transpose(0, 2, 1, 3).reshape(B, T, Dq)  # (B,T,H Dh)
        x = x + post(linear(heads, p + "self_attn.out_proj."), p + "post_norm1.")
        h = norm(x, p + "norm2.")
        if config.ffn == "swiglu":
            gate = linear(h, p + "linear_gate.")
            h = gate / (1.0 + np.exp(-gate)) * linear(h, p + "linear1.")  # silu(gate) * up
        elif config.ffn == "geglu":  # GELU's tanh approximation on the gate
            gate = linear(h, p + "linear_gate.")
            tanh = np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3))
            h = 0.5 * gate * (1.0 + tanh) * linear(h, p + "linear1.")
        else:
            h = linear(h, p + "linear1.")
            h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))  # exact GELU
        x = x + post(linear(h, p + "linear2."), p + "post_norm2.")
    head = params["token_embedding.weight" if config.tie_embeddings else "output_projection.weight"]
    return norm(x, "norm.") @ head.T  # (B,T,V)


class ReferenceGenerator:
    """Greedy decoding with ``reference_logits``; ``generate`` returns nested lists, like level 0."""

    def __init__(self, config, params):
        self.config, self.params = config, params

    def generate(self, prefix, max_new_tokens):
        tokens = np.asarray(prefix)
        for _ in range(max_new_tokens):
            nxt = reference_logits(self.config, self.params, tokens)[:, -1].argmax(-1)  # (B,)
            tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
        return tokens.tolist()


def _explicit(config: TransformerConfig) -> TransformerConfig:
    """``config`` with the options that may follow others (None) spelled out: same model, same value."""
    return dataclasses.replace(
        config,
        n_kv_heads=config.kv_heads,
        qkv_bias=config.has_qkv_bias,
        out_bias=config.has_out_bias,
    )


def assert_close(actual, expected, *, atol, rtol, what):
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = np.abs(actual - expected)
    bad = err > atol + rtol * np.abs(expected)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {err.size} out of tolerance, max |diff| {err.max():.3e}"
    )


# ---------------------------------------------------------------------------
# 1. The conversion, proved against transformers without the levels
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_reference_forward_matches_transformers(checkpoints, family):
    config, params = hf.load(checkpoints[family])
    expected = hf_logits(checkpoints[family], TOKENS)
    assert np.abs(expected).max() > 0.5  # logits of size O(1): the comparison means something
    ours = reference_logits(config, params, TOKENS)
    assert_close(ours, expected, atol=STOCK_ATOL, rtol=STOCK_RTOL, what=family)
    exact = hf_logits(checkpoints[family], TOKENS, exact=True)
    assert_close(ours, exact, atol=EXACT_TOL, rtol=EXACT_TOL, what=family)


def test_the_permutation_matters(checkpoints):
    """Without the RoPE row permutation the logits are plainly wrong (the test can fail)."""
    config, params = hf.load(checkpoints["llama"])
    raw = dict(params)
    H, Hkv, Dh = config.n_heads, config.kv_heads, config.d_head
    rows = params["layers.0.self_attn.in_proj_weight"]  # (D + 2 Dkv, D)
    q, k = rows[: H * Dh], rows[H * Dh : (H + Hkv) * Dh]
    raw["layers.0.self_attn.in_proj_weight"] = np.concatenate(
        [hf.to_rotate_half(q, H), hf.to_rotate_half(k, Hkv), rows[(H + Hkv) * Dh :]]
    )
    expected = hf_logits(checkpoints["llama"], TOKENS)
    assert np.abs(reference_logits(config, raw, TOKENS) - expected).max() > 1e-2


# What each tiny checkpoint must become: (norm, ffn, bias, qkv bias, out bias, Hkv, window, tied).
LOADED = {
    "llama": ("rmsnorm", "swiglu", False, False, False, 2, None, False),
    "llama_biases": ("rmsnorm", "swiglu", True, True, True, 1, None, True),
    "mistral": ("rmsnorm", "swiglu", False, False, False, 2, 4, False),
    "qwen2": ("rmsnorm", "swiglu", False, True, False, 2, None, True),
    "gpt_neox": ("layernorm", "gelu", True, True, True, 4, None, False),
    "gemma3_text": ("rmsnorm", "geglu", False, False, False, 1, 4, True),
}
# Gemma 3's options, as its tiny checkpoint must give them (the others' are the defaults).
GEMMA_LOADED = dict(
    head_dim=16, attn_scale=12**-0.5, qk_norm=True, post_norms=True, norm_weight_offset=1.0,
    window_pattern=2, rope_base=1e6, rope_local_base=1e4, scale_embeddings=True,
)  # fmt: skip


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_loaded_config(checkpoints, family):
    c = hf.load(checkpoints[family])[0]
    facts = (c.norm, c.ffn, c.bias, c.has_qkv_bias, c.has_out_bias, c.kv_heads, c.window)
    assert (*facts, c.tie_embeddings) == LOADED[family]
    assert (c.positional, c.max_seq_len) == ("rope", 64)
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
    expected = GEMMA_LOADED if family == "gemma3_text" else {"scale_embeddings": False}
    for name in GEMMA_LOADED:
        assert getattr(c, name) == expected.get(name, defaults[name]), name
    assert c.norm_eps == (1e-5 if family == "gpt_neox" else 1e-6)  # layer_norm_eps, rms_norm_eps
    # Llama and Mistral: bos 1, eos 2, no pad, so pad is eos; GPT-NeoX: bos 0, eos 2;
    # Qwen2: none of the three set, so all 0; Gemma: bos 2, eos 1, pad 0.
    ids = {"gpt_neox": (0, 2, 2), "qwen2": (0, 0, 0), "gemma3_text": (2, 1, 0)}
    assert (c.bos_id, c.eos_id, c.pad_id) == ids.get(family, (1, 2, 2))
    assert hf.load(checkpoints[family], max_seq_len=16)[0].max_seq_len == 16


# ---------------------------------------------------------------------------
# 2. Round trips
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_round_trip(checkpoints, family, tmp_path):
    config, params = hf.load(checkpoints[family])
    hf.save(tmp_path, config, params)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == ("llama" if family == "llama_biases" else family)
    original = _hf_model(str(checkpoints[family]), torch.float32).state_dict()
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    assert again.keys() == original.keys()
    for name, tensor in original.items():
        assert again[name].dtype == torch.float32
        assert torch.equal(again[name], tensor), name
    config2, params2 = hf.load(tmp_path)
    assert config2 == config
    assert params2.keys() == params.keys()
    for name in params:
        np.testing.assert_array_equal(params2[name], params[name], err_msg=name)


GEMMA = dict(
    norm="rmsnorm", ffn="geglu", bias=False, qk_norm=True, post_norms=True,
    norm_weight_offset=1.0, scale_embeddings=True, n_kv_heads=2,
)  # fmt: skip
NATIVE = {
    # Configs the ladder makes that no checkpoint above has: Qwen2 with a window
    # (its use_sliding_window), Llama with a tied head and MQA, GPT-NeoX without
    # attention biases and with a tied head.
    "qwen2_window": dict(
        norm="rmsnorm",
        ffn="swiglu",
        bias=False,
        qkv_bias=True,
        out_bias=False,
        window=3,
        n_kv_heads=2,
    ),
    "llama_tied": dict(norm="rmsnorm", ffn="swiglu", bias=False, n_kv_heads=1),
    "neox_no_attention_bias": dict(
        norm="layernorm", ffn="gelu", bias=True, qkv_bias=False, out_bias=False
    ),
    # Gemma 3 with every layer global, and with every layer local (its own RoPE base),
    # with attention biases, heads of D / H, the default score scale, an untied head.
    "gemma_global": dict(GEMMA, tie_embeddings=False),
    "gemma_local": dict(GEMMA, window=3, rope_local_base=50.0, qkv_bias=True, out_bias=True),
    "gemma_pattern": dict(GEMMA, window=3, window_pattern=2, head_dim=6, attn_scale=0.25),
}


@pytest.mark.parametrize("name", list(NATIVE))
def test_save_native_config(name, tmp_path):
    config = TransformerConfig(
        **dict(
            vocab_size=40, d_model=16, n_heads=4, d_ff=24, n_layers=2, max_seq_len=32,
            rope_base=500.0, norm_eps=1e-5, pad_id=3, bos_id=1, eos_id=2,
            scale_embeddings=False,
        ) | NATIVE[name],
    )  # fmt: skip
    # float32 values, so that the float32 file holds them exactly
    params = {
        k: v.astype(np.float32).astype(np.float64)
        for k, v in init_params(config, "decoder_only", seed=1, scheme="random").items()
    }
    hf.save(tmp_path, config, params)
    loaded_config, loaded = hf.load(tmp_path)
    assert _explicit(loaded_config) == _explicit(config)
    for k in params:
        np.testing.assert_array_equal(loaded[k], params[k], err_msg=k)
    tokens = TOKENS[:, :8] % config.vocab_size
    expected = hf_logits(tmp_path, tokens, exact=True)
    ours = reference_logits(config, params, tokens)
    assert_close(ours, expected, atol=EXACT_TOL, rtol=EXACT_TOL, what=name)


SAVE_REFUSALS = [
    (dict(scale_embeddings=True), "scale_embeddings"),
    (dict(positional="none"), "positional"),
    (dict(norm="layernorm", ffn="swiglu"), "norm='layernorm' with ffn='swiglu'"),
    (dict(norm="rmsnorm", ffn="gelu"), "norm='rmsnorm' with ffn='gelu'"),
    (dict(bias=False), "bias=False"),  # GPT-NeoX always has biases
    (dict(n_kv_heads=1), "n_kv_heads"),
    (dict(window=4), "window"),
    (dict(qkv_bias=False), "qkv_bias=False with out_bias=True"),
    (
        dict(norm="rmsnorm", ffn="swiglu", bias=False, qkv_bias=False, out_bias=True),
        "out_bias=True",
    ),
    (dict(norm="rmsnorm", ffn="swiglu", bias=True, window=4), "window=4"),
    # An option only Gemma 3 has needs every one of Gemma's.
    (dict(norm="rmsnorm", ffn="swiglu", bias=False, qk_norm=True), "qk_norm=True is Gemma 3's"),
    (GEMMA | dict(qk_norm=False), "whose models have qk_norm=True"),
    (GEMMA | dict(norm_weight_offset=0.0), "norm_weight_offset=1.0"),
    (GEMMA | dict(scale_embeddings=False), "scale_embeddings=True"),
    (GEMMA | dict(bias=True), "bias=False"),
    (GEMMA | dict(qkv_bias=True), "attention_bias covers both"),
    (GEMMA | dict(attn_scale=0.3), "no integer gives this scale"),
]


@pytest.mark.parametrize(("change", "match"), SAVE_REFUSALS)
def test_save_refuses(change, match, tmp_path):
    base = dict(vocab_size=16, d_model=8, n_heads=2, d_ff=8, n_layers=1, scale_embeddings=False)
    config = TransformerConfig(**(base | change))
    with pytest.raises(ValueError, match=match):
        hf.save(tmp_path, config, init_params(config, "decoder_only"))
    assert not (tmp_path / "config.json").exists()


def test_sharded_checkpoint(checkpoints, tmp_path):
    model = _hf_model(str(checkpoints["llama"]), torch.float32)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    config, params = hf.load(tmp_path)
    config0, params0 = hf.load(checkpoints["llama"])
    assert config == config0
    assert params.keys() == params0.keys()
    for name in params:
        np.testing.assert_array_equal(params[name], params0[name], err_msg=name)


def test_bfloat16_checkpoint(checkpoints, tmp_path):
    model = _hf_model(str(checkpoints["qwen2"]), torch.float32)
    transformers.AutoModelForCausalLM.from_pretrained(
        checkpoints["qwen2"], dtype=torch.bfloat16
    ).save_pretrained(tmp_path)
    _, params = hf.load(tmp_path)
    rounded = model.model.embed_tokens.weight.detach().bfloat16().double().numpy()
    np.testing.assert_array_equal(params["token_embedding.weight"], rounded)
    assert all(v.dtype == np.float64 for v in params.values())


# ---------------------------------------------------------------------------
# 3. What config.json may say
# ---------------------------------------------------------------------------


def _set(**changes):
    def edit(raw):
        raw.update(changes)

    return edit


def _drop(*keys, **changes):
    def edit(raw):
        for key in keys:
            raw.pop(key, None)
        raw.update(changes)

    return edit


LOAD_REFUSALS = [
    ("llama", _set(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling.*'linear'"),
    ("mistral", _set(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling.*'yarn'"),
    (
        "llama",
        _set(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}),
        "rope_parameters.*'llama3'",
    ),
    (
        "gpt_neox",
        _set(
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.25,
            }
        ),
        "partial_rotary_factor=0.25",
    ),
    ("gpt_neox", _drop("rope_parameters", rotary_pct=0.5), "rotary_pct=0.5"),
    ("gpt_neox", _drop("rope_parameters"), r"rotary_pct=0.25 \(the default"),
    (
        "qwen2",
        _set(
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e4,
                "partial_rotary_factor": 0.5,
            }
        ),
        "partial_rotary_factor=0.5",
    ),
    ("gpt_neox", _set(use_parallel_residual=True), "use_parallel_residual=True"),
    ("gpt_neox", _drop("use_parallel_residual"), r"use_parallel_residual=True \(the default"),
    ("gpt_neox", _set(hidden_act="gelu_new"), "hidden_act='gelu_new'"),
    ("llama", _set(hidden_act="gelu"), "hidden_act='gelu'"),
    ("qwen2", _set(hidden_act="relu"), "hidden_act='relu'"),
    ("llama", _set(head_dim=16), "head_dim=16"),
    ("mistral", _set(head_dim=4), "head_dim=4"),
    (
        "qwen2",
        _drop("layer_types", use_sliding_window=True, sliding_window=4, max_window_layers=1),
        "max_window_layers=1",
    ),
    (
        "qwen2",
        _set(
            use_sliding_window=True,
            sliding_window=4,
            layer_types=["full_attention", "sliding_attention"],
        ),
        "layer_types",
    ),
    ("mistral", _set(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    ("llama", _set(model_type="gpt2"), "model_type='gpt2'"),
    ("llama", _set(quantization_config={"quant_method": "bitsandbytes"}), "quantization_config"),
    ("llama", _set(eos_token_id=64), "eos_token_id=64"),
    ("llama", _set(mlp_bias=True), "mlp.gate_proj.bias"),  # the file has no MLP biases
    ("gemma3_text", _set(final_logit_softcapping=30.0), "final_logit_softcapping=30.0"),
    ("gemma3_text", _set(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0"),
    ("gemma3_text", _set(use_bidirectional_attention=True), "use_bidirectional_attention"),
    ("gemma3_text", _set(hidden_activation="gelu"), "hidden_activation='gelu'"),
    ("gemma3_text", _set(layer_types=["full_attention", "sliding_attention"]), "layer_types"),
    (
        "gemma3_text",
        _set(
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            }
        ),
        "RoPE type 'linear' of the full_attention layers",
    ),
    ("gemma3_text", _set(model_type="gemma3"), "multimodal"),
]


@pytest.mark.parametrize(("family", "edit", "match"), LOAD_REFUSALS)
def test_load_refuses(checkpoints, family, edit, match, tmp_path):
    path = _edit_config(checkpoints[family], tmp_path / "model", edit)
    with pytest.raises(ValueError, match=match):
        hf.load(path)


def test_load_refuses_more(checkpoints, tmp_path):
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        hf.load(checkpoints["llama"], max_seq_len=65)
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf.load(tmp_path)
    path = shutil.copytree(checkpoints["llama"], tmp_path / "extra")
    model = _hf_model(str(checkpoints["llama"]), torch.float32)
    state = {k: v.contiguous() for k, v in model.state_dict().items()} | {
        "model.extra.weight": torch.ones(2)
    }
    from safetensors.torch import save_file

    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="model.extra.weight"):
        hf.load(path)


ACCEPTED = [
    # (family, edit, what the ladder's config must say, what transformers' config says)
    (
        "qwen2",
        _drop("layer_types", use_sliding_window=True, sliding_window=4, max_window_layers=0),
        4,
        4,
    ),
    (
        "qwen2",
        _set(use_sliding_window=True, sliding_window=4, layer_types=["sliding_attention"] * 2),
        4,
        4,
    ),
    ("qwen2", _set(use_sliding_window=False, sliding_window=4), None, None),
    ("mistral", _set(sliding_window=None), None, None),
]


@pytest.mark.parametrize(("family", "edit", "window", "hf_window"), ACCEPTED)
def test_window_keys(checkpoints, family, edit, window, hf_window, tmp_path):
    path = _edit_config(checkpoints[family], tmp_path / "model", edit)
    config, params = hf.load(path)
    assert config.window == window
    assert transformers.AutoConfig.from_pretrained(path).sliding_window == hf_window
    expected = hf_logits(path, TOKENS[:1], exact=True)
    ours = reference_logits(config, params, TOKENS[:1])
    assert_close(ours, expected, atol=EXACT_TOL, rtol=EXACT_TOL, what=family)


def test_older_config_keys(checkpoints, tmp_path):
    """transformers 4's spelling: top-level rope_theta, rope_scaling null, NeoX's rotary_* keys."""
    llama = _edit_config(
        checkpoints["llama"],
        tmp_path / "llama",
        _drop("rope_parameters", rope_theta=500.0, rope_scaling=None),
    )
    neox = _edit_config(
        checkpoints["gpt_neox"],
        tmp_path / "neox",
        _drop("rope_parameters", rotary_pct=1.0, rotary_emb_base=700.0),
    )
    for path, theta in ((llama, 500.0), (neox, 700.0)):
        assert hf.load(path)[0].rope_base == theta
        assert transformers.AutoConfig.from_pretrained(path).rope_parameters["rope_theta"] == theta
    eos_list = _edit_config(checkpoints["llama"], tmp_path / "eos", _set(eos_token_id=[5, 6]))
    config = hf.load(eos_list)[0]
    assert (config.eos_id, config.pad_id) == (5, 5)


# ---------------------------------------------------------------------------
# 4. Every level against transformers
# ---------------------------------------------------------------------------

LEVEL_DTYPES = {
    "level0_loops": None,
    "level1_numpy": np.float64,
    "level2_torch_manual": torch.float64,
    "level3_sdpa_flash": torch.float64,
    "level4_triton_kernel": torch.float32,
}


def _level_model(name: str, config, params):
    try:
        module = levels.load(name)
    except levels.LevelUnavailable as exc:
        pytest.skip(str(exc))
    dtype = LEVEL_DTYPES[name]
    kwargs = {} if dtype is None else {"dtype": dtype}
    return module, module.DecoderOnlyTransformer(config, params, **kwargs)


def _level_inputs(name: str, tokens: np.ndarray):
    valid = np.ones(tokens.shape, dtype=bool)
    if name == "level0_loops":
        return tokens.tolist(), valid.tolist()
    if name == "level1_numpy":
        return tokens, valid
    return torch.as_tensor(tokens), torch.as_tensor(valid)


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("name", list(LEVEL_DTYPES))
def test_level_logits(checkpoints, family, name):
    config, params = hf.load(checkpoints[family])
    # Level 0 is pure Python (one row of 5 tokens); level 4 runs in Triton's interpreter.
    tokens = TOKENS[:1, :5] if name in ("level0_loops", "level4_triton_kernel") else TOKENS
    module, model = _level_model(name, config, params)
    tokens_in, valid_in = _level_inputs(name, tokens)
    logits = np.asarray(module.to_numpy(model.forward(tokens_in, valid=valid_in)), dtype=np.float64)
    expected = hf_logits(checkpoints[family], tokens)
    what = f"{name} on {family}"
    if name == "level4_triton_kernel":
        assert_close(logits, expected, atol=FLOAT32_TOL, rtol=FLOAT32_TOL, what=what)
        return
    assert_close(logits, expected, atol=STOCK_ATOL, rtol=STOCK_RTOL, what=what)
    exact = hf_logits(checkpoints[family], tokens, exact=True)
    assert_close(logits, exact, atol=EXACT_TOL, rtol=EXACT_TOL, what=what)


GENERATION_LEVELS = [
    *(
        (f, n)
        for f in FAMILY_NAMES
        for n in ("level1_numpy", "level2_torch_manual", "level3_sdpa_flash")
    ),
    # Pure Python and Triton's interpreter: three tokens from a prompt of two.
    *((f, n) for f in FAMILY_NAMES for n in ("level0_loops", "level4_triton_kernel")),
]


@pytest.mark.parametrize(("family", "name"), GENERATION_LEVELS)
def test_level_greedy_generation(checkpoints, family, name):
    config, params = hf.load(checkpoints[family])
    prefix, n = (
        ([7, 3], 3) if name in ("level0_loops", "level4_triton_kernel") else ([7, 3, 50, 21], 8)
    )
    expected = hf_generate(checkpoints[family], prefix, n)  # past Mistral's window of 4
    module, model = _level_model(name, config, params)
    for use_cache in (True, False):
        out = module.to_numpy(model.generate(np.array([prefix]), n, use_cache=use_cache))
        assert np.asarray(out).tolist() == [expected], f"use_cache={use_cache}"


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_reference_greedy_generation(checkpoints, family):
    """The numpy reference, greedy, gives transformers' tokens (the check of the test's own oracle)."""
    config, params = hf.load(checkpoints[family])
    prefix = [7, 3, 50, 21]
    got = ReferenceGenerator(config, params).generate(np.array([prefix]), 8)
    assert got == [hf_generate(checkpoints[family], prefix, 8)]


# ---------------------------------------------------------------------------
# 5. Text
# ---------------------------------------------------------------------------

SENTENCES = [
    "the cat sat on the mat",
    "the dog sat on the log",
    "a cat and a dog met on the mat",
    "the log was on the hill",
]


@pytest.fixture(scope="module")
def text_model(checkpoints, tmp_path_factory) -> Path:
    """The tiny Llama with a BPE tokenizer trained here (at most 64 tokens, its vocabulary)."""
    path = tmp_path_factory.mktemp("text") / "llama"
    shutil.copytree(checkpoints["llama"], path)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=SIZES["vocab_size"], special_tokens=["<unk>"])
    tokenizer.train_from_iterator(SENTENCES, trainer)
    assert tokenizer.get_vocab_size() <= SIZES["vocab_size"]
    tokenizer.save(str(path / "tokenizer.json"))
    return path


def _expected_text(path: Path, prompt: str, n: int) -> str:
    """transformers' greedy continuation of ``prompt``, up to ``n`` tokens or its EOS (the
    config's, id 2), as text: what ``ladder generate`` must print."""
    tokenizer = hf.load_tokenizer(path)
    ids = tokenizer.encode(prompt).ids
    new = hf_generate(path, ids, n)[len(ids) :]
    return tokenizer.decode(new[: new.index(2)] if 2 in new else new)


@pytest.mark.parametrize("name", ["level1_numpy", "level2_torch_manual"])
def test_text_streamed_by_a_level(text_model, name):
    from levels.tokenizer import StreamDecoder

    config, params = hf.load(text_model)
    _, model = _level_model(name, config, params)
    tokenizer = hf.load_tokenizer(text_model)
    ids = tokenizer.encode("the dog").ids
    decoder = StreamDecoder(tokenizer)
    pieces = [decoder.push(t) for t in model.stream(ids, 6, stop_ids=(2,)) if t != 2]
    assert "".join(pieces) + decoder.flush() == _expected_text(text_model, "the dog", 6)


def test_load_tokenizer_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        hf.load_tokenizer(tmp_path)


# ---------------------------------------------------------------------------
# ladder generate --hf
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("number", ["1", "3"])
def test_ladder_generate_hf_prints_the_prompt_and_its_greedy_continuation(
    text_model, number, capsys
):
    from ladder import cli

    argv = ["generate", "--hf", str(text_model), "--prompt", "the cat sat", "--level", number]
    assert cli.main([*argv, "--max-new-tokens", "6", "--dtype", "float64"]) == 0
    out, err = capsys.readouterr()
    assert out == "the cat sat" + _expected_text(text_model, "the cat sat", 6) + "\n"
    (line,) = err.splitlines()  # the two speeds, apart
    assert line.startswith("[prompt 3 tokens in ") and "| decode " in line and "float64" in line


def test_ladder_generate_at_level_0_says_what_the_prompt_costs_and_shows_it_advance(
    text_model, capsys, monkeypatch
):
    """The warning, the prompt's expected time, a line after each piece of it (a token a
    piece here: no seconds to wait for between them), the speeds; and level 1's tokens."""
    from ladder import cli
    from loading import slow

    monkeypatch.setattr(slow, "PIECE_S", 0.0)
    monkeypatch.setattr(slow, "PIECES_COST", float("inf"))  # a piece of one token
    argv = ["generate", "--hf", str(text_model), "--prompt", "the cat sat", "--max-new-tokens", "4"]
    assert cli.main([*argv, "--level", "0"]) == 0
    out, err = capsys.readouterr()
    assert cli.main([*argv, "--level", "1", "--dtype", "float64"]) == 0
    assert out == capsys.readouterr().out  # the same tokens
    lines = err.splitlines()
    assert lines[0].startswith("level 0 computes in pure Python: this model takes about ")
    assert re.fullmatch(
        r"the prompt \(3 tokens\) should take about \d+ s; its progress follows", lines[1]
    )
    counts = [re.fullmatch(r"the prompt: (\d) of 3 tokens in \d+ s.*", line) for line in lines[2:5]]
    assert [c[1] for c in counts] == ["1", "2", "3"] and "left" not in lines[4]
    assert lines[5].startswith("[prompt 3 tokens in ") and len(lines) == 6


HF_MISUSES = [
    (["--prompt", "x", "--input", "5 6"], "--input goes with a `ladder train` checkpoint"),
    ([], "generate needs --prompt"),
    (
        ["--prompt", "x", "--max-new-tokens", "70"],
        "leaves room for 62 tokens, not --max-new-tokens 70",
    ),
    (["--prompt", "x", "--level", "0", "--dtype", "float32"], "computes in float64"),
    (["--prompt", "x", "--context", "65"], "exceeds the model's 64 tokens"),
]


@pytest.mark.parametrize(("extra", "message"), HF_MISUSES)
def test_ladder_generate_hf_misuse_is_one_line(text_model, extra, message, capsys):
    from ladder import cli

    assert cli.main(["generate", "--hf", str(text_model), *extra]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("ladder generate: error: ") and message in line


def test_ladder_generate_hf_without_a_checkpoint_says_what_is_missing(tmp_path, capsys):
    from ladder import cli

    assert cli.main(["generate", "--hf", str(tmp_path), "--prompt", "x"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert "has no tokenizer.json" in line
