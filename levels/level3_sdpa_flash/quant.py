"""Weight-only int8: every matrix held in one byte a weight, one scale per output row.

Decoding one token reads every weight once, so its speed is bytes read per
second (docs/decoding.md): a quarter of float32's bytes is up to four times
the ceiling. The weights, not the activations, are quantized, as gpt-fast
does: row ``o`` of ``w (out, in)`` becomes ``q[o] = round(w[o] / s[o])`` with
``s[o] = max_i |w[o, i]| / 127``, so ``w ~ q * s[:, None]`` with each weight off
by at most ``s[o] / 2`` (half a step of its own row's grid). The product
``x @ w.T = (x @ q.T) * s`` keeps the scale outside the sum; PyTorch's CPU kernel
for it, ``aten._weight_int8pack_mm``, reads the int8 weights directly and
accumulates in float32. It takes 16-bit activations (given float32 ones, it
takes a slow path, three times slower than float32 weights here), so a
float32 model's activations are rounded to bfloat16 at each product and the
result widened back: the error that adds is measured with the weights' own
(``ladder bench --scenario real-model``).

``Int8Weight`` is a tensor of the int8 ``q`` carrying ``s``: a model's modules
keep calling ``F.linear(x, w)`` and ``w[rows]`` and ``w[tokens]``, and the tensor
answers each (``__torch_function__``): the product with the int8 kernel, a row
slice as int8 rows with their scales, a gather of embedding rows dequantized.
``quantize_`` swaps every matrix of a model for one (level 3's models take
``weights="int8"``); the model then is for inference only: no gradient
reaches an int8 weight, and ``state_dict()`` holds the int8 values without
their scales (load canonical parameters and quantize again instead).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LOW_PRECISION = (torch.bfloat16, torch.float16)  # the activations the kernel takes fast


class Int8Weight(torch.Tensor):
    """A matrix ``(out, in)`` as int8 ``q`` with ``scale (out,)``: ``w ~ q * scale[:, None]``;
    ``compute`` is the float dtype the model computes in (what a gather of rows returns)."""

    scale: torch.Tensor
    compute: torch.dtype

    @staticmethod
    def quantize(w: torch.Tensor) -> Int8Weight:
        """``w (out, in)`` float -> int8 rows and their absmax scales (float32)."""
        dtype, w = w.dtype, w.detach().float()
        scale = (w.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)  # (out,)
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)  # (out, in)
        return Int8Weight.wrap(q.contiguous(), scale, dtype)

    @staticmethod
    def wrap(q: torch.Tensor, scale: torch.Tensor, compute: torch.dtype) -> Int8Weight:
        t = torch.Tensor._make_subclass(Int8Weight, q)
        t.scale, t.compute = scale, compute
        return t

    def int8(self) -> torch.Tensor:
        return self.as_subclass(torch.Tensor)

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return self.int8().to(dtype) * self.scale.to(dtype)[:, None]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            return _linear(*args, **kwargs)
        if func is torch.Tensor.__getitem__:
            w, index = args
            if isinstance(index, slice):  # rows of a fused matrix (level 2's q/k/v)
                return Int8Weight.wrap(w.int8()[index], w.scale[index], w.compute)
            rows = w.int8()[index]  # an embedding gather: (..., in) int8
            return (rows.to(torch.float32) * w.scale[index][..., None]).to(w.compute)
        if func is torch.Tensor.detach:  # nn.Parameter(w) detaches: keep the scales
            return Int8Weight.wrap(args[0].int8().detach(), args[0].scale, args[0].compute)
        if func is torch.Tensor.to:
            w = args[0]
            moved = w.int8().to(*args[1:], **kwargs)
            if moved.dtype != torch.int8:  # a cast: to a float dtype means dequantizing
                return w.dequantize(moved.dtype).to(moved.device)
            return Int8Weight.wrap(moved, w.scale.to(moved.device), w.compute)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def _linear(x: torch.Tensor, w: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x (..., in) @ w.T + bias`` with the int8 kernel: ``(x @ q.T) * scale``."""
    compute = x.dtype if x.dtype in LOW_PRECISION else torch.bfloat16
    flat = x.reshape(-1, x.shape[-1]).to(compute)  # (N, in)
    y = torch.ops.aten._weight_int8pack_mm(flat, w.int8(), w.scale.to(compute))  # (N, out)
    y = y.reshape(*x.shape[:-1], y.shape[-1]).to(x.dtype)
    return y if bias is None else y + bias


def quantize_(model: nn.Module) -> nn.Module:
    """Every matrix parameter of ``model`` (the linears, q/k/v, the embedding and head) as an
    ``Int8Weight``, in place; -> ``model``, now for inference only."""
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and param.ndim == 2 and not isinstance(param, Int8Weight):
                # Registered directly: nn.Module accepts only float Parameters by assignment.
                module._parameters[name] = nn.Parameter(
                    Int8Weight.quantize(param), requires_grad=False
                )
    return model
