"""Level 2: the transformer as ``torch.nn`` modules, attention written out.

What it adds over level 1 (numpy): any torch device and float dtype
(float32 by default, ``dtype=`` to change), autograd for training, dropout
in training mode, and ``state_dict()`` keys that are the canonical names, so
weights load straight into PyTorch's ``nn.TransformerEncoderLayer`` /
``nn.TransformerDecoderLayer`` (``norm_first=True``) and back.

Where to read it:

* ``models.py``: the transformer in one file, top-down: RoPE, LayerNorm and RMSNorm
  (written out), the feed-forward, the KV cache (grown by concatenation), attention,
  the blocks, ``Transformer.forward(ids, positions, cache=None)``, and the public
  models over it;
* ``attention.py``: the attention core spelled out (scores, mask, softmax, weighted
  sum), materialising the ``(B, H, T, S)`` score matrix;
* ``arrays.py``: numpy in and out, and the parameters loaded under their names;
* ``paged.py``: the paged KV cache a server keeps (``ladder serve``).

What a faster level replaces
----------------------------
Levels 3 and 4 change only pieces of this level, through one frozen dataclass,
``Kernels`` (``kernels.py``), with six fields: the attention core, the two norm classes,
the KV cache class and the paged one, and ``linear``, the product of the matrices a
module holds itself. Every module reads ``self.kernels``: a class attribute (``LEVEL2_KERNELS``
here), overridable per instance with the ``kernels=`` constructor argument, and passed
down from a model to its layers. A higher level therefore writes, for example::

    KERNELS = replace(LEVEL2_KERNELS, attention=my_attention, layer_norm=MyLayerNorm)

    class DecoderOnlyTransformer(level2.DecoderOnlyTransformer):
        kernels = KERNELS

and inherits everything else (parameter loading, RoPE, the FFN, the transformer, the
public methods).

The tutorial chapter for this level is docs/level2_torch_manual.md.
"""

from __future__ import annotations

import torch

from ..common.facts import Facts
from .arrays import asarray, to_numpy
from .attention import attend, attention, causal_mask, check_attention, merge_attention
from .kernels import Kernels
from .models import (
    LEVEL2_KERNELS,
    DecoderLayer,
    DecoderOnlyTransformer,
    EncoderDecoder,
    EncoderLayer,
    FeedForward,
    KVCache,
    LayerNorm,
    MultiHeadAttention,
    RMSNorm,
    Seq2SeqTransformer,
    Transformer,
)

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
