"""The pieces a higher level may swap, and the record that names them: ``Kernels``.

The attention core is ``attention.py``, the norms and the KV cache are ``models.py``'s
(which builds level 2's record, ``LEVEL2_KERNELS``), the paged cache ``paged.py``; levels
3 and 4 build their own record of fused or in-place ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F

from .attention import attend
from .paged import PagedKVCache


@dataclass(frozen=True)
class Kernels:
    """What the modules of this level call for the parts a faster level replaces.

    - ``attention(q, k, v, *, mask, scale=..., dropout_p=...)`` with the semantics of
      ``attention.attention``, on inputs the model made (so the core unchecked,
      ``attention.attend``; a checking one works too), the mask built from the
      positions, every query row left a key; or ``causal=`` and ``window=`` instead of
      the mask where the positions are the core's places (``semantics.told``); ``dropout_p``
      is passed only in training mode with ``config.dropout > 0``, and ``scale`` only when
      ``config.attn_scale`` is set, so a kernel without them works for inference
      of the other models;
    - ``layer_norm`` and ``rms_norm``: classes built as ``cls(config, params, *,
      prefix, width, device, dtype)`` (``width`` None: ``D``; QK-norm's is ``Dh``),
      ``nn.Module``s whose state dict is ``weight`` (and ``bias`` for a LayerNorm
      with bias), their gain ``config.norm_weight_offset + weight``; ``norm(config)``
      picks ``config.norm``'s;
    - ``kv_cache``: a class built as ``kv_cache(config, batch, *, device, dtype)``
      with the interface of ``models.KVCache`` (``extend``, ``update``, ``next_positions``,
      ``rollback``); ``paged_kv_cache``: the paged one a server builds over its pool,
      ``paged_kv_cache(pool, sequences, config)`` (``paged.py``);
    - ``linear(x, w, bias=None)``: ``x @ w.T + bias`` for the matrices a module holds as
      its own attributes (the fused q/k/v rows, the tied head): ``F.linear``, or a product
      that takes the form a faster level holds them in (level 3's int8 and int4).
    """

    kv_cache: type
    layer_norm: type
    rms_norm: type
    attention: Callable = attend
    paged_kv_cache: type = PagedKVCache
    linear: Callable = F.linear

    def norm(self, config) -> type:
        """The norm class of ``config.norm``."""
        # option norm: RMSNorm (Llama and most models since) instead of LayerNorm
        return self.rms_norm if config.norm == "rmsnorm" else self.layer_norm
