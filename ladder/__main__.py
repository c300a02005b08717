"""``python -m ladder``: the same command as the ``ladder`` script."""

import sys

from . import main

sys.exit(main())
