"""The commands' rich console: at least 150 columns when writing to a file or a pipe (rich's
default there, 80, folds every table), the terminal's width otherwise."""

from __future__ import annotations

from rich.console import Console


def make_console(stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(width=150, stderr=stderr)
