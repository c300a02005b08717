"""Every row of the error table, at every level.

Each failing call runs inside a Triton launch counter: a level must reject bad
input *before* any kernel runs (a kernel given an out-of-range token id or an
empty row would read out of bounds or produce NaN). Levels without kernels
trivially launch none. Configuration errors do not involve a level and are
tested once, in test_config_params.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import types

import numpy as np
import pytest
import torch
from _helpers import count_kernel_launches, random_tokens

from levels import TransformerConfig, init_params


@contextlib.contextmanager
def raises_before_launch(exc_type, match=None):
    """``pytest.raises`` that also asserts no Triton kernel was launched."""
    with count_kernel_launches() as launches:
        with pytest.raises(exc_type, match=match) as info:
            yield info
    assert launches[0] == 0, f"{launches[0]} kernel launch(es) before the {exc_type.__name__}"


def tiny_config(**overrides) -> TransformerConfig:
    base = dict(vocab_size=11, d_model=8, n_heads=2, d_ff=12, n_layers=1, max_seq_len=6)
    return TransformerConfig(**(base | overrides))


def _qkv(level, T=3, S=5, Dh=4, *, k_shape=None, v_shape=None):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(1, 2, T, Dh))
    k = rng.normal(size=k_shape or (1, 2, S, Dh))
    v = rng.normal(size=v_shape or (1, 2, S, Dh))
    return level.arr(q), level.arr(k), level.arr(v)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------

BAD_SHAPES = {
    "k-head-width": dict(k_shape=(1, 2, 5, 6)),
    "v-length": dict(v_shape=(1, 2, 4, 4)),
    "k-batch": dict(k_shape=(2, 2, 5, 4)),
    "v-heads": dict(v_shape=(1, 3, 5, 4)),
    "k-3d": dict(k_shape=(2, 5, 4)),
}


@pytest.mark.parametrize("bad", list(BAD_SHAPES))
def test_mismatched_qkv_shapes(level, bad):
    q, k, v = _qkv(level, **BAD_SHAPES[bad])
    bad_shape = BAD_SHAPES[bad].get("k_shape") or BAD_SHAPES[bad]["v_shape"]
    # The message names the shapes.
    with raises_before_launch(ValueError, match=re.escape(str(bad_shape))):
        level.module.attention(q, k, v)


@pytest.mark.parametrize("dtype", [np.float64, np.int64], ids=["float", "int"])
def test_non_boolean_mask(level, dtype):
    q, k, v = _qkv(level)
    mask = level.arr(np.ones((3, 5), dtype=dtype))  # all ones: only the dtype is wrong
    with raises_before_launch(TypeError):
        level.module.attention(q, k, v, mask=mask)


@pytest.mark.parametrize("shape", [(4, 5), (3, 4), (2, 1, 3, 5), (1, 1, 1, 3, 5)])
def test_mask_not_broadcastable(level, shape):
    q, k, v = _qkv(level)
    with raises_before_launch(ValueError, match="broadcast"):
        level.module.attention(q, k, v, mask=level.arr(np.ones(shape, dtype=bool)))


@pytest.mark.stage("softmax")  # a learner's rung: the row that sees nothing
def test_empty_row_from_mask(level):
    q, k, v = _qkv(level)
    mask = np.ones((1, 2, 3, 5), dtype=bool)
    mask[0, 1, 2, :] = False  # head 1, query 2 may attend nothing
    with raises_before_launch(ValueError):
        level.module.attention(q, k, v, mask=level.arr(mask))


@pytest.mark.stage("softmax")  # a learner's rung: the row that sees nothing
def test_empty_row_from_causal_with_more_queries_than_keys(level):
    q, k, v = _qkv(level, T=5, S=3)  # bottom-right: queries 0 and 1 see no key
    with raises_before_launch(ValueError):
        level.module.attention(q, k, v, causal=True)


@pytest.mark.stage("softmax")  # a learner's rung: the row that sees nothing
def test_empty_row_from_causal_and_mask_together(level):
    """Each alone leaves every row non-empty; together query 0 sees nothing."""
    q, k, v = _qkv(level, T=3, S=3)
    mask = np.ones((3, 3), dtype=bool)
    mask[0, 0] = False  # query 0 loses key 0, the only key causality leaves it
    level.module.attention(q, k, v, mask=level.arr(mask))  # fine alone
    with raises_before_launch(ValueError):
        level.module.attention(q, k, v, mask=level.arr(mask), causal=True)


# ---------------------------------------------------------------------------
# Models: tokens, validity, lengths
# ---------------------------------------------------------------------------


def _models(level, config):
    dec = level.build("DecoderOnlyTransformer", config, init_params(config, "decoder_only", seed=0))
    s2s = level.build("Seq2SeqTransformer", config, init_params(config, "seq2seq", seed=0))
    return dec, s2s


def test_sequence_without_valid_token(level):
    config = tiny_config()
    dec, s2s = _models(level, config)
    rng = np.random.default_rng(1)
    tokens = random_tokens(rng, config, 2, 4)
    valid = np.ones((2, 4), dtype=bool)
    valid[1] = False
    ok = np.ones((2, 4), dtype=bool)
    with raises_before_launch(ValueError):
        dec.forward(level.arr(tokens), valid=level.arr(valid))
    with raises_before_launch(ValueError):
        dec.prefill(level.arr(tokens), valid=level.arr(valid))
    with raises_before_launch(ValueError):  # the source row is all padding
        s2s.forward(
            level.arr(tokens),
            level.arr(tokens),
            src_valid=level.arr(valid),
            tgt_valid=level.arr(ok),
        )
    with raises_before_launch(ValueError):  # the target row is all padding
        s2s.forward(
            level.arr(tokens),
            level.arr(tokens),
            src_valid=level.arr(ok),
            tgt_valid=level.arr(valid),
        )


@pytest.mark.parametrize(
    "row",
    [[False, True, True, True], [True, False, True, True], [True, True, False, True]],
    ids=["left-padded", "a hole", "a real last token after padding"],
)
def test_valid_rows_must_be_right_padded(level, row):
    """A real token after padding is refused by the edge, at every entry point, before
    anything runs. (Inside, the layers trust their masks: a left-padded causal row would
    leave its first query without a key, which softmax turns into NaN.)"""
    config = tiny_config()
    dec, s2s = _models(level, config)
    ids = random_tokens(np.random.default_rng(2), config, 2, 4)
    tokens = level.arr(ids)
    valid = level.arr(np.array([[True] * 4, row]))
    ok = level.arr(np.ones((2, 4), dtype=bool))
    message = r"not right-padded.*\(row\(s\) \[1\]\)"  # the bad row named: row 1 of two
    with raises_before_launch(ValueError, match=message):
        dec.forward(tokens, valid=valid)
    with raises_before_launch(ValueError, match=message):
        dec.prefill(tokens, valid=valid)
    _, cache = dec.prefill(tokens)
    before = cache.length
    left_padded = level.arr(np.array([[True, True], [False, True]]))
    with raises_before_launch(ValueError, match=message):
        dec.extend(level.arr(ids[:, :2]), cache, valid=left_padded)
    assert cache.length == before  # nothing was appended
    with raises_before_launch(ValueError, match=message):
        s2s.forward(tokens, tokens, src_valid=valid, tgt_valid=ok)
    with raises_before_launch(ValueError, match=message):
        s2s.forward(tokens, tokens, src_valid=ok, tgt_valid=valid)


def test_valid_mask_must_be_boolean_and_match_tokens(level):
    config = tiny_config()
    dec, s2s = _models(level, config)
    tokens = random_tokens(np.random.default_rng(6), config, 2, 4)
    with raises_before_launch(TypeError):
        dec.forward(level.arr(tokens), valid=level.arr(np.ones((2, 4), dtype=np.int64)))
    with raises_before_launch(ValueError):
        dec.forward(level.arr(tokens), valid=level.arr(np.ones((2, 3), dtype=bool)))
    with raises_before_launch(ValueError):
        s2s.forward(
            level.arr(tokens), level.arr(tokens), src_valid=level.arr(np.ones((2, 5), dtype=bool))
        )


@pytest.mark.parametrize("bad_id", [-1, 11, 1000], ids=["negative", "V", "far"])
def test_token_out_of_vocabulary(level, bad_id):
    config = tiny_config()  # V = 11
    dec, s2s = _models(level, config)
    rng = np.random.default_rng(2)
    good = random_tokens(rng, config, 2, 4)
    bad = good.copy()
    bad[1, 2] = bad_id
    match = str(bad_id)
    with raises_before_launch(ValueError, match=match):
        dec.forward(level.arr(bad))
    with raises_before_launch(ValueError, match=match):
        dec.prefill(level.arr(bad))
    with raises_before_launch(ValueError, match=match):
        dec.generate(level.arr(bad), 1)
    with raises_before_launch(ValueError, match=match):  # bad source id
        s2s.forward(level.arr(bad), level.arr(good))
    with raises_before_launch(ValueError, match=match):  # bad target id
        s2s.forward(level.arr(good), level.arr(bad))
    with raises_before_launch(ValueError, match=match):
        s2s.generate(level.arr(bad), max_new_tokens=2)


def test_length_over_max_seq_len(level):
    config = tiny_config()  # max_seq_len = 6
    dec, s2s = _models(level, config)
    rng = np.random.default_rng(3)
    long = random_tokens(rng, config, 1, 7)
    short = random_tokens(rng, config, 1, 3)
    with raises_before_launch(ValueError, match="max_seq_len"):
        dec.forward(level.arr(long))
    with raises_before_launch(ValueError, match="max_seq_len"):
        dec.prefill(level.arr(long))
    with raises_before_launch(ValueError, match="max_seq_len"):
        dec.generate(level.arr(short), 4)  # 3 + 4 > 6
    with raises_before_launch(ValueError, match="max_seq_len"):
        s2s.forward(level.arr(long), level.arr(short))
    with raises_before_launch(ValueError, match="max_seq_len"):
        s2s.forward(level.arr(short), level.arr(long))


# ---------------------------------------------------------------------------
# KV cache: overflow and bad tokens leave the cache unchanged
# ---------------------------------------------------------------------------


def _snapshot(value):
    """A deep copy of a cache's state, whatever the level's array type: numpy arrays and
    tensors become numpy copies, containers and plain objects are walked."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach().cpu().clone().numpy())
    if isinstance(value, np.ndarray):
        return ("array", value.copy())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_snapshot(v) for v in value])
    if isinstance(value, dict):
        return ("dict", {k: _snapshot(v) for k, v in value.items()})
    if isinstance(value, types.ModuleType):  # the level's ops: code, not the cache's state
        return ("value", value.__name__)
    if hasattr(value, "__dict__"):
        return ("object", _snapshot(vars(value)))
    return ("value", value)


def _assert_same_snapshot(before, after, path="cache"):
    assert before[0] == after[0], f"{path}: {before[0]} became {after[0]}"
    kind, a, b = before[0], before[1], after[1]
    if kind in ("tensor", "array"):
        # Bit-identical, NaN in the same places: nothing may have been written.
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=True), f"{path} changed"
    elif kind == "dict":
        assert a.keys() == b.keys(), f"{path}: keys changed"
        for key in a:
            _assert_same_snapshot(a[key], b[key], f"{path}.{key}")
    elif kind in ("list", "tuple"):
        assert len(a) == len(b), f"{path}: length changed"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same_snapshot(x, y, f"{path}[{i}]")
    elif kind == "object":
        _assert_same_snapshot(a, b, path)
    else:
        assert a == b, f"{path}: {a!r} became {b!r}"


def test_kv_cache_overflow_leaves_cache_unchanged(level):
    config = tiny_config()  # capacity 6
    dec, s2s = _models(level, config)
    rng = np.random.default_rng(4)
    tokens = random_tokens(rng, config, 2, 6)
    _, cache = dec.prefill(level.arr(tokens[:, :5]))
    dec.decode_step(level.arr(tokens[:, 5]), cache)
    assert cache.length == 6
    before = _snapshot(cache)
    with raises_before_launch(ValueError, match="overflow"):
        dec.decode_step(level.arr(tokens[:, 0]), cache)
    assert cache.length == 6, "a failed decode_step must not grow the cache"
    _assert_same_snapshot(before, _snapshot(cache))

    src = random_tokens(rng, config, 2, 4)
    _, cache = s2s.prefill(level.arr(src), level.arr(tokens[:, :6]))
    assert cache.length == 6
    before = _snapshot(cache)
    with raises_before_launch(ValueError, match="overflow"):
        s2s.decode_step(level.arr(tokens[:, 0]), cache)
    assert cache.length == 6
    _assert_same_snapshot(before, _snapshot(cache))


def test_failed_decode_step_leaves_cache_usable(level):
    """A rejected token changes nothing: the next good step gives the full-forward logits."""
    config = tiny_config()
    dec, s2s = _models(level, config)
    rng = np.random.default_rng(5)
    tokens = random_tokens(rng, config, 2, 4)
    full = level.np(dec.forward(level.arr(tokens)))
    _, cache = dec.prefill(level.arr(tokens[:, :3]))
    with raises_before_launch(ValueError):
        dec.decode_step(level.arr(np.array([1, config.vocab_size])), cache)
    assert cache.length == 3
    level.assert_close(
        dec.decode_step(level.arr(tokens[:, 3]), cache), full[:, 3], what="step after failure"
    )

    src = random_tokens(rng, config, 2, 5)
    full = level.np(s2s.forward(level.arr(src), level.arr(tokens)))
    _, cache = s2s.prefill(level.arr(src), level.arr(tokens[:, :3]))
    with raises_before_launch(ValueError):
        s2s.decode_step(level.arr(np.array([-1, 1])), cache)
    assert cache.length == 3
    level.assert_close(
        s2s.decode_step(level.arr(tokens[:, 3]), cache), full[:, 3], what="step after failure"
    )


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["decoder_only", "seq2seq"])
def test_bad_parameters_are_listed(level, kind):
    config = tiny_config()
    cls = "DecoderOnlyTransformer" if kind == "decoder_only" else "Seq2SeqTransformer"
    params = init_params(config, kind, seed=0)
    missing = "layers.0.norm2.bias" if kind == "decoder_only" else "decoder.layers.0.norm3.weight"
    misshaped = (
        "layers.0.linear1.weight" if kind == "decoder_only" else "encoder.layers.0.linear2.weight"
    )
    bad = dict(params)
    del bad[missing]
    bad["layers.9.surprise"] = np.zeros(3)
    bad[misshaped] = np.zeros((5, 5))
    with raises_before_launch(ValueError) as info:
        level.build(cls, config, bad)
    message = str(info.value)
    for name in (missing, "layers.9.surprise", misshaped):
        assert name in message, f"{name!r} not named in: {message}"


@pytest.mark.parametrize("kind", ["decoder_only", "seq2seq"])
def test_complex_parameters_are_refused(level, kind):
    """A complex parameter would lose its imaginary part in a real dtype: refused, named."""
    config = tiny_config()
    params = init_params(config, kind, seed=0)
    params["token_embedding.weight" if kind == "decoder_only" else "output_projection.weight"] = (
        params["token_embedding.weight" if kind == "decoder_only" else "output_projection.weight"]
        * (1 + 1j)
    )
    cls = "DecoderOnlyTransformer" if kind == "decoder_only" else "Seq2SeqTransformer"
    with raises_before_launch(TypeError, match="not real numbers: .*weight"):
        level.build(cls, config, params)


# ---------------------------------------------------------------------------
# Token arrays: shape and dtype, at the model boundary
# ---------------------------------------------------------------------------

BAD_TOKEN_SHAPES = {
    "1-D": np.array([3, 4]),
    "0-d": np.array(3),
    "(B,T,1)": np.array([[[3], [4]]]),
    "empty batch (0,T)": np.zeros((0, 3), dtype=np.int64),
    "empty row (B,0)": np.zeros((2, 0), dtype=np.int64),
}


@pytest.mark.parametrize("shape", list(BAD_TOKEN_SHAPES))
def test_token_arrays_of_the_wrong_shape(level, shape):
    dec, s2s = _models(level, tiny_config())
    bad = level.arr(BAD_TOKEN_SHAPES[shape])
    good = level.arr(np.array([[3, 4, 5]]))
    # The shape as the level holds it (level 0's nested lists hold (0, T) as [], shape (0,)).
    got = re.escape(str(np.asarray(level.module.to_numpy(bad)).shape))
    for call in (
        lambda: dec.forward(bad),
        lambda: dec.prefill(bad),
        lambda: dec.generate(bad, 2),
        lambda: s2s.forward(bad, good),
        lambda: s2s.forward(good, bad),  # a 1-D target, say
        lambda: s2s.generate(bad, max_new_tokens=2),
    ):
        with raises_before_launch(ValueError, match=rf"non-empty \(B, T\) array .*{got}"):
            call()


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "uint8"])
def test_token_ids_of_any_integer_dtype(level, dtype):
    """The same logits as int64 ids (a uint8 tensor is ids, not a boolean index)."""
    dec, _ = _models(level, tiny_config())
    tokens = np.array([[3, 4, 5], [6, 7, 0]])
    want = level.np(dec.forward(level.arr(tokens)))
    got = level.np(dec.forward(level.arr(tokens.astype(dtype))))
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.float64, np.bool_], ids=["float", "bool"])
def test_token_ids_must_be_integers(level, dtype):
    dec, s2s = _models(level, tiny_config())
    bad = level.arr(np.ones((1, 3), dtype=dtype))
    good = level.arr(np.array([[3, 4, 5]]))
    for call in (
        lambda: dec.forward(bad),
        lambda: dec.generate(bad, 2),  # generate refuses what forward refuses
        lambda: dec.generate(bad, 0),  # even with nothing to generate
        lambda: s2s.forward(good, bad),
        lambda: s2s.generate(bad),
    ):
        with raises_before_launch(TypeError, match="integer token ids"):
            call()


@pytest.mark.torch_only
def test_a_float_id_tensor_is_refused_by_its_own_dtype(level):
    """The edge reads ids as numpy, which has no bfloat16: the error still names the tensor's."""
    dec, _ = _models(level, tiny_config())
    for dtype in (torch.bfloat16, torch.float16):
        with raises_before_launch(TypeError, match=rf"got dtype {str(dtype)[6:]}$"):
            dec.forward(torch.ones((1, 3), dtype=dtype, device=level.device))


def test_ragged_rows_of_ids_or_valid_are_one_clear_error(level):
    """Nested lists whose rows differ in length are refused at every level with the same
    message (no numpy message about inhomogeneous shapes, no index error inside a layer),
    by the models' edge and by the generation loops alike."""
    dec, s2s = _models(level, tiny_config())
    for call in (
        lambda: dec.forward([[3, 4, 5], [6, 7]]),
        lambda: dec.forward([[3, 4], [6, 7]], valid=[[True, True], [True]]),
        lambda: s2s.forward([[3, 4], [5]], [[3, 4], [6, 7]]),
        # generate reads its prompts itself (the shared loops), with the same message
        lambda: dec.generate([[3, 4, 5], [6, 7]], 1),
        lambda: dec.generate([[3, 4], [6, 7]], 1, valid=[[True, True], [True]]),
        lambda: s2s.generate([[3, 4], [5]], max_new_tokens=1),
        lambda: s2s.generate([[3, 4], [5, 6]], src_valid=[[True, True], [True]], max_new_tokens=1),
    ):
        with raises_before_launch(ValueError, match="rows of different lengths"):
            call()


def test_generate_checks_its_inputs_with_nothing_to_generate(level):
    config = tiny_config()  # V = 11, max_seq_len = 6
    dec, s2s = _models(level, config)
    with raises_before_launch(ValueError, match="99 is outside"):
        dec.generate(level.arr(np.array([[3, 99]])), 0)
    with raises_before_launch(ValueError, match="source length 9 exceeds max_seq_len=6"):
        s2s.generate(level.arr(np.full((1, 9), 3)), max_new_tokens=0)
    with raises_before_launch(ValueError, match="max_new_tokens must be >= 0"):
        dec.generate(level.arr(np.array([[3, 4]])), -1)
    with raises_before_launch(TypeError, match="max_new_tokens must be an integer"):
        dec.generate(level.arr(np.array([[3, 4]])), 2.5)


def test_seq2seq_generate_has_one_default_length(level):
    """Without max_new_tokens, a row that never ends runs to max_seq_len - 1 new tokens."""
    config = tiny_config(eos_id=10)  # an EOS these random weights are unlikely to pick early
    _, s2s = _models(level, config)
    out = level.np(s2s.generate(level.arr(np.array([[3, 4, 5]]))))
    ended = (out[0, 1:] == config.eos_id).any()
    assert ended or out.shape == (1, config.max_seq_len)


def test_decode_step_with_another_batch_leaves_the_cache_bit_identical(level):
    config = tiny_config()
    dec, s2s = _models(level, config)
    tokens = random_tokens(np.random.default_rng(8), config, 2, 4)
    _, cache = dec.prefill(level.arr(tokens[:, :3]))
    before = _snapshot(cache)
    with raises_before_launch(ValueError, match="got 1 rows for a batch of 2"):
        dec.decode_step(level.arr(tokens[:1, 3]), cache)
    _assert_same_snapshot(before, _snapshot(cache))
    _, cache = s2s.prefill(level.arr(tokens), level.arr(tokens[:, :3]))
    before = _snapshot(cache)
    with raises_before_launch(ValueError, match="got 3 rows for a batch of 2"):
        s2s.decode_step(level.arr(np.array([3, 4, 5])), cache)
    _assert_same_snapshot(before, _snapshot(cache))


# ---------------------------------------------------------------------------
# Attention inputs
# ---------------------------------------------------------------------------


def test_attention_refuses_integer_inputs(level):
    q = level.arr(np.ones((1, 2, 3, 4), dtype=np.int64))
    with raises_before_launch(TypeError, match="floating-point q, k and v"):
        level.module.attention(q, q, q)


@pytest.mark.exclude_levels("level0_loops")  # one number type only: Python's float
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_attention_refuses_q_k_v_of_mixed_dtypes(level, which):
    """One of q, k, v in the level's second dtype: the same TypeError at every level, never
    a silent promotion (numpy's), a silent cast to q's dtype (a torch product's) or SDPA's
    own RuntimeError."""
    other = dataclasses.replace(level, dtype=level.module.FACTS.dtypes[1])
    q, k, v = _qkv(level, T=3, S=3)
    arrays = {"q": q, "k": k, "v": v}
    arrays[which] = other.arr(level.module.to_numpy(arrays[which]))
    names = [str(getattr(a, "dtype", "")).replace("torch.", "") for a in arrays.values()]
    assert len(set(names)) == 2, names  # the mix the test is about
    with raises_before_launch(TypeError, match=re.escape(f"of one dtype; got {', '.join(names)}")):
        level.module.attention(*arrays.values(), causal=True)


@pytest.mark.parametrize("scale", [0.0, -0.5, float("nan"), float("inf")])
def test_attention_scale_must_be_positive_and_finite(level, scale):
    """A scale of 0 or below would make every row uniform or invert it (SDPA returns NaN for
    some of these); the contract refuses it at every level instead."""
    q, k, v = _qkv(level, T=3, S=3)
    with raises_before_launch(ValueError, match="scale must be a positive finite number"):
        level.module.attention(q, k, v, causal=True, scale=scale)
