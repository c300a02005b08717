"""Level 1's array primitives: the functions of ``level0_loops/ops.py``, vectorised with numpy.

Same names, same arguments, same results (to rounding); each loop nest of
level 0 becomes one array expression. Shapes use B, H, T, S, D, Dh, F, V.
The arithmetic runs in the dtype of the arrays it is given: float64 unless
the model was built with ``dtype=np.float32``. Level 1's classes
(``models.py``) are level 0's with ``ops`` set to this module.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
from scipy.special import erf

from ..common import checks, semantics
from .convert import asarray, to_numpy  # noqa: F401  (the pieces load parameters with these)

# ------------------------------------------------------ reshaping and joining


def last_position(x: np.ndarray) -> np.ndarray:
    """``(B,T,N) -> (B,N)``: each row's last position (a decode step's logits)."""
    return x[:, -1]


def at_positions(x: np.ndarray, positions: list[int]) -> np.ndarray:
    """``(B,T,N) -> (B,1,N)``: position ``positions[b]`` of row ``b``."""
    return x[np.arange(len(positions)), positions][:, None]


def zero_padded(x: np.ndarray, valid) -> np.ndarray:
    """``x (B,T,N)`` with the vectors at padded positions (``valid`` False) exactly zero."""
    return np.where(np.asarray(valid, dtype=bool)[..., None], x, 0.0)


def prefix(x: np.ndarray, n: int, axis: int) -> np.ndarray:
    """The first ``n`` entries along ``axis`` (a cache's first ``n`` slots)."""
    return x[(slice(None),) * axis + (slice(0, n),)]


def last_slots(positions: np.ndarray) -> np.ndarray:
    """``positions (B, T)`` -> ``(B,)`` each row's slot of its largest position (its last real token)."""
    return positions.argmax(axis=-1)


def next_positions(positions: np.ndarray) -> np.ndarray:
    """``positions (B, S)`` of a cache -> ``(B,)`` each row's next position (0 for an empty row)."""
    return positions.max(axis=-1, initial=-1) + 1


def inference():
    """What the generation loops run the model in: nothing to switch off here (no autograd)."""
    return contextlib.nullcontext()


visible = (
    semantics.visible
)  # what each query may see, (B,1,T,S): numpy's arrays take the rule as it is


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


def gain(weight: np.ndarray, offset: float) -> np.ndarray:
    """A norm's gain: ``offset + weight`` (Gemma's gains are offsets from 1), or ``weight``."""
    return weight if offset == 0.0 else offset + weight


def layer_norm(x: np.ndarray, weight, bias, eps: float, offset: float = 0.0) -> np.ndarray:
    """``nn.LayerNorm`` over the last axis: biased variance, ``eps`` inside the square root;
    the gain is ``offset + weight``."""
    y = normalise(x, eps)[0] * gain(weight, offset)
    return y if bias is None else y + bias


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """``Phi(x) = 0.5 * (1 + erf(x / sqrt(2)))``, the standard normal CDF, elementwise.

    numpy has no erf; ``scipy.special.erf`` is vectorised and accurate to float64
    rounding (and computes float32 inputs in float32). It is still the most
    expensive elementwise step here, ~40 ns per element against ~8 for ``exp``.
    """
    return 0.5 * (1.0 + erf(x / math.sqrt(2.0)))


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, offset: float = 0.0) -> np.ndarray:
    """RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * (offset + weight)`` (no
    centring, no bias)."""
    return rms_normalise(x, eps)[0] * gain(weight, offset)


def rms_normalise(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(xhat (..., D), inv_rms (..., 1))`` with ``xhat = x * inv_rms``; the backward reuses both."""
    inv_rms = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
    return x * inv_rms, inv_rms


def mul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return x * y


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))``, computed as ``exp(min(x,0)) / (1 + exp(-|x|))`` so no ``exp`` overflows."""
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, z) / (1.0 + z)


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU (swish), ``x * sigmoid(x)``: SwiGLU's gate activation."""
    return x * sigmoid(x)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, ``x * Phi(x)``, not the tanh approximation."""
    return x * normal_cdf(x)


GELU_TANH_BETA = math.sqrt(2.0 / math.pi)  # the tanh approximation's constants
GELU_TANH_KAPPA = 0.044715


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation, ``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (GeGLU's
    gate in Gemma); ``np.tanh`` saturates, so nothing overflows."""
    return 0.5 * x * (1.0 + np.tanh(GELU_TANH_BETA * (x + GELU_TANH_KAPPA * x * x * x)))


def embed(table: np.ndarray, tokens: np.ndarray, scale: float) -> np.ndarray:
    return table[tokens] * scale  # (V, D) gathered by (B, T) -> (B, T, D)


def rope_angles(positions: np.ndarray, Dh: int, base: float, dtype) -> tuple:
    """``(cos, sin)``, each ``(B, 1, T, Dh/2)``: pair ``i`` of the token at ``positions[b, t]``
    turns by ``pos * base^(-2i/Dh)`` (a padded token, ``-1``, as position 0), the same for
    every head of a row. Angles are computed in float64, then cast."""
    inv_freq = base ** (-2 * np.arange(Dh // 2) / Dh)  # (Dh/2,)
    pos = np.maximum(np.asarray(positions), 0)  # (B, T)
    angle = pos[:, None, :, None] * inv_freq  # (B, 1, T, Dh/2)
    return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)


def rotate_pairs(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """``x (B, H, T, Dh)``: each adjacent pair ``(a, b) -> (a cos - b sin, b cos + a sin)``."""
    a, b = x[..., 0::2], x[..., 1::2]  # (B, H, T, Dh/2) each: even and odd features
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = b * cos + a * sin
    return out


def rope(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """Rotate adjacent feature pairs of ``x (B, H, T, Dh)`` by ``pos * base^(-2i/Dh)``, token
    ``t`` of row ``b`` at ``positions[b, t]``: ``(a, b) -> (a cos - b sin, b cos + a sin)``."""
    return rotate_pairs(x, *rope_angles(positions, x.shape[-1], base, x.dtype))


def position_mask(T: int, S: int, *, causal: bool, window: int | None) -> np.ndarray:
    """``(T, S)`` bool: the keys each query may see by position (``semantics.key_range``, vectorised).

    With ``d = i + (S - T)`` (bottom-right): causal keeps ``j <= d``; a window
    keeps ``j > d - W`` (causal) or ``|j - d| < W``.
    """
    d = np.arange(T)[:, None] + semantics.causal_offset(T, S)  # (T, 1)
    j = np.arange(S)[None, :]  # (1, S)
    allowed = np.ones((T, S), dtype=bool)
    if causal:
        allowed &= j <= d
    if window is not None:
        allowed &= (j > d - window) if causal else (np.abs(j - d) < window)
    return allowed  # (T, S)


def repeat_heads(x: np.ndarray, group: int) -> np.ndarray:
    """``(B, Hkv, S, N) -> (B, Hkv * group, S, N)``: each key/value head serves ``group``
    consecutive query heads (head ``h`` reads ``h // group``)."""
    return x if group == 1 else np.repeat(x, group, axis=1)


def sum_groups(x: np.ndarray, group: int) -> np.ndarray:
    """``(B, H, S, N) -> (B, H // group, S, N)``: what ``repeat_heads`` spread, summed back
    (the gradient of a shared key/value head collects its whole group's)."""
    B, H, S, N = x.shape
    return x if group == 1 else x.reshape(B, H // group, group, S, N).sum(axis=2)


def attention_weights(q, k, *, causal=False, mask=None, scale=None, window=None):
    """The softmax weights of attention and their log-sum-exp.

    ``q (B,H,T,Dh)``, ``k (B,H,S,Dh)`` (key heads already repeated to ``H``) ->
    ``(weights (B,H,T,S), lse (B,H,T))``. Rows sum to 1 over the allowed keys;
    forbidden keys get exactly 0. See ``attention`` for the arguments. (The
    backward reuses both.)
    """
    T, Dh, S = q.shape[-2], q.shape[-1], k.shape[-2]
    allowed = position_mask(T, S, causal=causal, window=window)  # (T, S)
    if mask is not None:
        allowed = allowed & mask  # broadcasts to at most (B, H, T, S)
    if scale is None:
        scale = 1.0 / math.sqrt(Dh)

    # -inf gives a forbidden key weight exactly 0 after exp. It is safe only
    # because every row keeps an allowed key (check_attention, or the model's
    # edge): its max is finite and no row becomes exp(-inf - -inf) = NaN.
    scores = (q @ k.swapaxes(-1, -2)) * scale  # (B,H,T,Dh) @ (B,H,Dh,S) -> (B,H,T,S)
    scores = np.where(allowed, scores, -np.inf)  # (B,H,T,S)
    return softmax(scores, return_lse=True)


def softmax(scores: np.ndarray, *, return_lse: bool = False):
    """The softmax over the last axis of ``scores (..., S)``, ``-inf`` at the keys a row may
    not see (their weight is exactly 0); with ``return_lse`` also each row's log-sum-exp
    ``(...,)``. A row must hold a finite score (the callers check it first)."""
    # Subtracting the row max keeps every exp argument <= 0 (no overflow) and
    # makes the largest term exactly 1 (no 0/0 from underflow).
    top = scores.max(axis=-1, keepdims=True)  # (..., 1)
    weights = np.exp(scores - top)
    total = weights.sum(axis=-1, keepdims=True)  # (..., 1), at least 1
    weights /= total  # (..., S), rows sum to 1
    lse = (top + np.log(total))[..., 0]  # lse = max + log sum exp(s - max)
    return (weights, lse) if return_lse else weights


def check_attention(q, k, v, *, causal, mask, scale, window) -> None:
    """Every check of ``attention`` (here and on level 1's tape), before any arithmetic:
    shapes, dtypes, scale, window, the mask, and a query row with no key (``ValueError``)."""
    B, H, T, S, _, _ = checks.attention_dims(np.shape(q), np.shape(k), np.shape(v))
    arrays = [np.asarray(a) for a in (q, k, v)]
    checks.check_float_inputs([a.dtype.kind for a in arrays], [a.dtype for a in arrays])
    checks.check_scale(scale)
    checks.check_window(window)
    allowed = position_mask(T, S, causal=causal, window=window)  # (T, S)
    if mask is not None:
        checks.check_mask(np.shape(mask), np.asarray(mask).dtype == np.bool_, (B, H, T, S))
        allowed = allowed & mask  # broadcasts to at most (B, H, T, S)
    if not allowed.any(axis=-1).all():
        raise ValueError(checks.EMPTY_ROW_MESSAGE)


def attention(q, k, v, *, causal=False, mask=None, scale=None, window=None, return_lse=False):
    """Scaled dot-product attention: ``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)`` -> ``(B,H,T,Dv)``.

    Query head ``h`` reads key/value head ``h // (H // Hkv)`` (grouped-query
    attention; the key heads are repeated, one copy per query head). ``mask``
    boolean, True = may attend, broadcastable to ``(B,H,T,S)``; ``causal``
    bottom-right (query ``i`` sees key ``j`` iff ``j <= i + S - T``); ``window``
    the ``W`` latest keys (causal) or the band ``|j - (i + S - T)| < W``; a key
    must pass all of them. A query row with no allowed key is a ``ValueError``.
    ``return_lse`` also returns ``lse (B,H,T)``. The checks, then ``attend``.
    """
    check_attention(q, k, v, causal=causal, mask=mask, scale=scale, window=window)
    kw = {"causal": causal, "mask": mask, "scale": scale, "window": window}
    return attend(q, k, v, **kw, return_lse=return_lse)


def attend(q, k, v, *, causal=False, mask=None, scale=None, window=None, return_lse=False):
    """``attention`` on inputs it would accept, unchecked: the core the models call (on
    inputs their edge has checked, with masks that leave every query row a key)."""
    q, k, v = (np.asarray(a) for a in (q, k, v))
    group = semantics.group_size(q.shape, k.shape)  # query heads per key/value head
    k, v = repeat_heads(k, group), repeat_heads(v, group)  # (B,H,S,Dh), (B,H,S,Dv)
    weights, lse = attention_weights(q, k, causal=causal, mask=mask, scale=scale, window=window)
    out = weights @ v  # (B,H,T,S) @ (B,H,S,Dv) -> (B,H,T,Dv)
    return (out, lse) if return_lse else out


def merge_attention(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Attention over the union of disjoint key sets, from each set's ``(out, lse)``.

    ``lse = log sum_i exp(lse_i)`` (``np.logaddexp`` keeps it exact for any
    range of values) and ``out = sum_i exp(lse_i - lse) out_i``; ``out_i (B,H,T,Dv)``,
    ``lse_i (B,H,T)``.
    """
    if not parts:
        raise ValueError("merge_attention needs at least one (out, lse) part")
    lse = np.logaddexp.reduce(np.stack([np.asarray(p[1]) for p in parts]), axis=0)  # (B,H,T)
    out = sum(np.exp(np.asarray(p[1]) - lse)[..., None] * np.asarray(p[0]) for p in parts)
    return out, lse
