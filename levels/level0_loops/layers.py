"""The transformer's pieces at level 0: LayerNorm, the feed-forward, attention, the two blocks.

Every class computes through ``self.ops``, the level's array functions
(``linear``, ``layer_norm``, ``attention``, ...). Here that is level 0's loops
(``ops.py``); level 1 subclasses these classes with ``ops`` set to numpy, and
level 1's training builds them with ``ops=`` a recording tape. A module hands
its own ``ops`` to every module it builds, the way level 2 hands down its
``kernels``, so one model computes with one set of ops throughout.

Parameters come from the canonical dict (``levels.common.params``) and are
converted once, at construction, with ``ops.asarray``. Dropout is not applied:
levels 0 and 1 are inference references (level 1 trains with dropout 0), so
``config.dropout`` is accepted and ignored.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ..common.config import TransformerConfig
from ..common.params import attention_shapes, check_params, feed_forward_shapes, norm_shapes
from ..common.positions import ragged_window
from . import ops as loops

Native = Any  # the level's array type: nested lists here, np.ndarray at level 1


class Module:
    """Base of every piece and model: the ops, the device and dtype, parameter loading.

    ``ops`` is a class attribute (level 0's loops here; level 1's classes set
    numpy's) that the ``ops=`` argument overrides for one instance.
    """

    ops: ModuleType = loops

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

    def _key_mask(self, valid, *, T: int | None = None, window: int | None = None) -> Native | None:
        """Key validity ``valid (B,S)`` (True = real token) -> a mask ``(B,1,1,S)``, the same
        for every head and query; None when every key is real (nothing to mask).

        With a sliding ``window`` over self-attention (``T`` new queries, the last
        ``T`` of the ``S`` keys), a query at a padded position may also see the
        padded keys of its window, ``(B,1,T,S)``: its window may hold no real key,
        and its output is zeroed anyway (real queries never see padded keys).
        """
        if valid is None:
            return None
        valid = np.asarray(self.ops.to_numpy(valid))
        if valid.all():
            return None
        mask = valid[:, None, None, :]  # (B,1,1,S)
        if window is not None:
            mask = mask | ~valid[:, None, valid.shape[1] - T :, None]  # (B,1,T,S)
        return self.ops.asarray(mask)


class LayerNorm(Module):
    """``nn.LayerNorm(D)``: ``(..., D) -> (..., D)``; reads ``{prefix}weight`` (and ``{prefix}bias``)."""

    def __init__(self, config, params, *, prefix="", ops=None, device=None, dtype=None):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        p = self._load(params, prefix, norm_shapes(config, ""))
        self.weight, self.bias = p["weight"], p.get("bias")  # (D,), (D,) or None

    def __call__(self, x: Native) -> Native:
        return self.ops.layer_norm(x, self.weight, self.bias, self.config.norm_eps)


class RMSNorm(Module):
    """RMSNorm: ``x / sqrt(mean(x^2) + eps) * weight``, ``(..., D) -> (..., D)``; reads ``{prefix}weight``."""

    def __init__(self, config, params, *, prefix="", ops=None, device=None, dtype=None):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        self.weight = self._load(params, prefix, norm_shapes(config, ""))["weight"]  # (D,)

    def __call__(self, x: Native) -> Native:
        return self.ops.rms_norm(x, self.weight, self.config.norm_eps)


def norm_class(config: TransformerConfig) -> type[LayerNorm] | type[RMSNorm]:
    """The norm a model of ``config`` uses (``config.norm``)."""
    return RMSNorm if config.norm == "rmsnorm" else LayerNorm


class FeedForward(Module):
    """The position-wise feed-forward network: ``(..., D) -> (..., F) -> (..., D)``.

    ``linear2(GELU(linear1(x)))`` with the exact (erf) GELU, or with ``ffn="swiglu"``
    ``linear2(silu(linear_gate(x)) * linear1(x))`` (Shazeer 2020: a gated unit).
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
        if self.w_gate is None:
            h = ops.gelu(h)
        else:
            h = ops.mul(ops.silu(ops.linear(x, self.w_gate, self.b_gate)), h)  # (..., F)
        return ops.linear(h, self.w2, self.b2)  # (..., D)


class MultiHeadAttention(Module):
    """``nn.MultiheadAttention`` with PyTorch's parameter layout, optionally with RoPE and GQA.

    ``mha(x, kv=None, *, mask=None, causal=False, window=None, position_offset=0,
    cache=None, index=0)``: ``x (B,T,D)`` attends to ``kv (B,S,D)`` (None: to
    itself) -> ``(B,T,D)``. ``in_proj_weight (D + 2 Hkv Dh, D)`` holds rows
    ``[q; k; v]``: ``H`` query heads, ``Hkv`` key/value heads. With ``rope=True``
    queries and keys are rotated at positions ``position_offset + t``. With a
    ``cache`` (self-attention), the new keys and values go into layer ``index``
    of the cache and the queries attend over everything it holds.
    """

    def __init__(self, config, params, *, prefix="", rope=False, ops=None, device=None, dtype=None):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        D, Dkv = config.d_model, config.kv_heads * config.d_head
        p = self._load(params, prefix, attention_shapes(config, ""))
        w, b = p["in_proj_weight"], p.get("in_proj_bias")  # (D + 2 Dkv, D), rows [q; k; v]
        rows = (slice(0, D), slice(D, D + Dkv), slice(D + Dkv, D + 2 * Dkv))
        self.w_q, self.w_k, self.w_v = (w[r] for r in rows)  # (D, D), (Dkv, D), (Dkv, D)
        self.b_q, self.b_k, self.b_v = (None,) * 3 if b is None else (b[r] for r in rows)
        self.w_o, self.b_o = p["out_proj.weight"], p.get("out_proj.bias")  # (D, D), (D,)
        self.rope_base = config.rope_base if rope else None
        self.n_heads, self.n_kv_heads = config.n_heads, config.kv_heads

    def heads(self, x, w, b, n_heads: int, position_offset: int | None) -> Native:
        """``x (B,L,D)`` projected by ``w``, split into ``n_heads`` heads ``(B,n,L,Dh)``,
        rotated when RoPE is on and ``position_offset`` is given."""
        ops = self.ops
        h = ops.split_heads(ops.linear(x, w, b), n_heads)  # (B,L,n*Dh) -> (B,n,L,Dh)
        if self.rope_base is None or position_offset is None:
            return h
        return ops.rope(h, position_offset, self.rope_base)

    def keys_values(self, source: Native) -> tuple[Native, Native]:
        """``source (B,S,D)`` -> ``k, v (B,Hkv,S,Dh)``, unrotated (cross-attention's memory)."""
        return (
            self.heads(source, self.w_k, self.b_k, self.n_kv_heads, None),
            self.heads(source, self.w_v, self.b_v, self.n_kv_heads, None),
        )

    def attend(self, q, k, v, *, mask=None, causal=False, window=None) -> Native:
        """``q (B,H,T,Dh)``, ``k, v (B,Hkv,S,Dh)`` -> ``(B,T,D)``: the core, heads merged, out_proj."""
        ops = self.ops
        o = ops.attention(q, k, v, causal=causal, mask=mask, window=window)  # (B,H,T,Dh)
        return ops.linear(ops.merge_heads(o), self.w_o, self.b_o)  # (B,T,D)

    def __call__(
        self,
        x,
        kv=None,
        *,
        mask=None,
        causal=False,
        window=None,
        position_offset=0,
        cache=None,
        index=0,
    ):
        source = x if kv is None else kv
        q = self.heads(x, self.w_q, self.b_q, self.n_heads, position_offset)  # (B,H,T,Dh)
        k = self.heads(source, self.w_k, self.b_k, self.n_kv_heads, position_offset)  # (B,Hkv,S,Dh)
        v = self.heads(source, self.w_v, self.b_v, self.n_kv_heads, None)  # (B,Hkv,S,Dh)
        if cache is not None:
            k, v = cache.append(index, k, v)  # (B,Hkv,length+T,Dh)
        return self.attend(q, k, v, mask=mask, causal=causal, window=window)


class EncoderLayer(Module):
    """A pre-norm ``nn.TransformerEncoderLayer``; also the decoder-only model's block (causal).

    ``layer(x, *, valid=None, causal=False, ...)``: ``x (B,T,D)``, ``valid (B,S)``
    the real keys (``S = T``, or the cache's length + T) -> ``(B,T,D)``. Reads
    ``{prefix}norm1``, ``self_attn``, ``norm2`` and the feed-forward's linears.
    Self-attention uses RoPE when ``config.positional == "rope"`` (``rope=``
    overrides) and ``config.window`` as its sliding window.
    """

    def __init__(self, config, params, *, prefix="", rope=None, ops=None, device=None, dtype=None):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        if rope is None:  # a block of a RoPE model rotates its self-attention
            rope = config.positional == "rope"
        kw = self._children()
        Norm = norm_class(config)
        self.norm1 = Norm(config, params, prefix=f"{prefix}norm1.", **kw)
        self.self_attn = MultiHeadAttention(
            config, params, prefix=f"{prefix}self_attn.", rope=rope, **kw
        )
        self.norm2 = Norm(config, params, prefix=f"{prefix}norm2.", **kw)
        self.ff = FeedForward(config, params, prefix=prefix, **kw)

    def _self_attention(self, x, valid, causal, position_offset, cache, index) -> Native:
        """``x + SelfAttn(norm1(x))``: ``x (B,T,D)`` over the cached keys and its own."""
        T = len(x[0])
        # Padding may sit between a ragged row's slots: then the window counts positions.
        by_position, window = ragged_window(valid, T, self.config.window, cache)
        if by_position is None:
            mask = self._key_mask(valid, T=T, window=window)
        else:
            mask = self.ops.asarray(by_position)
        h = self.self_attn(
            self.norm1(x),
            mask=mask,
            causal=causal,
            window=window,
            position_offset=position_offset,
            cache=cache,
            index=index,
        )
        return self.ops.add(x, h)  # (B,T,D)

    def __call__(self, x, *, valid=None, causal=False, position_offset=0, cache=None, index=0):
        """``x + SelfAttn(norm1(x))``, then ``x + FFN(norm2(x))``; ``cache`` as in ``MultiHeadAttention``."""
        x = self._self_attention(x, valid, causal, position_offset, cache, index)
        return self.ops.add(x, self.ff(self.norm2(x)))  # (B,T,D)


class DecoderLayer(EncoderLayer):
    """A pre-norm ``nn.TransformerDecoderLayer``: causal self-attention, cross-attention, FFN.

    ``layer(x, memory, *, valid=None, memory_valid=None, ...)``: ``x (B,T,D)``,
    ``memory (B,S,D)``, real target keys ``valid``, real source keys
    ``memory_valid (B,S)`` -> ``(B,T,D)``. Reads ``{prefix}norm1``, ``self_attn``,
    ``norm2``, ``multihead_attn``, ``norm3`` and the feed-forward's linears.
    """

    def __init__(self, config, params, *, prefix="", rope=None, ops=None, device=None, dtype=None):
        super().__init__(
            config, params, prefix=prefix, rope=rope, ops=ops, device=device, dtype=dtype
        )
        kw = self._children()
        # Cross-attention never rotates: memory and target positions belong to different sequences.
        self.multihead_attn = MultiHeadAttention(
            config, params, prefix=f"{prefix}multihead_attn.", **kw
        )
        self.norm3 = norm_class(config)(config, params, prefix=f"{prefix}norm3.", **kw)

    def __call__(
        self, x, memory, *, valid=None, memory_valid=None, position_offset=0, cache=None, index=0
    ):
        """``x + SelfAttn(norm1(x))``, ``x + CrossAttn(norm2(x), memory)``, ``x + FFN(norm3(x))``.

        With a ``cache`` the memory's keys and values are computed on the first
        call and kept in ``cache.cross[index]`` (``memory`` may then be None).
        """
        add = self.ops.add
        x = self._self_attention(x, valid, True, position_offset, cache, index)
        cross = self.multihead_attn
        if cache is not None and cache.cross[index] is not None:
            k, v = cache.cross[index]  # (B,Hkv,S,Dh) each
        else:
            k, v = cross.keys_values(memory)  # (B,Hkv,S,Dh) each
            if cache is not None:
                cache.cross[index] = (k, v)
        q = cross.heads(self.norm2(x), cross.w_q, cross.b_q, cross.n_heads, None)  # (B,H,T,Dh)
        x = add(x, cross.attend(q, k, v, mask=self._key_mask(memory_valid)))  # (B,T,D)
        return add(x, self.ff(self.norm3(x)))  # (B,T,D)
