"""What counts as right: the float64 reference, the error measure, and each dtype's bound.

A ``Case`` is one workload built for one subject: the call to time and its
check against this reference. The runner checks every case before timing it,
and a case over its bound is reported as wrong and never timed: a fast wrong
answer is not a result.

The reference
-------------
Level 1 (numpy) run in float64 is the reference for values: attention outputs,
logits and generated tokens. The attention gradients come from level 2 (torch
autograd through the written-out attention) run in float64, so level 1's
hand-written backward is measured against an independent computation. A level
measured against itself in float64 shows an error of zero, which is what that
comparison means.

On a GPU run (``device="cuda"``) the attention reference is level 2 in float64
on the GPU instead: at the GPU sweep's sizes (``B=4, H=16, T=16384``) level 1 on
the CPU would take minutes per size. Same formula, same float64, another device.

The inputs the reference sees are the level's own inputs after rounding to
the level's dtype (``round_to``), so an error figure is the computation's error,
not the rounding of the inputs. Results are cached per workload, since every
level is compared against the same numbers.

The error and its bounds
------------------------
Errors are ``max |x - ref| / max(1, max |ref|)`` (``scaled_error``: the absolute
error for values of order one, a relative one for large values), or, for
generated tokens, the number of tokens that differ from the reference's. The
bounds are loose enough for the rounding of each dtype on these workloads,
tight enough that a real bug (a wrong mask, a dropped bias, a misaligned
causal rule: errors of order 0.1 to 1) fails:

* float64: 1e-9. The levels agree to ~1e-14 in float64 (the test suite holds
  them to 1e-13); one hidden float32 step would show as ~1e-7.
* float32: 1e-3. eps is 1.2e-7; sums over thousands of keys and a few layers
  give up to ~1e-5 here, so two orders of margin.
* float16: 2e-2 and bfloat16: 1e-1. eps is 9.8e-4 and 7.8e-3; a low-precision
  output is a few eps off on values of order one. (The test suite holds the
  levels to the sharper rule, at most 2x PyTorch's own error in the dtype.)

Generated tokens are compared one by one: in float64 and float32 greedy
decoding must reproduce the reference's tokens exactly (the argmax margins of
these random models are far above float32 rounding); in float16 and bfloat16
a near-tie may flip one argmax and everything after it, so up to half the
generated tokens may differ before the case counts as wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

import levels
from levels.common.config import TransformerConfig

VALUE_LEVEL = "level1_numpy"
WINDOW_CHUNK = 512  # queries per chunk of the windowed reference
GRAD_LEVEL = "level2_torch_manual"
ERROR_BOUNDS = {"float64": 1e-9, "float32": 1e-3, "float16": 2e-2, "bfloat16": 1e-1}


@dataclass
class Case:
    """One workload built for one subject: a callable to time and how to judge it."""

    fn: Callable[[], object]  # the timed call; inputs are already native
    error: Callable[[], float] | None = None  # the error against the float64 reference
    error_of: str = ""  # what the error compares, e.g. "output", "dq,dk,dv", "logits"
    bound: float = 0.0  # the largest error that counts as right (``error_bound``)
    extras: dict[str, float] = field(default_factory=dict)


def error_bound(dtype: str) -> float:
    return ERROR_BOUNDS[dtype]


def token_bound(dtype: str, generated: int) -> float:
    """How many of ``generated`` tokens may differ from the reference's."""
    return 0.0 if dtype in ("float64", "float32") else float(math.floor(generated / 2))


def scaled_error(got: np.ndarray, want: np.ndarray) -> float:
    """``max |got - want| / max(1, max |want|)``, in float64 (inf for a non-finite value)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise ValueError(f"shape {got.shape} != reference shape {want.shape}")
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))


def round_to(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` rounded to ``dtype`` (any torch float dtype, bfloat16 included), back in float64."""
    if dtype == "float64":
        return np.asarray(a, dtype=np.float64)
    import torch

    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))
    return t.to(getattr(torch, dtype)).to(torch.float64).numpy()


def _load(name: str) -> ModuleType | None:
    try:
        return levels.load(name)
    except ImportError:
        return None


class Reference:
    """Lazily loaded float64 reference levels, with a small cache of their results."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device  # where the float64 attention reference runs (torch only)
        self._modules: dict[str, ModuleType | None] = {}
        self._cache: dict[Any, Any] = {}

    def _level(self, name: str) -> ModuleType:
        if name not in self._modules:
            self._modules[name] = _load(name)
        module = self._modules[name]
        if module is None:
            raise LookupError(f"the float64 reference needs {name}, which is unavailable")
        return module

    def _cached(self, key: Any, compute) -> Any:
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def attention(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, window: int | None = None
    ) -> np.ndarray:
        """Level 1 attention in float64 on ``q (B,H,T,Dh)``, ``k, v (B,H,S,Dh)`` -> ``(B,H,T,Dh)``.

        Computed one ``(b, h)`` slice at a time so the ``(T, S)`` float64 score
        matrix of only one head is alive at once; with a causal ``window``, one
        chunk of queries at a time against the keys its window reaches.
        """
        if self.device.startswith("cuda"):
            return self._attention_on_device(q, k, v, causal, window)
        level1 = self._level(VALUE_LEVEL)

        def one(qh, kh, vh):  # (1,1,T,Dh) -> (1,1,T,Dv)
            if window is None or not causal:  # a band without causal: one (T, S) matrix
                return np.asarray(level1.attention(qh, kh, vh, causal=causal, window=window))
            T, S = qh.shape[-2], kh.shape[-2]
            out = np.empty(qh.shape[:3] + vh.shape[3:])
            for a in range(0, T, WINDOW_CHUNK):
                b = min(T, a + WINDOW_CHUNK)
                lo = max(0, a + S - T - window + 1)
                # The chunk's queries sit at a + S - T.. among the sliced keys lo..: bottom-right
                # alignment of b - a queries against b + S - T - lo keys.
                hi = b + S - T
                out[:, :, a:b] = level1.attention(
                    qh[:, :, a:b], kh[:, :, lo:hi], vh[:, :, lo:hi], causal=causal, window=window
                )
            return out

        def compute() -> np.ndarray:
            out = np.empty(q.shape[:3] + v.shape[3:], dtype=np.float64)  # (B,H,T,Dv)
            for b in range(q.shape[0]):
                for h in range(q.shape[1]):
                    sl = (x[b : b + 1, h : h + 1] for x in (q, k, v))  # (1,1,T|S,Dh) each
                    out[b, h] = one(*sl)[0, 0]
            return out

        return self._cached(("attention", _digest(q, k, v), causal, window), compute)

    def _attention_on_device(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, window: int | None
    ) -> np.ndarray:
        """Level 2 attention in float64 on ``self.device``, one batch row at a time."""
        level2 = self._level(GRAD_LEVEL)

        def compute() -> np.ndarray:
            import torch

            out = np.empty(q.shape[:3] + v.shape[3:], dtype=np.float64)  # (B,H,T,Dv)
            for b in range(q.shape[0]):
                one = (torch.from_numpy(x[b : b + 1]).to(self.device) for x in (q, k, v))
                out[b] = level2.attention(*one, causal=causal, window=window)[0].cpu().numpy()
            return out

        return self._cached(("attention", _digest(q, k, v), causal, window), compute)

    def attention_grads(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, dout: np.ndarray, causal: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``dq, dk, dv`` of ``sum(attention(q, k, v) * dout)`` by level 2 autograd in float64."""
        level2 = self._level(GRAD_LEVEL)

        def compute() -> tuple[np.ndarray, ...]:
            import torch

            leaves = [
                torch.from_numpy(x.copy()).to(self.device).requires_grad_(True) for x in (q, k, v)
            ]
            out = level2.attention(*leaves, causal=causal)  # (B,H,T,Dh)
            out.backward(torch.from_numpy(dout.copy()).to(self.device))
            return tuple(x.grad.cpu().numpy() for x in leaves)

        return self._cached(("grads", _digest(q, k, v, dout), causal), compute)

    def train_grads(self, config: TransformerConfig, params: dict, batch: Any) -> dict:
        """Every parameter's gradient of the masked cross-entropy of ``batch`` (a
        ``lab.data.Batch``), by level 2 autograd in float64 on ``params``."""
        level2 = self._level(GRAD_LEVEL)

        def compute() -> dict:
            import torch

            from lab.loss import masked_cross_entropy

            model = level2.DecoderOnlyTransformer(config, params, dtype=torch.float64)
            t = {k: torch.as_tensor(getattr(batch, k)) for k in ("inputs", "valid", "targets")}
            logits = model(t["inputs"], valid=t["valid"])  # (B,T,V)
            masked_cross_entropy(logits, t["targets"], torch.as_tensor(batch.scored)).backward()
            return {n: p.grad.numpy().copy() for n, p in model.named_parameters()}

        key = ("train grads", config, _digest(*params.values(), batch.inputs, batch.targets))
        return self._cached(key, compute)

    def _model(self, config: TransformerConfig, params: dict, dtype: str) -> Any:
        """Level 1's decoder in float64 on the parameters rounded to ``dtype``."""
        level1 = self._level(VALUE_LEVEL)

        def compute() -> Any:
            rounded = {name: round_to(p, dtype) for name, p in params.items()}
            return level1.DecoderOnlyTransformer(config, rounded, dtype=np.float64)

        return self._cached(("model", config, _digest(*params.values()), dtype), compute)

    def decoder_logits(
        self,
        config: TransformerConfig,
        params: dict,
        dtype: str,
        tokens: Sequence[np.ndarray],
        valid: Sequence[np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        """Logits ``(B_b, T_b, V)`` of each batch ``tokens[b] (B_b, T_b)``."""
        model = self._model(config, params, dtype)

        def compute() -> list[np.ndarray]:
            masks = valid if valid is not None else [None] * len(tokens)
            return [
                np.asarray(model.forward(t, valid=m)) for t, m in zip(tokens, masks, strict=True)
            ]

        key = ("logits", config, dtype, _digest(*tokens), valid is not None)
        return self._cached(key, compute)

    def generate(
        self, config: TransformerConfig, params: dict, dtype: str, prefix: np.ndarray, n: int
    ) -> np.ndarray:
        """Greedy tokens ``(B, P + n)`` from level 1 in float64, with its KV cache."""
        model = self._model(config, params, dtype)

        def compute() -> np.ndarray:
            return np.asarray(model.generate(prefix, n, use_cache=True)).astype(np.int64)

        return self._cached(("generate", config, dtype, _digest(prefix), n), compute)


def _digest(*arrays: np.ndarray) -> tuple:
    """A cache key for arrays: their shapes and a checksum of their bytes."""
    import hashlib

    h = hashlib.sha1()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.shape, a.dtype.str)).encode())
        h.update(a.tobytes())
    return (h.hexdigest(),)
