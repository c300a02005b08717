"""The private PyTorch APIs level 3 uses: the one place, why each, and what it costs.

Level 3's rung is one public call, ``F.scaled_dot_product_attention``. Three things
the ladder asks of it have no public API in torch 2.13, and each is reached here
and nowhere else in the level:

* **The log-sum-exp of each row** (``attention(..., return_lse=True)``, which
  ``merge_attention`` and ring attention build on). SDPA returns only the
  output. The fused CPU kernel behind its "flash" backend computes the
  log-sum-exp for its own backward and returns it:
  ``aten::_scaled_dot_product_flash_attention_for_cpu`` and its ``_backward``
  (``lse.py`` ties the two to autograd). The public ways to a log-sum-exp
  do not fit: ``torch.nn.attention.flex_attention(..., return_aux=AuxRequest(lse=True))``
  is, without ``torch.compile``, an unfused implementation that materialises
  the ``(T, S)`` scores (torch warns so), and compiled it needs Inductor and a
  C++ compiler on the CPU; ``torch.nn.attention.varlen.varlen_attn`` runs on
  CUDA only. Level 2's written-out attention gives the same ``(out, lse)``
  with the ``(B, H, T, S)`` matrix in memory.

  What it costs: a private op carries no promise. A release may rename it,
  reorder its arguments or change what it returns; then ``return_lse`` at
  level 3 on the CPU fails, with the one-line ``RuntimeError`` below when the
  op is gone, and the level-3 tests of ``return_lse`` (values and gradients
  against level 2 and the float64 reference) catch a changed meaning. Plain
  attention, which never calls it, is unaffected.

* **SDPA's backend priority order** (``which_backend``, which tries the
  backends in the order the dispatcher does). ``sdpa_kernel(...,
  set_priority=True)`` sets the order publicly; only
  ``torch._C._get_sdp_priority_order`` reads it. Without it ``priority_order``
  returns PyTorch's default order (what torch 2.13 reports until a caller
  changes it: flash, efficient, math, cudnn): ``which_backend`` keeps working,
  and can be wrong only inside a ``set_priority=True`` block.

* **oneDNN's product with weights reordered beforehand** (``weights="blocked"``,
  ``blocked.py``: a server's decode step of a few rows). ``F.linear`` on a CPU is a
  BLAS GEMM; ``torch.ops.mkldnn._reorder_linear_weight`` lays a float32 matrix out
  once in oneDNN's blocked format for a given number of rows, and
  ``torch.ops.mkldnn._linear_pointwise`` multiplies by it: the pair Inductor emits
  for a frozen float32 ``nn.Linear``. The public route, ``torch.utils.mkldnn.to_mkldnn``,
  converts the activations at every call and takes no number of rows, and measured
  slower than ``F.linear`` (blocked.py gives the figures).

  What it costs: the same lack of promise. Without the ops (or without oneDNN),
  ``blocked_missing()`` says so in a line and ``weights="blocked"`` is refused
  with it; float weights are unaffected. The level-3 tests of ``"blocked"``
  compare its products and a model's logits with ``F.linear``'s.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

FLASH_CPU_FORWARD = "_scaled_dot_product_flash_attention_for_cpu"
FLASH_CPU_BACKWARD = "_scaled_dot_product_flash_attention_for_cpu_backward"
# PyTorch's default priority order, as torch 2.13 reports it before anyone sets one.
DEFAULT_ORDER = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
    SDPBackend.CUDNN_ATTENTION,
)


def _aten(name: str):
    """``torch.ops.aten.<name>``, or a one-line ``RuntimeError`` saying what is missing."""
    op = getattr(torch.ops.aten, name, None)
    if op is None:
        raise RuntimeError(
            f"level 3's return_lse needs torch's private aten::{name}, which torch "
            f"{torch.__version__} does not have; level 2's attention(..., return_lse=True) "
            "gives the same result (with the score matrix in memory)"
        )
    return op


def flash_cpu_forward(q, k, v, *, is_causal: bool, attn_mask, scale: float):
    """``(out (B,H,T,D), lse (B,H,T))`` of the fused CPU kernel, without dropout.

    ``q, k, v (B,H,·,D)``: one head count and one head width; ``attn_mask`` an
    additive float mask of q's dtype broadcastable to ``(B,H,T,S)``, or None;
    ``is_causal`` the kernel's own top-left rule, which skips masked tiles."""
    forward = _aten(FLASH_CPU_FORWARD)
    out, lse = forward(q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale)[:2]
    return out, lse  # 0.0: no dropout


def flash_cpu_backward(g, q, k, v, out, lse, *, is_causal: bool, attn_mask, scale: float):
    """``(dq, dk, dv)`` of the fused CPU kernel for the output gradient ``g (B,H,T,D)``,
    from the forward's ``out`` and ``lse`` (the same arguments as its forward)."""
    backward = _aten(FLASH_CPU_BACKWARD)
    return backward(g, q, k, v, out, lse, 0.0, is_causal, attn_mask=attn_mask, scale=scale)


def priority_order() -> list[SDPBackend]:
    """The backends in the order SDPA tries them now (``DEFAULT_ORDER`` where torch
    cannot say; see the module docstring)."""
    read = getattr(torch._C, "_get_sdp_priority_order", None)
    if read is None:
        return list(DEFAULT_ORDER)
    try:
        return [SDPBackend(i) for i in read()]
    except (TypeError, ValueError):  # a changed return value: the documented default
        return list(DEFAULT_ORDER)


def blocked_missing() -> str | None:
    """Why oneDNN's reordered float32 product cannot run here, or None when it can."""
    if not torch.backends.mkldnn.is_available():
        return f"torch {torch.__version__} was built without oneDNN (mkldnn)"
    for name in ("_reorder_linear_weight", "_linear_pointwise"):
        if not hasattr(torch.ops.mkldnn, name):
            return f"torch {torch.__version__} has no private mkldnn::{name}"
    return None


def blocked_reorder(w: torch.Tensor, rows: int) -> torch.Tensor:
    """``w (out, in)`` float32 reordered into oneDNN's blocked layout for products of
    about ``rows`` rows: an opaque tensor that only ``blocked_linear`` reads."""
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), rows)


def blocked_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None):
    """``x (..., in) @ w.T + bias`` -> ``(..., out)`` from ``blocked_reorder``'s ``w``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
