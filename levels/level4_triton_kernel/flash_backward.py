"""Flash-attention backward: dQ, dK, dV by recomputing the probabilities tile by tile.

The math
--------
With ``s = scale * q k^T`` (per head), ``p = softmax(s)`` row-wise and
``o = p v``, the gradients for an incoming ``dO`` are

    dV = p^T dO                      (S, Dv)
    dP = dO v^T                      (T, S)
    dS = p * (dP - delta[:, None])   (T, S), the softmax backward,
         delta_i = sum_j p_ij dP_ij = sum_d dO_id o_id   (the second form is cheap)
    dQ = scale * dS k                (T, Dh)
    dK = scale * dS^T q              (S, Dh)

Nothing of size ``T x S`` is stored between the passes: the forward saved only
each row's log-sum-exp ``lse_i`` (base 2), so any tile of ``p`` is recomputed
directly as ``p_ij = exp2(s_ij * log2(e) - lse_i)``, with no running max needed.

Structure: three kernels, no atomics
------------------------------------
1. ``_attn_bwd_delta_kernel``: ``delta = rowsum(dO * O)``, one pass over O and dO.
2. ``_attn_bwd_dkdv_kernel``: one program per *key* tile; it keeps its dK and dV
   tiles in registers and loops over the query tiles that can see it.
3. ``_attn_bwd_dq_kernel``: one program per *query* tile; it keeps its dQ tile in
   registers and loops over the key tiles it can see (the forward's loop).

The alternative, one kernel per key tile that also adds its share of dQ into
memory with atomic adds, recomputes ``p`` once instead of twice, but makes the
result depend on the order of the atomic adds (not bitwise reproducible) and
needs dQ zeroed and kept in fp32. With two kernels, ``q k^T`` and ``dO v^T``
are computed in both (seven tile matmuls instead of five: 40% more backward
FLOPs), and in exchange every output is written once, deterministically, by
one program. That is the clearer reference here.

Both loops honour the causal bound, so tiles that lie entirely above the
bottom-right diagonal are skipped in the backward too: a key tile starting at
``start_n`` is seen only by queries ``i >= start_n - (S - T)``.
Any T and S work: every load and the allowed-pair test are masked, as in the
forward (flash_forward.allowed_tile is shared).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .flash_forward import (
    LOG2E,
    TUNING_KEY,
    allowed_tile,
    kernel_constants,
    key_bounds,
    load_tile,
    mask_strides,
    store_tile,
)
from .tiles import DKDV_SHAPES, DQ_SHAPES, Tiles, autotuned, head_block, launch, length_key

DELTA_BLOCK_ROWS = 16  # rows of O per program in the delta pre-pass


@triton.jit(do_not_specialize=["R"])
def _attn_bwd_delta_kernel(
    Out,  # (R, Dv) forward output, contiguous, R = B * H * T rows
    dOut,  # (R, Dv) incoming gradient, contiguous
    Delta,  # (R,) fp32 out: rowsum(dO * O)
    R,  # number of rows
    DV,  # true value width
    BLOCK_R: tl.constexpr,  # rows per program
    BLOCK_DV: tl.constexpr,  # DV padded to a power of two >= 16
):
    offs_r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_DV)
    o = load_tile(Out, offs_r, offs_d, DV, 1, R, DV).to(tl.float32)  # (BLOCK_R, BLOCK_DV)
    do = load_tile(dOut, offs_r, offs_d, DV, 1, R, DV).to(tl.float32)
    tl.store(Delta + offs_r, tl.sum(o * do, 1), mask=offs_r < R)


@triton.jit
def query_bounds(
    start_n, T, S, WINDOW, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr
):
    """``[start, end)``: the queries that may see some key of ``[start_n, start_n + BLOCK_N)``.

    Query ``i`` sits at ``d = i + (S - T)``. Causal: key ``j`` is seen only when
    ``d >= j``, so queries before ``start_n - (S - T)`` never see the tile. A
    window also needs ``d < j + W`` (causal) or ``|j - d| < W``, which ends the
    range at ``start_n + BLOCK_N - 1 - (S - T) + W`` (and, without causal,
    starts it at ``start_n - (S - T) - W + 1``). Query tiles outside are skipped.
    """
    start = 0
    end = T
    if CAUSAL:
        start = tl.maximum(0, start_n - (S - T))
    if HAS_WINDOW:
        end = tl.minimum(T, start_n + BLOCK_N - 1 - (S - T) + WINDOW)
        if not CAUSAL:
            start = tl.maximum(0, start_n - (S - T) - WINDOW + 1)
    return start, end


@triton.jit(do_not_specialize=["T", "S", "T_KEY", "S_KEY", "WINDOW"])
def _attn_bwd_dkdv_kernel(
    Q, K, V,  # (B, H, T, Dh), (B, Hkv, S, Dh), (B, Hkv, S, Dv) forward inputs, any strides
    Mask,  # (B, H, T, S) bool view; a dummy pointer unless HAS_MASK
    dOut,  # (B, H, T, Dv) incoming gradient, contiguous
    Lse,  # (B * H, T) fp32 log2-sum-exp2 saved by the forward
    Delta,  # (B * H, T) fp32 rowsum(dO * O), less dL/dlse when the lse is used
    dK,  # (B, Hkv, S, Dh) out, contiguous
    dV,  # (B, Hkv, S, Dv) out, contiguous
    stride_qb, stride_qh, stride_qt, stride_qd,  # Q strides (elements)
    stride_kb, stride_kh, stride_ks, stride_kd,  # K strides
    stride_vb, stride_vh, stride_vs, stride_vd,  # V strides
    stride_mb, stride_mh, stride_mt, stride_ms,  # mask strides (0 on broadcast dims)
    H, GROUP, T, S, DH, DV,  # query heads, H // Hkv, lengths and true head widths
    WINDOW,  # the sliding window W (used only when HAS_WINDOW)
    scale,  # the softmax scale (natural units): dK = scale * dS^T q
    qk_scale,  # scale * log2(e), to recompute scores in base-2 units
    T_KEY, S_KEY,  # power-of-two buckets of T and S: the autotuner's cache key only
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr,  # as in the forward
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs
    BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr,  # padded head widths
    BLOCK_M: tl.constexpr,  # queries per loop iteration
    BLOCK_N: tl.constexpr,  # keys per program
):  # fmt: skip
    start_n = tl.program_id(0) * BLOCK_N
    pid_bhkv = tl.program_id(1)  # b * Hkv + key/value head
    HKV = H // GROUP
    off_b = (pid_bhkv // HKV).to(tl.int64)
    off_hkv = (pid_bhkv % HKV).to(tl.int64)
    off_bhkv = pid_bhkv.to(tl.int64)  # row offsets into the contiguous (B*Hkv, ...) buffers

    offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key indices owned by this program
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_dh = tl.arange(0, BLOCK_DH)
    offs_dv = tl.arange(0, BLOCK_DV)

    # This program's keys and values stay in registers for the whole loop.
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    k = load_tile(k_base, offs_n, offs_dh, stride_ks, stride_kd, S, DH)  # (BLOCK_N, BLOCK_DH)
    v = load_tile(v_base, offs_n, offs_dv, stride_vs, stride_vd, S, DV)  # (BLOCK_N, BLOCK_DV)
    dk = tl.zeros([BLOCK_N, BLOCK_DH], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)

    query_start, query_end = query_bounds(start_n, T, S, WINDOW, BLOCK_N, CAUSAL, HAS_WINDOW)
    # A shared key/value head collects the gradients of every query head of its group,
    # one after the other, in registers: a deterministic sum, no atomics.
    for g in range(GROUP):
        off_h = off_hkv * GROUP + g  # the query head
        off_bh = off_b * H + off_h  # its row in the contiguous (B*H, ...) buffers
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        do_base = dOut + off_bh * T * DV  # dO is contiguous: (B*H, T, Dv)
        mask_base = Mask + off_b * stride_mb + off_h * stride_mh
        for start_m in range(query_start, query_end, BLOCK_M):
            offs_m = start_m + offs_m0
            qT = load_tile(
                q_base, offs_dh, offs_m, stride_qd, stride_qt, DH, T
            )  # (BLOCK_DH, BLOCK_M)
            do = load_tile(do_base, offs_m, offs_dv, DV, 1, T, DV)  # (BLOCK_M, BLOCK_DV)
            lse = tl.load(Lse + off_bh * T + offs_m, mask=offs_m < T, other=0.0)  # (BLOCK_M,)
            delta = tl.load(Delta + off_bh * T + offs_m, mask=offs_m < T, other=0.0)

            # The tile transposed (keys along rows), so dK and dV need no transposes.
            sT = tl.dot(k, qT, input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_N, BLOCK_M)
            ok = allowed_tile(
                offs_m[None, :], offs_n[:, None], T, S, WINDOW, mask_base, stride_mt, stride_ms,
                CAUSAL, HAS_WINDOW, HAS_MASK,
            )  # (BLOCK_N, BLOCK_M)  # fmt: skip
            # -inf before exp2: disallowed pairs give exactly 0 and never overflow.
            pT = tl.math.exp2(tl.where(ok, sT - lse[None, :], float("-inf")))  # (BLOCK_N, BLOCK_M)
            dv += tl.dot(pT.to(do.dtype), do, input_precision=DOT_PRECISION)  # (BLOCK_N, BLOCK_DV)
            dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # (BLOCK_N, BLOCK_M)
            dsT = pT * (dpT - delta[None, :])  # (BLOCK_N, BLOCK_M) fp32
            dk += tl.dot(dsT.to(qT.dtype), tl.trans(qT), input_precision=DOT_PRECISION)

    # dK and dV are contiguous: (B*Hkv, S, Dh) and (B*Hkv, S, Dv).
    store_tile(dK + off_bhkv * S * DH, offs_n, offs_dh, DH, 1, S, DH, dk * scale)
    store_tile(dV + off_bhkv * S * DV, offs_n, offs_dv, DV, 1, S, DV, dv)


@triton.jit(do_not_specialize=["T", "S", "T_KEY", "S_KEY", "WINDOW"])
def _attn_bwd_dq_kernel(
    Q, K, V,  # (B, H, T, Dh), (B, Hkv, S, Dh), (B, Hkv, S, Dv) forward inputs, any strides
    Mask,  # (B, H, T, S) bool view; a dummy pointer unless HAS_MASK
    dOut,  # (B, H, T, Dv) incoming gradient, contiguous
    Lse,  # (B * H, T) fp32 log2-sum-exp2 saved by the forward
    Delta,  # (B * H, T) fp32 rowsum(dO * O), less dL/dlse when the lse is used
    dQ,  # (B, H, T, Dh) out, contiguous
    stride_qb, stride_qh, stride_qt, stride_qd,  # Q strides (elements)
    stride_kb, stride_kh, stride_ks, stride_kd,  # K strides
    stride_vb, stride_vh, stride_vs, stride_vd,  # V strides
    stride_mb, stride_mh, stride_mt, stride_ms,  # mask strides (0 on broadcast dims)
    H, GROUP, T, S, DH, DV,  # query heads, H // Hkv, lengths and true head widths
    WINDOW,  # the sliding window W (used only when HAS_WINDOW)
    scale,  # the softmax scale (natural units): dQ = scale * dS k
    qk_scale,  # scale * log2(e)
    T_KEY, S_KEY,  # power-of-two buckets of T and S: the autotuner's cache key only
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr,  # as in the forward
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs
    BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr,  # padded head widths
    BLOCK_M: tl.constexpr,  # queries per program
    BLOCK_N: tl.constexpr,  # keys per loop iteration
):  # fmt: skip
    start_m = tl.program_id(0) * BLOCK_M
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    off_hkv = off_h // GROUP
    off_bh = pid_bh.to(tl.int64)  # row offsets into the contiguous (B*H, ...) buffers

    offs_m = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query indices owned by this program
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_dh = tl.arange(0, BLOCK_DH)
    offs_dv = tl.arange(0, BLOCK_DV)

    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    mask_base = Mask + off_b * stride_mb + off_h * stride_mh

    # This program's queries, their dO, lse and delta stay in registers.
    q_base = Q + off_b * stride_qb + off_h * stride_qh
    q = load_tile(q_base, offs_m, offs_dh, stride_qt, stride_qd, T, DH)  # (BLOCK_M, BLOCK_DH)
    do = load_tile(dOut + off_bh * T * DV, offs_m, offs_dv, DV, 1, T, DV)  # (BLOCK_M, BLOCK_DV)
    lse = tl.load(Lse + off_bh * T + offs_m, mask=offs_m < T, other=0.0)  # (BLOCK_M,)
    delta = tl.load(Delta + off_bh * T + offs_m, mask=offs_m < T, other=0.0)  # (BLOCK_M,)
    dq = tl.zeros([BLOCK_M, BLOCK_DH], dtype=tl.float32)

    key_start, key_end = key_bounds(start_m, T, S, WINDOW, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
    for start_n in range(key_start, key_end, BLOCK_N):  # the forward's loop bounds
        offs_n = start_n + offs_n0
        kT = load_tile(k_base, offs_dh, offs_n, stride_kd, stride_ks, DH, S)  # (BLOCK_DH, BLOCK_N)
        vT = load_tile(v_base, offs_dv, offs_n, stride_vd, stride_vs, DV, S)  # (BLOCK_DV, BLOCK_N)
        s = tl.dot(q, kT, input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
        ok = allowed_tile(
            offs_m[:, None], offs_n[None, :], T, S, WINDOW, mask_base, stride_mt, stride_ms,
            CAUSAL, HAS_WINDOW, HAS_MASK,
        )  # (BLOCK_M, BLOCK_N)  # fmt: skip
        p = tl.math.exp2(tl.where(ok, s - lse[:, None], float("-inf")))  # (BLOCK_M, BLOCK_N)
        dp = tl.dot(do, vT, input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])  # (BLOCK_M, BLOCK_N) fp32
        dq += tl.dot(ds.to(kT.dtype), tl.trans(kT), input_precision=DOT_PRECISION)

    # dQ is contiguous: (B*H, T, Dh).
    store_tile(dQ + off_bh * T * DH, offs_m, offs_dh, DH, 1, T, DH, dq * scale)


_dkdv_tuned = autotuned(_attn_bwd_dkdv_kernel, TUNING_KEY, DKDV_SHAPES)
_dq_tuned = autotuned(_attn_bwd_dq_kernel, TUNING_KEY, DQ_SHAPES)


def delta_arguments(out: torch.Tensor, d_out: torch.Tensor, delta: torch.Tensor):
    """The delta pre-pass's runtime arguments and constants: ``out``, ``d_out``
    ``(B,H,T,Dv)`` contiguous, ``delta (B*H, T)`` fp32 (shared with the compile check,
    ladder/check/matrix.py)."""
    Dv = out.shape[-1]
    args = (out, d_out, delta, delta.numel(), Dv)
    return args, dict(BLOCK_R=DELTA_BLOCK_ROWS, BLOCK_DV=head_block(Dv))


def gradient_arguments(
    q, k, v, mask, d_out, lse, delta, grads: tuple, causal: bool, scale: float, window
) -> tuple[tuple, dict]:
    """The runtime arguments and constants (all but the tiles) of the dK/dV kernel
    (``grads = (dk, dv)``) or the dQ kernel (``grads = (dq,)``); shapes as in
    ``flash_backward``. Shared by the launches below and the compile check
    (ladder/check/matrix.py)."""
    H, T, Dh = q.shape[1], q.shape[2], q.shape[3]
    Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    args = (
        q, k, v, mask if mask is not None else q, d_out, lse, delta, *grads,
        *q.stride(), *k.stride(), *v.stride(), *mask_strides(mask),
        H, H // Hkv, T, S, Dh, Dv, window or 0, scale, scale * LOG2E,
        length_key(T), length_key(S),
    )  # fmt: skip
    return args, kernel_constants(q, Dh, Dv, causal, window, mask)


def flash_backward(
    d_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
    window: int | None = None,
    d_lse: torch.Tensor | None = None,
    tiles: Tiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv)`` with the shapes and dtypes of ``q``, ``k``, ``v``.

    ``out (B,H,T,Dv)`` and ``lse (B*H,T)`` are what ``flash_forward`` returned
    for the same inputs; ``d_out (B,H,T,Dv)`` any strides. ``d_lse (B,H,T)``
    (natural units), when the log-sum-exp itself was used: since
    ``d lse_i / d s_ij = p_ij``, it adds ``p_ij * d_lse_i`` to every ``dS_ij``,
    which is exactly ``delta_i`` lowered by ``d_lse_i``: the kernels need no change.
    """
    B, H, T, Dh = q.shape
    Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    d_out = d_out.contiguous()  # (B, H, T, Dv)
    out = out.contiguous()
    dq = torch.empty((B, H, T, Dh), device=q.device, dtype=q.dtype)
    dk = torch.empty((B, Hkv, S, Dh), device=k.device, dtype=k.dtype)
    dv = torch.empty((B, Hkv, S, Dv), device=v.device, dtype=v.dtype)

    # 1. delta = rowsum(dO * O), fp32: (B*H*T,)
    delta = torch.empty((B * H, T), device=q.device, dtype=torch.float32)
    args, constants = delta_arguments(out, d_out, delta)
    _attn_bwd_delta_kernel[(triton.cdiv(B * H * T, DELTA_BLOCK_ROWS),)](*args, **constants)
    if d_lse is not None:
        delta -= d_lse.reshape(B * H, T).to(torch.float32)

    # 2. dK, dV: one program per key tile and key/value head (looping over its group).
    args, constants = gradient_arguments(
        q, k, v, mask, d_out, lse, delta, (dk, dv), causal, scale, window
    )
    launch(
        _attn_bwd_dkdv_kernel,
        _dkdv_tuned,
        lambda block_m, block_n: (triton.cdiv(S, block_n), B * Hkv),
        args,
        constants,
        tiles,
    )
    # 3. dQ: one program per query tile and query head.
    args, constants = gradient_arguments(
        q, k, v, mask, d_out, lse, delta, (dq,), causal, scale, window
    )
    launch(
        _attn_bwd_dq_kernel,
        _dq_tuned,
        lambda block_m, block_n: (triton.cdiv(T, block_m), B * H),
        args,
        constants,
        tiles,
    )
    return dq, dk, dv
