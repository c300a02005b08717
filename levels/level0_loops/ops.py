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

import contextlib
import math
import operator
from collections.abc import Callable, Iterator
from typing import Any

from ..common import checks, semantics
from .convert import Nested, asarray, to_numpy  # noqa: F401  (the pieces load parameters with these)


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


# ------------------------------------------------------ what the public methods and caches ask


def last_position(x: Nested) -> Nested:
    """``(B,T,N) -> (B,N)``: each row's last position (a decode step's logits)."""
    return [seq[-1] for seq in x]


def at_positions(x: Nested, positions: list[int]) -> Nested:
    """``(B,T,N) -> (B,1,N)``: position ``positions[b]`` of row ``b``."""
    return [[seq[t]] for seq, t in zip(x, positions, strict=True)]


def zero_padded(x: Nested, valid: list[list[bool]]) -> Nested:
    """``x (B,T,N)`` with the vectors at padded positions (``valid`` False) exactly zero."""
    return [
        [vec if real else [0.0] * len(vec) for vec, real in zip(seq, row, strict=True)]
        for seq, row in zip(x, valid, strict=True)
    ]


# ------------------------------------------------------ reshaping and joining


def prefix(x: Nested, n: int, axis: int) -> Nested:
    """The first ``n`` entries along ``axis``: a cache's first ``n`` slots, of its keys
    ``(B, Hkv, S, Dh)`` along axis 2 or of its positions ``(B, S)`` along axis 1."""
    if axis == 0:
        return x[:n]
    return [prefix(item, n, axis - 1) for item in x]


def last_slots(positions: Nested) -> list[int]:
    """``positions (B, T)`` -> each row's slot of its largest position: its last real token."""
    return [row.index(max(row)) for row in positions]


def next_positions(positions: Nested) -> list[int]:
    """``positions (B, S)`` of a cache -> each row's next position (0 for an empty row)."""
    return [max(row, default=-1) + 1 for row in positions]


def inference():
    """What the generation loops run the model in: nothing to switch off here (no autograd)."""
    return contextlib.nullcontext()


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
    """``sum_i a_i b_i``. ``map(mul, a, b)`` is the same loop as ``a_i * b_i for ...``, run by
    the interpreter's C code instead of a Python frame per term: twice as fast, same order."""
    return sum(map(operator.mul, a, b))


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


def _gain(weight: list[float], offset: float) -> list[float]:
    """A norm's gain: ``offset + weight`` (Gemma's gains are offsets from 1), or ``weight``."""
    return weight if offset == 0.0 else [offset + w for w in weight]


def layer_norm(
    x: Nested, weight: Nested, bias: Nested | None, eps: float, offset: float = 0.0
) -> Nested:
    """Normalise each vector of ``x (..., D)`` to mean 0 and variance 1, then scale and shift.

    As ``nn.LayerNorm``: the *biased* variance (divide by D, not D - 1) and
    ``eps`` inside the square root. The gain is ``offset + weight``.
    """
    gain = _gain(weight, offset)

    def one(vec: list[float]) -> list[float]:
        D = len(vec)
        mean = sum(vec) / D
        var = sum((v - mean) ** 2 for v in vec) / D
        inv_std = 1.0 / math.sqrt(var + eps)
        out = [(v - mean) * inv_std * w for v, w in zip(vec, gain, strict=True)]
        return out if bias is None else [o + b for o, b in zip(out, bias, strict=True)]

    return _on_vectors(one, x)


def rms_norm(x: Nested, weight: Nested, eps: float, offset: float = 0.0) -> Nested:
    """Scale each vector of ``x (..., D)`` to a root mean square of 1, then by the gain.

    ``x / sqrt(mean(x^2) + eps) * (offset + weight)`` (Zhang & Sennrich 2019): LayerNorm
    without the centring and without a bias, as Llama, Mistral and Qwen2 use it (offset 0)
    and Gemma (offset 1: its weights are the gains' distances from 1).
    """
    gain = _gain(weight, offset)

    def one(vec: list[float]) -> list[float]:
        inv_rms = 1.0 / math.sqrt(sum(v * v for v in vec) / len(vec) + eps)
        return [v * inv_rms * w for v, w in zip(vec, gain, strict=True)]

    return _on_vectors(one, x)


def mul(x: Nested, y: Nested) -> Nested:
    """Elementwise ``x * y`` for two nested lists of the same shape (SwiGLU's gate)."""
    if isinstance(x, list):
        return [mul(a, b) for a, b in zip(x, y, strict=True)]
    return x * y


def silu(x: Nested) -> Nested:
    """SiLU (swish), ``x * sigmoid(x) = x / (1 + exp(-x))``: SwiGLU's gate activation.

    ``exp(-x)`` overflows for ``x < -709``; then ``x / inf`` is ``-0.0``, the limit.
    """
    if isinstance(x, list):
        return [silu(item) for item in x]
    return x / (1.0 + math.exp(-x)) if x > -700.0 else -0.0


def gelu(x: Nested) -> Nested:
    """Exact GELU, ``x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))`` (not the tanh approximation)."""
    if isinstance(x, list):
        return [gelu(item) for item in x]
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


GELU_TANH_BETA = math.sqrt(2.0 / math.pi)  # the tanh approximation's constants
GELU_TANH_KAPPA = 0.044715


def gelu_tanh(x: Nested) -> Nested:
    """GELU's tanh approximation, ``x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``: GeGLU's
    gate activation in Gemma (PyTorch's ``gelu(approximate="tanh")``, transformers'
    ``gelu_pytorch_tanh``). ``tanh`` saturates at +-1, so no term overflows."""
    if isinstance(x, list):
        return [gelu_tanh(item) for item in x]
    return 0.5 * x * (1.0 + math.tanh(GELU_TANH_BETA * (x + GELU_TANH_KAPPA * x * x * x)))


def embed(table: Nested, tokens: Nested, scale: float) -> Nested:
    """Rows of ``table (V, D)`` picked by ``tokens (B, T)``, times ``scale`` -> ``(B, T, D)``."""
    return [[[scale * e for e in table[t]] for t in row] for row in tokens]


def rope(x: Nested, positions: Nested, base: float) -> Nested:
    """Rotary position embedding of ``x (B, H, T, Dh)``, token ``t`` of row ``b`` at position
    ``positions[b][t]`` (a padded token, ``-1``, turns as position 0: nobody sees its key,
    and its output is zeroed).

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
        [[rotate(vec, max(pos, 0)) for vec, pos in zip(head, row, strict=True)] for head in seq]
        for seq, row in zip(x, positions, strict=True)
    ]


def visible(q_pos: Nested, k_pos: Nested, window: int | None = None, *, causal=True) -> Nested:
    """What each query may see, by position: ``q_pos (B,T)``, ``k_pos (B,S)`` -> ``(B,1,T,S)``
    booleans, ``semantics.sees`` for every pair; a padded query sees its row's first key."""
    return [
        [[[semantics.sees(q, k, window, causal=causal) or (q < 0 and j == 0)
           for j, k in enumerate(keys)] for q in queries]]
        for queries, keys in zip(q_pos, k_pos, strict=True)
    ]  # fmt: skip


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


def logsumexp(xs: list[float]) -> float:
    """``log sum exp(x)`` as ``max + log sum exp(x - max)``: no term overflows."""
    top = max(xs)
    return top + math.log(sum(math.exp(x - top) for x in xs))


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
    window: int | None = None,
    return_lse: bool = False,
) -> Nested:
    """Scaled dot-product attention, one query row at a time.

    ``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)`` -> ``(B,H,T,Dv)``.
    Query head ``h`` reads key/value head ``h // (H // Hkv)`` (grouped-query
    attention when ``Hkv < H``). ``mask`` is boolean, True = may attend,
    broadcastable to ``(B,H,T,S)``; ``causal`` is aligned bottom-right (query
    ``i`` sees key ``j`` iff ``j <= i + S - T``); ``window`` keeps the ``W``
    latest keys of each query (causal) or the band ``|j - (i + S - T)| < W``;
    a key must pass all of them. ``scale`` defaults to ``1/sqrt(Dh)``.
    ``return_lse`` also returns ``lse (B,H,T)``, the natural log of each row's
    sum of ``exp(scaled score)`` over its keys.

    Keys a query may not attend are simply left out of its softmax, which is
    what adding ``-inf`` to their scores means; a row left with no key at all
    is a ``ValueError``, since its softmax would be 0/0. The checks, then ``attend``.
    """
    B, H, T, S, Dh, Dv = checks.attention_dims(_shape(q), _shape(k), _shape(v))
    types = [_element_type(a) for a in (q, k, v)]
    checks.check_float_inputs(["f" if t == "float" else "?" for t in types], types)
    checks.check_scale(scale)
    checks.check_window(window)
    if mask is not None:
        checks.check_mask(_shape(mask), _is_bool(mask), (B, H, T, S))
    kw = {"causal": causal, "mask": mask, "scale": scale, "window": window}
    return attend(q, k, v, **kw, return_lse=return_lse)


def attend(q, k, v, *, causal=False, mask=None, scale=None, window=None, return_lse=False):
    """``attention`` on inputs it would accept, unchecked: the core the models call (on
    inputs their edge has checked). A row with no key is still refused, where its empty
    list of keys is found."""
    B, H, T, Dh = _shape(q)
    S, Dv = len(k[0][0]), len(v[0][0][0])
    read_mask = None if mask is None else _mask_reader(mask, (B, H, T, S))
    if scale is None:
        scale = 1.0 / math.sqrt(Dh)
    group = semantics.group_size(_shape(q), _shape(k))  # query heads per key/value head

    out, lse = [], []
    for b in range(B):
        heads, heads_lse = [], []
        for h in range(H):
            kh = h // group  # the key/value head this query head reads
            rows, rows_lse = [], []
            for i in range(T):
                lo, hi = semantics.key_range(i, T, S, causal=causal, window=window)
                keys = [j for j in range(lo, hi) if read_mask is None or read_mask(b, h, i, j)]
                if not keys:
                    raise ValueError(checks.EMPTY_ROW_MESSAGE)
                scores = [scale * _dot(q[b][h][i], k[b][kh][j]) for j in keys]
                weights = softmax(scores)
                rows.append(
                    [
                        sum(w * v[b][kh][j][d] for w, j in zip(weights, keys, strict=True))
                        for d in range(Dv)
                    ]
                )
                if return_lse:
                    rows_lse.append(logsumexp(scores))
            heads.append(rows)
            heads_lse.append(rows_lse)
        out.append(heads)
        lse.append(heads_lse)
    return (out, lse) if return_lse else out


def merge_attention(parts: list[tuple[Nested, Nested]]) -> tuple[Nested, Nested]:
    """Attention over the union of disjoint key sets, from each set's ``(out, lse)``.

    For one query row with log-sum-exps ``l_1 .. l_n`` over the sets, the whole
    row's is ``l = log sum_i exp(l_i)`` and its softmax weights are each set's
    own scaled by ``exp(l_i - l)``, so ``out = sum_i exp(l_i - l) out_i``
    (``out_i (B,H,T,Dv)``, ``lse_i (B,H,T)``). The subtraction of the largest
    ``l_i`` inside the log keeps every ``exp`` at most 1.
    """
    if not parts:
        raise ValueError("merge_attention needs at least one (out, lse) part")
    outs, lses = [p[0] for p in parts], [p[1] for p in parts]
    B, H, T = len(lses[0]), len(lses[0][0]), len(lses[0][0][0])
    out, lse = [], []
    for b in range(B):
        heads, heads_lse = [], []
        for h in range(H):
            rows, rows_lse = [], []
            for i in range(T):
                ls = [part[b][h][i] for part in lses]
                total = logsumexp(ls)
                weights = [math.exp(x - total) for x in ls]
                Dv = len(outs[0][b][h][i])
                rows.append(
                    [
                        sum(w * o[b][h][i][d] for w, o in zip(weights, outs, strict=True))
                        for d in range(Dv)
                    ]
                )
                rows_lse.append(total)
            heads.append(rows)
            heads_lse.append(rows_lse)
        out.append(heads)
        lse.append(heads_lse)
    return out, lse
