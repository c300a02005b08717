"""The arithmetic of the levels that compute through an ``ops`` module (levels 0 and 1, and a
learner's rung), one function at a time, against the float64 reference: the softmax,
RoPE, the two norms, and the KV cache's two methods.

The pieces' and models' tests check the same arithmetic inside the layers; here each
function is held alone, at the shapes a rung's stage is written for, so that a learner's
rung hears about its RoPE before its block (``stage``). The torch levels write these
inside their modules (``tests/test_pieces.py`` checks them there).
"""

from __future__ import annotations

import numpy as np
import pytest
import reference as ref
from _helpers import small_config

TORCH_LEVELS = ("level2_torch_manual", "level3_sdpa_flash", "level4_triton_kernel")
pytestmark = [pytest.mark.no_lowp, pytest.mark.exclude_levels(*TORCH_LEVELS)]


# Level 0's softmax takes one row of the allowed scores alone (its attention leaves the
# others out): not this function.
@pytest.mark.exclude_levels("level0_loops", *TORCH_LEVELS)
@pytest.mark.stage("softmax")
def test_softmax_of_ordinary_large_and_forbidden_scores(case):
    """Rows of ordinary scores, rows far past ``exp``'s overflow ([1000, 999, 998]) and far
    under its underflow (all of a row's scores near -1000), and ``-inf`` (a key the row may
    not see), which must weigh exactly 0."""
    rng = np.random.default_rng(0)
    scores = 3.0 * rng.normal(size=(2, 3, 5, 7))  # (B, H, T, S)
    scores[0, 0, 0] = [1000.0, 999.0, 998.0, 990.0, 1000.0, 0.0, 500.0]
    scores[0, 0, 1] = -1000.0 - np.arange(7)  # exp(-1000) underflows to 0: 0 / 0 unshifted
    forbidden = rng.random((2, 3, 5, 7)) < 0.3
    forbidden[..., 0] = False  # every row keeps a key
    scores = np.where(forbidden, -np.inf, scores)
    got = case.np(case.module.ops.softmax(case.arr(scores)))
    case.assert_close(got, ref.softmax(scores), what="softmax")
    assert (got[forbidden] == 0).all(), "softmax: a score of -inf must weigh exactly 0"


@pytest.mark.stage("rope")
@pytest.mark.parametrize("Dh", [4, 6], ids=["Dh4", "Dh6"])
def test_rope_turns_adjacent_pairs_by_position(case, Dh):
    """Each row at its own positions (a cache's rows stand at different places), a padded
    token (``-1``) as position 0; ``Dh = 6`` gives three pairs, whose middle one a swap of
    the halves for the pairs would move."""
    rng = np.random.default_rng(Dh)
    B, H, T, base = 2, 3, 5, 100.0
    x = rng.normal(size=(B, H, T, Dh))
    positions = np.array([[4, 5, 6, 7, 8], [0, 1, 2, -1, -1]])  # (B, T)
    expected = np.stack([ref.rope(x[b], np.maximum(positions[b], 0), base) for b in range(B)])
    got = case.module.ops.rope(case.arr(x), case.arr(positions), base)
    case.assert_close(got, expected, what=f"rope, Dh={Dh}")


@pytest.mark.stage("norms")
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_layer_norm_and_rms_norm_over_the_last_axis(case, bias):
    """Over the last axis of a 3-D and a 4-D input (the stream, and a head of QK-norm),
    with an offset and a spread far from 0 and 1 so that the mean and the variance
    both matter, an odd width, and ``eps`` large enough to show where it goes."""
    rng = np.random.default_rng(1)
    ops = case.module.ops
    for shape in ((2, 5, 7), (2, 3, 4, 7)):
        x = 3.0 + 2.5 * rng.normal(size=shape)
        weight, b = 1.0 + 0.3 * rng.normal(size=7), (0.5 * rng.normal(size=7) if bias else None)
        eps = 0.1  # a tenth of the variance's scale (6.25): eps inside or outside the root differ
        got = ops.layer_norm(case.arr(x), case.arr(weight), None if b is None else case.arr(b), eps)
        case.assert_close(got, ref.layer_norm(x, weight, b, eps), what="layer_norm")
        got = ops.rms_norm(case.arr(x), case.arr(weight), eps)
        case.assert_close(got, ref.rms_norm(x, weight, eps), what="rms_norm")


@pytest.mark.stage("cache")
def test_the_cache_appends_each_pass_and_returns_every_slot(case):
    """Three passes (a prefill of a padded batch, two tokens, one): after each, ``extend``
    returns every slot's position and each layer's ``update`` every key and value, in the
    order they came; the cache's length and its rows' next positions follow."""
    config = small_config(case.tiny, n_kv_heads=1)
    cache = case.module.KVCache(config, 2, ops=case.module.ops)
    rng = np.random.default_rng(2)
    Dh = config.d_head
    passes = [np.array([[0, 1, 2], [0, 1, -1]]), np.array([[3, 4], [2, 3]]), np.array([[5], [4]])]
    seen_positions, seen = np.zeros((2, 0), np.int64), [[np.zeros((2, 1, 0, Dh))] * 2] * config.n_layers  # fmt: skip
    for n, positions in enumerate(passes, 1):
        seen_positions = np.concatenate([seen_positions, positions], axis=1)  # (B, S)
        got = case.np(cache.extend(case.arr(positions)))
        np.testing.assert_array_equal(got, seen_positions, err_msg=f"extend, pass {n}")
        assert cache.length == seen_positions.shape[1], f"the cache's length after pass {n}"
        T = positions.shape[1]
        for layer in range(config.n_layers):
            k, v = rng.normal(size=(2, 1, T, Dh)), rng.normal(size=(2, 1, T, Dh))
            want = [
                np.concatenate([old, new], axis=2)
                for old, new in zip(seen[layer], (k, v), strict=True)
            ]
            seen[layer] = want
            got_k, got_v = cache.update(layer, case.arr(k), case.arr(v))
            case.assert_close(got_k, want[0], what=f"update: layer {layer}'s keys, pass {n}")
            case.assert_close(got_v, want[1], what=f"update: layer {layer}'s values, pass {n}")
    np.testing.assert_array_equal(np.asarray(cache.next_positions()), [6, 5])
