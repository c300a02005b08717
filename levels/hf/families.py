"""``config.json`` <-> ``TransformerConfig``, for each supported family.

``config_from_hf`` reads a parsed ``config.json`` the way the family's config class in
``transformers`` reads it (its defaults for what the file omits) and refuses what the
ladder does not compute; ``config_to_hf`` picks the one family that computes a config's
model and writes its ``config.json``. (The package docstring lists what is refused.)
"""

from __future__ import annotations

import dataclasses

from ..common.config import TransformerConfig

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
# TransformerConfig -> config.json
# ---------------------------------------------------------------------------


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
