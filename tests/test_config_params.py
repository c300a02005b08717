"""TransformerConfig validation and the canonical parameters (no level involved).

``param_shapes`` must list exactly the entries of the state dicts of PyTorch's
own modules, with the same shapes, so that weights move between this project
and PyTorch by name.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch
from _helpers import TorchDecoderOnly, TorchSeq2Seq
from torch import nn

from levels import TransformerConfig, init_params, param_shapes
from levels.common.params import check_params

GOOD = dict(vocab_size=11, d_model=12, n_heads=3, d_ff=20, n_layers=2)


def test_good_config_and_defaults():
    config = TransformerConfig(**GOOD)
    assert config.d_head == 4
    # The defaults docs/conventions.md states.
    assert (config.dropout, config.bias, config.positional) == (0.0, True, "rope")
    assert (config.rope_base, config.norm_eps, config.pad_id) == (10000.0, 1e-5, 0)
    assert config.max_seq_len == 1024
    with pytest.raises(AttributeError):  # frozen
        config.d_model = 16  # type: ignore[misc]


BAD_CONFIGS = {
    "heads-do-not-divide": dict(d_model=12, n_heads=5),
    "odd-head-width-with-rope": dict(d_model=12, n_heads=4),  # Dh = 3
    "zero-vocab": dict(vocab_size=0),
    "negative-width": dict(d_model=-12),
    "zero-heads": dict(n_heads=0),
    "zero-ff": dict(d_ff=0),
    "zero-layers": dict(n_layers=0),
    "zero-max-len": dict(max_seq_len=0),
    "float-size": dict(d_model=12.0),
    "bool-size": dict(n_layers=True),
    "unknown-positional": dict(positional="sinusoidal"),
    "dropout-one": dict(dropout=1.0),
    "negative-eps": dict(norm_eps=-1e-5),
    "pad-outside-vocab": dict(pad_id=11),
    "fractional-pad": dict(pad_id=0.5),
    "bool-eos": dict(eos_id=True),
    "infinite-eps": dict(norm_eps=float("inf")),
    "nan-rope-base": dict(rope_base=float("nan")),
    "bias-as-text": dict(bias="no"),
    "dropout-as-text": dict(dropout="0.1"),
    # Gemma 3's options
    "zero-head-dim": dict(head_dim=0),
    "float-head-dim": dict(head_dim=4.0),
    "odd-head-dim-with-rope": dict(head_dim=5),
    "zero-attn-scale": dict(attn_scale=0.0),
    "nan-attn-scale": dict(attn_scale=float("nan")),
    "qk-norm-as-text": dict(qk_norm="yes"),
    "post-norms-as-int": dict(post_norms=1),
    "infinite-norm-weight-offset": dict(norm_weight_offset=float("inf")),
    "norm-weight-offset-as-text": dict(norm_weight_offset="1"),
    "unknown-ffn": dict(ffn="reglu"),
    "window-pattern-without-window": dict(window_pattern=6),
    "window-pattern-of-one": dict(window_pattern=1, window=4),
    "fractional-window-pattern": dict(window_pattern=2.5, window=4),
    "rope-local-base-without-window": dict(rope_local_base=1e4),
    "negative-rope-local-base": dict(rope_local_base=-1.0, window=4),
}
NAMED_BY = {
    "heads-do-not-divide": "n_heads",
    "odd-head-width-with-rope": "head width",
    "odd-head-dim-with-rope": "head width",
}


@pytest.mark.parametrize("bad", list(BAD_CONFIGS))
def test_bad_config_raises(bad):
    name = NAMED_BY.get(bad, next(iter(BAD_CONFIGS[bad])))
    with pytest.raises(ValueError, match=name):  # the message names what is wrong
        TransformerConfig(**(GOOD | BAD_CONFIGS[bad]))


def test_odd_head_width_is_fine_without_rope():
    assert TransformerConfig(**(GOOD | dict(n_heads=4, positional="none"))).d_head == 3


def test_gemma_options():
    """head_dim frees Dh from D / H; window_pattern makes every k-th layer global, and
    rope_local_base is the windowed layers' base. The defaults change nothing."""
    config = TransformerConfig(**(GOOD | dict(d_model=10, n_heads=4, head_dim=6)))
    assert (config.d_head, config.q_width) == (6, 24)  # 10 % 4 != 0 is fine with head_dim
    config = TransformerConfig(
        **(GOOD | dict(n_layers=7, window=3, window_pattern=3, rope_local_base=100.0))
    )
    assert config.layer_windows == (3, 3, None, 3, 3, None, 3)
    assert [config.rope_base_of(w) for w in (3, None)] == [100.0, 10000.0]
    plain = TransformerConfig(**GOOD)
    assert (plain.q_width, plain.layer_windows, plain.rope_base_of(None)) == (12, (None,) * 2, 1e4)
    assert (plain.head_dim, plain.attn_scale, plain.qk_norm, plain.post_norms) == (
        None, None, False, False,
    )  # fmt: skip
    assert (plain.norm_weight_offset, plain.window_pattern, plain.rope_local_base) == (
        0.0, None, None,
    )  # fmt: skip


def test_gemma_parameters():
    """Gemma's entries: wide heads in in_proj and out_proj, QK-norm's Dh-wide gains, a
    post_norm{k} after each sublayer; with gains stored as offsets they start at 0."""
    config = TransformerConfig(
        **(GOOD | dict(head_dim=6, n_kv_heads=1, norm="rmsnorm", ffn="geglu", bias=False)),
        qk_norm=True, post_norms=True, norm_weight_offset=1.0,
    )  # fmt: skip
    shapes = param_shapes(config, "decoder_only")
    assert shapes["layers.0.self_attn.in_proj_weight"] == (3 * 6 + 2 * 6, 12)  # H Dh + 2 Hkv Dh
    assert shapes["layers.0.self_attn.out_proj.weight"] == (12, 18)  # (D, H Dh)
    assert shapes["layers.0.self_attn.q_norm.weight"] == shapes["layers.0.self_attn.k_norm.weight"]
    assert shapes["layers.0.self_attn.q_norm.weight"] == (6,)
    assert shapes["layers.1.linear_gate.weight"] == (20, 12)
    names = [n for n in shapes if n.startswith("layers.0.") and "norm" in n]
    assert names == [
        "layers.0.norm1.weight", "layers.0.self_attn.q_norm.weight",
        "layers.0.self_attn.k_norm.weight", "layers.0.post_norm1.weight",
        "layers.0.norm2.weight", "layers.0.post_norm2.weight",
    ]  # fmt: skip
    decoder = [n for n in param_shapes(config, "seq2seq") if n.startswith("decoder.layers.0.post")]
    assert decoder == [f"decoder.layers.0.post_norm{k}.weight" for k in (1, 2, 3)]
    params = init_params(config, "decoder_only", seed=0)
    for name in names + ["norm.weight"]:
        assert (params[name] == 0.0).all(), name  # the gain, 1 + weight, starts at 1


# ---------------------------------------------------------------------------
# init_params
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["decoder_only", "seq2seq"])
@pytest.mark.parametrize("scheme", ["standard", "random"])
def test_init_params_is_deterministic_by_seed(kind, scheme):
    config = TransformerConfig(**GOOD)
    a = init_params(config, kind, seed=3, scheme=scheme)
    b = init_params(config, kind, seed=3, scheme=scheme)
    c = init_params(config, kind, seed=4, scheme=scheme)
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == np.float64
        assert a[name].shape == param_shapes(config, kind)[name]
        np.testing.assert_array_equal(a[name], b[name])
    assert any(not np.array_equal(a[n], c[n]) for n in a), "another seed must change something"
    check_params(a, param_shapes(config, kind))


def test_random_scheme_randomises_biases_and_norms():
    config = TransformerConfig(**GOOD)
    standard = init_params(config, "seq2seq", seed=0)
    random = init_params(config, "seq2seq", seed=0, scheme="random")
    for name in (
        "encoder.layers.0.norm1.weight",
        "decoder.norm.bias",
        "encoder.layers.1.linear1.bias",
    ):
        trivial = 1.0 if name.endswith("norm1.weight") else 0.0
        assert (standard[name] == trivial).all()
        assert (random[name] != trivial).all()


# ---------------------------------------------------------------------------
# Names and shapes match PyTorch's modules
# ---------------------------------------------------------------------------


def _torch_shapes(module: nn.Module, prefix: str = "") -> dict[str, tuple[int, ...]]:
    return {prefix + n: tuple(t.shape) for n, t in module.state_dict().items()}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_param_shapes_match_torch_layers(bias):
    config = TransformerConfig(**GOOD, bias=bias)
    kw = dict(
        d_model=config.d_model,
        nhead=config.n_heads,
        dim_feedforward=config.d_ff,
        batch_first=True,
        norm_first=True,
        bias=bias,
    )
    expected: dict[str, tuple[int, ...]] = {}
    expected["token_embedding.weight"] = (config.vocab_size, config.d_model)
    for i in range(config.n_layers):
        expected |= _torch_shapes(nn.TransformerEncoderLayer(**kw), f"layers.{i}.")
    expected |= _torch_shapes(nn.LayerNorm(config.d_model, bias=bias), "norm.")
    assert param_shapes(config, "decoder_only") == expected

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nested tensors off with norm_first
        transformer = nn.Transformer(num_encoder_layers=2, num_decoder_layers=2, **kw)
    expected = _torch_shapes(transformer)
    for name in ("source_embedding.weight", "target_embedding.weight", "output_projection.weight"):
        expected[name] = (config.vocab_size, config.d_model)
    assert param_shapes(config, "seq2seq") == expected


@pytest.mark.parametrize("kind", ["decoder_only", "seq2seq"])
def test_params_load_into_torch_by_name(kind):
    """The whole dict loads into PyTorch's modules with strict=True (no rename, no reshape)."""
    config = TransformerConfig(**GOOD, positional="none")
    model = TorchDecoderOnly(config) if kind == "decoder_only" else TorchSeq2Seq(config)
    params = init_params(config, kind, seed=0, scheme="random")
    model.load_state_dict({n: torch.as_tensor(v) for n, v in params.items()}, strict=True)


def test_check_params_lists_every_problem():
    config = TransformerConfig(**GOOD)
    params = init_params(config, "decoder_only")
    del params["norm.bias"]
    params["extra.weight"] = np.zeros(2)
    params["layers.1.linear2.weight"] = np.zeros((3, 3))
    with pytest.raises(ValueError) as info:
        check_params(params, param_shapes(config, "decoder_only"))
    for name in ("norm.bias", "extra.weight", "layers.1.linear2.weight"):
        assert name in str(info.value)


def test_level4_loads_after_level3_in_one_process():
    """Level 3 imports torch's attention-bias module, which imports triton; level 4 must
    still load afterwards (the interpreter is chosen when ``levels`` is imported)."""
    import subprocess
    import sys

    pytest.importorskip("triton", reason="level 4 needs triton")
    code = (
        "import levels; levels.load('level3_sdpa_flash'); "
        "print(levels.load('level4_triton_kernel').describe())"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("level2_torch_manual", "level2_torch_manual"),
        ("level2", "level2_torch_manual"),
        ("2", "level2_torch_manual"),
        (" 0 ", "level0_loops"),
        ("4", "level4_triton_kernel"),
    ],
)
def test_level_name_accepts_names_short_forms_and_numbers(spec, expected):
    from levels import level_name

    assert level_name(spec) == expected


@pytest.mark.parametrize("spec", ["5", "level5", "-1", "numpy", ""])
def test_level_name_refuses_unknown_levels(spec):
    from levels import level_name

    with pytest.raises(ValueError, match="unknown level"):
        level_name(spec)


def test_level_names_keeps_the_order_given_and_defaults_to_all():
    from levels import LEVELS, level_names

    assert level_names("3,level0,level1_numpy") == [LEVELS[3], LEVELS[0], LEVELS[1]]
    assert level_names(None) == list(LEVELS)
    assert level_names("") == list(LEVELS)
