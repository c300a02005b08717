"""``attention(q, k, v, *, causal, mask, scale)``: checks on the host, then the Triton kernels.

The kernels (flash_forward.py, flash_backward.py) trust their inputs. This
module does everything that must happen before a launch: the shared shape and
mask checks of ``levels/common/checks.py``, refusing a query row with no
allowed key (the one case where a flash kernel would otherwise divide by zero),
and handing a broadcast mask to the kernel as a stride-0 view instead of a
materialised ``(B, H, T, S)`` copy. ``FlashAttention`` ties forward and
backward together for autograd.
"""

from __future__ import annotations

import math

import torch

from ..common.checks import EMPTY_ROW_MESSAGE
from ..common.semantics import causal_offset, rows_without_keys, window_binds
from ..level2_torch_manual.attention import as_4d, check_inputs
from .flash_backward import flash_backward
from .flash_decode import choose_splits, flash_decode
from .flash_forward import flash_forward
from .tiles import DECODE_MAX_T, Tiles, interpreting

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LN2 = math.log(2.0)  # the kernels keep log-sum-exps in base 2
MAX_HEAD_WIDTH = 256  # wider heads need tiles too large for on-chip memory (tested up to 128)


def check_rows_nonempty(
    mask: torch.Tensor | None, causal: bool, window: int | None, T: int, S: int
) -> None:
    """Raise ``ValueError`` if some query row would have no key it may attend to.

    By position alone (causal, window) a row is empty only at the ends of the
    query range, decided from the shapes (``rows_without_keys``, no data read).
    With a mask, row ``i`` may see the keys ``[lo_i, hi_i)`` of its position
    rule (``key_range``), and is non-empty iff the mask allows one of them: a
    running count of allowed keys along each mask row answers that for every
    row at once, ``count[hi_i] - count[lo_i] > 0``. It is computed on the mask's
    own, un-broadcast shape, so a ``(B, 1, 1, S)`` padding mask costs ``B * (S + T)``
    work, not ``B * H * T * S``. Reading the answer synchronises with the GPU;
    that is the price of a clear error instead of NaN.
    """
    if rows_without_keys(T, S, causal=causal, window=window):
        raise ValueError(EMPTY_ROW_MESSAGE)
    if mask is None:
        return
    m = as_4d(mask)  # (b, h, t, S), each leading size 1 or full
    d = torch.arange(T, device=m.device) + causal_offset(T, S)  # (T,) each query's place
    # Row i's keys [lo_i, hi_i), as semantics.key_range gives them, clamped to [0, S].
    if causal:
        hi = d + 1
    else:
        hi = d + window if window is not None else torch.full_like(d, S)
    lo = d - window + 1 if window is not None else torch.zeros_like(d)
    hi, lo = hi.clamp(0, S), lo.clamp(0, S)  # (T,) each
    zeros = torch.zeros(m.shape[:-1] + (1,), dtype=torch.int32, device=m.device)
    # count[..., j]: how many keys before j the mask allows, (b, h, t, S + 1).
    count = torch.cat([zeros, m.to(torch.int32).cumsum(-1, dtype=torch.int32)], dim=-1)
    if count.shape[2] == 1:  # one mask row serves every query: read it at each row's bounds
        seen = count[..., hi] - count[..., lo]  # (b, h, 1, T)
    else:  # row i of the mask, at row i's bounds
        b, h, t, _ = count.shape
        at = lambda x: x.view(1, 1, t, 1).expand(b, h, t, 1)  # noqa: E731
        seen = count.gather(-1, at(hi)) - count.gather(-1, at(lo))  # (b, h, T, 1)
    if not bool((seen > 0).all()):
        raise ValueError(EMPTY_ROW_MESSAGE)


class FlashAttention(torch.autograd.Function):
    """Autograd glue: ``(out, lse)``; the forward saves q, k, v, the output and the row
    log-sum-exp, and the backward takes the gradients of both outputs."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal: bool, scale: float, window, tiles: Tiles | None):
        out, lse = flash_forward(q, k, v, mask, causal, scale, window, tiles)  # lse (B*H, T) base 2
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.causal, ctx.scale, ctx.window, ctx.tiles = causal, scale, window, tiles
        ctx.set_materialize_grads(False)  # an unused lse arrives as None, not zeros
        B, H, T = q.shape[:3]
        return out, (lse * LN2).view(B, H, T)  # natural log: log x = log2 x * ln 2

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, out, lse, mask = ctx.saved_tensors
        if d_out is None:
            d_out = torch.zeros_like(out)
        # ctx.tiles is the caller's pin; None lets the backward pick (or tune) its own tiles.
        dq, dk, dv = flash_backward(
            d_out, q, k, v, out, lse, mask, ctx.causal, ctx.scale, ctx.window, d_lse, ctx.tiles
        )
        return dq, dk, dv, None, None, None, None, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    window: int | None = None,
    return_lse: bool = False,
    tiles: Tiles | None = None,
    splits: int | None = None,
):
    """Fused attention: ``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)`` -> ``(B,H,T,Dv)``.

    Query head ``h`` reads key/value head ``h // (H // Hkv)``. ``mask`` is
    boolean, True = may attend, broadcastable to ``(B,H,T,S)``; ``causal`` is
    bottom-right aligned (query ``i`` sees key ``j`` iff ``j <= i + S - T``);
    ``window`` keeps the ``W`` latest keys (causal) or the band
    ``|j - (i + S - T)| < W``; ``scale`` defaults to ``1/sqrt(Dh)``.
    ``return_lse`` also returns ``lse (B,H,T)`` fp32 (natural log). Differentiable
    in q, k and v (through both outputs). ``tiles`` pins the tile sizes (tests;
    default: autotuned on a GPU, fixed under the interpreter).

    A decode step (``T <= 16`` queries) without gradients runs flash-decoding
    (flash_decode.py) when ``choose_splits`` finds the GPU would be under-filled:
    the keys in slices, one program each, merged by their log-sum-exps.
    ``splits`` overrides that choice (1: the plain forward kernel).
    """
    T, S = check_inputs(q, k, v, mask, scale=scale, window=window)[2:4]
    check_kernel_inputs(q, k, v)
    if splits is not None and (
        isinstance(splits, bool) or not isinstance(splits, int) or splits < 1
    ):
        raise ValueError(f"splits must be a positive integer (or None), got {splits!r}")
    if window is not None and not window_binds(T, S, causal=causal, window=window):
        window = None  # a window wider than the sequence binds nothing: its rows are causal's
    check_rows_nonempty(None if mask is None else key_wide(mask, q.device, S), causal, window, T, S)
    return attend(q, k, v, causal=causal, mask=mask, scale=scale, window=window,
                  return_lse=return_lse, tiles=tiles, splits=splits)  # fmt: skip


def check_kernel_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """What these kernels can run: q, k, v of one supported dtype, heads up to
    ``MAX_HEAD_WIDTH``, on one device of the kind Triton runs on here (a GPU, or the CPU
    under the interpreter, without bfloat16). Plain comparisons, no device work: ``attend``
    runs them too, since a model's dtype and device are its user's choice."""
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"level 4 kernels take q, k, v of one dtype among float32, float16, bfloat16; "
            f"got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    Dh, Dv = q.shape[-1], v.shape[-1]
    if max(Dh, Dv) > MAX_HEAD_WIDTH:
        raise ValueError(f"head widths up to {MAX_HEAD_WIDTH} are supported; got Dh={Dh}, Dv={Dv}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v live on different devices: {q.device}, {k.device}, {v.device}")
    if (q.device.type == "cuda") == interpreting():
        where = "CPU tensors (TRITON_INTERPRET=1)" if interpreting() else "CUDA tensors"
        raise ValueError(f"the Triton kernels here run on {where}; got tensors on {q.device}")
    if interpreting() and q.dtype == torch.bfloat16:
        raise TypeError(
            "bfloat16 is not emulated correctly by Triton's interpreter (its numpy "
            "arithmetic has no bfloat16), so level 4 refuses it on the CPU; use float32 or float16"
        )


def key_wide(mask: torch.Tensor, device: torch.device, S: int) -> torch.Tensor:
    """A mask broadcastable to ``(B,H,T,S)`` as a 4-D view on ``device`` whose last axis is
    ``S`` wide (a ``(T, 1)`` mask, a scalar True broadcast along the keys too: stride 0),
    since the checks and the kernel index it by key."""
    mask = as_4d(mask.to(device))
    return mask.expand(*mask.shape[:-1], S)


# fmt: off
def attend(q, k, v, *, causal=False, mask=None, scale=None, window=None, return_lse=False,
           tiles=None, splits=None):  # the arguments of ``attention``, which types them
    # fmt: on
    """``attention`` on inputs it would accept, without its checks of them: the core the
    models call (level 2's ``attend`` says what their edge has checked). What the kernels
    can run is still checked (``check_kernel_inputs``)."""
    check_kernel_inputs(q, k, v)
    B, H, T, Dh = q.shape
    S = k.shape[2]
    if window is not None and not window_binds(T, S, causal=causal, window=window):
        window = None  # a window wider than the sequence changes nothing: no bound to apply
    if mask is not None:
        mask = key_wide(mask, q.device, S).expand(B, H, T, S)  # a view: stride 0 where broadcast
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    needs_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    if T <= DECODE_MAX_T and not needs_grad:
        if splits is None:
            splits = choose_splits(S, B * H, q.device)
        if splits > 1:
            out, lse = flash_decode(q, k, v, mask, bool(causal), scale, window, splits)
            return (out, (lse * LN2).view(B, H, T)) if return_lse else out
    out, lse = FlashAttention.apply(q, k, v, mask, bool(causal), scale, window, tiles)
    return (out, lse) if return_lse else out
