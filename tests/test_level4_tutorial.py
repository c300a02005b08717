"""The tutorial kernels of level 4's chapter (levels/level4_triton_kernel/tutorial.py) against
PyTorch and level 2, on awkward sizes: partial blocks and tiles at every edge, a padded head
width, ``T != S``, a transposed operand. They are not part of the rung; these tests keep the
chapter's kernels honest."""

from __future__ import annotations

import pytest
import torch

import levels

try:
    levels.load("level4_triton_kernel")
except levels.LevelUnavailable as exc:  # no triton: the chapter's blocks are skipped too
    pytest.skip(f"level 4 is unavailable: {exc}", allow_module_level=True)

import triton  # noqa: E402

from levels.level4_triton_kernel import tutorial  # noqa: E402
from levels.level4_triton_kernel.tiles import interpreting  # noqa: E402

L2 = levels.load("level2_torch_manual")
DEVICE = "cpu" if interpreting() else "cuda"  # the interpreter takes CPU tensors, a GPU CUDA ones


def _qkv(B, H, T, S, Dh, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dh, generator=g)  # (B,H,T,Dh)
    k = torch.randn(B, H, S, Dh, generator=g)  # (B,H,S,Dh)
    v = torch.randn(B, H, S, Dh, generator=g)
    return (x.to(DEVICE) for x in (q, k, v))


@pytest.mark.parametrize("N,block", [(1823, 64), (1, 64), (64, 64), (65, 16), (1000, 128)])
def test_add_matches_torch_and_writes_nothing_past_the_end(N, block):
    """Exact (one rounding, as torch's), and the lanes past N touch nothing: the output
    lives in a larger buffer whose tail must keep its NaN."""
    g = torch.Generator().manual_seed(N)
    x, y = (torch.randn(N, generator=g).to(DEVICE) for _ in range(2))
    buffer = torch.full((N + block,), float("nan"), device=DEVICE)
    z = buffer[:N]
    tutorial._add_kernel[(triton.cdiv(N, block),)](x, y, z, N, BLOCK=block)
    assert torch.equal(z, x + y)
    assert buffer[N:].isnan().all()
    assert torch.equal(tutorial.add(x, y, block=block), x + y)


def test_add_refuses_what_it_cannot_index():
    x = torch.zeros(8, 2, device=DEVICE)
    with pytest.raises(ValueError, match="contiguous 1-D"):
        tutorial.add(x, x)
    with pytest.raises(ValueError, match="contiguous 1-D"):
        tutorial.add(x[:, 0], x[:, 0])  # a strided view


@pytest.mark.parametrize(
    "M,K,N", [(37, 29, 41), (1, 7, 1), (64, 64, 64), (17, 100, 3), (50, 16, 33)]
)
@pytest.mark.parametrize("blocks", [(16, 16, 16), (32, 16, 64), (16, 64, 32)])
def test_matmul_matches_float64(M, K, N, blocks):
    """float32 products summed in float32: about K * eps relative to the size of a sum of K
    products of standard normals (sqrt(K)), so 1e-5 * sqrt(K) absolute, with room."""
    g = torch.Generator().manual_seed(M * K * N)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    want = a.double() @ b.double()
    bm, bn, bk = blocks
    got = tutorial.matmul(a.to(DEVICE), b.to(DEVICE), block_m=bm, block_n=bn, block_k=bk)
    torch.testing.assert_close(got.cpu().double(), want, atol=1e-5 * K**0.5, rtol=1e-5)


def test_matmul_reads_a_transposed_operand_in_place():
    """``q @ k.T`` as attention's scores take it: b is a (Dh, S) view of a (S, Dh) tensor."""
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(13, 24, generator=g), torch.randn(29, 24, generator=g)
    got = tutorial.matmul(q.to(DEVICE), k.to(DEVICE).t())
    torch.testing.assert_close(
        got.cpu().double(), q.double() @ k.double().t(), atol=1e-5, rtol=1e-5
    )


def test_matmul_never_reads_past_an_edge():
    """a and b are views into buffers padded with NaN past their edges (columns of a, rows
    of b); a lane that read the padding would multiply NaN by the other side's masked 0."""
    M, K, N = 21, 37, 19
    g = torch.Generator().manual_seed(4)
    a_buf = torch.full((M, K + 16), float("nan"))
    b_buf = torch.full((K + 16, N + 16), float("nan"))
    a_buf[:, :K], b_buf[:K, :N] = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    a, b = a_buf.to(DEVICE)[:, :K], b_buf.to(DEVICE)[:K, :N]  # strided views, NaN beyond
    got = tutorial.matmul(a, b)
    torch.testing.assert_close(
        got.cpu().double(), a.cpu().double() @ b.cpu().double(), atol=1e-4, rtol=1e-5
    )


def test_matmul_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="matmul takes"):
        tutorial.matmul(torch.zeros(3, 4, device=DEVICE), torch.zeros(5, 6, device=DEVICE))


@pytest.mark.parametrize("R,C", [(7, 13), (3, 1), (5, 100), (1, 16)])
def test_softmax_rows_matches_torch(R, C):
    x = (torch.randn(R, C, generator=torch.Generator().manual_seed(R * C)) * 5).to(DEVICE)
    torch.testing.assert_close(tutorial.softmax_rows(x), x.softmax(-1), atol=1e-6, rtol=1e-6)


def test_softmax_rows_reads_rows_with_a_stride():
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(1)).to(DEVICE)[:, :25]
    torch.testing.assert_close(tutorial.softmax_rows(x), x.softmax(-1), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("T,S,Dh", [(13, 29, 24), (1, 7, 4), (37, 37, 16), (20, 3, 33)])
def test_attention_v2_is_attention_over_every_key(T, S, Dh):
    q, k, v = _qkv(2, 3, T, S, Dh)
    want = L2.attention(q.cpu().double(), k.cpu().double(), v.cpu().double())
    got = tutorial.attention_v2(q, k, v).cpu().double()
    assert (got - want).abs().max() < 1e-5


@pytest.mark.parametrize(
    "T,S,Dh", [(13, 29, 24), (1, 7, 4), (37, 37, 16), (16, 48, 8), (33, 40, 16)]
)
@pytest.mark.parametrize("blocks", [(16, 16), (16, 32), (32, 16)])
def test_attention_v3_is_bottom_right_causal_attention(T, S, Dh, blocks):
    q, k, v = _qkv(1, 2, T, S, Dh, seed=T + S)
    want = L2.attention(q.cpu().double(), k.cpu().double(), v.cpu().double(), causal=True)
    got = tutorial.attention_v3(q, k, v, block_m=blocks[0], block_n=blocks[1]).cpu().double()
    assert (got - want).abs().max() < 1e-5


# The interpreter's numpy reductions warn about the NaN rows this probe creates on purpose.
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")
def test_attention_v3_never_loads_the_tiles_past_the_diagonal():
    """Keys 32..63 poisoned with NaN: query tiles 0 and 1 (rows 0..31) must stop before them."""
    q, k, v = _qkv(1, 1, 64, 64, 16)
    k, v = k.clone(), v.clone()
    k[:, :, 32:], v[:, :, 32:] = float("nan"), float("nan")
    out = tutorial.attention_v3(q, k, v)
    want = L2.attention(q[:, :, :32].cpu(), k[:, :, :32].cpu(), v[:, :, :32].cpu(), causal=True)
    torch.testing.assert_close(out[:, :, :32].cpu(), want, atol=1e-5, rtol=1e-5)
    assert out[:, :, 32:].isnan().all()


@pytest.mark.parametrize("T,S", [(13, 29), (64, 64), (37, 37), (5, 80)])
def test_the_unmasked_tiles_are_exactly_those_every_query_sees_in_full(T, S):
    """tile_plan's split, against the position rule pair by pair: every key of a tile below
    ``full_end`` is visible to every query of the tile, and the first tile from there is not."""
    bm = bn = 16
    for start_m, full_end, end in tutorial.tile_plan(T, S, bm, bn):
        queries = range(start_m, min(T, start_m + bm))
        assert all(j <= i + S - T for i in queries for j in range(full_end))
        if full_end < end:
            tile = range(full_end, min(S, full_end + bn))
            assert not all(j <= i + S - T for i in queries for j in tile)
        assert end == min(S, max(queries) + S - T + 1 + (bm - len(queries)))


def test_attention_v3_refuses_more_queries_than_keys():
    q, k, v = _qkv(1, 1, 5, 3, 4)
    with pytest.raises(ValueError, match="T <= S"):
        tutorial.attention_v3(q, k, v)


# ----------------------------------------------------------------------------- C. grouped order


@pytest.mark.parametrize("M,K,N", [(70, 40, 100), (16, 16, 16), (129, 17, 33)])
@pytest.mark.parametrize("group_m", [1, 3, 4, 8])
def test_grouped_matmul_matches_float64_in_any_order(M, K, N, group_m):
    """Every tile computed once whatever the order (3 leaves a short last group of rows at
    70 and 129 rows, 8 more rows than 16 has); float32 sums of K products, as above."""
    g = torch.Generator().manual_seed(M + K + N + group_m)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    c, order = tutorial.grouped_matmul(a.to(DEVICE), b.to(DEVICE), group_m=group_m)
    torch.testing.assert_close(
        c.cpu().double(), a.double() @ b.double(), atol=1e-5 * K**0.5, rtol=1e-5
    )
    tiles_m, tiles_n = order.shape
    assert sorted(order.flatten().tolist()) == list(range(tiles_m * tiles_n))  # a permutation
    # The kernel's order is the one program_order computes (which the chapter uses at sizes
    # too large to launch under the interpreter).
    for pid, (m, n) in enumerate(tutorial.program_order(tiles_m, tiles_n, group_m)):
        assert order[m, n].item() == pid


def test_grouped_order_walks_down_a_group_before_moving_right():
    """Five rows of tiles in groups of two: programs 0, 1 take column 0 of rows 0, 1; the last
    group holds one row, walked left to right. group_m = 1 is row-major."""
    order = tutorial.program_order(5, 3, 2)
    assert order[:4] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert order[-3:] == [(4, 0), (4, 1), (4, 2)]
    assert tutorial.program_order(2, 3, 1) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_grouped_matmul_refuses_a_group_of_no_rows():
    with pytest.raises(ValueError, match="group_m"):
        tutorial.grouped_matmul(
            torch.zeros(16, 16, device=DEVICE), torch.zeros(16, 16, device=DEVICE), group_m=0
        )
