"""Level 3: level 2's modules with PyTorch's fused attention and a static KV cache.

What changes over level 2, and nothing else (the classes here are level 2's,
re-parameterised through its ``Kernels`` hook; no code is copied):

- the attention core is ``F.scaled_dot_product_attention`` (``attention.py``),
  which never materialises the ``(B,H,T,S)`` score matrix when a fused
  backend runs, keeping the ladder's semantics: bottom-right causal alignment,
  a ``ValueError`` (not NaN) for a query row with no allowed key, SDPA's own
  grouped-query attention, sliding windows in chunks of queries
  (cost ``T * W``, not ``T * S``), and the log-sum-exp from the
  fused CPU kernel (``lse.py``);
- the SDPA backend can be chosen (``backend="auto" | "flash" | "efficient" |
  "cudnn" | "math"``) on ``attention`` and on every module and model, and
  ``which_backend(q, k, v, ...)`` reports the one that actually runs;
  ``backend="auto"`` also obeys an enclosing ``torch.nn.attention.sdpa_kernel``;
- the KV cache (``StaticKVCache``, in ``models.py``) is allocated
  once to ``max_seq_len`` and written in place, instead of growing by
  concatenation;
- the norms are PyTorch's fused ``F.layer_norm`` and ``F.rms_norm`` (one call
  each instead of level 2's six operations, which a decode step pays 61 times);
- ``weights="int8"`` holds a model's matrices in int8 with a scale per row
  (``quant.py``): a quarter of the bytes a decode step reads; ``"int4"`` an
  eighth; ``"blocked"`` keeps float32 in oneDNN's layout for a few rows at once
  (``blocked.py``): a server's step of several requests at about one row's cost.

``FeedForward`` and ``merge_attention`` are level 2's unchanged (declared in
``models.py``, so every rung names its pieces in its own files). Length
bucketing (``levels.common.bucketing``), which level 3 introduced, is
docs/decoding.md's.

The tutorial chapter for this level is docs/level3_sdpa_flash.md.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .. import level2_torch_manual as level2
from ..level2_torch_manual import asarray, merge_attention, to_numpy
from .attention import BACKEND_CHOICES, BACKENDS, attend, attention, which_backend
from .models import (
    KERNELS,
    DecoderLayer,
    DecoderOnlyTransformer,
    EncoderLayer,
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    RMSNorm,
    Seq2SeqTransformer,
    StaticKVCache,
    kernels_for,
)

# What the harness and the tests read about this level (docs/conventions.md, "Levels").
FACTS = replace(  # level 2's, but for what computes attention
    level2.FACTS,
    description=f"torch {torch.__version__} F.scaled_dot_product_attention (fused attention), "
    "static KV cache",
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
