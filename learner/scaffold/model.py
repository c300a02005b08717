"""Stage 7: the decoder, from token ids to logits (docs/prelude.md, "The head: from the
stream to logits"; docs/your_rung.md, stage 7).

Level 1's decoder-only model with the plain pass written by you: level 1's ``__init__``
builds the pieces from the parameters, and its public methods (``forward(tokens, *,
valid=None)``, ``prefill``, ``decode_step``, ``generate``) check their inputs, make each
token's position and call your ``transformer``.
"""

import numpy as np  # noqa: F401  (what you will write it with)

from learner.stages import stage
from levels.level1_numpy import models as level1

from . import ops
from .block import EncoderLayer
from .cache import KVCache


class DecoderOnlyTransformer(level1.DecoderOnlyTransformer):
    """The model. Level 1's ``__init__`` leaves you ``self.token_embedding (V,D)``,
    ``self.embedding_scale`` (``sqrt(D)``, or 1 where a model does not scale),
    ``self.layers`` (the blocks: your ``EncoderLayer``), ``self.norm`` (the final norm),
    ``self.output_projection (V,D)`` (the embedding itself when tied) and
    ``self._masks(positions, keys)``, what each layer's queries may see, by position.
    """

    ops = ops
    Block = EncoderLayer
    Cache = KVCache

    def transformer(self, ids, positions, cache=None, last=False):
        """``ids (B,T)`` in ``[0, V)``, ``positions (B,T)`` (``-1``: padding) -> logits ``(B,T,V)``.

        1. Embed: row ``ids[b, t]`` of the embedding, times ``self.embedding_scale``.
        2. The keys' positions: ``positions``, or with a ``cache`` ``cache.extend(positions)``
           (the cached slots' and these, ``(B,S)``).
        3. ``masks = self._masks(positions, keys)``: one ``(B,1,T,S)`` mask a layer.
        4. Each block in turn: ``x = layer(x, positions, mask, cache, i)``.
        5. With ``last``, keep each row's last real token only: ``(B,1,D)`` (the one whose
           position is the row's largest).
        6. The final norm, then ``@ output_projection^T``: ``(B,T,V)``.
        """
        raise NotImplementedError(stage("decoder").not_written())


# To take level 1's decoder instead of writing your own, delete the method above: the
# class then runs level 1's pass, with your blocks and your cache.
