"""Stage 1, attention: level 1's, taken by ``ladder rung new --take attention``.

To write your own, replace the import by the function ``ladder rung new`` writes here
(docs/your_rung.md, stage 1).
"""

from levels.level1_numpy.ops import attention  # noqa: F401  (level 1's)
