"""Ctrl-C at any moment of a command: one line on stderr and exit status 130.

Python turns SIGINT into a ``KeyboardInterrupt`` raised at whatever bytecode runs next,
and ``ladder.cli.main`` turns that into the one line. Three moments of a command's life
break that promise unless the handler here stands in for Python's:

* **a compiled extension's initialisation.** triton's module (nanobind) builds its enums
  with Python's ``enum`` while it initialises; an exception raised there crosses C++
  frames that cannot carry it, and the process aborts (``terminate called after throwing
  an instance of 'nanobind::python_error'``, SIGABRT, a screen of traceback). ``ladder
  train`` meets it a second or two in, when the optimiser's first step imports
  ``torch._dynamo`` and with it triton. So an interrupt that lands in Python code an
  extension's initialisation called is held, and sent again every ``RETRY_S`` until it
  lands elsewhere: the initialisation ends (a fraction of a second), then the command
  stops. An interrupt in any other import is raised at once (the half-imported module
  is dropped, harmlessly).
* **code run by ``exec`` of a string** (``dataclasses`` and ``collections.namedtuple``
  write their methods that way, mostly while modules import). CPython 3.11 marks an
  interrupt raised there as unhandled even when the command catches it, and ``python -m
  ladder`` then ends by SIGINT at exit instead of returning 130 (6 of 40 interrupted
  ``ladder train --quick`` runs ended so). ``forget_unhandled`` clears the mark.
* **the interpreter's exit**, after the command is done: Python puts SIGINT's default
  action back while it shuts down, so a late Ctrl-C killed a finished command. ``ladder``
  ignores it then (``finished``): the work is done and its status stands.

What no handler can cover is the interpreter's own start (its ``site`` packages
included), the tens of milliseconds before any code of this package runs.

And a fourth moment loses the interrupt altogether: **a finalizer or a weakref callback**
(torch runs them between any two steps), where Python prints the exception as "ignored"
and goes on, so the command ran to its end (a training interrupted there exited 0
after printing it). ``CtrlC`` takes such an interrupt
from ``sys.unraisablehook`` and sends it again, to land outside. It also remembers the
signal, for a loop that must stop whatever swallowed it (training asks ``check()``
between steps). Where SIGINT is ignored (``nohup``, a background job) nothing is
installed: the command keeps ignoring it, as it was told to.
"""

from __future__ import annotations

import os
import signal
import sys

RETRY_S = 0.02  # seconds before an interrupt held back (or swallowed) is sent again
_LOADERS = "<frozen importlib._bootstrap_external>"  # where importlib's loaders run


class CtrlC:
    """SIGINT's handler while the block runs (where Python's own handler, or another
    ``CtrlC``, was in place); the previous handler comes back at the end of the block."""

    def __init__(self) -> None:
        self.seen = False  # an interrupt arrived, raised or still held
        self.previous = None

    def __enter__(self) -> CtrlC:
        self.seen = False
        self.previous = signal.getsignal(signal.SIGINT)
        self.installed = self.previous is signal.default_int_handler or isinstance(
            self.previous, CtrlC
        )
        if self.installed:
            signal.signal(signal.SIGINT, self)
            self.previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc) -> bool:
        if self.installed:
            if signal.getsignal(signal.SIGINT) is self:
                signal.signal(signal.SIGINT, self.previous)
            if sys.unraisablehook == self._unraisable:
                sys.unraisablehook = self.previous_hook
        return False

    def __call__(self, signum, frame) -> None:
        self.seen = True
        if _importing(frame):
            self._later()
            return
        raise KeyboardInterrupt

    def _unraisable(self, unraisable) -> None:
        """An exception Python cannot raise (in a finalizer, a callback): an interrupt is
        sent again, to land where it can; anything else goes where it went before."""
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            self._later()
        else:
            self.previous_hook(unraisable)

    def _later(self) -> None:
        import threading  # here: the module loads before any other, and loads fast

        later = threading.Timer(RETRY_S, self._again)
        later.daemon = True  # never keeps a finishing process waiting
        later.start()

    @staticmethod
    def _again() -> None:
        if isinstance(signal.getsignal(signal.SIGINT), CtrlC):  # this block's, or a nested one's
            os.kill(os.getpid(), signal.SIGINT)

    def check(self) -> None:
        """``KeyboardInterrupt`` if an interrupt arrived in the block, even one that code
        in between swallowed."""
        if self.seen:
            raise KeyboardInterrupt


def _importing(frame) -> bool:
    """Whether ``frame`` is Python code called by a compiled extension while it initialises:
    importlib's ``create_module`` or ``exec_module`` of an ``ExtensionFileLoader`` is on its
    stack. (An interrupt in any other import is safe: the half-imported module is dropped.)"""
    while frame is not None:
        code = frame.f_code
        if code.co_filename == _LOADERS and code.co_name in ("create_module", "exec_module"):
            if type(frame.f_locals.get("self")).__name__ == "ExtensionFileLoader":
                return True
        frame = frame.f_back
    return False


def forget_unhandled() -> None:
    """Clear CPython's mark of an unhandled interrupt, left by one raised inside ``exec`` of
    a string and caught all the same: ``exec`` of a string resets the mark before it runs
    its code (CPython 3.11; a CPython that marks only an interrupt that really ends the
    program has nothing to clear, and this changes nothing there)."""
    exec("")


def finished() -> None:
    """The command is over: a Ctrl-C while the interpreter exits is ignored (where SIGINT
    was handled at all), so the command's status stands."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
