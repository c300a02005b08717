"""Level 4's own kernel tests: flash attention (forward and backward) and fused LayerNorm.

The shared suite drives level 4 through the common interface; this file checks
what only a kernel can get wrong: partial tiles (T, S, head widths that are not
multiples of the tile), padded head widths, T != S, the bottom-right causal
bound skipping whole tiles, stride-0 masks, and the gradients of the backward
kernels. Every expected value comes from float64 torch (autograd for the
gradients), never from the code under test.

On CPU the kernels run in Triton's interpreter: float32 and float16 only
(bfloat16 is wrong there), small shapes. ``pytest --device cuda`` runs the
same tests on a GPU and adds bfloat16; float16 / bfloat16 are held to the
flash-attention rule: at most twice PyTorch SDPA's own error in that dtype,
both measured against the float64 reference.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np
import pytest
import torch
from _helpers import count_kernel_launches

import levels

try:
    L4 = levels.load("level4_triton_kernel")
except levels.LevelUnavailable as exc:  # no triton here: say so, do not pretend
    pytest.skip(str(exc), allow_module_level=True)

from levels.level4_triton_kernel.tiles import Tiles  # noqa: E402

# fp32: the kernels sum in a different order than the float64 reference (tiles
# of 16 keys, online rescaling by exp2(m_old - m_new)); with O(1) inputs that
# costs a few ulps (eps = 1.2e-7) per accumulated term: ~1e-6 observed, 2e-5 allowed.
# Backward sums over up to max(T, S) ~ 64 terms of products of O(1) values.
FP32_ATOL = FP32_RTOL = 2e-5
# fp16/bf16: no fixed number is honest; the level may be at most twice as far
# from float64 as PyTorch's own SDPA in the same dtype, plus a floor of a few
# ulps of O(1) values for when PyTorch happens to be nearly exact.
LOWP_FACTOR = 2.0
LOWP_FLOOR = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def tiles_for(device: str) -> Tiles | None:
    """The interpreter's fixed tiles on CPU; one pinned tile on a GPU.

    Autotuning each of these small test shapes on a GPU would compile every
    candidate configuration of three kernels per shape (minutes); the tests pin
    one tile instead, and ``test_autotuned_kernels_at_scale`` checks the
    autotuned path at large sizes.
    """
    return None if device == "cpu" else Tiles(block_m=32, block_n=16)


def dtypes_here(device: str) -> list[torch.dtype]:
    # bfloat16 is emulated wrongly by the interpreter: GPU only.
    if device == "cuda":
        return [torch.float32, torch.float16, torch.bfloat16]
    return [torch.float32, torch.float16]


# ---------------------------------------------------------------------------
# float64 references
# ---------------------------------------------------------------------------


def allowed_pairs(
    T: int, S: int, causal: bool, mask: torch.Tensor | None, window: int | None = None
) -> torch.Tensor:
    """Bool, broadcastable to (B,H,T,S): bottom-right causal rule, window and mask combined."""
    ok = torch.ones(T, S, dtype=torch.bool, device=mask.device if mask is not None else "cpu")
    d = torch.arange(T, device=ok.device)[:, None] + (S - T)  # each query's place among the keys
    j = torch.arange(S, device=ok.device)[None, :]
    if causal:
        ok = ok & (j <= d)
    if window is not None:
        ok = ok & ((j > d - window) if causal else ((j - d).abs() < window))
    return ok if mask is None else ok & mask


def reference_attention(q, k, v, *, causal=False, mask=None, scale=None, window=None):
    """softmax(q k^T * scale, masked) v in the inputs' dtype (float64 in these tests);
    ``k, v`` may have fewer heads than ``q`` (each serves H // Hkv query heads)."""
    T, S = q.shape[-2], k.shape[-2]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # (B,H,S,*)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale  # (B,H,T,S)
    allowed = allowed_pairs(T, S, causal, mask, window).to(q.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v  # (B,H,T,Dv)


def sdpa_same_dtype(q, k, v, *, causal, mask):
    """PyTorch's own attention in the inputs' (low) dtype: the baseline error."""
    ok = allowed_pairs(q.shape[-2], k.shape[-2], causal, mask).to(q.device)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=ok)


def make_mask(kind: str, B: int, H: int, T: int, S: int, gen: torch.Generator):
    """None, key padding (B,1,1,S), a general (B,1,T,S) mask, or a full (B,H,T,S) one.

    Every row keeps key 0 and key S - 1 allowed so no row is empty whether or
    not causal is on (row i always sees key 0 when T <= S).
    """
    if kind == "none":
        return None
    if kind == "padding":
        lengths = torch.randint(1, S + 1, (B,), generator=gen)
        lengths[0] = S
        return (torch.arange(S)[None, :] < lengths[:, None])[:, None, None, :]  # (B,1,1,S)
    shape = (B, 1, T, S) if kind == "general" else (B, H, T, S)
    mask = torch.rand(shape, generator=gen) < 0.6
    mask[..., 0] = True
    mask[..., -1] = True
    return mask


def check_lowp(actual, expected, baseline, dtype, what):
    err = (actual.double() - expected).abs().max().item()
    base = (baseline.double() - expected).abs().max().item()
    bound = LOWP_FACTOR * base + LOWP_FLOOR[dtype]
    assert err <= bound, f"{what}: max error {err:.3e} > {LOWP_FACTOR} x SDPA's {base:.3e} + floor"


def check_fp32(actual, expected, what):
    torch.testing.assert_close(
        actual.double().cpu(), expected.cpu(), atol=FP32_ATOL, rtol=FP32_RTOL, msg=what
    )


def random_qkv(seed: int, B: int, H: int, T: int, S: int, Dh: int, Dv: int | None = None):
    """float64 ``q (B,H,T,Dh)``, ``k (B,H,S,Dh)``, ``v (B,H,S,Dv)`` and an upstream
    gradient ``d_out (B,H,T,Dv)``, all standard normal."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((T, Dh), (S, Dh), (S, Dv or Dh), (T, Dv or Dh))
    return [torch.randn(B, H, n, d, generator=gen, dtype=torch.float64) for n, d in shapes]


def with_grads(fn, q, k, v, d_out, *, dtype=torch.float64, device="cpu"):
    """``[out, dq, dk, dv]`` of ``fn(q, k, v)`` for the upstream gradient ``d_out``,
    with the inputs cast to ``dtype`` on ``device``."""
    ins = [x.detach().to(device, dtype).requires_grad_() for x in (q, k, v)]
    out = fn(*ins)
    out.backward(d_out.to(device, dtype))
    return [out.detach(), *(x.grad for x in ins)]


def ours(device, **kw):
    """Level 4's attention with this device's test tiles; ``kw``: causal, mask, window, tiles, scale."""
    kw.setdefault("tiles", tiles_for(device))
    if kw.get("mask") is not None:
        kw["mask"] = kw["mask"].to(device)
    return functools.partial(L4.attention, **kw)


def reference(**kw):
    return functools.partial(reference_attention, **kw)


GRAD_NAMES = ("output", "dq", "dk", "dv")


# ---------------------------------------------------------------------------
# attention: forward and backward against float64 autograd
# ---------------------------------------------------------------------------

# (T, S, Dh, Dv, causal, mask kind): odd lengths, T != S both ways, head widths
# that need padding (4, 12, 24, 40, 80 -> 16, 16, 32, 64, 128), Dv != Dh.
SHAPES = [
    (13, 29, 24, 24, False, "none"),
    (13, 29, 24, 24, True, "none"),
    (13, 29, 24, 24, False, "padding"),
    (13, 29, 24, 24, True, "general"),
    (29, 13, 24, 24, False, "general"),  # T > S is fine without causal
    (29, 29, 40, 40, True, "padding"),
    (17, 17, 4, 4, True, "none"),
    (20, 33, 12, 80, False, "full"),
    (1, 29, 80, 80, True, "padding"),  # decoding: one query against a cache
    (5, 37, 24, 24, True, "general"),  # a few new queries against a cache
]


@pytest.mark.parametrize("T,S,Dh,Dv,causal,mask_kind", SHAPES)
def test_attention_forward_backward_fp32(device, T, S, Dh, Dv, causal, mask_kind):
    q, k, v, d_out = random_qkv(T * 1000 + S * 10 + Dh, 2, 2, T, S, Dh, Dv)
    mask = make_mask(mask_kind, 2, 2, T, S, torch.Generator().manual_seed(T + S))
    got = with_grads(
        ours(device, causal=causal, mask=mask), q, k, v, d_out, dtype=torch.float32, device=device
    )
    want = with_grads(reference(causal=causal, mask=mask), q, k, v, d_out)
    for name, g, w in zip(GRAD_NAMES, got, want, strict=True):
        check_fp32(g, w, name)


# (T, S, H, Hkv, window, causal, mask kind): grouped heads (Hkv 1 and 2 of H = 4, and
# 3 of 6), windows shorter than a tile and longer than several, T != S, odd sizes.
GROUPED = [
    (13, 29, 4, 1, 5, True, "none"),
    (29, 29, 4, 2, 20, True, "padding"),
    (20, 45, 6, 3, 7, False, "general"),
    (45, 45, 4, 2, 3, True, "general"),
    (1, 37, 4, 1, 9, True, "padding"),  # decoding with a window: one query, a long cache
    (37, 20, 4, 2, 30, False, "none"),  # T > S, the band reaching back to the first keys
]


@pytest.mark.parametrize("T,S,H,Hkv,window,causal,mask_kind", GROUPED)
def test_grouped_heads_and_windows_forward_backward(
    device, T, S, H, Hkv, window, causal, mask_kind
):
    """dK and dV of a shared head are the sums over its group; windowed tiles are skipped."""
    gen = torch.Generator().manual_seed(T * S + H + Hkv)
    q, d_out = (torch.randn(2, H, T, 24, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(2, Hkv, S, 24, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = make_mask(mask_kind, 2, H, T, S, gen)
    if mask is not None:  # every row keeps the key at its own place (inside any window)
        mask = mask.expand(2, -1, T, S).clone()
        mask[..., torch.arange(T), (torch.arange(T) + S - T).clamp(0, S - 1)] = True
    kw = dict(causal=causal, mask=mask, window=window)
    got = with_grads(ours(device, **kw), q, k, v, d_out, dtype=torch.float32, device=device)
    want = with_grads(reference(**kw), q, k, v, d_out)
    for name, g, w in zip(GRAD_NAMES, got, want, strict=True):
        check_fp32(g, w, f"{name} Hkv={Hkv} W={window}")


# ---------------------------------------------------------------------------
# flash-decoding: the keys in slices, merged by their log-sum-exps
# ---------------------------------------------------------------------------

# (B, H, Hkv, T, S, window, causal, mask kind): one to three queries against caches of
# odd lengths, so slices end mid-tile and, with a window, some slices see no key at all.
DECODE = [
    (2, 4, 2, 1, 50, None, True, "padding"),
    (1, 4, 1, 3, 77, 9, True, "general"),
    (2, 2, 2, 2, 45, None, False, "general"),
    (1, 3, 3, 1, 100, 30, True, "none"),
]


@pytest.mark.parametrize("splits", [2, 3, 5])
@pytest.mark.parametrize("B,H,Hkv,T,S,window,causal,mask_kind", DECODE)
def test_flash_decoding_matches_float64(device, B, H, Hkv, T, S, window, causal, mask_kind, splits):
    from levels.level4_triton_kernel import flash_decode

    gen = torch.Generator().manual_seed(S + T + splits)
    q = torch.randn(B, H, T, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, S, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = make_mask(mask_kind, B, H, T, S, gen)
    kw = dict(causal=causal, window=window, mask=None if mask is None else mask.to(device))
    launched = []
    real = flash_decode._decode_split_kernel

    class Spy:  # records the grid, so the test knows the keys really were split
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]

    flash_decode._decode_split_kernel = Spy()
    try:
        with torch.no_grad():
            out, lse = L4.attention(
                *(x.to(device, torch.float32) for x in (q, k, v)),
                splits=splits,
                return_lse=True,
                **kw,
            )
    finally:
        flash_decode._decode_split_kernel = real
    assert launched and launched[0][0] > 1 and launched[0][1] == B * H
    want = reference_attention(q, k, v, causal=causal, mask=mask, window=window)
    check_fp32(out, want, f"flash-decoding, {splits} splits")
    # The merged log-sum-exp is that of all the keys (natural log, as return_lse promises).
    scores = (q @ k.repeat_interleave(H // Hkv, 1).transpose(-1, -2)) / 4.0  # scale 1/sqrt(16)
    allowed = allowed_pairs(T, S, causal, mask, window)
    want_lse = scores.masked_fill(~allowed, float("-inf")).logsumexp(-1)  # (B,H,T)
    check_fp32(lse, want_lse, "flash-decoding lse")


def test_decoding_with_gradients_takes_the_differentiable_kernel(device):
    q, k, v, d_out = random_qkv(3, 1, 2, 1, 40, 16)
    kw = dict(causal=True, splits=4)
    got = with_grads(ours(device, **kw), q, k, v, d_out, dtype=torch.float32, device=device)
    want = with_grads(reference(causal=True), q, k, v, d_out)
    for name, g, w in zip(GRAD_NAMES, got, want, strict=True):
        check_fp32(g, w, name)


def test_split_choice_fills_the_gpu_and_keeps_slices_long(monkeypatch):
    from types import SimpleNamespace

    from levels.level4_triton_kernel import flash_decode

    monkeypatch.setattr(flash_decode, "interpreting", lambda: False)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: SimpleNamespace(multi_processor_count=132)
    )
    gpu = torch.device("cuda")
    # Batch 1, 16 heads: 2 * 132 / 16 -> 17 slices, if the cache is long enough for them.
    assert flash_decode.choose_splits(16384, 16, gpu) == 17
    assert flash_decode.choose_splits(1024, 16, gpu) == 4  # slices of 256 keys at least
    assert flash_decode.choose_splits(200, 16, gpu) == 1
    assert flash_decode.choose_splits(16384, 512, gpu) == 1  # B * H fills the GPU already
    monkeypatch.setattr(flash_decode, "interpreting", lambda: True)
    assert flash_decode.choose_splits(16384, 1, gpu) == 1


def test_model_decode_steps_with_split_keys_give_the_forward_logits(device, monkeypatch):
    from levels import TransformerConfig, init_params
    from levels.level4_triton_kernel import flash_attention

    monkeypatch.setattr(flash_attention, "choose_splits", lambda S, BH, dev: 3)
    config = TransformerConfig(
        vocab_size=17, d_model=32, n_heads=2, d_ff=24, n_layers=1, max_seq_len=40, n_kv_heads=1
    )
    params = init_params(config, "decoder_only", seed=2, scheme="random")
    model = L4.DecoderOnlyTransformer(config, params, device=device)
    tokens = torch.randint(3, 17, (2, 38), generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        full = model(tokens)  # (B, 38, V)
        _, cache = model.prefill(tokens[:, :35])
        steps = [model.decode_step(tokens[:, t], cache) for t in range(35, 38)]
    for t, step in zip(range(35, 38), steps, strict=True):
        check_fp32(step, full[:, t].double(), f"decode step at {t}")


def test_splits_must_be_a_positive_integer(device):
    q = torch.zeros(1, 1, 1, 16, device=device)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="splits"):
            L4.attention(q, q, q, splits=bad)


# The interpreter's numpy reductions warn about the NaN rows these probes create on purpose.
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")
def test_windowed_tiles_before_the_window_are_never_loaded(device):
    """Queries 48..63 with a causal window of 16 see keys 33..63 at most: key tiles 0
    and 1 (keys 0..31) must be skipped by the forward and the dQ kernel, and the dK/dV
    programs of those key tiles must never read queries past 47 (NaN there proves it)."""
    q, k, v, d_out = random_qkv(13, 1, 2, 64, 64, 16)
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[:, :, :32] = float("nan")
    poisoned_v[:, :, :32] = float("nan")
    fn = ours(device, causal=True, window=16, tiles=PROBE_TILES)
    kw = {"dtype": torch.float32, "device": device}
    out, dq, _, _ = with_grads(fn, q, poisoned_k, poisoned_v, d_out, **kw)
    want_out, want_dq, _, _ = with_grads(reference(causal=True, window=16), q, k, v, d_out)
    check_fp32(out[:, :, 48:], want_out[:, :, 48:], "rows whose window starts past key 32")
    check_fp32(dq[:, :, 48:], want_dq[:, :, 48:], "dq of those rows")
    poisoned_q, poisoned_do = q.clone(), d_out.clone()
    poisoned_q[:, :, 48:] = float("nan")
    poisoned_do[:, :, 48:] = float("nan")
    _, _, dk, dv = with_grads(fn, poisoned_q, k, v, poisoned_do, **kw)
    _, _, want_dk, want_dv = with_grads(reference(causal=True, window=16), q, k, v, d_out)
    check_fp32(dk[:, :, :32], want_dk[:, :, :32], "dk of the keys no late query sees")
    check_fp32(dv[:, :, :32], want_dv[:, :, :32], "dv of those keys")


@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16)])
@pytest.mark.parametrize("T,S", [(13, 45), (45, 45)])
def test_attention_unequal_tiles(device, block_m, block_n, T, S):
    """Query and key tiles of different sizes: the causal loop bounds mix the two."""
    q, k, v, d_out = random_qkv(block_m + T, 1, 2, T, S, 16)
    mask = make_mask("general", 1, 2, T, S, torch.Generator().manual_seed(T))
    tiles = Tiles(block_m=block_m, block_n=block_n)
    fn = ours(device, causal=True, mask=mask, tiles=tiles)
    got = with_grads(fn, q, k, v, d_out, dtype=torch.float32, device=device)
    want = with_grads(reference(causal=True, mask=mask), q, k, v, d_out)
    for name, g, w in zip(GRAD_NAMES, got, want, strict=True):
        check_fp32(g, w, name)


@pytest.mark.parametrize(
    "T,S,Dh,causal,mask_kind", [(13, 29, 24, True, "padding"), (29, 29, 12, False, "general")]
)
def test_attention_low_precision(device, T, S, Dh, causal, mask_kind):
    """fp16 (and bf16 on a GPU): within twice SDPA's own error, output and gradients."""
    q, k, v, d_out = random_qkv(7, 2, 2, T, S, Dh)
    mask = make_mask(mask_kind, 2, 2, T, S, torch.Generator().manual_seed(7))
    want = with_grads(reference(causal=causal, mask=mask), q, k, v, d_out)
    for dtype in dtypes_here(device)[1:]:
        sdpa = functools.partial(
            sdpa_same_dtype, causal=causal, mask=None if mask is None else mask.to(device)
        )
        kw = {"dtype": dtype, "device": device}
        got = with_grads(ours(device, causal=causal, mask=mask), q, k, v, d_out, **kw)
        base = with_grads(sdpa, q, k, v, d_out, **kw)
        for name, g, b, w in zip(GRAD_NAMES, got, base, want, strict=True):
            check_lowp(g.cpu(), w, b.cpu(), dtype, f"{dtype} {name}")


# On a GPU: odd lengths far from any tile multiple and a head width (80) padded to
# 128, with the autotuned tiles; under the interpreter, the same checks at sizes
# it can run (a few seconds). Low precision under the flash-attention rule.
AT_SCALE = {
    "cuda": [(1000, 1537, 80, True), (1000, 1537, 80, False), (2048, 2048, 64, True)],
    "cpu": [(45, 70, 24, True), (45, 70, 24, False)],
}


def pytest_generate_tests(metafunc):
    """The sizes of ``test_autotuned_kernels_at_scale`` are the device's (``--device``)."""
    if "scale_shape" in metafunc.fixturenames:
        shapes = AT_SCALE[metafunc.config.getoption("--device")]
        ids = [f"T{T}-S{S}-Dh{Dh}-{'causal' if c else 'full'}" for T, S, Dh, c in shapes]
        metafunc.parametrize("scale_shape", shapes, ids=ids)


@pytest.mark.slow
def test_autotuned_kernels_at_scale(device, scale_shape):
    """Forward and backward with the tiles the kernels choose themselves (autotuned on a
    GPU), float16 and (GPU) bfloat16 within twice SDPA's own error, padding mask."""
    T, S, Dh, causal = scale_shape
    B, H = (2, 4) if device == "cuda" else (1, 2)
    q, k, v, d_out = random_qkv(T + S + Dh, B, H, T, S, Dh)
    mask = make_mask("padding", B, H, T, S, torch.Generator().manual_seed(T))
    want = with_grads(reference(causal=causal, mask=mask), q, k, v, d_out)
    for dtype in dtypes_here(device)[1:]:
        sdpa = functools.partial(sdpa_same_dtype, causal=causal, mask=mask.to(device))
        kw = {"dtype": dtype, "device": device}
        got = with_grads(ours(device, causal=causal, mask=mask, tiles=None), q, k, v, d_out, **kw)
        base = with_grads(sdpa, q, k, v, d_out, **kw)
        for name, g, b, w in zip(GRAD_NAMES, got, base, want, strict=True):
            check_lowp(g.cpu(), w, b.cpu(), dtype, f"{dtype} {name} T={T} S={S} Dh={Dh}")


def test_attention_strided_inputs_and_scale(device):
    """Non-contiguous q, k, v (the models pass transposed views) and a custom scale."""
    gen = torch.Generator().manual_seed(3)
    B, T, H, Dh = 2, 19, 3, 24
    x = torch.randn(B, T, 3, H, Dh, generator=gen, dtype=torch.float64)  # (B,T,3,H,Dh)
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))  # (B,H,T,Dh) views, not contiguous
    expected = reference_attention(q, k, v, causal=True, scale=0.3)
    x32 = x.to(device, torch.float32)
    q32, k32, v32 = (x32[:, :, i].transpose(1, 2) for i in range(3))
    assert not q32.is_contiguous()
    out = L4.attention(q32, k32, v32, causal=True, scale=0.3, tiles=tiles_for(device))
    check_fp32(out, expected, "strided output")


# ---------------------------------------------------------------------------
# tiles past the causal diagonal are skipped, not loaded and masked
# ---------------------------------------------------------------------------
# The probe: NaN placed in keys/values that some query tile must never load.
# A kernel that loaded the tile and masked it would still compute 0 * NaN = NaN
# in its p @ v (or dS^T q) product, so the finite result shows the tile was skipped.


# 16 x 16 tiles over T = S = 64: four query tiles, four key tiles, whatever the device.
PROBE_TILES = Tiles(block_m=16, block_n=16)


# The interpreter's numpy reductions warn about the NaN rows these probes create on purpose.
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")
def test_causal_forward_and_dq_skip_tiles_past_the_diagonal(device):
    q, k, v, d_out = random_qkv(11, 1, 2, 64, 64, 16)
    d_out[:, :, 32:] = 0.0  # only rows 0..31 are checked; the rest legitimately see NaN
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[:, :, 32:] = float("nan")  # key tiles 2 and 3
    poisoned_v[:, :, 32:] = float("nan")
    # Query tiles 0 and 1 (rows 0..31) must end their key loop at key 16 and 32.
    fn = ours(device, causal=True, tiles=PROBE_TILES)
    kw = {"dtype": torch.float32, "device": device}
    out, dq, _, _ = with_grads(fn, q, poisoned_k, poisoned_v, d_out, **kw)
    want_out, want_dq, _, _ = with_grads(reference(causal=True), q, k, v, d_out)
    check_fp32(out[:, :, :32], want_out[:, :, :32], "rows before the poisoned key tiles")
    check_fp32(dq[:, :, :32], want_dq[:, :, :32], "dq of those rows")
    assert out[:, :, 32:].isnan().all(), "rows that may see the poisoned keys should be NaN"


# The interpreter's numpy reductions warn about the NaN rows these probes create on purpose.
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")
def test_causal_dkdv_skips_query_tiles_before_the_diagonal(device):
    q, k, v, d_out = random_qkv(12, 1, 2, 64, 64, 16)
    # Keys 32..63 are seen only by queries 32..63: the dK/dV programs of key tiles
    # 2 and 3 must start their query loop at row 32 and never read rows 0..31.
    poisoned_q, poisoned_do = q.clone(), d_out.clone()
    poisoned_q[:, :, :32] = float("nan")
    poisoned_do[:, :, :32] = float("nan")
    fn = ours(device, causal=True, tiles=PROBE_TILES)
    kw = {"dtype": torch.float32, "device": device}
    _, _, dk, dv = with_grads(fn, poisoned_q, k, v, poisoned_do, **kw)
    _, _, want_dk, want_dv = with_grads(reference(causal=True), q, k, v, d_out)
    check_fp32(dk[:, :, 32:], want_dk[:, :, 32:], "dk of the late keys")
    check_fp32(dv[:, :, 32:], want_dv[:, :, 32:], "dv of the late keys")


# ---------------------------------------------------------------------------
# errors: refused on the host, before any kernel runs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "T,S,causal,mask_fn",
    [
        (5, 3, True, None),  # causal with T > S: the first T - S rows see nothing
        (4, 6, False, lambda m: m.__setitem__((1, 0, 2), False)),  # one row masked out entirely
        # the mask alone leaves row 0 a key (key 5), but causal hides it: 5 > 0 + (6 - 4)
        (4, 6, True, lambda m: m.__setitem__((0, 0, 0, slice(0, 5)), False)),
    ],
)
def test_empty_rows_are_refused_before_launch(device, T, S, causal, mask_fn):
    q = torch.randn(2, 2, T, 16, device=device)
    k = torch.randn(2, 2, S, 16, device=device)
    mask = None
    if mask_fn is not None:
        mask = torch.ones(2, 1, T, S, dtype=torch.bool)
        mask_fn(mask)
        mask = mask.to(device)
    with count_kernel_launches() as launches, pytest.raises(ValueError, match="no key"):
        L4.attention(q, k, k, causal=causal, mask=mask)
    assert launches[0] == 0


def test_bad_inputs_are_refused(device):
    q = torch.randn(1, 2, 4, 16, device=device)
    with pytest.raises(TypeError, match="boolean"):
        L4.attention(q, q, q, mask=torch.ones(4, 4, device=device))
    with pytest.raises(ValueError, match="broadcastable"):
        L4.attention(q, q, q, mask=torch.ones(3, 4, dtype=torch.bool, device=device))
    with pytest.raises(TypeError, match="dtype"):
        L4.attention(q.double(), q.double(), q.double())


# ---------------------------------------------------------------------------
# fused LayerNorm: forward and backward against float64 autograd
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 7, 24), (5, 40), (37, 12)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_forward_backward(device, shape, bias):
    gen = torch.Generator().manual_seed(sum(shape))
    D = shape[-1]
    # A large mean next to the spread: the two-pass variance keeps it exact.
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 3 + 20
    w = torch.randn(D, generator=gen, dtype=torch.float64)
    b = torch.randn(D, generator=gen, dtype=torch.float64) if bias else None
    dy = torch.randn(shape, generator=gen, dtype=torch.float64)
    ref = [t.clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    expected = torch.nn.functional.layer_norm(ref[0], (D,), ref[1], ref[2], 1e-5)
    expected.backward(dy)
    ins = [
        t.to(device, torch.float32).requires_grad_() if t is not None else None for t in (x, w, b)
    ]
    out = L4.layer_norm(ins[0], ins[1], ins[2], 1e-5)
    out.backward(dy.to(device, torch.float32))
    check_fp32(out, expected.detach(), "layer norm output")
    for name, got, want in zip(("dx", "dw", "db"), ins, ref, strict=True):
        if want is not None:
            check_fp32(got.grad, want.grad, f"layer norm {name}")
    if not bias:
        assert ins[2] is None


# ---------------------------------------------------------------------------
# the models train: gradients through level 2's modules with the kernels swapped in
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
def test_decoder_only_gradients_match_level2_float64(device, bias):
    L2 = levels.load("level2_torch_manual")
    config = levels.TransformerConfig(
        vocab_size=19, d_model=24, n_heads=2, d_ff=40, n_layers=1, bias=bias, max_seq_len=16
    )
    params = levels.init_params(config, "decoder_only", seed=5, scheme="random")
    rng = np.random.default_rng(5)
    tokens = torch.as_tensor(rng.integers(3, 19, size=(2, 11)))
    valid = torch.ones(2, 11, dtype=torch.bool)
    valid[1, 7:] = False  # right padding in the second row
    ours = L4.DecoderOnlyTransformer(config, params, device=device)
    ref = L2.DecoderOnlyTransformer(config, params, dtype=torch.float64)
    assert isinstance(ours.layers[0].norm1, L4.LayerNorm)
    weights = torch.randn(
        2, 11, 19, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    (ours(tokens.to(device), valid=valid.to(device)).double().cpu() * weights).sum().backward()
    (ref(tokens, valid=valid) * weights).sum().backward()
    got = dict(ours.named_parameters())
    for name, p in ref.named_parameters():
        # Gradients sum over B*T positions and pass through LayerNorm and two
        # attention backward kernels: a few times the per-op fp32 tolerance.
        torch.testing.assert_close(
            got[name].grad.double().cpu(), p.grad, atol=1e-4, rtol=1e-4, msg=name
        )


def test_describe_names_the_interpreter_without_cuda():
    text = L4.describe()
    if not torch.cuda.is_available():
        assert text.startswith("Triton interpreter (no CUDA)")
    elif os.environ.get("TRITON_INTERPRET") == "1":
        assert text.startswith("Triton interpreter")
    else:
        assert "CUDA" in text and "interpreter" not in text


def test_bfloat16_runs_compiled_and_is_refused_interpreted(device):
    """The interpreter's numpy arithmetic has no bfloat16 (results off by ~1e8): level 4
    refuses it there, saying why; compiled on a GPU it is one of the tested dtypes."""
    q = torch.randn(1, 2, 5, 16, device=device)
    if L4.FACTS.interpreted:
        with count_kernel_launches() as launches, pytest.raises(TypeError, match="interpreter"):
            L4.attention(q.bfloat16(), q.bfloat16(), q.bfloat16())
        assert launches[0] == 0
        assert "bfloat16" not in L4.FACTS.dtypes
    else:
        out = L4.attention(q.bfloat16(), q.bfloat16(), q.bfloat16())
        want = reference_attention(q.double(), q.double(), q.double())
        assert (out.double() - want).abs().max() < 5e-2  # a few bf16 ulps of O(1) values
