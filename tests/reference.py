"""An independent float64 reference for the whole model, written as plainly as possible.

Every level is compared against these functions. They import no level and
share no code with one: plain numpy in float64, one function per piece of the
architecture in docs/conventions.md, the parameters read straight from the canonical dict
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


def window_mask(T: int, S: int, W: int, *, causal: bool) -> np.ndarray:
    """``(T, S)`` bool, True where key ``j`` is inside query ``i``'s window of ``W`` keys.

    With ``d = i + (S - T)`` (the query's place among the keys, bottom-right):
    causal keeps ``d - W < j`` (with ``j <= d`` from ``causal_mask``), not causal the
    band ``|j - d| < W``.
    """
    d = np.arange(T)[:, None] + (S - T)  # (T, 1)
    j = np.arange(S)[None, :]  # (1, S)
    return (j > d - W) if causal else (np.abs(j - d) < W)


def attention(
    q, k, v, *, causal=False, mask=None, scale=None, window=None, return_lse=False
) -> np.ndarray:
    """Softmax attention. ``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)`` -> ``(B,H,T,Dv)``.

    With ``Hkv < H`` query head ``h`` reads key/value head ``h // (H // Hkv)``.
    ``return_lse`` also returns ``lse (B,H,T)``, the natural log of each row's sum
    of ``exp(score)`` over its allowed keys. Raises ``ValueError`` when some
    query row may attend no key at all.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    H, Hkv = q.shape[1], k.shape[1]
    k = np.repeat(k, H // Hkv, axis=1)  # (B,H,S,Dh): head h gets kv head h // (H // Hkv)
    v = np.repeat(v, H // Hkv, axis=1)  # (B,H,S,Dv)
    T, S, Dh = q.shape[-2], k.shape[-2], q.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(Dh)
    allowed = np.ones((T, S), dtype=bool)
    if causal:
        allowed = allowed & causal_mask(T, S)
    if window is not None:
        allowed = allowed & window_mask(T, S, window, causal=causal)
    if mask is not None:
        allowed = allowed & np.asarray(mask, dtype=bool)
    allowed = np.broadcast_to(allowed, q.shape[:-2] + (T, S))  # (B,H,T,S)
    if not allowed.any(axis=-1).all():
        raise ValueError("a query row has no key it may attend to")
    scores = (q @ np.swapaxes(k, -1, -2)) * scale  # (B,H,T,Dh) @ (B,H,Dh,S) -> (B,H,T,S)
    scores = np.where(allowed, scores, -np.inf)
    # Subtracting the row maximum changes nothing mathematically and keeps exp() <= 1.
    top = scores.max(axis=-1, keepdims=True)  # (B,H,T,1)
    weights = np.exp(scores - top)  # exp(-inf) = 0 for the masked keys
    total = weights.sum(axis=-1, keepdims=True)  # (B,H,T,1)
    out = (weights / total) @ v  # (B,H,T,S) @ (B,H,S,Dv) -> (B,H,T,Dv)
    if return_lse:
        return out, (top + np.log(total))[..., 0]  # lse = max + log sum exp(s - max)
    return out


def softmax(scores) -> np.ndarray:
    """The softmax over the last axis of ``scores (..., S)`` in float64, ``-inf`` at the keys a
    row may not see (weight exactly 0); every row holds a finite score."""
    scores = np.asarray(scores, dtype=np.float64)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))  # exp(-inf) = 0
    return e / e.sum(axis=-1, keepdims=True)


def merge(parts) -> tuple[np.ndarray, np.ndarray]:
    """Attention over the union of disjoint key sets from each set's ``(out, lse)``:
    weights ``exp(lse_i - lse)`` with ``lse = log sum_i exp(lse_i)``."""
    lse = np.logaddexp.reduce(np.stack([lse_i for _, lse_i in parts]), axis=0)  # (B,H,T)
    out = sum(np.exp(lse_i - lse)[..., None] * out_i for out_i, lse_i in parts)
    return out, lse


def layer_norm(x, weight, bias=None, eps=1e-5) -> np.ndarray:
    """LayerNorm over the last axis with the biased variance, as ``nn.LayerNorm``."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps) * weight
    return y if bias is None else y + bias


def rms_norm(x, weight, eps=1e-5) -> np.ndarray:
    """RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * weight`` (no centring, no bias)."""
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


def gelu_tanh(x) -> np.ndarray:
    """GELU's tanh approximation (Gemma's ``gelu_pytorch_tanh``):
    ``x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def silu(x) -> np.ndarray:
    """``x * sigmoid(x)``."""
    return x / (1.0 + np.exp(-x))


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
    n_kv_heads=None,
    mask=None,
    causal=False,
    window=None,
    rope_base=None,
    position_offset=0,
    d_head=None,
    scale=None,
    qk_norm=None,
) -> np.ndarray:
    """Multi-head attention with ``nn.MultiheadAttention``'s parameters under ``prefix``.

    ``x (B,T,D)``, ``kv (B,S,D)`` (None: self-attention) -> ``(B,T,D)``.
    ``in_proj_weight`` holds rows ``[q (H Dh); k (Hkv Dh); v (Hkv Dh)]``, ``Dh =
    d_head`` (None: ``D // H``). ``mask`` broadcasts to ``(B,H,T,S)``; ``rope_base``
    not None rotates q and k at positions ``position_offset + arange``; ``qk_norm``, a
    function of ``(name, heads)`` with name ``"q_norm"`` or ``"k_norm"``, normalises
    each head of q and k first; ``scale`` multiplies the scores (None: ``1/sqrt(Dh)``).
    """
    kv = x if kv is None else kv
    B, T, D = x.shape
    S = kv.shape[1]
    H = n_heads
    Hkv = n_heads if n_kv_heads is None else n_kv_heads
    Dh = D // H if d_head is None else d_head
    Dq, Dkv = H * Dh, Hkv * Dh
    W = params[prefix + "in_proj_weight"]  # (Dq + 2 Dkv, D)
    b = _get(params, prefix + "in_proj_bias")  # (Dq + 2 Dkv,) or None
    rows = (slice(0, Dq), slice(Dq, Dq + Dkv), slice(Dq + Dkv, Dq + 2 * Dkv))
    bq, bk, bv = (None, None, None) if b is None else (b[r] for r in rows)
    q = linear(x, W[rows[0]], bq)  # (B,T,Dq)
    k = linear(kv, W[rows[1]], bk)  # (B,S,Dkv)
    v = linear(kv, W[rows[2]], bv)  # (B,S,Dkv)
    q = q.reshape(B, T, H, Dh).transpose(0, 2, 1, 3)  # (B,H,T,Dh)
    k = k.reshape(B, S, Hkv, Dh).transpose(0, 2, 1, 3)  # (B,Hkv,S,Dh)
    v = v.reshape(B, S, Hkv, Dh).transpose(0, 2, 1, 3)  # (B,Hkv,S,Dh)
    if qk_norm is not None:
        q, k = qk_norm("q_norm", q), qk_norm("k_norm", k)  # over each head's Dh features
    if rope_base is not None:
        q = rope(q, position_offset + np.arange(T), rope_base)
        k = rope(k, position_offset + np.arange(S), rope_base)
    o = attention(q, k, v, causal=causal, mask=mask, scale=scale, window=window)  # (B,H,T,Dh)
    o = o.transpose(0, 2, 1, 3).reshape(B, T, Dq)  # (B,T,Dq)
    return linear(o, params[prefix + "out_proj.weight"], _get(params, prefix + "out_proj.bias"))


def norm(config, params, prefix, x) -> np.ndarray:
    """The config's norm (LayerNorm or RMSNorm) with the weights under ``prefix``; the gain
    is ``norm_weight_offset + weight`` (Gemma stores its gains as offsets from 1)."""
    gain = params[prefix + "weight"] + config.norm_weight_offset
    if config.norm == "rmsnorm":
        return rms_norm(x, gain, config.norm_eps)
    return layer_norm(x, gain, _get(params, prefix + "bias"), config.norm_eps)


def feed_forward(params, prefix, x, ffn="gelu") -> np.ndarray:
    """``linear2(GELU(linear1(x)))``, or SwiGLU ``linear2(silu(linear_gate(x)) * linear1(x))``,
    or GeGLU (``gelu_tanh`` for ``silu``), with the weights under ``prefix``: ``(..., D) -> (..., D)``."""
    h = linear(x, params[prefix + "linear1.weight"], _get(params, prefix + "linear1.bias"))
    if ffn in ("swiglu", "geglu"):
        gate = linear(
            x, params[prefix + "linear_gate.weight"], _get(params, prefix + "linear_gate.bias")
        )
        h = (silu(gate) if ffn == "swiglu" else gelu_tanh(gate)) * h
    else:
        h = gelu(h)
    return linear(h, params[prefix + "linear2.weight"], _get(params, prefix + "linear2.bias"))


def layer_window(config, layer):
    """The sliding window of layer ``layer``: none in the global layers, every
    ``window_pattern``-th one (layers ``pattern - 1``, ``2 pattern - 1``, ...)."""
    pattern = config.window_pattern
    if config.window is None or (pattern is not None and (layer + 1) % pattern == 0):
        return None
    return config.window


def layer_rope_base(config, layer):
    """RoPE's base of layer ``layer``: ``rope_local_base`` in a windowed layer, if set."""
    if layer_window(config, layer) is not None and config.rope_local_base is not None:
        return config.rope_local_base
    return config.rope_base


def _post(config, params, name, h):
    """A sublayer's output ``h`` through ``post_norm{k}`` (``name``), when the config has them."""
    return norm(config, params, name, h) if config.post_norms else h


def _key_mask(valid):
    """``valid (B,S)`` -> a key mask ``(B,1,1,S)``, or None."""
    return None if valid is None else np.asarray(valid, bool)[:, None, None, :]


def _self_attention_mask(valid, window):
    """Real keys; with a window, a query at a padded position may also see the padded keys
    of its window (its output is zeroed anyway), so that no row is empty."""
    if valid is None:
        return None
    valid = np.asarray(valid, bool)
    mask = valid[:, None, None, :]  # (B,1,1,S)
    return mask if window is None else mask | ~valid[:, None, :, None]  # (B,1,T,S)


def _attention_options(config, params, prefix):
    """The keywords of ``mha`` a config decides for the attention under ``prefix``."""

    def qk_norm(name, heads):
        return norm(config, params, f"{prefix}{name}.", heads)

    return dict(
        n_heads=config.n_heads,
        n_kv_heads=config.n_kv_heads,
        d_head=config.head_dim,
        scale=config.attn_scale,
        qk_norm=qk_norm if config.qk_norm else None,
    )


def _self_attention(config, params, prefix, h, *, valid, causal, use_rope, layer):
    window = layer_window(config, layer)
    attn = prefix + "self_attn."
    return mha(
        params,
        attn,
        h,
        mask=_self_attention_mask(valid, window),
        causal=causal,
        window=window,
        rope_base=layer_rope_base(config, layer) if use_rope else None,
        **_attention_options(config, params, attn),
    )


def encoder_layer(config, params, prefix, x, *, valid=None, causal=False, rope=None, layer=0):
    """One pre-norm block: ``x + SelfAttn(norm1(x))`` then ``+ FFN(norm2(x))``. ``x (B,T,D)``.

    ``rope`` None follows ``config.positional``; ``layer`` is the block's index in its
    stack (its window and RoPE base); with ``post_norms`` each sublayer's output is
    normed (``post_norm1``, ``post_norm2``) before the residual sum.
    """
    use_rope = (config.positional == "rope") if rope is None else rope
    h = norm(config, params, prefix + "norm1.", x)
    h = _self_attention(
        config, params, prefix, h, valid=valid, causal=causal, use_rope=use_rope, layer=layer
    )
    x = x + _post(config, params, prefix + "post_norm1.", h)
    h = feed_forward(params, prefix, norm(config, params, prefix + "norm2.", x), config.ffn)
    return x + _post(config, params, prefix + "post_norm2.", h)


def decoder_layer(
    config, params, prefix, x, memory, *, valid=None, memory_valid=None, rope=None, layer=0
):
    """Causal self-attention, cross-attention over ``memory (B,S,D)``, FFN; ``x (B,T,D)``
    (``post_norm1..3`` after them with ``post_norms``)."""
    use_rope = (config.positional == "rope") if rope is None else rope
    h = norm(config, params, prefix + "norm1.", x)
    h = _self_attention(
        config, params, prefix, h, valid=valid, causal=True, use_rope=use_rope, layer=layer
    )
    x = x + _post(config, params, prefix + "post_norm1.", h)
    h = norm(config, params, prefix + "norm2.", x)
    cross = prefix + "multihead_attn."
    h = mha(
        params,
        cross,
        h,
        memory,
        mask=_key_mask(memory_valid),
        **_attention_options(config, params, cross),
    )
    x = x + _post(config, params, prefix + "post_norm2.", h)
    h = feed_forward(params, prefix, norm(config, params, prefix + "norm3.", x), config.ffn)
    return x + _post(config, params, prefix + "post_norm3.", h)


def _embed(config, table, tokens):
    scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0
    return table[np.asarray(tokens)] * scale  # (B,T,D)


def _default_valid(config, tokens, valid):
    # The contract since 2026-12-02: no valid mask means every token is real.
    return np.ones(np.shape(tokens), bool) if valid is None else np.asarray(valid, bool)


def decoder_only_forward(config, params, tokens, *, valid=None) -> np.ndarray:
    """Logits ``(B,T,V)`` of the decoder-only model; zero at padded positions."""
    valid = _default_valid(config, tokens, valid)
    x = _embed(config, params["token_embedding.weight"], tokens)
    for i in range(config.n_layers):
        x = encoder_layer(config, params, f"layers.{i}.", x, valid=valid, causal=True, layer=i)
    x = norm(config, params, "norm.", x)
    head = params["token_embedding.weight" if config.tie_embeddings else "output_projection.weight"]
    logits = x @ head.T  # (B,T,D) @ (D,V) -> (B,T,V)
    return np.where(valid[..., None], logits, 0.0)


def encode(config, params, src, *, src_valid=None) -> np.ndarray:
    """Encoder memory ``(B,S,D)`` of the seq2seq model (bidirectional, RoPE per config)."""
    src_valid = _default_valid(config, src, src_valid)
    x = _embed(config, params["source_embedding.weight"], src)
    for i in range(config.n_layers):
        x = encoder_layer(config, params, f"encoder.layers.{i}.", x, valid=src_valid, layer=i)
    return norm(config, params, "encoder.norm.", x)


def seq2seq_forward(config, params, src, tgt_in, *, src_valid=None, tgt_valid=None):
    """Logits ``(B,T,V)`` of the seq2seq model; zero at padded target positions."""
    src_valid = _default_valid(config, src, src_valid)
    tgt_valid = _default_valid(config, tgt_in, tgt_valid)
    memory = encode(config, params, src, src_valid=src_valid)
    x = _embed(config, params["target_embedding.weight"], tgt_in)
    for i in range(config.n_layers):
        x = decoder_layer(
            config,
            params,
            f"decoder.layers.{i}.",
            x,
            memory,
            valid=tgt_valid,
            memory_valid=src_valid,
            layer=i,
        )
    x = norm(config, params, "decoder.norm.", x)
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
