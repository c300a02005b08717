"""Stage 6, the KV cache: level 1's, taken by ``ladder rung new --take cache``.

To write your own, add the two methods ``ladder rung new`` writes here
(docs/your_rung.md, stage 6).
"""

from levels.level1_numpy import KVCache as Level1KVCache


class KVCache(Level1KVCache):
    """Level 1's cache (level 0's class, on numpy arrays)."""
