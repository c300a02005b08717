"""The ``ladder`` command, over the library (``levels``), the harness (``benchmarks``) and
the training lab (``lab``), none of which imports it.

* ``cli``: the parser (every argument of every command), the one-line errors, ``main``;
* ``interrupts``: Ctrl-C at any moment, one line and exit status 130;
* ``bench``: ``ladder bench``, the harness run with its progress and files;
* ``train``: ``ladder train``, ``preflight`` and ``generate --checkpoint`` (the lab's models);
* ``chat``, ``serve``, ``pull``: the real models.

Run it as ``ladder ...`` or ``python -m ladder ...``: both call ``main`` below, which
imports nothing before its SIGINT handler is in place (this file imports nothing at all).
"""


def main() -> int:
    """The ``ladder`` process: ``cli.main`` under ``interrupts.CtrlC`` from its first import
    on, then the interpreter's exit shielded from a late Ctrl-C."""
    import sys

    from .interrupts import CtrlC, finished, forget_unhandled

    with CtrlC():
        try:
            from .cli import main as run

            status = run()
        except KeyboardInterrupt:  # before ``run`` could name the command (its parsing)
            print("ladder: interrupted", file=sys.stderr)
            status = 130
    forget_unhandled()  # an interrupt caught anywhere (a chat's answer cut short, say)
    finished()
    return status
