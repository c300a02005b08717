"""The three pieces a higher level may swap: attention core, LayerNorm, KV cache."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .attention import attention
from .cache import KVCache
from .norm import LayerNorm


@dataclass(frozen=True)
class Kernels:
    """What the modules of this level call for the parts a faster level replaces.

    - ``attention(q, k, v, *, causal, mask, dropout_p=...)`` with the semantics of
      ``attention.attention``; ``dropout_p`` is passed only in training mode
      with ``config.dropout > 0``, so a kernel without dropout works for inference.
    - ``layer_norm``: a class built as ``layer_norm(config, params, *, prefix,
      device, dtype)``, an ``nn.Module`` whose state dict is ``weight`` (and ``bias``).
    - ``kv_cache``: a class built as ``kv_cache(config, batch, *, device, dtype)``
      with the interface described in ``cache.py``.
    """

    attention: Callable = attention
    layer_norm: type = LayerNorm
    kv_cache: type = KVCache


LEVEL2_KERNELS = Kernels()
