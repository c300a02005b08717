"""Level 4's kernels on their own, defined for Triton's compiler, in a process without a GPU.

Why this module exists
----------------------
Triton decides when a kernel is *decorated* whether ``@triton.jit`` builds a
function for its compiler or for its CPU interpreter (``TRITON_INTERPRET``), and
its own built-ins (``tl.sum``, ``tl.max``) are decorated when triton is first
imported. A process that has imported triton to interpret cannot also compile;
compiling needs a process that chose the compiler from the start.

Such a process cannot import level 4 the usual way: the level's ``__init__``
refuses a process that neither interprets nor sees a CUDA device, because its
models could not run there (and ``levels.load`` must say so). But the kernel
modules (``tiles``, ``flash_forward``, ``flash_backward``, ``flash_decode``,
``fused_layer_norm``, ``compile_check``) import only torch, triton and each
other, so they can be loaded *on their own*, as a package of the same directory
under another name, without the level's ``__init__``. ``kernel_package()`` does
that; nothing is patched, and ``levels/__init__.py`` stays the one place that
chooses the interpreter (it only ``setdefault``s the variable, so the
``TRITON_INTERPRET=0`` such a process starts with stands).

Use
---
The compile check (level4_triton_kernel/compile_check.py) starts its workers as
``python -m levels.level4_compile`` with ``TRITON_INTERPRET=0``. By hand, on a
laptop::

    TRITON_INTERPRET=0 python -c "
    from levels.level4_compile import kernel_package
    kernels = kernel_package()
    print(kernels.compile_check.compile_one(kernels.compile_check.plan()[0]))"
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
DIRECTORY = Path(__file__).parent / "level4_triton_kernel"
MODULES = ("tiles", "flash_forward", "flash_backward", "flash_decode", "fused_layer_norm")


def kernel_package() -> ModuleType:
    """Level 4's kernel modules, loaded from their directory as the package ``level4_kernels``.

    The package has no ``__init__`` code: its submodules are imported from
    ``DIRECTORY`` by the ordinary import system (their relative imports resolve
    inside it), and each is an attribute of the package, as after ``import``.
    Raises ``RuntimeError`` in a process that interprets, where the kernels
    would be the interpreter's and could not be compiled.
    """
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
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
    for name in (*MODULES, "compile_matrix", "compile_check"):
        importlib.import_module(f"{PACKAGE}.{name}")
    return package


if __name__ == "__main__":  # a compile worker (compile_check.py starts it)
    sys.exit(kernel_package().compile_check.serve())
