"""The attention core of every level against the float64 reference.

The full grid of awkward shapes runs here, on attention only (it is cheap):
lengths T, S in {1, 7, 13, 33} with T != S, head widths Dh in {4, 8, 12, 16},
causal on and off, no mask or a random boolean mask with no empty row; key
heads shared in groups; scores far past where ``exp`` overflows.

These are also the first two stages of a learner's rung (``stage``: attention, and
the softmax's numerics).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import reference as ref
from _helpers import random_mask

LENGTHS = (1, 7, 13, 33)
HEAD_WIDTHS = (4, 8, 12, 16)
# Every (T, S) pair, each with a head width taken in turn, so each Dh meets
# short and long, square and rectangular problems.
SHAPES = [
    (T, S, HEAD_WIDTHS[n % len(HEAD_WIDTHS)])
    for n, (T, S) in enumerate(itertools.product(LENGTHS, LENGTHS))
]


def _qkv(rng, B, H, T, S, Dh, Dv=None):
    Dv = Dh if Dv is None else Dv
    return (
        rng.normal(size=(B, H, T, Dh)),
        rng.normal(size=(B, H, S, Dh)),
        rng.normal(size=(B, H, S, Dv)),
    )


def _batch(case):
    """(B, H): keep the slow levels to one batch row."""
    return (1, 2) if case.tiny else (2, 3)


# Causal with T > S leaves the first T - S queries without a key: that is an
# error (test_errors), so those combinations are not generated here.
GRID = [
    (T, S, Dh, causal) for T, S, Dh in SHAPES for causal in (False, True) if T <= S or not causal
]


@pytest.mark.no_lowp
@pytest.mark.stage("attention")
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize(
    "T,S,Dh,causal",
    GRID,
    ids=[f"T{T}-S{S}-Dh{Dh}-{'causal' if c else 'full'}" for T, S, Dh, c in GRID],
)
def test_attention_matches_reference(case, T, S, Dh, causal, masked):
    B, H = _batch(case)
    rng = np.random.default_rng(1000 * T + 10 * S + Dh)
    q, k, v = _qkv(rng, B, H, T, S, Dh)
    mask = None
    if masked:
        mask = random_mask(rng, (B, H, T, S))
        if causal:
            # Keep every row non-empty under causality too: also allow each
            # query the last key it can see causally, j = i + (S - T).
            mask[..., np.arange(T), np.arange(T) + (S - T)] = True
    expected = ref.attention(q, k, v, causal=causal, mask=mask)
    out = case.module.attention(
        case.arr(q),
        case.arr(k),
        case.arr(v),
        causal=causal,
        mask=None if mask is None else case.arr(mask),
    )
    case.assert_close(out, expected, what="attention")


@pytest.mark.no_lowp
@pytest.mark.stage("attention")
def test_value_width_differs_from_head_width(case):
    """``v`` may have its own width Dv != Dh."""
    B, H = _batch(case)
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, B, H, 5, 9, 8, Dv=12)
    out = case.module.attention(case.arr(q), case.arr(k), case.arr(v), causal=True)
    case.assert_close(out, ref.attention(q, k, v, causal=True), what="attention Dv=12")


@pytest.mark.no_lowp
@pytest.mark.stage("attention")
def test_explicit_scale(case):
    B, H = _batch(case)
    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, B, H, 6, 6, 4)
    out = case.module.attention(case.arr(q), case.arr(k), case.arr(v), scale=0.3)
    case.assert_close(out, ref.attention(q, k, v, scale=0.3), what="attention scale=0.3")


MASK_SHAPES = {
    "S": lambda B, H, T, S: (S,),  # one row of keys for every query, head and batch row
    "TS": lambda B, H, T, S: (T, S),
    "B1TS": lambda B, H, T, S: (B, 1, T, S),
    "1H1S": lambda B, H, T, S: (1, H, 1, S),
    "B11S": lambda B, H, T, S: (B, 1, 1, S),
}


@pytest.mark.no_lowp
@pytest.mark.stage("attention")
@pytest.mark.parametrize("form", list(MASK_SHAPES))
def test_broadcast_masks(case, form):
    """Masks broadcast to (B,H,T,S) like numpy arrays, from the right."""
    B, H = _batch(case)
    T, S = 5, 7
    rng = np.random.default_rng(9)
    q, k, v = _qkv(rng, B, H, T, S, 4)
    mask = random_mask(rng, MASK_SHAPES[form](B, H, T, S))
    out = case.module.attention(case.arr(q), case.arr(k), case.arr(v), mask=case.arr(mask))
    case.assert_close(out, ref.attention(q, k, v, mask=mask), what=f"attention mask {form}")


KEY_BROADCAST = {"T1": (5, 1), "1HT1": (1, 2, 5, 1), "scalar": ()}


@pytest.mark.no_lowp
@pytest.mark.parametrize("form", list(KEY_BROADCAST))
def test_masks_that_broadcast_along_the_keys(case, form):
    """A mask of one column (or a scalar) is a verdict per query on every key: True keeps the
    row whole, False empties it, which is the empty-row error at every level."""
    B, H = _batch(case)
    T, S = 5, 7
    q, k, v = _qkv(np.random.default_rng(11), B, H, T, S, 4)
    shape = KEY_BROADCAST[form]
    if form == "1HT1":
        shape = (1, H, T, 1)
    mask = np.ones(shape, dtype=bool)
    args = (case.arr(q), case.arr(k), case.arr(v))
    out = case.module.attention(*args, mask=case.arr(mask))
    case.assert_close(out, ref.attention(q, k, v), what=f"attention mask {form} (all True)")
    if mask.ndim:
        mask.reshape(-1)[-1] = False  # the last query's row (of one head) is left empty
        with pytest.raises(ValueError, match="no key it may attend"):
            case.module.attention(*args, mask=case.arr(mask))


@pytest.mark.best_dtype
@pytest.mark.stage("attention")
def test_causal_is_bottom_right(case):
    """With T < S the last query sees every key and the first sees S - T + 1 of them.

    Checked without the reference: causal attention must equal non-causal
    attention with the bottom-right mask written out by hand.
    """
    B, H = _batch(case)
    T, S = 3, 7
    rng = np.random.default_rng(10)
    q, k, v = _qkv(rng, B, H, T, S, 4)
    by_hand = np.array(
        [[j <= i + (S - T) for j in range(S)] for i in range(T)]
    )  # first row: keys 0..4
    causal = case.np(case.module.attention(case.arr(q), case.arr(k), case.arr(v), causal=True))
    masked = case.np(
        case.module.attention(case.arr(q), case.arr(k), case.arr(v), mask=case.arr(by_hand))
    )
    case.assert_close(causal, masked, what="causal vs explicit bottom-right mask")
    # One query against a cache: causal masks nothing.
    full = case.np(case.module.attention(case.arr(q[:, :, -1:]), case.arr(k), case.arr(v)))
    case.assert_close(causal[:, :, -1:], full, what="last query sees every key")


# (T, S, Hkv, causal, masked) with H = 4 query heads: multi-query (Hkv = 1), groups of two
# (Hkv = 2: query heads 0 and 1 read key head 0, heads 2 and 3 key head 1), one key head a
# query head (Hkv = H); T < S (a cache) and T > S (without causal).
GROUPED = [(3, 7, 1, True, False), (5, 5, 2, True, True), (6, 4, 2, False, True), (2, 9, 4, False, False)]  # fmt: skip


@pytest.mark.no_lowp
@pytest.mark.stage("attention")
@pytest.mark.parametrize(
    "T,S,Hkv,causal,masked",
    GROUPED,
    ids=[f"T{T}-S{S}-Hkv{h}-{'causal' if c else 'full'}{'-mask' if m else ''}" for T, S, h, c, m in GROUPED],
)  # fmt: skip
def test_key_heads_shared_in_groups(case, T, S, Hkv, causal, masked):
    """Query head ``h`` reads key/value head ``h // (H // Hkv)``: consecutive query heads share
    one (Llama's ``repeat_kv``), which an interleaved mapping (``h % Hkv``) gets wrong."""
    B, H, Dh = 2, 4, 6
    rng = np.random.default_rng(100 * T + 10 * S + Hkv)
    q = rng.normal(size=(B, H, T, Dh))
    k, v = rng.normal(size=(B, Hkv, S, Dh)), rng.normal(size=(B, Hkv, S, Dh + 1))  # Dv != Dh
    mask = None
    if masked:
        mask = random_mask(rng, (B, 1, T, S))
        mask[..., np.arange(T), np.minimum(np.arange(T) + (S - T), S - 1)] = True  # a key a row
    expected = ref.attention(q, k, v, causal=causal, mask=mask)
    out = case.module.attention(
        case.arr(q), case.arr(k), case.arr(v), causal=causal,
        mask=None if mask is None else case.arr(mask),
    )  # fmt: skip
    case.assert_close(out, expected, what=f"attention, {H} query heads over {Hkv} key heads")


def _large_scores(base: int, T: int, S: int, B=2, H=2):
    """q, k with integer entries whose scores ``q . k`` (at scale 1) are ``base`` plus
    ``-27 .. 27``: exact in every float dtype, far past ``exp``'s overflow (709.8 in
    float64, 88.7 in float32) when ``base`` is, and spread out, so that several keys of a
    row weigh."""
    rng = np.random.default_rng(base)
    root = int(round(base**0.5))
    q = np.concatenate([np.full((B, H, T, 1), root), rng.integers(-3, 4, (B, H, T, 3))], axis=-1)
    k = np.concatenate([np.full((B, H, S, 1), root), rng.integers(-3, 4, (B, H, S, 3))], axis=-1)
    return q.astype(np.float64), k.astype(np.float64)


@pytest.mark.no_lowp
@pytest.mark.stage("softmax")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_scores_far_past_overflow(case, causal):
    """Scores of about 900 in float64 (``exp`` overflows above 709.8) and 100 in float32
    (above 88.7): right only with each row's maximum subtracted first. Two keys are masked
    and their values huge, so that any weight they keep shows."""
    base = 900 if case.dtype == "float64" else 100
    B, H, T, S = 2, 2, 5, 9
    q, k = _large_scores(base, T, S, B, H)
    v = np.random.default_rng(1).normal(size=(B, H, S, 3))
    v[:, :, :2] = 1e6
    mask = np.ones((T, S), dtype=bool)
    mask[:, :2] = False  # (T, S): keys 0 and 1 hidden from every query
    expected = ref.attention(q, k, v, causal=causal, mask=mask, scale=1.0)
    out = case.module.attention(
        case.arr(q), case.arr(k), case.arr(v), causal=causal, mask=case.arr(mask), scale=1.0
    )
    case.assert_close(out, expected, what=f"attention with scores near {base}")
