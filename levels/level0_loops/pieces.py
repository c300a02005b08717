"""The transformer's pieces, written once against an ops namespace.

Every class here computes only through ``self.ops`` (the level's array
primitives: ``linear``, ``layer_norm``, ``attention``, ...) and turns the
canonical numpy parameters into the level's arrays with ``self.convert``.
Level 0 binds them to its loops (``ops.py``), level 1 to numpy; see ``bind.py``.
So these classes are the architecture of both levels, and a change of
arithmetic never needs a change here.

Dropout is not applied: levels 0 and 1 are inference-only references, so
``config.dropout`` is accepted and ignored.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

from ..common.config import TransformerConfig
from ..common.params import check_params

Native = Any  # the level's array type


class Component:
    """Base of every piece and model.

    ``ops``, ``convert`` and ``classes`` are class attributes set by ``bind``:
    the array primitives, the numpy converters (``asarray``, ``to_numpy``,
    ``check_device``), and the level's own piece classes, so that a block
    builds children of the same level.
    """

    ops: ModuleType
    convert: ModuleType
    classes: SimpleNamespace

    def _setup(self, config: TransformerConfig, device: object, dtype: object) -> None:
        self.config = config
        self.device = device
        self.dtype = dtype
        self.convert.check_device(device)

    def _native(self, array: Any) -> Native:
        return self.convert.asarray(array, device=self.device, dtype=self.dtype)

    def _load(
        self, params: dict[str, Any], prefix: str, shapes: dict[str, tuple[int, ...]]
    ) -> dict[str, Native]:
        """Check and convert the entries ``prefix + name`` for every ``name`` in ``shapes``.

        Names ending in ``bias`` are left out when ``config.bias`` is False, and come
        back as ``None``. Missing or mis-shaped entries are one ``ValueError``
        listing them; other entries of ``params`` (the rest of a model) are ignored.
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


class LayerNorm(Component):
    """``nn.LayerNorm(D)``: ``(..., D) -> (..., D)``; reads ``{prefix}weight`` and ``{prefix}bias``."""

    def __init__(self, config, params, *, prefix="", device=None, dtype=None):
        self._setup(config, device, dtype)
        D = config.d_model
        p = self._load(params, prefix, {"weight": (D,), "bias": (D,)})
        self.weight, self.bias = p["weight"], p["bias"]  # (D,), (D,) or None

    def __call__(self, x: Native) -> Native:
        return self.ops.layer_norm(x, self.weight, self.bias, self.config.norm_eps)


class FeedForward(Component):
    """``linear2(GELU(linear1(x)))``, ``(..., D) -> (..., F) -> (..., D)``, exact erf GELU.

    Reads ``{prefix}linear1.*`` and ``{prefix}linear2.*`` (``prefix`` is the block's).
    """

    def __init__(self, config, params, *, prefix="", device=None, dtype=None):
        self._setup(config, device, dtype)
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
        hidden = self.ops.gelu(self.ops.linear(x, self.w1, self.b1))  # (..., F)
        return self.ops.linear(hidden, self.w2, self.b2)  # (..., D)


class MultiHeadAttention(Component):
    """``nn.MultiheadAttention`` with PyTorch's parameter layout, optionally with RoPE.

    ``mha(x, kv=None, *, mask=None, causal=False, position_offset=0)``:
    ``x (B,T,D)``, ``kv (B,S,D)`` (None: self-attention) -> ``(B,T,D)``.
    With ``rope=True`` queries are rotated at positions ``position_offset + t``
    and keys at ``position_offset + s`` (meant for self-attention).

    The call is split into ``queries``, ``keys_values`` and ``attend`` so the
    models can keep keys and values in a cache and attend to them later.
    """

    def __init__(self, config, params, *, prefix="", rope=False, device=None, dtype=None):
        self._setup(config, device, dtype)
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
        self.rope = rope
        self.n_heads = config.n_heads

    def _project(self, x: Native, w: Native, b: Native | None, position_offset: int) -> Native:
        """``(B,T,D) -> (B,H,T,Dh)``, rotated when ``rope`` is on."""
        heads = self.ops.split_heads(self.ops.linear(x, w, b), self.n_heads)
        if self.rope:
            heads = self.ops.rope(heads, position_offset, self.config.rope_base)
        return heads

    def queries(self, x: Native, position_offset: int = 0) -> Native:
        """``x (B,T,D) -> q (B,H,T,Dh)``."""
        return self._project(x, self.w_q, self.b_q, position_offset)

    def keys_values(self, source: Native, position_offset: int = 0) -> tuple[Native, Native]:
        """``source (B,S,D) -> (k, v)``, each ``(B,H,S,Dh)``; only keys are rotated."""
        k = self._project(source, self.w_k, self.b_k, position_offset)
        v = self.ops.split_heads(self.ops.linear(source, self.w_v, self.b_v), self.n_heads)
        return k, v

    def attend(self, q: Native, k: Native, v: Native, *, mask=None, causal=False) -> Native:
        """``q (B,H,T,Dh)``, ``k, v (B,H,S,Dh)`` -> ``(B,T,D)`` after the output projection."""
        heads = self.ops.attention(q, k, v, causal=causal, mask=mask)  # (B,H,T,Dh)
        return self.ops.linear(self.ops.merge_heads(heads), self.w_o, self.b_o)  # (B,T,D)

    def __call__(self, x, kv=None, *, mask=None, causal=False, position_offset=0):
        q = self.queries(x, position_offset)
        k, v = self.keys_values(x if kv is None else kv, position_offset)
        return self.attend(q, k, v, mask=mask, causal=causal)


class _Block(Component):
    """What encoder and decoder blocks share: pre-norm self-attention and feed-forward."""

    def _build_common(self, config, params, prefix, rope, device, dtype) -> None:
        self._setup(config, device, dtype)
        if rope is None:  # a block of a RoPE model rotates its self-attention
            rope = config.positional == "rope"
        pieces = self.classes
        kw = {"device": device, "dtype": dtype}
        self.norm1 = pieces.LayerNorm(config, params, prefix=f"{prefix}norm1.", **kw)
        self.self_attn = pieces.MultiHeadAttention(
            config, params, prefix=f"{prefix}self_attn.", rope=rope, **kw
        )
        self.norm2 = pieces.LayerNorm(config, params, prefix=f"{prefix}norm2.", **kw)
        self.ff = pieces.FeedForward(config, params, prefix=prefix, **kw)

    def _self_attention(self, x, *, key_valid, causal, past, position_offset):
        """``x = x + SelfAttn(LN1(x))`` over the cached keys ``past`` and the new ones.

        ``x (B,T,D)``; ``past`` is ``(k, v)`` of earlier positions, each ``(B,H,P,Dh)``,
        or None; ``key_valid (B,P+T)`` (or None: every key real). Returns the new
        ``x`` and ``(k, v)`` over all ``P+T`` positions, for the cache.
        """
        ops = self.ops
        h = self.norm1(x)
        q = self.self_attn.queries(h, position_offset)  # (B,H,T,Dh)
        k, v = self.self_attn.keys_values(h, position_offset)  # (B,H,T,Dh) each
        if past is not None:
            k = ops.concat(past[0], k, axis=2)  # (B,H,P+T,Dh)
            v = ops.concat(past[1], v, axis=2)  # (B,H,P+T,Dh)
        mask = None if key_valid is None else ops.key_mask(key_valid)  # (B,1,1,P+T)
        # Bottom-right causal alignment lets the T new queries see all P cached keys.
        return ops.add(x, self.self_attn.attend(q, k, v, mask=mask, causal=causal)), (k, v)

    def _feed_forward(self, x: Native, norm: LayerNorm) -> Native:
        """``x = x + FFN(norm(x))``."""
        return self.ops.add(x, self.ff(norm(x)))


class EncoderLayer(_Block):
    """A pre-norm ``nn.TransformerEncoderLayer``; also the decoder-only model's block (causal).

    ``layer(x, *, valid=None, causal=False)``: ``x (B,T,D)``, ``valid (B,T)`` -> ``(B,T,D)``.
    Reads ``{prefix}norm1``, ``self_attn``, ``norm2``, ``linear1``, ``linear2``.
    Self-attention uses RoPE when ``config.positional == "rope"`` (``rope=`` overrides).
    """

    def __init__(self, config, params, *, prefix="", rope=None, device=None, dtype=None):
        self._build_common(config, params, prefix, rope, device, dtype)

    def step(self, x, *, key_valid=None, causal=False, past=None, position_offset=0):
        """One block over new positions; returns ``(x (B,T,D), (k, v))`` (see ``_self_attention``)."""
        x, kv = self._self_attention(
            x, key_valid=key_valid, causal=causal, past=past, position_offset=position_offset
        )
        return self._feed_forward(x, self.norm2), kv

    def __call__(self, x, *, valid=None, causal=False):
        return self.step(x, key_valid=valid, causal=causal)[0]


class DecoderLayer(_Block):
    """A pre-norm ``nn.TransformerDecoderLayer``: causal self-attention, cross-attention, FFN.

    ``layer(x, memory, *, valid=None, memory_valid=None)``: ``x (B,T,D)``,
    ``memory (B,S,D)`` -> ``(B,T,D)``. Reads ``{prefix}norm1``, ``self_attn``,
    ``norm2``, ``multihead_attn``, ``norm3``, ``linear1``, ``linear2``.
    """

    def __init__(self, config, params, *, prefix="", rope=None, device=None, dtype=None):
        self._build_common(config, params, prefix, rope, device, dtype)
        kw = {"device": device, "dtype": dtype}
        # Cross-attention never rotates: memory positions and target positions
        # are different sequences.
        self.multihead_attn = self.classes.MultiHeadAttention(
            config, params, prefix=f"{prefix}multihead_attn.", **kw
        )
        self.norm3 = self.classes.LayerNorm(config, params, prefix=f"{prefix}norm3.", **kw)

    def step(self, x, *, cross_kv, memory_valid=None, key_valid=None, past=None, position_offset=0):
        """One block over new target positions.

        ``cross_kv`` is ``multihead_attn.keys_values(memory)``, ``(k, v)`` each
        ``(B,H,S,Dh)``, computed once per source; ``memory_valid (B,S)``.
        Returns ``(x (B,T,D), (k, v))`` of the self-attention, for the cache.
        """
        x, kv = self._self_attention(
            x, key_valid=key_valid, causal=True, past=past, position_offset=position_offset
        )
        q = self.multihead_attn.queries(self.norm2(x))  # (B,H,T,Dh)
        mask = None if memory_valid is None else self.ops.key_mask(memory_valid)  # (B,1,1,S)
        x = self.ops.add(x, self.multihead_attn.attend(q, *cross_kv, mask=mask))
        return self._feed_forward(x, self.norm3), kv

    def __call__(self, x, memory, *, valid=None, memory_valid=None):
        cross_kv = self.multihead_attn.keys_values(memory)
        return self.step(x, cross_kv=cross_kv, memory_valid=memory_valid, key_valid=valid)[0]
