"""Stage 7: the decoder, from token ids to logits (docs/your_rung.md, stage 7)."""

import numpy as np

from levels.level1_numpy import models as level1

from . import ops
from .block import EncoderLayer
from .cache import KVCache


class DecoderOnlyTransformer(level1.DecoderOnlyTransformer):
    """The model: level 1's ``__init__`` and public methods, your pass."""

    ops = ops
    Block = EncoderLayer
    Cache = KVCache

    def transformer(self, ids, positions, cache=None, last=False):
        x = self.token_embedding[ids] * self.embedding_scale  # (B,T) -> (B,T,D)
        keys = positions if cache is None else cache.extend(positions)  # (B,S)
        masks = self._masks(positions, keys)  # (B,1,T,S) a layer
        for i, (layer, mask) in enumerate(zip(self.layers, masks, strict=True)):
            x = layer(x, positions, mask, cache, i)  # (B,T,D)
        if last:  # each row's last real token, the one at its largest position
            x = x[np.arange(len(x)), positions.argmax(axis=1)][:, None]  # (B,1,D)
        return self.norm(x) @ self.output_projection.T  # (B,T,D) @ (D,V) -> (B,T,V)
