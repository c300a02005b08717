"""The product of a few rows as one small C++ kernel: ``x (M, K) @ w.T``, ``w`` streamed once.

Level 3's compiled step (``compiled.py``) computes every product of its pass, ``M`` rows
(one for a decode step, ``k + 1`` for speculative decoding's check of ``k`` guesses) by
``M`` weights ``(N, K)``. At a few rows a product is the read of its weights, if each
weight read is used by every row at once; inductor's loops read ``w`` once a row, and the
library GEMM streams so short a matrix slowly. ``rows.cpp`` is the product written for
this case (its header explains the blocking and the numerics): 4 outputs by up to 6 rows
in AVX-512 registers, float32 sums, the weights read at their own bytes (float32,
bfloat16, or int8 with one scale an output, as ``quant.py`` holds them).

It is compiled once, by the C++ compiler with torch's headers, into the user's cache
(``levels.registry.cache_dir() / "extensions"``, under a hash of the source, torch and the
compiler) and registered as ``torch.ops.ladder_rows.rows_linear``, which the compiled step's
decompositions call and AOTInductor's library calls back (an operator of this process).
Where it cannot be (no C++ compiler, no AVX-512), ``available()`` says why, once, and the
compiled step keeps inductor's loops (``compiled.few_rows_linear``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import warnings
from functools import lru_cache
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("rows.cpp")
MAX_ROWS = 9  # up to speculative decoding's k + 1 = 9; beyond, the GEMM (compiled.py)


def missing() -> str | None:
    """Why the kernel cannot run here, or None: a C++ compiler (``$CXX`` or ``c++``) and a
    CPU with AVX-512 (as torch reads it) are needed, and ``LADDER_ROWS_KERNEL=0`` turns it
    off (to measure the step without it)."""
    if os.environ.get("LADDER_ROWS_KERNEL") == "0":
        return "LADDER_ROWS_KERNEL=0"
    name = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "c++")
    if shutil.which(name) is None:
        return f"no C++ compiler ({name}) on PATH"
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return f"the CPU has no AVX-512 (torch reads {torch.backends.cpu.get_cpu_capability()})"
    return None


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether ``torch.ops.ladder_rows.rows_linear`` is registered in this process: built (or
    loaded from the cache) at the first call; where it cannot be, a warning says why, once."""
    why = missing()
    if why is None:
        try:
            _build()
        except Exception as error:  # a compiler that fails: the step keeps inductor's loops
            why = f"building {SOURCE.name} failed ({type(error).__name__}: {error})"
    if why is not None:
        warnings.warn(f"the few-rows kernel is off, inductor's loops instead: {why}", stacklevel=2)
        return False
    return True


def digest() -> str:
    """What a build depends on: the source, torch and the compiler named."""
    text = SOURCE.read_bytes() + torch.__version__.encode() + os.environ.get("CXX", "").encode()
    return hashlib.sha256(text).hexdigest()[:16]


def _build() -> None:
    """Compile ``rows.cpp`` into the cache (once: a file of the same digest is loaded) and load
    it into this process, which registers the operator."""
    import subprocess

    from torch.utils import cpp_extension

    from ..registry import cache_dir

    library = cache_dir() / "extensions" / f"rows-{digest()}.so"
    if not library.is_file():
        library.parent.mkdir(parents=True, exist_ok=True)
        scratch = library.with_name(f".{library.stem}.{os.getpid()}.so")
        abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
        command = [
            os.environ.get("CXX") or "c++",
            *("-O3", "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"),
            # AVX-512 F for the vectors, BW and VL for the masked 8- and 16-bit loads.
            *("-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma"),
            *(f"-I{path}" for path in cpp_extension.include_paths()),
            str(SOURCE),
            *(f"-L{path}" for path in cpp_extension.library_paths()),
            *("-lc10", "-ltorch_cpu", "-o", str(scratch)),
        ]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True)
            os.replace(scratch, library)  # atomic: a half-written library is never loaded
        except subprocess.CalledProcessError as error:
            last = error.stderr.strip().splitlines()[-1] if error.stderr.strip() else error
            raise RuntimeError(last) from error
        finally:
            scratch.unlink(missing_ok=True)
    torch.ops.load_library(str(library))
    _register_fake()


def _register_fake() -> None:
    """The operator's shapes, for ``torch.export`` to trace through it: ``(M, N)`` in ``x``'s
    dtype."""

    @torch.library.register_fake("ladder_rows::rows_linear")
    def _(x, w, scale=None):
        return x.new_empty((x.shape[0], w.shape[0]))


def rows_linear(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None):
    """``x (M, K) @ w.T`` (times ``scale (N,)`` an output for int8 ``w``) -> ``(M, N)`` in
    ``x``'s dtype, by the kernel (``available()`` first)."""
    return torch.ops.ladder_rows.rows_linear(x, w, scale)
