"""The training objective: cross-entropy over scored positions only.

For logits ``z (B, T, V)``, targets ``y (B, T)`` and a boolean ``scored (B, T)``:

    loss = sum_{b,t scored} -log softmax(z[b, t])[y[b, t]]  /  #scored

Padding never enters the sum, and the mean is over real target tokens, not
over rows: a batch's loss is the same however its rows are padded, and a
long sequence weighs in proportion to its tokens. (A mean over the padded
grid would shrink the loss, and its gradient, as padding grows.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor
) -> torch.Tensor:
    """Mean negative log-likelihood of ``targets`` over the ``scored`` positions.

    ``logits (B, T, V)``, ``targets (B, T)`` int64, ``scored (B, T)`` bool -> scalar.
    Boolean indexing drops unscored positions before the softmax, so a padded
    position cannot contribute even a ``0 * inf``.
    """
    if not bool(scored.any()):
        raise ValueError("masked_cross_entropy needs at least one scored position")
    picked = logits[scored].float()  # (N, V), N = #scored; float32 log-softmax even for fp16
    return F.cross_entropy(picked, targets[scored], reduction="mean")
