"""Stage 3, RoPE: level 1's, taken by ``ladder rung new --take rope``.

To write your own, replace the import by the function ``ladder rung new`` writes here
(docs/your_rung.md, stage 3).
"""

from levels.level1_numpy.ops import rope  # noqa: F401  (level 1's)
