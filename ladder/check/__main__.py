"""A compile worker: ``python -m ladder.check`` (check.py starts it with
``TRITON_INTERPRET=0``), serving jobs on stdin until it closes.

The kernel modules are loaded on their own before anything else (the package
docstring says why), so that ``kernels()`` gives check.py and matrix.py that
package, on a GPU machine too.
"""

import sys

from . import kernel_package

kernel_package()

from .check import serve  # noqa: E402  (after the kernels: check.py reaches them through kernels())

sys.exit(serve())
