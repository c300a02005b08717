"""The transformer's pieces at level 0: LayerNorm, the feed-forward, attention, the two blocks.

Every class computes through ``self.ops``, the level's array functions
(``linear``, ``layer_norm``, ``attention``, ...). Here that is level 0's loops
(``ops.py``); level 1 subclasses these classes with ``ops`` set to numpy, and
level 1's training builds them with ``ops=`` a recording tape. A module hands
its own ``ops`` to every module it builds, the way level 2 hands down its
``kernels``, so one model computes with one set of ops throughout. The class a
block builds its attention from is a class attribute too (``EncoderLayer.Attention``),
as are the model's block and cache (``models.py``): a learner's rung subclasses
the piece it writes and names it there (docs/your_rung.md).

Parameters come from the canonical dict (``levels.common.params``) and are
converted once, at construction, with ``ops.asarray``. Dropout is not applied:
levels 0 and 1 are inference references (level 1 trains with dropout 0), so
``config.dropout`` is accepted and ignored.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..common.config import TransformerConfig
from ..common.params import attention_shapes, check_params, feed_forward_shapes, norm_shapes
from . import ops as loop_ops

Native = Any  # the level's array type: nested lists here, np.ndarray at level 1


class Module:
    """Base of every piece and model: the ops, the device and dtype, parameter loading.

    ``ops`` is a class attribute (level 0's loops here; level 1's classes set
    numpy's) that the ``ops=`` argument overrides for one instance.
    """

    ops: ModuleType = loop_ops

    def __init__(self, config: TransformerConfig, *, ops=None, device=None, dtype=None):
        if ops is not None:
            self.ops = ops
        # A device or dtype the level lacks is refused by ops.asarray, at the first parameter.
        self.config, self.device, self.dtype = config, device, dtype

    def _children(self) -> dict[str, Any]:
        """What every module this one builds receives: the same ops, device and dtype."""
        return {"ops": self.ops, "device": self.device, "dtype": self.dtype}

    def _load(self, params, prefix: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Native]:
        """Check and convert ``params[prefix + name]`` for every ``name`` of ``shapes``.

        ``shapes`` are the canonical ones of this piece (``levels.common.params``),
        so an entry the config leaves out (a bias with ``bias=False``) is simply
        absent and comes back as ``None`` from ``.get``. Missing or mis-shaped
        entries are one ``ValueError`` listing them; other entries of ``params``
        (the rest of a model) are ignored.
        """
        wanted = {prefix + name: shape for name, shape in shapes.items()}
        present = {name: params[name] for name in wanted if name in params}
        check_params(present, wanted, what=f"parameters of {type(self).__name__}")
        return {name: self._native(params[prefix + name]) for name in shapes}

    def _native(self, array) -> Native:
        """A numpy array in this level's array type, device and dtype."""
        return self.ops.asarray(array, device=self.device, dtype=self.dtype)


class LayerNorm(Module):
    """``nn.LayerNorm(N)``: ``(..., N) -> (..., N)``; reads ``{prefix}weight`` (and ``{prefix}bias``).

    ``N`` is ``width``: ``D`` by default, ``Dh`` for QK-norm. The gain is
    ``config.norm_weight_offset + weight``.
    """

    def __init__(self, config, params, *, prefix="", width=None, ops=None, device=None, dtype=None):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        p = self._load(params, prefix, norm_shapes(config, "", width))
        self.weight, self.bias = p["weight"], p.get("bias")  # (N,), (N,) or None

    def __call__(self, x: Native) -> Native:
        c = self.config  # option norm_weight_offset: the gain is offset + weight (Gemma)
        return self.ops.layer_norm(x, self.weight, self.bias, c.norm_eps, c.norm_weight_offset)


class RMSNorm(Module):
    """RMSNorm: ``x / sqrt(mean(x^2) + eps) * (offset + weight)``, ``(..., N) -> (..., N)``;
    reads ``{prefix}weight``. ``N`` and the offset as in ``LayerNorm``."""

    def __init__(self, config, params, *, prefix="", width=None, ops=None, device=None, dtype=None):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        self.weight = self._load(params, prefix, norm_shapes(config, "", width))["weight"]  # (N,)

    def __call__(self, x: Native) -> Native:
        c = self.config  # option norm_weight_offset: the gain is offset + weight (Gemma)
        return self.ops.rms_norm(x, self.weight, c.norm_eps, c.norm_weight_offset)


def norm_class(config: TransformerConfig) -> type[LayerNorm] | type[RMSNorm]:
    """The norm a model of ``config`` uses (``config.norm``)."""
    # option norm: RMSNorm (Llama and most models since) instead of LayerNorm
    return RMSNorm if config.norm == "rmsnorm" else LayerNorm


class FeedForward(Module):
    """The position-wise feed-forward network: ``(..., D) -> (..., F) -> (..., D)``.

    ``linear2(GELU(linear1(x)))`` with the exact (erf) GELU, or with ``ffn="swiglu"``
    ``linear2(silu(linear_gate(x)) * linear1(x))`` (Shazeer 2020: a gated unit), or with
    ``ffn="geglu"`` the same gate through GELU's tanh approximation (Gemma).
    Reads ``{prefix}linear1.*``, ``{prefix}linear2.*`` (and ``{prefix}linear_gate.*``).
    """

    def __init__(self, config, params, *, prefix="", ops=None, device=None, dtype=None):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        p = self._load(params, prefix, feed_forward_shapes(config, ""))
        self.w1, self.b1 = p["linear1.weight"], p.get("linear1.bias")  # (F, D), (F,)
        self.w2, self.b2 = p["linear2.weight"], p.get("linear2.bias")  # (D, F), (D,)
        self.w_gate, self.b_gate = p.get("linear_gate.weight"), p.get("linear_gate.bias")  # (F, D)

    def __call__(self, x: Native) -> Native:
        ops = self.ops
        h = ops.linear(x, self.w1, self.b1)  # (..., F)
        # option ffn: a gated unit, SwiGLU (Llama) or GeGLU (Gemma), instead of GELU
        if self.w_gate is None:
            h = ops.gelu(h)
        else:
            gate = ops.linear(x, self.w_gate, self.b_gate)  # (..., F)
            act = ops.silu if self.config.ffn == "swiglu" else ops.gelu_tanh
            h = ops.mul(act(gate), h)  # (..., F)
        return ops.linear(h, self.w2, self.b2)  # (..., D)


class MultiHeadAttention(Module):
    """``nn.MultiheadAttention`` with PyTorch's parameter layout, optionally with RoPE and GQA.

    ``mha(x, positions, mask, cache=None, index=0)``: self-attention of ``x (B,T,D)``
    -> ``(B,T,D)``. ``positions (B,T)`` are what RoPE rotates by; ``mask`` says what the
    queries may see, ``(B,1,T,S)``, True = may attend; with a ``cache`` the new keys and
    values go into layer ``index`` of it, and the queries attend over all it holds.
    ``in_proj_weight (H Dh + 2 Hkv Dh, D)`` holds rows ``[q; k; v]``: ``H`` query heads,
    ``Hkv`` key/value heads (``H Dh = D`` unless ``config.head_dim`` says otherwise). With
    ``config.qk_norm`` each head of q and k is normalised (``q_norm``, ``k_norm``) before
    RoPE. ``rope=True`` rotates q and k by ``rope_base`` (None: ``config.rope_base``).
    Cross-attention is ``attend(queries(x), *keys_values(memory), mask)``, unrotated.
    """

    def __init__(
        self,
        config,
        params,
        *,
        prefix="",
        rope=False,
        rope_base=None,
        ops=None,
        device=None,
        dtype=None,
    ):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        # option n_kv_heads: Hkv key/value heads, each shared by H // Hkv query heads (GQA)
        Dq, Dkv = config.q_width, config.kv_heads * config.d_head
        p = self._load(params, prefix, attention_shapes(config, ""))
        # option qkv_bias, out_bias: each bias is there when the config says (attention_shapes)
        w, b = p["in_proj_weight"], p.get("in_proj_bias")  # (Dq + 2 Dkv, D), rows [q; k; v]
        rows = (slice(0, Dq), slice(Dq, Dq + Dkv), slice(Dq + Dkv, Dq + 2 * Dkv))
        self.w_q, self.w_k, self.w_v = (w[r] for r in rows)  # (Dq, D), (Dkv, D), (Dkv, D)
        self.b_q, self.b_k, self.b_v = (None,) * 3 if b is None else (b[r] for r in rows)
        self.w_o, self.b_o = p["out_proj.weight"], p.get("out_proj.bias")  # (D, Dq), (D,)
        # option qk_norm: a norm over each head's Dh features of q and k, before RoPE (Gemma 3)
        self.q_norm = self.k_norm = None
        if config.qk_norm:
            Norm, kw = norm_class(config), self._children()
            self.q_norm = Norm(config, params, prefix=f"{prefix}q_norm.", width=config.d_head, **kw)
            self.k_norm = Norm(config, params, prefix=f"{prefix}k_norm.", width=config.d_head, **kw)
        self.rope_base = (config.rope_base if rope_base is None else rope_base) if rope else None
        # option attn_scale: what the scores are multiplied by (Gemma); None: 1 / sqrt(Dh)
        self.scale = config.attn_scale
        self.n_heads, self.n_kv_heads = config.n_heads, config.kv_heads

    def __call__(self, x, positions=None, mask=None, cache=None, index=0):
        q = self.queries(x, positions)  # (B,H,T,Dh)
        k, v = self.keys_values(x, positions)  # (B,Hkv,T,Dh) each
        if cache is not None:
            k, v = cache.update(index, k, v)  # (B,Hkv,S,Dh): every key the cache holds
        return self.attend(q, k, v, mask)

    def heads(self, x, w, b, n_heads: int, positions=None, norm=None) -> Native:
        """``x (B,L,D)`` projected by ``w``, split into ``n_heads`` heads ``(B,n,L,Dh)``,
        each normalised by ``norm`` (QK-norm) and then rotated to ``positions (B,L)``,
        when RoPE is on and they are given."""
        ops = self.ops
        h = ops.split_heads(ops.linear(x, w, b), n_heads)  # (B,L,n*Dh) -> (B,n,L,Dh)
        if norm is not None:
            h = norm(h)  # (B,n,L,Dh), over each head's Dh features
        if self.rope_base is None or positions is None:
            return h
        return ops.rope(h, positions, self.rope_base)

    def queries(self, x, positions=None) -> Native:
        """``x (B,T,D)`` -> ``q (B,H,T,Dh)``, normed (QK-norm) and rotated to ``positions``."""
        return self.heads(x, self.w_q, self.b_q, self.n_heads, positions, self.q_norm)

    def keys_values(self, source, positions=None) -> tuple[Native, Native]:
        """``source (B,S,D)`` -> ``k, v (B,Hkv,S,Dh)``; k normed and rotated to ``positions``
        (None: unrotated, as cross-attention's memory is)."""
        return (
            self.heads(source, self.w_k, self.b_k, self.n_kv_heads, positions, self.k_norm),
            self.heads(source, self.w_v, self.b_v, self.n_kv_heads),
        )

    def attend(self, q, k, v, mask=None) -> Native:
        """``q (B,H,T,Dh)``, ``k, v (B,Hkv,S,Dh)`` -> ``(B,T,D)``: the core, heads merged, out_proj."""
        ops = self.ops
        o = ops.attend(q, k, v, mask=mask, scale=self.scale)  # (B,H,T,Dh)
        return ops.linear(ops.merge_heads(o), self.w_o, self.b_o)  # (B,H,T,Dh) -> (B,T,D)


class EncoderLayer(Module):
    """A pre-norm ``nn.TransformerEncoderLayer``; also the decoder-only model's block.

    ``layer(x, positions, mask, cache=None, index=0)``: ``x (B,T,D)`` -> ``(B,T,D)``,
    ``x + SelfAttn(norm1(x))`` then ``x + FFN(norm2(x))``; ``positions``, ``mask`` and
    ``cache`` as ``MultiHeadAttention``'s (the mask says causal or not: the model built
    it). Reads ``{prefix}norm1``, ``self_attn``, ``norm2`` and the feed-forward's linears
    (and with ``config.post_norms`` ``post_norm1`` and ``post_norm2``, applied to each
    sublayer's output). Self-attention uses RoPE when ``config.positional == "rope"``
    (``rope=`` overrides), with base ``rope_base`` (None: ``config.rope_base``; a model
    passes each layer's, ``config.rope_base_of``).
    """

    Attention = MultiHeadAttention  # the attention it builds (a learner's rung names its own)

    def __init__(
        self,
        config,
        params,
        *,
        prefix="",
        rope=None,
        rope_base=None,
        ops=None,
        device=None,
        dtype=None,
    ):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        if rope is None:  # a block of a RoPE model rotates its self-attention
            rope = config.positional == "rope"
        kw = self._children()
        Norm = norm_class(config)
        self.norm1 = Norm(config, params, prefix=f"{prefix}norm1.", **kw)
        self.self_attn = self.Attention(
            config, params, prefix=f"{prefix}self_attn.", rope=rope, rope_base=rope_base, **kw
        )
        self.norm2 = Norm(config, params, prefix=f"{prefix}norm2.", **kw)
        self.ff = FeedForward(config, params, prefix=prefix, **kw)
        # option post_norms: a norm after each sublayer as well as before it (Gemma 2 and 3)
        self.post_norm1 = self.post_norm2 = None  # identities without config.post_norms
        if config.post_norms:
            self.post_norm1 = Norm(config, params, prefix=f"{prefix}post_norm1.", **kw)
            self.post_norm2 = Norm(config, params, prefix=f"{prefix}post_norm2.", **kw)

    def __call__(self, x, positions=None, mask=None, cache=None, index=0):
        h = self.self_attn(self.norm1(x), positions, mask, cache, index)  # (B,T,D)
        x = self._residual(x, h, self.post_norm1)
        return self._residual(x, self.ff(self.norm2(x)), self.post_norm2)  # (B,T,D)

    def _residual(self, x, h, post_norm) -> Native:
        """``x + h``, or ``x + post_norm(h)`` with ``config.post_norms``: ``(B,T,D)``."""
        return self.ops.add(x, h if post_norm is None else post_norm(h))


class DecoderLayer(EncoderLayer):
    """A pre-norm ``nn.TransformerDecoderLayer``: causal self-attention, cross-attention, FFN.

    ``layer(x, positions, mask, memory, memory_mask, cache=None, index=0)``: ``x (B,T,D)``,
    ``memory (B,S,D)``, ``memory_mask`` the real source keys ``(B,1,1,S)`` -> ``(B,T,D)``.
    Reads ``{prefix}norm1``, ``self_attn``, ``norm2``, ``multihead_attn``, ``norm3`` and
    the feed-forward's linears (and ``post_norm1..3`` with ``config.post_norms``). With a
    ``cache`` the memory's keys and values are computed on the first call and kept in
    ``cache.cross[index]`` (``memory`` may then be None).
    """

    def __init__(self, config, params, *, prefix="", **options):
        """``EncoderLayer``'s arguments (``options``: ``rope``, ``rope_base``, ``ops``,
        ``device``, ``dtype``), and the cross-attention and its norm."""
        super().__init__(config, params, prefix=prefix, **options)
        kw = self._children()
        Norm = norm_class(config)
        # Cross-attention never rotates: memory and target positions belong to different sequences.
        self.multihead_attn = self.Attention(
            config, params, prefix=f"{prefix}multihead_attn.", **kw
        )
        self.norm3 = Norm(config, params, prefix=f"{prefix}norm3.", **kw)
        # option post_norms: a norm after each sublayer as well as before it (Gemma 2 and 3)
        # (post_norm2 follows the cross-attention here, post_norm3 the FFN)
        self.post_norm3 = None
        if config.post_norms:
            self.post_norm3 = Norm(config, params, prefix=f"{prefix}post_norm3.", **kw)

    def __call__(self, x, positions, mask, memory, memory_mask, cache=None, index=0):
        h = self.self_attn(self.norm1(x), positions, mask, cache, index)  # (B,T,D)
        x = self._residual(x, h, self.post_norm1)
        cross = self.multihead_attn
        if cache is None:
            k, v = cross.keys_values(memory)  # (B,Hkv,S,Dh) each
        else:  # computed once a generation
            k, v = cache.memory_keys(index, lambda: cross.keys_values(memory))
        h = cross.attend(cross.queries(self.norm2(x)), k, v, memory_mask)  # (B,T,D)
        x = self._residual(x, h, self.post_norm2)
        return self._residual(x, self.ff(self.norm3(x)), self.post_norm3)  # (B,T,D)
