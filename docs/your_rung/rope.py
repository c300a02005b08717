"""Stage 3: rotary position embeddings (docs/your_rung.md, stage 3)."""

import numpy as np


def rope(x, positions, base):
    """``x (B,H,T,Dh)`` rotated to ``positions (B,T)`` -> ``(B,H,T,Dh)``."""
    Dh = x.shape[-1]
    inv_freq = base ** (-2 * np.arange(Dh // 2) / Dh)  # (Dh/2,): pair i's turn a position
    angle = np.maximum(positions, 0)[:, None, :, None] * inv_freq  # (B,1,T,Dh/2), float64
    cos, sin = np.cos(angle).astype(x.dtype), np.sin(angle).astype(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]  # (B,H,T,Dh/2): each pair's first and second
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = b * cos + a * sin
    return out
