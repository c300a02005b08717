"""Level 4's on-ramp: six small Triton kernels, each one idea past the last, up to the
shape of the real forward kernel (flash_forward.py).

Three warm-ups, lettered, climb as Triton's own tutorials begin (01 vector add,
03 matrix multiplication); then three versions of one kernel, numbered as
llm.c's ``dev/cuda`` numbers its kernel versions (docs/level4_triton_kernel.md
reads them in order):

A. ``add``: the programming model. One *program* per block of ``BLOCK``
   elements (the grid is the number of blocks), each block loaded with a
   *mask* for the lanes past the end of the vectors.
B. ``matmul``: tiles and ``tl.dot``. One program per ``BLOCK_M x BLOCK_N``
   tile of the output (a 2-D grid), walking the shared dimension ``BLOCK_K``
   at a time with a float32 accumulator held in registers: the loop every
   attention kernel below runs, with a softmax added.
C. ``grouped_matmul``: what the compiler decides. The same product with its
   tile chosen by ``@triton.autotune`` (one configuration, with the
   ``num_warps`` and ``num_stages`` a GPU compile reads), and its programs
   handed their tiles in grouped order (Triton's tutorial 03), so that the
   programs running at once share the rows of A and columns of B they read.
1. ``softmax_rows``: a reduction inside a program. One program per row, a
   block of ``BLOCK`` columns, the row's max and sum taken in registers. One
   read and one write of the row.
2. ``attention_v2``: the online softmax over key tiles, FlashAttention-2's
   loop: one program per (query tile, batch x head), every key visible. No
   attention mask, no causal rule, no grouped heads, no window.
3. ``attention_v3``: bottom-right causal. Key tiles past the diagonal are
   never loaded, and the loop is split in two, as Triton's tutorial 06 splits
   it: the tiles every query of the tile sees in full run without any mask
   arithmetic, and only the tiles on the diagonal apply the causal rule.

What the real kernel adds to version 3: grouped-query heads, boolean masks,
sliding windows (whose tiles make the ``-inf`` guard necessary), the saved
log-sum-exp for the backward, any strides, and autotuned tiles.

Nothing in the package imports this module: the rung's behaviour does not
depend on it. The chapter and tests/test_level4_tutorial.py do; it imports
triton, so import ``levels`` first (which sets ``TRITON_INTERPRET=1`` on a
machine without a GPU).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LOG2E = math.log2(math.e)  # exp(x) == exp2(x * LOG2E)


# ----------------------------------------------------------------------------- A. add


@triton.jit
def _add_kernel(
    X,  # (N,) first input, contiguous
    Y,  # (N,) second input, contiguous
    Z,  # (N,) output, contiguous
    N,  # the true number of elements
    BLOCK: tl.constexpr,  # elements per program: a compile-time power of two
):
    start = tl.program_id(0) * BLOCK  # this program's first element
    offs = start + tl.arange(0, BLOCK)  # (BLOCK,) the elements it owns
    inside = offs < N  # the last block runs past N: its extra lanes neither read nor write
    x = tl.load(X + offs, mask=inside)  # (BLOCK,)
    y = tl.load(Y + offs, mask=inside)
    tl.store(Z + offs, x + y, mask=inside)


def add(x: torch.Tensor, y: torch.Tensor, *, block: int = 64) -> torch.Tensor:
    """``x + y`` of two contiguous 1-D tensors of one shape: one program per ``block`` elements."""
    if x.dim() != 1 or x.shape != y.shape or not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError(
            f"add takes two contiguous 1-D tensors of one shape, got {tuple(x.shape)}, {tuple(y.shape)}"
        )
    z = torch.empty_like(x)  # (N,)
    N = x.numel()
    _add_kernel[(triton.cdiv(N, block),)](x, y, z, N, BLOCK=block)
    return z


# ----------------------------------------------------------------------------- B. matmul


@triton.jit
def _matmul_kernel(
    A,  # (M, K) left operand
    B,  # (K, N) right operand
    C,  # (M, N) output
    M,  # rows of A and C
    N,  # columns of B and C
    K,  # the shared dimension
    stride_am, stride_ak,  # elements from one row / column of A to the next
    stride_bk, stride_bn,  # the same for B (a transposed view has stride_bk == 1)
    stride_cm, stride_cn,  # the same for C
    BLOCK_M: tl.constexpr,  # rows of C per program
    BLOCK_N: tl.constexpr,  # columns of C per program
    BLOCK_K: tl.constexpr,  # the shared dimension, this much per loop step
):  # fmt: skip
    _matmul_tile(
        A, B, C, tl.program_id(0), tl.program_id(1), M, N, K, stride_am, stride_ak,
        stride_bk, stride_bn, stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip


@triton.jit
def _matmul_tile(
    A, B, C, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
    stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Tile ``(pid_m, pid_n)`` of ``C = A @ B``, ``(BLOCK_M, BLOCK_N)``, computed in float32
    and stored: what one program of either matmul kernel does once it knows its tile."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) this tile's rows
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,) its columns
    offs_k = tl.arange(0, BLOCK_K)  # (BLOCK_K,)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # the C tile, in registers throughout
    for start_k in range(0, K, BLOCK_K):
        k = start_k + offs_k  # (BLOCK_K,) this step's slice of the shared dimension
        a = tl.load(
            A + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
            mask=(offs_m[:, None] < M) & (k[None, :] < K),
            other=0.0,
        )  # (BLOCK_M, BLOCK_K); past the edges 0, which adds nothing to the products
        b = tl.load(
            B + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
            mask=(k[:, None] < K) & (offs_n[None, :] < N),
            other=0.0,
        )  # (BLOCK_K, BLOCK_N)
        acc += tl.dot(a, b, input_precision="ieee")  # (BLOCK_M, BLOCK_K) @ (BLOCK_K, BLOCK_N)
    tl.store(
        C + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
        acc,
        mask=(offs_m[:, None] < M) & (offs_n[None, :] < N),
    )


def matmul(a: torch.Tensor, b: torch.Tensor, *, block_m=16, block_n=16, block_k=16):
    """``a @ b`` of float32 ``a (M, K)`` and ``b (K, N)``, any strides: one program per
    ``block_m x block_n`` tile of the output ``(M, N)``."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(
            f"matmul takes a (M, K) and b (K, N), got {tuple(a.shape)}, {tuple(b.shape)}"
        )
    if not (a.dtype == b.dtype == torch.float32):
        raise TypeError("the tutorial's matmul takes float32 operands")
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=torch.float32)  # (M, N)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))  # one program per tile of c
    _matmul_kernel[grid](
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        c.stride(0), c.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip
    return c


# ----------------------------------------------------------------------------- C. what the compiler decides

# One configuration, so the autotuner has nothing to time (under the interpreter it could
# not: it times real launches). On a GPU the list holds the candidates, and the first call
# for each new (M, N, K) times them all and keeps the fastest. num_warps and num_stages
# are the compiler's: the interpreter runs a program as one numpy thread and ignores both.
MATMUL_CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, num_warps=4, num_stages=2)
]


@triton.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"])
@triton.jit
def _grouped_matmul_kernel(
    A,  # (M, K) left operand
    B,  # (K, N) right operand
    C,  # (M, N) output
    Order,  # (tiles_m, tiles_n) int32: the program that computed each tile of C
    M, N, K,  # the sizes, as in _matmul_kernel
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    GROUP_M: tl.constexpr,  # rows of tiles a group of programs walks down before moving right
    BLOCK_M: tl.constexpr,  # the autotuner's choice, from MATMUL_CONFIGS
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)  # a 1-D grid: the program's place in launch order
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n  # programs per group: GROUP_M rows of tiles, every column
    first_m = (pid // in_group) * GROUP_M  # the group's first row of tiles
    rows = tl.minimum(tiles_m - first_m, GROUP_M)  # the last group may have fewer rows
    pid_m = first_m + (pid % in_group) % rows  # down the group's rows first,
    pid_n = (pid % in_group) // rows  # then one column to the right
    tl.store(Order + pid_m * tiles_n + pid_n, pid)
    _matmul_tile(
        A, B, C, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
        stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip


def grouped_matmul(
    a: torch.Tensor, b: torch.Tensor, *, group_m: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    """``a @ b`` as ``matmul`` computes it, its tiles handed out in grouped order (Triton's
    tutorial 03): -> ``(c (M, N), order (tiles_m, tiles_n))``, ``order`` the program that
    computed each tile. ``group_m = 1`` is row-major order, one row of tiles after another."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(
            f"matmul takes a (M, K) and b (K, N), got {tuple(a.shape)}, {tuple(b.shape)}"
        )
    if not (a.dtype == b.dtype == torch.float32):
        raise TypeError("the tutorial's matmul takes float32 operands")
    if group_m < 1:
        raise ValueError(f"group_m must be at least 1, got {group_m}")
    (M, K), N = a.shape, b.shape[1]
    tile = MATMUL_CONFIGS[0].kwargs  # one configuration: its tiles size the order's table
    tiles_m, tiles_n = triton.cdiv(M, tile["BLOCK_M"]), triton.cdiv(N, tile["BLOCK_N"])
    c = torch.empty((M, N), device=a.device, dtype=torch.float32)  # (M, N)
    order = torch.full((tiles_m, tiles_n), -1, device=a.device, dtype=torch.int32)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    _grouped_matmul_kernel[grid](
        a, b, c, order, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        c.stride(0), c.stride(1), GROUP_M=group_m,
    )  # fmt: skip
    return c, order


def program_order(tiles_m: int, tiles_n: int, group_m: int) -> list[tuple[int, int]]:
    """The tile ``(pid_m, pid_n)`` of C that program ``pid`` computes, for every ``pid``:
    ``_grouped_matmul_kernel``'s arithmetic, in Python, for sizes too large to launch."""
    out = []
    for pid in range(tiles_m * tiles_n):
        in_group = group_m * tiles_n
        first_m = (pid // in_group) * group_m
        rows = min(tiles_m - first_m, group_m)
        out.append((first_m + (pid % in_group) % rows, (pid % in_group) // rows))
    return out


# ----------------------------------------------------------------------------- 1. softmax_rows


@triton.jit
def _softmax_rows_kernel(
    X,  # (R, C) input, each row contiguous
    Y,  # (R, C) output, each row contiguous
    stride_x,  # elements from one row of X to the next
    stride_y,  # elements from one row of Y to the next
    C,  # the true number of columns
    BLOCK: tl.constexpr,  # a power of two >= C: one program holds a whole row
):
    row = tl.program_id(0)  # which row this program owns: 0 .. R-1, one per grid entry
    cols = tl.arange(0, BLOCK)  # (BLOCK,) column offsets, a compile-time size
    inside = cols < C  # columns past C are the block's padding: never read, never written
    x = tl.load(X + row * stride_x + cols, mask=inside, other=float("-inf"))  # (BLOCK,)
    x = x - tl.max(x, axis=0)  # padding stays -inf, so exp gives it exactly 0
    e = tl.exp(x)
    tl.store(Y + row * stride_y + cols, e / tl.sum(e, axis=0), mask=inside)


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``softmax(x, dim=-1)`` of a 2-D ``x (R, C)`` whose rows are contiguous: one program per row."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(
            f"softmax_rows takes a 2-D tensor with contiguous rows, got {tuple(x.shape)}"
        )
    R, C = x.shape
    y = torch.empty((R, C), device=x.device, dtype=x.dtype)  # (R, C), contiguous
    _softmax_rows_kernel[(R,)](x, y, x.stride(0), y.stride(0), C, BLOCK=triton.next_power_of_2(C))
    return y


# ----------------------------------------------------------------------------- 2. attention_v2


@triton.jit
def _attention_v2_kernel(
    Q,  # (N, T, Dh) queries, contiguous; N = B * H
    K,  # (N, S, Dh) keys, contiguous
    V,  # (N, S, Dh) values, contiguous
    Out,  # (N, T, Dh) output
    T,  # number of queries
    S,  # number of keys
    DH,  # true head width
    qk_scale,  # softmax scale * log2(e): exp2 of these scores is exp of the scaled scores
    BLOCK_M: tl.constexpr,  # queries per program
    BLOCK_N: tl.constexpr,  # keys per loop iteration
    BLOCK_DH: tl.constexpr,  # DH padded to a power of two >= 16 (tl.dot's minimum)
):
    start_m = tl.program_id(0) * BLOCK_M  # this program's query tile
    n = tl.program_id(1)  # this program's (batch, head)
    offs_m = start_m + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query indices
    offs_d = tl.arange(0, BLOCK_DH)  # (BLOCK_DH,) feature indices
    in_head = offs_d[None, :] < DH  # (1, BLOCK_DH): padded features load as 0, adding nothing
    q = tl.load(
        Q + n * T * DH + offs_m[:, None] * DH + offs_d[None, :],
        mask=(offs_m[:, None] < T) & in_head,
        other=0.0,
    )  # (BLOCK_M, BLOCK_DH), in registers for the whole loop

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max of each row
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(s - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_DH], dtype=tl.float32)  # running sum of exp2(s - m_i) v
    for start_n in range(0, S, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key indices of this tile
        rows = n * S * DH + offs_n[:, None] * DH + offs_d[None, :]  # (BLOCK_N, BLOCK_DH)
        k = tl.load(K + rows, mask=(offs_n[:, None] < S) & in_head, other=0.0)
        v = tl.load(V + rows, mask=(offs_n[:, None] < S) & in_head, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # (BLOCK_M, BLOCK_N)
        s = tl.where(offs_n[None, :] < S, s, float("-inf"))  # the last tile's padding keys
        m_new = tl.maximum(m_i, tl.max(s, 1))  # (BLOCK_M,)
        p = tl.math.exp2(s - m_new[:, None])  # (BLOCK_M, BLOCK_N), in [0, 1]
        alpha = tl.math.exp2(m_i - m_new)  # rescales the old state to the new max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new

    out = acc / l_i[:, None]  # (BLOCK_M, BLOCK_DH)
    tl.store(
        Out + n * T * DH + offs_m[:, None] * DH + offs_d[None, :],
        out,
        mask=(offs_m[:, None] < T) & in_head,
    )


def _heads(q, k, v):
    """``(B,H,T,Dh)``, ``(B,H,S,Dh)`` float32 -> contiguous ``(B*H, T, Dh)``, ``(B*H, S, Dh)``."""
    if not (q.dtype == k.dtype == v.dtype == torch.float32):
        raise TypeError("the tutorial kernels take float32 q, k and v")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q (B,H,T,Dh), k and v (B,H,S,Dh); got {q.shape}, {k.shape}, {v.shape}")
    return [x.reshape(-1, x.shape[-2], x.shape[-1]).contiguous() for x in (q, k, v)]


def attention_v2(q, k, v, *, scale=None, block_m=16, block_n=16):
    """``softmax(q kᵀ * scale) v`` over every key: ``q (B,H,T,Dh)``, ``k, v (B,H,S,Dh)`` float32."""
    B, H, T, Dh = q.shape
    S = k.shape[2]
    q3, k3, v3 = _heads(q, k, v)
    out = torch.empty_like(q3)  # (B*H, T, Dh)
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    grid = (triton.cdiv(T, block_m), B * H)  # one program per (query tile, batch x head)
    _attention_v2_kernel[grid](
        q3, k3, v3, out, T, S, Dh, scale * LOG2E,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_DH=max(16, triton.next_power_of_2(Dh)),
    )  # fmt: skip
    return out.view(B, H, T, Dh)


# ----------------------------------------------------------------------------- 3. attention_v3


@triton.jit
def _attend_tiles(
    q, m_i, l_i, acc,  # the query tile and its online-softmax state
    K, V, n, offs_m, offs_d, T, S, DH, qk_scale,
    lo, hi,  # the key tiles [lo, hi) to walk, lo on a tile boundary
    MASKED: tl.constexpr,  # apply the causal rule (tiles on the diagonal) or not (tiles below it)
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Version 2's loop over the keys ``[lo, hi)``; with ``MASKED`` the causal rule too."""
    in_head = offs_d[None, :] < DH
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        rows = n * S * DH + offs_n[:, None] * DH + offs_d[None, :]  # (BLOCK_N, BLOCK_DH)
        k = tl.load(K + rows, mask=(offs_n[:, None] < S) & in_head, other=0.0)
        v = tl.load(V + rows, mask=(offs_n[:, None] < S) & in_head, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # (BLOCK_M, BLOCK_N)
        if MASKED:  # bottom-right: query i sits at i + (S - T) and sees the keys up to there
            visible = (offs_n[None, :] <= offs_m[:, None] + (S - T)) & (offs_n[None, :] < S)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _attention_v3_kernel(
    Q, K, V, Out,  # as version 2's: (N, T, Dh), (N, S, Dh), (N, S, Dh), (N, T, Dh)
    T, S, DH, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DH: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0) * BLOCK_M
    n = tl.program_id(1)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_DH)
    in_tile = (offs_m[:, None] < T) & (offs_d[None, :] < DH)
    q = tl.load(Q + n * T * DH + offs_m[:, None] * DH + offs_d[None, :], mask=in_tile, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DH], dtype=tl.float32)

    # The tile's first query sits at start_m + S - T: the key tiles wholly at or before
    # that key are seen in full by every query of the tile, and need no mask at all.
    full_end = ((start_m + S - T + 1) // BLOCK_N) * BLOCK_N
    # One past the last key the tile's last query sees: the tiles after it are skipped.
    end = tl.minimum(S, start_m + BLOCK_M + S - T)
    m_i, l_i, acc = _attend_tiles(
        q, m_i, l_i, acc, K, V, n, offs_m, offs_d, T, S, DH, qk_scale, 0, full_end,
        False, BLOCK_N,
    )  # fmt: skip
    m_i, l_i, acc = _attend_tiles(
        q, m_i, l_i, acc, K, V, n, offs_m, offs_d, T, S, DH, qk_scale, full_end, end,
        True, BLOCK_N,
    )  # fmt: skip
    tl.store(
        Out + n * T * DH + offs_m[:, None] * DH + offs_d[None, :], acc / l_i[:, None], mask=in_tile
    )


def tile_plan(T: int, S: int, block_m: int = 16, block_n: int = 16) -> list[tuple[int, int, int]]:
    """What version 3 does per query tile, as the kernel computes it: ``(start_m, full_end,
    end)``, the unmasked key tiles ``[0, full_end)`` and the masked ones ``[full_end, end)``."""
    return [
        (m, (m + S - T + 1) // block_n * block_n, min(S, m + block_m + S - T))
        for m in range(0, T, block_m)
    ]


def attention_v3(q, k, v, *, scale=None, block_m=16, block_n=16):
    """Bottom-right causal attention: ``q (B,H,T,Dh)``, ``k, v (B,H,S,Dh)`` float32, ``T <= S``
    (with more queries than keys the first ones would see nothing)."""
    B, H, T, Dh = q.shape
    S = k.shape[2]
    if T > S:
        raise ValueError(f"causal attention needs T <= S (got T={T}, S={S}): query 0 sees no key")
    q3, k3, v3 = _heads(q, k, v)
    out = torch.empty_like(q3)
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    grid = (triton.cdiv(T, block_m), B * H)
    _attention_v3_kernel[grid](
        q3, k3, v3, out, T, S, Dh, scale * LOG2E,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_DH=max(16, triton.next_power_of_2(Dh)),
    )  # fmt: skip
    return out.view(B, H, T, Dh)
