"""An independent float64 reference for the whole model, written as plainly as possible.

Every level is compared against these functions. They import no level and
share no code with one: plain numpy in float64, one function per piece of the
architecture in SPEC.md, the parameters read straight from the canonical dict
by name. Speed is not a goal; obviousness is.

Conventions (the same as the levels'):

* masks are boolean, True = may attend;
* ``causal`` is bottom-right aligned: query ``i`` may attend key ``j`` iff
  ``j <= i + (S - T)``;
* every linear computes ``x @ W.T + b``; ``in_proj_weight`` stacks rows
  ``[q; k; v]``;
* ``valid`` is a ``(B, T)`` mask of real tokens; logits at padded positions
  are exactly zero.
"""

from __future__ import annotations

import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def causal_mask(T: int, S: int) -> np.ndarray:
    """``(T, S)`` bool, bottom-right aligned: True where ``j <= i + (S - T)``."""
    i = np.arange(T)[:, None]  # (T, 1)
    j = np.arange(S)[None, :]  # (1, S)
    return j <= i + (S - T)


def attention(q, k, v, *, causal=False, mask=None, scale=None) -> np.ndarray:
    """Softmax attention. ``q (B,H,T,Dh)``, ``k (B,H,S,Dh)``, ``v (B,H,S,Dv)`` -> ``(B,H,T,Dv)``.

    Raises ``ValueError`` when some query row may attend no key at all.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    T, S, Dh = q.shape[-2], k.shape[-2], q.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(Dh)
    allowed = np.ones((T, S), dtype=bool)
    if causal:
        allowed = allowed & causal_mask(T, S)
    if mask is not None:
        allowed = allowed & np.asarray(mask, dtype=bool)
    allowed = np.broadcast_to(allowed, q.shape[:-2] + (T, S))  # (B,H,T,S)
    if not allowed.any(axis=-1).all():
        raise ValueError("a query row has no key it may attend to")
    scores = (q @ np.swapaxes(k, -1, -2)) * scale  # (B,H,T,Dh) @ (B,H,Dh,S) -> (B,H,T,S)
    scores = np.where(allowed, scores, -np.inf)
    # Subtracting the row maximum changes nothing mathematically and keeps exp() <= 1.
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)  # exp(-inf) = 0 for the masked keys
    weights = weights / weights.sum(axis=-1, keepdims=True)
    return weights @ v  # (B,H,T,S) @ (B,H,S,Dv) -> (B,H,T,Dv)


def layer_norm(x, weight, bias=None, eps=1e-5) -> np.ndarray:
    """LayerNorm over the last axis with the biased variance, as ``nn.LayerNorm``."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps) * weight
    return y if bias is None else y + bias


def gelu(x) -> np.ndarray:
    """Exact GELU: ``x * Phi(x) = x/2 * (1 + erf(x / sqrt(2)))``."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def linear(x, weight, bias=None) -> np.ndarray:
    """``x (..., in) @ weight.T (in, out) + bias (out)`` -> ``(..., out)``."""
    y = x @ weight.T
    return y if bias is None else y + bias


def rope(x, positions, base=10000.0) -> np.ndarray:
    """Rotate adjacent feature pairs of ``x (..., T, Dh)`` by ``pos * base^(-2i/Dh)``.

    Pair ``i`` is ``(x[2i], x[2i+1]) = (a, b)``; it becomes
    ``(a cos - b sin, a sin + b cos)``, i.e. ``x cos + (-b, a) sin``.
    ``positions`` is ``(T,)``.
    """
    Dh = x.shape[-1]
    i = np.arange(Dh // 2)
    inv_freq = base ** (-2.0 * i / Dh)  # (Dh/2,)
    angle = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (T, Dh/2)
    cos, sin = np.cos(angle), np.sin(angle)
    a, b = x[..., 0::2], x[..., 1::2]  # (..., T, Dh/2) each
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def _get(params, name):
    return params.get(name)


def mha(
    params,
    prefix,
    x,
    kv=None,
    *,
    n_heads,
    mask=None,
    causal=False,
    rope_base=None,
    position_offset=0,
) -> np.ndarray:
    """Multi-head attention with ``nn.MultiheadAttention``'s parameters under ``prefix``.

    ``x (B,T,D)``, ``kv (B,S,D)`` (None: self-attention) -> ``(B,T,D)``.
    ``mask`` broadcasts to ``(B,H,T,S)``; ``rope_base`` not None rotates q and k
    at positions ``position_offset + arange``.
    """
    kv = x if kv is None else kv
    B, T, D = x.shape
    S = kv.shape[1]
    H = n_heads
    Dh = D // H
    W = params[prefix + "in_proj_weight"]  # (3D, D)
    b = _get(params, prefix + "in_proj_bias")  # (3D,) or None
    bq, bk, bv = (None, None, None) if b is None else (b[:D], b[D : 2 * D], b[2 * D :])
    q = linear(x, W[:D], bq)  # (B,T,D)
    k = linear(kv, W[D : 2 * D], bk)  # (B,S,D)
    v = linear(kv, W[2 * D :], bv)  # (B,S,D)
    q = q.reshape(B, T, H, Dh).transpose(0, 2, 1, 3)  # (B,H,T,Dh)
    k = k.reshape(B, S, H, Dh).transpose(0, 2, 1, 3)  # (B,H,S,Dh)
    v = v.reshape(B, S, H, Dh).transpose(0, 2, 1, 3)  # (B,H,S,Dh)
    if rope_base is not None:
        q = rope(q, position_offset + np.arange(T), rope_base)
        k = rope(k, position_offset + np.arange(S), rope_base)
    o = attention(q, k, v, causal=causal, mask=mask)  # (B,H,T,Dh)
    o = o.transpose(0, 2, 1, 3).reshape(B, T, D)  # (B,T,D)
    return linear(o, params[prefix + "out_proj.weight"], _get(params, prefix + "out_proj.bias"))


def _norm(params, prefix, x, eps):
    return layer_norm(x, params[prefix + "weight"], _get(params, prefix + "bias"), eps)


def feed_forward(params, prefix, x) -> np.ndarray:
    """``linear2(GELU(linear1(x)))`` with the weights under ``prefix``: ``(..., D) -> (..., D)``."""
    h = linear(x, params[prefix + "linear1.weight"], _get(params, prefix + "linear1.bias"))
    return linear(gelu(h), params[prefix + "linear2.weight"], _get(params, prefix + "linear2.bias"))


def _key_mask(valid):
    """``valid (B,S)`` -> a key mask ``(B,1,1,S)``, or None."""
    return None if valid is None else np.asarray(valid, bool)[:, None, None, :]


def encoder_layer(config, params, prefix, x, *, valid=None, causal=False, rope=None):
    """One pre-norm block: ``x + SelfAttn(LN1(x))`` then ``+ FFN(LN2(x))``. ``x (B,T,D)``.

    ``rope`` None follows ``config.positional``.
    """
    use_rope = (config.positional == "rope") if rope is None else rope
    h = _norm(params, prefix + "norm1.", x, config.norm_eps)
    x = x + mha(
        params,
        prefix + "self_attn.",
        h,
        n_heads=config.n_heads,
        mask=_key_mask(valid),
        causal=causal,
        rope_base=config.rope_base if use_rope else None,
    )
    h = _norm(params, prefix + "norm2.", x, config.norm_eps)
    return x + feed_forward(params, prefix, h)


def decoder_layer(config, params, prefix, x, memory, *, valid=None, memory_valid=None, rope=None):
    """Causal self-attention, cross-attention over ``memory (B,S,D)``, FFN; ``x (B,T,D)``."""
    use_rope = (config.positional == "rope") if rope is None else rope
    h = _norm(params, prefix + "norm1.", x, config.norm_eps)
    x = x + mha(
        params,
        prefix + "self_attn.",
        h,
        n_heads=config.n_heads,
        mask=_key_mask(valid),
        causal=True,
        rope_base=config.rope_base if use_rope else None,
    )
    h = _norm(params, prefix + "norm2.", x, config.norm_eps)
    x = x + mha(
        params,
        prefix + "multihead_attn.",
        h,
        memory,
        n_heads=config.n_heads,
        mask=_key_mask(memory_valid),
    )
    h = _norm(params, prefix + "norm3.", x, config.norm_eps)
    return x + feed_forward(params, prefix, h)


def _embed(table, tokens, d_model):
    return table[np.asarray(tokens)] * math.sqrt(d_model)  # (B,T,D)


def _default_valid(config, tokens, valid):
    return np.asarray(tokens) != config.pad_id if valid is None else np.asarray(valid, bool)


def decoder_only_forward(config, params, tokens, *, valid=None) -> np.ndarray:
    """Logits ``(B,T,V)`` of the decoder-only model; zero at padded positions."""
    valid = _default_valid(config, tokens, valid)
    x = _embed(params["token_embedding.weight"], tokens, config.d_model)
    for i in range(config.n_layers):
        x = encoder_layer(config, params, f"layers.{i}.", x, valid=valid, causal=True)
    x = _norm(params, "norm.", x, config.norm_eps)
    logits = x @ params["token_embedding.weight"].T  # (B,T,D) @ (D,V) -> (B,T,V), tied
    return np.where(valid[..., None], logits, 0.0)


def encode(config, params, src, *, src_valid=None) -> np.ndarray:
    """Encoder memory ``(B,S,D)`` of the seq2seq model (bidirectional, RoPE per config)."""
    src_valid = _default_valid(config, src, src_valid)
    x = _embed(params["source_embedding.weight"], src, config.d_model)
    for i in range(config.n_layers):
        x = encoder_layer(config, params, f"encoder.layers.{i}.", x, valid=src_valid)
    return _norm(params, "encoder.norm.", x, config.norm_eps)


def seq2seq_forward(config, params, src, tgt_in, *, src_valid=None, tgt_valid=None):
    """Logits ``(B,T,V)`` of the seq2seq model; zero at padded target positions."""
    src_valid = _default_valid(config, src, src_valid)
    tgt_valid = _default_valid(config, tgt_in, tgt_valid)
    memory = encode(config, params, src, src_valid=src_valid)
    x = _embed(params["target_embedding.weight"], tgt_in, config.d_model)
    for i in range(config.n_layers):
        x = decoder_layer(
            config,
            params,
            f"decoder.layers.{i}.",
            x,
            memory,
            valid=tgt_valid,
            memory_valid=src_valid,
        )
    x = _norm(params, "decoder.norm.", x, config.norm_eps)
    logits = x @ params["output_projection.weight"].T  # (B,T,D) @ (D,V) -> (B,T,V)
    return np.where(tgt_valid[..., None], logits, 0.0)


def greedy_decoder_only(config, params, prefix, max_new_tokens) -> np.ndarray:
    """Greedy continuation by full forwards; ties go to the lowest id. ``(B,P) -> (B,P+n)``."""
    tokens = np.asarray(prefix, dtype=np.int64)
    for _ in range(max_new_tokens):
        logits = decoder_only_forward(config, params, tokens, valid=np.ones(tokens.shape, bool))
        nxt = logits[:, -1].argmax(axis=-1)
        tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
    return tokens


def greedy_seq2seq(config, params, src, max_new_tokens, *, src_valid=None) -> np.ndarray:
    """Greedy decoding from BOS; each row stops at EOS and is padded after. ``-> (B, 1+n)``."""
    B = np.asarray(src).shape[0]
    out = np.full((B, 1), config.bos_id, dtype=np.int64)
    done = np.zeros(B, dtype=bool)
    for _ in range(max_new_tokens):
        if done.all():
            break
        logits = seq2seq_forward(
            config, params, src, out, src_valid=src_valid, tgt_valid=np.ones(out.shape, bool)
        )
        nxt = np.where(done, config.pad_id, logits[:, -1].argmax(axis=-1))
        done |= nxt == config.eos_id
        out = np.concatenate([out, nxt[:, None]], axis=1)
    return out
