"""Stage 6: the KV cache (docs/your_rung.md, stage 6)."""

import numpy as np

from levels.level1_numpy import KVCache as Level1KVCache


class KVCache(Level1KVCache):
    """Every layer's keys and values so far, and every slot's position."""

    def extend(self, positions):
        if self.positions is not None:
            positions = np.concatenate([self.positions, positions], axis=1)  # (B, length + T)
        self.positions, self.length = positions, positions.shape[1]
        return positions

    def update(self, index, k, v):
        if self.keys[index] is not None:
            k = np.concatenate([self.keys[index], k], axis=2)  # (B,Hkv,length,Dh)
            v = np.concatenate([self.values[index], v], axis=2)
        self.keys[index], self.values[index] = k, v
        return k, v
