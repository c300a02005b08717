"""Stage 6: the KV cache (docs/level0_loops.md, "One architecture, any arithmetic";
docs/level1_numpy.md, "Incremental decoding"; docs/your_rung.md, stage 6).

Level 1's cache (level 0's class, on numpy arrays) with the two methods a pass calls
written by you: the pass calls ``extend`` once with the new tokens' positions, then each
layer ``update`` with its new keys and values.
"""

import numpy as np  # noqa: F401  (what you will write it with)

from learner.stages import stage
from levels.level1_numpy import KVCache as Level1KVCache


class KVCache(Level1KVCache):
    """Every layer's keys and values so far, and every slot's position.

    Level 1's ``__init__`` leaves you: ``self.length`` (0: the slots filled),
    ``self.positions`` (None until the first pass; then ``(B, length)``),
    ``self.keys`` and ``self.values`` (a list with one entry per layer, None until the
    first pass; then ``(B,Hkv,length,Dh)``).
    """

    def extend(self, positions):
        """The ``T`` new slots' positions ``(B,T)`` -> every slot's position ``(B, length + T)``.

        Append them to ``self.positions`` (or start it), and set ``self.length`` to the
        slots the cache now holds.
        """
        raise NotImplementedError(stage("cache").not_written())

    def update(self, index, k, v):
        """Layer ``index``'s keys and values of the new slots ``(B,Hkv,T,Dh)`` -> every key and
        value of that layer ``(B,Hkv,length,Dh)`` (``extend`` has run in this pass).

        Append them along the slots' axis to ``self.keys[index]`` and
        ``self.values[index]`` (or start them), and return the two.
        """
        raise NotImplementedError(stage("cache").not_written())


# To take level 1's cache instead of writing your own, delete the two methods above.
