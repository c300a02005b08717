"""Stage 1: scaled dot-product attention, with masks (docs/your_rung.md, stage 1)."""

import math

import numpy as np

from levels.common import checks

from .softmax import softmax


def attention(q, k, v, *, causal=False, mask=None, scale=None):
    """``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)`` -> ``(B,H,T,Dv)``."""
    T, Dh, S = q.shape[2], q.shape[3], k.shape[2]
    group = q.shape[1] // k.shape[1]  # the query heads one key head serves
    k = np.repeat(k, group, axis=1)  # (B,H,S,Dh): query head h reads key head h // group
    v = np.repeat(v, group, axis=1)  # (B,H,S,Dv)
    if scale is None:
        scale = 1.0 / math.sqrt(Dh)
    scores = (q @ k.swapaxes(-1, -2)) * scale  # (B,H,T,Dh) @ (B,H,Dh,S) -> (B,H,T,S)
    allowed = np.ones((T, S), dtype=bool)  # (T,S): what each query may see
    if causal:  # bottom-right: query i sits at i + (S - T) among the keys
        allowed = np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)
    if mask is not None:
        allowed = allowed & mask  # broadcasts, up to (B,H,T,S)
    allowed = np.broadcast_to(allowed, scores.shape)  # (B,H,T,S)
    if not allowed.any(axis=-1).all():  # a query row that sees no key: 0 / 0
        raise ValueError(checks.EMPTY_ROW_MESSAGE)
    weights = softmax(np.where(allowed, scores, -np.inf))  # (B,H,T,S), rows sum to 1
    return weights @ v  # (B,H,T,S) @ (B,H,S,Dv) -> (B,H,T,Dv)
