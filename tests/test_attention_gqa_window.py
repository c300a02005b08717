"""Grouped-query attention, sliding windows and the log-sum-exp, at every level.

* values against the float64 reference (``tests/reference.py``) over
  ``Hkv`` in {1, 2, H}, windows ``W`` in {1, 3, S}, ``T != S`` both ways,
  causal on and off, with and without a mask;
* ``return_lse``: the natural log of each row's sum of ``exp(score)``;
* the merge identity: attention over keys split into 1 to 5 disjoint chunks,
  merged by their log-sum-exps (``merge_attention``), equals attention over
  all the keys, values and (torch levels, level 1) gradients;
* gradients of the torch levels and of level 1's hand-written backward against
  PyTorch's own SDPA (math backend, ``enable_gqa``) in float64 autograd;
* the errors: mismatched head counts name both, a non-positive window.
"""

from __future__ import annotations

import numpy as np
import pytest
import reference as ref
import torch
from _helpers import random_mask

pytestmark = pytest.mark.no_lowp

H = 4
# (T, S, Hkv, window, causal): every Hkv of {1, 2, H} and window of {1, 3, S, None},
# T < S, T = S and T > S (the latter without causal), small enough for level 0.
CASES = [
    (5, 9, 1, 3, True),
    (5, 9, 2, 1, True),
    (5, 9, H, 9, True),
    (7, 7, 2, 3, True),
    (7, 7, 1, None, True),
    (9, 5, 2, 6, False),  # T > S: the band must reach back to the first keys
    (6, 11, 1, 4, False),
    (1, 9, 2, 3, True),  # decoding: one query against a cache
    (7, 7, H, None, False),
]
IDS = [f"T{T}-S{S}-Hkv{h}-W{w}-{'causal' if c else 'full'}" for T, S, h, w, c in CASES]


def _inputs(seed, T, S, Hkv, Dh=4, B=2):
    rng = np.random.default_rng(seed)
    return (
        rng.normal(size=(B, H, T, Dh)),
        rng.normal(size=(B, Hkv, S, Dh)),
        rng.normal(size=(B, Hkv, S, Dh + 1)),  # Dv != Dh
        rng,
    )


def _mask_keeping_rows(rng, T, S, window, causal, B=2):
    """A random (B, 1, T, S) mask that leaves every row a key its position rule allows."""
    mask = random_mask(rng, (B, 1, T, S))
    allowed = np.ones((T, S), dtype=bool)
    if causal:
        allowed &= ref.causal_mask(T, S)
    if window is not None:
        allowed &= ref.window_mask(T, S, window, causal=causal)
    last = np.where(allowed.any(axis=1), S - 1 - np.argmax(allowed[:, ::-1], axis=1), 0)
    mask[..., np.arange(T), last] = True  # each row's last allowed key
    return mask


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("T,S,Hkv,window,causal", CASES, ids=IDS)
def test_values_and_lse_match_the_reference(case, T, S, Hkv, window, causal, masked):
    q, k, v, rng = _inputs(T * 100 + S * 10 + Hkv, T, S, Hkv)
    mask = _mask_keeping_rows(rng, T, S, window, causal) if masked else None
    want, want_lse = ref.attention(
        q, k, v, causal=causal, mask=mask, window=window, return_lse=True
    )
    kw = dict(causal=causal, window=window, mask=None if mask is None else case.arr(mask))
    a = case.module.attention
    out = a(case.arr(q), case.arr(k), case.arr(v), **kw)
    case.assert_close(out, want, what="attention")
    out, lse = a(case.arr(q), case.arr(k), case.arr(v), return_lse=True, **kw)
    case.assert_close(out, want, what="attention with return_lse")
    case.assert_close(lse, want_lse, what="lse")


def _chunks(S: int, parts: int) -> list[tuple[int, int]]:
    bounds = np.linspace(0, S, parts + 1).astype(int)
    return list(zip(bounds, bounds[1:], strict=False))


@pytest.mark.parametrize("parts", [1, 2, 3, 5])
@pytest.mark.parametrize(
    "causal,window,masked", [(False, None, True), (True, None, False), (True, 3, True)]
)
def test_attention_over_split_keys_merges_to_attention_over_all(
    case, parts, causal, window, masked
):
    """The merge identity: the keys cut into ``parts`` disjoint chunks, each attended with
    the position rule and the mask restricted to its keys, merged by log-sum-exp. A row
    that sees no key of a chunk gets that chunk's first key (so the call is legal) and an
    lse of -inf (so the merge gives it weight 0): how a split over devices treats it."""
    T, S, Hkv = 6, 11, 2
    q, k, v, rng = _inputs(parts, T, S, Hkv)
    mask = _mask_keeping_rows(rng, T, S, window, causal) if masked else None
    allowed = np.broadcast_to(np.ones((T, S), bool) if mask is None else mask, (2, 1, T, S))
    allowed = allowed & (ref.causal_mask(T, S) if causal else True)
    if window is not None:
        allowed = allowed & ref.window_mask(T, S, window, causal=causal)
    want, want_lse = ref.attention(
        q, k, v, causal=causal, mask=mask, window=window, return_lse=True
    )
    parts_native = []
    for lo, hi in _chunks(S, parts):
        chunk = allowed[..., lo:hi].copy()  # (B, 1, T, hi - lo)
        empty = ~chunk.any(axis=-1)  # (B, 1, T): rows this chunk gives nothing
        chunk[..., 0] |= empty
        out, lse = case.module.attention(
            case.arr(q), case.arr(k[:, :, lo:hi]), case.arr(v[:, :, lo:hi]),
            mask=case.arr(chunk), return_lse=True,
        )  # fmt: skip
        lse = np.where(np.broadcast_to(empty, (2, H, T)), -np.inf, case.np(lse))
        parts_native.append((out, case.arr(lse)))
    merged, merged_lse = case.module.merge_attention(parts_native)
    case.assert_close(merged, want, what=f"merge of {parts} chunks")
    case.assert_close(merged_lse, want_lse, what=f"merged lse of {parts} chunks")


@pytest.mark.exclude_levels("level0_loops")
@pytest.mark.parametrize("parts", [2, 3, 5])
def test_merged_attention_has_the_gradients_of_attention_over_all(case, parts):
    """Gradients through the split and the merge (autograd at the torch levels, level 1's
    tape) equal those of one attention over all the keys. Every row keeps a key in every
    chunk (T != S, a mask, no causal rule), so no part is empty."""
    T, S, Hkv = 5, 11, 2
    q, k, v, rng = _inputs(30 + parts, T, S, Hkv)
    mask = random_mask(rng, (2, 1, T, S))
    chunks = _chunks(S, parts)
    for lo, _ in chunks:
        mask[..., lo] = True
    d_out = rng.normal(size=(2, H, T, v.shape[-1]))
    if case.is_torch:

        def grads(split: bool):
            ins = [case.arr(x).requires_grad_() for x in (q, k, v)]
            if split:
                pieces = [
                    case.module.attention(
                        ins[0],
                        ins[1][:, :, lo:hi],
                        ins[2][:, :, lo:hi],
                        mask=case.arr(mask[..., lo:hi]),
                        return_lse=True,
                    )  # fmt: skip
                    for lo, hi in chunks
                ]
                out, _ = case.module.merge_attention(pieces)
            else:
                out = case.module.attention(*ins, mask=case.arr(mask))
            (out * case.arr(d_out)).sum().backward()
            return [x.grad for x in ins]

        split, whole = grads(True), grads(False)
    else:  # level 1: the same split on its tape, and its hand-written backward
        from levels.level1_numpy.backward import Tape

        qa, ka, va = (case.arr(x) for x in (q, k, v))
        tape = Tape({"q": qa, "k": ka, "v": va})
        pieces = [
            tape.attention(qa, ka[:, :, lo:hi], va[:, :, lo:hi], mask=mask[..., lo:hi],
                           return_lse=True)
            for lo, hi in chunks
        ]  # fmt: skip
        out, _ = tape.merge_attention(pieces)
        g = tape.backward(out, case.arr(d_out))
        split = [g["q"], g["k"], g["v"]]
        whole = case.module.attention_grads(qa, ka, va, case.arr(d_out), mask=mask)
    for name, a, b in zip(("dq", "dk", "dv"), split, whole, strict=True):
        case.assert_close(a, case.np(b), what=f"{name} through {parts} merged chunks")


def _sdpa_math_grads(q, k, v, d_out, d_lse, *, causal, window, mask):
    """float64 gradients through PyTorch's SDPA (math backend, its own GQA) and a
    logsumexp written with torch: an implementation that shares nothing with the levels."""
    import math

    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    T, S = q.shape[-2], k.shape[-2]
    allowed = torch.tensor(ref.causal_mask(T, S) if causal else np.ones((T, S), bool))
    if window is not None:
        allowed = allowed & torch.tensor(ref.window_mask(T, S, window, causal=causal))
    if mask is not None:
        allowed = allowed & torch.tensor(mask)
    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, enable_gqa=True
        )
    group = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(group, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    lse = torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    ((out * torch.tensor(d_out)).sum() + (lse * torch.tensor(d_lse)).sum()).backward()
    return [x.grad.numpy() for x in (q, k, v)]


GRAD_CASES = [(5, 9, 1, 3, True), (7, 7, 2, None, True), (6, 11, 2, 4, False), (7, 7, H, 2, True)]


@pytest.mark.exclude_levels("level0_loops")
@pytest.mark.parametrize("use_lse", [False, True], ids=["out", "out+lse"])
@pytest.mark.parametrize("T,S,Hkv,window,causal", GRAD_CASES)
def test_gradients_match_sdpa_math(case, T, S, Hkv, window, causal, use_lse):
    q, k, v, rng = _inputs(7 + T + S, T, S, Hkv)
    d_out = rng.normal(size=q.shape[:3] + (v.shape[-1],))
    d_lse = rng.normal(size=q.shape[:3]) if use_lse else np.zeros(q.shape[:3])
    mask = _mask_keeping_rows(rng, T, S, window, causal)
    want = _sdpa_math_grads(q, k, v, d_out, d_lse, causal=causal, window=window, mask=mask)
    kw = dict(causal=causal, window=window)
    if case.is_torch:
        ins = [case.arr(x).requires_grad_() for x in (q, k, v)]
        out, lse = case.module.attention(*ins, mask=case.arr(mask), return_lse=True, **kw)
        loss = (out * case.arr(d_out)).sum() + (lse * case.arr(d_lse).to(lse.dtype)).sum()
        loss.backward()
        got = [x.grad for x in ins]
    else:  # level 1: the hand-written backward
        got = case.module.attention_grads(
            *(case.arr(x) for x in (q, k, v)),
            case.arr(d_out),
            mask=case.arr(mask),
            d_lse=case.arr(d_lse) if use_lse else None,
            **kw,
        )
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        case.assert_close(g, w, what=name)


def test_head_counts_that_do_not_divide_name_both(level):
    rng = np.random.default_rng(0)
    q = level.arr(rng.normal(size=(1, 4, 3, 4)))
    k = level.arr(rng.normal(size=(1, 3, 5, 4)))
    with pytest.raises(ValueError, match=r"H=4 must be a multiple of the key/value heads Hkv=3"):
        level.module.attention(q, k, k)


@pytest.mark.parametrize("window", [0, -2, 1.5, True])
def test_window_must_be_a_positive_integer(level, window):
    rng = np.random.default_rng(0)
    q = level.arr(rng.normal(size=(1, 2, 3, 4)))
    with pytest.raises(ValueError, match="window must be a positive integer"):
        level.module.attention(q, q, q, causal=True, window=window)
