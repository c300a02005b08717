"""The tensors of a Hugging Face checkpoint <-> the canonical parameters.

The q and k rows permuted between ``rotate_half`` order and the ladder's adjacent
pairs, GPT-NeoX's fused ``query_key_value`` regrouped, and the renaming, for the
Llama-like families (Llama, Mistral, Qwen2, Gemma 3) and for GPT-NeoX: each family's
map in both directions, side by side. (The package docstring explains the layouts.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from ..common.config import TransformerConfig
from ..common.params import check_params, param_shapes

# Buffers older checkpoints carry that are not parameters (transformers skips them too).
_IGNORED_TENSORS = re.compile(r"(rotary_emb\.inv_freq|attention\.bias|attention\.masked_bias)$")


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


def params_to_hf(
    config: TransformerConfig, raw: dict, params: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The tensors of a model ``config`` under their Hugging Face names, in the layout of
    ``raw``'s family (its ``config.json``, from ``config_to_hf``): ``params_from_hf``'s inverse."""
    if raw["model_type"] == "gpt_neox":
        return _to_neox(config, params)
    return _to_llama(config, params)
