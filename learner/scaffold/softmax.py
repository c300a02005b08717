"""Stage 2: the softmax, and its numerics (docs/level0_loops.md, "The softmax, and why it
subtracts the maximum"; docs/level1_numpy.md, "-inf, not a large negative number";
docs/your_rung.md, stage 2)."""

import numpy as np  # noqa: F401  (what you will write it with)

from learner.stages import stage


def softmax(scores):
    """``scores (..., S)`` -> weights ``(..., S)``, each row summing to 1 over the last axis.

    ``exp(s) / sum(exp(s))``, computed so that it never overflows: subtract each row's
    largest score first (it cancels, and every ``exp`` argument is then ``<= 0``). A score
    of ``-inf`` (a key the query may not see) gets weight exactly 0. A row of ``-inf``
    only would be ``0 / 0``: ``attention`` refuses such a row before it gets here (a
    ``ValueError``), so every row you are given has a finite score.
    """
    raise NotImplementedError(stage("softmax").not_written())


# To take level 1's softmax instead of writing your own, replace the function above by:
#     from levels.level1_numpy.ops import softmax
