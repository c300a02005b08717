"""Stage 3: rotary position embeddings (docs/prelude.md, "Positions: rotary embeddings";
docs/your_rung.md, stage 3)."""

import numpy as np  # noqa: F401  (what you will write it with)

from learner.stages import stage


def rope(x, positions, base):
    """``x (B,H,T,Dh)`` rotated to ``positions (B,T)`` -> ``(B,H,T,Dh)``.

    The features go in adjacent pairs: pair ``i`` is ``(a, b) = (x[..., 2i], x[..., 2i+1])``,
    and it turns by the angle ``pos * base ** (-2i / Dh)``:
    ``(a, b) -> (a cos - b sin, b cos + a sin)``. Token ``t`` of row ``b`` is at
    ``positions[b, t]``, the same for every head; a padded token (``-1``) turns as
    position 0 (no query sees it). Compute the angles in float64, then return ``x``'s dtype.
    """
    raise NotImplementedError(stage("rope").not_written())


# To take level 1's RoPE instead of writing your own, replace the function above by:
#     from levels.level1_numpy.ops import rope
