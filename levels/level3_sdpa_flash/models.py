"""Level 3's modules: level 2's, with SDPA for attention and a static KV cache.

Each class is level 2's, re-parameterised through its ``Kernels`` hook (no
model code is copied): ``KERNELS`` names level 3's attention core
(``attention.py``), PyTorch's fused norms, and the static cache below;
``backend=`` on any module or model narrows SDPA to one of its backends;
``weights="int8"`` or ``"int4"`` on a model holds its matrices in fewer bytes
(``quant.py``), and ``compile=True`` on the decoder-only model compiles its
one-token pass (``compiled.py``).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from functools import partial

import torch
import torch.nn.functional as F

from .. import level2_torch_manual as level2
from ..level2_torch_manual import Kernels, Transformer
from ..level2_torch_manual.arrays import row_major, zeros
from . import blocked, compiled, quant
from .attention import attend, check_backend


class LayerNorm(level2.LayerNorm):
    """Level 2's LayerNorm (same parameters) computed by PyTorch's fused ``F.layer_norm``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in at least float32, as level 2's: a half-precision input is widened.
        xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
        w = self.gain(xf.dtype)  # weight, or Gemma's offset + weight
        b = None if self.bias is None else self.bias.to(xf.dtype)
        return F.layer_norm(xf, (xf.shape[-1],), w, b, self.eps).to(x.dtype)  # (..., D)


class RMSNorm(level2.RMSNorm):
    """Level 2's RMSNorm computed by PyTorch's fused ``F.rms_norm``: one call instead of
    six tensor operations, which is what a decode step, 61 norms of one row, pays for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
        y = F.rms_norm(xf, (xf.shape[-1],), self.gain(xf.dtype), self.eps)
        return y.to(x.dtype)  # (..., D)


class FeedForward(level2.FeedForward):
    """Level 2's feed-forward network, unchanged."""


class StaticKVCache(level2.KVCache):
    """Level 2's cache with its keys and values ``(n_layers, B, Hkv, C, Dh)`` allocated once,
    to capacity ``C = max_seq_len``, and written in place, as its positions are.

    A pass's ``T`` new slots are written at ``[length, length + T)`` and attention reads
    the filled prefix ``[:length]`` as a view, with no copy (level 2's cache copies every
    slot at every step). ``Hkv`` is the model's key/value heads: grouped-query attention
    shrinks the cache by ``H / Hkv`` (``levels.common.params.kv_bytes_per_token``).
    """

    def __init__(self, config, batch: int, *, device=None, dtype=None):
        super().__init__(config, batch, device=device, dtype=dtype)
        L, H, Dh, C = config.n_layers, config.kv_heads, config.d_head, config.max_seq_len
        # Zeros rather than empty: slots past `length` are never read, but deterministic
        # contents make the cache comparable bit for bit. Zeros that cost nothing until a
        # slot is written (`zeros`): most of the context never is.
        kw = {"device": device, "dtype": dtype or torch.float32}
        self.k = zeros((L, batch, H, C, Dh), **kw)  # (L,B,Hkv,C,Dh)
        self.v = zeros((L, batch, H, C, Dh), **kw)  # (L,B,Hkv,C,Dh)

    def update(self, index: int, k_new: torch.Tensor, v_new: torch.Tensor):
        """Write ``k_new, v_new (B,Hkv,T,Dh)`` into layer ``index`` at the pass's slots -> views
        of every filled slot, ``(B,Hkv,length,Dh)``: strided along C, contiguous in Dh,
        which SDPA accepts."""
        T, k, v = k_new.shape[2], self.k[index], self.v[index]  # (B,Hkv,C,Dh) views
        k.narrow(2, self.length - T, T).copy_(k_new)
        v.narrow(2, self.length - T, T).copy_(v_new)
        return k.narrow(2, 0, self.length), v.narrow(2, 0, self.length)


KERNELS = Kernels(attention=attend, layer_norm=LayerNorm, rms_norm=RMSNorm, kv_cache=StaticKVCache)


def kernels_for(backend: str = "auto") -> Kernels:
    """Level 3's kernels with SDPA restricted to ``backend`` (``"auto"``: SDPA chooses)."""
    if check_backend(backend) == "auto":
        return KERNELS
    return replace(KERNELS, attention=partial(attend, backend=backend))


class _ChoosesBackend:
    """Adds ``backend=`` to a level 2 class: it becomes ``kernels=kernels_for(backend)``."""

    def __init__(self, *args, backend: str = "auto", kernels: Kernels | None = None, **kwargs):
        super().__init__(*args, kernels=kernels or kernels_for(backend), **kwargs)
        self.backend = backend


WEIGHT_FORMATS = ("float", "blocked", *quant.FORMATS)


class _Quantizable(_ChoosesBackend):
    """Adds ``weights=`` to a model: ``"float"`` (the dtype's, the default), ``"blocked"``
    (float32 in oneDNN's layout for products of a few rows: ``blocked.py``), ``"int8"`` or
    ``"int4"`` (in groups of ``group_size``): the model is built in floats, then
    ``blocked.block`` or ``quant.quantize`` turns its matrices into the form, once
    (inference only)."""

    def __init__(self, *args, weights: str = "float", group_size: int = 32, **kwargs):
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {weights!r}")
        if weights == "blocked":  # before any weight is loaded
            blocked.check_blockable(kwargs.get("dtype"), kwargs.get("device"))
        elif weights != "float":
            quant.check_format(weights, group_size)
        super().__init__(*args, **kwargs)
        self.weights, self.group_size = weights, group_size
        if weights == "blocked":
            blocked.block(self)
        elif weights != "float":
            quant.quantize(self, weights, group_size=group_size)


class MultiHeadAttention(_ChoosesBackend, level2.MultiHeadAttention):
    __doc__ = level2.MultiHeadAttention.__doc__
    kernels = KERNELS


class EncoderLayer(_ChoosesBackend, level2.EncoderLayer):
    __doc__ = level2.EncoderLayer.__doc__
    kernels = KERNELS


class DecoderLayer(_ChoosesBackend, level2.DecoderLayer):
    __doc__ = level2.DecoderLayer.__doc__
    kernels = KERNELS


class DecoderOnlyTransformer(_Quantizable, level2.DecoderOnlyTransformer):
    """Level 2's decoder-only model on level 3's kernels; ``compile=True`` decodes with
    the whole step compiled (``compiled.py``).

    With ``compile``, ``transformer`` (the plain pass every engine calls) runs a pass of
    one token per row into a static cache through the compiled step: the first such pass
    of a batch size (and thread count) compiles it, or loads it from the user's cache
    (``prepare_decode`` does it beforehand, and says which, ``decode_report``); every later
    one of that batch size runs it, but the cache's last slot, which runs eagerly, as does
    every pass of a model without a C++ compiler. A pass of ``k + 1`` tokens a row
    (speculative decoding's verification) runs compiled where ``prepare_decode(batch,
    k + 1)`` prepared it. The prompt stays eager: it is a batched
    product, already arithmetic-bound, of a new length every time. ``state_dict()`` keys
    are the canonical names (``token_embedding.weight``, ``layers.{i}.*``, ``norm.*``).
    """

    kernels = KERNELS

    def __init__(self, *args, compile: bool = False, **kwargs):
        if compile and kwargs.get("weights") == "blocked":
            raise ValueError(
                "weights='blocked' is for eager steps of several rows; the compiled step "
                "(compile=True) makes its own products from float weights"
            )
        with row_major() if compile else contextlib.nullcontext():  # the compiled step's layout
            super().__init__(*args, **kwargs)
        self.compiled_decode = compile
        # By (batch size, tokens a pass, torch's threads): a CPU step is compiled for the
        # threads it runs on.
        self._steps: dict[tuple[int, int, int], compiled.CompiledDecode | None] = {}
        self.decode_report: compiled.CompileReport | None = None

    def prepare_decode(self, batch: int = 1, tokens: int = 1) -> compiled.CompileReport:
        """Compile the pass of ``tokens`` new tokens for each of ``batch`` rows (a decode step:
        one; speculative decoding's verification: ``k + 1``) for the threads torch runs with
        now, or load it from the cache -> how it went (compiled, loaded, or eager and why).
        A pass of one token is prepared at its first call; of several, only here."""
        key = (batch, tokens, torch.get_num_threads())
        if key not in self._steps:
            reason = compiled.compiler_missing() if self.device.type == "cpu" else None
            if reason is not None:
                self._steps[key] = None
                self.decode_report = compiled.CompileReport("eager", 0.0, reason=reason)
            else:
                self._steps[key] = step = compiled.build(self, batch, tokens)
                self.decode_report = step.report
        return self.decode_report

    def transformer(self, ids, positions, cache=None, last: bool = False):
        """The plain pass every engine calls, ``Transformer.forward``: with ``compile``, through
        the compiled step where one runs this pass."""
        step = self._compiled_step(ids, cache, last) if self.compiled_decode else None
        if step is None:
            return Transformer.forward(self, ids, positions, cache, last)
        return step(ids, positions, cache)  # (B,T,V)

    def options(self) -> dict:
        """Level 2's, and ``compile``; a model of int8 or int4 weights is not rebuilt from them."""
        if self.weights != "float":
            raise ValueError(f"a model of {self.weights} weights is not built again from its parts (first_layers): build it from float weights")  # fmt: skip
        return super().options() | {"compile": self.compiled_decode}

    def _compiled_step(self, ids: torch.Tensor, cache, last) -> compiled.CompiledDecode | None:
        """The compiled step for this pass: new tokens into a cache, no gradient; one token a
        row (compiled at its first call), or as many as a prepared step takes. (``last`` of
        one token a row is that token: a draft's step asks for it.)"""
        if cache is None or (last and ids.shape[1] != 1):
            return None
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            return None  # the compiled step has no backward
        B, T = ids.shape
        if T == 1:
            self.prepare_decode(B)
        step = self._steps.get((B, T, torch.get_num_threads()))
        return step if step is not None and step.fits(ids, cache) else None


class Seq2SeqTransformer(_Quantizable, level2.Seq2SeqTransformer):
    __doc__ = level2.Seq2SeqTransformer.__doc__
    kernels = KERNELS
