"""Sliding-window attention in chunks of queries: time and memory grow with ``T * W``, not ``T * S``.

SDPA has no window argument. A window written as a ``(T, S)`` boolean mask
is correct, but SDPA still computes every score of that matrix (and the mask
itself holds ``T * S`` booleans), so a window of 256 over 8192 tokens would
cost as much as full attention. Instead the queries are cut into chunks of
``C``; the queries ``[a, a + C)`` can only see the keys
``[a + (S - T) - W + 1, a + C + (S - T))`` (causal) or one band wider (not
causal), fewer than ``C + 2W`` keys, so each chunk is one SDPA call on a
slice of the keys with a ``(C, C + W)`` mask: ``T / C`` calls of
``C * (C + W)`` scores each. Autograd runs through the slices and the
concatenation unchanged.

Why chunking rather than FlexAttention's block masks, which skip the same
blocks inside one fused kernel: FlexAttention needs ``torch.compile`` to be
fast, and on a CPU PyTorch 2.13 has no FlexAttention backward at all.
Chunking is plain SDPA calls, so it runs forward and backward on every
device, in every dtype SDPA supports, with no compilation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..common.checks import EMPTY_ROW_MESSAGE, key_range, rows_without_keys
from ..level2_torch_manual.attention import as_4d, position_rule

MIN_CHUNK = 128  # queries per chunk at least: fewer would cost more in calls than it saves


def chunk_size(window: int) -> int:
    """``C``: a chunk of queries as wide as the window (at least ``MIN_CHUNK``), so each
    call's keys are at most ``C + 2W``, about three times its queries."""
    return max(window, MIN_CHUNK)


def chunking_pays(T: int, S: int, window: int) -> bool:
    """Chunk when a chunk's keys are clearly fewer than all of them and there are several chunks."""
    C = chunk_size(window)
    return T > C and C + 2 * window < S


def attention_in_chunks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    mask: torch.Tensor | None,
    scale: float | None,
    window: int,
    call: Callable[..., torch.Tensor],
) -> torch.Tensor:
    """``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)`` -> ``(B,H,T,Dv)``, chunk by chunk.

    ``call(q, k, v, attn_mask, is_causal, scale=...)`` is one SDPA call (level 3's
    ``sdpa``, with its backend). Inputs are checked already (``check_inputs``); an
    empty row, from the positions or from the mask inside a chunk, is a ``ValueError``.
    """
    T, S = q.shape[-2], k.shape[-2]
    if rows_without_keys(T, S, causal=causal, window=window):
        raise ValueError(EMPTY_ROW_MESSAGE)
    mask = None if mask is None else as_4d(mask.to(q.device))  # (b?, h?, t?, S)
    C = chunk_size(window)
    # One output written chunk by chunk (autograd records each slice's copy): a list of
    # chunks and a final cat would hold the output twice at the peak.
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])  # (B,H,T,Dv)
    for a in range(0, T, C):
        b = min(T, a + C)
        lo = key_range(a, T, S, causal=causal, window=window)[0]  # the chunk's first key
        hi = key_range(b - 1, T, S, causal=causal, window=window)[1]  # one past its last
        # Rows a..b-1, columns lo..hi-1 of the (T, S) position rule.
        d = torch.arange(a, b, device=q.device) + (S - T)  # where these queries sit
        j = torch.arange(lo, hi, device=q.device)  # the keys they may reach
        allowed = position_rule(d, j, causal=causal, window=window)  # (b - a, hi - lo)
        if mask is not None:
            rows = slice(a, b) if mask.shape[-2] != 1 else slice(None)
            allowed = allowed & mask[..., rows, lo:hi]  # (b?, h?, b - a, hi - lo)
            if not bool(allowed.any(dim=-1).all()):
                raise ValueError(EMPTY_ROW_MESSAGE)
        out[:, :, a:b] = call(
            q[:, :, a:b], k[:, :, lo:hi], v[:, :, lo:hi], allowed, False, scale=scale
        )  # (B,H,b-a,Dv)
    return out
