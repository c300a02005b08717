"""Float32 matrices laid out for oneDNN: a decode step of a few rows at about one row's cost.

A server decodes its running requests together, one token each, so every product of
the step is ``M`` rows (up to ``--max-batch``) times a weight matrix that is read once
for all of them. On a CPU, ``F.linear`` hands that to a BLAS GEMM, tuned for large
products, and for a handful of rows it is slow: eight rows cost it more than twice one
row. oneDNN's inner product, with each matrix reordered once into its blocked layout for
eight rows, costs about a row's time for eight (docs/decoding.md measures both:
``python docs/tools/decode_profile.py --layouts --rows 8``).

``block(model)`` is an explicit transform, as ``quant.quantize`` is (``forms.convert``
walks the model for both): each ``nn.Linear`` becomes a ``BlockedLinear``, each other
matrix a ``BlockedWeight``, and the products go through oneDNN's private ops
(``private.py`` says why and what that costs). Level 3's models take it as
``weights="blocked"``, and ``ladder serve`` uses it for a batch of float32 requests on
a CPU. A float32 model on a CPU only: oneDNN has no float64 product.

What changes in the numbers: the order in which each dot product is summed, so the
results differ from ``F.linear``'s by float32 rounding (the tests hold a model's
logits to ``F.linear``'s within float32's usual bound). What it costs in memory: an
``nn.Linear``'s matrix is kept only reordered; each other matrix also as floats,
which a gather (the embedding) and a slice of rows (the q/k/v rows of
cross-attention) read. ``ladder serve``'s process held 1.65 GB after loading SmolLM2
so, against 1.33 GB with float weights (1.95 GB at its peak, while reordering).
"""

from __future__ import annotations

import torch
from torch import nn

from . import forms, private

ROWS = 8  # the rows the layout is chosen for: --max-batch's default


def refusal(dtype: torch.dtype | None, device) -> str | None:
    """Why a model of ``dtype`` on ``device`` (None: float32, the CPU) cannot be blocked, the
    end of a sentence whose subject is the option; None when it can: float32 on a CPU, with
    oneDNN's ops in this torch."""
    missing = private.blocked_missing()
    if missing is not None:
        return f"needs oneDNN's reordered product: {missing}"
    dtype, device = dtype or torch.float32, torch.device(device or "cpu")
    if dtype != torch.float32 or device.type != "cpu":
        name = str(dtype).removeprefix("torch.")
        return f"is for float32 on a CPU (oneDNN's product), not {name} on {device.type}"
    return None


def check_blockable(dtype: torch.dtype | None, device) -> None:
    """``ValueError`` (one line) with ``refusal``'s reason, if there is one."""
    reason = refusal(dtype, device)
    if reason is not None:
        raise ValueError(f"weights='blocked' {reason}; use weights='float'")


class BlockedWeight(forms.Weight):
    """A float32 matrix ``(out, in)`` in oneDNN's blocked layout, multiplied by ``linear``.

    With ``floats`` it also keeps the matrix as it was (buffer ``weight``), which a gather
    of rows reads (an embedding lookup, ``w[ids]``) and a slice of rows is laid out from
    on first use (``w[a:b]``, the q/k/v rows of cross-attention)."""

    def __init__(self, w: torch.Tensor, rows: int = ROWS, *, floats: bool = True):
        super().__init__()
        self.out_features, self.in_features = w.shape
        self.rows = rows
        self.register_buffer("weight", w.detach() if floats else None)
        self._layout = private.blocked_reorder(w, rows)  # opaque: only oneDNN's product reads it
        self._slices: dict[tuple[int, int], BlockedWeight] = {}

    def __getitem__(self, index):
        """A slice of rows as a ``BlockedWeight`` of them; a gather (ids) as floats."""
        if isinstance(index, slice):
            start, stop, step = index.indices(self.out_features)
            if (start, stop, step) == (0, self.out_features, 1):
                return self
            if step == 1:
                if (start, stop) not in self._slices:
                    floats = self._floats()[start:stop]
                    self._slices[(start, stop)] = BlockedWeight(floats, self.rows)
                return self._slices[(start, stop)]
        return self._floats()[index]  # (..., in)

    def _floats(self) -> torch.Tensor:
        if self.weight is None:
            raise ValueError("this blocked matrix kept no floats: it only multiplies (linear)")
        return self.weight

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x (..., in) @ w.T + bias`` -> ``(..., out)``, by oneDNN's product."""
        return private.blocked_linear(x, self._layout, bias)

    def extra_repr(self) -> str:
        return f"{self.out_features}, {self.in_features}, blocked for {self.rows} rows"


class BlockedLinear(forms.Linear):
    """An ``nn.Linear`` whose weight is a ``BlockedWeight`` (without its floats)."""

    def __init__(self, linear: nn.Linear, rows: int = ROWS):
        super().__init__(BlockedWeight(linear.weight, rows, floats=False), linear.bias)


def block(model: nn.Module, *, rows: int = ROWS) -> nn.Module:
    """Every matrix of ``model`` in oneDNN's blocked layout for about ``rows`` rows, in place
    -> ``model`` (float32 on a CPU: ``check_blockable``)."""
    p = next(model.parameters())
    check_blockable(p.dtype, p.device)
    return forms.convert(
        model, lambda linear: BlockedLinear(linear, rows), lambda w: BlockedWeight(w, rows)
    )
