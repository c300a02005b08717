"""Fused LayerNorm and RMSNorm: one Triton kernel for the forward, one for the backward.

Motivation
----------
Written with torch ops, ``(x - mean) / sqrt(var + eps) * w + b`` launches about
six kernels, each reading and writing an ``(N, D)`` tensor: roughly 12 N D
element moves for a result that needs two (read x, write y). The fused kernel
reads a row once, keeps it in registers, and writes it once, so it runs at
memory bandwidth. It also saves the row's mean and 1/std (two fp32 numbers per
row) so the backward does not recompute the statistics.

The backward formula
--------------------
For one row ``x`` of width D, with ``mu = mean(x)``,
``var = mean((x - mu)^2)``, ``r = 1 / sqrt(var + eps)``,
``xhat = (x - mu) r`` and ``y = w * xhat + b``. Write ``g = dL/dy * w``
(= dL/dxhat). Differentiating:

    d mu / d x_i   = 1/D
    d var / d x_i  = 2 (x_i - mu) / D         (the mu-term sums to zero)
    d r / d x_i    = -r^3 (x_i - mu) / D
    d xhat_j / d x_i = r (delta_ij - 1/D) - (x_j - mu) r^3 (x_i - mu) / D
                     = r (delta_ij - 1/D - xhat_j xhat_i / D)

so

    dL/dx_i = sum_j g_j d xhat_j / d x_i
            = r (g_i - mean(g) - xhat_i * mean(g * xhat))

and, summing over every row n of the batch,

    dL/dw = sum_n dL/dy_n * xhat_n        dL/db = sum_n dL/dy_n

Work split
----------
Each row is normalised by one program that holds the whole row in registers
(``BLOCK_D`` = D padded to a power of two). Rows narrower than about 4096
elements are grouped, ``ROWS`` of them per program as a ``(ROWS, BLOCK_D)``
tile with every reduction along the row: a model of width 64 would otherwise
launch one tiny program per token, which wastes a GPU's schedulers and costs
milliseconds per program in the interpreter. At D >= 4096, ROWS = 1: one row
per program, the textbook layout.

dx is computed row by row in the same way. dw and db are sums over all N rows.
Rather than atomics or locks, backward program ``p`` walks a fixed set of row
groups (``p, p + G, p + 2G, ...``), accumulates its partial dw and db in fp32
registers and writes them to a ``(G, D)`` buffer; the G partial sums are added
on the host with one ``sum(0)``. The result is deterministic and the extra
traffic is ``G x D``, small next to ``N x D``.

RMSNorm
-------
RMSNorm (Llama, Mistral, Qwen2) is LayerNorm without the centring and the
bias: ``r = 1 / sqrt(mean(x^2) + eps)``, ``xhat = x r``, ``y = w * xhat``. The
same derivation without the ``mu`` terms gives

    dL/dx_i = r (g_i - xhat_i * mean(g * xhat))

so both norms are the same two kernels, with ``IS_RMS`` (a compile-time
constant) dropping the mean in the forward and the ``mean(g)`` term in the
backward.

Numerics: statistics in fp32 whatever the input dtype; the variance is the
two-pass ``mean((x - mu)^2)`` on the row held in registers, which avoids the
cancellation of ``mean(x^2) - mu^2`` when ``|mu|`` is large next to the spread.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_FUSED_BYTES = 65536  # one row must fit in a program's registers / shared memory
ROW_TILE_ELEMENTS = 4096  # narrow rows are grouped so a program holds about this many elements
BACKWARD_PROGRAMS = 128  # G: partial-sum rows for dw and db


@triton.jit(do_not_specialize=["N"])
def _layer_norm_fwd_kernel(
    X,  # (N, D) input rows, contiguous
    Y,  # (N, D) output, contiguous
    W,  # (D,) weight
    Bias,  # (D,) bias; a dummy pointer unless HAS_BIAS
    Mean,  # (N,) fp32 out: row means, saved for the backward
    Rstd,  # (N,) fp32 out: row 1 / sqrt(var + eps), saved for the backward
    N,  # number of rows
    D,  # row width
    eps,  # added to the variance
    HAS_BIAS: tl.constexpr,  # add Bias (config.bias)
    IS_RMS: tl.constexpr,  # RMSNorm: no centring (Mean stores 0)
    ROWS: tl.constexpr,  # rows per program: 1 for wide rows, more for narrow ones
    BLOCK_D: tl.constexpr,  # D padded to a power of two: whole rows in one tile
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # (ROWS,)
    cols = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    col_ok = cols < D
    ok = (rows < N)[:, None] & col_ok[None, :]  # (ROWS, BLOCK_D)
    offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
    x = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)  # (ROWS, BLOCK_D)
    if IS_RMS:
        mean = tl.zeros([ROWS], dtype=tl.float32)  # RMSNorm does not centre
    else:
        mean = tl.sum(x, 1) / D  # (ROWS,)
    xc = tl.where(ok, x - mean[:, None], 0.0)  # padded columns must not add (0 - mean)^2
    var = tl.sum(xc * xc, 1) / D  # (ROWS,)
    rstd = 1.0 / tl.sqrt(var + eps)  # (ROWS,)
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        y += tl.load(Bias + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=ok)
    tl.store(Mean + rows, mean, mask=rows < N)
    tl.store(Rstd + rows, rstd, mask=rows < N)


@triton.jit(do_not_specialize=["N"])
def _layer_norm_bwd_kernel(
    X,  # (N, D) forward input
    dY,  # (N, D) incoming gradient, contiguous
    W,  # (D,) weight
    Mean,  # (N,) fp32 saved row means
    Rstd,  # (N,) fp32 saved row 1/std
    dX,  # (N, D) out
    dW_partial,  # (G, D) fp32 out: this program's share of dL/dw
    dB_partial,  # (G, D) fp32 out: this program's share of dL/db (written only if HAS_BIAS)
    N,  # number of rows
    D,  # row width
    G,  # number of programs; program p takes row groups p, p + G, p + 2G, ...
    HAS_BIAS: tl.constexpr,
    IS_RMS: tl.constexpr,  # RMSNorm: no mean(g) term
    ROWS: tl.constexpr,  # rows per group, as in the forward
    BLOCK_D: tl.constexpr,  # D padded to a power of two
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]  # (1, BLOCK_D)
    dw = tl.zeros([BLOCK_D], dtype=tl.float32)
    db = tl.zeros([BLOCK_D], dtype=tl.float32)
    for group in range(pid, tl.cdiv(N, ROWS), G):
        rows = group * ROWS + tl.arange(0, ROWS)  # (ROWS,)
        ok = (rows < N)[:, None] & col_ok[None, :]  # (ROWS, BLOCK_D)
        offs = rows.to(tl.int64)[:, None] * D + cols[None, :]
        x = tl.load(X + offs, mask=ok, other=0.0).to(tl.float32)
        dy = tl.load(dY + offs, mask=ok, other=0.0).to(tl.float32)
        mean = tl.load(Mean + rows, mask=rows < N, other=0.0)[:, None]  # (ROWS, 1)
        rstd = tl.load(Rstd + rows, mask=rows < N, other=0.0)[:, None]  # (ROWS, 1)
        xhat = tl.where(ok, (x - mean) * rstd, 0.0)  # (ROWS, BLOCK_D)
        g = dy * w  # dL/dxhat; 0 on padding since dy loads as 0 there
        # dx = r (g - mean(g) - xhat * mean(g * xhat)), derived in the module docstring
        # (RMSNorm: without mean(g), since nothing was centred).
        mean_gx = tl.sum(g * xhat, 1)[:, None] / D  # (ROWS, 1)
        if IS_RMS:
            dx = (g - xhat * mean_gx) * rstd
        else:
            dx = (g - tl.sum(g, 1)[:, None] / D - xhat * mean_gx) * rstd
        tl.store(dX + offs, dx.to(dX.dtype.element_ty), mask=ok)
        dw += tl.sum(dy * xhat, 0)
        db += tl.sum(dy, 0)
    tl.store(dW_partial + pid * D + cols, dw, mask=col_ok)
    if HAS_BIAS:
        tl.store(dB_partial + pid * D + cols, db, mask=col_ok)


def _row_block(D: int, element_size: int) -> tuple[int, int]:
    """``(ROWS, BLOCK_D)``: the padded row width and how many rows share a program."""
    block = triton.next_power_of_2(D)
    if block * element_size > MAX_FUSED_BYTES:
        raise ValueError(
            f"the fused LayerNorm keeps a whole row on chip; D={D} is over "
            f"{MAX_FUSED_BYTES // element_size} elements"
        )
    return max(1, min(16, ROW_TILE_ELEMENTS // block)), block


def norm_forward_arguments(x2, y, weight, bias, mean, rstd, eps: float, rms: bool):
    """The forward kernel's runtime arguments and constants: ``x2``, ``y (N, D)``
    contiguous, ``weight``, ``bias (D,)`` (bias None: no bias), ``mean``, ``rstd (N,)``
    fp32. Shared by ``FusedLayerNorm`` and the compile check (ladder/check/matrix.py)."""
    N, D = x2.shape
    rows, block = _row_block(D, x2.element_size())
    args = (x2, y, weight, bias if bias is not None else weight, mean, rstd, N, D, eps)
    return args, dict(HAS_BIAS=bias is not None, IS_RMS=rms, ROWS=rows, BLOCK_D=block)


def norm_backward_arguments(x2, dy2, weight, mean, rstd, dx, dw_partial, db_partial, has_bias, rms):
    """The backward kernel's runtime arguments and constants: ``x2``, ``dy2``, ``dx (N, D)``,
    ``dw_partial``, ``db_partial (G, D)`` fp32, one row of partial sums per program."""
    N, D = x2.shape
    rows, block = _row_block(D, x2.element_size())
    args = (x2, dy2, weight, mean, rstd, dx, dw_partial, db_partial, N, D, dw_partial.shape[0])
    return args, dict(HAS_BIAS=has_bias, IS_RMS=rms, ROWS=rows, BLOCK_D=block)


def backward_programs(N: int, D: int, element_size: int) -> int:
    """G: how many backward programs (and rows of dw, db partial sums) for ``N`` rows."""
    rows, _ = _row_block(D, element_size)
    return max(1, min(BACKWARD_PROGRAMS, triton.cdiv(N, rows)))


class FusedLayerNorm(torch.autograd.Function):
    """Autograd glue for the two kernels; ``bias`` may be None (config.bias = False);
    ``rms`` selects RMSNorm (no centring, no bias)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, rms: bool):
        D = x.shape[-1]
        x2 = x.reshape(-1, D).contiguous()  # (N, D)
        N = x2.shape[0]
        y = torch.empty_like(x2)  # (N, D)
        mean = torch.empty(N, device=x.device, dtype=torch.float32)  # (N,)
        rstd = torch.empty(N, device=x.device, dtype=torch.float32)  # (N,)
        args, constants = norm_forward_arguments(x2, y, weight, bias, mean, rstd, eps, rms)
        _layer_norm_fwd_kernel[(triton.cdiv(N, constants["ROWS"]),)](*args, **constants)
        ctx.save_for_backward(x2, weight, bias, mean, rstd)
        ctx.rms = rms
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, bias, mean, rstd = ctx.saved_tensors
        N, D = x2.shape
        dy2 = dy.reshape(N, D).contiguous()  # (N, D)
        dx = torch.empty_like(x2)
        G = backward_programs(N, D, x2.element_size())
        dw_partial = torch.empty((G, D), device=x2.device, dtype=torch.float32)  # (G, D)
        db_partial = torch.empty_like(dw_partial) if bias is not None else dw_partial
        args, constants = norm_backward_arguments(
            x2, dy2, weight, mean, rstd, dx, dw_partial, db_partial, bias is not None, ctx.rms
        )
        _layer_norm_bwd_kernel[(G,)](*args, **constants)
        dw = dw_partial.sum(0).to(weight.dtype)  # (D,)
        db = db_partial.sum(0).to(bias.dtype) if bias is not None else None
        return dx.view(dy.shape), dw, db, None, None


def _check_widths(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if weight.shape != (x.shape[-1],) or (bias is not None and bias.shape != weight.shape):
        raise ValueError(
            f"a norm over width {x.shape[-1]} needs weight and bias of shape "
            f"({x.shape[-1]},); got {tuple(weight.shape)}, "
            f"{None if bias is None else tuple(bias.shape)}"
        )


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last dim: ``(..., D) -> (..., D)``."""
    _check_widths(x, weight, bias)
    return FusedLayerNorm.apply(x, weight, bias, float(eps), False)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim: ``(..., D) -> (..., D)``."""
    _check_widths(x, weight, None)
    return FusedLayerNorm.apply(x, weight, None, float(eps), True)
