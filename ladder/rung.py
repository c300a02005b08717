"""``ladder rung``: write a learner's rung, and grade it with the ladder's own suite.

    ladder rung new DIR [--take STAGES]   a package to fill in, stage by stage (learner.new)
    ladder rung test DIR                  the suite on it, one line a stage (pytest --rung)

``test`` imports the rung first, so that one that does not import is one line here (a
usage error, as a file of the wrong kind is for the other commands); then it runs this
clone's suite on it, in this process and without pytest's terminal, so that what it
prints is tests/rung_grading.py's summary alone: every failure in full is ``python -m
pytest --rung DIR``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .cli import Interrupted

ROOT = Path(__file__).resolve().parent.parent  # the clone: its tests/ grade the rung


def new(args: argparse.Namespace) -> int:
    import learner

    learner.new(args.folder, args.take)
    print(f"a rung in {args.folder}, one file a stage, in the course's order:")
    for stage in learner.STAGES:
        if stage.file:
            state = "level 1's (taken)" if stage.name in args.take else "to write"
            print(f"  {stage.file:<13} {stage.title}: {state}")
    print(f"then: ladder rung test {args.folder}   (docs/your_rung.md walks through it)")
    return 0


def test(args: argparse.Namespace) -> int:
    import pytest

    import learner

    folder = args.folder.resolve()
    learner.load(folder)  # a rung that does not import: one line, before the suite starts
    tests = ROOT / "tests"
    if not (tests / "rung_grading.py").is_file():
        raise RuntimeError(f"the ladder's tests are not at {tests}: grading runs from a clone")
    # pytest's terminal is off: the grading prints its summary alone. The project's
    # addopts name the terminal's options, so they are replaced by the rest of them.
    options = ["-p", "no:terminal", "-p", "no:cacheprovider", "-o", "addopts=", "--strict-markers"]
    options += ["-m", "not extended and not manual", f"--rung={folder}"]
    options += [f"--rung-stage={name}" for name in args.stage or ()]
    status = pytest.main([str(tests), *options])
    if status in (0, 1):  # every stage passed; or one failed, or is not written yet
        return int(status)
    if status == pytest.ExitCode.INTERRUPTED:
        raise Interrupted("interrupted while the suite ran")
    raise RuntimeError(f"the suite did not run to the end (pytest's exit status {int(status)})")
