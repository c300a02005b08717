"""Paged decoding: a decode step's attention read through the block table.

Why
---
A server keeps its requests' keys and values in blocks of one pool, a table per
request saying which blocks hold its positions (the paged cache,
levels/level2_torch_manual/paged.py). Levels 2 and 3 gather each row's blocks into
one ``(B, Hkv, S, Dh)`` tensor per layer and step and attend over that: a copy of
the whole cache, every layer, every step, and padding up to the longest row. This
kernel reads the blocks where they lie.

How
---
One program per (row, query head), one query (the step's new token, at position
``count - 1``). It walks the row's table: block ``j`` holds positions ``[j * BS,
(j + 1) * BS)``; the program loads its keys ``(BS, Dh)`` from the pool, scores them
against the query and folds them into the online softmax of the flash kernel
(flash_forward.py: running maximum ``m``, sum ``l``, output ``acc``, base 2). The
row's ``count`` bounds its keys, so a short row reads only its own blocks and
nothing is padded or masked: a position at or past ``count`` in the last block is
set to ``-inf``. A sliding window ``W`` starts the walk at the block holding
position ``count - W`` and hides the positions before it. Causality needs nothing:
every cached key is at or before the query.

The query is a vector, so the scores are a broadcast product summed along ``Dh``,
not a ``tl.dot`` (whose tiles need 16 rows): a decode step is bound by reading the
keys, which this reads once per query head (a grouped-query head's group reads its
keys once each).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .flash_forward import LOG2E
from .tiles import head_block

PAGED_WARPS = 4  # one block of keys per iteration: small tiles, few warps


@triton.jit(do_not_specialize=["WINDOW"])
def _paged_decode_kernel(
    Q,  # (B, H, Dh): the step's one query per row and head
    K, V,  # (N, Hkv, BS, Dh): the layer's pool of blocks
    Tables,  # (B, M) int32: each row's blocks, in position order
    Counts,  # (B,) int32: each row's keys, the new one included
    Out,  # (B, H, Dh) in q's dtype
    stride_qb, stride_qh, stride_qd,
    stride_kn, stride_kh, stride_ks, stride_kd,
    stride_vn, stride_vh, stride_vs, stride_vd,
    stride_tb, stride_ob, stride_oh, stride_od,
    H, GROUP, DH, WINDOW, qk_scale,
    HAS_WINDOW: tl.constexpr, BLOCK_DH: tl.constexpr, BS: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    hkv = h // GROUP
    offs_d = tl.arange(0, BLOCK_DH)
    offs_s = tl.arange(0, BS)
    in_head = offs_d < DH  # Dh padded up to BLOCK_DH: the padding loads as 0
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_d * stride_qd, mask=in_head, other=0.0)
    q = q.to(tl.float32)
    count = tl.load(Counts + b)
    first = 0  # the first position the query sees: count - W under a window
    if HAS_WINDOW:
        first = tl.maximum(count - WINDOW, 0)
    k_base = K + hkv * stride_kh
    v_base = V + hkv * stride_vh
    m_i = tl.max(tl.full([BS], float("-inf"), tl.float32), axis=0)  # a scalar -inf
    l_i = tl.sum(tl.zeros([BS], tl.float32), axis=0)  # a scalar 0
    acc = tl.zeros([BLOCK_DH], dtype=tl.float32)
    for j in range(first // BS, tl.cdiv(count, BS)):
        block = tl.load(Tables + b * stride_tb + j).to(tl.int64)
        pos = j * BS + offs_s  # (BS,) the block's positions
        seen = (pos < count) & (pos >= first)
        tile = offs_s[:, None] * stride_ks + offs_d[None, :] * stride_kd
        k = tl.load(k_base + block * stride_kn + tile, mask=in_head[None, :], other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * qk_scale  # (BS,) base-2 scores
        s = tl.where(seen, s, float("-inf"))
        # Every block walked holds a seen position (first < count), so m_new is finite
        # and the first block's rescale is exp2(-inf) = 0.
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new)  # (BS,) 0 where unseen
        tile = offs_s[:, None] * stride_vs + offs_d[None, :] * stride_vd
        v = tl.load(v_base + block * stride_vn + tile, mask=in_head[None, :], other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    out = acc / l_i  # l_i >= 1: the largest score contributes exp2(0)
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_d * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=in_head)


def paged_arguments(q, k_pool, v_pool, tables, counts, out, scale: float, window) -> tuple:
    """The kernel's runtime arguments and constants (shapes as in ``paged_decode``). Shared
    by the launch below and the compile check (ladder/check/matrix.py)."""
    B, H, Dh = q.shape
    Hkv, BS = k_pool.shape[1], k_pool.shape[2]
    args = (
        q, k_pool, v_pool, tables, counts, out,
        *q.stride(), *k_pool.stride(), *v_pool.stride(), tables.stride(0), *out.stride(),
        H, H // Hkv, Dh, window or 0, scale * LOG2E,
    )  # fmt: skip
    constants = dict(HAS_WINDOW=window is not None, BLOCK_DH=head_block(Dh), BS=BS)
    return args, constants


def paged_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    tables: torch.Tensor,
    counts: torch.Tensor,
    *,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Attention of one query per row and head over the row's cached keys, read through its
    table: ``q (B,H,1,Dh)``, ``k_pool, v_pool (N,Hkv,BS,Dh)``, ``tables (B,M)`` int32 (each
    row's blocks, in position order; entries past its count unread), ``counts (B,)`` int32
    (each row's keys, the new one included, at least 1) -> ``(B,H,1,Dh)`` in q's dtype.

    ``scale`` defaults to ``1/sqrt(Dh)``; ``window`` W lets the query at position
    ``count - 1`` see the positions after ``count - 1 - W``. The block size ``BS`` is a
    power of two (a tile's rows). The caller (the level's paged cache) checks the rest.
    """
    B, H, _, Dh = q.shape
    if k_pool.shape[2] & (k_pool.shape[2] - 1):
        raise ValueError(f"the paged kernel needs a power-of-two block size, got {k_pool.shape[2]}")
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    q3 = q[:, :, 0]  # (B,H,Dh)
    out = torch.empty_like(q3)
    args, constants = paged_arguments(q3, k_pool, v_pool, tables, counts, out, scale, window)
    _paged_decode_kernel[(B, H)](*args, **constants, num_warps=PAGED_WARPS)
    return out[:, :, None]  # (B,H,1,Dh)
