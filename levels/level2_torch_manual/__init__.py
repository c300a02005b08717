"""Level 2: the transformer as ``torch.nn`` modules, attention written out.

What it adds over level 1 (numpy): any torch device and float dtype
(float32 by default, ``dtype=`` to change), autograd for training, dropout
in training mode, and ``state_dict()`` keys that are the canonical names, so
weights load straight into PyTorch's ``nn.TransformerEncoderLayer`` /
``nn.TransformerDecoderLayer`` (``norm_first=True``) and back. Attention is
still spelled out (``attention.py``: scores, mask, softmax, weighted sum),
materialising the ``(B, H, T, S)`` score matrix; the norms are written out
(``norms.py``) and the KV cache grows by concatenation (``cache.py``).

Hooks for the levels above
--------------------------
Levels 3 and 4 change only pieces of this level, through one frozen
dataclass, ``Kernels`` (``kernels.py``), with six fields:

- ``attention``: the core, ``attention(q, k, v, *, causal, mask, window, dropout_p=...)``
  with the semantics of :func:`attention.attention`, called on inputs the model has
  checked (here :func:`attention.attend`, the same without the checks; ``dropout_p``
  is passed only in training mode with ``config.dropout > 0``);
- ``layer_norm`` and ``rms_norm``: the norm classes, built as ``cls(config, params, *,
  prefix, device, dtype)``, whose state dict is ``weight`` (and ``bias``);
- ``kv_cache``: the cache class, built as ``cls(config, batch, *, device, dtype)``: a
  ``levels.common.boundary.CacheBook`` with an ``append`` (``cache.py``, which also
  holds levels 3 and 4's ``StaticKVCache``); ``paged_kv_cache``: the one a server builds
  over its pool of blocks, ``cls(pool, sequences, config)`` (``paged.py``);
- ``linear``: ``x @ w.T + bias`` for the matrices a module holds itself (the fused
  q/k/v rows, the tied head): ``F.linear``, or level 3's product of int8 and int4 ones.

Every module that uses one of these (``MultiHeadAttention``, ``EncoderLayer``,
``DecoderLayer``, ``DecoderOnlyTransformer``, ``Seq2SeqTransformer``) reads
``self.kernels``: a class attribute (``LEVEL2_KERNELS`` here), overridable per
instance with the ``kernels=`` constructor argument, and passed down from a
model to its layers. A higher level therefore writes, for example::

    KERNELS = Kernels(attention=my_attention, layer_norm=MyLayerNorm, kv_cache=MyCache)

    class DecoderOnlyTransformer(level2.DecoderOnlyTransformer):
        kernels = KERNELS

and inherits everything else (parameter loading, checks, RoPE, the FFN,
the models' forward / prefill / decode_step / generate).

The tutorial chapter for this level is docs/level2_torch_manual.md.
"""

from __future__ import annotations

import torch

from ..common.facts import Facts
from .arrays import asarray, to_numpy
from .attention import attend, attention, causal_mask, check_attention, merge_attention
from .cache import KVCache
from .kernels import LEVEL2_KERNELS, Kernels
from .layers import DecoderLayer, EncoderLayer, FeedForward, MultiHeadAttention, rope
from .models import DecoderOnlyTransformer, Seq2SeqTransformer
from .norms import LayerNorm, RMSNorm

# What the harness and the tests read about this level (docs/conventions.md, "Levels").
FACTS = Facts(
    array="torch",
    gradients="autograd",
    interpreted=False,
    dtypes=("float64", "float32", "float16", "bfloat16"),
    devices=("cpu", "cuda"),
    description=f"torch {torch.__version__} modules, attention written out "
    "(matmul, mask, softmax, matmul; float32 by default), KV cache grown by concatenation",
)
describe = FACTS.describe
