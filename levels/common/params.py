"""Canonical parameters: one dict of numpy arrays that every level builds from.

Names and layouts are those of PyTorch's ``nn.TransformerEncoderLayer``,
``nn.TransformerDecoderLayer`` and ``nn.Transformer`` (``norm_first=True``)
state dicts, so weights move between this project and PyTorch by name:
``layers.{i}.self_attn.in_proj_weight`` is ``(3D, D)`` with rows ``[q; k; v]``,
linear weights are ``(out, in)`` and every linear computes ``x @ W.T + b``.

The options of the models people run add or change a few entries, named in
the same style (docs/conventions.md, "Parameters"): with ``Hkv`` key/value
heads ``in_proj_weight`` is ``(D + 2 Hkv Dh, D)`` (``(H Dh + 2 Hkv Dh, D)`` with a
``head_dim``, and ``out_proj.weight (D, H Dh)``); SwiGLU and GeGLU add
``linear_gate.weight (F, D)``; RMSNorm has a ``weight`` only; an untied
decoder-only model has ``output_projection.weight (V, D)``; ``qkv_bias`` and
``out_bias`` decide ``in_proj_bias`` and ``out_proj.bias`` on their own; QK-norm
adds ``q_norm`` and ``k_norm`` (``Dh`` wide) to each attention, ``post_norms`` a
``post_norm{k}`` after the sublayer that ``norm{k}`` comes before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import numpy as np

from .config import TransformerConfig

KINDS = ("decoder_only", "seq2seq")
INIT_SCHEMES = ("standard", "random")
# A norm's parameters: norm, norm1, post_norm2, q_norm, ... as the last module of the name.
_NORM = re.compile(r"(^|[._])norm\d*\.(weight|bias)$")


def attention_shapes(config: TransformerConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    """One attention's parameters under ``prefix``: ``in_proj_*`` (rows ``[q; k; v]``),
    ``out_proj.*``, and with QK-norm ``q_norm.*`` and ``k_norm.*``."""
    D, Dq, Dkv = config.d_model, config.q_width, config.kv_heads * config.d_head
    shapes = {
        f"{prefix}in_proj_weight": (Dq + 2 * Dkv, D),  # rows [q (H Dh); k (Dkv); v (Dkv)]
        f"{prefix}out_proj.weight": (D, Dq),
    }
    # The order matters: init_params draws in this order (today's models are reproduced
    # exactly from their seeds).
    if config.has_qkv_bias:
        shapes[f"{prefix}in_proj_bias"] = (Dq + 2 * Dkv,)
    if config.has_out_bias:
        shapes[f"{prefix}out_proj.bias"] = (D,)
    if config.qk_norm:  # one norm over each head's Dh features, shared by the heads
        shapes |= norm_shapes(config, f"{prefix}q_norm.", config.d_head)
        shapes |= norm_shapes(config, f"{prefix}k_norm.", config.d_head)
    return shapes


def norm_shapes(
    config: TransformerConfig, prefix: str, width: int | None = None
) -> dict[str, tuple[int, ...]]:
    """One norm's parameters under ``prefix``, over ``width`` features (default ``D``)."""
    # Both norms have a gain; LayerNorm's bias follows config.bias, RMSNorm has none.
    width = config.d_model if width is None else width
    shapes = {f"{prefix}weight": (width,)}
    if config.has_norm_bias:
        shapes[f"{prefix}bias"] = (width,)
    return shapes


def _linear_shapes(config, prefix: str, n_out: int, n_in: int) -> dict[str, tuple[int, ...]]:
    shapes = {f"{prefix}weight": (n_out, n_in)}
    if config.bias:
        shapes[f"{prefix}bias"] = (n_out,)
    return shapes


def feed_forward_shapes(config: TransformerConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    """``linear1 (F, D)`` and ``linear2 (D, F)``; SwiGLU and GeGLU add ``linear_gate (F, D)``."""
    D, F = config.d_model, config.d_ff
    shapes: dict[str, tuple[int, ...]] = {}
    if config.ffn != "gelu":  # a gated unit
        shapes |= _linear_shapes(config, f"{prefix}linear_gate.", F, D)
    shapes |= _linear_shapes(config, f"{prefix}linear1.", F, D)
    shapes |= _linear_shapes(config, f"{prefix}linear2.", D, F)
    return shapes


def layer_shapes(config: TransformerConfig, prefix: str, *, cross: bool) -> dict[str, tuple]:
    """Shapes of one pre-norm block under ``prefix`` (e.g. ``"layers.3."``).

    An encoder / decoder-only block has norm1, self_attn, norm2 and the FFN;
    a seq2seq decoder block (``cross=True``) adds ``multihead_attn`` and uses
    norm3 before the FFN, exactly as ``nn.TransformerDecoderLayer``. With
    ``post_norms``, ``post_norm{k}`` follows the sublayer ``norm{k}`` precedes.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    sublayers = [f"{prefix}self_attn."] + ([f"{prefix}multihead_attn."] if cross else [])
    for k, attention in enumerate(sublayers, start=1):
        shapes |= norm_shapes(config, f"{prefix}norm{k}.")
        shapes |= attention_shapes(config, attention)
        if config.post_norms:
            shapes |= norm_shapes(config, f"{prefix}post_norm{k}.")
    ffn = len(sublayers) + 1  # norm2, or norm3 in a decoder block
    shapes |= norm_shapes(config, f"{prefix}norm{ffn}.")
    shapes |= feed_forward_shapes(config, prefix)
    if config.post_norms:
        shapes |= norm_shapes(config, f"{prefix}post_norm{ffn}.")
    return shapes


def param_shapes(config: TransformerConfig, kind: str) -> dict[str, tuple[int, ...]]:
    """Every canonical parameter name of a model ``kind``, with its shape."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    V, D = config.vocab_size, config.d_model
    shapes: dict[str, tuple[int, ...]] = {}
    if kind == "decoder_only":
        shapes["token_embedding.weight"] = (V, D)  # also the output projection when tied
        for i in range(config.n_layers):
            shapes |= layer_shapes(config, f"layers.{i}.", cross=False)
        shapes |= norm_shapes(config, "norm.")
        if not config.tie_embeddings:
            shapes["output_projection.weight"] = (V, D)
    else:
        shapes["source_embedding.weight"] = (V, D)
        shapes["target_embedding.weight"] = (V, D)
        for i in range(config.n_layers):
            shapes |= layer_shapes(config, f"encoder.layers.{i}.", cross=False)
        shapes |= norm_shapes(config, "encoder.norm.")
        for i in range(config.n_layers):
            shapes |= layer_shapes(config, f"decoder.layers.{i}.", cross=True)
        shapes |= norm_shapes(config, "decoder.norm.")
        shapes["output_projection.weight"] = (V, D)
    return shapes


def kv_bytes_per_token(config: TransformerConfig, bytes_per_element: int) -> int:
    """What one position costs in a KV cache: the keys and values of every layer,
    ``2 L Hkv Dh`` numbers. Grouped-query attention divides it by ``H / Hkv``."""
    return 2 * config.n_layers * config.kv_heads * config.d_head * bytes_per_element


def check_params(
    params: Mapping[str, object],
    expected: Mapping[str, tuple[int, ...]],
    *,
    what: str = "parameters",
) -> None:
    """Raise one ``ValueError`` listing every missing, unexpected or mis-shaped entry,
    then a ``TypeError`` listing entries that are not real numbers (complex, bool).

    ``params`` values may be any array type with a ``.shape`` (numpy, torch) or
    nested lists.
    """
    missing = sorted(set(expected) - set(params))
    unexpected = sorted(set(params) - set(expected))
    misshaped = []
    for name in sorted(set(expected) & set(params)):
        shape = _shape_of(params[name])
        if shape != tuple(expected[name]):
            misshaped.append(f"{name}: expected {tuple(expected[name])}, got {shape}")
    problems = []
    if missing:
        problems.append("missing: " + ", ".join(missing))
    if unexpected:
        problems.append("unexpected: " + ", ".join(unexpected))
    if misshaped:
        problems.append("mis-shaped: " + "; ".join(misshaped))
    if problems:
        raise ValueError(f"bad {what}: " + " | ".join(problems))
    not_real = [
        f"{name} ({_dtype_name(params[name])})"
        for name in sorted(params)
        if not _real(params[name])
    ]
    if not_real:
        raise TypeError(f"bad {what}: not real numbers: " + ", ".join(not_real))


def _dtype_name(value: object) -> str:
    dtype = getattr(value, "dtype", None)
    return str(np.asarray(value).dtype if dtype is None else dtype).replace("torch.", "")


def _real(value: object) -> bool:
    """Whether a parameter holds real numbers (float or integer; not complex, not bool)."""
    name = _dtype_name(value)
    if "complex" in name or name == "bool":
        return False
    try:
        return np.dtype(name).kind in "fiu"
    except TypeError:  # a torch dtype numpy does not know (bfloat16): a real float
        return True


def _shape_of(value: object) -> tuple[int, ...]:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return tuple(int(n) for n in shape)
    return np.shape(value)


def subset(params: Mapping[str, object], prefix: str) -> dict[str, object]:
    """The entries under ``prefix``, with the prefix removed."""
    return {name[len(prefix) :]: value for name, value in params.items() if name.startswith(prefix)}


def init_params(
    config: TransformerConfig, kind: str, seed: int = 0, *, scheme: str = "standard"
) -> dict[str, np.ndarray]:
    """Fresh canonical parameters as float64 numpy arrays, reproducible from ``seed``.

    ``scheme="standard"`` is a training initialisation: weights drawn with
    standard deviation ``1/sqrt(fan_in)`` so every projection keeps unit
    variance, the projections that write into the residual stream
    (``out_proj``, ``linear2``) shrunk by ``1/sqrt(2 * n_layers)`` so the stream
    does not grow with depth (GPT-2's rule), biases 0, norm gains 1.
    Embeddings have standard deviation ``1/sqrt(D)``: the model multiplies them by
    ``sqrt(D)``, so the stream starts at unit variance, and tied logits
    ``h @ E.T`` start at unit variance too.

    ``scheme="random"`` additionally draws biases and norm parameters at random
    (N(0, 0.1) around their usual values). Tests use it so that a level that
    forgets a bias or a norm gain cannot pass by accident.

    With ``norm_weight_offset`` (Gemma's gains, ``offset + weight``) a norm's weight
    starts at ``1 - offset``, so every gain starts at 1 either way.
    """
    if scheme not in INIT_SCHEMES:
        raise ValueError(f"scheme must be one of {INIT_SCHEMES}, got {scheme!r}")
    rng = np.random.default_rng(seed)
    residual_shrink = 1.0 / math.sqrt(2 * config.n_layers)
    params: dict[str, np.ndarray] = {}
    for name, shape in param_shapes(config, kind).items():
        leaf = name.rsplit(".", 1)[-1]
        is_norm = _NORM.search(name) is not None and leaf in ("weight", "bias")
        if is_norm:
            base = 1.0 - config.norm_weight_offset if leaf == "weight" else 0.0
            noise = rng.normal(0.0, 0.1, shape) if scheme == "random" else 0.0
            params[name] = np.full(shape, base, dtype=np.float64) + noise
        elif leaf in ("bias", "in_proj_bias"):
            noise = rng.normal(0.0, 0.1, shape) if scheme == "random" else 0.0
            params[name] = np.zeros(shape, dtype=np.float64) + noise
        elif "embedding" in name or name == "output_projection.weight":
            params[name] = rng.normal(0.0, 1.0 / math.sqrt(config.d_model), shape)
        else:
            fan_in = shape[1]
            std = 1.0 / math.sqrt(fan_in)
            if name.endswith("out_proj.weight") or name.endswith("linear2.weight"):
                std *= residual_shrink
            params[name] = rng.normal(0.0, std, shape)
    return params
