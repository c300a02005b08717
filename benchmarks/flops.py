"""FLOP formulas behind every GFLOP/s figure (one multiply-add counts as 2 FLOPs).

Attention forward, ``4 * B * H * T * S * Dh``: ``Q @ K^T`` is a
``(T, Dh) @ (Dh, S)`` product per head, ``2 * T * S * Dh`` FLOPs, and ``P @ V``
is another ``2 * T * S * Dv`` (``Dv = Dh`` here). Softmax, scaling and masking
are O(T * S) and left out, as everyone does. With ``causal=True`` (``T == S``)
only the lower triangle is useful work, so it counts as half; this is the
convention of the FlashAttention papers' benchmarks (Dao et al. 2022/2023),
which lets a kernel that skips masked blocks show its saving as time, not as a
higher FLOP rate.

Attention backward, ``2.5 x`` the forward: five matmuls of the forward's size
(``dV = P^T dO``, ``dP = dO V^T``, ``dQ = dS K``, ``dK = dS^T Q``, and ``S = Q
K^T`` recomputed) against the forward's two; FlashAttention-2 (Dao 2023) counts
it this way, so forward + backward is ``3.5 x`` the forward.

Decoder forward, ``2 * N * tokens + attention``: every weight of a matmul is
used once per token in one multiply-add, so the linear layers cost ``2 * N``
FLOPs per token, with ``N = L * (4 D^2 + 2 D F) + V * D`` (q, k, v and output
projections, the two feed-forward matmuls, and the tied logits projection;
biases, norms, GELU and RoPE are O(D) per token and left out). This is the
``C_forward = 2 N`` rule of Kaplan et al. 2020, "Scaling Laws for Neural
Language Models", Table 1. The attention term is the attention forward above
per layer, with ``H * Dh = D``, causal over a prompt and full (one query row
sees every cached key) for a decode step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from levels.common.config import TransformerConfig

BACKWARD_FACTOR = 2.5  # backward FLOPs / forward FLOPs (FlashAttention-2 convention)


def attention_flops(
    B: int, H: int, T: int, S: int, Dh: int, *, causal: bool, window: int | None = None
) -> float:
    """Forward FLOPs of attention on ``q (B,H,T,Dh)``, ``k, v (B,H,S,Dh)``.

    With a causal sliding ``window`` of ``W`` keys (``T = S``), query ``i`` sees
    ``min(W, i + 1)`` keys, ``T W - W (W - 1) / 2`` pairs in all: the work that
    matters, as the causal convention counts the lower triangle only.
    """
    if window is not None and causal and window < S:
        pairs = T * window - window * (window - 1) / 2
        return 4.0 * B * H * pairs * Dh
    full = 4.0 * B * H * T * S * Dh  # QK^T and PV, 2*T*S*Dh each per head
    return full / 2 if causal else full


def attention_fwd_bwd_flops(
    B: int, H: int, T: int, S: int, Dh: int, *, causal: bool, window: int | None = None
) -> float:
    """Forward plus backward: ``(1 + 2.5) x`` the forward."""
    return (1.0 + BACKWARD_FACTOR) * attention_flops(B, H, T, S, Dh, causal=causal, window=window)


def matmul_params(config: TransformerConfig) -> int:
    """``N``: weights that take part in a matmul, each once per token in a decoder forward."""
    D, F, L, V = config.d_model, config.d_ff, config.n_layers, config.vocab_size
    per_layer = 4 * D * D + 2 * D * F  # in_proj (3D x D), out_proj (D x D), linear1, linear2
    return L * per_layer + V * D  # + the tied logits projection h @ E^T


def decoder_forward_flops(config: TransformerConfig, B: int, T: int) -> float:
    """A decoder-only forward over ``(B, T)`` tokens (causal self-attention, ``S = T``)."""
    attn = config.n_layers * attention_flops(B, config.n_heads, T, T, config.d_head, causal=True)
    return 2.0 * matmul_params(config) * B * T + attn


def decode_step_flops(config: TransformerConfig, B: int, S: int) -> float:
    """One cached decode step: one new token per row attending ``S`` cached keys."""
    attn = config.n_layers * attention_flops(B, config.n_heads, 1, S, config.d_head, causal=False)
    return 2.0 * matmul_params(config) * B + attn


def generation_flops(
    config: TransformerConfig, B: int, prompt: int, new_tokens: int, *, use_cache: bool
) -> float:
    """FLOPs of greedy generation as the engine performs it for ``generate``.

    With the cache: one prefill over the prompt gives the first new token, then
    ``new_tokens - 1`` decode steps, step ``j`` attending ``prompt + j`` keys.
    Without it: ``new_tokens`` full forwards over lengths ``prompt .. prompt + new_tokens - 1``.
    """
    if new_tokens == 0:
        return 0.0
    if use_cache:
        steps = (decode_step_flops(config, B, prompt + j) for j in range(1, new_tokens))
        return decoder_forward_flops(config, B, prompt) + sum(steps)
    return sum(decoder_forward_flops(config, B, prompt + j) for j in range(new_tokens))


def element_bytes(dtype: str) -> int:
    """Bytes per number of a dtype by name (numpy has no bfloat16: 2 bytes, as float16)."""
    return 2 if dtype == "bfloat16" else int(np.dtype(dtype).itemsize)


def weight_bytes_per_step(config: TransformerConfig, bytes_per_element: int) -> int:
    """Bytes of parameters one decode step reads: every weight once, whatever the batch
    (an untied embedding table is only gathered from, a row per token: left out)."""
    from levels.common.params import param_shapes

    shapes = param_shapes(config, "decoder_only")
    gathered = () if config.tie_embeddings else ("token_embedding.weight",)
    count = sum(math.prod(shape) for name, shape in shapes.items() if name not in gathered)
    return count * bytes_per_element


def generation_bytes(
    config: TransformerConfig, B: int, prompt: int, new_tokens: int, bytes_per_element: int
) -> float:
    """Bytes read by cached generation: the weights at every step (the prefill and
    ``new_tokens - 1`` decode steps) and, at decode step ``j``, the ``prompt + j`` cached
    positions of every row (``kv_bytes_per_token`` each). Decoding is bound by these
    bytes, not by FLOPs: the figure gpt-fast prints as "bandwidth achieved"."""
    from levels.common.params import kv_bytes_per_token

    weights = weight_bytes_per_step(config, bytes_per_element)
    per_position = kv_bytes_per_token(config, bytes_per_element)
    cache = sum(B * (prompt + j) * per_position for j in range(1, new_tokens))
    return float(weights * max(new_tokens, 1) + cache)


def batches_forward_flops(config: TransformerConfig, shapes: Iterable[tuple[int, int]]) -> float:
    """Decoder forwards over padded batches of shapes ``(B, T)``: padding is computed too."""
    return sum(decoder_forward_flops(config, B, T) for B, T in shapes)


def matmul_flops(n: int) -> float:
    """An ``(n, n) @ (n, n)`` product: ``n^2`` outputs, ``n`` multiply-adds each."""
    return 2.0 * n**3
