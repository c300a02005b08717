"""Hugging Face checkpoints in and out of the canonical parameters.

``load(path)`` reads a model directory as ``transformers`` writes it
(``config.json`` and ``model.safetensors``, or several shards listed in
``model.safetensors.index.json``) for ``model_type`` ``llama``, ``mistral``,
``qwen2``, ``gpt_neox`` or ``gemma3_text``, and returns a ``TransformerConfig`` with float64
canonical parameters that every level builds from. ``save(path, config,
params)`` writes the inverse, a directory that
``transformers.AutoModelForCausalLM.from_pretrained`` loads. Only ``safetensors``
(and numpy) is needed; ``transformers`` itself is never imported here.

Two layouts differ from the project's, and are converted:

* RoPE. The ladder rotates adjacent feature pairs ``(x[2i], x[2i+1])``;
  Hugging Face's ``rotate_half`` pairs feature ``i`` with feature ``i + Dh/2``,
  with the same frequency ``base^(-2i/Dh)``. Permuting the rows of the q and k
  projections (and of their biases) within each head, new row ``2i`` <- old
  row ``i`` and new row ``2i + 1`` <- old row ``i + Dh/2``, turns one rotation
  into the other; ``q . k`` is unchanged because both sides get the same
  permutation. Values are never permuted. ``save`` applies the inverse.
* GPT-NeoX fuses q, k and v into ``query_key_value`` with its rows grouped
  per head, ``(H, 3, Dh)``; the ladder's ``in_proj_weight`` is ``[q; k; v]``.

The rest is renaming (Llama's ``gate_proj``, ``up_proj``, ``down_proj`` are
``linear_gate``, ``linear1``, ``linear2``) and the options the families spell
differently: Llama's ``attention_bias`` covers q, k, v and the output
projection, its ``mlp_bias`` the three FFN linears (``bias``: RMSNorm has
none); Qwen2 has q, k, v biases only; Mistral's ``sliding_window`` and Qwen2's
``use_sliding_window`` are the ladder's ``window`` (a query sees its W most
recent keys, itself included, as in Hugging Face's masks). Embeddings are not
scaled (``scale_embeddings=False``). A key missing from ``config.json`` takes
the family's default in ``transformers`` (GPT-NeoX's ``use_parallel_residual``
is True and its ``rotary_pct`` 0.25 when absent, Mistral's ``sliding_window``
4096, Qwen2's ``num_key_value_heads`` 32).

Gemma 3 (``gemma3_text``, ``Gemma3ForCausalLM``) is the same layout with more
options: ``head_dim`` (heads wider than ``D / H``), ``q_norm`` and ``k_norm``
(QK-norm; their gains are permuted like the q and k rows they scale), a norm
after each sublayer (its ``post_attention_layernorm`` is the ladder's
``post_norm1``, ``pre_feedforward_layernorm`` its ``norm2``), GeGLU with the
tanh GELU, RMSNorm gains stored as offsets from 1 (``norm_weight_offset=1``),
embeddings scaled by ``sqrt(D)``, ``layer_types`` (every ``window_pattern``-th
layer global, the others local with ``sliding_window``) with the RoPE base of
each kind (``rope_parameters``, or ``rope_theta`` and ``rope_local_base_freq``),
and ``query_pre_attn_scalar`` (the scores' scale, ``1 / sqrt`` of it).

What the ladder does not compute is refused with a ``ValueError`` naming the
key and its value, never loaded as a different model: RoPE scaling of any type
but ``"default"`` (``rope_scaling`` / ``rope_parameters``), partial rotary,
GPT-NeoX's parallel residual, an activation other than SiLU (Llama family) or
exact GELU (GPT-NeoX), a ``head_dim`` other than ``hidden_size //
num_attention_heads``, a window on some layers only (Qwen2's
``max_window_layers`` / ``layer_types``), Gemma's logit soft-capping, its
bidirectional attention, or ``layer_types`` with no period, quantized weights,
any other ``model_type`` (Gemma 3's multimodal ``gemma3``, whose text model is
``gemma3_text``). Dropout rates are training settings and are not carried over
(the config's ``dropout`` is 0).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .common.config import TransformerConfig
from .common.params import check_params, param_shapes

FAMILIES = ("llama", "mistral", "qwen2", "gpt_neox", "gemma3_text")
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}

# What each family's config class in transformers assumes for a key config.json omits.
_DEFAULTS: dict[str, dict[str, object]] = {
    "llama": {
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "num_key_value_heads": None,
        "attention_bias": False,
        "mlp_bias": False,
    },
    "mistral": {
        "hidden_act": "silu",
        "max_position_embeddings": 4096 * 32,
        "rms_norm_eps": 1e-6,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "num_key_value_heads": 8,
        "sliding_window": 4096,
    },
    "qwen2": {
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "bos_token_id": None,
        "eos_token_id": None,
        "num_key_value_heads": 32,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "layer_types": None,
    },
    "gpt_neox": {
        "hidden_act": "gelu",
        "max_position_embeddings": 2048,
        "layer_norm_eps": 1e-5,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "attention_bias": True,
        "use_parallel_residual": True,
        "rotary_pct": 0.25,
        "rotary_emb_base": 10000.0,
    },
    "gemma3_text": {  # Gemma3TextConfig's
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "layer_types": None,
        "sliding_window_pattern": 6,  # read when layer_types is absent
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "use_bidirectional_attention": False,
    },
}
_COMMON_DEFAULTS = {"tie_word_embeddings": False, "pad_token_id": None, "head_dim": None}
_DEFAULT_NOTE = " (the default when config.json omits it)"

# Buffers older checkpoints carry that are not parameters (transformers skips them too).
_IGNORED_TENSORS = re.compile(r"(rotary_emb\.inv_freq|attention\.bias|attention\.masked_bias)$")


# ---------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------


def to_adjacent_pairs(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows of ``w (heads*Dh, ...)`` from rotate_half order to adjacent pairs, per head."""
    rest = w.shape[1:]
    d_head = w.shape[0] // heads
    halves = w.reshape(heads, 2, d_head // 2, *rest)  # (Hx, half, i, ...): old row half*Dh/2 + i
    pairs = np.swapaxes(halves, 1, 2)  # (Hx, i, half, ...): new row 2i + half
    return pairs.reshape(heads * d_head, *rest)  # (Hx*Dh, ...)


def to_rotate_half(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of ``to_adjacent_pairs``."""
    rest = w.shape[1:]
    d_head = w.shape[0] // heads
    pairs = w.reshape(heads, d_head // 2, 2, *rest)  # (Hx, i, half, ...)
    halves = np.swapaxes(pairs, 1, 2)  # (Hx, half, i, ...)
    return halves.reshape(heads * d_head, *rest)  # (Hx*Dh, ...)


def _qkv_rows(config: TransformerConfig) -> tuple[slice, slice, slice]:
    """Where q, k and v sit in ``in_proj_weight``'s rows ``[q (H Dh); k (Hkv Dh); v (Hkv Dh)]``."""
    Dq, Dkv = config.q_width, config.kv_heads * config.d_head
    return slice(0, Dq), slice(Dq, Dq + Dkv), slice(Dq + Dkv, Dq + 2 * Dkv)


def _block_norms(config: TransformerConfig) -> dict[str, str]:
    """A block's norms, canonical name -> Hugging Face's. Llama's ``post_attention_layernorm``
    is the norm before the MLP (``norm2``); Gemma's, with a norm after each sublayer, is
    the one after the attention (``post_norm1``), and ``pre_feedforward_layernorm`` ``norm2``."""
    if not config.post_norms:
        return {"norm1": "input_layernorm", "norm2": "post_attention_layernorm"}
    return {
        "norm1": "input_layernorm",
        "post_norm1": "post_attention_layernorm",
        "norm2": "pre_feedforward_layernorm",
        "post_norm2": "post_feedforward_layernorm",
    }


def _from_llama(config: TransformerConfig, take) -> dict[str, np.ndarray]:
    """Canonical parameters from Llama / Mistral / Qwen2 / Gemma 3 tensors (``take(name)``
    hands one over)."""
    H, Hkv = config.n_heads, config.kv_heads
    params = {"token_embedding.weight": take("model.embed_tokens.weight")}  # (V, D)
    for i in range(config.n_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        for canonical, theirs in _block_norms(config).items():
            params[f"{ours}{canonical}.weight"] = take(f"{hf}{theirs}.weight")
        attn = hf + "self_attn."
        suffixes = ("weight", "bias") if config.has_qkv_bias else ("weight",)
        for suffix in suffixes:
            q = to_adjacent_pairs(take(f"{attn}q_proj.{suffix}"), H)  # (H*Dh, D) or (H*Dh,)
            k = to_adjacent_pairs(take(f"{attn}k_proj.{suffix}"), Hkv)  # (Hkv*Dh, ...)
            v = take(f"{attn}v_proj.{suffix}")  # (Hkv*Dh, ...)
            fused = np.concatenate([q, k, v])  # (H Dh + 2 Dkv, D) or (H Dh + 2 Dkv,)
            params[f"{ours}self_attn.in_proj_{suffix}"] = fused
        if config.qk_norm:  # the gains of one head's features, in the order of its rows
            for name in ("q_norm", "k_norm"):
                gain = take(f"{attn}{name}.weight")  # (Dh,)
                params[f"{ours}self_attn.{name}.weight"] = to_adjacent_pairs(gain, 1)
        params[ours + "self_attn.out_proj.weight"] = take(attn + "o_proj.weight")
        if config.has_out_bias:
            params[ours + "self_attn.out_proj.bias"] = take(attn + "o_proj.bias")
        for canonical, theirs in (
            ("linear_gate", "gate_proj"),
            ("linear1", "up_proj"),
            ("linear2", "down_proj"),
        ):
            params[f"{ours}{canonical}.weight"] = take(f"{hf}mlp.{theirs}.weight")
            if config.bias:
                params[f"{ours}{canonical}.bias"] = take(f"{hf}mlp.{theirs}.bias")
    params["norm.weight"] = take("model.norm.weight")
    if not config.tie_embeddings:
        params["output_projection.weight"] = take("lm_head.weight")  # (V, D)
    return params


def _to_llama(config: TransformerConfig, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Llama / Mistral / Qwen2 tensors from canonical parameters (the inverse of ``_from_llama``)."""
    H, Hkv = config.n_heads, config.kv_heads
    q_rows, k_rows, v_rows = _qkv_rows(config)
    out = {"model.embed_tokens.weight": params["token_embedding.weight"]}
    for i in range(config.n_layers):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        for canonical, theirs in _block_norms(config).items():
            out[f"{hf}{theirs}.weight"] = params[f"{ours}{canonical}.weight"]
        attn = hf + "self_attn."
        suffixes = ("weight", "bias") if config.has_qkv_bias else ("weight",)
        for suffix in suffixes:
            fused = params[f"{ours}self_attn.in_proj_{suffix}"]  # (D + 2 Dkv, ...)
            out[f"{attn}q_proj.{suffix}"] = to_rotate_half(fused[q_rows], H)  # (H*Dh, ...)
            out[f"{attn}k_proj.{suffix}"] = to_rotate_half(fused[k_rows], Hkv)  # (Hkv*Dh, ...)
            out[f"{attn}v_proj.{suffix}"] = fused[v_rows]  # (Hkv*Dh, ...)
        if config.qk_norm:
            for name in ("q_norm", "k_norm"):
                out[f"{attn}{name}.weight"] = to_rotate_half(
                    params[f"{ours}self_attn.{name}.weight"], 1
                )
        out[attn + "o_proj.weight"] = params[ours + "self_attn.out_proj.weight"]
        if config.has_out_bias:
            out[attn + "o_proj.bias"] = params[ours + "self_attn.out_proj.bias"]
        for canonical, theirs in (
            ("linear_gate", "gate_proj"),
            ("linear1", "up_proj"),
            ("linear2", "down_proj"),
        ):
            out[f"{hf}mlp.{theirs}.weight"] = params[f"{ours}{canonical}.weight"]
            if config.bias:
                out[f"{hf}mlp.{theirs}.bias"] = params[f"{ours}{canonical}.bias"]
    out["model.norm.weight"] = params["norm.weight"]
    if not config.tie_embeddings:
        out["lm_head.weight"] = params["output_projection.weight"]
    return out


def _from_neox(config: TransformerConfig, take, head_name: str) -> dict[str, np.ndarray]:
    """Canonical parameters from GPT-NeoX tensors; ``head_name`` is ``embed_out`` or ``lm_head``."""
    H, D, Dh = config.n_heads, config.d_model, config.d_head
    params = {"token_embedding.weight": take("gpt_neox.embed_in.weight")}  # (V, D)
    for i in range(config.n_layers):
        hf, ours = f"gpt_neox.layers.{i}.", f"layers.{i}."
        for canonical, theirs in (
            ("norm1", "input_layernorm"),
            ("norm2", "post_attention_layernorm"),
        ):
            params[f"{ours}{canonical}.weight"] = take(f"{hf}{theirs}.weight")
            params[f"{ours}{canonical}.bias"] = take(f"{hf}{theirs}.bias")
        suffixes = ("weight", "bias") if config.has_qkv_bias else ("weight",)
        for suffix in suffixes:
            fused = take(f"{hf}attention.query_key_value.{suffix}")  # (3D, D) or (3D,)
            rest = fused.shape[1:]
            per_head = fused.reshape(H, 3, Dh, *rest)  # rows grouped (H, [q, k, v], Dh)
            q, k, v = (per_head[:, j].reshape(D, *rest) for j in range(3))  # (H*Dh, ...) each
            q, k = to_adjacent_pairs(q, H), to_adjacent_pairs(k, H)
            params[f"{ours}self_attn.in_proj_{suffix}"] = np.concatenate([q, k, v])  # (3D, ...)
        params[ours + "self_attn.out_proj.weight"] = take(hf + "attention.dense.weight")
        if config.has_out_bias:
            params[ours + "self_attn.out_proj.bias"] = take(hf + "attention.dense.bias")
        for canonical, theirs in (("linear1", "dense_h_to_4h"), ("linear2", "dense_4h_to_h")):
            params[f"{ours}{canonical}.weight"] = take(f"{hf}mlp.{theirs}.weight")
            params[f"{ours}{canonical}.bias"] = take(f"{hf}mlp.{theirs}.bias")
    params["norm.weight"] = take("gpt_neox.final_layer_norm.weight")
    params["norm.bias"] = take("gpt_neox.final_layer_norm.bias")
    if not config.tie_embeddings:
        params["output_projection.weight"] = take(f"{head_name}.weight")  # (V, D)
    return params


def _to_neox(config: TransformerConfig, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """GPT-NeoX tensors from canonical parameters (the inverse of ``_from_neox``)."""
    H, D, Dh = config.n_heads, config.d_model, config.d_head
    q_rows, k_rows, v_rows = _qkv_rows(config)
    out = {"gpt_neox.embed_in.weight": params["token_embedding.weight"]}
    for i in range(config.n_layers):
        hf, ours = f"gpt_neox.layers.{i}.", f"layers.{i}."
        for canonical, theirs in (
            ("norm1", "input_layernorm"),
            ("norm2", "post_attention_layernorm"),
        ):
            out[f"{hf}{theirs}.weight"] = params[f"{ours}{canonical}.weight"]
            out[f"{hf}{theirs}.bias"] = params[f"{ours}{canonical}.bias"]
        suffixes = ("weight", "bias") if config.has_qkv_bias else ("weight",)
        for suffix in suffixes:
            fused = params[f"{ours}self_attn.in_proj_{suffix}"]  # (3D, ...)
            rest = fused.shape[1:]
            q = to_rotate_half(fused[q_rows], H).reshape(H, Dh, *rest)  # (H, Dh, ...)
            k = to_rotate_half(fused[k_rows], H).reshape(H, Dh, *rest)  # (H, Dh, ...)
            v = fused[v_rows].reshape(H, Dh, *rest)  # (H, Dh, ...)
            per_head = np.stack([q, k, v], axis=1)  # (H, 3, Dh, ...)
            out[f"{hf}attention.query_key_value.{suffix}"] = per_head.reshape(3 * D, *rest)
        out[hf + "attention.dense.weight"] = params[ours + "self_attn.out_proj.weight"]
        if config.has_out_bias:
            out[hf + "attention.dense.bias"] = params[ours + "self_attn.out_proj.bias"]
        for canonical, theirs in (("linear1", "dense_h_to_4h"), ("linear2", "dense_4h_to_h")):
            out[f"{hf}mlp.{theirs}.weight"] = params[f"{ours}{canonical}.weight"]
            out[f"{hf}mlp.{theirs}.bias"] = params[f"{ours}{canonical}.bias"]
    out["gpt_neox.final_layer_norm.weight"] = params["norm.weight"]
    out["gpt_neox.final_layer_norm.bias"] = params["norm.bias"]
    if not config.tie_embeddings:
        out["embed_out.weight"] = params["output_projection.weight"]  # the name on the Hub
    return out


# ---------------------------------------------------------------------------
# config.json -> TransformerConfig
# ---------------------------------------------------------------------------


class _Keys:
    """``config.json`` read the way the family's config class reads it (its defaults)."""

    def __init__(self, raw: dict, family: str):
        self.raw, self.family = raw, family
        self.defaults = {**_COMMON_DEFAULTS, **_DEFAULTS[family]}

    def __getitem__(self, key: str):
        if key in self.raw:
            return self.raw[key]
        if key in self.defaults:
            return self.defaults[key]
        raise ValueError(f"{self.family} config.json has no {key!r}")

    def refuse(self, key: str, why: str):
        value = self[key]
        given = "" if key in self.raw else _DEFAULT_NOTE
        raise ValueError(f"{self.family} config {key}={value!r}{given}: {why}")


def _rope_base(keys: _Keys) -> float:
    """``rope_theta``, after refusing scaled and partial RoPE.

    transformers 5 keeps RoPE settings in ``rope_parameters``; older files have
    ``rope_scaling`` (which takes precedence when not null), top-level
    ``rope_theta`` and, for GPT-NeoX, ``rotary_emb_base`` / ``rotary_pct``.
    """
    source = "rope_scaling" if keys.raw.get("rope_scaling") else "rope_parameters"
    rope = keys.raw.get(source) or {}
    if not isinstance(rope, dict):
        keys.refuse(source, "expected a dict of RoPE settings")
    if any(isinstance(value, dict) for value in rope.values()):
        keys.refuse(source, "RoPE settings per layer type are not supported")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(
            f"{keys.family} config {source}={rope!r}: RoPE type {rope_type!r} rescales the "
            f"positions; the ladder implements plain RoPE (type 'default') only"
        )
    if keys.family == "gpt_neox":
        theta = rope.get("rope_theta", keys.raw.get("rope_theta", keys["rotary_emb_base"]))
        fraction_key = "partial_rotary_factor" if "partial_rotary_factor" in rope else "rotary_pct"
        fraction = rope.get("partial_rotary_factor", keys["rotary_pct"])
    else:
        theta = rope.get("rope_theta", keys.raw.get("rope_theta", 10000.0))
        fraction_key = "partial_rotary_factor"
        fraction = rope.get("partial_rotary_factor", keys.raw.get("partial_rotary_factor", 1.0))
    if fraction != 1.0:
        given = "" if fraction_key in rope or fraction_key in keys.raw else _DEFAULT_NOTE
        raise ValueError(
            f"{keys.family} config {fraction_key}={fraction!r}{given}: the ladder rotates every "
            f"feature of a head (partial rotary is not implemented)"
        )
    return float(theta)


def _token_id(keys: _Keys, key: str, vocab_size: int) -> int | None:
    """A special token's id (the first of a list), None when unset; refused outside [0, V)."""
    value = keys[key]
    if isinstance(value, list):
        value = value[0] if value else None
    if value is not None and not (isinstance(value, int) and 0 <= value < vocab_size):
        keys.refuse(key, f"a token id must lie in [0, vocab_size={vocab_size})")
    return value


def _window(keys: _Keys, n_layers: int) -> int | None:
    """The sliding window of every layer, or a refusal when only some layers have one."""
    if keys.family == "mistral":
        window = keys["sliding_window"]
        types = keys.raw.get("layer_types")
        if types is not None and len(set(types)) > 1:
            keys.refuse("layer_types", "Mistral applies one attention to every layer")
        return window
    if keys.family != "qwen2" or not keys["use_sliding_window"] or keys["sliding_window"] is None:
        return None  # Qwen2 ignores sliding_window unless use_sliding_window is true
    if keys["layer_types"] is not None:  # written by transformers 5; takes precedence
        key, sliding = "layer_types", [t == "sliding_attention" for t in keys["layer_types"]]
    else:
        key = "max_window_layers"
        sliding = [i >= keys["max_window_layers"] for i in range(n_layers)]
    if all(sliding):
        return keys["sliding_window"]
    if not any(sliding):
        return None
    keys.refuse(
        key,
        f"with use_sliding_window=true only layers {[i for i, s in enumerate(sliding) if s]} "
        f"of {n_layers} have a window; the ladder's window applies to every layer or none",
    )


def _gemma_rope(keys: _Keys) -> tuple[float, float]:
    """Gemma 3's RoPE bases ``(global, local)``: transformers 5's ``rope_parameters`` per
    layer type, or ``rope_theta`` and ``rope_local_base_freq``; plain RoPE only."""
    nested = keys.raw.get("rope_parameters") or {}
    if keys.raw.get("rope_scaling"):  # transformers 4: scaling of the global layers
        nested = {"full_attention": keys.raw["rope_scaling"]}
    bases = {}
    for kind, flat in (("full_attention", "rope_theta"), ("sliding_attention", "rope_local_base_freq")):  # fmt: skip
        rope = nested.get(kind) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            key = "rope_scaling" if keys.raw.get("rope_scaling") else "rope_parameters"
            keys.refuse(key, f"RoPE type {rope_type!r} of the {kind} layers rescales the "
                        "positions; the ladder implements plain RoPE (type 'default') only")  # fmt: skip
        bases[kind] = float(rope.get("rope_theta", keys[flat]))
    return bases["full_attention"], bases["sliding_attention"]


def _gemma_windows(keys: _Keys, n_layers: int) -> tuple[int | None, int | None]:
    """``(window, window_pattern)`` from ``layer_types`` (or ``sliding_window_pattern``): the
    global layers must come every ``p``-th layer, ``(i + 1) % p == 0``, as Gemma's do."""
    types = keys["layer_types"]
    if types is None:
        pattern = keys.raw.get("_sliding_window_pattern", keys["sliding_window_pattern"])
        types = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(n_layers)
        ]
    if len(types) != n_layers or set(types) - {"full_attention", "sliding_attention"}:
        keys.refuse("layer_types", f"expected {n_layers} of 'full_attention', 'sliding_attention'")
    global_layers = [i for i, t in enumerate(types) if t == "full_attention"]
    if len(global_layers) == n_layers or keys["sliding_window"] is None:
        return None, None  # no layer has a window
    if not global_layers:
        return keys["sliding_window"], None
    pattern = global_layers[0] + 1
    if pattern < 2 or global_layers != list(range(pattern - 1, n_layers, pattern)):
        keys.refuse(
            "layer_types",
            f"global layers {global_layers}: the ladder's global layers come every "
            "window_pattern-th layer (layers p - 1, 2p - 1, ...)",
        )
    return keys["sliding_window"], pattern


def _gemma(keys: _Keys, D: int, H: int) -> tuple[dict, float]:
    """The architecture options of a ``gemma3_text`` config, and its global RoPE base."""
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if keys[key] is not None:
            keys.refuse(key, "the ladder does not soft-cap logits (Gemma 3 does not either)")
    if keys["use_bidirectional_attention"]:
        keys.refuse("use_bidirectional_attention", "the ladder's decoder-only model is causal")
    if keys["hidden_activation"] != "gelu_pytorch_tanh":
        keys.refuse("hidden_activation", "the ladder's GeGLU gates with 'gelu_pytorch_tanh'")
    Dh, n_layers = keys["head_dim"], keys["num_hidden_layers"]
    window, pattern = _gemma_windows(keys, n_layers)
    rope_base, local_base = _gemma_rope(keys)
    scalar = keys["query_pre_attn_scalar"]
    attention_bias = bool(keys["attention_bias"])
    arch = dict(
        norm="rmsnorm",
        ffn="geglu",
        bias=False,
        qkv_bias=attention_bias,
        out_bias=attention_bias,
        n_kv_heads=keys["num_key_value_heads"],
        head_dim=None if Dh * H == D else Dh,
        attn_scale=None if scalar == Dh else float(scalar) ** -0.5,  # transformers' scaling
        qk_norm=True,
        post_norms=True,
        norm_weight_offset=1.0,  # Gemma3RMSNorm: x_hat * (1 + weight)
        scale_embeddings=True,  # Gemma3TextScaledWordEmbedding: times hidden_size ** 0.5
        window=window,
        window_pattern=pattern,
        rope_local_base=None if window is None or local_base == rope_base else local_base,
    )
    return arch, rope_base


def config_from_hf(raw: dict, *, max_seq_len: int | None = None) -> TransformerConfig:
    """The ``TransformerConfig`` of a parsed ``config.json``; ``ValueError`` for what the ladder lacks."""
    family = raw.get("model_type")
    if family == "gemma3":
        raise ValueError(
            "config.json model_type='gemma3' is Gemma 3's multimodal model (a vision tower "
            "beside the text model); the ladder reads the text model, model_type 'gemma3_text'"
        )
    if family not in FAMILIES:
        raise ValueError(
            f"config.json model_type={family!r} is not supported; supported: {', '.join(FAMILIES)}"
        )
    keys = _Keys(raw, family)
    if raw.get("quantization_config") is not None:
        keys.refuse("quantization_config", "quantized weights are not supported")
    D, H = keys["hidden_size"], keys["num_attention_heads"]
    if family != "gemma3_text" and keys["head_dim"] is not None and keys["head_dim"] * H != D:
        keys.refuse(
            "head_dim", f"the ladder's heads are hidden_size // num_attention_heads = {D // H} wide"
        )
    if family == "gemma3_text":
        arch, rope_base = _gemma(keys, D, H)
        eps = keys["rms_norm_eps"]
    elif family == "gpt_neox":
        rope_base = _rope_base(keys)
        if keys["use_parallel_residual"]:
            keys.refuse(
                "use_parallel_residual",
                "the ladder's blocks are sequential (x + attn(norm1(x)), then + ffn(norm2(x)))",
            )
        if keys["hidden_act"] != "gelu":
            keys.refuse("hidden_act", "the ladder's GELU is the exact (erf) 'gelu'")
        attention_bias = bool(keys["attention_bias"])
        arch = dict(norm="layernorm", ffn="gelu", bias=True, n_kv_heads=None, window=None)
        arch |= dict(qkv_bias=attention_bias, out_bias=attention_bias)
        eps = keys["layer_norm_eps"]
    else:
        rope_base = _rope_base(keys)
        if keys["hidden_act"] not in ("silu", "swish"):
            keys.refuse("hidden_act", "the ladder's SwiGLU gates with SiLU ('silu')")
        n_kv = keys["num_key_value_heads"]
        arch = dict(norm="rmsnorm", ffn="swiglu", n_kv_heads=H if n_kv is None else n_kv)
        if family == "llama":
            attention_bias = bool(keys["attention_bias"])
            arch |= dict(
                bias=bool(keys["mlp_bias"]), qkv_bias=attention_bias, out_bias=attention_bias
            )
        elif family == "qwen2":
            arch |= dict(bias=False, qkv_bias=True, out_bias=False)
        else:
            arch |= dict(bias=False, qkv_bias=False, out_bias=False)
        arch["window"] = _window(keys, keys["num_hidden_layers"])
        eps = keys["rms_norm_eps"]
    V = keys["vocab_size"]
    bos, eos, pad = (
        _token_id(keys, k, V) for k in ("bos_token_id", "eos_token_id", "pad_token_id")
    )
    # The config's own defaults where they say the same: None follows n_heads / bias.
    if arch["n_kv_heads"] == H:
        arch["n_kv_heads"] = None
    for name in ("qkv_bias", "out_bias"):
        if arch[name] == arch["bias"]:
            arch[name] = None
    limit = keys["max_position_embeddings"]
    if max_seq_len is not None:
        if max_seq_len > limit:
            raise ValueError(
                f"max_seq_len={max_seq_len} exceeds the checkpoint's max_position_embeddings={limit}"
            )
        limit = max_seq_len
    return TransformerConfig(
        vocab_size=V,
        d_model=D,
        n_heads=H,
        d_ff=keys["intermediate_size"],
        n_layers=keys["num_hidden_layers"],
        positional="rope",
        rope_base=rope_base,
        norm_eps=float(eps),
        pad_id=pad if pad is not None else eos if eos is not None else 0,
        bos_id=bos if bos is not None else 0,
        eos_id=eos if eos is not None else 0,
        max_seq_len=limit,
        tie_embeddings=bool(keys["tie_word_embeddings"]),
        **({"scale_embeddings": False} | arch),  # only Gemma scales its embeddings
    )


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


def _read_tensors(path: Path, dtype: np.dtype) -> dict[str, np.ndarray]:
    """Every tensor of ``model.safetensors`` (or of the shards its index lists), as ``dtype``."""
    from safetensors import safe_open

    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.exists():
        files = [single]
    elif index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [path / name for name in sorted(set(weight_map.values()))]
    else:
        raise FileNotFoundError(
            f"{path} has neither model.safetensors nor model.safetensors.index.json"
        )
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        bf16 = []
        with safe_open(str(file), framework="np") as f:
            for name in f.keys():
                if f.get_slice(name).get_dtype() == "BF16":  # numpy has no bfloat16
                    bf16.append(name)
                else:
                    tensors[name] = f.get_tensor(name).astype(dtype)
        if bf16:
            with safe_open(str(file), framework="pt") as f:  # needs torch
                for name in bf16:
                    # bfloat16 -> float32 is exact (the same exponent, a shorter mantissa)
                    tensors[name] = f.get_tensor(name).float().numpy().astype(dtype)
    return tensors


def _read_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.exists():
        raise FileNotFoundError(f"{path} has no config.json")
    return json.loads(config_file.read_text())


def load_config(path, *, max_seq_len: int | None = None) -> TransformerConfig:
    """The ``TransformerConfig`` of the model directory ``path``, without reading its weights."""
    return config_from_hf(_read_config(Path(path)), max_seq_len=max_seq_len)


def load(
    path, *, max_seq_len: int | None = None, dtype=np.float64
) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """``(config, params)`` of the Hugging Face model directory ``path``, params in ``dtype``.

    float64 (the default) holds every float32, float16 and bfloat16 weight
    exactly; ``dtype=np.float32`` halves the memory of a large model, and
    is exact too for the float32 and half-precision checkpoints the Hub holds.

    ``max_seq_len`` (the longest sequence, and the KV cache's capacity) is the
    checkpoint's ``max_position_embeddings``, or the smaller value given here.
    ``pad_id`` is ``pad_token_id``, else the first ``eos_token_id``, else 0;
    ``bos_id`` and ``eos_id`` fall back to 0. (The models never infer padding
    from ``pad_id``: a padded batch passes ``valid``.)
    """
    path = Path(path)
    raw = _read_config(path)
    config = config_from_hf(raw, max_seq_len=max_seq_len)
    return config, params_from_hf(config, raw, _read_tensors(path, np.dtype(dtype)), where=path)


def params_from_hf(
    config: TransformerConfig, raw: dict, tensors: dict[str, np.ndarray], *, where: object
) -> dict[str, np.ndarray]:
    """The canonical parameters of a model ``config`` (read from ``raw``, its ``config.json``)
    from its tensors under their Hugging Face names; ``ValueError`` naming ``where`` for a
    missing tensor or one the ladder has no place for. (``levels.gguf`` hands GGUF files'
    tensors over under these names too.)"""
    tensors = {k: v for k, v in tensors.items() if not _IGNORED_TENSORS.search(k)}
    remaining = dict(tensors)

    def take(name: str) -> np.ndarray:
        if name not in remaining:
            raise ValueError(f"{where}: the checkpoint has no tensor {name!r}")
        return remaining.pop(name)

    if config.tie_embeddings:  # transformers ties these too, whatever the file holds
        for name in ("lm_head.weight", "embed_out.weight"):
            remaining.pop(name, None)
    if raw["model_type"] == "gpt_neox":
        head = "lm_head" if "lm_head.weight" in tensors else "embed_out"
        params = _from_neox(config, take, head)
    else:
        params = _from_llama(config, take)
    if remaining:
        raise ValueError(
            f"{where}: tensors the ladder has no place for: {', '.join(sorted(remaining))}"
        )
    params = {name: np.ascontiguousarray(value) for name, value in params.items()}
    check_params(params, param_shapes(config, "decoder_only"), what=f"parameters from {where}")
    return params


# The options only Gemma 3 has among the families, and what a Gemma 3 model sets them to
# (the others' values in Gemma3TextConfig's terms: head_dim, query_pre_attn_scalar, ...).
_GEMMA_ONLY = (
    "ffn", "qk_norm", "post_norms", "norm_weight_offset", "head_dim", "attn_scale",
    "window_pattern", "rope_local_base",
)  # fmt: skip
_GEMMA = dict(
    norm="rmsnorm", ffn="geglu", qk_norm=True, post_norms=True, norm_weight_offset=1.0,
    scale_embeddings=True, bias=False,
)  # fmt: skip


def _query_pre_attn_scalar(config: TransformerConfig) -> int:
    """Gemma's ``query_pre_attn_scalar`` (an integer): the scores are scaled by its
    ``-1/2``-th power, which must give back ``attn_scale`` (None: ``Dh``)."""
    if config.attn_scale is None:
        return config.d_head
    scalar = round(config.attn_scale**-2)
    if scalar < 1 or float(scalar) ** -0.5 != config.attn_scale:
        raise ValueError(
            f"attn_scale={config.attn_scale}: Gemma 3 scales by query_pre_attn_scalar ** -0.5 "
            "for an integer query_pre_attn_scalar, and no integer gives this scale"
        )
    return scalar


def _gemma_family(config: TransformerConfig) -> bool:
    """Whether ``config`` is a Gemma 3 model: it sets one of the options only Gemma has,
    and then every one of Gemma's (``ValueError`` naming the first that differs)."""
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerConfig)}
    given = [n for n in _GEMMA_ONLY if getattr(config, n) != defaults[n] and n != "ffn"]
    if config.ffn == "geglu":
        given.insert(0, "ffn")
    if not given:
        return False
    why = f"{given[0]}={getattr(config, given[0])!r} is Gemma 3's (the only family with it)"
    for name, value in _GEMMA.items():
        if getattr(config, name) != value:
            raise ValueError(
                f"{why}, whose models have {name}={value!r}, not {getattr(config, name)!r}"
            )
    if config.has_qkv_bias != config.has_out_bias:
        raise ValueError(
            f"qkv_bias={config.has_qkv_bias} with out_bias={config.has_out_bias}: "
            "Gemma 3's attention_bias covers both"
        )
    _query_pre_attn_scalar(config)
    return True


def _family(config: TransformerConfig) -> str:
    """The Hugging Face family that computes exactly ``config``'s model, or a ``ValueError``."""
    if config.positional != "rope":
        raise ValueError(f"positional={config.positional!r}: every supported family uses RoPE")
    if _gemma_family(config):
        return "gemma3_text"
    if config.scale_embeddings:
        raise ValueError(
            "scale_embeddings=True: no supported family scales its embeddings by sqrt(D)"
        )
    if config.norm == "layernorm" and config.ffn == "gelu":
        if not config.bias:
            raise ValueError("bias=False: GPT-NeoX's LayerNorms and MLP always have biases")
        if config.kv_heads != config.n_heads:
            raise ValueError(
                f"n_kv_heads={config.n_kv_heads}: GPT-NeoX has no grouped-query attention"
            )
        if config.window is not None:
            raise ValueError(f"window={config.window}: GPT-NeoX has no sliding window")
        if config.has_qkv_bias != config.has_out_bias:
            raise ValueError(
                f"qkv_bias={config.has_qkv_bias} with out_bias={config.has_out_bias}: "
                "GPT-NeoX's attention_bias covers both"
            )
        return "gpt_neox"
    if config.norm == "rmsnorm" and config.ffn == "swiglu":
        biases = (config.has_qkv_bias, config.has_out_bias, config.bias)
        if biases == (True, False, False):
            return "qwen2"
        if config.window is None and config.has_qkv_bias == config.has_out_bias:
            return "llama"
        if config.window is not None and biases == (False, False, False):
            return "mistral"
        raise ValueError(
            f"qkv_bias={config.has_qkv_bias}, out_bias={config.has_out_bias}, bias={config.bias} "
            f"with window={config.window}: no family has these biases (Llama: attention_bias "
            "and mlp_bias, no window; Mistral: a window, no biases; Qwen2: q/k/v biases only)"
        )
    raise ValueError(
        f"norm={config.norm!r} with ffn={config.ffn!r}: no supported family "
        "(GPT-NeoX is layernorm + gelu; Llama, Mistral and Qwen2 are rmsnorm + swiglu)"
    )


def _gemma_config(config: TransformerConfig, rope: dict) -> dict:
    """The keys of a ``gemma3_text`` config.json beyond every family's."""
    kinds = [
        "sliding_attention" if w is not None else "full_attention" for w in config.layer_windows
    ]
    window = (
        config.window if config.window is not None else _DEFAULTS["gemma3_text"]["sliding_window"]
    )
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": config.norm_eps,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.d_head,
        "attention_bias": config.has_qkv_bias,
        "query_pre_attn_scalar": _query_pre_attn_scalar(config),
        "sliding_window": window,  # unused when every layer is global
        "layer_types": kinds,
        "rope_parameters": {
            "full_attention": rope,
            "sliding_attention": rope | {"rope_theta": config.rope_base_of(config.window)},
        },
        "rope_local_base_freq": config.rope_base_of(config.window),  # transformers 4's key
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "use_bidirectional_attention": False,
    }


def config_to_hf(config: TransformerConfig) -> dict:
    """The ``config.json`` of ``config``'s model (its family chosen by ``_family``)."""
    family = _family(config)
    raw = {
        "architectures": [ARCHITECTURES[family]],
        "model_type": family,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "max_position_embeddings": config.max_seq_len,
        "hidden_act": {"gpt_neox": "gelu", "gemma3_text": "gelu_pytorch_tanh"}.get(family, "silu"),
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": config.bos_id,
        "eos_token_id": config.eos_id,
        # None when it is the EOS token (load's fallback): transformers makes pad_token_id
        # the embedding's padding_idx, whose row training would then never update.
        "pad_token_id": None if config.pad_id == config.eos_id else config.pad_id,
        "attention_dropout": 0.0,
        "dtype": "float32",
        "torch_dtype": "float32",  # the key before transformers 5
        "rope_theta": config.rope_base,  # read by transformers 4, folded in by 5
    }
    rope = {"rope_type": "default", "rope_theta": config.rope_base}
    if family == "gemma3_text":
        return raw | _gemma_config(config, rope)
    if family == "gpt_neox":
        raw |= {
            "layer_norm_eps": config.norm_eps,
            "attention_bias": config.has_qkv_bias,
            "use_parallel_residual": False,
            "rotary_pct": 1.0,
            "rotary_emb_base": config.rope_base,
            "hidden_dropout": 0.0,
            "rope_parameters": rope | {"partial_rotary_factor": 1.0},
        }
        return raw
    raw |= {
        "rms_norm_eps": config.norm_eps,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.d_head,
        "rope_parameters": rope,
    }
    if family == "llama":
        raw |= {"attention_bias": config.has_qkv_bias, "mlp_bias": config.bias}
    elif family == "mistral":
        raw["sliding_window"] = config.window
    else:
        sliding = config.window is not None
        raw |= {
            "use_sliding_window": sliding,
            "sliding_window": config.window,
            "max_window_layers": 0 if sliding else config.n_layers,
            "layer_types": [("sliding_attention" if sliding else "full_attention")]
            * config.n_layers,
        }
    return raw


def save(path, config: TransformerConfig, params: Mapping[str, object]) -> None:
    """Write ``config`` and ``params`` as a Hugging Face model directory (float32 safetensors).

    The family follows from the config: GPT-NeoX for LayerNorm + GELU with
    biases; Llama for RMSNorm + SwiGLU without a window (``attention_bias`` for
    matching q/k/v and output biases, ``mlp_bias`` for ``bias``); Mistral for
    RMSNorm + SwiGLU with a window and no biases; Qwen2 for q/k/v biases only.
    Anything else is a ``ValueError`` naming the option no family expresses.
    ``dropout`` is a training setting and is not written.
    """
    from safetensors.numpy import save_file

    raw = config_to_hf(config)  # refuses first what no family expresses
    check_params(params, param_shapes(config, "decoder_only"))
    arrays = {name: np.asarray(value, dtype=np.float64) for name, value in params.items()}
    hf = _to_neox(config, arrays) if raw["model_type"] == "gpt_neox" else _to_llama(config, arrays)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    tensors = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in hf.items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


# ---------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------


def load_tokenizer(path):
    """The ``tokenizers.Tokenizer`` of ``path / "tokenizer.json"``."""
    from tokenizers import Tokenizer

    file = Path(path) / "tokenizer.json"
    if not file.exists():
        raise FileNotFoundError(
            f"{path} has no tokenizer.json (only the fast-tokenizer file of the `tokenizers` "
            "library is read; a slow tokenizer such as tokenizer.model is not)"
        )
    return Tokenizer.from_file(str(file))


def load_chat_template(path, required: bool = True):
    """The chat template of a model directory (``levels.tokenizer.ChatTemplate``), from
    ``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template`` (the default one
    of a list), with that file's special-token strings. Without one: ``ValueError`` when
    ``required``, else None."""
    from .tokenizer import ChatTemplate

    path = Path(path)
    config_file = path / "tokenizer_config.json"
    settings = json.loads(config_file.read_text()) if config_file.exists() else {}
    source = settings.get("chat_template")
    if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
        source = next((t["template"] for t in source if t.get("name") == "default"), None)
    if (path / "chat_template.jinja").exists():
        source = (path / "chat_template.jinja").read_text()
    if not source:
        if not required:
            return None
        raise ValueError(f"{path} has no chat template; use ladder generate for plain text")
    special = {}
    for key, value in settings.items():
        if key.endswith("_token") and value is not None:
            special[key] = value["content"] if isinstance(value, dict) else str(value)
    return ChatTemplate(source, special)
