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
from ..common.params import check_params
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

        Names ending in ``bias`` are skipped when ``config.bias`` is False and
        come back as ``None``. Missing or mis-shaped entries are one
        ``ValueError`` listing them; other entries of ``params`` (the rest of a
        model) are ignored.
        """
        wanted = {
            prefix + name: shape
            for name, shape in shapes.items()
            if self.config.bias or not name.endswith("bias")
        }
        present = {name: params[name] for name in wanted if name in params}
        check_params(present, wanted, what=f"parameters of {type(self).__name__}")
        return {
            name: self._native(params[prefix + name]) if prefix + name in wanted else None
            for name in shapes
        }

    def _native(self, array) -> Native:
        """A numpy array in this level's array type, device and dtype."""
        return self.ops.asarray(array, device=self.device, dtype=self.dtype)

    def _key_mask(self, valid) -> Native | None:
        """Key validity ``valid (B,S)`` (True = real token) -> a mask ``(B,1,1,S)``, the same
        for every head and query; None when every key is real (nothing to mask)."""
        if valid is None:
            return None
        valid = np.asarray(self.ops.to_numpy(valid))
        return None if valid.all() else self.ops.asarray(valid[:, None, None, :])


class LayerNorm(Module):
    """``nn.LayerNorm(D)``: ``(..., D) -> (..., D)``; reads ``{prefix}weight`` and ``{prefix}bias``."""

    def __init__(self, config, params, *, prefix="", ops=None, device=None, dtype=None):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        D = config.d_model
        p = self._load(params, prefix, {"weight": (D,), "bias": (D,)})
        self.weight, self.bias = p["weight"], p["bias"]  # (D,), (D,) or None

    def __call__(self, x: Native) -> Native:
        return self.ops.layer_norm(x, self.weight, self.bias, self.config.norm_eps)


class FeedForward(Module):
    """``linear2(GELU(linear1(x)))``: ``(..., D) -> (..., F) -> (..., D)``, exact (erf) GELU.

    Reads ``{prefix}linear1.*`` and ``{prefix}linear2.*`` (``prefix`` is the block's).
    """

    def __init__(self, config, params, *, prefix="", ops=None, device=None, dtype=None):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        D, F = config.d_model, config.d_ff
        p = self._load(
            params,
            prefix,
            {
                "linear1.weight": (F, D),
                "linear1.bias": (F,),
                "linear2.weight": (D, F),
                "linear2.bias": (D,),
            },
        )
        self.w1, self.b1 = p["linear1.weight"], p["linear1.bias"]  # (F, D), (F,)
        self.w2, self.b2 = p["linear2.weight"], p["linear2.bias"]  # (D, F), (D,)

    def __call__(self, x: Native) -> Native:
        ops = self.ops
        return ops.linear(ops.gelu(ops.linear(x, self.w1, self.b1)), self.w2, self.b2)


class MultiHeadAttention(Module):
    """``nn.MultiheadAttention`` with PyTorch's parameter layout, optionally with RoPE.

    ``mha(x, kv=None, *, mask=None, causal=False, position_offset=0, cache=None, index=0)``:
    ``x (B,T,D)`` attends to ``kv (B,S,D)`` (None: to itself) -> ``(B,T,D)``.
    ``in_proj_weight (3D, D)`` holds rows ``[q; k; v]``. With ``rope=True``
    queries and keys are rotated at positions ``position_offset + t``. With a
    ``cache`` (self-attention), the new keys and values go into layer ``index``
    of the cache and the queries attend over everything it holds.
    """

    def __init__(self, config, params, *, prefix="", rope=False, ops=None, device=None, dtype=None):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        D = config.d_model
        p = self._load(
            params,
            prefix,
            {
                "in_proj_weight": (3 * D, D),
                "in_proj_bias": (3 * D,),
                "out_proj.weight": (D, D),
                "out_proj.bias": (D,),
            },
        )
        w, b = p["in_proj_weight"], p["in_proj_bias"]  # (3D, D) rows [q; k; v], (3D,)
        self.w_q, self.w_k, self.w_v = w[:D], w[D : 2 * D], w[2 * D :]  # (D, D) each
        self.b_q, self.b_k, self.b_v = (
            (None,) * 3 if b is None else (b[:D], b[D : 2 * D], b[2 * D :])
        )
        self.w_o, self.b_o = p["out_proj.weight"], p["out_proj.bias"]  # (D, D), (D,)
        self.rope_base = config.rope_base if rope else None
        self.n_heads = config.n_heads

    def heads(self, x: Native, w: Native, b: Native | None, position_offset: int) -> Native:
        """``x (B,L,D)`` projected by ``w``, split into heads ``(B,H,L,Dh)``, rotated if RoPE is on."""
        ops = self.ops
        h = ops.split_heads(ops.linear(x, w, b), self.n_heads)  # (B,L,D) -> (B,H,L,Dh)
        return h if self.rope_base is None else ops.rope(h, position_offset, self.rope_base)

    def keys_values(self, source: Native) -> tuple[Native, Native]:
        """``source (B,S,D)`` -> ``k, v (B,H,S,Dh)``, unrotated (cross-attention's memory)."""
        ops = self.ops
        k = ops.split_heads(ops.linear(source, self.w_k, self.b_k), self.n_heads)
        v = ops.split_heads(ops.linear(source, self.w_v, self.b_v), self.n_heads)
        return k, v

    def attend(self, q: Native, k: Native, v: Native, *, mask=None, causal=False) -> Native:
        """``q (B,H,T,Dh)``, ``k, v (B,H,S,Dh)`` -> ``(B,T,D)``: the core, heads merged, out_proj."""
        ops = self.ops
        o = ops.attention(q, k, v, causal=causal, mask=mask)  # (B,H,T,Dh)
        return ops.linear(ops.merge_heads(o), self.w_o, self.b_o)  # (B,T,D)

    def __call__(
        self, x, kv=None, *, mask=None, causal=False, position_offset=0, cache=None, index=0
    ):
        source = x if kv is None else kv
        q = self.heads(x, self.w_q, self.b_q, position_offset)  # (B,H,T,Dh)
        k = self.heads(source, self.w_k, self.b_k, position_offset)  # (B,H,S,Dh)
        v = self.ops.split_heads(self.ops.linear(source, self.w_v, self.b_v), self.n_heads)
        if cache is not None:
            k, v = cache.append(index, k, v)  # (B,H,length+T,Dh)
        return self.attend(q, k, v, mask=mask, causal=causal)


class EncoderLayer(Module):
    """A pre-norm ``nn.TransformerEncoderLayer``; also the decoder-only model's block (causal).

    ``layer(x, *, valid=None, causal=False, ...)``: ``x (B,T,D)``, ``valid (B,S)``
    the real keys (``S = T``, or the cache's length + T) -> ``(B,T,D)``. Reads ``{prefix}norm1``,
    ``self_attn``, ``norm2``, ``linear1``, ``linear2``. Self-attention uses RoPE when
    ``config.positional == "rope"`` (``rope=`` overrides).
    """

    def __init__(self, config, params, *, prefix="", rope=None, ops=None, device=None, dtype=None):
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        if rope is None:  # a block of a RoPE model rotates its self-attention
            rope = config.positional == "rope"
        kw = self._children()
        self.norm1 = LayerNorm(config, params, prefix=f"{prefix}norm1.", **kw)
        self.self_attn = MultiHeadAttention(
            config, params, prefix=f"{prefix}self_attn.", rope=rope, **kw
        )
        self.norm2 = LayerNorm(config, params, prefix=f"{prefix}norm2.", **kw)
        self.ff = FeedForward(config, params, prefix=prefix, **kw)

    def __call__(self, x, *, valid=None, causal=False, position_offset=0, cache=None, index=0):
        """``x + SelfAttn(LN1(x))``, then ``x + FFN(LN2(x))``; ``cache`` as in ``MultiHeadAttention``."""
        add = self.ops.add
        h = self.self_attn(
            self.norm1(x),
            mask=self._key_mask(valid),
            causal=causal,
            position_offset=position_offset,
            cache=cache,
            index=index,
        )
        x = add(x, h)  # (B,T,D)
        return add(x, self.ff(self.norm2(x)))  # (B,T,D)


class DecoderLayer(EncoderLayer):
    """A pre-norm ``nn.TransformerDecoderLayer``: causal self-attention, cross-attention, FFN.

    ``layer(x, memory, *, valid=None, memory_valid=None, ...)``: ``x (B,T,D)``,
    ``memory (B,S,D)``, real target keys ``valid``, real source keys
    ``memory_valid (B,S)`` -> ``(B,T,D)``. Reads ``{prefix}norm1``, ``self_attn``,
    ``norm2``, ``multihead_attn``, ``norm3``, ``linear1``, ``linear2``.
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
        self.norm3 = LayerNorm(config, params, prefix=f"{prefix}norm3.", **kw)

    def __call__(
        self, x, memory, *, valid=None, memory_valid=None, position_offset=0, cache=None, index=0
    ):
        """``x + SelfAttn(LN1(x))``, ``x + CrossAttn(LN2(x), memory)``, ``x + FFN(LN3(x))``.

        With a ``cache`` the memory's keys and values are computed on the first
        call and kept in ``cache.cross[index]`` (``memory`` may then be None).
        """
        add = self.ops.add
        h = self.self_attn(
            self.norm1(x),
            mask=self._key_mask(valid),
            causal=True,
            position_offset=position_offset,
            cache=cache,
            index=index,
        )
        x = add(x, h)  # (B,T,D)
        cross = self.multihead_attn
        if cache is not None and cache.cross[index] is not None:
            k, v = cache.cross[index]  # (B,H,S,Dh) each
        else:
            k, v = cross.keys_values(memory)  # (B,H,S,Dh) each
            if cache is not None:
                cache.cross[index] = (k, v)
        q = cross.heads(self.norm2(x), cross.w_q, cross.b_q, 0)  # (B,H,T,Dh), never rotated
        x = add(x, cross.attend(q, k, v, mask=self._key_mask(memory_valid)))  # (B,T,D)
        return add(x, self.ff(self.norm3(x)))  # (B,T,D)
