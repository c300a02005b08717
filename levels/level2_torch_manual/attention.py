"""Attention written out: scores, mask, softmax, weighted sum.

This is the readable version of the operation that level 3 hands to
``F.scaled_dot_product_attention`` and level 4 to a Triton kernel. It builds
the full ``(B, H, T, S)`` score matrix, so its memory grows with ``T * S``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..common.checks import (
    EMPTY_ROW_MESSAGE,
    attention_dims,
    causal_offset,
    check_float_inputs,
    check_mask,
    check_scale,
)
from .arrays import dtype_kind


def causal_mask(T: int, S: int, *, device=None) -> torch.Tensor:
    """``(T, S)`` bool, True where query ``i`` may attend key ``j``: ``j <= i + (S - T)``.

    Bottom-right alignment: the last query always sees every key, which is what
    decoding against a cache needs (``T`` new queries after ``S - T`` cached keys).
    """
    ones = torch.ones(T, S, dtype=torch.bool, device=device)  # (T, S)
    return ones.tril(diagonal=causal_offset(T, S))  # (T, S), keeps j - i <= S - T


def check_inputs(q, k, v, mask) -> tuple[int, int, int, int, int, int]:
    """The shared shape, dtype and mask checks of every torch level; -> ``(B,H,T,S,Dh,Dv)``."""
    dims = attention_dims(q.shape, k.shape, v.shape)
    check_float_inputs([dtype_kind(a.dtype) for a in (q, k, v)], [a.dtype for a in (q, k, v)])
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask must be a boolean tensor, got {type(mask).__name__}")
        B, H, T, S = dims[:4]
        check_mask(mask.shape, mask.dtype == torch.bool, (B, H, T, S))
    return dims


def as_4d(mask: torch.Tensor) -> torch.Tensor:
    """A mask broadcastable to ``(B,H,T,S)`` with its missing leading axes made explicit
    (a view): ``(S,)`` -> ``(1,1,1,S)``, ``(T,S)`` -> ``(1,1,T,S)``."""
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))


def allowed_keys(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, mask: torch.Tensor | None
) -> torch.Tensor | None:
    """Validate the inputs and combine ``mask`` and ``causal`` into one boolean mask.

    Returns a bool tensor broadcastable to ``(B, H, T, S)`` (True = may attend),
    or ``None`` when every key is allowed. Raises ``ValueError`` when some query
    row would have no key at all; this check is what makes the ``-inf`` fill
    in ``attention`` safe. Shared with level 3, whose SDPA call would turn such
    a row into NaN.
    """
    B, H, T, S, _, _ = check_inputs(q, k, v, mask)
    if mask is not None:
        mask = as_4d(mask.to(q.device))
    if causal and T > S:
        # Bottom-right alignment leaves the first T - S queries without a key.
        raise ValueError(EMPTY_ROW_MESSAGE)
    allowed = mask
    if causal:
        tri = causal_mask(T, S, device=q.device)  # (T, S)
        allowed = tri if mask is None else mask & tri  # broadcasts to (B?, H?, T, S)
    if mask is not None and not bool(allowed.any(dim=-1).all()):
        # One reduction over (..., T, S); on a GPU this waits for the device,
        # the price of refusing empty rows before they become NaN.
        raise ValueError(EMPTY_ROW_MESSAGE)
    return allowed


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v.

    ``q (B,H,T,Dh)``, ``k (B,H,S,Dh)``, ``v (B,H,S,Dv)`` -> ``(B,H,T,Dv)`` in
    ``q``'s dtype. ``mask`` is boolean, True = may attend, broadcastable to
    ``(B,H,T,S)``; ``causal`` is bottom-right aligned (``j <= i + S - T``).
    ``dropout_p`` drops attention probabilities (the models pass it only in
    training mode). A query row with no allowed key is a ``ValueError``.
    """
    check_scale(scale)
    allowed = allowed_keys(q, k, v, causal=causal, mask=mask)  # (.., T, S) bool or None
    Dh = q.shape[-1]
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    # Half-precision inputs are upcast: the dot products, the exponentials and
    # the row sums all accumulate in float32 (float64 stays float64).
    acc = torch.promote_types(q.dtype, torch.float32)
    qf, kf, vf = q.to(acc), k.to(acc), v.to(acc)
    scores = (qf @ kf.transpose(-2, -1)) * scale  # (B,H,T,Dh) @ (B,H,Dh,S) -> (B,H,T,S)
    if allowed is not None:
        # -inf makes a masked key's weight exactly 0 after exp. It is safe only
        # because allowed_keys rejected rows with no allowed key: such a row
        # would be all -inf, and softmax would return 0/0 = NaN.
        scores = scores.masked_fill(~allowed, float("-inf"))  # (B,H,T,S)
    # Softmax over keys, written out: subtracting each row's maximum leaves the
    # result unchanged (the factor exp(-max) cancels) but keeps exp() <= 1, so
    # large scores cannot overflow. Every row has a finite maximum (see above).
    row_max = scores.amax(dim=-1, keepdim=True)  # (B,H,T,1)
    weights = torch.exp(scores - row_max)  # (B,H,T,S), masked entries exp(-inf) = 0
    probs = weights / weights.sum(dim=-1, keepdim=True)  # (B,H,T,S), rows sum to 1
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p, training=True)  # (B,H,T,S)
    out = probs @ vf  # (B,H,T,S) @ (B,H,S,Dv) -> (B,H,T,Dv)
    return out.to(q.dtype)
