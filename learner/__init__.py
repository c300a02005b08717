"""A learner's rung: the ladder's transformer written by the reader, graded by the ladder.

A rung is a package in a folder of the learner's, exposing the names a level exposes
(docs/conventions.md, "A learner's rung"). It computes in numpy, like level 1: its
pieces are level 1's classes with the arithmetic, and the classes, that the learner
writes put in their place, passed down the way every level passes its pieces
(``ops``, ``Attention``, ``Block``, ``Cache``). Read it in this order:

* ``stages.py``: the stages, in the course's order, with what each asks for and the
  chapter that teaches it;
* ``scaffold/``: the package ``ladder rung new`` writes, every stage a stub raising
  ``NotImplementedError``; ``taken/``: each stage's file taking level 1's piece instead;
* ``rung.py``: writing a rung (``new``) and importing one from its folder (``load``),
  and whose code each stage runs (``origin``).

The suite grades a rung (``python -m pytest --rung DIR``, ``ladder rung test DIR``:
tests/rung_grading.py), the bench times it (``ladder bench --rung DIR``), and
docs/your_rung.md walks a learner through the stages.
"""

from .rung import NAMES, RungError, load, new, origin, stage_entries
from .stages import STAGES, Stage, stage, stage_names

__all__ = [
    "NAMES",
    "STAGES",
    "RungError",
    "Stage",
    "load",
    "new",
    "origin",
    "stage",
    "stage_entries",
    "stage_names",
]
