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
    check_float_inputs,
    check_mask,
    check_scale,
    check_window,
)
from ..common.semantics import (
    causal_binds,
    causal_offset,
    group_size,
    rows_without_keys,
    window_binds,
)
from .arrays import dtype_kind


def causal_mask(T: int, S: int, *, device=None) -> torch.Tensor:
    """``(T, S)`` bool, True where query ``i`` may attend key ``j``: ``j <= i + (S - T)``.

    Bottom-right alignment: the last query always sees every key, which is what
    decoding against a cache needs (``T`` new queries after ``S - T`` cached keys).
    """
    ones = torch.ones(T, S, dtype=torch.bool, device=device)  # (T, S)
    return ones.tril(diagonal=causal_offset(T, S))  # (T, S), keeps j - i <= S - T


def position_rule(
    d: torch.Tensor, j: torch.Tensor, *, causal: bool, window: int | None
) -> torch.Tensor:
    """``(len(d), len(j))`` bool: may a query placed at ``d`` see key ``j``, by position alone.

    Causal keeps ``j <= d``; a window keeps ``j > d - W`` (causal) or the band
    ``|j - d| < W`` (``semantics.key_range`` is the same rule for one row).
    """
    d, j = d[:, None], j[None, :]  # (T, 1), (1, S)
    allowed = (
        j <= d if causal else torch.ones(d.shape[0], j.shape[1], dtype=torch.bool, device=d.device)
    )
    if window is not None:
        allowed = allowed & ((j > d - window) if causal else ((j - d).abs() < window))
    return allowed


def position_mask(T: int, S: int, *, causal: bool, window: int | None, device=None):
    """``(T, S)`` bool: the keys each query may see by position, with the queries placed
    bottom-right (query ``i`` at ``d = i + (S - T)``). None when every key is allowed:
    without causal and window, and also when neither hides a key (causal with one query,
    as every decode step has; a window wider than the keys)."""
    if not (causal_binds(T, causal=causal) or window_binds(T, S, causal=causal, window=window)):
        return None
    d = torch.arange(T, device=device) + causal_offset(T, S)  # (T,)
    return position_rule(d, torch.arange(S, device=device), causal=causal, window=window)


def check_inputs(q, k, v, mask, *, scale=None, window=None) -> tuple[int, int, int, int, int, int]:
    """The shared shape, dtype, mask, scale and window checks of every torch level;
    -> ``(B,H,T,S,Dh,Dv)``."""
    dims = attention_dims(q.shape, k.shape, v.shape)
    check_float_inputs([dtype_kind(a.dtype) for a in (q, k, v)], [a.dtype for a in (q, k, v)])
    check_scale(scale)
    check_window(window)
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


def visible_keys(
    T: int, S: int, *, causal: bool, mask: torch.Tensor | None, window: int | None, device=None
) -> torch.Tensor | None:
    """``mask`` and the position rule (causal, window) as one boolean mask broadcastable to
    ``(B, H, T, S)``, True = may attend; ``None`` when every key is allowed."""
    allowed = position_mask(T, S, causal=causal, window=window, device=device)  # (T, S) or None
    if mask is None:
        return allowed
    mask = as_4d(mask.to(device))  # (B?, H?, T?, S)
    return mask if allowed is None else mask & allowed  # broadcasts to (B?, H?, T, S)


def check_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    mask: torch.Tensor | None,
    scale: float | None = None,
    window: int | None = None,
) -> None:
    """Every check of ``attention``, before any arithmetic: the shapes, dtypes, mask, scale
    and window (``check_inputs``), and a query row with no key it may attend to, a
    ``ValueError``. Its absence is what makes the ``-inf`` fill in ``attend`` safe; level 3
    refuses the same rows, which SDPA would turn into NaN, with this function."""
    B, H, T, S, _, _ = check_inputs(q, k, v, mask, scale=scale, window=window)
    if rows_without_keys(T, S, causal=causal, window=window):
        # e.g. bottom-right causal with T > S: the first T - S queries have no key.
        raise ValueError(EMPTY_ROW_MESSAGE)
    if mask is not None:
        allowed = visible_keys(T, S, causal=causal, mask=mask, window=window, device=q.device)
        # One reduction over (..., T, S); on a GPU this waits for the device, the price
        # of refusing empty rows before they become NaN.
        if not bool(allowed.any(dim=-1).all()):
            raise ValueError(EMPTY_ROW_MESSAGE)


def repeat_heads(x: torch.Tensor, group: int) -> torch.Tensor:
    """``(B, Hkv, S, N) -> (B, Hkv * group, S, N)``: each key/value head serves ``group``
    consecutive query heads (head ``h`` reads ``h // group``). Autograd sums the
    gradients of the copies back into the shared head."""
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    window: int | None = None,
    return_lse: bool = False,
    dropout_p: float = 0.0,
):
    """softmax(q k^T * scale, masked) v.

    ``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)`` -> ``(B,H,T,Dv)`` in
    ``q``'s dtype; query head ``h`` reads key/value head ``h // (H // Hkv)``.
    ``mask`` is boolean, True = may attend, broadcastable to ``(B,H,T,S)``;
    ``causal`` is bottom-right aligned (``j <= i + S - T``); ``window`` keeps
    each query's ``W`` latest keys (causal) or the band ``|j - (i + S - T)| < W``.
    ``return_lse`` also returns ``lse (B,H,T)`` (float32 or float64), the log of
    each row's sum of ``exp(score)``. ``dropout_p`` drops attention probabilities
    (the models pass it only in training mode). A query row with no allowed key
    is a ``ValueError``.

    The checks, then ``attend``: a bad input is refused before any arithmetic.
    """
    check_attention(q, k, v, causal=causal, mask=mask, scale=scale, window=window)
    return attend(q, k, v, causal=causal, mask=mask, scale=scale, window=window,
                  return_lse=return_lse, dropout_p=dropout_p)  # fmt: skip


def attend(
    q, k, v, *, causal=False, mask=None, scale=None, window=None, return_lse=False, dropout_p=0.0
):  # the arguments of ``attention``, which types them
    """``attention`` on inputs it would accept, unchecked: the core the models call.

    A model's public methods have checked what reaches it (token ids, ``valid``; the
    config was checked when it was made), its layers made q, k and v, and every mask
    the model builds from positions leaves each query row a key
    (``levels.common.semantics.visible``).
    """
    T, S, Dh = q.shape[-2], k.shape[-2], q.shape[-1]
    allowed = visible_keys(T, S, causal=causal, mask=mask, window=window, device=q.device)
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    group = group_size(q.shape, k.shape)
    # Half-precision inputs are upcast: the dot products, the exponentials and
    # the row sums all accumulate in float32 (float64 stays float64).
    acc = torch.promote_types(q.dtype, torch.float32)
    qf = q.to(acc)
    kf, vf = repeat_heads(k.to(acc), group), repeat_heads(v.to(acc), group)  # (B,H,S,*)
    scores = (qf @ kf.transpose(-2, -1)) * scale  # (B,H,T,Dh) @ (B,H,Dh,S) -> (B,H,T,S)
    if allowed is not None:
        # -inf makes a masked key's weight exactly 0 after exp. It is safe only
        # because every row keeps an allowed key (the caller's promise): a row
        # of -inf only would give softmax 0/0 = NaN.
        scores = scores.masked_fill(~allowed, float("-inf"))  # (B,H,T,S)
    # Softmax over keys, written out: subtracting each row's maximum leaves the
    # result unchanged (the factor exp(-max) cancels) but keeps exp() <= 1, so
    # large scores cannot overflow. Every row has a finite maximum (see above).
    row_max = scores.amax(dim=-1, keepdim=True)  # (B,H,T,1)
    weights = torch.exp(scores - row_max)  # (B,H,T,S), masked entries exp(-inf) = 0
    total = weights.sum(dim=-1, keepdim=True)  # (B,H,T,1), at least 1
    probs = weights / total  # (B,H,T,S), rows sum to 1
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p, training=True)  # (B,H,T,S)
    out = (probs @ vf).to(q.dtype)  # (B,H,T,S) @ (B,H,S,Dv) -> (B,H,T,Dv)
    if return_lse:
        # row_max is treated as a constant by the maths (its gradient cancels), and
        # autograd agrees: d/ds of (m + log sum exp(s - m)) is softmax(s) either way.
        return out, (row_max + torch.log(total))[..., 0]  # (B,H,T)
    return out


def merge_attention(parts):
    """Attention over the union of disjoint key sets, from each set's ``(out, lse)``.

    ``lse = logsumexp_i lse_i`` and ``out = sum_i exp(lse_i - lse) out_i``, with
    ``out_i (B,H,T,Dv)`` and ``lse_i (B,H,T)``; differentiable in every part.
    The weights are computed in the lse's precision (float32 at least).
    """
    if not parts:
        raise ValueError("merge_attention needs at least one (out, lse) part")
    lses = torch.stack([lse for _, lse in parts])  # (n, B,H,T)
    lse = torch.logsumexp(lses, dim=0)  # (B,H,T)
    weights = torch.exp(lses - lse)  # (n, B,H,T), sum to 1 over the parts
    out = sum(w[..., None] * o.to(w.dtype) for w, (o, _) in zip(weights, parts, strict=True))
    return out.to(parts[0][0].dtype), lse
