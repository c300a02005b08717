"""Level 1's array primitives: the functions of ``level0_loops/ops.py``, vectorised with numpy.

Same names, same arguments, same results (to rounding); each loop nest of
level 0 becomes one array expression. Shapes use B, H, T, S, D, Dh, F, V.
The arithmetic runs in the dtype of the arrays it is given: float64 unless
the model was built with ``dtype=np.float32``. Level 1's classes
(``models.py``) are level 0's with ``ops`` set to this module.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf

from ..common import checks
from .convert import asarray, to_numpy  # noqa: F401  (the pieces load parameters with these)

# ------------------------------------------------------ reshaping and joining


def concat(a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
    return np.concatenate([a, b], axis=axis)


def split_heads(x: np.ndarray, H: int) -> np.ndarray:
    B, T, D = x.shape
    # (B, T, D) -> (B, T, H, Dh) -> (B, H, T, Dh); head h owns features h*Dh .. (h+1)*Dh - 1
    return x.reshape(B, T, H, D // H).transpose(0, 2, 1, 3)


def merge_heads(x: np.ndarray) -> np.ndarray:
    B, H, T, Dh = x.shape
    # (B, H, T, Dh) -> (B, T, H, Dh) -> (B, T, D)
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * Dh)


# ---------------------------------------------------------------- arithmetic


def add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return x + y


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """``x @ weight.T + bias`` as ``nn.Linear``, weight ``(Out, In)``."""
    y = x @ weight.T  # (..., In) @ (In, Out) -> (..., Out)
    return y if bias is None else y + bias


def normalise(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """LayerNorm before its affine part: ``(x - mean) / sqrt(var + eps)`` over the last axis.

    Returns ``(xhat (..., D), inv_std (..., 1))``; the backward reuses both.
    """
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)  # (..., 1), divides by D
    inv_std = 1.0 / np.sqrt(var + eps)  # (..., 1)
    return centred * inv_std, inv_std


def layer_norm(x: np.ndarray, weight, bias, eps: float) -> np.ndarray:
    """``nn.LayerNorm`` over the last axis: biased variance, ``eps`` inside the square root."""
    y = normalise(x, eps)[0] * weight
    return y if bias is None else y + bias


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """``Phi(x) = 0.5 * (1 + erf(x / sqrt(2)))``, the standard normal CDF, elementwise.

    numpy has no erf; ``scipy.special.erf`` is vectorised and accurate to float64
    rounding (and computes float32 inputs in float32). It is still the most
    expensive elementwise step here, ~40 ns per element against ~8 for ``exp``.
    """
    return 0.5 * (1.0 + erf(x / math.sqrt(2.0)))


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, ``x * Phi(x)``, not the tanh approximation."""
    return x * normal_cdf(x)


def embed(table: np.ndarray, tokens: np.ndarray, scale: float) -> np.ndarray:
    return table[tokens] * scale  # (V, D) gathered by (B, T) -> (B, T, D)


def rope_angles(T: int, Dh: int, position_offset: int, base: float, dtype) -> tuple:
    """``(cos, sin)``, each ``(T, Dh/2)``: pair ``i`` at time step ``t`` turns by
    ``(position_offset + t) * base^(-2i/Dh)``. Angles are computed in float64, then cast."""
    inv_freq = base ** (-2 * np.arange(Dh // 2) / Dh)  # (Dh/2,)
    pos = position_offset + np.arange(T)  # (T,)
    angle = pos[:, None] * inv_freq[None, :]  # (T, 1) * (1, Dh/2) -> (T, Dh/2)
    return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)


def rotate_pairs(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """``x (B, H, T, Dh)``: each adjacent pair ``(a, b) -> (a cos - b sin, b cos + a sin)``."""
    a, b = x[..., 0::2], x[..., 1::2]  # (B, H, T, Dh/2) each: even and odd features
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = b * cos + a * sin
    return out


def rope(x: np.ndarray, position_offset: int, base: float) -> np.ndarray:
    """Rotate adjacent feature pairs of ``x (B, H, T, Dh)`` by ``pos * base^(-2i/Dh)``.

    ``(a, b) -> (a cos - b sin, b cos + a sin)``; time step ``t`` is at
    ``position_offset + t``.
    """
    T, Dh = x.shape[-2:]
    return rotate_pairs(x, *rope_angles(T, Dh, position_offset, base, x.dtype))


def attention_weights(q, k, *, causal=False, mask=None, scale=None) -> np.ndarray:
    """The softmax weights of attention: ``q (B,H,T,Dh)``, ``k (B,H,S,Dh)`` -> ``(B,H,T,S)``.

    Rows sum to 1 over the allowed keys; forbidden keys get exactly 0. See
    ``attention`` for ``causal``, ``mask`` and ``scale``. (The backward reuses them.)
    """
    B, H, T, Dh = q.shape
    S = k.shape[-2]
    allowed = np.ones((T, S), dtype=bool)  # (T, S)
    if causal:
        # Lower triangle shifted right by S - T: True where j <= i + (S - T).
        allowed = np.tri(T, S, k=checks.causal_offset(T, S), dtype=bool)  # (T, S)
    if mask is not None:
        checks.check_mask(np.shape(mask), np.asarray(mask).dtype == np.bool_, (B, H, T, S))
        allowed = allowed & mask  # broadcasts to at most (B, H, T, S)
    if not allowed.any(axis=-1).all():
        raise ValueError(checks.EMPTY_ROW_MESSAGE)
    if scale is None:
        scale = 1.0 / math.sqrt(Dh)

    scores = (q @ k.swapaxes(-1, -2)) * scale  # (B,H,T,Dh) @ (B,H,Dh,S) -> (B,H,T,S)
    # -inf gives a forbidden key weight exactly 0 after exp. It is safe only
    # because of the check above: every row keeps a finite score, so its max is
    # finite and no row becomes exp(-inf - -inf) = NaN.
    scores = np.where(allowed, scores, -np.inf)  # (B,H,T,S)
    # Subtracting the row max keeps every exp argument <= 0 (no overflow) and
    # makes the largest term exactly 1 (no 0/0 from underflow).
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)  # (B,H,T,S), rows sum to 1
    return weights


def attention(q, k, v, *, causal=False, mask=None, scale=None) -> np.ndarray:
    """Scaled dot-product attention: ``q (B,H,T,Dh)``, ``k (B,H,S,Dh)``, ``v (B,H,S,Dv)`` -> ``(B,H,T,Dv)``.

    ``mask`` boolean, True = may attend, broadcastable to ``(B,H,T,S)``;
    ``causal`` bottom-right (query ``i`` sees key ``j`` iff ``j <= i + S - T``);
    a key must pass both. A query row with no allowed key is a ``ValueError``.
    """
    checks.attention_dims(np.shape(q), np.shape(k), np.shape(v))
    q, k, v = (np.asarray(a) for a in (q, k, v))
    checks.check_float_inputs([a.dtype.kind for a in (q, k, v)], [a.dtype for a in (q, k, v)])
    checks.check_scale(scale)
    weights = attention_weights(q, k, causal=causal, mask=mask, scale=scale)  # (B,H,T,S)
    return weights @ v  # (B,H,T,S) @ (B,H,S,Dv) -> (B,H,T,Dv)
