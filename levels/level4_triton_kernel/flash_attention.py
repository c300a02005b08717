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

from ..common.checks import EMPTY_ROW_MESSAGE, causal_offset, check_scale
from ..level2_torch_manual.attention import as_4d, check_inputs
from .flash_backward import flash_backward
from .flash_forward import flash_forward
from .tiles import Tiles, interpreting

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_WIDTH = 256  # wider heads need tiles too large for on-chip memory (tested up to 128)


def check_rows_nonempty(mask: torch.Tensor | None, causal: bool, T: int, S: int) -> None:
    """Raise ``ValueError`` if some query row would have no key it may attend to.

    Causal alone: row ``i`` sees keys ``0 .. i + S - T``, so every row is
    non-empty iff ``T <= S`` (decided from the shapes, no data read).
    With a mask, row ``i`` is non-empty iff its *first* allowed key ``f_i``
    exists and (when causal) ``f_i <= i + S - T``. ``f_i`` is computed on the
    mask's own, un-broadcast shape, so a ``(B, 1, 1, S)`` padding mask costs
    ``B * S`` work, not ``B * H * T * S``. Reading the answer synchronises
    with the GPU; that is the price of a clear error instead of NaN.
    """
    if causal and T > S:
        raise ValueError(EMPTY_ROW_MESSAGE)
    if mask is None:
        return
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (b, h, t, s), each 1 or full
    has_key = m.any(-1)  # (b, h, t)
    if causal:
        # argmax returns the first maximal index: the first True key of each row.
        first = m.to(torch.uint8).argmax(-1)  # (b, h, t)
        # The tightest row is the earliest; when t == 1 the mask row serves every query,
        # so only query 0 (bound S - T) needs checking.
        bound = torch.arange(m.shape[2], device=m.device) + causal_offset(T, S)  # (t,)
        has_key = has_key & (first <= bound)
    if not bool(has_key.all()):
        raise ValueError(EMPTY_ROW_MESSAGE)


class FlashAttention(torch.autograd.Function):
    """Autograd glue: the forward saves q, k, v, the output and the row log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal: bool, scale: float, tiles: Tiles | None):
        out, lse = flash_forward(q, k, v, mask, causal, scale, tiles)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.causal, ctx.scale, ctx.tiles = causal, scale, tiles
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse, mask = ctx.saved_tensors
        # ctx.tiles is the caller's pin; None lets the backward pick (or tune) its own tiles.
        dq, dk, dv = flash_backward(
            d_out, q, k, v, out, lse, mask, ctx.causal, ctx.scale, ctx.tiles
        )
        return dq, dk, dv, None, None, None, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """Fused attention: ``q (B,H,T,Dh)``, ``k (B,H,S,Dh)``, ``v (B,H,S,Dv)`` -> ``(B,H,T,Dv)``.

    ``mask`` is boolean, True = may attend, broadcastable to ``(B,H,T,S)``;
    ``causal`` is bottom-right aligned (query ``i`` sees key ``j`` iff
    ``j <= i + S - T``); ``scale`` defaults to ``1/sqrt(Dh)``. Differentiable
    in q, k and v. ``tiles`` pins the tile sizes (tests; default: autotuned on
    a GPU, fixed under the interpreter).
    """
    B, H, T, S, Dh, Dv = check_inputs(q, k, v, mask)
    check_scale(scale)
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"level 4 kernels take q, k, v of one dtype among float32, float16, bfloat16; "
            f"got {q.dtype}, {k.dtype}, {v.dtype}"
        )
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
    if mask is not None:
        mask = as_4d(mask.to(q.device))
    check_rows_nonempty(mask, causal, T, S)
    if mask is not None:
        mask = mask.expand(B, H, T, S)  # a view: stride 0 on every broadcast dimension
    scale = 1.0 / math.sqrt(Dh) if scale is None else float(scale)
    return FlashAttention.apply(q, k, v, mask, bool(causal), scale, tiles)
