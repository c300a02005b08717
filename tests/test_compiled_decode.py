"""Level 3's compiled decode step (levels/level3_sdpa_flash/compiled.py) against its eager step.

The compiled step is the model's own code traced at fixed shapes, so it must give the
eager step's logits (float32: within summation-order rounding) and its greedy tokens, for
every batch layout: prompts of different lengths (a ragged cache, its padding at position -1),
local and global layers (a mask per window), and the cache's last slot (decoded eagerly).

Compiling takes tens of seconds a model (inductor, then the C++ compiler), so the checks
that compile are ``extended`` (CI runs them), each model compiled once into one cache for
the session; what needs no compiler runs by default: the step traced whole (no graph
break), and the eager fallback where no compiler is found.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import GEMMA_OPTIONS

import levels
from levels import TransformerConfig, init_params
from levels.common import semantics
from levels.level3_sdpa_flash import compiled

level3 = levels.load("level3_sdpa_flash")

# A Gemma 3 at a test's size (local and global layers, QK-norm, post-norms, GQA with one
# KV head), and a Llama (SwiGLU, grouped heads, untied head).
GEMMA = TransformerConfig(
    vocab_size=61, d_model=24, n_heads=4, d_ff=40, n_layers=2, max_seq_len=20, **GEMMA_OPTIONS
)
LLAMA = TransformerConfig(
    vocab_size=53,
    d_model=32,
    n_heads=4,
    n_kv_heads=2,
    d_ff=64,  # rows of 32 and 64: whole int4 groups of 32
    n_layers=2,
    max_seq_len=24,
    norm="rmsnorm",
    ffn="swiglu",
    bias=False,
    scale_embeddings=False,
    tie_embeddings=False,
)
# Prompts of different lengths, right-padded: the cache is ragged after the prefill.
PROMPTS = np.array([[5, 7, 11, 13, 2, 9], [3, 4, 9, 0, 0, 0]])
VALID = np.array([[True] * 6, [True] * 3 + [False] * 3])
# float32 logits of the compiled and the eager step: the same products summed in another
# order (a dot product per output row, against the library's GEMM), each a few float32 ulps
# of values of order 1-10 after 2 layers; measured 1e-6. A wrong mask, position or cache
# slot moves a logit by its own size.
F32_BOUND = 1e-4


def _model(config, **options):
    params = init_params(config, "decoder_only", seed=1, scheme="random")
    return level3.DecoderOnlyTransformer(config, params, **options)


def test_the_decode_step_traces_whole():
    """The step of a model with every family option, padding and a ragged cache, traced by
    dynamo: one graph, no break (a break would leave Python between two compiled halves)."""
    model = _model(GEMMA)
    args = compiled._example(model, 2, 9)
    with torch.no_grad(), compiled._bare_attention(model):
        explained = torch._dynamo.explain(compiled.DecodeStep(model))(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_without_a_compiler_decoding_is_eager_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("LADDER_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    model = _model(LLAMA, compile=True)
    report = model.prepare_decode(2)
    assert report.how == "eager" and "no-such-c++-compiler" in report.line()
    want = _model(LLAMA).generate(PROMPTS, 6, valid=VALID)
    assert np.array_equal(np.asarray(model.generate(PROMPTS, 6, valid=VALID)), np.asarray(want))
    assert not (tmp_path / "compiled").exists()  # nothing compiled, nothing cached


def test_the_step_reads_the_positions_the_cache_holds():
    """The compiled step's inputs after a ragged prompt: each row's own next position, the
    slot after the cache's filled ones, and every key's position (padding at -1), from
    which the step builds each window's mask as the eager pass does."""
    model = _model(GEMMA)
    with torch.no_grad():
        _, cache = model.prefill(torch.tensor(PROMPTS), valid=torch.tensor(VALID))
    seen = {}

    def run(*inputs):
        seen["inputs"] = inputs
        return torch.zeros(2, 1, GEMMA.vocab_size)

    step = compiled.CompiledDecode(model, 2, run=run, report=None)
    positions = torch.tensor(cache.next_positions())[:, None]  # (B,1)
    assert step(torch.tensor([[1], [2]]), positions, cache).shape == (2, 1, GEMMA.vocab_size)
    ids, positions, slot, key_positions, keys, values = seen["inputs"]
    assert positions.tolist() == [[6], [3]] and slot.tolist() == [6]  # ragged: its own positions
    assert key_positions.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, -1, -1, -1, 3]]
    # The compiled library reads its inputs with the strides it was exported with
    # (contiguous ones), not with the cache's (its positions a narrow of a (B,C) buffer).
    assert key_positions.is_contiguous() and positions.is_contiguous()
    assert cache.length == 7 and len(keys) == len(values) == GEMMA.n_layers
    assert keys[0].shape == (2, 1, 20, 6)  # a layer of the cache, written in place at the slot
    local = semantics.visible(positions, key_positions, 3)[:, 0, 0]  # GEMMA's layer 0: window 3
    # Row 1's new token is at position 3: its window holds positions 1, 2, 3 (slots 1, 2, 6).
    assert local.tolist() == [[False] * 4 + [True] * 3, [False, True, True] + [False] * 3 + [True]]


@pytest.fixture(scope="module")
def compiled_cache(tmp_path_factory):
    """One cache of compiled steps for the module: each model compiles once."""
    return tmp_path_factory.mktemp("ladder-cache")


def _decode_both(config, compiled_cache, monkeypatch, new_tokens, **options):
    monkeypatch.setenv("LADDER_CACHE", str(compiled_cache))
    eager, fast = _model(config, **options), _model(config, compile=True, **options)
    assert fast.prepare_decode(2).how in ("compiled", "loaded")
    prompts, valid = torch.tensor(PROMPTS), torch.tensor(VALID)
    steps = []
    with torch.no_grad():
        (want, want_cache), (got, got_cache) = (
            m.prefill(prompts, valid=valid, last_only=True) for m in (eager, fast)
        )
        for _ in range(new_tokens):
            token = want.argmax(-1)  # (B,): the eager step's greedy tokens, fed to both
            steps.append((want, got))
            want, got = eager.decode_step(token, want_cache), fast.decode_step(token, got_cache)
    return eager, fast, steps


@pytest.mark.extended
@pytest.mark.parametrize("config", [GEMMA, LLAMA], ids=["gemma", "llama"])
def test_compiled_steps_give_the_eager_logits_to_the_last_slot(config, compiled_cache, monkeypatch):
    """Greedy decoding from a ragged cache up to its last slot: each step's logits within the
    float32 bound and the same argmax; the last slot (eager) joins without a seam; a second
    model of the same shapes loads the step instead of compiling it."""
    room = config.max_seq_len - PROMPTS.shape[1]
    _, fast, steps = _decode_both(config, compiled_cache, monkeypatch, room)
    for want, got in steps:
        scale = want.abs().max().item()
        assert (got - want).abs().max().item() <= F32_BOUND * scale
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    again = _model(config, compile=True)
    assert again.prepare_decode(2).how == "loaded"
    assert fast.decode_report is not None


# int8 compiled against eager: the eager kernel rounds each product's input and output to
# bfloat16 (2^-9 relative each), the compiled dot products keep float32 (compiled.int8_rows);
# measured 6.3e-3 of the largest logit after 2 layers. Three times that; a wrong scale or
# row costs the logit's own size.
INT8_BOUND = 2e-2


@pytest.mark.extended
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantized_compiled_steps_give_the_quantized_eager_logits(fmt, compiled_cache, monkeypatch):
    """The int8/int4 products inside the compiled step. int4: the packed kernel, as eager, so
    the logits agree as float32 ones do. int8: the same integers and scales in fused dot
    products with float32 activations, so the logits agree to bfloat16's rounding, and the
    greedy tokens are the same."""
    _, _, steps = _decode_both(LLAMA, compiled_cache, monkeypatch, 6, weights=fmt)
    bound = INT8_BOUND if fmt == "int8" else F32_BOUND
    for want, got in steps:
        assert (got - want).abs().max().item() <= bound * want.abs().max().item()
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_on_a_gpu_the_compiled_step_gives_the_eager_tokens(device):
    """CUDA: ``torch.compile`` with CUDA graphs over the whole cache (masks as wide as it),
    the cache's buffers written in place: the eager step's greedy tokens from a ragged
    cache, and its logits within the float32 bound (``pytest --device cuda``)."""
    if device != "cuda":
        pytest.skip("the CUDA path of the compiled step (pytest --device cuda)")
    eager = _model(LLAMA, device="cuda")
    fast = _model(LLAMA, device="cuda", compile=True)
    prompts, valid = torch.tensor(PROMPTS, device="cuda"), torch.tensor(VALID, device="cuda")
    with torch.no_grad():
        want, want_cache = eager.prefill(prompts, valid=valid, last_only=True)
        got, got_cache = fast.prefill(prompts, valid=valid, last_only=True)
        for _ in range(LLAMA.max_seq_len - PROMPTS.shape[1]):
            token = want.argmax(-1)
            want, got = eager.decode_step(token, want_cache), fast.decode_step(token, got_cache)
            assert (got - want).abs().max().item() <= F32_BOUND * want.abs().max().item()
            assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert fast.decode_report.how == "compiled"
