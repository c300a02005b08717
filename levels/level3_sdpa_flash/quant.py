"""Weight-only int8 and int4: a loaded model's matrices held in fewer bytes.

Decoding one token reads every weight once, so its speed is bytes read per
second (docs/decoding.md): a quarter of float32's bytes (int8) or an eighth
(int4) raises the ceiling that much. The weights, not the activations, are
quantized, as gpt-fast does, and the products are PyTorch's own packed
kernels, which read the small integers directly and accumulate in float32:

* ``"int8"``: row ``o`` of ``w (out, in)`` becomes ``q[o] = round(w[o] / s[o])``
  with ``s[o] = max_i |w[o, i]| / 127``, so each weight is off by at most
  ``s[o] / 2`` (half a step of its row's grid). ``x @ w.T = (x @ q.T) * s``:
  ``aten._weight_int8pack_mm``.
* ``"int4"``: each row in groups of ``group_size`` weights (32 by default; 64 or
  128 halve or quarter the scales' bytes for a coarser grid), each group on
  its own 16-step grid from its minimum to its maximum, ``w ~ (q - 8) * scale +
  zero`` with ``q`` in ``[0, 15]``, ``scale = (max - min) / 15`` and ``zero = min +
  8 * scale`` (kept in bfloat16, as the kernels take them):
  ``aten._weight_int4pack_mm_for_cpu`` on a CPU, ``aten._weight_int4pack_mm``
  on CUDA, each with its own packing of the nibbles.

Both kernels take 16-bit activations and return them: a float32 model's
activations are rounded to bfloat16 at each product and the result widened
back. The error that adds is measured with the weights' own
(``ladder bench --scenario real-model``). The compiled decode step
(``compiled.py``) computes the int8 product as fused dot products over ``q``
instead, which read it at about twice the kernel's rate and keep float32
activations.

A GGUF file's quantisation is not this one, but close: a ``Q4_1`` block (32
weights, ``w = d * q + m``) is the int4 grid above with ``scale = d`` and
``zero = m + 8 d``, and ``Q4_K``'s sub-blocks of 32 are too (``d * sc``,
``dmin * m``); ``levels.gguf`` dequantizes every file to floats, and
``weights="int4"`` quantizes those floats again, group by group, recovering
the file's grid where a group spans all 16 steps (and rounding its scales
from float16 to bfloat16).

``quantize(model, fmt)`` is an explicit transform, applied once a model is
loaded (level 3's models take ``weights=``, and ``ladder --weights``, to call
it): every ``nn.Linear`` becomes a ``QuantizedLinear``, every other matrix
(the fused q/k/v rows, the embedding, which is also the tied head) a
``QuantizedWeight`` under the same name, and the modules' ``kernels.linear``
the product that takes either form (``forms.py``). The model is then for inference: no
gradient reaches a quantized weight, and ``state_dict()`` holds the integers
and their scales under each matrix's name (``in_proj_weight.q``, ...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import forms

FORMATS = ("int8", "int4")
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 32  # a GGUF Q4_1 block, a Q4_K sub-block: the finest grid the kernels take
LOW_PRECISION = (torch.bfloat16, torch.float16)  # the activations the kernels take


def check_format(fmt: str, group_size: int = DEFAULT_GROUP_SIZE) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"weights must be one of ('float', {', '.join(map(repr, FORMATS))})")
    if fmt == "int4" and group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group_size must be one of {GROUP_SIZES}, got {group_size!r}")


class QuantizedWeight(forms.Weight):
    """A matrix ``(out, in)`` in ``"int8"`` or ``"int4"``; ``compute`` is the float dtype of
    the model (what a gather of rows returns), ``act`` the 16-bit dtype the kernels take
    (the model's, or bfloat16), in which the scales are kept: the kernels multiply by them
    in it, and so does ``dequantize``.

    Buffers: int8 ``q (out, in)`` and ``scale (out,)``; int4 ``nibbles (out, in/2)``
    (two weights a byte, the even column in the low nibble), ``scale_zero (in/G, out, 2)``
    and ``packed``, the nibbles in the layout of the device's kernel.
    """

    def __init__(self, w: torch.Tensor, fmt: str, group_size: int = DEFAULT_GROUP_SIZE):
        super().__init__()
        check_format(fmt, group_size)
        self.fmt, self.group_size, self.compute = fmt, group_size, w.dtype
        self.act = w.dtype if w.dtype in LOW_PRECISION else torch.bfloat16
        self.out_features, self.in_features = w.shape
        w = w.detach().float()
        tiny = torch.finfo(self.act).tiny  # an all-zero row or group: a tiny scale, no 0/0
        if fmt == "int8":
            scale = (w.abs().amax(dim=1) / 127).clamp_min(tiny).to(self.act)  # (out,)
            # Rounded to the scale the kernel uses, the largest weight may land a fraction of
            # a step past 127 (the scale's rounding, 2^-9 relative): clamped, within half a step.
            q = torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
            self.register_buffer("q", q.contiguous())  # (out, in)
            self.register_buffer("scale", scale)
            return
        if self.in_features % group_size:
            raise ValueError(
                f"int4: rows of {self.in_features} do not split into groups of {group_size}"
            )
        groups = w.reshape(self.out_features, -1, group_size)  # (out, in/G, G)
        low, high = groups.amin(-1), groups.amax(-1)  # (out, in/G)
        scale = ((high - low) / 15).clamp_min(tiny).to(self.act)
        zero = (low + 8 * scale.float()).to(self.act)  # the grid's middle step, q = 8
        # Steps counted from the group's minimum on the grid the kernel will use.
        start = zero.float() - 8 * scale.float()
        q = torch.round((groups - start[..., None]) / scale.float()[..., None]).clamp(0, 15)
        q = q.to(torch.uint8).reshape(self.out_features, self.in_features)
        self.register_buffer("nibbles", q[:, 0::2] | (q[:, 1::2] << 4))  # (out, in/2)
        self._pack_for_kernel(q, torch.stack([scale.t(), zero.t()], -1), w.device)

    def _pack_for_kernel(self, q: torch.Tensor, scale_zero: torch.Tensor, device) -> None:
        """``packed`` and ``scale_zero (in/G, out', 2)`` for the device's int4 kernel, from
        ``q (out, in)`` in ``[0, 15]``: the kernels take rows in multiples of 16 (CPU) or 8
        (CUDA), so a matrix of other heights gets rows of zero scale, cut from the product."""
        multiple = 8 if device.type == "cuda" else 16
        self.padded_rows = -(-self.out_features // multiple) * multiple
        extra = self.padded_rows - self.out_features
        q = F.pad(q, (0, 0, 0, extra))  # (out', in)
        self.register_buffer("scale_zero", F.pad(scale_zero, (0, 0, 0, extra)).contiguous())
        if device.type == "cuda":  # a byte per two weights, the even one in the high nibble
            pairs = (q[:, 0::2] << 4 | q[:, 1::2]).to(torch.uint8)
            tiles = next(t for t in (8, 4, 2) if self.in_features % (16 * t) == 0)
            packed = torch.ops.aten._convert_weight_to_int4pack(pairs.to(device), tiles)
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        self.register_buffer("packed", packed)

    def values(self, rows=slice(None)) -> torch.Tensor:
        """The integers ``(out, in)`` (or those ``rows``): int8 as they are, int4 unpacked to
        ``[0, 15]``. The rows are taken before unpacking: an embedding lookup unpacks the
        rows it reads, not the whole table (a fifth of the model's bytes)."""
        if self.fmt == "int8":
            return self.q[rows]
        nibbles = self.nibbles[rows]  # (..., in/2)
        low, high = nibbles & 15, nibbles >> 4
        return torch.stack([low, high], -1).reshape(*nibbles.shape[:-1], self.in_features)

    def dequantize(self, dtype: torch.dtype = torch.float32, rows=slice(None)) -> torch.Tensor:
        """The matrix it stands for, ``(out, in)`` (or those ``rows``), in ``dtype``."""
        if self.fmt == "int8":
            return (self.q[rows].float() * self.scale[rows].float()[..., None]).to(dtype)
        q = self.values(rows).float()  # (n, in)
        kept = self.scale_zero[:, : self.out_features]  # (in/G, out, 2), without padding rows
        scale, zero = (kept[..., i].t()[rows].float() for i in (0, 1))  # (n, in/G)
        groups = q.reshape(*q.shape[:-1], -1, self.group_size)  # (n, in/G, G)
        w = (groups - 8) * scale[..., None] + zero[..., None]
        return w.reshape(q.shape).to(dtype)

    def __getitem__(self, index):
        """A slice of rows as a ``QuantizedWeight`` (the fused q/k/v rows); a gather of rows
        (an embedding lookup, ``index`` a tensor of ids) as floats in ``compute``."""
        if not isinstance(index, slice):
            return self.dequantize(self.compute, index)  # (..., in)
        start, stop, step = index.indices(self.out_features)
        if (start, stop, step) == (0, self.out_features, 1):
            return self
        return self._rows(start, stop)

    def _rows(self, start: int, stop: int) -> QuantizedWeight:
        part = QuantizedWeight.__new__(QuantizedWeight)
        nn.Module.__init__(part)
        part.fmt, part.group_size, part.compute, part.act = (
            self.fmt,
            self.group_size,
            self.compute,
            self.act,
        )
        part.out_features, part.in_features = stop - start, self.in_features
        if self.fmt == "int8":
            part.register_buffer("q", self.q[start:stop])
            part.register_buffer("scale", self.scale[start:stop])
        else:
            part.register_buffer("nibbles", self.nibbles[start:stop])
            scale_zero = self.scale_zero[:, start:stop]
            part._pack_for_kernel(part.values(), scale_zero, self.nibbles.device)
        return part

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x (..., in) @ w.T + bias`` -> ``(..., out)`` in ``x``'s dtype, by the packed kernel
        (``x`` rounded to ``act`` on the way in, the result widened back)."""
        flat = x.reshape(-1, x.shape[-1]).to(self.act)  # (N, in)
        if self.fmt == "int8":
            y = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale)
        elif x.device.type == "cuda":
            y = torch.ops.aten._weight_int4pack_mm(
                flat, self.packed, self.group_size, self.scale_zero
            )
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                flat, self.packed, self.group_size, self.scale_zero
            )
        y = y[:, : self.out_features]  # (N, out): without the int4 kernels' padding rows
        y = y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)  # (..., out)
        return y if bias is None else y + bias

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.fmt == "int4" else ""
        return f"{self.out_features}, {self.in_features}, {self.fmt}{group}"


class QuantizedLinear(forms.Linear):
    """An ``nn.Linear`` whose weight is a ``QuantizedWeight``: ``x @ w.T + bias``."""

    def __init__(self, linear: nn.Linear, fmt: str, group_size: int = DEFAULT_GROUP_SIZE):
        super().__init__(QuantizedWeight(linear.weight, fmt, group_size), linear.bias)


def quantize(model: nn.Module, fmt: str, *, group_size: int = DEFAULT_GROUP_SIZE) -> nn.Module:
    """Every matrix of ``model`` in ``fmt`` (``"int8"`` or ``"int4"``), in place -> ``model``.

    Each ``nn.Linear`` becomes a ``QuantizedLinear``; each other 2-D parameter a
    ``QuantizedWeight`` under its own name; each module with ``kernels`` computes
    ``kernels.linear`` with ``forms.linear`` (``forms.convert``). Norms, biases and the
    cache stay as they are. Quantize a model on the device it will run on (the int4
    packing is the device's).
    """
    check_format(fmt, group_size)
    return forms.convert(
        model,
        lambda linear: QuantizedLinear(linear, fmt, group_size),
        lambda w: QuantizedWeight(w, fmt, group_size),
    )
