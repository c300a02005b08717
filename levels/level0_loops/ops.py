"""Level 0's array primitives: nested Python lists, ``math`` and loops.

Every function here is one step of the transformer written as plainly as
possible, so it can serve as the exact float64 reference at small sizes.
Level 1 (``levels/level1_numpy/ops.py``) provides the same functions with the
same arguments in numpy. The architecture (``layers.py``, ``models.py``)
computes only through these, reached as ``self.ops``: that is how level 1
reuses every line above the arithmetic.

Arrays are nested lists: a ``(B, T, D)`` array is ``x[b][t][d]``. Floats are
Python floats, i.e. IEEE float64. The arithmetic imports nothing but the
standard library (and the shared checks, which look only at shapes);
``asarray`` / ``to_numpy`` (``convert.py``) are the one door to numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from ..common import checks
from .convert import asarray, to_numpy  # noqa: F401  (the pieces load parameters with these)

Nested = Any  # nested lists of float / int / bool


def _shape(x: Nested) -> tuple[int, ...]:
    """The shape of a (rectangular) nested list; a scalar has shape ``()``."""
    dims = []
    while isinstance(x, list):
        dims.append(len(x))
        x = x[0] if x else None
    return tuple(dims)


def _leaves(x: Nested) -> Iterator[Any]:
    if isinstance(x, list):
        for item in x:
            yield from _leaves(item)
    else:
        yield x


def _is_bool(x: Nested) -> bool:
    return all(isinstance(leaf, bool) for leaf in _leaves(x))


def _element_type(x: Nested) -> str:
    """``"float"`` if every leaf is a Python float, else the first other leaf type's name."""
    for leaf in _leaves(x):
        if not isinstance(leaf, float):
            return type(leaf).__name__
    return "float"


# ------------------------------------------------------ reshaping and joining


def concat(a: Nested, b: Nested, axis: int) -> Nested:
    """Join two nested lists along ``axis`` (e.g. cached keys and new keys along time)."""
    if axis == 0:
        return a + b
    return [concat(ra, rb, axis - 1) for ra, rb in zip(a, b, strict=True)]


def split_heads(x: Nested, H: int) -> Nested:
    """``(B, T, D)`` -> ``(B, H, T, Dh)``: head ``h`` owns features ``h*Dh .. (h+1)*Dh - 1``."""
    Dh = len(x[0][0]) // H
    return [[[vec[h * Dh : (h + 1) * Dh] for vec in seq] for h in range(H)] for seq in x]


def merge_heads(x: Nested) -> Nested:
    """``(B, H, T, Dh)`` -> ``(B, T, D)``: the heads' outputs side by side."""
    out = []
    for heads in x:
        T = len(heads[0])
        out.append([[value for head in heads for value in head[t]] for t in range(T)])
    return out


# ---------------------------------------------------------------- arithmetic


def _on_vectors(fn: Callable[[list], list], x: Nested) -> Nested:
    """Apply ``fn`` to every vector along the last axis of ``x (..., N)``."""
    if not isinstance(x, list):
        raise TypeError(f"level 0 computes on nested lists (see asarray), got {type(x).__name__}")
    if isinstance(x[0], list):
        return [_on_vectors(fn, item) for item in x]
    return fn(x)


def _dot(a: list[float], b: list[float]) -> float:
    return sum(ai * bi for ai, bi in zip(a, b, strict=True))


def add(x: Nested, y: Nested) -> Nested:
    """Elementwise ``x + y`` for two nested lists of the same shape (the residual connection)."""
    if isinstance(x, list):
        return [add(a, b) for a, b in zip(x, y, strict=True)]
    return x + y


def linear(x: Nested, weight: Nested, bias: Nested | None) -> Nested:
    """``x (..., In) @ weight.T + bias``, weight ``(Out, In)`` as in ``nn.Linear``."""

    def one(vec: list[float]) -> list[float]:
        out = [_dot(row, vec) for row in weight]
        return out if bias is None else [o + b for o, b in zip(out, bias, strict=True)]

    return _on_vectors(one, x)


def layer_norm(x: Nested, weight: Nested, bias: Nested | None, eps: float) -> Nested:
    """Normalise each vector of ``x (..., D)`` to mean 0 and variance 1, then scale and shift.

    As ``nn.LayerNorm``: the *biased* variance (divide by D, not D - 1) and
    ``eps`` inside the square root.
    """

    def one(vec: list[float]) -> list[float]:
        D = len(vec)
        mean = sum(vec) / D
        var = sum((v - mean) ** 2 for v in vec) / D
        inv_std = 1.0 / math.sqrt(var + eps)
        out = [(v - mean) * inv_std * w for v, w in zip(vec, weight, strict=True)]
        return out if bias is None else [o + b for o, b in zip(out, bias, strict=True)]

    return _on_vectors(one, x)


def gelu(x: Nested) -> Nested:
    """Exact GELU, ``x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))`` (not the tanh approximation)."""
    if isinstance(x, list):
        return [gelu(item) for item in x]
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def embed(table: Nested, tokens: Nested, scale: float) -> Nested:
    """Rows of ``table (V, D)`` picked by ``tokens (B, T)``, times ``scale`` -> ``(B, T, D)``."""
    return [[[scale * e for e in table[t]] for t in row] for row in tokens]


def rope(x: Nested, position_offset: int, base: float) -> Nested:
    """Rotary position embedding of ``x (B, H, T, Dh)``; time step ``t`` sits at ``position_offset + t``.

    Features are rotated in adjacent pairs: pair ``i`` = ``(a, b) = (x[2i], x[2i+1])``
    turns by the angle ``pos * base^(-2i/Dh)``, i.e.
    ``(a, b) -> (a cos - b sin, b cos + a sin)`` = ``(a, b) * cos + (-b, a) * sin``.
    A dot product of two rotated vectors then depends only on their distance.
    """

    def rotate(vec: list[float], pos: int) -> list[float]:
        Dh = len(vec)
        out = []
        for i in range(Dh // 2):
            angle = pos * base ** (-2 * i / Dh)
            c, s = math.cos(angle), math.sin(angle)
            a, b = vec[2 * i], vec[2 * i + 1]
            out += [a * c - b * s, b * c + a * s]
        return out

    return [
        [[rotate(vec, position_offset + t) for t, vec in enumerate(head)] for head in seq]
        for seq in x
    ]


def softmax(scores: list[float]) -> list[float]:
    """Softmax of one row of scores.

    Subtracting the row maximum first changes nothing mathematically (it cancels
    between numerator and denominator) but keeps every ``exp`` argument <= 0, so
    no term overflows to inf, and the largest term is exactly 1, so the sum is >= 1.
    """
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


def _mask_reader(mask: Nested, target: tuple[int, int, int, int]) -> Callable[..., bool]:
    """A function ``(b, h, i, j) -> bool`` reading ``mask`` with numpy-style broadcasting."""
    mshape = _shape(mask)
    lead = len(target) - len(mshape)  # missing leading axes broadcast

    def read(*index: int) -> bool:
        value = mask
        for idx, n in zip(index[lead:], mshape, strict=True):
            value = value[idx if n != 1 else 0]
        return value

    return read


def attention(
    q: Nested,
    k: Nested,
    v: Nested,
    *,
    causal: bool = False,
    mask: Nested | None = None,
    scale: float | None = None,
) -> Nested:
    """Scaled dot-product attention, one query row at a time.

    ``q (B,H,T,Dh)``, ``k (B,H,S,Dh)``, ``v (B,H,S,Dv)`` -> ``(B,H,T,Dv)``.
    ``mask`` is boolean, True = may attend, broadcastable to ``(B,H,T,S)``;
    ``causal`` is aligned bottom-right (query ``i`` sees key ``j`` iff
    ``j <= i + S - T``); a key must pass both. ``scale`` defaults to ``1/sqrt(Dh)``.

    Keys a query may not attend are simply left out of its softmax, which is
    what adding ``-inf`` to their scores means; a row left with no key at all
    is a ``ValueError``, since its softmax would be 0/0.
    """
    B, H, T, S, Dh, Dv = checks.attention_dims(_shape(q), _shape(k), _shape(v))
    types = [_element_type(a) for a in (q, k, v)]
    checks.check_float_inputs(["f" if t == "float" else "?" for t in types], types)
    checks.check_scale(scale)
    read_mask = None
    if mask is not None:
        checks.check_mask(_shape(mask), _is_bool(mask), (B, H, T, S))
        read_mask = _mask_reader(mask, (B, H, T, S))
    if scale is None:
        scale = 1.0 / math.sqrt(Dh)
    offset = checks.causal_offset(T, S)

    out = []
    for b in range(B):
        heads = []
        for h in range(H):
            rows = []
            for i in range(T):
                keys = [
                    j
                    for j in range(S)
                    if (not causal or j <= i + offset)
                    and (read_mask is None or read_mask(b, h, i, j))
                ]
                if not keys:
                    raise ValueError(checks.EMPTY_ROW_MESSAGE)
                scores = [scale * _dot(q[b][h][i], k[b][h][j]) for j in keys]
                weights = softmax(scores)
                rows.append(
                    [
                        sum(w * v[b][h][j][d] for w, j in zip(weights, keys, strict=True))
                        for d in range(Dv)
                    ]
                )
            heads.append(rows)
        out.append(heads)
    return out
