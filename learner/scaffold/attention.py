"""Stage 1: scaled dot-product attention, with masks (docs/level0_loops.md, "Attention,
grown one idea at a time"; docs/your_rung.md, stage 1)."""

import numpy as np  # noqa: F401  (what you will write it with)

from learner.stages import stage

from .softmax import softmax  # noqa: F401  (stage 2: a plain one will do for now)


def attention(q, k, v, *, causal=False, mask=None, scale=None):
    """``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)`` -> ``(B,H,T,Dv)``.

    1. The scores: ``q @ k^T`` over the head's features, times ``scale`` (None:
       ``1 / sqrt(Dh)``) -> ``(B,H,T,S)``. With fewer key heads than query heads (``Hkv <
       H``), query head ``h`` reads key head ``h // (H // Hkv)``: repeat each key and value
       head for the ``H // Hkv`` consecutive query heads of its group first.
    2. What each query may see: with ``causal``, query ``i`` sees key ``j`` when ``j <= i +
       (S - T)`` (bottom-right: with a cache the queries are the last ``T`` positions);
       ``mask`` (boolean, broadcastable to ``(B,H,T,S)``) keeps the keys where it is True.
       A key must pass both. Give every other key the score ``-inf``.
    3. ``softmax`` over the keys (the last axis; stage 2, ``softmax.py``), then the
       weighted sum of the values: ``weights @ v``.

    Stage 2 adds one check, before any arithmetic: a query row left with no key is a
    ``ValueError`` (never NaN).
    """
    raise NotImplementedError(stage("attention").not_written())


# To take level 1's attention instead of writing your own, replace the function above by:
#     from levels.level1_numpy.ops import attention
