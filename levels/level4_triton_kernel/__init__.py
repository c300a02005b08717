"""Level 4: hand-written Triton kernels for attention (forward and backward) and LayerNorm.

What it adds over level 3 (which hands attention to PyTorch's fused SDPA):
the fused kernels themselves, written out so they can be read.

- ``flash_forward.py``: FlashAttention-2 forward. One program per
  (query tile, batch*head) walks the key tiles with an online softmax
  (running max ``m_i``, running sum ``l_i``, fp32 accumulator ``acc``), never
  materialising the ``(T, S)`` score matrix; bottom-right causal with the key
  tiles past the diagonal skipped; boolean masks read as stride-0 views;
  any T and S; head widths up to 256, tested from 4 to 128, padded to a power
  of two with masked loads.
- ``flash_backward.py``: dQ, dK, dV recomputed from the saved log-sum-exp, a
  ``delta = rowsum(dO * O)`` pre-pass, then one kernel per key tile (dK, dV)
  and one per query tile (dQ): deterministic, no atomics.
- ``fused_layer_norm.py``: fused LayerNorm and RMSNorm forward and backward
  (formulas derived in its docstring), with or without bias, and their
  ``autograd.Function``.
- ``flash_attention.py``: the host side: the shared checks, refusing empty query
  rows before launch, and attention's ``autograd.Function``.
- ``flash_decode.py``: flash-decoding for a decode step (T <= 16 queries)
  without gradients: the keys in slices, one program each running the
  forward's loop, then a kernel merging the slices by their log-sum-exps;
  taken when ``B * H`` programs alone would leave the GPU idle.
- ``tiles.py``: tile sizes, autotuned on a GPU, fixed under the interpreter;
  decoding (T <= 16 queries against a KV cache) uses a 16-row query tile.
- ``models.py``: level 2's modules with only the attention core and the
  LayerNorm swapped, and level 3's static KV cache (level 2's ``Kernels``
  hook); no model code is repeated.
- ``tutorial.py``: the chapter's five small kernels (vector add, matrix
  product, row softmax, attention v2 and v3), not used by the rung.

Outside the level, the command ``ladder check`` (the package ``ladder.check``):
every kernel compiled ahead of time for sm_80 and sm_90 by Triton's real compiler,
on a machine without a GPU, in every launch the autotuner or a launcher can give
it. What it measures is the level's ``shared_memory.py``: what each autotuning
candidate needs, from which ``tiles.CandidatePrune`` drops, on a GPU, the
candidates over its limit before anything is compiled.

The kernel modules (``tiles``, ``flash_forward``, ``flash_backward``,
``flash_decode``, ``fused_layer_norm``) import only torch, triton, each other
and that table (plain data), never this ``__init__``'s names: a process that
compiles for a GPU it does not have loads them on their own
(ladder/check/__init__.py), since this ``__init__`` refuses such a process.

Without CUDA the kernels run in Triton's interpreter (numpy on the CPU, one
program instance at a time): correct for float32 and float16, wrong for
bfloat16, and thousands of times slower than a GPU. ``describe()`` says which
one is in use, so nobody mistakes interpreter timings for kernel timings.

The tutorial chapter for this level is docs/level4_triton_kernel.md.
"""

from __future__ import annotations

import importlib.util
import sys

import torch

if importlib.util.find_spec("triton") is None:  # levels.load turns this into a skip with the reason
    raise ImportError("level 4 needs the 'triton' package (pip install 'attention-ladder[triton]')")
_TRITON_WAS_IMPORTED = "triton" in sys.modules

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .tiles import interpreting  # noqa: E402

if interpreting() and _TRITON_WAS_IMPORTED and type(tl.sum).__name__ != "InterpretedFunction":
    raise ImportError(
        "triton was imported before TRITON_INTERPRET=1 was set, so its built-in kernels "
        "cannot run in the interpreter; import levels (which chooses) before triton"
    )
if not interpreting() and not torch.cuda.is_available():
    raise ImportError(
        "level 4's compiled kernels need a CUDA device, which torch does not see here, and "
        "Triton's interpreter was not chosen: set TRITON_INTERPRET=1 before importing levels"
    )

from dataclasses import replace  # noqa: E402

from .. import level2_torch_manual as level2  # noqa: E402
from ..level2_torch_manual import asarray, merge_attention, to_numpy  # noqa: E402
from .flash_attention import FlashAttention, attend, attention  # noqa: E402
from .fused_layer_norm import FusedLayerNorm, layer_norm, rms_norm  # noqa: E402
from .models import (  # noqa: E402
    KERNELS,
    DecoderLayer,
    DecoderOnlyTransformer,
    EncoderLayer,
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    RMSNorm,
    Seq2SeqTransformer,
    kernel_attention,
)
from .tiles import Tiles  # noqa: E402

# What the harness and the tests read about this level (docs/conventions.md, "Levels").
_INTERPRETED = interpreting()  # kernels emulated by numpy on the CPU: correct, very slow
if _INTERPRETED:
    _why = "no CUDA" if not torch.cuda.is_available() else "TRITON_INTERPRET=1, CUDA unused"
    _what = (
        f"Triton interpreter ({_why}): triton {triton.__version__} kernels run by numpy on the CPU"
    )
else:
    _what = f"Triton {triton.__version__} kernels on CUDA ({torch.cuda.get_device_name()})"
FACTS = replace(  # level 2's: torch arrays, autograd (through the kernels' own backward)
    level2.FACTS,
    interpreted=_INTERPRETED,
    # float64 has no tensor-core path and is not compiled; the interpreter gets bfloat16 wrong.
    dtypes=("float32", "float16") if _INTERPRETED else ("float32", "float16", "bfloat16"),
    devices=("cpu",) if _INTERPRETED else ("cuda",),
    description=_what,
)
describe = FACTS.describe
