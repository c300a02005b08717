"""The few-rows product (levels/level3_sdpa_flash/rows.cpp) against the float64 product.

``rows_linear(x (M, K), w (N, K), scale)`` sums in float32 in 16 lanes and a tree, another
order than any reference's, so each output is held to the float32 dot product's bound:
``|y - x @ w.T| <= K * 2^-24 * (|x| @ |w|.T)`` (each of the K products and sums rounds once,
relative 2^-24 at most), plus half a bfloat16 step of ``|y|`` where the output is rounded
to bfloat16 (2^-8 relative). The sizes are the awkward ones: every row count the check of guesses uses
(1..9, which the kernel splits into chunks of at most 6), K below, at and past a multiple of
16 (the masked tail), N not a multiple of 4 (the blocks of one output). Hand-made cases whose
sums are exact integers must come out exactly. Where the kernel cannot be built (no C++
compiler, no AVX-512), the compiled step keeps inductor's loops and says so, once.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

from levels.level3_sdpa_flash import compiled, rows

needs_kernel = pytest.mark.skipif(
    rows.missing() is not None, reason=f"the few-rows kernel cannot run here: {rows.missing()}"
)
SIZES = [(1, 1), (3, 15), (5, 16), (7, 17), (4, 33), (9, 100), (13, 576)]  # (N, K)


def _bound(x, w, scale=None):
    """The float32 dot product's bound on each output, (M, N), float64."""
    K = x.shape[1]
    size = x.double().abs() @ w.double().abs().T  # (M, N)
    if scale is not None:
        size = size * scale.double().abs()
    return (K + 1) * 2.0**-24 * size  # K rounded products and sums, and the scale's product


def _reference(x, w, scale=None):
    y = x.double() @ w.double().T  # (M, N): the weights' own values, exactly
    return y if scale is None else y * scale.double()


@needs_kernel
@pytest.mark.parametrize("M", range(1, 10))
@pytest.mark.parametrize("N,K", SIZES)
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
def test_rows_linear_is_the_product_within_float32_rounding(M, N, K, fmt):
    assert rows.available()
    gen = torch.Generator().manual_seed(M * 1000 + N * 10 + K)
    x = torch.randn(M, K, generator=gen)  # (M, K)
    w = torch.randn(N, K, generator=gen)  # (N, K)
    scale = None
    if fmt == "bfloat16":
        w = w.bfloat16()
    elif fmt == "int8":
        w = torch.randint(-127, 128, (N, K), generator=gen, dtype=torch.int8)
        scale = (torch.rand(N, generator=gen) / 127).bfloat16()  # as quant.py keeps it
    y = rows.rows_linear(x, w, scale)
    assert y.shape == (M, N) and y.dtype == torch.float32
    assert ((y.double() - _reference(x, w, scale)).abs() <= _bound(x, w, scale)).all()


@needs_kernel
@pytest.mark.parametrize("M", [1, 3, 9])
def test_bfloat16_activations_come_back_rounded_once(M):
    """A bfloat16 model's product: bfloat16 in and out, float32 sums, one rounding at the end
    (half a bfloat16 step: 2^-8 of the output, its 8 significant bits, besides the sums' bound)."""
    gen = torch.Generator().manual_seed(M)
    x = torch.randn(M, 67, generator=gen).bfloat16()
    w = torch.randn(11, 67, generator=gen).bfloat16()
    y = rows.rows_linear(x, w)
    assert y.dtype == torch.bfloat16
    want = _reference(x, w)
    assert ((y.double() - want).abs() <= _bound(x, w) + 2.0**-8 * want.abs() * (1 + 2**-8)).all()


@needs_kernel
def test_exact_sums_come_out_exactly():
    """Small integers: every product and partial sum is exact in float32, whatever the order,
    so the kernel must give the integers themselves, tails and chunks included."""
    K = 37  # two full vectors and a tail of 5
    x = torch.arange(9 * K, dtype=torch.float32).reshape(9, K) % 7 - 3  # (9, K), -3..3
    w = torch.arange(6 * K, dtype=torch.float32).reshape(6, K) % 5 - 2  # (6, K), -2..2
    assert torch.equal(rows.rows_linear(x, w), x @ w.T)
    q = torch.tensor([[127, -127, 1], [-128, 0, 2]], dtype=torch.int8)
    scale = torch.tensor([0.5, 0.25])
    got = rows.rows_linear(torch.tensor([[1.0, 1.0, 2.0]]), q, scale)
    assert got.tolist() == [[1.0, -31.0]]  # (127 - 127 + 2) / 2, (-128 + 4) / 4
    assert rows.rows_linear(torch.ones(2, 4), torch.zeros(0, 4)).shape == (2, 0)


@needs_kernel
def test_the_compiled_steps_products_call_the_kernel():
    """What the compiled step traces for a product (compiled.few_rows_linear): the kernel
    for float32 at 2..9 rows and bfloat16 at 1..9, inductor's loop or the GEMM otherwise."""
    w32, w16 = torch.randn(5, 8), torch.randn(5, 8).bfloat16()
    assert not compiled._by_kernel(1, w32) and compiled._by_kernel(2, w32)
    assert compiled._by_kernel(9, w32) and not compiled._by_kernel(10, w32)
    assert compiled._by_kernel(1, w16) and not compiled._by_kernel(1, w32.double())
    x = torch.randn(1, 3, 8)  # (B, T, in): a pass of 3 tokens
    want = (x.double() @ w32.double().T).float()
    assert torch.allclose(compiled.few_rows_linear(x, w32), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "setting,why",
    [
        ({"CXX": "ladder-no-c++-compiler"}, "no C++ compiler (ladder-no-c++-compiler) on PATH"),
        ({"LADDER_ROWS_KERNEL": "0"}, "LADDER_ROWS_KERNEL=0"),
    ],  # fmt: skip
)
def test_without_the_kernel_the_step_keeps_inductors_loops_and_says_so_once(
    setting, why, monkeypatch
):
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    rows.available.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert not rows.available() and not rows.available()  # the second asks nothing
        assert [str(w.message) for w in caught] == [
            f"the few-rows kernel is off, inductor's loops instead: {why}"
        ]
        w, x = torch.randn(5, 8), torch.randn(3, 8)  # (out, in), (M, in)
        assert not compiled._by_kernel(3, w)
        want = x.double() @ w.double().T  # the dot products per row and output, float32
        # One dot product of 8 float32 products: within 1e-5 of values of order 1.
        assert torch.allclose(compiled.few_rows_linear(x, w).double(), want, atol=1e-5)
    finally:
        rows.available.cache_clear()  # the next caller asks again, without these settings


def test_a_cpu_without_avx512_is_said(monkeypatch):
    monkeypatch.setenv("CXX", sys.executable)  # a compiler found (any file that runs will do)
    monkeypatch.delenv("LADDER_ROWS_KERNEL", raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert rows.missing() == "the CPU has no AVX-512 (torch reads AVX2)"
