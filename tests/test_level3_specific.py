"""What only level 3 has: SDPA backend choice and reporting, bottom-right causal
alignment on top of SDPA, empty rows refused before SDPA, sliding windows in
query chunks, grouped heads through SDPA's ``enable_gqa``, the static KV cache,
and length bucketing. The shared suite runs level 3 through everything else.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from levels import TransformerConfig, init_params
from levels import level2_torch_manual as level2
from levels import level3_sdpa_flash as level3
from levels.common.bucketing import make_batches, pad_batch, padding_waste
from levels.level3_sdpa_flash.attention import sdpa_mask
from levels.level3_sdpa_flash.private import blocked_missing

F64 = torch.float64
# float64 paths differ from the reference only by summation order: ~1e-16 per
# operation over a few dozen terms, so 1e-12 leaves a wide margin yet catches
# any semantic slip (a wrong mask moves results by O(0.1)).
F64_TOL = 1e-12
# float32 flash vs math: tiled online softmax vs one-pass softmax reorder the
# sums; errors are a few ulp (~1e-7) of O(1) outputs, so 1e-5 is loose but tight
# enough to catch any masking or scaling error.
F32_TOL = 1e-5


def qkv(B, H, T, S, Dh, *, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dh, generator=g, dtype=dtype)
    k = torch.randn(B, H, S, Dh, generator=g, dtype=dtype)
    v = torch.randn(B, H, S, Dh, generator=g, dtype=dtype)
    return q, k, v


def explicit_bottom_right(T: int, S: int) -> torch.Tensor:
    """(T, S) bool written with loops, independently of the code under test."""
    m = np.zeros((T, S), dtype=bool)
    for i in range(T):
        for j in range(S):
            m[i, j] = j <= i + (S - T)
    return torch.from_numpy(m)


def small_config(**kw) -> TransformerConfig:
    base = dict(vocab_size=29, d_model=16, n_heads=2, d_ff=24, n_layers=2, max_seq_len=12)
    return TransformerConfig(**(base | kw))


# ---------------------------------------------------------------- causal alignment


@pytest.mark.parametrize("T,S", [(1, 9), (3, 7), (5, 6), (7, 7), (2, 13)])
def test_causal_is_bottom_right(T, S):
    q, k, v = qkv(2, 3, T, S, 5)
    out = level3.attention(q, k, v, causal=True)
    # Two independent references: an explicit loop-built mask, and PyTorch's own
    # lower-right causal bias (which level 3 does not use).
    by_mask = F.scaled_dot_product_attention(q, k, v, attn_mask=explicit_bottom_right(T, S))
    by_bias = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(T, S))
    torch.testing.assert_close(out, by_mask, atol=F64_TOL, rtol=0)
    torch.testing.assert_close(out, by_bias, atol=F64_TOL, rtol=0)
    if 1 < T < S:
        # SDPA's is_causal would have been wrong here: top-left hides keys that
        # bottom-right allows, so the outputs must differ visibly.
        top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert (out - top_left).abs().max() > 1e-3


@pytest.mark.parametrize("T,S", [(3, 7), (6, 6)])
def test_causal_and_padding_mask_combine(T, S):
    q, k, v = qkv(2, 2, T, S, 4, seed=1)
    valid = torch.ones(2, S, dtype=torch.bool)
    valid[0, S - 2 :] = False  # row 0 has two padded keys at the end
    out = level3.attention(q, k, v, causal=True, mask=valid[:, None, None, :])
    both = explicit_bottom_right(T, S) & valid[:, None, None, :]  # (B,1,T,S)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=both)
    torch.testing.assert_close(out, ref, atol=F64_TOL, rtol=0)


# ---------------------------------------------------------------- empty rows


@pytest.mark.parametrize("how", ["all_masked_row", "causal_T_gt_S", "padding_hides_causal_prefix"])
def test_empty_row_is_value_error_not_nan(how):
    T, S = (5, 3) if how == "causal_T_gt_S" else (4, 4)
    q, k, v = qkv(1, 2, T, S, 4)
    mask, causal = None, how != "all_masked_row"
    if how == "all_masked_row":
        mask = torch.ones(1, 1, T, S, dtype=torch.bool)
        mask[0, 0, 2] = False  # query 2 may attend nothing
    elif how == "padding_hides_causal_prefix":
        mask = torch.tensor([False, True, True, True])  # key 0 padded: query 0 sees nothing
    with pytest.raises(ValueError, match="no key"):
        level3.attention(q, k, v, causal=causal, mask=mask)
    with pytest.raises(ValueError, match="no key"):
        which = level3.which_backend(q, k, v, causal=causal, mask=mask)
        pytest.fail(f"which_backend ran {which} on an empty row")


def test_all_true_mask_is_dropped_so_fused_kernels_stay_eligible():
    q, k, v = qkv(2, 2, 1, 9, 4)
    ones = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    assert sdpa_mask(q, k, v, causal=True, mask=ones) == (None, False)
    torch.testing.assert_close(
        level3.attention(q, k, v, causal=True, mask=ones),
        level2.attention(q, k, v, causal=True, mask=ones),
        atol=F64_TOL,
        rtol=0,
    )


# ---------------------------------------------------------------- backends


def _dispatcher_choice(q, k, v, *, causal, mask, dropout_p) -> str:
    """PyTorch's own answer for these inputs (its private dispatcher query)."""
    attn_mask, is_causal = sdpa_mask(q, k, v, causal=causal, mask=mask)
    chosen = SDPBackend(torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal))
    return {b: n for n, b in level3.BACKENDS.items()}[chosen]


@pytest.mark.skipif(not hasattr(torch, "_fused_sdp_choice"), reason="private query absent")
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize(
    "causal,padded,dropout_p", [(True, False, 0.0), (False, True, 0.0), (True, False, 0.2)]
)
def test_which_backend_agrees_with_the_dispatcher(dtype, causal, padded, dropout_p):
    q, k, v = qkv(2, 2, 6, 6, 8, dtype=dtype)
    mask = None
    if padded:
        mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])[:, None, None, :]
    reported = level3.which_backend(q, k, v, causal=causal, mask=mask, dropout_p=dropout_p)
    assert reported == _dispatcher_choice(q, k, v, causal=causal, mask=mask, dropout_p=dropout_p)


@pytest.mark.parametrize("T,S", [(17, 17), (5, 17)])
def test_forced_backends_report_themselves_and_agree_on_values(T, S):
    q, k, v = qkv(2, 3, T, S, 8, dtype=torch.float32)
    ref = level2.attention(q, k, v, causal=True)
    for name in ("flash", "math"):  # the two CPU kernels
        assert level3.which_backend(q, k, v, causal=True, backend=name) == name
        out = level3.attention(q, k, v, causal=True, backend=name)
        torch.testing.assert_close(out, ref, atol=F32_TOL, rtol=0)


def test_which_backend_respects_an_enclosing_sdpa_kernel():
    q, k, v = qkv(1, 2, 8, 8, 8, dtype=torch.float32)
    assert level3.which_backend(q, k, v, causal=True) == "flash"  # the CPU build's fused kernel
    with sdpa_kernel([SDPBackend.MATH]):
        assert level3.which_backend(q, k, v, causal=True) == "math"


# ---------------------------------------------------------------- the private torch APIs


def test_the_default_priority_order_is_the_one_torch_reports():
    """``private.DEFAULT_ORDER`` stands in for torch's private query where it is missing:
    it must be the order torch itself reports while no one has set another."""
    from levels.level3_sdpa_flash import private

    if not hasattr(torch._C, "_get_sdp_priority_order"):
        pytest.skip("private query absent: DEFAULT_ORDER is all there is")
    live = private.priority_order()
    assert live[: len(private.DEFAULT_ORDER)] == list(private.DEFAULT_ORDER)


def test_without_the_private_priority_query_which_backend_still_answers(monkeypatch):
    from levels.level3_sdpa_flash import private

    monkeypatch.delattr(torch._C, "_get_sdp_priority_order", raising=False)
    assert private.priority_order() == list(private.DEFAULT_ORDER)
    q, k, v = qkv(1, 2, 8, 8, 8, dtype=torch.float32)
    assert level3.which_backend(q, k, v, causal=True) == "flash"


@pytest.mark.parametrize("op", ["FLASH_CPU_FORWARD", "FLASH_CPU_BACKWARD"])
def test_a_missing_private_kernel_is_one_clear_line(monkeypatch, op):
    """A torch without the fused CPU kernel: ``return_lse`` says what is missing and
    what to use instead, instead of an AttributeError from inside torch.ops."""
    from levels.level3_sdpa_flash import private

    monkeypatch.setattr(private, op, "_no_such_kernel_in_this_torch")
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 6, 6, 8))
    with pytest.raises(RuntimeError) as raised:
        out, lse = level3.attention(q, k, v, causal=True, return_lse=True)
        (out.sum() + lse.sum()).backward()  # the backward kernel is looked up here
    message = str(raised.value)
    assert "aten::_no_such_kernel_in_this_torch" in message and "level 2" in message
    assert "\n" not in message
    level3.attention(q, k, v, causal=True)  # plain attention never needs it


def test_a_backend_that_cannot_run_says_so():
    q, k, v = qkv(1, 2, 4, 4, 8, dtype=torch.float32)  # CPU tensors: no CUDA kernel applies
    with pytest.raises(RuntimeError, match="'efficient'"):
        level3.attention(q, k, v, backend="efficient")
    with pytest.raises(RuntimeError):
        level3.which_backend(q, k, v, backend="efficient")
    with pytest.raises(ValueError, match="backend must be one of"):
        level3.attention(q, k, v, backend="fastest")


def test_model_backend_reaches_the_core_and_auto_obeys_an_enclosing_sdpa_kernel():
    cfg = small_config()
    params = init_params(cfg, "decoder_only", seed=0, scheme="random")
    tokens = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]])
    auto = level3.DecoderOnlyTransformer(cfg, params)
    math = level3.DecoderOnlyTransformer(cfg, params, backend="math")
    torch.testing.assert_close(math(tokens), auto(tokens), atol=F32_TOL, rtol=0)
    with pytest.raises(RuntimeError, match="'efficient'"):
        level3.DecoderOnlyTransformer(cfg, params, backend="efficient")(tokens)
    # "auto" adds no restriction of its own, so the caller's context decides.
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]), pytest.raises(RuntimeError):
        auto(tokens)
    assert "static KV cache" in level3.describe()
    assert "-> math" in level3.describe(backend="math")


# ---------------------------------------------------------------- windows and grouped heads


def _chunks_taken(monkeypatch) -> list[int]:
    """Record the query count of every SDPA call made in chunks."""
    # The package's `attention` is the function; the module is reached by its full name.
    module = importlib.import_module("levels.level3_sdpa_flash.attention")
    taken: list[int] = []
    real = module.attention_in_chunks

    def spy(q, *args, **kw):
        taken.append(q.shape[-2])
        return real(q, *args, **kw)

    monkeypatch.setattr(module, "attention_in_chunks", spy)
    return taken


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "band"])
@pytest.mark.parametrize("T,S,W", [(700, 700, 40), (300, 650, 128), (517, 517, 1)])
def test_long_windows_run_in_chunks_and_equal_one_masked_call(monkeypatch, T, S, W, causal):
    taken = _chunks_taken(monkeypatch)
    q, k, v = qkv(1, 4, T, S, 8)
    k, v = k[:, :2], v[:, :2]  # two KV heads for four query heads
    mask = torch.rand(1, 1, 1, S, generator=torch.Generator().manual_seed(3)) > 0.2
    mask[..., :W] = True  # the first queries see only the first keys: keep one for each
    if W == 1:
        mask[...] = True  # every row sees one key only, which must stay
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = level3.attention(*leaves, causal=causal, window=W, mask=mask)
    assert taken == [T], "the window should have been computed in chunks"
    ref_leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    ref = level2.attention(*ref_leaves, causal=causal, window=W, mask=mask)
    torch.testing.assert_close(out, ref, atol=F64_TOL, rtol=0)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    ref_grads = torch.autograd.grad(ref, ref_leaves, dout)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=F64_TOL, rtol=0)


def test_a_window_that_binds_nothing_is_plain_causal_attention(monkeypatch):
    taken = _chunks_taken(monkeypatch)
    q, k, v = qkv(1, 2, 300, 300, 8)
    out = level3.attention(q, k, v, causal=True, window=300)
    assert taken == []  # no chunks: the same SDPA call as without a window
    assert torch.equal(out, level3.attention(q, k, v, causal=True))


def test_windowed_peak_memory_does_not_grow_with_the_square_of_T():
    """Chunking keeps one chunk's scores alive, so doubling T about doubles the peak
    (the output itself is T * Dv); a (T, S) mask or score matrix would quadruple it."""
    from benchmarks.measure import peak_torch_profiler

    peaks = []
    for T in (2048, 4096):
        q, k, v = qkv(1, 2, T, T, 16, dtype=torch.float32)
        call = lambda q=q, k=k, v=v: level3.attention(q, k, v, causal=True, window=64)  # noqa: E731
        peaks.append(peak_torch_profiler(call))
    assert None not in peaks, "the torch profiler recorded no allocations"
    # Linear growth gives 2x; quadratic 4x. 2.6 leaves room for allocator rounding.
    assert peaks[1] / peaks[0] < 2.6, peaks


def test_grouped_heads_reach_sdpa_without_repeating_keys(monkeypatch):
    """SDPA gets the Hkv heads as they are, with enable_gqa, rather than copies."""
    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kw):
        seen.append((k.shape[1], kw.get("enable_gqa", False)))
        return real(q, k, v, *args, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    q, k, v = qkv(2, 6, 5, 5, 4)
    out = level3.attention(q, k[:, :2], v[:, :2], causal=True)
    assert seen == [(2, True)]
    want = level2.attention(q, k[:, :2], v[:, :2], causal=True)
    torch.testing.assert_close(out, want, atol=F64_TOL, rtol=0)


def test_grouped_cache_holds_kv_heads_only():
    cfg = small_config(n_heads=4, d_model=16, n_kv_heads=1)
    cache = level3.StaticKVCache(cfg, 2, dtype=F64)
    assert cache.k.shape == (cfg.n_layers, 2, 1, cfg.max_seq_len, cfg.d_head)


# ---------------------------------------------------------------- static KV cache


def _model_and_tokens(seed=0):
    cfg = small_config()
    params = init_params(cfg, "decoder_only", seed=seed, scheme="random")
    model = level3.DecoderOnlyTransformer(cfg, params, dtype=F64)
    tokens = torch.randint(
        3, cfg.vocab_size, (2, cfg.max_seq_len), generator=torch.Generator().manual_seed(seed)
    )
    return cfg, params, model, tokens


def test_cache_is_allocated_once_and_written_in_place():
    cfg, params, model, tokens = _model_and_tokens()
    _, cache = model.prefill(tokens[:, :4])
    assert isinstance(cache, level3.StaticKVCache)
    assert cache.k.shape == (cfg.n_layers, 2, cfg.n_heads, cfg.max_seq_len, cfg.d_head)
    k_ptr, v_ptr, k_buf = cache.k.data_ptr(), cache.v.data_ptr(), cache.k
    for t in range(4, 8):
        model.decode_step(tokens[:, t], cache)
        assert cache.k is k_buf and cache.k.data_ptr() == k_ptr and cache.v.data_ptr() == v_ptr
    assert cache.length == 8
    # The filled slots hold exactly the keys and values level 2's growing cache holds.
    ref = level2.DecoderOnlyTransformer(cfg, params, dtype=F64)
    _, ref_cache = ref.prefill(tokens[:, :8])
    for layer in range(cfg.n_layers):
        torch.testing.assert_close(
            cache.k[layer, :, :, :8], ref_cache.keys[layer], atol=F64_TOL, rtol=0
        )
        torch.testing.assert_close(
            cache.v[layer, :, :, :8], ref_cache.values[layer], atol=F64_TOL, rtol=0
        )


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.float16, torch.bfloat16])
def test_a_new_cache_is_zeros_of_its_dtype_and_writable(dtype):
    """The cache's lazily zeroed buffers (``arrays.zeros``): every bit zero, the dtype and
    shape asked for, the keys and values apart, and writes land where they are made."""
    cfg = small_config(n_heads=4, d_model=16, n_kv_heads=2)
    cache = level3.StaticKVCache(cfg, 3, dtype=dtype)
    for buffer in (cache.k, cache.v):
        assert buffer.dtype == dtype and buffer.is_contiguous()
        assert buffer.shape == (cfg.n_layers, 3, 2, cfg.max_seq_len, cfg.d_head)
        assert not buffer.view(torch.uint8).any()  # +0.0 everywhere, not -0.0 nor garbage
    cache.k[1, 2, 1, -1, -1] = 1.5  # the last element: the whole buffer is addressable
    assert cache.k.sum().item() == 1.5 and not cache.v.view(torch.uint8).any()


def test_updated_views_share_the_buffer():
    cfg = small_config()
    cache = level3.StaticKVCache(cfg, 2, dtype=F64)
    keys = cache.extend(torch.tensor([[0, 1, 2], [0, 1, -1]]))  # the pass's positions first
    assert keys.tolist() == [[0, 1, 2], [0, 1, -1]] and cache.length == 3
    k_new = torch.randn(2, cfg.n_heads, 3, cfg.d_head, dtype=F64)
    k, v = cache.update(0, k_new, k_new)
    assert k.untyped_storage().data_ptr() == cache.k.untyped_storage().data_ptr()
    assert torch.equal(k, k_new)
    cache.rollback(1)  # forgotten slots read as padding again, in the whole buffer
    assert cache.positions[:, 1:].eq(-1).all() and cache.next_positions().tolist() == [1, 1]


def test_decoding_reads_only_the_filled_prefix():
    cfg, params, model, tokens = _model_and_tokens(seed=1)
    full = model(tokens[:, :7], valid=torch.ones(2, 7, dtype=torch.bool))  # (B,7,V)
    _, cache = model.prefill(tokens[:, :5])
    # Poison every slot past the filled prefix: a read there would show as NaN.
    cache.k[:, :, :, 5:] = float("nan")
    cache.v[:, :, :, 5:] = float("nan")
    for t in (5, 6):
        step = model.decode_step(tokens[:, t], cache)
        torch.testing.assert_close(step, full[:, t], atol=F64_TOL, rtol=0)


def test_overflow_raises_and_leaves_the_cache_bit_identical():
    cfg, params, model, tokens = _model_and_tokens(seed=2)
    _, cache = model.prefill(tokens[:, : cfg.max_seq_len - 1])
    model.decode_step(tokens[:, -1], cache)  # fills the last slot
    assert cache.length == cache.capacity == cfg.max_seq_len
    before = (cache.k.clone(), cache.v.clone(), cache.positions.clone(), cache.length)
    with pytest.raises(ValueError, match="overflow"):
        model.decode_step(tokens[:, 0], cache)
    assert torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1])
    assert torch.equal(cache.positions, before[2]) and cache.length == before[3]


# ---------------------------------------------------------------- bucketing


def test_bucketing_cuts_padding_waste_of_a_long_tailed_mix():
    rng = np.random.default_rng(0)
    lengths = np.minimum(1 + (rng.pareto(1.5, 2000) * 20).astype(int), 1000)
    plain = padding_waste(make_batches(lengths, batch_size=16, bucketed=False), lengths)
    bucketed = padding_waste(make_batches(lengths, batch_size=16, bucketed=True), lengths)
    # A heavy tail makes random batches mostly padding; sorting within pools of
    # 50 batches should remove the bulk of it (measured: well over 10x).
    assert plain > 1.0
    assert bucketed < plain / 5


def test_a_sequence_gets_the_same_logits_in_any_bucket():
    cfg = small_config(max_seq_len=16)
    params = init_params(cfg, "decoder_only", seed=4, scheme="random")
    model = level3.DecoderOnlyTransformer(cfg, params, dtype=F64)
    rng = np.random.default_rng(1)
    seqs = [list(rng.integers(3, cfg.vocab_size, n)) for n in (2, 9, 3, 16, 8, 4)]
    lengths = [len(s) for s in seqs]
    alone = [
        model(torch.tensor([seq]), valid=torch.ones(1, len(seq), dtype=torch.bool))[0]
        for seq in seqs
    ]  # (n_i, V) each
    for bucketed in (True, False):
        for batch in make_batches(lengths, batch_size=3, bucketed=bucketed, seed=0):
            toks, valid = pad_batch([seqs[i] for i in batch], cfg.pad_id)  # (B,T) each
            logits = model(torch.from_numpy(toks), valid=torch.from_numpy(valid))  # (B,T,V)
            for row, i in enumerate(batch):
                n = lengths[i]
                torch.testing.assert_close(logits[row, :n], alone[i], atol=F64_TOL, rtol=0)
                assert torch.all(logits[row, n:] == 0)


# ----------------------------------------------------------------------------- int8 and int4 weights


def test_int8_rows_round_to_their_own_grid_with_exact_ties():
    """Row scales are absmax / 127, kept in bfloat16 (the kernel's); a value on a half step
    rounds to even (torch.round), and every weight is within half a step of its row's grid."""
    from levels.level3_sdpa_flash.quant import QuantizedWeight

    # Scales exact in bfloat16 (1 and 2^-5), so the ties below are ties.
    w = torch.tensor([[127.0, -63.5, 0.5, 1.5], [0.0, 0.0, 0.0, 0.0], [-3.96875, 0.015625, 0, 1]])
    q = QuantizedWeight(w, "int8")
    assert q.q.dtype == torch.int8 and q.scale.dtype == torch.bfloat16
    assert q.scale[0] == 1.0 and q.scale[2] == 2**-5
    assert q.q[0].tolist() == [127, -64, 0, 2]  # the ties -63.5, 0.5, 1.5 go to even
    assert q.q[1].tolist() == [0, 0, 0, 0]  # an all-zero row: a tiny scale, no 0/0
    assert q.q[2].tolist() == [-127, 0, 0, 32]  # 0.015625 / 2^-5 = 0.5 -> 0 (even)
    assert torch.isfinite(q.scale.float()).all()
    g = torch.Generator().manual_seed(0)
    big = torch.randn(64, 96, generator=g)
    deq = QuantizedWeight(big, "int8").dequantize()
    half_step = big.abs().amax(1, keepdim=True) / 127 / 2
    # The scale's bfloat16 rounding (2^-9 relative) moves the grid by up to 127 * 2^-9 of a
    # step at the row's ends: a quarter step on top of the half step, where the largest
    # weight is clamped to 127.
    assert ((deq - big).abs() <= half_step * 1.5).all()


def test_int4_groups_span_their_own_sixteen_steps():
    """Each group of G weights on its own grid from its minimum to its maximum: the ends are
    steps 0 and 15 (up to the bfloat16 scale), every weight within half a step, a constant
    group exact, and the nibbles unpack to the integers."""
    from levels.level3_sdpa_flash.quant import QuantizedWeight

    g = torch.Generator().manual_seed(2)
    w = torch.randn(16, 64, generator=g)
    w[3, :32] = 0.75  # a constant group: a tiny scale, its value at the middle step
    q = QuantizedWeight(w, "int4", group_size=32)
    values = q.values()
    assert values.shape == (16, 64) and values.dtype == torch.uint8 and int(values.max()) <= 15
    groups = values.reshape(16, 2, 32)
    assert (groups.amin(-1) == 0)[torch.arange(16) != 3].all()  # the group's minimum, step 0
    deq = q.dequantize()
    assert torch.equal(deq[3, :32], torch.full((32,), 0.75))
    step = (w.reshape(16, 2, 32).amax(-1) - w.reshape(16, 2, 32).amin(-1)) / 15  # (16, 2)
    err = (deq - w).abs().reshape(16, 2, 32)
    # Half a step, and the bfloat16 rounding of scale and zero: 2^-9 of each, times up to
    # 8 steps from the middle.
    assert (err <= step[..., None] * (0.5 + 9 * 2**-8) + 1e-6).all()
    with pytest.raises(ValueError, match="group_size must be one of"):
        QuantizedWeight(w, "int4", group_size=48)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_products_are_the_integer_sums_scaled(fmt):
    """The packed kernel against the same product in float64 from the matrix the integers
    stand for (``dequantize``), with ``x`` rounded to bfloat16 as the kernel takes it; rows
    sliced off a fused matrix (q/k/v) and an embedding's gather agree with the whole."""
    from levels.level3_sdpa_flash.quant import QuantizedWeight

    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(40, 96, generator=g), torch.randn(3, 5, 96, generator=g)  # 40: padded
    q = QuantizedWeight(w, fmt)
    got = q.linear(x)
    want = x.bfloat16().double() @ q.dequantize(torch.float64).T
    assert got.shape == (3, 5, 40) and got.dtype == torch.float32
    # The kernels accumulate in float32 and return bfloat16 (8 significant bits): within a
    # bfloat16 rounding (2^-8 relative) of the exact sum, plus the float32 sums.
    assert torch.allclose(got.double(), want, rtol=2**-8, atol=1e-3)
    part = q[8:24]
    assert torch.allclose(part.linear(x).double(), want[..., 8:24], rtol=2**-8, atol=1e-3)
    rows = torch.tensor([[3, 7], [0, 39]])
    gathered = q[rows]  # an embedding's gather: the rows dequantized, in the compute dtype
    assert gathered.dtype == torch.float32 and torch.equal(gathered, q.dequantize()[rows])


@pytest.mark.parametrize("fmt, bound", [("int8", 0.1), ("int4", 0.5)])
def test_quantized_model_is_close_to_its_float_model(fmt, bound):
    config = TransformerConfig(
        vocab_size=64,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        d_ff=64,
        n_layers=2,
        max_seq_len=16,
        norm="rmsnorm",
        ffn="swiglu",
        positional="rope",
        scale_embeddings=False,
        bias=False,
    )
    params = init_params(config, "decoder_only", seed=0)
    ids = torch.tensor([[1, 5, 9, 2, 33, 7]])
    base = level3.DecoderOnlyTransformer(config, params, dtype=torch.float32)
    small = level3.DecoderOnlyTransformer(config, params, dtype=torch.float32, weights=fmt)
    assert not any(p.ndim == 2 for p in small.parameters())  # every matrix is quantized
    assert {type(m).__name__ for m in small.modules()} >= {"QuantizedWeight", "QuantizedLinear"}
    want, got = base(ids), small(ids)
    # int8: each weight moves by at most half a step of its row's 127-step grid, int4 of
    # its group's 15-step one, and the activations are rounded to bfloat16 at each product:
    # a few per cent of the logits' range (int8) or a few tens (int4: 16 steps across
    # init_params' uniform weights), where a wrong scale or a transposed matrix is of the
    # order of the logits themselves. Measured: int8 0.033, int4 0.29.
    assert (got - want).abs().max() <= bound * want.abs().max()
    with pytest.raises(ValueError, match="weights must be one of"):
        level3.DecoderOnlyTransformer(config, params, weights="int3")


# ----------------------------------------------------------------------------- blocked weights

blocked_here = pytest.mark.skipif(
    blocked_missing() is not None,
    reason="this torch has no oneDNN reordered product (the refusal is tested below)",
)


@blocked_here
@pytest.mark.parametrize("rows", [1, 3, 8, 40])
def test_blocked_products_are_float_linear_to_rounding(rows):
    """oneDNN's product by the reordered matrix against the float64 product, for a few rows
    (the layout's 8, fewer, and a prefill's 40), with a bias, through a 3-D input; a slice of
    rows (cross-attention's k/v) and an embedding's gather read the kept floats."""
    from levels.level3_sdpa_flash.blocked import BlockedWeight

    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(50, 96, generator=g), torch.randn(50, generator=g)
    x = torch.randn(rows, 1, 96, generator=g)
    blocked = BlockedWeight(w)
    want = x.double() @ w.double().T + b.double()  # (rows, 1, 50)
    got = blocked.linear(x, b)
    assert got.shape == (rows, 1, 50) and got.dtype == torch.float32
    # float32 sums of 96 products of unit normals: each term's rounding is 2^-24 of it, and
    # the sums' of about |x||w| ~ 96; a summation order of oneDNN's own, so within 1e-4 of
    # the exact value (measured: 4e-6), where a wrong layout is off by the values themselves.
    assert (got.double() - want).abs().max() < 1e-4
    part = blocked[10:34]
    assert (part.linear(x).double() - want[..., 10:34] + b[10:34].double()).abs().max() < 1e-4
    assert blocked[0:50] is blocked  # the whole matrix: its own layout, not a copy
    ids = torch.tensor([[3, 7], [0, 49]])
    assert torch.equal(blocked[ids], w[ids])


@blocked_here
@pytest.mark.parametrize("tied", [True, False], ids=["tied head", "own head"])
def test_blocked_model_gives_the_float_models_logits(tied):
    """A model with weights="blocked" against the same model in floats: a forward, a prefill
    and a decode step of three rows; every matrix blocked, none left a float parameter."""
    config = TransformerConfig(
        vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2,
        max_seq_len=16, norm="rmsnorm", ffn="swiglu", bias=False, tie_embeddings=tied,
    )  # fmt: skip
    params = init_params(config, "decoder_only", seed=0)
    base = level3.DecoderOnlyTransformer(config, params, dtype=torch.float32)
    blocked = level3.DecoderOnlyTransformer(config, params, dtype=torch.float32, weights="blocked")
    assert not any(p.ndim == 2 for p in blocked.parameters())
    assert {type(m).__name__ for m in blocked.modules()} >= {"BlockedWeight", "BlockedLinear"}
    ids = torch.tensor([[1, 5, 9, 2, 33, 7], [4, 4, 8, 1, 0, 63], [2, 3, 5, 7, 11, 13]])
    with torch.no_grad():
        # float32 products summed in another order: rounding of a few 2^-24 of the logits'
        # size through two layers (measured: under 1e-6), where a transposed or misplaced
        # matrix changes them by their own size.
        assert (blocked(ids) - base(ids)).abs().max() < 1e-5
        _, cache_a = base.prefill(ids)
        _, cache_b = blocked.prefill(ids)
        step = torch.tensor([3, 9, 27])
        assert (
            blocked.decode_step(step, cache_b) - base.decode_step(step, cache_a)
        ).abs().max() < 1e-5


def test_blocked_weights_are_refused_where_they_cannot_run():
    """float64 and CUDA (oneDNN's product is float32 on a CPU) and the compiled step, each one
    line before any weight is loaded; the floats of an nn.Linear are not kept."""
    from levels.level3_sdpa_flash import blocked, private

    config = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_layers=1)
    params = init_params(config, "decoder_only", seed=0)
    if private.blocked_missing() is not None:
        with pytest.raises(ValueError, match="oneDNN"):
            level3.DecoderOnlyTransformer(config, params, weights="blocked")
        return
    with pytest.raises(ValueError, match="float32 on a CPU"):
        level3.DecoderOnlyTransformer(config, params, dtype=torch.float64, weights="blocked")
    with pytest.raises(ValueError, match="float32 on a CPU"):
        blocked.check_blockable(torch.float32, "cuda")
    with pytest.raises(ValueError, match="compiled step"):
        level3.DecoderOnlyTransformer(config, params, weights="blocked", compile=True)
    linear = blocked.BlockedLinear(torch.nn.Linear(8, 4))
    with pytest.raises(ValueError, match="kept no floats"):
        linear.weight[torch.tensor([0])]
