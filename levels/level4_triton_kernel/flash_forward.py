"""Flash-attention forward kernel (the FlashAttention-2 algorithm) and its launcher.

Motivation
----------
Level 2 writes attention as four steps: ``scores = q @ k^T``, mask, softmax,
``out = probs @ v``, and each step hands the next a ``(B, H, T, S)`` matrix
through memory: for B = 1, H = 16, T = S = 4096 in fp16 that is 512 MiB written
and read back at every step, against 32 MiB for q, k, v and the output together
(Dh = 64). The arithmetic is cheap next to moving that matrix, so the unfused
version is bound by memory bandwidth.

The fused kernel never writes the score matrix. One program owns a tile of
``BLOCK_M`` query rows and walks over the keys ``BLOCK_N`` at a time, keeping
the scores of only the current ``BLOCK_M x BLOCK_N`` tile in registers. The
softmax is computed *online* (Milakov & Gimelshein 2018; Dao 2023): per query
row it keeps

* ``m_i``: the largest score seen so far (for numerical stability),
* ``l_i``: the sum of ``exp(score - m_i)`` over the keys seen so far,
* ``acc``: the sum of ``exp(score - m_i) * v`` over the keys seen so far,

and when a new tile raises the running maximum from ``m_old`` to ``m_new`` it
rescales ``l_i`` and ``acc`` by ``exp(m_old - m_new)``. After the last tile,
``acc / l_i`` equals ``softmax(scores) @ v`` (up to rounding). Memory traffic drops to reading
q once and k, v once per query tile: O(T * Dh + S * Dh * T / BLOCK_M) instead of
O(T * S).

The kernel also stores each query row's log-sum-exp. The backward pass uses it to
recompute the probabilities tile by tile instead of storing them
(flash_backward.py).

Numerics
--------
* Scores, ``m_i``, ``l_i`` and ``acc`` are fp32 whatever the input dtype
  (fp16/bf16 inputs feed the tensor cores, which accumulate in fp32).
* ``exp(x) = exp2(x * log2(e))``; exp2 is the hardware instruction, so
  ``log2(e)`` is folded into the softmax scale once (``qk_scale``) and every
  score, ``m_i`` and the saved log-sum-exp live in base-2 units.
* A disallowed score is set to ``-inf``, so ``exp2`` gives exactly 0. (A large
  finite negative such as -1e9 works only while the row has some allowed key:
  a fully masked row would come out as a silent uniform average of its
  values.) ``-inf`` needs one guard: a row whose keys so far are *all* disallowed has ``m_i = -inf``, and
  ``-inf - (-inf)`` is NaN; the kernel subtracts 0 instead for such rows, which
  still gives ``exp2(-inf) = 0``. A row that stays empty to the end is refused on
  the host before launch (flash_attention.py), so ``l_i > 0`` for every stored row.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .tiles import (
    DECODE_MAX_T,
    FORWARD_SHAPES,
    Tiles,
    autotuned,
    decode_tiles,
    head_block,
    launch,
    length_key,
)

LOG2E = math.log2(math.e)  # exp(x) == exp2(x * LOG2E)


@triton.jit
def load_tile(
    base,  # pointer to element (0, 0) of a strided matrix
    rows,  # (R,) row indices of the tile
    cols,  # (C,) column indices of the tile
    stride_r,  # elements between consecutive rows
    stride_c,  # elements between consecutive columns
    n_rows,  # true number of rows: indices >= n_rows are tile padding
    n_cols,  # true number of columns (e.g. Dh, padded up to BLOCK_DH)
):
    """An ``(R, C)`` tile; padding entries load as 0, which adds nothing to a dot product.

    Swapping the roles of rows and columns loads the transpose (``K^T`` tiles)
    without moving any data.
    """
    ptrs = base + rows[:, None] * stride_r + cols[None, :] * stride_c
    return tl.load(ptrs, mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :], other=0.0)


@triton.jit
def store_tile(base, rows, cols, stride_r, stride_c, n_rows, n_cols, value):
    """Store the ``(R, C)`` tile ``value`` (cast to the buffer's dtype), skipping padding."""
    ptrs = base + rows[:, None] * stride_r + cols[None, :] * stride_c
    ok = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    tl.store(ptrs, value.to(base.dtype.element_ty), mask=ok)


@triton.jit
def key_bounds(
    start_m, T, S, WINDOW, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
):  # fmt: skip
    """``[start, end)``: the keys any query of the tile ``[start_m, start_m + BLOCK_M)`` may see.

    Query ``i`` sits at ``d = i + (S - T)`` among the keys (bottom-right). Causal:
    ``j <= d``, so keys at or beyond ``start_m + BLOCK_M + S - T`` are invisible to
    the whole tile. A window ``W`` also hides ``j <= d - W`` (causal) or keeps the
    band ``|j - d| < W``: keys before ``start_m + S - T - W + 1`` are invisible to
    the tile's first query and so to all of them. The loop runs over ``[start,
    end)`` only: tiles outside, at both ends, are skipped, not loaded and masked.
    ``start`` is rounded down to a tile boundary, so the tiles stay aligned.
    """
    start = 0
    end = S
    if CAUSAL:
        end = tl.minimum(S, start_m + BLOCK_M + S - T)
    if HAS_WINDOW:
        first = tl.maximum(0, start_m + S - T - WINDOW + 1)
        start = (first // BLOCK_N) * BLOCK_N
        if not CAUSAL:
            end = tl.minimum(S, start_m + BLOCK_M - 1 + S - T + WINDOW)
    return start, end


@triton.jit
def allowed_tile(
    qi,  # query indices, a 2-D tile broadcastable against kj: (BLOCK_M, 1) or (1, BLOCK_M)
    kj,  # key indices: (1, BLOCK_N) or (BLOCK_N, 1)
    T,  # number of queries; rows qi >= T are tile padding
    S,  # number of keys; columns kj >= S are tile padding
    WINDOW,  # the sliding window W (read only when HAS_WINDOW)
    mask_base,  # pointer to mask[b, h, 0, 0] (a bool view, stride 0 on broadcast dims)
    stride_mt,  # mask stride between queries
    stride_ms,  # mask stride between keys
    CAUSAL: tl.constexpr,  # apply the bottom-right causal rule
    HAS_WINDOW: tl.constexpr,  # apply the window (W latest keys, or the band |j - d| < W)
    HAS_MASK: tl.constexpr,  # read the boolean mask (True = may attend)
):
    """Which (query, key) pairs of a tile may attend: padding, causal rule, window and mask.

    Works in either orientation (queries along rows or along columns), so the
    forward, the dQ kernel and the transposed dK/dV kernel share one definition.
    """
    ok = (qi < T) & (kj < S)
    d = qi + (S - T)  # the query's place among the keys
    if CAUSAL:
        ok = ok & (kj <= d)
    if HAS_WINDOW:
        if CAUSAL:
            ok = ok & (kj > d - WINDOW)
        else:
            ok = ok & (kj - d < WINDOW) & (d - kj < WINDOW)
    if HAS_MASK:
        # A masked load: padding and excluded entries are not even read.
        ok = ok & (tl.load(mask_base + qi * stride_mt + kj * stride_ms, mask=ok, other=0) != 0)
    return ok


@triton.jit
def attend_keys(
    q,  # (BLOCK_M, BLOCK_DH) the query tile, in registers
    offs_m,  # (BLOCK_M,) its query indices
    k_base, v_base, mask_base,  # this (batch, head)'s K, V and mask
    stride_ks, stride_kd, stride_vs, stride_vd, stride_mt, stride_ms,
    T, S, DH, DV, WINDOW, qk_scale,
    key_start, key_end,  # the keys [key_start, key_end) to walk, key_start on a tile boundary
    m_i, l_i, acc,  # the online-softmax state so far (base-2 units)
    CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The online softmax over the keys ``[key_start, key_end)``: ``(m_i, l_i, acc)`` updated.

    The loop of the forward kernel, shared with flash-decoding's split kernel
    (flash_decode.py), which walks one slice of the keys per program.
    """
    offs_n0 = tl.arange(0, BLOCK_N)  # (BLOCK_N,) key offsets inside a tile
    offs_dh = tl.arange(0, BLOCK_DH)
    offs_dv = tl.arange(0, BLOCK_DV)
    for start_n in range(key_start, key_end, BLOCK_N):
        offs_n = start_n + offs_n0
        kT = load_tile(k_base, offs_dh, offs_n, stride_kd, stride_ks, DH, S)  # (BLOCK_DH, BLOCK_N)
        s = tl.dot(q, kT, input_precision=DOT_PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N) fp32
        ok = allowed_tile(
            offs_m[:, None], offs_n[None, :], T, S, WINDOW, mask_base, stride_mt, stride_ms,
            CAUSAL, HAS_WINDOW, HAS_MASK,
        )  # (BLOCK_M, BLOCK_N)  # fmt: skip
        s = tl.where(ok, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
        # Rows with no allowed key yet have m_new = -inf; shift them by 0 instead,
        # so exp2(-inf - 0) = 0 rather than exp2(-inf + inf) = NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_shift[:, None])  # (BLOCK_M, BLOCK_N), in [0, 1]
        alpha = tl.math.exp2(m_i - m_shift)  # rescales the old state to the new max
        l_i = l_i * alpha + tl.sum(p, 1)

        v = load_tile(v_base, offs_n, offs_dv, stride_vs, stride_vd, S, DV)  # (BLOCK_N, BLOCK_DV)
        # p is cast to v's dtype for the tensor cores (fp16/bf16); the sum stays fp32.
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return m_i, l_i, acc


# Lengths are not specialised: by default Triton compiles a separate variant when
# an integer argument is 1 or a multiple of 16. T and S only enter comparisons,
# loop bounds and row offsets, so such variants would buy nothing and cost a
# compilation (with every autotuning candidate) each time a new length class appears.
@triton.jit(do_not_specialize=["T", "S", "T_KEY", "S_KEY", "WINDOW"])
def _attn_fwd_kernel(
    Q,  # (B, H, T, Dh) queries, any strides
    K,  # (B, Hkv, S, Dh) keys: query head h reads key/value head h // GROUP
    V,  # (B, Hkv, S, Dv) values
    Mask,  # (B, H, T, S) bool view, True = may attend; a dummy pointer unless HAS_MASK
    Out,  # (B, H, T, Dv) output
    Lse,  # (B * H, T) fp32 out: log2-sum-exp2 of each row's scaled scores
    stride_qb, stride_qh, stride_qt, stride_qd,  # Q strides (elements)
    stride_kb, stride_kh, stride_ks, stride_kd,  # K strides
    stride_vb, stride_vh, stride_vs, stride_vd,  # V strides
    stride_mb, stride_mh, stride_mt, stride_ms,  # mask strides (0 on broadcast dims)
    stride_ob, stride_oh, stride_ot, stride_od,  # Out strides
    H,  # number of query heads: program_id(1) = b * H + h
    GROUP,  # query heads per key/value head, H // Hkv (1 without grouped-query attention)
    T,  # number of queries (any value, not a multiple of BLOCK_M)
    S,  # number of keys (any value, not a multiple of BLOCK_N)
    DH,  # true query/key head width
    DV,  # true value head width
    WINDOW,  # the sliding window W (used only when HAS_WINDOW)
    qk_scale,  # softmax scale * log2(e): scores come out in base-2 units
    T_KEY,  # T rounded up to a power of two: the autotuner's cache key only
    S_KEY,  # S rounded up likewise
    CAUSAL: tl.constexpr,  # bottom-right causal rule, key tiles past the diagonal skipped
    HAS_WINDOW: tl.constexpr,  # sliding window, key tiles before it skipped
    HAS_MASK: tl.constexpr,  # read Mask
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no silent TF32); ignored for fp16/bf16
    BLOCK_DH: tl.constexpr,  # DH padded to a power of two >= 16
    BLOCK_DV: tl.constexpr,  # DV padded likewise
    BLOCK_M: tl.constexpr,  # queries per program
    BLOCK_N: tl.constexpr,  # keys per loop iteration
):  # fmt: skip
    start_m = tl.program_id(0) * BLOCK_M
    pid_bh = tl.program_id(1)
    # int64 offsets: b * stride_qb overflows int32 once a tensor passes 2^31 elements.
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    off_hkv = off_h // GROUP  # the key/value head of this query head's group

    offs_m = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query indices
    offs_dh = tl.arange(0, BLOCK_DH)
    offs_dv = tl.arange(0, BLOCK_DV)

    q_base = Q + off_b * stride_qb + off_h * stride_qh
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh
    mask_base = Mask + off_b * stride_mb + off_h * stride_mh

    # The query tile stays in registers for the whole loop.
    q = load_tile(q_base, offs_m, offs_dh, stride_qt, stride_qd, T, DH)  # (BLOCK_M, BLOCK_DH)

    # Online-softmax state, fp32, one entry per query row (base-2 units).
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max of scores
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)  # running sum of exp2(score - m_i) * v

    key_start, key_end = key_bounds(start_m, T, S, WINDOW, BLOCK_M, BLOCK_N, CAUSAL, HAS_WINDOW)
    m_i, l_i, acc = attend_keys(
        q, offs_m, k_base, v_base, mask_base, stride_ks, stride_kd, stride_vs, stride_vd,
        stride_mt, stride_ms, T, S, DH, DV, WINDOW, qk_scale, key_start, key_end, m_i, l_i, acc,
        CAUSAL, HAS_WINDOW, HAS_MASK, DOT_PRECISION, BLOCK_DH, BLOCK_DV, BLOCK_N,
    )  # fmt: skip

    # Every stored row has l_i > 0 (the host refused empty rows); only padded rows
    # (offs_m >= T) may have l_i = 0, and the guard keeps them free of NaN.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]  # (BLOCK_M, BLOCK_DV)
    o_base = Out + off_b * stride_ob + off_h * stride_oh
    store_tile(o_base, offs_m, offs_dv, stride_ot, stride_od, T, DV, out)
    # log2(sum_j exp2(s_j)) = m_i + log2(l_i): the backward gets p_ij = exp2(s_ij - lse_i).
    tl.store(Lse + pid_bh * T + offs_m, m_i + tl.math.log2(l_safe), mask=offs_m < T)


# The autotuner's cache key; it adds the tensors' dtypes itself.
TUNING_KEY = ["T_KEY", "S_KEY", "BLOCK_DH", "BLOCK_DV", "CAUSAL", "HAS_WINDOW", "HAS_MASK"]
_attn_fwd_tuned = autotuned(_attn_fwd_kernel, TUNING_KEY, FORWARD_SHAPES)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 products ("ieee"); Triton would otherwise use TF32."""
    return "ieee" if dtype == torch.float32 else "tf32"


def kernel_constants(q, Dh: int, Dv: int, causal: bool, window, mask) -> dict:
    """The compile-time constants every attention kernel takes (forward, backward, decode)."""
    return dict(
        CAUSAL=causal,
        HAS_WINDOW=window is not None,
        HAS_MASK=mask is not None,
        DOT_PRECISION=dot_precision(q.dtype),
        BLOCK_DH=head_block(Dh),
        BLOCK_DV=head_block(Dv),
    )


def mask_strides(mask: torch.Tensor | None) -> tuple[int, int, int, int]:
    """Strides of the (B, H, T, S) mask view; zeros when there is no mask."""
    return tuple(mask.stride()) if mask is not None else (0, 0, 0, 0)


def forward_arguments(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
    window: int | None,
) -> tuple[tuple, dict]:
    """The forward kernel's runtime arguments, in order, and its compile-time constants
    (all but the tiles) for these tensors.

    The launch below and the ahead-of-time compile check (ladder/check/matrix.py,
    which passes ``device="meta"`` tensors) both build them here, so both compile the
    signature a real launch specialises. Shapes as in ``flash_forward``.
    """
    H, T, Dh = q.shape[1], q.shape[2], q.shape[3]
    Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[3]
    args = (
        q, k, v, mask if mask is not None else q, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *mask_strides(mask), *out.stride(),
        H, H // Hkv, T, S, Dh, Dv, window or 0, scale * LOG2E,
        length_key(T), length_key(S),
    )  # fmt: skip
    return args, kernel_constants(q, Dh, Dv, causal, window, mask)


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    scale: float,
    window: int | None = None,
    tiles: Tiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel. Inputs are already validated (flash_attention.py).

    ``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)``, ``mask`` a bool
    ``(B,H,T,S)`` view or None. Returns ``out (B,H,T,Dv)`` in q's dtype and
    ``lse (B*H, T)`` fp32 in base-2 units. ``tiles`` pins the tile sizes
    (default: autotuned on a GPU, fixed under the interpreter; decoding with
    ``T <= 16`` uses ``decode_tiles(q.dtype)``).
    """
    B, H, T = q.shape[:3]
    Dv = v.shape[3]
    out = torch.empty((B, H, T, Dv), device=q.device, dtype=q.dtype)  # (B, H, T, Dv)
    lse = torch.empty((B * H, T), device=q.device, dtype=torch.float32)  # (B*H, T)
    if tiles is None and T <= DECODE_MAX_T:
        tiles = decode_tiles(q.dtype)
    args, constants = forward_arguments(q, k, v, mask, out, lse, causal, scale, window)

    def grid(block_m: int, block_n: int) -> tuple[int, int]:
        return (triton.cdiv(T, block_m), B * H)

    launch(_attn_fwd_kernel, _attn_fwd_tuned, grid, args, constants, tiles)
    return out, lse
