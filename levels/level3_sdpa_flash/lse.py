"""Attention and its log-sum-exp, from the fused kernel SDPA runs on a CPU.

``F.scaled_dot_product_attention`` returns only the output. The fused CPU
kernel behind it (``aten::_scaled_dot_product_flash_attention_for_cpu``, the
"flash" backend) computes each row's log-sum-exp anyway, for its backward, and
returns it; this module calls that kernel directly and ties it to autograd,
so that ``attention(..., return_lse=True)`` is as fused as plain attention and
differentiable in both outputs. The kernel is private to PyTorch, with no
public equivalent in torch 2.13: it is reached only through ``private.py``,
which says why and what that costs.

The backward
------------
With ``s = scale q k^T``, ``p = softmax(s)``, ``o = p v``, ``lse = log sum_j exp(s_j)``,
upstream gradients ``g = dL/do`` and ``e = dL/dlse``, and ``d lse / d s = p``:

    ds = p * (g v^T - rowsum(g * o))  +  p * e

The kernel's own backward (``..._for_cpu_backward``) computes the first term
and the gradients it implies. The second term adds, with ``p e`` as the
score gradient,

    dq += scale * e * (p k)       p k is attention with the keys as values: one more forward
    dk += scale * p^T (e q)       p^T x is the value gradient of a backward fed x

both again the fused kernel, so nothing of size ``T x S`` is ever stored.

Elsewhere (CUDA, say, where the corresponding kernels are private and differ
per backend) ``attention.py`` runs level 2's written-out attention for
``return_lse``: the same function, with its ``(B, H, T, S)`` memory.

The mask is plain attention's (``attention.sdpa_mask``): none where none
binds, and the kernel's own causal rule when ``T == S``, so the tiles above
the diagonal are skipped rather than computed and masked (a third of the time
of a materialised mask at ``T = S = 4096``: the appendix's measurements).

Grouped-query heads are repeated for the kernel (``repeat_heads``), and their
gradients summed back over each group. The kernel wants one head width for
q, k and v: when ``Dv != Dh`` the narrower ones are padded with zero columns
(which add nothing to a dot product, and come out as zero columns of the
output) and cut off again.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

from ..common.semantics import group_size
from ..level2_torch_manual.attention import causal_mask, repeat_heads
from .private import flash_cpu_backward, flash_cpu_forward


def _sum_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """``(B, H, S, N) -> (B, H // group, S, N)``: a shared head's gradient is its group's sum."""
    B, H, S, N = x.shape
    return x if group == 1 else x.reshape(B, H // group, group, S, N).sum(dim=2)


class FusedAttentionWithLSE(torch.autograd.Function):
    """``(out, lse)`` from the fused CPU kernel; see the module docstring for the backward."""

    @staticmethod
    def forward(ctx, q, k, v, bias, is_causal: bool, scale: float, group: int):
        # bias: an additive (0 / -inf) float mask broadcastable to (B,H,T,S), or None;
        # is_causal: the kernel's own (top-left) causal rule, which skips masked tiles.
        Dh, Dv = q.shape[-1], v.shape[-1]
        width = max(Dh, Dv)  # one head width for the kernel: zero columns pad the others
        q, k, v = (F.pad(x, (0, width - x.shape[-1])) for x in (q, k, v))
        k, v = repeat_heads(k, group), repeat_heads(v, group)  # (B,H,S,width)
        out, lse = flash_cpu_forward(q, k, v, is_causal=is_causal, attn_mask=bias, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, bias)
        ctx.is_causal, ctx.scale, ctx.group, ctx.widths = is_causal, scale, group, (Dh, Dv)
        return out[..., :Dv], lse  # (B,H,T,Dv), (B,H,T) float32 (float64 for float64 inputs)

    @staticmethod
    def backward(ctx, g, e):
        q, k, v, out, lse, bias = ctx.saved_tensors
        causal, scale, group = ctx.is_causal, ctx.scale, ctx.group
        Dh, Dv = ctx.widths
        kw = {"is_causal": causal, "attn_mask": bias, "scale": scale}
        g = torch.zeros_like(out) if g is None else F.pad(g, (0, out.shape[-1] - Dv))
        dq, dk, dv = flash_cpu_backward(g.contiguous(), q, k, v, out, lse, **kw)
        if e is not None:
            e = e.to(q.dtype)[..., None]  # (B,H,T,1)
            pk, _ = flash_cpu_forward(q, k, k, **kw)  # p k: (B,H,T,Dh)
            dq = dq + scale * e * pk
            # A backward fed x = e q as the output gradient returns p^T x as its value gradient.
            eq = (e * q).contiguous()
            _, _, ptq = flash_cpu_backward(eq, q, k, k, torch.zeros_like(q), lse, **kw)
            dk = dk + scale * ptq
        dk, dv = _sum_groups(dk, group), _sum_groups(dv, group)
        return dq[..., :Dh], dk[..., :Dh], dv[..., :Dv], None, None, None, None


def _is_causal_bias(attn_mask) -> bool:
    """Whether ``attn_mask`` is the lower-right ``CausalBias`` ``sdpa_mask`` returns for
    ``1 < T < S``. Its module is imported only where that case arises (it imports
    ``torch._dynamo``): until then no mask can be one."""
    bias = sys.modules.get("torch.nn.attention.bias")
    return bias is not None and isinstance(attn_mask, bias.CausalBias)


def attention_with_lse(q, k, v, attn_mask, is_causal: bool, *, scale):
    """``(out (B,H,T,Dv), lse (B,H,T))`` on the CPU, from SDPA's ``(attn_mask, is_causal)``
    for these inputs (``attention.sdpa_mask``: checked, no empty row): the kernel's own
    causal rule when ``T == S``, which skips the tiles above the diagonal."""
    if _is_causal_bias(attn_mask):  # 1 < T < S: bottom-right, spelled out for the kernel
        attn_mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device)  # (T, S)
    bias = None
    if attn_mask is not None:
        # The kernel takes an additive float mask of q's dtype: 0 where allowed, -inf not
        # (no row is all -inf: empty rows were refused).
        bias = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill(~attn_mask, float("-inf"))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    group = group_size(q.shape, k.shape)
    return FusedAttentionWithLSE.apply(q, k, v, bias, is_causal, scale, group)
