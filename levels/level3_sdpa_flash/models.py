"""Level 3's modules: level 2's, with SDPA for attention and a static KV cache.

Each class is level 2's, re-parameterised through its ``Kernels`` hook (no
model code is copied): ``KERNELS`` names level 3's attention core
(``attention.py``), PyTorch's fused norms, and the static cache (level 2's
``cache.py``);
``backend=`` on any module or model narrows SDPA to one of its backends;
``weights="int8"`` or ``"int4"`` on a model holds its matrices in fewer bytes
(``quant.py``), and ``compile=True`` on the decoder-only model compiles its
decode step (``compiled.py``).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from functools import partial

import torch
import torch.nn.functional as F

from .. import level2_torch_manual as level2
from ..level2_torch_manual import Kernels
from ..level2_torch_manual.arrays import row_major
from ..level2_torch_manual.cache import StaticKVCache
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

    With ``compile``, the first decode step of a batch size (and thread count) compiles
    the step for it, or loads it from the user's cache (``prepare_decode`` does it beforehand, and says
    which, ``decode_report``); every later step of that batch size runs it, but the
    cache's last slot, which runs eagerly, as does every step of a model without a C++
    compiler. The prompt's prefill stays eager: it is a batched product, already
    arithmetic-bound, of a new length every time. ``state_dict()`` keys are the
    canonical names (``token_embedding.weight``, ``layers.{i}.*``, ``norm.*``).
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
        # By (batch size, torch's threads): a CPU step is compiled for the threads it runs on.
        self._steps: dict[tuple[int, int], compiled.CompiledDecode | None] = {}
        self.decode_report: compiled.CompileReport | None = None

    def prepare_decode(self, batch: int = 1) -> compiled.CompileReport:
        """Compile the decode step for ``batch`` rows and the threads torch runs with now, or
        load it from the cache -> how it went (compiled, loaded, or eager and why)."""
        key = (batch, torch.get_num_threads())
        if key not in self._steps:
            reason = compiled.compiler_missing() if self.device.type == "cpu" else None
            if reason is not None:
                self._steps[key] = None
                self.decode_report = compiled.CompileReport("eager", 0.0, reason=reason)
            else:
                self._steps[key] = step = compiled.build(self, batch)
                self.decode_report = step.report
        return self.decode_report

    def _decoder(self, tokens: torch.Tensor, steps: dict, cache, last=None) -> torch.Tensor:
        """The edge's pass, or the compiled step where one runs it (``compile=True``)."""
        step = self._compiled_step(tokens, cache, last) if self.compiled_decode else None
        if step is None:
            return super()._decoder(tokens, steps, cache, last)
        logits = step(tokens, steps, cache)  # (B,1,V)
        cache.commit(next(iter(steps.values())))  # what every window's step shares
        return logits

    def _compiled_step(self, tokens: torch.Tensor, cache, last) -> compiled.CompiledDecode | None:
        """The compiled step for this pass: one new token per row into a cache, no gradient."""
        if cache is None or last is not None or tokens.shape[1] != 1:
            return None
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            return None  # the compiled step has no backward
        self.prepare_decode(tokens.shape[0])
        step = self._steps[(tokens.shape[0], torch.get_num_threads())]
        return step if step is not None and step.fits(tokens, cache) else None


class Seq2SeqTransformer(_Quantizable, level2.Seq2SeqTransformer):
    __doc__ = level2.Seq2SeqTransformer.__doc__
    kernels = KERNELS
