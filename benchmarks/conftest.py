"""pytest configuration for the benchmark suite (``pytest benchmarks/ --benchmark-only``).

Level 4's kernels run on the CPU only under the Triton interpreter, which must
be switched on before the module defining them is imported, so this happens
before the suite imports any level.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
