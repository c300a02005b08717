"""What a model tells its attention cores: a mask, or the cores' own ``causal``/``window``.

One rule decides who sees whom (``levels.common.semantics``). Where a pass's positions
are the cores' places (an unpadded prompt, an unpadded step, a chunk of a prompt after
its cached start) the model hands the core ``causal=``/``window=`` instead of a mask, so
that level 3 reaches SDPA's causal kernel and level 4's kernel skips the key tiles past
the diagonal. These tests hold the rule by hand, watch each fast path being taken, and
check that every other pass (padded rows, windows, a prompt in pieces) keeps the same
logits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import levels
from levels import TransformerConfig, init_params
from levels import level2_torch_manual as level2
from levels import level3_sdpa_flash as level3
from levels.common import semantics
from levels.common.semantics import ByPlace, in_place, told, visible

# float64 at both levels: the same maths in another summation order (SDPA's tiles against
# level 2's one softmax), ~1e-16 a term over a few hundred keys and two layers; 1e-11
# leaves a wide margin and still catches a wrong key (it moves logits by O(0.1)).
F64_TOL = 1e-11


def rows(*positions) -> np.ndarray:
    return np.array(positions, dtype=np.int64)


# ----------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    "q_pos,k_pos,placed",
    [
        (rows([0, 1, 2, 3]), rows([0, 1, 2, 3]), True),  # an unpadded prompt
        (rows([0, 1, 2], [5, 6, 7]), rows([0, 1, 2], [5, 6, 7]), True),  # a shard further on
        (rows([3, 4]), rows([0, 1, 2, 3, 4]), True),  # a chunk after its cached start
        (rows([4]), rows([0, 1, 2, 3, 4]), True),  # a decode step
        (rows([0, 1, -1]), rows([0, 1, -1]), False),  # right padding
        (rows([0, 1, 2], [0, 1, -1]), rows([0, 1, 2], [0, 1, -1]), False),  # one row padded
        (rows([3]), rows([0, 1, -1, 3]), False),  # a padded slot in the cache
        (rows([2]), rows([0, 2, 1]), False),  # keys out of order
        (rows([1, 2]), rows([0, 1, 2]), True),
        (rows([0, 1]), rows([0, 1, 2]), False),  # queries not the last keys
        (rows([0, 1, 2]), rows([0, 1]), False),  # more queries than keys
    ],
)
def test_positions_in_place_are_told_by_place_and_the_rest_by_mask(q_pos, k_pos, placed):
    assert in_place(q_pos, k_pos) is placed
    assert in_place(torch.from_numpy(q_pos), torch.from_numpy(k_pos)) is placed
    seen = told(q_pos, k_pos, 3)
    if placed:
        assert seen == ByPlace(causal=True, window=3)
    else:
        np.testing.assert_array_equal(seen, visible(q_pos, k_pos, 3))


@pytest.mark.parametrize("window", [None, 1, 2, 5])
@pytest.mark.parametrize(
    "T,S,causal",
    # a model's encoder (not causal) attends its own positions: T == S
    [(1, 1, True), (1, 6, True), (3, 6, True), (6, 6, True), (1, 1, False), (6, 6, False)],
)
def test_the_cores_places_are_positions_under_the_same_rule(T, S, causal, window):
    """``visible`` at the places (keys ``0..S-1``, queries the last ``T``; and shifted by 4)
    equals ``key_range``'s keys row by row: the models' rule and the cores' are one."""
    for shift in (0, 4):
        keys = np.arange(S)[None] + shift  # (1,S)
        queries = keys[:, S - T :]  # (1,T)
        mask = visible(queries, keys, window, causal=causal)[0, 0]  # (T,S)
        for i in range(T):
            lo, hi = semantics.key_range(i, T, S, causal=causal, window=window)
            assert mask[i].tolist() == [lo <= j < hi for j in range(S)], (i, shift)


# ----------------------------------------------------------------------------- level 3


def config(**kw) -> TransformerConfig:
    base = dict(vocab_size=31, d_model=16, n_heads=4, n_kv_heads=2, d_ff=24, n_layers=2,
                max_seq_len=256)  # fmt: skip
    return TransformerConfig(**(base | kw))


def models(cfg: TransformerConfig):
    params = init_params(cfg, "decoder_only", seed=0)
    kw = {"dtype": torch.float64}
    return level3.DecoderOnlyTransformer(cfg, params, **kw), level2.DecoderOnlyTransformer(
        cfg, params, **kw
    )


def sdpa_calls(monkeypatch) -> list[tuple[bool, bool, int]]:
    """Each SDPA call's ``(is_causal, has a mask, queries)``, recorded as it runs."""
    calls, real = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, *args, is_causal=False, **kw):
        calls.append((is_causal, attn_mask is not None, q.shape[2]))
        return real(q, k, v, attn_mask, *args, is_causal=is_causal, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def tokens(B: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 31, (B, T), generator=torch.Generator().manual_seed(seed))


def test_an_unpadded_prefill_takes_sdpas_causal_path_in_one_call_a_layer(monkeypatch):
    """200 queries: a mask would have been cut into chunks of 128 (``mask_chunks``)."""
    fast, written = models(config())
    ids = tokens(2, 200)
    calls = sdpa_calls(monkeypatch)
    with torch.no_grad():
        got, _ = fast.prefill(ids)
    assert calls == [(True, False, 200)] * 2  # one causal call a layer, no mask
    with torch.no_grad():
        want, _ = written.prefill(ids)
    torch.testing.assert_close(got, want, atol=F64_TOL, rtol=0)


def test_a_padded_prefill_keeps_its_mask_and_its_rows_logits(monkeypatch):
    fast, written = models(config())
    ids = tokens(2, 200)
    valid = torch.ones(2, 200, dtype=torch.bool)
    valid[1, 150:] = False
    calls = sdpa_calls(monkeypatch)
    with torch.no_grad():
        got, _ = fast.prefill(ids, valid=valid)
        alone, _ = fast.prefill(ids[1:, :150])
    assert calls[:2] and all(not causal and masked for causal, masked, _ in calls[:-2])
    assert calls[-2:] == [(True, False, 150)] * 2  # the short row alone: in place again
    with torch.no_grad():
        want, _ = written.prefill(ids, valid=valid)
    torch.testing.assert_close(got, want, atol=F64_TOL, rtol=0)
    torch.testing.assert_close(got[1, :150], alone[0], atol=F64_TOL, rtol=0)


@pytest.mark.parametrize("window_pattern", [None, 2], ids=["windowed", "local-global"])
def test_a_windowed_prefill_is_told_its_window_and_keeps_its_logits(window_pattern):
    fast, written = models(config(window=40, window_pattern=window_pattern))
    ids = tokens(1, 200)
    with torch.no_grad():
        got, _ = fast.prefill(ids)
        want, _ = written.prefill(ids)
        positions = torch.arange(200)[None]
        told_ = fast._masks(positions, positions)
    expected = [ByPlace(True, w) for w in fast.config.layer_windows]
    assert told_ == expected
    torch.testing.assert_close(got, want, atol=F64_TOL, rtol=0)


def test_a_prompt_in_pieces_after_its_cache_gives_the_whole_prompts_logits(monkeypatch):
    fast, _ = models(config())
    ids = tokens(2, 200)
    with torch.no_grad():
        whole, _ = fast.prefill(ids)
        first, cache = fast.prefill(ids[:, :130])
        calls = sdpa_calls(monkeypatch)
        rest = fast.extend(ids[:, 130:], cache)
    # 70 queries after 130 cached keys: bottom-right causal, which SDPA's top-left
    # is_causal is not, so a (T, S) mask by place, one call a layer.
    assert calls == [(False, True, 70)] * 2
    torch.testing.assert_close(torch.cat([first, rest], 1), whole, atol=F64_TOL, rtol=0)


# ----------------------------------------------------------------------------- level 4


@pytest.fixture
def level4():
    try:
        return levels.load("level4_triton_kernel")
    except levels.LevelUnavailable as exc:
        pytest.skip(str(exc))


def key_tiles_visited(monkeypatch) -> list[int]:
    """How many key tiles the forward kernel walks, all programs together: its loop asks
    ``allowed_tile`` once a tile (the interpreter runs the kernel as Python, so the module's
    name is looked up at each call)."""
    from levels.level4_triton_kernel import flash_forward

    count, real = [0], flash_forward.allowed_tile

    def counting(*args, **kw):
        count[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(flash_forward, "allowed_tile", counting)
    return count


@pytest.mark.parametrize("n", [1, 2, 5])
def test_level4_causal_prefill_walks_at_most_half_the_key_tiles_and_a_padded_one_all(
    monkeypatch, level4, n
):
    """A causal prefill of ``n`` tiles of queries: query tile ``m`` walks key tiles ``0..m``,
    ``n (n + 1) / 2`` of the ``n * n`` a mask makes it walk, ``(n + 1) / 2n`` of them."""
    from levels.level4_triton_kernel.tiles import INTERPRETER_TILES, interpreting

    if not interpreting():
        pytest.skip("counts the interpreter's tiles (TRITON_INTERPRET=1, the CPU)")
    tile = INTERPRETER_TILES.block_m
    assert INTERPRETER_TILES.block_n == tile  # square tiles: n tiles of queries and of keys
    cfg = config(n_layers=1, n_kv_heads=None, max_seq_len=6 * tile)
    model = level4.DecoderOnlyTransformer(cfg, init_params(cfg, "decoder_only", seed=0))
    T, programs = n * tile, 1 * cfg.n_heads  # B = 1 row, one layer
    count = key_tiles_visited(monkeypatch)
    with torch.no_grad():
        model.prefill(tokens(1, T))
    every = programs * n * n
    assert count[0] == programs * n * (n + 1) // 2
    assert count[0] <= every * (n + 1) / (2 * n)
    count[0] = 0
    valid = torch.ones(1, T + 1, dtype=torch.bool)
    valid[0, T] = False  # one padded slot: a mask, and no tile is skipped
    with torch.no_grad():
        model.prefill(tokens(1, T + 1), valid=valid)
    m = -(-(T + 1) // tile)  # the padded prompt's tiles
    assert count[0] == programs * m * m
