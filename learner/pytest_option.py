"""``--rung DIR`` (and ``--rung-stage NAME``), declared to pytest by this package's entry point
(pyproject's ``pytest11``).

The suite's other options live in tests/conftest.py, but this one cannot: pytest picks
its root folder and its conftest files from the arguments *before* it reads a conftest,
and an option it does not know yet leaves ``DIR`` among them, where it is taken for a
folder of tests outside the project. An entry point is read first. What the option does
is tests/conftest.py's (and tests/rung_grading.py's).
"""

from __future__ import annotations


def pytest_addoption(parser):
    parser.addoption(
        "--rung",
        default=None,
        metavar="DIR",
        help="run the stages' tests on the learner's rung in DIR (`ladder rung new DIR` writes one)",
    )
    parser.addoption(
        "--rung-stage",
        action="append",
        default=None,
        metavar="NAME",
        help="with --rung: this stage's tests only (repeatable; learner.STAGES names them)",
    )
