"""The pieces: RoPE, feed-forward, multi-head attention and the two pre-norm blocks.

Every class is built from the canonical parameter dict and registers its
parameters under the canonical names, so ``state_dict()`` matches PyTorch's
``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` (``norm_first=True``).
The attention core and the LayerNorm class come from ``self.kernels``
(a ``Kernels``): the class attribute by default, or the ``kernels=`` argument.
"""

from __future__ import annotations

from functools import lru_cache, partial

import torch
import torch.nn.functional as F
from torch import nn

from ..common.config import TransformerConfig
from .arrays import fetch, linear
from .kernels import LEVEL2_KERNELS, Kernels


def rope_tables(
    start: int, stop: int, d_head: int, base: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin (stop - start, Dh)`` float64 for positions ``start..stop-1``, laid out
    for ``apply_rope``: feature ``2i`` and ``2i+1`` of a row hold pair ``i``'s angle,
    ``sin`` negated on the even features.

    Angle of pair ``i`` at position ``p``: ``p * base^(-2i/Dh)``. Computed in
    float64: at position 1000 a float32 angle is off by ~6e-5 rad, visible
    against the float64 reference; callers cast only the finished cos/sin.
    """
    pos = torch.arange(start, stop, dtype=torch.float64)  # (T,)
    inv_freq = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (Dh/2,)
    angles = (pos[:, None] * inv_freq[None, :]).repeat_interleave(2, dim=-1)  # (T, Dh)
    sign = torch.tensor([-1.0, 1.0], dtype=torch.float64).repeat(d_head // 2)  # (Dh,) -+-+...
    return angles.cos(), angles.sin() * sign


@lru_cache(maxsize=8)
def _whole_tables(stop: int, d_head: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope_tables(0, stop, ...)``, computed once for the layers that share a base (30 of
    SmolLM2's, two bases in Gemma 3): each layer casts its own copy (``.to``), never writes
    into these."""
    return rope_tables(0, stop, d_head, base)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent feature pairs of ``x (B,H,T,Dh)`` by the tables of ``rope_tables``,
    ``cos, sin (T, Dh)`` (or ``(B,1,T,Dh)``, one set of positions per row).

    Pair ``i`` is ``(x[2i], x[2i+1]) = (a, b)``, mapped to ``(a cos - b sin, b cos + a sin)``.
    Written as ``x * cos + flip(x) * sin`` with ``flip(a, b) = (b, a)`` and ``sin``'s even
    features negated: ``(a cos + b (-sin), b cos + a sin)``, the same numbers to the bit
    (negation is exact), in six tensor operations instead of a dozen, which is what a
    decode step of one token pays for.
    """
    if cos.dtype != x.dtype or cos.device != x.device:
        cos = cos.to(device=x.device, dtype=x.dtype)  # (T, Dh) or (B,1,T,Dh)
        sin = sin.to(device=x.device, dtype=x.dtype)
    flipped = x.unflatten(-1, (x.shape[-1] // 2, 2)).flip(-1).flatten(-2)  # (B,H,T,Dh): (b, a)
    return x * cos + flipped * sin  # (B,H,T,Dh)


def rope(x: torch.Tensor, position_offset: int, base: float) -> torch.Tensor:
    """RoPE on ``x (B,H,T,Dh)`` at positions ``position_offset + t`` (tables built on the spot)."""
    T, Dh = x.shape[-2], x.shape[-1]
    return apply_rope(x, *rope_tables(position_offset, position_offset + T, Dh, base))


def feed_forward_linears(
    config: TransformerConfig, params, prefix: str, *, device=None, dtype=None
) -> dict[str, nn.Linear]:
    """``linear1 (F, D)`` and ``linear2 (D, F)`` (and the gate of SwiGLU and GeGLU,
    ``linear_gate (F, D)``) from ``{prefix}linear1.*`` and so on.

    A block registers these directly as ``self.linear1``, ``self.linear2`` (where
    PyTorch keeps them) and ``self.linear_gate``, and ``FeedForward`` does the
    same, so both share this loader and ``feed_forward`` below instead of nesting
    a submodule.
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
    """The position-wise feed-forward network (GELU, or SwiGLU or GeGLU as ``config.ffn``
    says), reading ``{prefix}linear1.*``, ``{prefix}linear2.*`` (and ``{prefix}linear_gate.*``)."""

    def __init__(
        self, config: TransformerConfig, params, *, prefix: str = "", device=None, dtype=None
    ):
        super().__init__()
        # option ffn: the gate ``feed_forward`` applies (GATES)
        self.dropout_p, self.ffn = config.dropout, config.ffn
        for name, layer in feed_forward_linears(
            config, params, prefix, device=device, dtype=dtype
        ).items():
            setattr(self, name, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return feed_forward(self, x)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with ``nn.MultiheadAttention``'s parameters, and grouped-query attention.

    ``in_proj_weight (H Dh + 2 Hkv Dh, D)`` holds rows ``[q; k; v]``: ``H`` query
    heads and ``Hkv = config.kv_heads`` key/value heads (``3D`` rows when
    ``Hkv = H`` and ``H Dh = D``); ``out_proj`` is a linear ``(D, H Dh)``.
    ``config.qk_norm`` normalises each head of q and k (``q_norm``, ``k_norm``, of
    the kernels' norm class, ``Dh`` wide) before RoPE. ``rope=True`` rotates q and
    k (self-attention of the models) with base ``rope_base`` (None:
    ``config.rope_base``). The core is ``self.kernels.attention``, scaled by
    ``config.attn_scale`` when set.
    """

    kernels: Kernels = LEVEL2_KERNELS

    def __init__(
        self,
        config: TransformerConfig,
        params,
        *,
        prefix: str = "",
        device=None,
        dtype=None,
        rope: bool = False,
        rope_base: float | None = None,
        kernels: Kernels | None = None,
    ):
        super().__init__()
        if kernels is not None:
            self.kernels = kernels
        D, Dq = config.d_model, config.q_width
        # option n_kv_heads: Hkv key/value heads, each shared by H // Hkv query heads (GQA)
        self.n_heads, self.n_kv_heads, self.d_head = config.n_heads, config.kv_heads, config.d_head
        rows = Dq + 2 * self.n_kv_heads * self.d_head
        self.rope_base = (config.rope_base if rope_base is None else rope_base) if rope else None
        # option attn_scale: what the scores are multiplied by (Gemma); None: 1 / sqrt(Dh)
        self.dropout_p, self.scale = config.dropout, config.attn_scale
        kw = {"device": device, "dtype": dtype}
        if rope:
            # cos/sin for positions [0, max_seq_len), built once (float64 maths,
            # stored in the compute dtype) instead of at every decoding step; each layer
            # its own, at its base. Not persistent: state_dict() holds only the parameters.
            cos, sin = _whole_tables(config.max_seq_len, self.d_head, self.rope_base)
            to = {"device": device, "dtype": dtype or torch.float32}
            self.register_buffer("rope_cos", cos.to(**to), persistent=False)  # (max_seq_len, Dh)
            self.register_buffer("rope_sin", sin.to(**to), persistent=False)  # (max_seq_len, Dh)
        self.in_proj_weight = fetch(params, f"{prefix}in_proj_weight", (rows, D), **kw)
        # option qkv_bias, out_bias: biases apart from ``bias`` (Qwen2: q, k and v only)
        if config.has_qkv_bias:
            self.in_proj_bias = fetch(params, f"{prefix}in_proj_bias", (rows,), **kw)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = linear(params, f"{prefix}out_proj.", D, Dq, bias=config.has_out_bias, **kw)
        # option qk_norm: a norm over each head's Dh features of q and k, before RoPE (Gemma 3)
        self.q_norm = self.k_norm = None
        if config.qk_norm:
            Norm, width = self.kernels.norm(config), self.d_head
            self.q_norm = Norm(config, params, prefix=f"{prefix}q_norm.", width=width, **kw)
            self.k_norm = Norm(config, params, prefix=f"{prefix}k_norm.", width=width, **kw)

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

    def _tables(self, position_offset: int | torch.Tensor, L: int):
        """RoPE's ``cos, sin`` for ``L`` positions from ``position_offset`` (an int, or one per
        row ``(B,)`` for prompts of different lengths): ``(L, Dh)`` or ``(B,1,L,Dh)``; None
        past ``max_seq_len`` (only a bare piece gets there; ``rope`` builds its own)."""
        if isinstance(position_offset, torch.Tensor):
            positions = position_offset[:, None] + torch.arange(L, device=position_offset.device)
            return self.rope_cos[positions][:, None], self.rope_sin[positions][:, None]
        if position_offset + L > self.rope_cos.shape[0]:
            return None
        return (
            self.rope_cos.narrow(0, position_offset, L),
            self.rope_sin.narrow(0, position_offset, L),
        )

    def _rotate(self, x: torch.Tensor, position_offset: int | torch.Tensor, tables=None):
        """RoPE on ``x (B,n,L,Dh)`` at positions ``position_offset + t``, when RoPE is on
        (``tables``: this call's ``_tables``, when the caller has them already)."""
        if self.rope_base is None:
            return x
        tables = tables or self._tables(position_offset, x.shape[-2])
        if tables is None:
            return rope(x, position_offset, self.rope_base)
        return apply_rope(x, *tables)

    def _normed(self, x: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
        """QK-norm of ``x (B,n,L,Dh)`` over each head's features (as it is without one)."""
        return x if norm is None else norm(x)

    def queries(self, x: torch.Tensor, position_offset: int = 0, tables=None) -> torch.Tensor:
        """``x (B,T,D)`` -> ``q (B,H,T,Dh)``, normed (QK-norm) and rotated when RoPE is on."""
        q = self._normed(self._project(x, (0,))[0], self.q_norm)  # (B,H,T,Dh)
        return self._rotate(q, position_offset, tables)

    def keys_values(
        self, kv: torch.Tensor, position_offset: int = 0, tables=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv (B,S,D)`` -> ``k, v (B,Hkv,S,Dh)``; k normed (QK-norm) and rotated when RoPE is on."""
        k, v = self._project(kv, (1, 2))  # (B,Hkv,S,Dh) each
        return self._rotate(self._normed(k, self.k_norm), position_offset, tables), v

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        window: int | None = None,
    ) -> torch.Tensor:
        """Attention core over heads, heads merged, ``out_proj``: -> ``(B,T,D)``."""
        extra = {"dropout_p": self.dropout_p} if self.training and self.dropout_p > 0 else {}
        if self.scale is not None:  # passed only when set: a kernel without one runs the rest
            extra["scale"] = self.scale
        o = self.kernels.attention(q, k, v, causal=causal, mask=mask, window=window, **extra)
        B, H, T, Dh = o.shape  # (B,H,T,Dh)
        o = o.transpose(1, 2).reshape(B, T, H * Dh)  # (B,H,T,Dh) -> (B,T,H,Dh) -> (B,T,H Dh)
        return self.out_proj(o)  # (B,T,H Dh) -> (B,T,D)

    def forward(
        self,
        x: torch.Tensor,
        kv: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        window: int | None = None,
        position_offset: int = 0,
        cache=None,
        index: int = 0,
    ) -> torch.Tensor:
        """``x (B,T,D)`` attends to ``kv (B,S,D)`` (``None``: to itself) -> ``(B,T,D)``.

        ``mask`` broadcastable to ``(B,H,T,S)``, True = may attend. Queries and
        keys are numbered from ``position_offset`` for RoPE. With ``cache``
        (self-attention only), the new keys and values go into layer ``index``
        of the cache and the queries attend over everything filled so far.
        """
        if kv is None:  # self-attention: q, k and v in one matmul, q and k rotated alike
            tables = self._tables(position_offset, x.shape[1]) if self.rope_base else None
            q, k, v = self._project(x, (0, 1, 2))  # (B,H,T,Dh), (B,Hkv,T,Dh) x 2
            q, k = self._normed(q, self.q_norm), self._normed(k, self.k_norm)
            q, k = (
                self._rotate(q, position_offset, tables),
                self._rotate(k, position_offset, tables),
            )
        else:
            q = self.queries(x, position_offset)  # (B,H,T,Dh)
            k, v = self.keys_values(kv, position_offset)  # (B,Hkv,S,Dh)
        if cache is not None:
            k, v = cache.append(index, k, v)  # (B,Hkv,length+T,Dh)
        return self.attend(q, k, v, mask=mask, causal=causal, window=window)


class EncoderLayer(nn.Module):
    """Pre-norm block ``x + SelfAttn(norm1(x))``, then ``x + FFN(norm2(x))``: ``(B,T,D) -> (B,T,D)``.

    Also the decoder-only model's block, called with ``causal=True``. Dropout
    (training only) follows the attention output and the FFN, as in PyTorch.
    Self-attention uses RoPE when ``config.positional == "rope"`` (``rope=``
    overrides) with base ``rope_base`` (None: ``config.rope_base``; a model passes
    each layer's, ``config.rope_base_of``); the window is the one the model's step
    passes; the norms are ``config.norm``'s class from ``self.kernels``. With
    ``config.post_norms`` each sublayer's output is normed too (``post_norm1``,
    ``post_norm2``) before it joins the stream: ``x + post_norm1(SelfAttn(norm1(x)))``.
    """

    kernels: Kernels = LEVEL2_KERNELS

    def __init__(
        self,
        config: TransformerConfig,
        params,
        *,
        prefix: str = "",
        device=None,
        dtype=None,
        rope: bool | None = None,
        rope_base: float | None = None,
        kernels: Kernels | None = None,
    ):
        super().__init__()
        if kernels is not None:
            self.kernels = kernels
        if rope is None:  # a block of a RoPE model rotates its self-attention
            rope = config.positional == "rope"
        kw = {"device": device, "dtype": dtype}
        Norm = self.kernels.norm(config)
        # option ffn: the gate ``feed_forward`` applies (GATES)
        self.dropout_p, self.ffn = config.dropout, config.ffn
        self.norm1 = Norm(config, params, prefix=f"{prefix}norm1.", **kw)
        self.self_attn = MultiHeadAttention(
            config,
            params,
            prefix=f"{prefix}self_attn.",
            rope=rope,
            rope_base=rope_base,
            kernels=self.kernels,
            **kw,
        )
        self.norm2 = Norm(config, params, prefix=f"{prefix}norm2.", **kw)
        for name, layer in feed_forward_linears(config, params, prefix, **kw).items():
            setattr(self, name, layer)  # linear1, linear2 (and linear_gate), as PyTorch names them
        # option post_norms: a norm after each sublayer as well as before it (Gemma 2 and 3)
        self.post_norm1 = self.post_norm2 = None  # identities without config.post_norms
        if config.post_norms:
            self.post_norm1 = Norm(config, params, prefix=f"{prefix}post_norm1.", **kw)
            self.post_norm2 = Norm(config, params, prefix=f"{prefix}post_norm2.", **kw)

    def _dropout(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.dropout_p == 0:
            return x  # what F.dropout returns then, without the call
        return F.dropout(x, p=self.dropout_p, training=True)

    def _residual(self, x: torch.Tensor, h: torch.Tensor, post_norm) -> torch.Tensor:
        """``x + dropout(h)``, or ``x + dropout(post_norm(h))`` with ``config.post_norms``."""
        return x + self._dropout(h if post_norm is None else post_norm(h))  # (B,T,D)

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        window: int | None = None,
        position_offset: int | torch.Tensor = 0,
        cache=None,
        index: int = 0,
    ) -> torch.Tensor:
        """``x + dropout(SelfAttn(norm1(x)))``, then ``x + dropout(FFN(norm2(x)))``: ``(B,T,D)``.

        ``mask`` (True = may attend) and ``window`` are what the model's step says the
        queries may see (``levels.common.boundary``); queries and keys sit at positions
        ``position_offset + t`` (an int, or one per row). With ``cache``, ``x`` holds the
        ``T`` newest positions, whose keys and values go into layer ``index`` of it.
        """
        x = self._self_attention(x, mask, causal, window, position_offset, cache, index)
        return self._residual(x, feed_forward(self, self.norm2(x)), self.post_norm2)  # (B,T,D)

    def _self_attention(self, x, mask, causal, window, position_offset, cache, index):
        """``x + dropout(SelfAttn(norm1(x)))``: ``(B,T,D)``."""
        h = self.self_attn(
            self.norm1(x),
            mask=mask,
            causal=causal,
            window=window,
            position_offset=position_offset,
            cache=cache,
            index=index,
        )  # (B,T,D)
        return self._residual(x, h, self.post_norm1)


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
        # option post_norms: a norm after each sublayer as well as before it (Gemma 2 and 3)
        self.post_norm3 = None  # post_norm2 follows the cross-attention here, post_norm3 the FFN
        if config.post_norms:
            self.post_norm3 = Norm(config, params, prefix=f"{prefix}post_norm3.", **kw)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None,
        *,
        mask: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        window: int | None = None,
        position_offset: int | torch.Tensor = 0,
        cache=None,
        index: int = 0,
    ) -> torch.Tensor:
        """``x (B,T,D)``, ``memory (B,S,D)`` -> ``(B,T,D)``.

        ``mask`` and ``window`` as ``EncoderLayer``'s (causal); ``memory_mask`` the real
        source keys, ``(B,1,1,S)``. With ``cache``, the cross-attention keys and values of
        ``memory`` are computed on the first call and reused after (``memory`` may then
        be ``None``).
        """
        x = self._self_attention(x, mask, True, window, position_offset, cache, index)
        cross = self.multihead_attn
        if cache is not None and cache.cross[index] is not None:
            k, v = cache.cross[index]  # (B,Hkv,S,Dh) each
        else:
            k, v = cross.keys_values(memory)  # (B,Hkv,S,Dh) each
            if cache is not None:
                cache.cross[index] = (k, v)
        h = cross.attend(cross.queries(self.norm2(x)), k, v, mask=memory_mask)
        x = self._residual(x, h, self.post_norm2)  # (B,T,D)
        return self._residual(x, feed_forward(self, self.norm3(x)), self.post_norm3)  # (B,T,D)
