"""Stage 4, LayerNorm and RMSNorm: level 1's, taken by ``ladder rung new --take norms``.

To write your own, replace the import by the functions ``ladder rung new`` writes here
(docs/your_rung.md, stage 4).
"""

from levels.level1_numpy.ops import layer_norm, rms_norm  # noqa: F401  (level 1's)
