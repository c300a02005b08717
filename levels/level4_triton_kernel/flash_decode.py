"""Flash-decoding: a decode step's attention split along the keys, then merged.

Why
---
A decode step has one query (or a few) per head against a cache of ``S`` keys.
The forward kernel gives each (batch, head) one program, which streams the
whole cache: with batch 1 and 16 heads that is 16 programs on a GPU with over
a hundred multiprocessors, most of them idle while a long cache is read by a
few. Flash-decoding (Dao, Haziza, Massa and Sizov, 2023) cuts the keys into
``n`` slices and gives each slice its own program, so ``B * H * n`` programs
share the reading.

How
---
Each program runs the forward kernel's loop (``attend_keys``) over its slice
only and stores what the online softmax knows at the end: the slice's output,
normalised, and its log-sum-exp ``lse_i`` (base 2; ``-inf`` for a slice with
no allowed key). A second kernel merges the slices exactly as
``merge_attention`` merges attention over disjoint keys, and as the online
softmax merges tiles: with ``lse = log2 sum_i 2^lse_i``,
``out = sum_i 2^(lse_i - lse) out_i``. Tiles, splits and devices are one algebra.

No backward pass: decoding runs without gradients; ``attention`` takes this
path only then (flash_attention.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .flash_forward import (
    LOG2E,
    attend_keys,
    kernel_constants,
    key_bounds,
    load_tile,
    mask_strides,
    store_tile,
)
from .tiles import INTERPRETER_TILES, decode_tiles, head_block, interpreting

MIN_SPLIT_KEYS = 256  # keys per slice at least: a shorter slice costs more to merge than it saves
PROGRAMS_PER_SM = 2  # enough programs to keep every multiprocessor busy while others wait on memory


def choose_splits(S: int, batch_heads: int, device: torch.device) -> int:
    """How many slices of the keys: enough programs for the GPU (``PROGRAMS_PER_SM`` per
    multiprocessor over ``B * H``), none shorter than ``MIN_SPLIT_KEYS``; 1 means the
    plain forward kernel. Under the interpreter there is no GPU to fill: 1."""
    if interpreting() or device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    wanted = math.ceil(PROGRAMS_PER_SM * sms / batch_heads)
    return max(1, min(wanted, S // MIN_SPLIT_KEYS))


@triton.jit(do_not_specialize=["T", "S", "WINDOW", "SPLIT_KEYS"])
def _decode_split_kernel(
    Q, K, V, Mask,  # as the forward kernel's: (B,H,T,Dh), (B,Hkv,S,Dh), (B,Hkv,S,Dv), (B,H,T,S)
    OutPart,  # (B*H, n, T, Dv) fp32: each slice's normalised output
    LsePart,  # (B*H, n, T) fp32: each slice's log2-sum-exp2 (-inf: no allowed key)
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_ks, stride_kd,
    stride_vb, stride_vh, stride_vs, stride_vd,
    stride_mb, stride_mh, stride_mt, stride_ms,
    H, GROUP, T, S, DH, DV, WINDOW, qk_scale,
    SPLIT_KEYS,  # keys per slice, a multiple of BLOCK_N
    N_SPLITS,  # number of slices
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,  # >= T: every query of the step in one tile
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    off_hkv = off_h // GROUP
    offs_m = tl.arange(0, BLOCK_M)  # (BLOCK_M,) query indices
    offs_dh = tl.arange(0, BLOCK_DH)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = load_tile(
        Q + off_b * stride_qb + off_h * stride_qh, offs_m, offs_dh, stride_qt, stride_qd, T, DH
    )
    # This slice's keys, within the keys any of the step's queries may see.
    key_start, key_end = key_bounds(0, T, S, WINDOW, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
    lo = tl.maximum(key_start, split * SPLIT_KEYS)  # both on tile boundaries
    hi = tl.minimum(key_end, (split + 1) * SPLIT_KEYS)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    m_i, l_i, acc = attend_keys(
        q, offs_m,
        K + off_b * stride_kb + off_hkv * stride_kh,
        V + off_b * stride_vb + off_hkv * stride_vh,
        Mask + off_b * stride_mb + off_h * stride_mh,
        stride_ks, stride_kd, stride_vs, stride_vd, stride_mt, stride_ms,
        T, S, DH, DV, WINDOW, qk_scale, lo, hi, m_i, l_i, acc,
        CAUSAL, HAS_WINDOW, HAS_MASK, DOT_PRECISION, BLOCK_DH, BLOCK_DV, BLOCK_N,
    )  # fmt: skip
    # A slice may see no allowed key (all masked, or past a row's diagonal): lse = -inf,
    # weight 0 in the merge; its output is stored as zeros.
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]  # (BLOCK_M, BLOCK_DV)
    lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    row = pid_bh * N_SPLITS + split  # (bh, split) of (B*H, n)
    store_tile(OutPart + row * T * DV, offs_m, offs_dv, DV, 1, T, DV, out)
    tl.store(LsePart + row * T + offs_m, lse, mask=offs_m < T)


@triton.jit(do_not_specialize=["T", "N_SPLITS"])
def _decode_merge_kernel(
    OutPart,  # (B*H, n, T, Dv) fp32
    LsePart,  # (B*H, n, T) fp32
    Out,  # (B, H, T, Dv) in q's dtype
    Lse,  # (B*H, T) fp32 out: the merged log2-sum-exp2
    stride_ob, stride_oh, stride_ot, stride_od,
    H, T, DV, N_SPLITS,
    BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """One program per (batch, head): the slices merged by their log-sum-exps, online."""
    pid_bh = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # the largest lse_i so far
    total = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum_i 2^(lse_i - m)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)  # sum_i 2^(lse_i - m) out_i
    for split in range(0, N_SPLITS):
        row = pid_bh * N_SPLITS + split
        lse_i = tl.load(LsePart + row * T + offs_m, mask=offs_m < T, other=float("-inf"))
        out_i = load_tile(OutPart + row * T * DV, offs_m, offs_dv, DV, 1, T, DV)
        m_new = tl.maximum(m, lse_i)
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no slice with keys yet
        alpha = tl.math.exp2(m - m_shift)
        w = tl.math.exp2(lse_i - m_shift)  # 0 for a slice without keys
        total = total * alpha + w
        acc = acc * alpha[:, None] + w[:, None] * out_i
        m = m_new
    # Every row saw a key in some slice (the host refused empty rows): total > 0.
    safe = tl.where(total > 0.0, total, 1.0)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    o_base = Out + off_b * stride_ob + off_h * stride_oh
    store_tile(o_base, offs_m, offs_dv, stride_ot, stride_od, T, DV, acc / safe[:, None])
    tl.store(Lse + pid_bh * T + offs_m, m + tl.math.log2(safe), mask=offs_m < T)


def split_arguments(
    q, k, v, mask, out_part, lse_part, causal: bool, scale: float, window, split_keys: int,
    block_n: int,
) -> tuple[tuple, dict]:  # fmt: skip
    """The split kernel's runtime arguments and constants for these tensors (shapes as in
    ``flash_decode``; ``out_part (B*H, n, T, Dv)``, ``lse_part (B*H, n, T)``). Shared by
    the launch below and the compile check (ladder/check/matrix.py)."""
    H, T, Dh = q.shape[1], q.shape[2], q.shape[3]
    Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    args = (
        q, k, v, mask if mask is not None else q, out_part, lse_part,
        *q.stride(), *k.stride(), *v.stride(), *mask_strides(mask),
        H, H // Hkv, T, S, Dh, Dv, window or 0, scale * LOG2E, split_keys, out_part.shape[1],
    )  # fmt: skip
    constants = kernel_constants(q, Dh, Dv, causal, window, mask)
    # Every query of the step in one tile: T <= 16 rows, padded to 16 for tl.dot.
    return args, constants | dict(BLOCK_M=max(16, triton.next_power_of_2(T)), BLOCK_N=block_n)


def merge_arguments(out_part, lse_part, out, lse) -> tuple[tuple, dict]:
    """The merge kernel's runtime arguments and constants: ``out_part (B*H, n, T, Dv)``,
    ``lse_part (B*H, n, T)`` in, ``out (B,H,T,Dv)``, ``lse (B*H, T)`` out."""
    H, T, Dv = out.shape[1], out.shape[2], out.shape[3]
    args = (out_part, lse_part, out, lse, *out.stride(), H, T, Dv, out_part.shape[1])
    return args, dict(BLOCK_M=max(16, triton.next_power_of_2(T)), BLOCK_DV=head_block(Dv))


MERGE_WARPS = 4  # the merge kernel's num_warps: it reads n x T x Dv fp32 numbers per program


def flash_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
    window: int | None,
    splits: int,
    block_n: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K attention for ``T <= 16`` queries; inputs validated already (flash_attention.py).

    ``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)``, ``mask`` a bool
    ``(B,H,T,S)`` view or None; ``splits`` slices of the keys (each a whole number
    of ``block_n`` tiles, default ``decode_tiles(q.dtype)``' or the interpreter's). Returns ``out
    (B,H,T,Dv)`` in q's dtype and ``lse (B*H, T)`` fp32 in base-2 units, as
    ``flash_forward`` does.
    """
    B, H, T = q.shape[:3]
    S, Dv = k.shape[2], v.shape[3]
    if block_n is None:  # the interpreter's small tiles, so short test caches still split
        block_n = (INTERPRETER_TILES if interpreting() else decode_tiles(q.dtype)).block_n
    split_keys = triton.cdiv(triton.cdiv(S, splits), block_n) * block_n  # whole tiles per slice
    n = triton.cdiv(S, split_keys)  # slices that hold keys (rounding may leave fewer)
    out_part = torch.empty((B * H, n, T, Dv), device=q.device, dtype=torch.float32)
    lse_part = torch.empty((B * H, n, T), device=q.device, dtype=torch.float32)
    args, constants = split_arguments(
        q, k, v, mask, out_part, lse_part, causal, scale, window, split_keys, block_n
    )
    pinned = decode_tiles(q.dtype)  # its warps and pipeline stages
    _decode_split_kernel[(n, B * H)](
        *args, **constants, num_warps=pinned.num_warps, num_stages=pinned.num_stages
    )
    out = torch.empty((B, H, T, Dv), device=q.device, dtype=q.dtype)
    lse = torch.empty((B * H, T), device=q.device, dtype=torch.float32)
    args, constants = merge_arguments(out_part, lse_part, out, lse)
    _decode_merge_kernel[(B * H,)](*args, **constants, num_warps=MERGE_WARPS)
    return out, lse
