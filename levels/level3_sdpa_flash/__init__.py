"""Level 3: level 2's modules with PyTorch's fused attention and a static KV cache.

What changes over level 2, and nothing else (the classes here are level 2's,
re-parameterised through its ``Kernels`` hook; no code is copied):

- the attention core is ``F.scaled_dot_product_attention`` (``attention.py``),
  which never materialises the ``(B,H,T,S)`` score matrix when a fused
  backend runs, keeping the ladder's semantics: bottom-right causal alignment,
  a ``ValueError`` (not NaN) for a query row with no allowed key, SDPA's own
  grouped-query attention, sliding windows in chunks of queries
  (``windowed.py``: cost ``T * W``, not ``T * S``), and the log-sum-exp from the
  fused CPU kernel (``lse.py``);
- the SDPA backend can be chosen (``backend="auto" | "flash" | "efficient" |
  "cudnn" | "math"``) on ``attention`` and on every module and model, and
  ``which_backend(q, k, v, ...)`` reports the one that actually runs;
  ``backend="auto"`` also obeys an enclosing ``torch.nn.attention.sdpa_kernel``;
- the KV cache (``cache.py``) is allocated once to ``max_seq_len`` and
  written in place, instead of growing by concatenation;
- ``levels.common.bucketing`` batches sequences of similar length, so less
  of that attention is spent on padding (``ladder bench --scenario varlen``).

``LayerNorm``, ``RMSNorm``, ``FeedForward`` and ``merge_attention`` are level 2's unchanged
(``LayerNorm`` and ``FeedForward`` are declared here as level 2's, so every rung names its
pieces in its own files).

The tutorial chapter for this level is docs/level3_sdpa_flash.md.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from .. import level2_torch_manual as level2
from ..level2_torch_manual import (
    Kernels,
    RMSNorm,
    asarray,
    merge_attention,
    to_numpy,
)
from .attention import BACKEND_CHOICES, BACKENDS, attention, check_backend, which_backend
from .cache import StaticKVCache


class LayerNorm(level2.LayerNorm):
    """Level 2's LayerNorm: level 3 changes the attention core and the cache, not the norms."""


class FeedForward(level2.FeedForward):
    """Level 2's feed-forward network, unchanged."""


KERNELS = Kernels(attention=attention, layer_norm=LayerNorm, kv_cache=StaticKVCache)


def kernels_for(backend: str = "auto") -> Kernels:
    """Level 3's kernels with SDPA restricted to ``backend`` (``"auto"``: SDPA chooses)."""
    if check_backend(backend) == "auto":
        return KERNELS
    return replace(KERNELS, attention=partial(attention, backend=backend))


class _ChoosesBackend:
    """Adds ``backend=`` to a level 2 class: it becomes ``kernels=kernels_for(backend)``."""

    def __init__(self, *args, backend: str = "auto", kernels: Kernels | None = None, **kwargs):
        super().__init__(*args, kernels=kernels or kernels_for(backend), **kwargs)
        self.backend = backend


class MultiHeadAttention(_ChoosesBackend, level2.MultiHeadAttention):
    __doc__ = level2.MultiHeadAttention.__doc__
    kernels = KERNELS


class EncoderLayer(_ChoosesBackend, level2.EncoderLayer):
    __doc__ = level2.EncoderLayer.__doc__
    kernels = KERNELS


class DecoderLayer(_ChoosesBackend, level2.DecoderLayer):
    __doc__ = level2.DecoderLayer.__doc__
    kernels = KERNELS


class DecoderOnlyTransformer(_ChoosesBackend, level2.DecoderOnlyTransformer):
    __doc__ = level2.DecoderOnlyTransformer.__doc__
    kernels = KERNELS


class Seq2SeqTransformer(_ChoosesBackend, level2.Seq2SeqTransformer):
    __doc__ = level2.Seq2SeqTransformer.__doc__
    kernels = KERNELS


# What the harness and the tests read about this level (docs/conventions.md, "Levels").
ARRAY = "torch"
GRADIENTS = "autograd"
INTERPRETED = False
DTYPES = ("float64", "float32", "float16", "bfloat16")
DEVICES = ("cpu", "cuda")
DESCRIPTION = (
    f"torch {torch.__version__} F.scaled_dot_product_attention (fused attention), static KV cache"
)


def describe(*, device=None, dtype=None, backend: str = "auto") -> str:
    """One line: the SDPA backend that runs causal self-attention here, and the cache.

    The backend is measured with ``which_backend`` on a small probe
    ``(1, 2, 16, 16)`` of ``dtype`` (default float32) on ``device`` (default CPU).
    """
    dtype = dtype or torch.float32
    probe = torch.randn(1, 2, 16, 16, device=device, dtype=dtype)  # (B,H,T,Dh)
    ran = which_backend(probe, probe, probe, causal=True, backend=backend)
    where = probe.device.type
    kernel = "fused CPU kernel" if (ran == "flash" and where == "cpu") else "SDPA kernel"
    return (
        f"torch {torch.__version__} SDPA, backend {backend} -> {ran} ({kernel}) "
        f"for {str(dtype).replace('torch.', '')} causal attention on {where}; static KV cache"
    )


__all__ = [
    "ARRAY",
    "DESCRIPTION",
    "DEVICES",
    "DTYPES",
    "GRADIENTS",
    "INTERPRETED",
    "BACKENDS",
    "BACKEND_CHOICES",
    "KERNELS",
    "DecoderLayer",
    "DecoderOnlyTransformer",
    "EncoderLayer",
    "FeedForward",
    "LayerNorm",
    "MultiHeadAttention",
    "RMSNorm",
    "Seq2SeqTransformer",
    "StaticKVCache",
    "asarray",
    "attention",
    "describe",
    "kernels_for",
    "merge_attention",
    "to_numpy",
    "which_backend",
]
