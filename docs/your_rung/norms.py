"""Stage 4: LayerNorm and RMSNorm (docs/your_rung.md, stage 4)."""

import numpy as np


def layer_norm(x, weight, bias, eps, offset=0.0):
    """``nn.LayerNorm`` over the last axis: ``x (..., N)`` -> ``(..., N)``."""
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # (..., 1): divided by N
    y = (x - mean) / np.sqrt(var + eps) * (offset + weight)
    return y if bias is None else y + bias


def rms_norm(x, weight, eps, offset=0.0):
    """RMSNorm over the last axis: ``x / sqrt(mean(x^2) + eps) * (offset + weight)``."""
    mean_square = (x * x).mean(axis=-1, keepdims=True)  # (..., 1)
    return x / np.sqrt(mean_square + eps) * (offset + weight)
