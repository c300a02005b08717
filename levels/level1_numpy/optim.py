"""AdamW and global-norm gradient clipping in numpy, as PyTorch computes them.

Both work on dicts keyed by canonical parameter name (``model.parameters()``
and the grads of ``loss_and_grads``) and update in place. The arithmetic
follows ``torch.optim.AdamW`` and ``torch.nn.utils.clip_grad_norm_`` step for
step, including the order of operations, so that level 1 and level 2 trained
from the same start follow the same curve to rounding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


def clip_grad_norm(grads: Mapping[str, np.ndarray], max_norm: float) -> float:
    """Scale every gradient by ``min(1, max_norm / (norm + 1e-6))`` in place; return ``norm``.

    ``norm`` is the L2 norm of all gradients together (one vector), measured
    before clipping. The ``1e-6`` is torch's: it keeps the ratio finite when
    every gradient is zero, and makes a clipped norm land just under
    ``max_norm``.
    """
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
    coef = min(1.0, max_norm / (norm + 1e-6))
    if coef < 1.0:
        for g in grads.values():
            g *= coef
    return norm


class AdamW:
    """``torch.optim.AdamW`` (Loshchilov & Hutter): Adam with decoupled weight decay.

    ``AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)``;
    ``params`` is the dict of arrays to update in place, ``weight_decay`` one
    value for all, or a dict giving each name its own (e.g. 0 for biases and
    norm gains). Per parameter ``w`` with gradient ``g``, at step ``t = 1, 2, ...``::

        w <- w * (1 - lr * weight_decay)       decay, outside the adaptive scaling
        m <- m + (1 - b1) (g - m)              = b1 m + (1 - b1) g, as torch's lerp
        v <- b2 v + (1 - b2) g^2
        w <- w - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    The divisions by ``1 - b^t`` undo the bias of ``m`` and ``v`` towards
    their zero start. ``step_count``, ``exp_avg`` (``m``) and ``exp_avg_sq``
    (``v``) are the state, named as in torch's state dict.
    """

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float | Mapping[str, float] = 1e-2,
    ):
        self.params = params
        self.lr, self.betas, self.eps = lr, betas, eps
        if isinstance(weight_decay, Mapping):
            self.weight_decay = {name: float(weight_decay[name]) for name in params}
        else:
            self.weight_decay = dict.fromkeys(params, float(weight_decay))
        self.step_count = 0
        self.exp_avg = {name: np.zeros_like(w) for name, w in params.items()}
        self.exp_avg_sq = {name: np.zeros_like(w) for name, w in params.items()}

    def step(self, grads: Mapping[str, np.ndarray], lr: float | None = None) -> None:
        """One update of every parameter from ``grads`` (same keys); ``lr`` overrides ``self.lr``."""
        if set(grads) != set(self.params):
            raise ValueError(
                f"gradients and parameters differ: missing {sorted(set(self.params) - set(grads))}, "
                f"extra {sorted(set(grads) - set(self.params))}"
            )
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        self.step_count += 1
        t = self.step_count
        step_size = lr / (1 - b1**t)
        bias_correction2_sqrt = math.sqrt(1 - b2**t)
        for name, w in self.params.items():
            g, m, v = grads[name], self.exp_avg[name], self.exp_avg_sq[name]
            w *= 1 - lr * self.weight_decay[name]
            m += (1 - b1) * (g - m)
            v *= b2
            v += (1 - b2) * (g * g)
            denom = np.sqrt(v) / bias_correction2_sqrt + self.eps
            w -= step_size * (m / denom)

    def state(self) -> dict:
        """``{"step": int, "exp_avg": {name: array}, "exp_avg_sq": {name: array}}``, copies."""
        if self.step_count == 0:
            return {"step": 0, "exp_avg": {}, "exp_avg_sq": {}}  # no moments yet, as in torch
        return {
            "step": self.step_count,
            "exp_avg": {name: m.copy() for name, m in self.exp_avg.items()},
            "exp_avg_sq": {name: v.copy() for name, v in self.exp_avg_sq.items()},
        }

    def load_state(self, state: Mapping) -> None:
        """Restore what ``state()`` returned (step 0 may come without moments: zeros)."""
        self.step_count = int(state["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            moments = getattr(self, key)
            saved = state.get(key) or {}
            for name, array in moments.items():
                array[...] = saved[name] if self.step_count > 0 else 0.0
