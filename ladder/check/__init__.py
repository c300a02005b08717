"""Level 4 compiled ahead of time: the kernels on their own, and the compile check.

Level 4's folder holds the kernels and the tutorial; this package, the ``ladder check``
command's, holds the tooling that compiles those kernels for the GPUs they are for, on a
machine without one:

- ``matrix.py``: what is compiled: every kernel in every launch the autotuner
  or a launcher can give it, per dtype, size, variant and target (``TARGETS``);
- ``check.py``: the compiles, in worker processes, and the verdict;
  ``run`` is the ``ladder check`` command;
- ``report.py``: the tables ``ladder check`` prints;
- the table it measures (``--write-table``) is level 4's own
  ``shared_memory.py``, which ``tiles.py`` reads on a GPU to prune its autotuning
  candidates: plain data, importing nothing, so the kernels import it in any process;
- ``__main__.py``: a compile worker (``python -m ladder.check``);
- this ``__init__``: the kernel modules loaded on their own
  (``kernel_package``), and the kernel package for this process (``kernels``).

Why the kernels are loaded on their own
---------------------------------------
Triton decides when a kernel is *decorated* whether ``@triton.jit`` builds a
function for its compiler or for its CPU interpreter (``TRITON_INTERPRET``), and
its own built-ins (``tl.sum``, ``tl.max``) are decorated when triton is first
imported. A process that has imported triton to interpret cannot also compile;
compiling needs a process that chose the compiler from the start.

Such a process cannot import level 4 the usual way: the level's ``__init__``
refuses a process that neither interprets nor sees a CUDA device, because its
models could not run there (and ``levels.load`` must say so). But the kernel
modules (``tiles``, ``flash_forward``, ``flash_backward``, ``flash_decode``,
``fused_layer_norm``) import only torch, triton, each other and the table
``shared_memory``, so they can be loaded *on their own*,
as a package of the same directory under another name, without the level's
``__init__``. ``kernel_package()`` does that; nothing is patched, and
``levels/__init__.py`` stays the one place that chooses the interpreter (it
only ``setdefault``s the variable, so the ``TRITON_INTERPRET=0`` such a process
starts with stands).

Which kernel modules a process uses
-----------------------------------
The tooling runs in two kinds of process, and reaches the kernel modules
through one function, ``kernels()``, which ``matrix.py`` and ``check.py`` call
when they are imported:

- the *parent* (``ladder check``, the tests): it plans the jobs, applies the
  prune and reports; it compiles nothing. Without a GPU it interprets
  (``levels`` chose ``TRITON_INTERPRET=1``), on a GPU it has CUDA; either way
  it can import level 4, and ``kernels()`` gives it ``levels.level4_triton_kernel``,
  the same modules the rest of the process uses (one copy of each);
- a *compile worker* (``python -m ladder.check``, started by
  ``check.py`` with ``TRITON_INTERPRET=0``): ``__main__`` loads the kernels on
  their own first, on any machine (a worker needs the kernels only, not the
  level's models, and on a GPU machine importing the level would initialise
  CUDA in every worker), and ``kernels()`` gives it that package,
  ``level4_kernels``. A process that neither interprets nor sees a CUDA device
  gets it too, since level 4 itself would refuse it.

Use
---
The compile check (check.py) starts its workers as ``python -m
ladder.check`` with ``TRITON_INTERPRET=0``. By hand, on a laptop::

    TRITON_INTERPRET=0 python -c "
    from ladder.check.check import compile_one, plan
    print(compile_one(plan()[0]))"
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

PACKAGE = "level4_kernels"  # the name the kernel modules take when loaded on their own
LEVEL = "levels.level4_triton_kernel"  # their name in a process that imports level 4
DIRECTORY = Path(__file__).parents[2] / "levels" / "level4_triton_kernel"
MODULES = (
    "tiles",
    "flash_forward",
    "flash_backward",
    "flash_decode",
    "paged_decode",
    "fused_layer_norm",
)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (as ``tiles.interpreting``,
    which cannot be imported here without importing triton)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernel_package() -> ModuleType:
    """Level 4's kernel modules, loaded from their directory as the package ``level4_kernels``.

    The package has no ``__init__`` code: its submodules are imported from
    ``DIRECTORY`` by the ordinary import system (their relative imports resolve
    inside it), and each is an attribute of the package, as after ``import``.
    Raises ``RuntimeError`` in a process that interprets, where the kernels
    would be the interpreter's and could not be compiled.
    """
    if interpreting():
        raise RuntimeError(
            "level 4's kernels are loaded for compiling only in a process started with "
            "TRITON_INTERPRET=0 (this one interprets them)"
        )
    if PACKAGE not in sys.modules:
        # A namespace-style package: a spec with no loader, whose search path is the directory.
        spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
        spec.submodule_search_locations = [str(DIRECTORY)]
        sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
    package = sys.modules[PACKAGE]
    for name in MODULES:
        importlib.import_module(f"{PACKAGE}.{name}")
    return package


def kernels() -> ModuleType:
    """The kernel package for this process (the module docstring): ``level4_kernels`` if
    it was loaded on its own (a compile worker) or level 4 cannot be imported here (no
    interpreter, no CUDA device), else level 4 itself. Either has ``MODULES`` as attributes."""
    if PACKAGE in sys.modules:
        return kernel_package()
    if not interpreting():
        import torch

        if not torch.cuda.is_available():
            return kernel_package()
    package = importlib.import_module(LEVEL)
    for name in MODULES:
        importlib.import_module(f"{LEVEL}.{name}")
    return package
