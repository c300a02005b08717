"""The forms a model's matrices may take besides its floats, and the one walk into them.

Two transforms change how a level-3 model holds its matrices, once, after it is built:
``quant.quantize`` (int8 and int4, fewer bytes to read) and ``blocked.block`` (float32
laid out for oneDNN's product of a few rows). Both walk the model the same way
(``convert``): each ``nn.Linear`` becomes a module of the new form, each other matrix
(the fused q/k/v rows, the embedding, which is also the tied head) a weight module of
the form under the same name, and every module's ``kernels.linear`` the product that
takes a matrix in any form (``linear``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn


class Weight(nn.Module):
    """A matrix ``(out, in)`` held in another form, in place of a parameter: it reads as a
    tensor where the modules read a weight's shape; each form adds its product,
    ``linear(x, bias=None)``."""

    out_features: int
    in_features: int

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    @property
    def ndim(self) -> int:
        return 2


class Linear(nn.Module):
    """An ``nn.Linear`` whose weight is a ``Weight`` (its bias kept as it was, frozen):
    ``x @ w.T + bias`` by the weight's own product."""

    def __init__(self, weight: Weight, bias: torch.Tensor | None):
        super().__init__()
        self.weight = weight
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight.linear(x, self.bias)


def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``Kernels.linear`` of a converted model: a weight of another form multiplies by its
    own product (``w.linear``), a float matrix by ``F.linear``."""
    if isinstance(w, torch.Tensor):
        return F.linear(x, w, bias)
    return w.linear(x, bias)


def convert(
    model: nn.Module,
    as_linear: Callable[[nn.Linear], nn.Module],
    as_weight: Callable[[nn.Parameter], nn.Module],
) -> nn.Module:
    """``model`` with its matrices in a new form, in place -> ``model``: each ``nn.Linear``
    replaced by ``as_linear(it)``, each other 2-D parameter by ``as_weight(it)`` under its
    own name, and ``kernels.linear`` of every module that has kernels by ``linear``. Norms,
    biases and the cache stay as they are; the model is then for inference."""
    for module in list(model.modules()):
        if isinstance(module, nn.Linear):
            continue  # replaced whole by its parent, below
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, as_linear(child))
        for name, param in list(module._parameters.items()):
            if param is not None and param.ndim == 2:
                del module._parameters[name]  # a parameter's name may hold a module only once freed
                module.add_module(name, as_weight(param))
        if getattr(module, "kernels", None) is not None:
            module.kernels = replace(module.kernels, linear=linear)
    model.requires_grad_(False)
    return model
