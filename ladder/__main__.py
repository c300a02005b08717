"""``python -m ladder``: the same command as the ``ladder`` script."""

import sys

from .cli import main

sys.exit(main())
