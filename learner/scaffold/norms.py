"""Stage 4: LayerNorm and RMSNorm (docs/prelude.md, "The block: a residual stream,
normalised on the way in"; docs/your_rung.md, stage 4)."""

import numpy as np  # noqa: F401  (what you will write it with)

from learner.stages import stage


def layer_norm(x, weight, bias, eps, offset=0.0):
    """``nn.LayerNorm`` over the last axis: ``x (..., N)`` -> ``(..., N)``.

    ``(x - mean) / sqrt(var + eps) * (offset + weight) + bias``, the mean and the variance
    over the last axis, the variance divided by ``N`` (not ``N - 1``); ``bias`` may be
    None (no bias). ``offset`` is 0 except for Gemma, which stores its gains as offsets
    from 1.
    """
    raise NotImplementedError(stage("norms").not_written())


def rms_norm(x, weight, eps, offset=0.0):
    """RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * (offset + weight)``.

    No centring and no bias: LayerNorm's cheaper cousin, which Llama and SmolLM2 use.
    """
    raise NotImplementedError(stage("norms").not_written())


# To take level 1's norms instead of writing your own, replace the functions above by:
#     from levels.level1_numpy.ops import layer_norm, rms_norm
