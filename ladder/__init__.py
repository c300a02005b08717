"""The ``ladder`` command, over the library (``levels``), the harness (``benchmarks``) and
the training lab (``lab``), none of which imports it.

* ``cli``: the parser (every argument of every command), the one-line errors, ``main``;
* ``bench``: ``ladder bench``, the harness run with its progress bar and files;
* ``train``: ``ladder train``, ``preflight`` and ``generate --checkpoint`` (the lab's models).

Run it as ``ladder ...`` or ``python -m ladder ...``.
"""
