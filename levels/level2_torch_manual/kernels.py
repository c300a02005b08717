"""The pieces a higher level may swap: attention core, the two norms, the KV cache."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .attention import attention
from .cache import KVCache
from .norm import LayerNorm, RMSNorm


@dataclass(frozen=True)
class Kernels:
    """What the modules of this level call for the parts a faster level replaces.

    - ``attention(q, k, v, *, causal, mask, window, dropout_p=...)`` with the
      semantics of ``attention.attention``; ``dropout_p`` is passed only in
      training mode with ``config.dropout > 0``, so a kernel without dropout works
      for inference;
    - ``layer_norm`` and ``rms_norm``: classes built as ``cls(config, params, *,
      prefix, device, dtype)``, ``nn.Module``s whose state dict is ``weight`` (and
      ``bias`` for a LayerNorm with bias); ``norm(config)`` picks ``config.norm``'s;
    - ``kv_cache``: a class built as ``kv_cache(config, batch, *, device, dtype)``
      with the interface described in ``cache.py``.
    """

    attention: Callable = attention
    layer_norm: type = LayerNorm
    kv_cache: type = KVCache
    rms_norm: type = RMSNorm

    def norm(self, config) -> type:
        """The norm class of ``config.norm``."""
        return self.rms_norm if config.norm == "rmsnorm" else self.layer_norm


LEVEL2_KERNELS = Kernels()
