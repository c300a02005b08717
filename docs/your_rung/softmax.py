"""Stage 2: the softmax, and its numerics (docs/your_rung.md, stage 2)."""

import numpy as np


def softmax(scores):
    """``scores (..., S)`` -> weights ``(..., S)``, each row summing to 1 over the last axis."""
    top = scores.max(axis=-1, keepdims=True)  # (..., 1): finite, every row has a key
    e = np.exp(scores - top)  # every argument <= 0: no overflow; exp(-inf) = 0
    return e / e.sum(axis=-1, keepdims=True)  # the sum is >= 1: no 0 / 0
