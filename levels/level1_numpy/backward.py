"""Level 1's backward pass: every op's gradient, written by hand, recorded on a tape.

A ``Tape`` is an ops namespace: it has every function of ``ops.py`` with the
same arguments, so the architecture of ``level0_loops`` (layers, models) can
be built with ``ops=tape`` exactly as level 1 builds it with plain numpy. Each differentiable op
computes its forward with ``ops``, then appends one entry to the tape:
its output, its inputs, and a ``backward`` closure that maps the gradient of
the output to the gradients of the inputs. ``Tape.backward`` replays the
entries newest first (the chain rule, one op at a time) and sums the
gradients of the parameters.

Notation: for an op ``y = f(x, ...)`` and a scalar loss ``L``, ``g`` is
``dL/dy`` (same shape as ``y``) and each backward returns ``dL/dx`` for every
input (``None`` for inputs without a gradient: token ids, masks).
Matrix shapes use the symbols of docs/conventions.md; ``N`` is "all leading
axes flattened" (``B*T`` for a ``(B, T, D)`` activation).

Parameters are recognised by identity: the tape is given the parameter dict
that the model computes with, and a gradient arriving at one of those arrays,
or at a view of one (``MultiHeadAttention`` reads ``w_q``, ``w_k``, ``w_v`` as
row slices of ``in_proj_weight``), is added to the same place of that
parameter's gradient. A parameter used twice (the tied embedding: gather at
the input, projection at the output) sums both contributions, as it must.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..common import semantics
from . import ops

Grads = tuple[np.ndarray | None, ...]


def _sum_to_last_axis(g: np.ndarray) -> np.ndarray:
    """``(..., N) -> (N,)``: the gradient of a vector broadcast over every leading axis."""
    return g.reshape(-1, g.shape[-1]).sum(axis=0)


class Tape:
    """An ops namespace that records each op's backward; see the module docstring.

    ``Tape(params)``: ``params`` maps canonical names to the arrays the model
    computes with (its ``parameters()``). Run one forward through classes built
    with ``ops=tape``, then ``backward(output, grad)``. A tape serves one forward.
    """

    # The converters and the functions of positions and masks are level 1's own, unchanged
    # (nothing flows back through them: ids, positions, masks, zeroed padding).
    asarray = staticmethod(ops.asarray)
    to_numpy = staticmethod(ops.to_numpy)
    zero_padded = staticmethod(ops.zero_padded)
    visible = staticmethod(ops.visible)

    def __init__(self, params: Mapping[str, np.ndarray]):
        self._params = dict(params)
        self._name_of = {id(array): name for name, array in self._params.items()}
        # (outputs, inputs, backward), in the order the forward ran them. An op
        # with several outputs (attention's out and lse) records them together;
        # its backward gets one gradient per output (None for an unused one).
        self._entries: list[tuple[tuple[np.ndarray, ...], tuple[Any, ...], Callable]] = []

    def _record(self, output: np.ndarray, inputs: tuple, backward: Callable) -> np.ndarray:
        self._entries.append(((output,), inputs, backward))
        return output

    def _record_pair(self, outputs: tuple, inputs: tuple, backward: Callable) -> tuple:
        self._entries.append((outputs, inputs, backward))
        return outputs

    # ------------------------------------------------------------ the backward

    def backward(self, output: np.ndarray, grad: np.ndarray, *more) -> dict[str, np.ndarray]:
        """Gradients of every parameter, given ``grad = dL/d output`` for the tape's final output
        (and more ``output, grad`` pairs after it, for a loss that reads several outputs).

        Entries are replayed newest first, so an array's gradient is complete
        (every consumer has added its share) before the op that produced it
        passes it on. Returns ``{name: dL/d param}`` for every parameter of the
        dict the tape was given (zeros for one the loss does not reach).
        """
        param_grads = {name: np.zeros_like(array) for name, array in self._params.items()}
        # Gradients of intermediate arrays, keyed by id. The entries keep every
        # array alive until the tape is dropped, so no id is reused meanwhile.
        seeds = [(output, grad), *zip(more[0::2], more[1::2], strict=True)]
        pending = {id(out): g for out, g in seeds}
        for outs, inputs, backward in reversed(self._entries):
            gs = [pending.pop(id(out), None) for out in outs]
            if all(g is None for g in gs):  # no output of this op reached the loss
                continue
            grads = backward(*gs)  # an unused output of several contributes None
            for x, gx in zip(inputs, grads, strict=True):
                if gx is None:
                    continue
                slot = self._parameter_slot(x, param_grads)
                if slot is not None:
                    slot += gx
                else:  # not in place: backward may return one array for two inputs
                    pending[id(x)] = pending[id(x)] + gx if id(x) in pending else gx
        return param_grads

    def _parameter_slot(self, x: Any, param_grads: dict[str, np.ndarray]) -> np.ndarray | None:
        """Where ``x``'s gradient goes if ``x`` is a parameter or a view of one, else None.

        For a view (``in_proj_weight[:D]``) it is the same view of the
        parameter's gradient: same byte offset, shape and strides.
        """
        base = x if id(x) in self._name_of else getattr(x, "base", None)
        if base is None or id(base) not in self._name_of:
            return None
        grad = param_grads[self._name_of[id(base)]]
        if x is base:
            return grad
        offset = x.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        return np.ndarray(x.shape, x.dtype, buffer=grad, offset=offset, strides=x.strides)

    # ----------------------------------------------- reshaping and joining ops

    def split_heads(self, x: np.ndarray, H: int) -> np.ndarray:
        # (B,T,D) -> (B,H,T,Dh) only moves numbers, so the backward moves them back.
        return self._record(ops.split_heads(x, H), (x,), lambda g: (ops.merge_heads(g),))

    def merge_heads(self, x: np.ndarray) -> np.ndarray:
        H = x.shape[1]
        # (B,H,T,Dh) -> (B,T,D); backward (B,T,D) -> (B,H,T,Dh).
        return self._record(ops.merge_heads(x), (x,), lambda g: (ops.split_heads(g, H),))

    def concat(self, a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
        # Training runs whole sequences: nothing is appended to a KV cache.
        raise NotImplementedError("level 1's tape does not differentiate through a KV cache")

    # ------------------------------------------------------------ arithmetic

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        # Residual: d(x + y)/dx = d(x + y)/dy = identity, so both inputs receive g.
        return self._record(ops.add(x, y), (x, y), lambda g: (g, g))

    def embed(self, table: np.ndarray, tokens: np.ndarray, scale: float) -> np.ndarray:
        # y[b,t] = scale * E[tokens[b,t]]: row v of dE sums scale * g over the
        # positions holding token v. np.add.at accumulates repeated indices
        # (a plain fancy-index += would keep only one of them).
        def backward(g):  # g (B,T,D)
            d_table = np.zeros_like(table)  # (V, D)
            rows = tokens.reshape(-1)  # (B,T) -> (N,)
            np.add.at(d_table, rows, scale * g.reshape(-1, g.shape[-1]))  # (N, D) into (V, D)
            return d_table, None

        return self._record(ops.embed(table, tokens, scale), (table, tokens), backward)

    def linear(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        # y = x W^T + b with W (Out, In). Per row: dx = g W; dW = sum over rows g^T x;
        # db = sum over rows of g.
        def backward(g):  # g (..., Out)
            d_x = g @ weight  # (..., Out) @ (Out, In) -> (..., In)
            g2 = g.reshape(-1, g.shape[-1])  # (N, Out)
            x2 = x.reshape(-1, x.shape[-1])  # (N, In)
            d_weight = g2.T @ x2  # (Out, N) @ (N, In) -> (Out, In)
            d_bias = None if bias is None else g2.sum(axis=0)  # (Out,)
            return d_x, d_weight, d_bias

        return self._record(ops.linear(x, weight, bias), (x, weight, bias), backward)

    def layer_norm(self, x: np.ndarray, weight, bias, eps: float, offset: float = 0.0):
        # y = xhat * w + b, xhat = (x - mean) * r, r = 1/sqrt(var + eps), over D features.
        # dw = sum over rows of g * xhat, db = sum of g. With gh = g * w (the
        # gradient at xhat), differentiating mean and var (both depend on every x_j):
        #   dx = r * (gh - mean(gh) - xhat * mean(gh * xhat))
        # (from dxhat_i/dx_j = r (delta_ij - 1/D - xhat_i xhat_j / D)). The two
        # subtracted terms are what the normalisation undoes: a shift of x along
        # the all-ones direction (taken out by the mean) and, up to eps, a scaling
        # along xhat (taken out by the variance). With Gemma's gains, w is offset + weight:
        # the same formulas, since d(offset + weight) = d weight.
        xhat, inv_std = ops.normalise(x, eps)  # (..., D), (..., 1)
        w = ops.gain(weight, offset)  # (D,)

        def backward(g):  # g (..., D)
            gh = g * w  # (..., D)
            d_x = inv_std * (
                gh
                - gh.mean(axis=-1, keepdims=True)
                - xhat * (gh * xhat).mean(axis=-1, keepdims=True)
            )
            d_weight = _sum_to_last_axis(g * xhat)  # (D,)
            d_bias = None if bias is None else _sum_to_last_axis(g)  # (D,)
            return d_x, d_weight, d_bias

        y = xhat * w if bias is None else xhat * w + bias
        return self._record(y, (x, weight, bias), backward)

    def rms_norm(self, x: np.ndarray, weight, eps: float, offset: float = 0.0) -> np.ndarray:
        # y = xhat * w, xhat = x * r, r = 1/sqrt(mean(x^2) + eps) over D features
        # (w = offset + weight). dw = sum over rows of g * xhat. With gh = g * w (the
        # gradient at xhat), dr/dx_j = -r^3 x_j / D, so
        #   dx = r * (gh - xhat * mean(gh * xhat))
        # LayerNorm's formula without the mean term: nothing is centred here.
        xhat, inv_rms = ops.rms_normalise(x, eps)  # (..., D), (..., 1)
        w = ops.gain(weight, offset)  # (D,)

        def backward(g):  # g (..., D)
            gh = g * w  # (..., D)
            d_x = inv_rms * (gh - xhat * (gh * xhat).mean(axis=-1, keepdims=True))
            return d_x, _sum_to_last_axis(g * xhat), None

        return self._record(xhat * w, (x, weight, eps), backward)

    def mul(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        # d(x * y) = y dx + x dy, elementwise.
        return self._record(ops.mul(x, y), (x, y), lambda g: (g * y, g * x))

    def silu(self, x: np.ndarray) -> np.ndarray:
        # y = x s(x) with s the sigmoid, s' = s (1 - s): dy/dx = s + x s (1 - s).
        s = ops.sigmoid(x)

        def backward(g):
            return (g * (s + x * s * (1.0 - s)),)

        return self._record(x * s, (x,), backward)

    def gelu(self, x: np.ndarray) -> np.ndarray:
        # y = x Phi(x) with Phi the standard normal CDF, so
        # dy/dx = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi) its density.
        # Phi is kept from the forward: erf is the costly part.
        cdf = ops.normal_cdf(x)

        def backward(g):
            pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
            return (g * (cdf + x * pdf),)

        return self._record(x * cdf, (x,), backward)

    def gelu_tanh(self, x: np.ndarray) -> np.ndarray:
        # y = x/2 (1 + t), t = tanh(u), u = b (x + k x^3) (b = sqrt(2/pi), k = 0.044715):
        # dy/dx = (1 + t)/2 + x/2 (1 - t^2) b (1 + 3 k x^2).
        b, k = ops.GELU_TANH_BETA, ops.GELU_TANH_KAPPA
        t = np.tanh(b * (x + k * x * x * x))

        def backward(g):
            return (g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * b * (1.0 + 3.0 * k * x * x)),)

        return self._record(0.5 * x * (1.0 + t), (x,), backward)

    def rope(self, x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
        # Each pair is multiplied by a rotation matrix R(theta), so dx = R(theta)^T g
        # = R(-theta) g: the inverse rotation, i.e. the same rotation with sin negated.
        cos, sin = ops.rope_angles(positions, x.shape[-1], base, x.dtype)  # (B,1,T,Dh/2) each

        def backward(g):  # g (B,H,T,Dh)
            return (ops.rotate_pairs(g, cos, -sin),)

        return self._record(ops.rotate_pairs(x, cos, sin), (x,), backward)

    def attention(
        self, q, k, v, *, causal=False, mask=None, scale=None, window=None, return_lse=False
    ):
        ops.check_attention(q, k, v, causal=causal, mask=mask, scale=scale, window=window)
        kw = {"causal": causal, "mask": mask, "scale": scale, "window": window}
        return self.attend(q, k, v, **kw, return_lse=return_lse)

    def attend(
        self, q, k, v, *, causal=False, mask=None, scale=None, window=None, return_lse=False
    ):
        # Forward: s = scale q k^T, p = softmax(s) over allowed keys, o = p v, and
        # lse = log sum_j exp(s_j) over the same keys. With g = dL/do and e = dL/dlse:
        #   dv = p^T g                      (B,H,S,T) @ (B,H,T,Dv)
        #   dp = g v^T                      (B,H,T,Dv) @ (B,H,Dv,S)
        #   ds = p * (dp - rowsum(p * dp))  softmax's Jacobian, row by row
        #      + p * e                      d lse / d s = p
        #   dq = scale ds k,  dk = scale ds^T q
        # A forbidden key has p = 0, hence ds = 0: no gradient flows through it,
        # exactly as if it had been left out of the softmax. With grouped-query
        # attention the key/value heads were repeated for every query head of
        # their group, so their gradients are the group's summed (sum_groups).
        group = semantics.group_size(q.shape, k.shape)  # G = H // Hkv
        Dh = q.shape[-1]
        scale = 1.0 / math.sqrt(Dh) if scale is None else scale
        kr, vr = ops.repeat_heads(k, group), ops.repeat_heads(v, group)  # (B,H,S,*)
        p, lse = ops.attention_weights(q, kr, causal=causal, mask=mask, scale=scale, window=window)

        def backward(g, e=None):  # g (B,H,T,Dv) or None, e (B,H,T) or None
            if g is None:  # only lse reached the loss
                g = np.zeros(p.shape[:-1] + vr.shape[-1:], dtype=p.dtype)
            d_v = p.swapaxes(-1, -2) @ g  # (B,H,S,T) @ (B,H,T,Dv) -> (B,H,S,Dv)
            d_p = g @ vr.swapaxes(-1, -2)  # (B,H,T,Dv) @ (B,H,Dv,S) -> (B,H,T,S)
            row = (p * d_p).sum(axis=-1, keepdims=True)  # (B,H,T,1)
            if e is not None:
                row = row - e[..., None]  # p * (dp - row) + p * e = p * (dp - (row - e))
            d_s = p * (d_p - row)  # (B,H,T,S)
            d_q = scale * (d_s @ kr)  # (B,H,T,S) @ (B,H,S,Dh) -> (B,H,T,Dh)
            d_k = scale * (d_s.swapaxes(-1, -2) @ q)  # (B,H,S,T) @ (B,H,T,Dh) -> (B,H,S,Dh)
            return d_q, ops.sum_groups(d_k, group), ops.sum_groups(d_v, group)

        out = p @ vr  # (B,H,T,S) @ (B,H,S,Dv) -> (B,H,T,Dv)
        if not return_lse:
            return self._record(out, (q, k, v), backward)
        return self._record_pair((out, lse), (q, k, v), backward)

    def merge_attention(self, parts):
        # out = sum_i w_i out_i, lse = log sum_i exp(lse_i), w_i = exp(lse_i - lse).
        # d w_i / d lse_k = w_i (delta_ik - w_k), so with g = dL/dout and e = dL/dlse:
        #   d out_i = w_i g
        #   d lse_k = w_k (rowsum(g * out_k) - rowsum(g * out)) + w_k e
        out, lse = ops.merge_attention(parts)
        weights = [np.exp(p[1] - lse) for p in parts]  # (B,H,T) each

        def backward(g, e=None):
            grads = []
            if g is None:
                g = np.zeros_like(out)
            base = (g * out).sum(axis=-1)  # (B,H,T)
            for (out_k, _), w in zip(parts, weights, strict=True):
                d_lse = w * ((g * out_k).sum(axis=-1) - base)
                if e is not None:
                    d_lse = d_lse + w * e
                grads += [w[..., None] * g, d_lse]
            return tuple(grads)

        inputs = tuple(a for part in parts for a in part)  # out_1, lse_1, out_2, lse_2, ...
        return self._record_pair((out, lse), inputs, backward)


def attention_grads(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    d_out: np.ndarray,
    *,
    causal: bool = False,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    window: int | None = None,
    d_lse: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The attention forward and its hand-written backward on their own.

    ``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)`` and the upstream
    gradients ``d_out (B,H,T,Dv)`` (and ``d_lse (B,H,T)`` of the log-sum-exp,
    when it is used) -> ``(dq, dk, dv)``, the same contract as ``attention``
    (and the same errors). q, k and v are handed to the tape as its
    "parameters", so their gradients come back by name; this is what the
    benchmarks time against autograd at the torch levels.
    """
    tape = Tape({"q": q, "k": k, "v": v})
    kw = {"causal": causal, "mask": mask, "scale": scale, "window": window}
    if d_lse is None:
        out = tape.attention(q, k, v, **kw)  # (B,H,T,Dv)
        grads = tape.backward(out, d_out)
    else:
        out, lse = tape.attention(q, k, v, return_lse=True, **kw)  # (B,H,T,Dv), (B,H,T)
        grads = tape.backward(out, d_out, lse, d_lse)
    return grads["q"], grads["k"], grads["v"]
