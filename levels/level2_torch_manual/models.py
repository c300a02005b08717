"""The transformer as ``torch.nn`` modules, in one file, read top-down as the textbook.

``Transformer.forward(ids, positions, cache=None)`` is the model: embed, the blocks, the
final norm, the head. ``ids (B,T)`` and ``positions (B,T)`` (each token's position,
``-1`` at padding) are trusted: nothing here checks or converts. What a query may see is
one rule of positions (``levels.common.semantics.visible``), built inside ``forward`` once
per distinct window of the layers; a block is ``x = x + attn(norm1(x))``, then
``x = x + ffn(norm2(x))``. Then, in order: RoPE, the norms, the feed-forward, the KV
cache, attention, the two blocks, the two transformers, and the public models, whose methods
(``forward(tokens, *, valid=None)``, ``prefill``, ``decode_step``, ``generate``) are
``levels.common.public``'s, the same at every level: they check the inputs, make the
positions and call ``Transformer.forward``.

The attention core, the norms, the caches and the products a faster level replaces come
from ``self.kernels`` (``kernels.py``): a class attribute, overridable per instance with
``kernels=``, and handed down from a model to its layers. The lines marked ``# option``
are the families' options (Gemma's QK-norm, sandwich norms, score scale; GQA's heads):
a reader may skip them and read the plain pre-norm block.
"""

from __future__ import annotations

from functools import lru_cache, partial

import torch
import torch.nn.functional as F
from torch import nn

from ..common import public
from ..common.cache import Cache
from ..common.config import TransformerConfig
from ..common.params import check_params, param_shapes
from ..common.semantics import core_keywords, in_place, told, visible
from . import arrays as level_arrays
from .arrays import fetch, linear, to_numpy
from .kernels import Kernels

# ----------------------------------------------------------------------------- RoPE


def rope_tables(stop: int, d_head: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin (stop, Dh)`` float64 for positions ``0..stop-1``, laid out for
    ``apply_rope``: feature ``2i`` and ``2i+1`` of a row hold pair ``i``'s angle, ``sin``
    negated on the even features.

    Angle of pair ``i`` at position ``p``: ``p * base^(-2i/Dh)``. Computed in float64:
    at position 1000 a float32 angle is off by ~6e-5 rad, visible against the float64
    reference; callers cast only the finished cos/sin.
    """
    pos = torch.arange(stop, dtype=torch.float64)  # (stop,)
    inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (Dh/2,)
    angles = (pos[:, None] * inv_freq[None, :]).repeat_interleave(2, dim=-1)  # (stop, Dh)
    sign = torch.tensor([-1.0, 1.0], dtype=torch.float64).repeat(d_head // 2)  # (Dh,) -+-+...
    return angles.cos(), angles.sin() * sign


@lru_cache(maxsize=8)
def _shared_tables(stop: int, d_head: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope_tables``, computed once for the layers that share a base (30 of SmolLM2's, two
    bases in Gemma 3): each layer casts its own copy (``.to``), never writes into these."""
    return rope_tables(stop, d_head, base)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent feature pairs of ``x (B,H,T,Dh)`` by the tables of ``rope_tables`` at
    the tokens' positions, ``cos, sin (B,1,T,Dh)``.

    Pair ``i`` is ``(x[2i], x[2i+1]) = (a, b)``, mapped to ``(a cos - b sin, b cos + a sin)``.
    Written as ``x * cos + flip(x) * sin`` with ``flip(a, b) = (b, a)`` and ``sin``'s even
    features negated: ``(a cos + b (-sin), b cos + a sin)``, the same numbers to the bit
    (negation is exact), in six tensor operations instead of a dozen, which is what a
    decode step of one token pays for.
    """
    flipped = x.unflatten(-1, (x.shape[-1] // 2, 2)).flip(-1).flatten(-2)  # (B,H,T,Dh): (b, a)
    return x * cos + flipped * sin  # (B,H,T,Dh)


class Rotary(nn.Module):
    """RoPE of one layer: ``cos`` and ``sin`` for positions ``[0, max_seq_len)``, built once
    (float64 maths, stored in the compute dtype) side by side, ``tables (max_seq_len, 2, Dh)``,
    so that one gather reads both at the tokens' positions."""

    def __init__(self, config: TransformerConfig, base: float, d_head: int, *, device, dtype):
        super().__init__()
        tables = torch.stack(_shared_tables(config.max_seq_len, d_head, base), dim=1)
        # Not persistent: state_dict() holds only the parameters.
        self.register_buffer("tables", tables.to(device=device, dtype=dtype or torch.float32),
                             persistent=False)  # fmt: skip

    def forward(self, positions: torch.Tensor, *heads: torch.Tensor) -> list[torch.Tensor]:
        """Each of ``heads`` ``(B,n,T,Dh)`` rotated to ``positions (B,T)``. (A padded token's
        ``-1`` reads the last row, as numpy would: nobody sees its key, and its output is
        zeroed.)"""
        cos, sin = self.tables[positions][:, None].unbind(-2)  # (B,1,T,Dh) each: every head alike
        return [apply_rope(x, cos, sin) for x in heads]


# ----------------------------------------------------------------------------- the norms
# Written out, with their statistics in at least float32; levels 3 and 4 swap in fused ones
# (``Kernels.layer_norm``, ``Kernels.rms_norm``) with these parameters and state dicts.


def _statistics_dtype(x: torch.Tensor) -> torch.Tensor:
    """``x`` in at least float32: float16 and bfloat16 promoted, float32 and float64 as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)


class _Norm(nn.Module):
    """What both norms share: ``eps``, ``weight (N,)`` from ``{prefix}weight`` and the gain.

    ``N`` is ``width``: ``D`` by default, ``Dh`` for QK-norm. The gain is ``weight``, or
    ``norm_weight_offset + weight`` (Gemma's gains are offsets from 1), which is added
    in the statistics' dtype, as transformers adds Gemma's 1 in float32.
    """

    def __init__(
        self,
        config: TransformerConfig,
        params,
        *,
        prefix: str = "",
        width: int | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.width = config.d_model if width is None else width
        # option norm_weight_offset: the gain is offset + weight (Gemma stores offsets from 1)
        self.eps, self.offset = config.norm_eps, config.norm_weight_offset
        self.weight = fetch(params, f"{prefix}weight", (self.width,), device=device, dtype=dtype)

    def gain(self, dtype: torch.dtype) -> torch.Tensor:
        """``weight``, or ``offset + weight``, in ``dtype`` (the statistics' dtype): ``(N,)``."""
        weight = self.weight.to(dtype)  # the parameter itself when it has that dtype
        return weight if self.offset == 0.0 else self.offset + weight


class LayerNorm(_Norm):
    """``(x - mean) / sqrt(var + eps) * gain + bias`` over the last axis: ``(..., N) -> (..., N)``.

    Reads ``{prefix}weight`` and, when ``config.bias``, ``{prefix}bias``; the
    state-dict names are ``weight`` and ``bias``, as in ``nn.LayerNorm``.
    """

    def __init__(self, config: TransformerConfig, params, *, prefix: str = "", **kw):
        super().__init__(config, params, prefix=prefix, **kw)  # width, device, dtype
        if config.has_norm_bias:  # on the weight's device, in its dtype
            w = self.weight
            self.bias = fetch(
                params, f"{prefix}bias", (self.width,), device=w.device, dtype=w.dtype
            )
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in at least float32: a half-precision sum of D squares loses
        # digits fast. The variance is the biased one (divide by D), as nn.LayerNorm.
        xf = _statistics_dtype(x)  # (..., N)
        mean = xf.mean(dim=-1, keepdim=True)  # (..., 1)
        centred = xf - mean  # (..., N)
        var = (centred * centred).mean(dim=-1, keepdim=True)  # (..., 1)
        y = centred * torch.rsqrt(var + self.eps) * self.gain(xf.dtype)  # (..., N)
        if self.bias is not None:
            y = y + self.bias
        return y if y.dtype == x.dtype else y.to(x.dtype)


class RMSNorm(_Norm):
    """``x / sqrt(mean(x^2) + eps) * gain`` over the last axis: ``(..., N) -> (..., N)``.

    Reads ``{prefix}weight``; no bias and no centring (Zhang & Sennrich 2019), as
    Llama, Mistral, Qwen2 and Gemma use it. The state-dict name is ``weight``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The mean of squares in at least float32, as LayerNorm's statistics above.
        xf = _statistics_dtype(x)  # (..., N)
        y = xf * torch.rsqrt((xf * xf).mean(dim=-1, keepdim=True) + self.eps) * self.gain(xf.dtype)
        return y if y.dtype == x.dtype else y.to(x.dtype)  # (..., N)


# ----------------------------------------------------------------------------- the feed-forward


def feed_forward_linears(
    config: TransformerConfig, params, prefix: str, *, device=None, dtype=None
) -> dict[str, nn.Linear]:
    """``linear1 (F, D)`` and ``linear2 (D, F)`` (and the gate of SwiGLU and GeGLU,
    ``linear_gate (F, D)``) from ``{prefix}linear1.*`` and so on.

    A block registers these directly as ``self.linear1``, ``self.linear2`` (where
    PyTorch keeps them) and ``self.linear_gate``, and ``FeedForward`` does the same,
    so both share this loader and ``feed_forward`` below.
    """
    D, F_ = config.d_model, config.d_ff
    kw = {"bias": config.bias, "device": device, "dtype": dtype}
    linears = {
        "linear1": linear(params, f"{prefix}linear1.", F_, D, **kw),
        "linear2": linear(params, f"{prefix}linear2.", D, F_, **kw),
    }
    if config.ffn != "gelu":  # option ffn: a gated unit (SwiGLU, GeGLU)
        linears["linear_gate"] = linear(params, f"{prefix}linear_gate.", F_, D, **kw)
    return linears


# The gate's activation of each gated feed-forward: SiLU, or GELU's tanh approximation
# (Gemma's GeGLU; transformers' gelu_pytorch_tanh is this call).
GATES = {"swiglu": F.silu, "geglu": partial(F.gelu, approximate="tanh")}


def feed_forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``linear2(dropout(GELU(linear1(x))))``, or gated, SwiGLU
    ``linear2(dropout(silu(linear_gate(x)) * linear1(x)))`` and GeGLU (the tanh GELU
    for silu): ``(..., D) -> (..., D)``.

    Exact (erf) GELU; the inner dropout is ``nn.TransformerEncoderLayer``'s and
    acts only in training mode. ``module.ffn`` is the config's ``ffn``.
    """
    h = module.linear1(x)  # (..., D) -> (..., F)
    gate = getattr(module, "linear_gate", None)
    h = F.gelu(h) if gate is None else GATES[module.ffn](gate(x)) * h  # (..., F)
    if module.training and module.dropout_p > 0:
        h = F.dropout(h, p=module.dropout_p, training=True)  # (..., F)
    return module.linear2(h)  # (..., F) -> (..., D)


class FeedForward(nn.Module):
    """The position-wise feed-forward network on its own (the blocks hold its linears
    themselves, under PyTorch's names): GELU, or SwiGLU or GeGLU as ``config.ffn`` says;
    reads ``{prefix}linear1.*``, ``{prefix}linear2.*`` (and ``{prefix}linear_gate.*``)."""

    def __init__(
        self, config: TransformerConfig, params, *, prefix: str = "", device=None, dtype=None
    ):
        super().__init__()
        # option ffn: the gate ``feed_forward`` applies (GATES)
        self.dropout_p, self.ffn = config.dropout, config.ffn
        for name, layer in feed_forward_linears(config, params, prefix, device=device, dtype=dtype).items():  # fmt: skip
            setattr(self, name, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return feed_forward(self, x)


# ----------------------------------------------------------------------------- the KV cache


class KVCache(Cache):
    """Level 2's KV cache, grown by concatenation: for each layer the keys and values of the
    slots filled so far, ``(B,Hkv,length,Dh)``, and every slot's position ``positions
    (B,length)`` (``-1``: padding); capacity ``max_seq_len`` slots.

    A pass calls ``extend(positions)`` once (the new slots' positions, written in place:
    the cache now holds them), then each layer ``update(index, k, v)``. Simple and
    obviously right, but every step copies the whole cache (``O(N^2)`` traffic over ``N``
    steps): level 3's ``StaticKVCache`` writes its keys and values in place too. ``rollback`` (setting the length back) and an
    encoder-decoder's memory keys are ``levels.common.cache.Cache``'s.
    """

    def __init__(self, config: TransformerConfig, batch: int, *, device=None, dtype=None):
        super().__init__(config, batch, device)
        # Every slot's position, (B, C), written in place: -1 (padding) where nothing is.
        self.positions = torch.full((batch, self.capacity), -1, dtype=torch.long, device=device)
        self.keys: list[torch.Tensor | None] = [None] * config.n_layers  # (B,Hkv,length,Dh)
        self.values: list[torch.Tensor | None] = [None] * config.n_layers

    def extend(self, positions: torch.Tensor) -> torch.Tensor:
        """Write ``positions (B,T)`` at slots ``[length, length + T)`` -> every filled slot's
        position, ``(B,length+T)`` (a view)."""
        T = positions.shape[1]
        self.positions.narrow(1, self.length, T).copy_(positions)
        self.length += T
        return self.positions.narrow(1, 0, self.length)

    def update(self, index: int, k: torch.Tensor, v: torch.Tensor):
        """Layer ``index``'s keys and values of the new slots, ``(B,Hkv,T,Dh)`` -> of every slot,
        ``(B,Hkv,length,Dh)``."""
        kept = self.length - k.shape[2]  # the slots before this pass (a rollback's dropped)
        if kept:
            k = torch.cat([self.keys[index][:, :, :kept], k], dim=2)  # (B,Hkv,length,Dh)
            v = torch.cat([self.values[index][:, :, :kept], v], dim=2)
        self.keys[index], self.values[index] = k, v
        return k, v

    def next_positions(self):
        """Each row's next position, ``(B,)`` numpy: after its largest one (0 when empty)."""
        filled = self.positions[:, : self.length]  # (B, length)
        return to_numpy(filled.amax(dim=1) + 1) if self.length else to_numpy(filled.sum(dim=1))

    def rollback(self, length: int) -> None:
        """Forget the slots after ``length``; their positions become padding again, so that a
        step that reads the whole buffer (a compiled one on a GPU) sees none of them."""
        super().rollback(length)
        self.positions[:, length:] = -1


# Level 2's pieces: the written-out attention core (``attention.py``) and norms, this cache.
LEVEL2_KERNELS = Kernels(kv_cache=KVCache, layer_norm=LayerNorm, rms_norm=RMSNorm)


# ----------------------------------------------------------------------------- attention


class MultiHeadAttention(nn.Module):
    """Multi-head attention with ``nn.MultiheadAttention``'s parameters, and grouped-query heads.

    ``in_proj_weight (H Dh + 2 Hkv Dh, D)`` holds rows ``[q; k; v]``: ``H`` query heads
    and ``Hkv = config.kv_heads`` key/value heads; ``out_proj`` is a linear ``(D, H Dh)``.
    ``rope=True`` rotates q and k (self-attention) with base ``rope_base`` (None:
    ``config.rope_base``). The core is ``self.kernels.attention``. Cross-attention is
    ``attend(queries(x), *keys_values(memory), mask)``, unrotated.
    """

    kernels: Kernels = LEVEL2_KERNELS

    def __init__(self, config: TransformerConfig, params, *, prefix: str = "", device=None,
                 dtype=None, rope: bool = False, rope_base: float | None = None,
                 kernels: Kernels | None = None):  # fmt: skip
        super().__init__()
        self.kernels = kernels or self.kernels
        kw = {"device": device, "dtype": dtype}
        # option n_kv_heads: Hkv key/value heads, each shared by H // Hkv query heads (GQA)
        self.n_heads, self.n_kv_heads, self.d_head = config.n_heads, config.kv_heads, config.d_head
        rows, D = config.q_width + 2 * self.n_kv_heads * self.d_head, config.d_model
        self.in_proj_weight = fetch(params, f"{prefix}in_proj_weight", (rows, D), **kw)
        # option qkv_bias, out_bias: biases apart from ``bias`` (Qwen2: q, k and v only)
        bias = (
            fetch(params, f"{prefix}in_proj_bias", (rows,), **kw) if config.has_qkv_bias else None
        )
        self.register_parameter("in_proj_bias", bias)
        self.out_proj = linear(
            params, f"{prefix}out_proj.", D, config.q_width, bias=config.has_out_bias, **kw
        )
        base = config.rope_base if rope_base is None else rope_base
        self.rope = Rotary(config, base, self.d_head, **kw) if rope else None
        # option qk_norm: a norm over each head's Dh features of q and k, before RoPE (Gemma 3)
        self.q_norm, self.k_norm = qk_norms(config, params, prefix, self.kernels, **kw)
        # option attn_scale: what the scores are multiplied by (Gemma); None: 1 / sqrt(Dh)
        self.dropout_p, self.scale = config.dropout, config.attn_scale

    def forward(self, x, positions=None, mask=None, cache=None, index: int = 0) -> torch.Tensor:
        """Self-attention of ``x (B,T,D)`` -> ``(B,T,D)``: queries and keys rotated to
        ``positions (B,T)``; ``mask (B,1,T,S)``, True = may attend; with a ``cache``, the new
        keys and values join layer ``index`` of it and the queries see all it holds."""
        q, k, v = self._project(x, (0, 1, 2))  # (B,H,T,Dh), (B,Hkv,T,Dh), (B,Hkv,T,Dh)
        q, k = self._place(positions, (q, self.q_norm), (k, self.k_norm))
        if cache is not None:
            k, v = cache.update(index, k, v)  # (B,Hkv,S,Dh): every key the cache holds
        return self.attend(q, k, v, mask)

    def _project(self, x: torch.Tensor, parts: tuple[int, ...]) -> list[torch.Tensor]:
        """Project ``x (B,L,D)`` with the rows of consecutive ``parts`` (0 q, 1 k, 2 v) of
        in_proj, in one matmul (one pass over those rows of the weight): -> ``(B,H,L,Dh)``
        for q, ``(B,Hkv,L,Dh)`` for k and v, views of its output."""
        widths = (self.n_heads * self.d_head,) + (self.n_kv_heads * self.d_head,) * 2
        starts = (0, widths[0], widths[0] + widths[1])
        rows = slice(starts[parts[0]], starts[parts[-1]] + widths[parts[-1]])
        bias = None if self.in_proj_bias is None else self.in_proj_bias[rows]
        y = self.kernels.linear(x, self.in_proj_weight[rows], bias)  # (B,L,D) @ (D,width)
        heads = y.split([widths[p] for p in parts], dim=-1)  # (B,L,n*Dh) each
        # (B,L,n*Dh) -> (B,L,n,Dh) -> (B,n,L,Dh)
        return [h.unflatten(-1, (-1, self.d_head)).transpose(1, 2) for h in heads]

    def _place(self, positions, *heads: tuple[torch.Tensor, nn.Module | None]) -> list:
        """Each ``(x (B,n,L,Dh), norm)`` of ``heads``: normed (QK-norm, where the norm is not
        None), then rotated to ``positions (B,L)`` where the layer has RoPE."""
        normed = [x if norm is None else norm(x) for x, norm in heads]
        return normed if self.rope is None or positions is None else self.rope(positions, *normed)

    def queries(self, x: torch.Tensor, positions=None) -> torch.Tensor:
        """``x (B,T,D)`` -> ``q (B,H,T,Dh)``, normed and rotated to ``positions``."""
        return self._place(positions, (self._project(x, (0,))[0], self.q_norm))[0]

    def keys_values(self, kv: torch.Tensor, positions=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv (B,S,D)`` -> ``k, v (B,Hkv,S,Dh)``; k normed and rotated to ``positions``
        (None: unrotated, as cross-attention's memory is)."""
        k, v = self._project(kv, (1, 2))  # (B,Hkv,S,Dh) each
        return self._place(positions, (k, self.k_norm))[0], v

    def attend(self, q, k, v, mask=None) -> torch.Tensor:
        """The core over heads, heads merged, ``out_proj``: ``q (B,H,T,Dh)``, ``k, v
        (B,Hkv,S,Dh)`` -> ``(B,T,D)``. ``mask`` broadcastable to ``(B,H,T,S)``, or the
        model's ``semantics.ByPlace``, handed to the core as ``causal=`` and ``window=``."""
        extra = {"dropout_p": self.dropout_p} if self.training and self.dropout_p > 0 else {}
        if self.scale is not None:  # passed only when set: a kernel without one runs the rest
            extra["scale"] = self.scale
        o = self.kernels.attention(q, k, v, **core_keywords(mask), **extra)  # (B,H,T,Dh)
        B, H, T, Dh = o.shape
        o = o.transpose(1, 2).reshape(B, T, H * Dh)  # (B,H,T,Dh) -> (B,T,H,Dh) -> (B,T,H Dh)
        return self.out_proj(o)  # (B,T,H Dh) -> (B,T,D)


def qk_norms(config: TransformerConfig, params, prefix: str, kernels: Kernels, **kw):
    """Gemma 3's QK-norm: ``(q_norm, k_norm)`` over each head's ``Dh`` features, of the
    kernels' norm class (``{prefix}q_norm.weight``, ``{prefix}k_norm.weight``); ``(None,
    None)`` for the models without it."""
    if not config.qk_norm:  # option qk_norm: the norms themselves
        return None, None
    Norm = kernels.norm(config)
    return tuple(Norm(config, params, prefix=f"{prefix}{n}.", width=config.d_head, **kw)
                 for n in ("q_norm", "k_norm"))  # fmt: skip


# ----------------------------------------------------------------------------- the blocks


class EncoderLayer(nn.Module):
    """The pre-norm block ``x + SelfAttn(norm1(x))``, then ``x + FFN(norm2(x))``: ``(B,T,D) -> (B,T,D)``.

    ``nn.TransformerEncoderLayer``'s parameters, and the decoder-only model's block (whose
    mask makes it causal). Dropout (training only) follows the attention output and the
    FFN, as in PyTorch. Self-attention uses RoPE when ``config.positional == "rope"``
    (``rope=`` overrides) with base ``rope_base``; the norms are ``config.norm``'s class
    from ``self.kernels``.
    """

    kernels: Kernels = LEVEL2_KERNELS

    def __init__(self, config: TransformerConfig, params, *, prefix: str = "", device=None,
                 dtype=None, rope: bool | None = None, rope_base: float | None = None,
                 kernels: Kernels | None = None):  # fmt: skip
        super().__init__()
        self.kernels = kernels or self.kernels
        rope = config.positional == "rope" if rope is None else rope  # a RoPE model's blocks rotate
        kw = {"device": device, "dtype": dtype}
        Norm = self.kernels.norm(config)
        self.norm1 = Norm(config, params, prefix=f"{prefix}norm1.", **kw)
        self.self_attn = MultiHeadAttention(config, params, prefix=f"{prefix}self_attn.", rope=rope,
                                            rope_base=rope_base, kernels=self.kernels, **kw)  # fmt: skip
        self.norm2 = Norm(config, params, prefix=f"{prefix}norm2.", **kw)
        for name, layer in feed_forward_linears(config, params, prefix, **kw).items():
            setattr(self, name, layer)  # linear1, linear2 (and linear_gate), as PyTorch names them
        # option ffn: the gate ``feed_forward`` applies (GATES)
        self.dropout_p, self.ffn = config.dropout, config.ffn
        # option post_norms: a norm after each sublayer as well as before it (Gemma 2 and 3)
        self.post_norm1, self.post_norm2 = post_norms(config, params, prefix, Norm, (1, 2), **kw)

    def forward(self, x, positions=None, mask=None, cache=None, index: int = 0) -> torch.Tensor:
        """``x (B,T,D)`` at ``positions (B,T)``; ``mask``, ``cache`` and ``index`` as
        ``MultiHeadAttention``'s."""
        h = self.self_attn(self.norm1(x), positions, mask, cache, index)  # (B,T,D)
        x = x + self._out(h, self.post_norm1)
        return x + self._out(feed_forward(self, self.norm2(x)), self.post_norm2)  # (B,T,D)

    def _out(self, h: torch.Tensor, post_norm: nn.Module | None) -> torch.Tensor:
        """A sublayer's output as it joins the stream: ``dropout(h)``, or
        ``dropout(post_norm(h))`` with ``config.post_norms``."""
        h = h if post_norm is None else post_norm(h)
        return (
            F.dropout(h, p=self.dropout_p, training=True)
            if self.training and self.dropout_p > 0
            else h
        )


def post_norms(config: TransformerConfig, params, prefix: str, Norm: type, which, **kw) -> list:
    """Gemma 2 and 3's sandwich norms: ``post_norm{i}`` for each ``i`` of ``which``, a norm
    of each sublayer's output before it joins the stream; Nones for the models without."""
    if not config.post_norms:  # option post_norms: the norms themselves
        return [None] * len(which)
    return [Norm(config, params, prefix=f"{prefix}post_norm{i}.", **kw) for i in which]


class DecoderLayer(EncoderLayer):
    """Seq2seq decoder block: causal self-attention, cross-attention to ``memory``, FFN.

    ``x + SelfAttn(norm1(x))``, ``x + CrossAttn(norm2(x), memory)``, ``x + FFN(norm3(x))``,
    with ``nn.TransformerDecoderLayer``'s names (``multihead_attn``, ``norm3``); with
    ``config.post_norms`` the three outputs pass ``post_norm1``, ``post_norm2``, ``post_norm3``.
    """

    def __init__(self, config: TransformerConfig, params, *, prefix: str = "", **options):
        """``EncoderLayer``'s arguments (``options``: ``device``, ``dtype``, ``rope``,
        ``rope_base``, ``kernels``), and the cross-attention and its norm."""
        super().__init__(config, params, prefix=prefix, **options)
        kw = {"device": options.get("device"), "dtype": options.get("dtype")}
        Norm = self.kernels.norm(config)
        self.multihead_attn = MultiHeadAttention(
            config, params, prefix=f"{prefix}multihead_attn.", kernels=self.kernels, **kw
        )
        self.norm3 = Norm(config, params, prefix=f"{prefix}norm3.", **kw)
        # option post_norms: post_norm2 follows the cross-attention here, post_norm3 the FFN
        (self.post_norm3,) = post_norms(config, params, prefix, Norm, (3,), **kw)

    def forward(self, x, positions, mask, memory, memory_mask, cache=None, index: int = 0):
        """``x (B,T,D)``, ``memory (B,S,D)``, ``memory_mask`` the real source keys
        ``(B,1,T,S)`` -> ``(B,T,D)``; the rest as ``EncoderLayer``'s. With a ``cache`` the
        memory's keys and values are computed on the first call and kept in
        ``cache.cross[index]`` (``memory`` may then be None)."""
        h = self.self_attn(self.norm1(x), positions, mask, cache, index)  # (B,T,D)
        x = x + self._out(h, self.post_norm1)
        cross = self.multihead_attn
        if cache is None:
            k, v = cross.keys_values(memory)  # (B,Hkv,S,Dh) each
        else:  # computed once a generation
            k, v = cache.memory_keys(index, lambda: cross.keys_values(memory))
        h = cross.attend(cross.queries(self.norm2(x)), k, v, memory_mask)  # (B,T,D)
        x = x + self._out(h, self.post_norm2)
        return x + self._out(feed_forward(self, self.norm3(x)), self.post_norm3)  # (B,T,D)


# ----------------------------------------------------------------------------- the transformers


class _Plain(nn.Module):
    """What both transformers share: the parameter check, the kernels, the layers."""

    kernels: Kernels = LEVEL2_KERNELS
    arrays = level_arrays  # the converters the public methods use (arrays.py)

    def __init__(self, config: TransformerConfig, params, kind: str, *, dtype, kernels):
        super().__init__()
        check_params(params, param_shapes(config, kind))
        self.kernels = kernels or self.kernels
        self.config = config
        self.dtype = dtype or torch.float32
        # option window_pattern: each layer's window (None: every key), one per layer
        self.windows = config.layer_windows

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def new_cache(self, batch: int):
        """An empty KV cache of capacity ``max_seq_len`` for ``batch`` rows."""
        return self.kernels.kv_cache(self.config, batch, device=self.device, dtype=self.dtype)

    def _layers(self, config: TransformerConfig, params, prefix: str, Layer, **kw) -> nn.ModuleList:
        """``Layer`` ``{prefix}{i}.`` for each layer ``i``, each with its RoPE base."""
        # option window_pattern, rope_local_base: each layer's window and RoPE base (Gemma 3)
        return nn.ModuleList(
            Layer(config, params, prefix=f"{prefix}{i}.", rope_base=config.rope_base_of(w),
                  kernels=self.kernels, **kw)
            for i, w in enumerate(config.layer_windows)
        )  # fmt: skip

    def _masks(self, positions, keys, causal: bool = True) -> list:
        """What each layer's queries may see, by the positions of the queries ``(B,T)`` and the
        keys ``(B,S)``, once for each distinct window (``semantics.told``): where the
        positions are in place (an unpadded prompt or step) the core's own ``causal`` and
        ``window`` (``ByPlace``), so that it takes its fast path (SDPA's causal kernel, the
        Triton kernel's skipped tiles); else a ``(B,1,T,S)`` mask, None where it hides
        nothing. A compiled pass keeps its masks (no branch on values)."""
        windows = self.windows  # each layer's (Gemma 3's local and global layers)
        if torch.compiler.is_compiling():
            built = {w: visible(positions, keys, w, causal=causal) for w in dict.fromkeys(windows)}
        else:
            placed = in_place(positions, keys)
            built = {w: told(positions, keys, w, causal=causal, placed=placed)
                     for w in dict.fromkeys(windows)}  # fmt: skip
            built = {w: None if _hides_nothing(m) else m for w, m in built.items()}
        return [built[w] for w in windows]


def _hides_nothing(seen) -> bool:
    """A mask of all True (``ByPlace`` is no mask: the core applies it by place)."""
    return isinstance(seen, torch.Tensor) and bool(seen.all())


class _Embedding(nn.Module):
    """A lookup table ``weight (V, D)`` with the canonical name ``{prefix}weight``."""

    def __init__(self, config: TransformerConfig, params, name: str, *, device=None, dtype=None):
        super().__init__()
        self.weight = fetch(
            params, name, (config.vocab_size, config.d_model), device=device, dtype=dtype
        )
        # option scale_embeddings: times sqrt(D), so the stream starts at unit variance; or 1
        self.scale = config.embedding_scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.weight[ids]  # (B,T) -> (B,T,D): ids trusted in [0, V)
        return x if self.scale == 1.0 else x * self.scale


class Transformer(_Plain):
    """The decoder-only transformer: embedding, causal pre-norm blocks, final norm, logits
    (tied to the embedding by default). ``state_dict()`` keys are the canonical names
    (``token_embedding.weight``, ``layers.{i}.*``, ``norm.*``)."""

    def __init__(self, config: TransformerConfig, params, *, device=None, dtype=None,
                 kernels: Kernels | None = None):  # fmt: skip
        super().__init__(config, params, "decoder_only", dtype=dtype, kernels=kernels)
        kw = {"device": device, "dtype": self.dtype}
        self.token_embedding = _Embedding(config, params, "token_embedding.weight", **kw)
        self.layers = self._layers(config, params, "layers.", EncoderLayer, **kw)
        self.norm = self.kernels.norm(config)(config, params, prefix="norm.", **kw)
        # option tie_embeddings: the head is the embedding itself, or a matrix of its own
        if not config.tie_embeddings:  # output_projection.weight (V, D)
            V, D = config.vocab_size, config.d_model
            self.output_projection = linear(params, "output_projection.", V, D, bias=False, **kw)

    def first_layers(self, n: int) -> Transformer:
        """This model cut after its first ``n`` layers, with its own final norm and head: a
        model of its own over the same parameters, not copies (speculative decoding's
        layer-skip draft), built as any model is, from its parameters (``adopt``)."""
        config = self.config.first_layers(n)
        kept = param_shapes(config, "decoder_only")
        params = {name: p.detach() for name, p in self.state_dict().items() if name in kept}
        with level_arrays.adopt():
            return type(self)(config, params, device=self.device, **self.options())

    def options(self) -> dict:
        """What this model was built with besides its config and parameters (a model built
        from its parts again: ``first_layers``)."""
        return {"dtype": self.dtype, "kernels": self.kernels}

    def forward(self, ids, positions, cache=None, last: bool = False) -> torch.Tensor:
        """``ids (B,T)`` in ``[0, V)``, ``positions (B,T)`` (``-1``: padding) -> logits ``(B,T,V)``.

        With a ``cache``, the tokens come after its slots, and their keys and values join
        it. ``last``: the head on each row's last real token only -> ``(B,1,V)``.
        """
        x = self.token_embedding(ids)  # (B,T,D)
        keys = positions if cache is None else cache.extend(positions)  # (B,S): keys' positions
        masks = self._masks(positions, keys)  # (B,1,T,S) a layer: what its queries may see
        for i, (layer, mask) in enumerate(zip(self.layers, masks, strict=True)):
            x = layer(x, positions, mask, cache, i)  # (B,T,D)
        if last:  # the head is the largest product (V x D a position): skip the rest
            rows, at = torch.arange(len(x), device=x.device), positions.argmax(dim=1)  # (B,) each
            x = x[rows, at][:, None]  # (B,T,D) -> (B,1,D): each row's last real token
        # Tied: h @ E^T with the input embedding E; untied: the head's own (V, D).
        head = getattr(self, "output_projection", self.token_embedding)
        return self.kernels.linear(self.norm(x), head.weight)  # (B,T,D) @ (D,V) -> (B,T,V)


class _Stack(nn.Module):
    """``layers.{i}`` and a final ``norm``: the encoder or decoder of the seq2seq model."""

    def __init__(self, layers: nn.ModuleList, norm: nn.Module):
        super().__init__()
        self.layers, self.norm = layers, norm


class EncoderDecoder(_Plain):
    """The encoder-decoder transformer (``nn.Transformer``'s layout, pre-norm): ``memory(src,
    positions)`` encodes, ``forward(ids, positions, memory, memory_positions, cache=None)``
    decodes. ``state_dict()`` keys: ``source_embedding.weight``, ``target_embedding.weight``,
    ``encoder.layers.{i}.*``, ``encoder.norm.*``, ``decoder.layers.{i}.*``,
    ``decoder.norm.*``, ``output_projection.weight``."""

    def __init__(self, config: TransformerConfig, params, *, device=None, dtype=None,
                 kernels: Kernels | None = None):  # fmt: skip
        super().__init__(config, params, "seq2seq", dtype=dtype, kernels=kernels)
        Norm, kw = self.kernels.norm(config), {"device": device, "dtype": self.dtype}
        self.source_embedding = _Embedding(config, params, "source_embedding.weight", **kw)
        self.target_embedding = _Embedding(config, params, "target_embedding.weight", **kw)
        self.encoder = _Stack(self._layers(config, params, "encoder.layers.", EncoderLayer, **kw),
                              Norm(config, params, prefix="encoder.norm.", **kw))  # fmt: skip
        self.decoder = _Stack(self._layers(config, params, "decoder.layers.", DecoderLayer, **kw),
                              Norm(config, params, prefix="decoder.norm.", **kw))  # fmt: skip
        V, D = config.vocab_size, config.d_model
        self.output_projection = linear(params, "output_projection.", V, D, bias=False, **kw)

    def memory(self, src: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The encoder: ``src (B,S)`` ids at ``positions (B,S)`` -> memory ``(B,S,D)``, each
        token seeing every real token of its row (both ways)."""
        x = self.source_embedding(src)  # (B,S,D)
        masks = self._masks(positions, positions, causal=False)
        for layer, mask in zip(self.encoder.layers, masks, strict=True):
            x = layer(x, positions, mask)  # (B,S,D)
        return self.encoder.norm(x)

    def forward(self, ids, positions, memory, memory_positions, cache=None) -> torch.Tensor:
        """The decoder: ``ids (B,T)`` at ``positions (B,T)`` over ``memory (B,S,D)`` of the
        source at ``memory_positions (B,S)`` -> logits ``(B,T,V)``; ``cache`` as in
        ``Transformer.forward`` (it also keeps the memory's keys: later calls may pass None)."""
        x = self.target_embedding(ids)  # (B,T,D)
        keys = positions if cache is None else cache.extend(positions)  # (B,S)
        cross = visible(positions, memory_positions, causal=False)  # (B,1,T,S): real sources
        masks = self._masks(positions, keys)  # (B,1,T,S) a layer
        for i, (layer, mask) in enumerate(zip(self.decoder.layers, masks, strict=True)):
            x = layer(x, positions, mask, memory, cross, cache, i)  # (B,T,D)
        return self.output_projection(self.decoder.norm(x))  # (B,T,D) -> (B,T,V)


# ----------------------------------------------------------------------------- the public models


class DecoderOnlyTransformer(public.DecoderOnly, Transformer):
    """The decoder-only model a user calls, with the methods every rung shares
    (``levels.common.public.DecoderOnly``): ``forward(tokens (B,T), *, valid=None) -> logits
    (B,T,V)`` (also ``model(tokens)``, ``nn.Module``'s call), ``logits``, ``prefill``,
    ``decode_step``, ``extend``, ``generate`` and ``stream``, taking tensors, numpy or lists.
    The plain pass stays reachable as ``transformer``: an engine calls it with positions it
    holds."""

    transformer = Transformer.forward


class Seq2SeqTransformer(public.Seq2Seq, EncoderDecoder):
    """The encoder-decoder model a user calls, with the methods every rung shares
    (``levels.common.public.Seq2Seq``): ``forward(src (B,S), tgt_in (B,T), *, src_valid=None,
    tgt_valid=None) -> (B,T,V)``, ``logits``, ``encode``, ``prefill``, ``decode_step`` and
    ``generate``, over ``memory`` and ``EncoderDecoder.forward`` (``transformer``)."""

    transformer = EncoderDecoder.forward
