"""Converters between numpy and torch, the level's native array type, and canonical
numpy parameters as ``nn.Parameter``s under their canonical names."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

DEFAULT_DTYPE = torch.float32  # the torch levels compute in float32 unless told otherwise
# How ``fetch`` lays out a matrix: as ``matvec_layout`` says (what eager one-row products
# stream fastest), or row-major ``(out, in)`` inside ``row_major()``.
_ROW_MAJOR = contextvars.ContextVar("row_major", default=False)
# Whether ``fetch`` may make a parameter of the caller's own array (inside ``adopt()``).
_ADOPT = contextvars.ContextVar("adopt", default=False)


@contextmanager
def row_major() -> Iterator[None]:
    """Within it, ``fetch`` keeps every matrix row-major ``(out, in)``: the layout a compiled
    decode step streams (level 3's ``compile=True`` builds its model so, rather than laying
    the tall matrices out column-major and back, half a second of a chat's start)."""
    token = _ROW_MAJOR.set(True)
    try:
        yield
    finally:
        _ROW_MAJOR.reset(token)


@contextmanager
def adopt() -> Iterator[None]:
    """Within it, ``fetch`` makes a parameter of a value already in the wanted dtype, device
    and layout without copying it: the caller hands its arrays over, and the model's
    parameters are those arrays (a write to one is a write to the other). For a loader
    whose freshly read weights nobody else holds: ``ladder chat`` builds its model so,
    skipping a copy of every weight (a fifth of a second of its start for SmolLM2)."""
    token = _ADOPT.set(True)
    try:
        yield
    finally:
        _ADOPT.reset(token)


def copied(value: torch.Tensor, *, device=None, dtype=None) -> torch.Tensor:
    """A contiguous copy of ``value`` on ``device`` in ``dtype``; on the CPU in memory from
    numpy, which asks the kernel for huge pages (``madvise``) for blocks of 4 MiB or more,
    where torch's allocator takes 4 KiB pages. A decode step streams every weight once,
    and with 4 KiB pages its address translations are a real share of the step (the
    appendix's measurements)."""
    dtype = dtype or value.dtype
    if torch.device(device or "cpu").type != "cpu":
        return value.to(
            device=device, dtype=dtype, memory_format=torch.contiguous_format, copy=True
        )
    size = int(np.prod(value.shape)) * dtype.itemsize
    out = torch.from_numpy(np.empty(size, np.uint8)).view(dtype).reshape(value.shape)
    return out.copy_(value)


def zeros(shape: tuple[int, ...], *, device=None, dtype=None) -> torch.Tensor:
    """``torch.zeros(shape)``, on the CPU without writing a byte: the memory comes from
    ``calloc`` (through numpy), whose large blocks are pages the operating system zeroes
    on first touch. A KV cache sized for the whole context is mostly never written, and
    ``torch.zeros`` would write all of it before the first token (0.1 s of a chat's start
    for SmolLM2's 2048 positions). All bits zero is +0.0 in every float format."""
    dtype = dtype or DEFAULT_DTYPE
    if torch.device(device or "cpu").type != "cpu":
        return torch.zeros(shape, device=device, dtype=dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    return torch.from_numpy(np.zeros(size, np.uint8)).view(dtype).reshape(shape)


def asarray(np_array, *, device=None, dtype=None) -> torch.Tensor:
    """A numpy array (or anything ``np.asarray`` accepts) as a new torch tensor on ``device``
    (never sharing the input's memory). Integer and boolean arrays keep their kind (token
    ids, masks); ``dtype`` (default float32) applies to floats; other dtypes (complex) are a
    ``TypeError``: nothing is silently dropped."""
    array = np.asarray(np_array)
    if array.dtype.kind in "biu":
        return torch.as_tensor(array).to(device=device, copy=True)
    if array.dtype.kind != "f":
        raise TypeError(f"the torch levels hold real numbers; cannot convert dtype {array.dtype}")
    return torch.as_tensor(array).to(device=device, dtype=dtype or DEFAULT_DTYPE, copy=True)


def to_numpy(x) -> np.ndarray:
    """A tensor back to numpy (detached, on the CPU). bfloat16, which numpy lacks, comes back as float32."""
    if not isinstance(x, torch.Tensor):
        return np.asarray(x)
    x = x.detach().cpu()  # views, where the tensor is on the CPU already
    return (x.float() if x.dtype == torch.bfloat16 else x).numpy()


def zero_padded(x: torch.Tensor, valid) -> torch.Tensor:
    """``x (B,T,N)``, exactly zero (and of zero gradient) at the padded positions (``valid``
    ``(B,T)`` False)."""
    padded = ~torch.as_tensor(valid, dtype=torch.bool, device=x.device)  # (B,T)
    return x.masked_fill(padded[..., None], 0.0)  # (B,T,N)


def inference():
    """What the generation loops run the model in: without autograd."""
    return torch.no_grad()


def last_position(x: torch.Tensor) -> torch.Tensor:
    """``(B,T,N) -> (B,N)``: each row's last position (a decode step's logits)."""
    return x[:, -1]


def dtype_kind(dtype: torch.dtype) -> str:
    """numpy's one-letter kind of a torch dtype: ``b`` bool, ``i``/``u`` integer, ``f``, ``c``."""
    if dtype == torch.bool:
        return "b"
    if dtype.is_complex:
        return "c"
    if dtype.is_floating_point:
        return "f"
    return "u" if dtype == torch.uint8 else "i"


def fetch(
    params: Mapping[str, object], name: str, shape: tuple[int, ...], *, device=None, dtype=None
) -> nn.Parameter:
    """``params[name]`` as a fresh parameter (a copy: training never writes into ``params``;
    inside ``adopt()``, the value itself where it already fits).

    A missing or mis-shaped entry is a ``ValueError`` naming it; the models
    check the whole dict up front with ``check_params``, the pieces rely on this.
    """
    if name not in params:
        raise ValueError(f"bad parameters: missing: {name}")
    value = torch.as_tensor(params[name])
    if value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"bad parameters: not real numbers: {name} ({value.dtype})")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(
            f"bad parameters: mis-shaped: {name}: expected {tuple(shape)}, got {tuple(value.shape)}"
        )
    target = {"device": device, "dtype": dtype or DEFAULT_DTYPE}
    if value.ndim == 2 and not _ROW_MAJOR.get():
        if _ADOPT.get() and _fits(value, **target) and _in_matvec_layout(value):
            return nn.Parameter(value)  # another model's parameter, laid out already
        return nn.Parameter(matvec_layout(value, **target))
    if _ADOPT.get():  # inside adopt(), `to` returns the value itself where it can
        return nn.Parameter(value.to(**target, memory_format=torch.contiguous_format))
    return nn.Parameter(copied(value, **target))


def _fits(value: torch.Tensor, *, device, dtype) -> bool:
    return value.dtype == dtype and value.device == torch.device(device or "cpu")


def _in_matvec_layout(w: torch.Tensor) -> bool:
    """Whether ``w (out, in)`` is laid out as ``matvec_layout`` lays it out."""
    out, inner = w.shape
    return (w.t() if out >= inner else w).is_contiguous()


def matvec_layout(w: torch.Tensor, *, device=None, dtype=None) -> torch.Tensor:
    """A copy of ``w (out, in)`` on ``device`` in ``dtype``: the same numbers and shape, laid
    out in memory so that a product with one row, ``x (1, in) @ w.T``, streams it in the
    longest contiguous runs.

    A decode step multiplies one row by every weight and reads each weight once,
    so its speed is the rate at which the weights stream from memory. Row-major
    ``(out, in)`` makes that a dot product per output over a row of ``in``
    numbers; column-major (``w.T`` contiguous, ``(in, out)``) makes it ``x_i``
    times row ``i`` of ``w.T``, accumulated over rows of ``out`` numbers. Short
    rows pay loop and reduction overhead per row: for SmolLM2's weights one core
    streamed 10.6 GB/s row-major, 13.1 GB/s column-major, and 15.7 GB/s with
    each matrix in the layout of its longer side (``ladder bench --scenario
    decode``; docs/decoding.md). ``F.linear`` and ``@`` take either layout,
    autograd keeps it for the gradients, and ``state_dict()`` holds ``(out, in)``.
    One copy: the cast and the layout are one ``to`` (``to`` keeps a view's strides).
    """
    out, inner = w.shape
    source = w.t() if out >= inner else w  # the layout's rows: (in, out) for a tall matrix
    copy = copied(source, device=device, dtype=dtype)
    return copy.t() if out >= inner else copy


def linear(
    params: Mapping[str, object],
    prefix: str,
    n_out: int,
    n_in: int,
    *,
    bias: bool,
    device=None,
    dtype=None,
) -> nn.Linear:
    """An ``nn.Linear`` (``x @ W.T + b``) loaded from ``{prefix}weight (n_out, n_in)`` and ``{prefix}bias``."""
    layer = nn.Linear(n_in, n_out, bias=bias, device="meta")  # no throwaway init
    layer.weight = fetch(params, f"{prefix}weight", (n_out, n_in), device=device, dtype=dtype)
    if bias:
        layer.bias = fetch(params, f"{prefix}bias", (n_out,), device=device, dtype=dtype)
    return layer
