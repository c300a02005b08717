"""GGUF files in the canonical parameters (levels/gguf.py), and every way a file can be bad.

Tiny files are written by ``gguf``'s own writer (tests/gguf_files.py) in each tensor type it
can write, for the llama architecture (q/k rows in llama.cpp's interleaved order), tied and
untied, and qwen2 (Hugging Face's order, q/k/v biases); ``transformers`` reads the same
file as the peer. The real models, with their K-quants, are tests/test_real_models.py.

Every bad file is one ``GGUFError`` (a ``ValueError``) whose one line names what is wrong,
raised by the header check before anything the file claims is allocated; through ``ladder``
it is one line on stderr and exit status 1.
"""

from __future__ import annotations

import itertools
import struct

import gguf_files
import numpy as np
import pytest
import torch
import transformers
from hf_peer import make_exact
from transformers.utils import logging as hf_logging

import levels
from ladder.cli import main as ladder
from levels import gguf

# float64 level 1 against transformers' float64 model on the same dequantized float32
# weights, its float32 steps patched: rounding order only (measured 6e-15 on logits up to 3).
EXACT_TOL = 1e-12
TOKENS = np.array([[5, 17, 3, 60, 22, 9, 41, 0, 33, 12], [1, 2, 63, 7, 7, 30, 18, 44, 25, 6]])


def _hf_logits(path) -> np.ndarray:
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent),
        gguf_file=path.name,
        dtype=torch.float64,
        quantization_config=transformers.GgufConfig(dequantize=True),
        attn_implementation="sdpa",
    )
    with torch.no_grad():
        return make_exact(model).eval()(torch.as_tensor(TOKENS)).logits.numpy()


@pytest.mark.parametrize(
    "arch,tie",
    [("llama", True), ("llama", False), ("qwen2", True), ("gemma3", True)],
    ids=["llama", "untied", "qwen2", "gemma3"],
)
def test_tiny_files_give_transformers_logits(tmp_path, arch, tie):
    path = gguf_files.write(tmp_path / "tiny.gguf", arch=arch, tie=tie, seed=len(arch) + tie)
    config, params = gguf.load(path)
    assert (config.tie_embeddings, config.has_qkv_bias) == (tie, arch == "qwen2")
    assert config.rope_base == 50000.0 and config.kv_heads == 2 and config.max_seq_len == 128
    if arch == "gemma3":  # what the file says, and what it leaves to llama.cpp's defaults
        facts = (config.head_dim, config.window, config.window_pattern, config.rope_local_base)
        assert facts == (128, 4, 6, 10000.0)
        assert config.attn_scale == 256**-0.5  # transformers' query_pre_attn_scalar, not 128
        assert config.layer_windows == (4,) * 5 + (None,)
        assert (config.qk_norm, config.post_norms, config.norm_weight_offset) == (True, True, 1.0)
        gain = params["layers.0.post_norm1.weight"] + 1.0  # the file's gains are 1 + w
        assert 0.5 < gain.mean() < 1.5 and abs(params["layers.0.post_norm1.weight"].mean()) < 0.5
    L1 = levels.load("level1_numpy")
    ours = L1.DecoderOnlyTransformer(config, params).forward(TOKENS)
    theirs = _hf_logits(path)
    assert np.abs(theirs).max() > 1.0  # a model that computes something
    err = np.abs(ours - theirs).max()
    assert err <= EXACT_TOL, f"{arch}: {err:.2e}"


def test_dequantized_to_the_requested_dtype(tmp_path):
    path = gguf_files.write(tmp_path / "tiny.gguf")
    _, p64 = gguf.load(path)
    config, p32 = gguf.load(path, dtype=np.float32, max_seq_len=16)
    assert config.max_seq_len == 16
    for name, value in p64.items():
        assert p32[name].dtype == np.float32 and value.dtype == np.float64
        # dequantized weights are float32 numbers: float64 holds them exactly
        np.testing.assert_array_equal(p32[name].astype(np.float64), value, err_msg=name)
    with pytest.raises(ValueError, match="exceeds the checkpoint's max_position_embeddings=128"):
        gguf.load(path, max_seq_len=129)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_header_reads_as_gguf_reads_it(tmp_path, arch):
    """The loader's own header walk (levels.gguf.read) against gguf's GGUFReader on the same
    file: every metadata value, and every tensor's bytes dequantized by gguf's own
    ``quants.dequantize``, in each type the writer makes (round-robin over the matrices)."""
    import gguf as gguf_package
    from gguf import quants

    path = gguf_files.write(tmp_path / "tiny.gguf", arch=arch)
    ours = gguf.read(path)
    reader = gguf_package.GGUFReader(path)
    theirs = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata == theirs
    kinds = set()
    for tensor, peer in zip(ours.tensors, reader.tensors, strict=True):
        assert (tensor.name, tensor.kind) == (peer.name, peer.tensor_type)
        kinds.add(tensor.kind.name)
        want = quants.dequantize(peer.data, peer.tensor_type).astype(np.float32)
        got = gguf._dequantize(ours, tensor, np.dtype(np.float32))
        np.testing.assert_array_equal(got.reshape(want.shape), want, err_msg=tensor.name)
    assert {t.name for t in gguf_files.types()} <= kinds  # every type the writer makes


@pytest.mark.parametrize("kind", sorted(gguf._DECODERS))
def test_own_block_decoders_match_gguf_bit_for_bit(kind):
    """The in-place decoders of the registry's formats against gguf's on every byte pattern:
    random blocks (scales that are NaN, infinities and subnormals among them), plus the
    extremes set by hand: nibbles 0 and 15, int8 -128 and 127, scales of +-0 and 65504."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[kind]
    size = GGML_QUANT_SIZES[qtype][1]
    blocks = np.random.default_rng(0).integers(0, 256, (4096, size), dtype=np.uint8)
    halves = 4 if kind == "Q4_1" else 2  # the scale (and Q4_1's minimum) open the block
    scales = np.array([0.0, -0.0, 65504.0, -65504.0, 6e-8, 1.0], np.float16)  # 6e-8: subnormal
    payloads = np.array([0x00, 0xFF, 0x80, 0x7F], np.uint8)  # nibbles 0/15, int8 0/-1/-128/127
    for i, (scale, payload) in enumerate(itertools.product(scales, payloads)):
        blocks[i, :halves] = np.tile(np.array([scale]).view(np.uint8), halves // 2)
        blocks[i, halves:] = payload
    with np.errstate(invalid="ignore", over="ignore"):  # the NaN and infinite scales, on purpose
        got = gguf._DECODERS[kind](blocks)
        want = quants._type_traits[qtype].dequantize_blocks(blocks)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# ----------------------------------------------------------------------------- bad files


def _expect(path, match: str) -> str:
    with pytest.raises(gguf.GGUFError, match=match) as info:
        gguf.load(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_wrong_magic_and_empty_and_missing(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04" + bytes(60))
    _expect(bad, r"not a GGUF file \(it starts with b'PK\\x03\\x04'")
    bad.write_bytes(b"")
    _expect(bad, "not a GGUF file")
    _expect(tmp_path / "absent.gguf", "no such file")


@pytest.mark.parametrize("fraction", [0.0001, 0.001, 0.3, 0.999])
def test_truncated_files(tmp_path, fraction):
    """Cut in the header (the counts, the metadata) or in the tensor data."""
    data = gguf_files.write(tmp_path / "full.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: max(5, int(len(data) * fraction))])
    _expect(cut, "truncated")


def _header(path) -> bytearray:
    return bytearray(path.read_bytes())


def test_counts_and_lengths_that_cannot_fit(tmp_path):
    data = _header(gguf_files.write(tmp_path / "full.gguf"))
    bad = tmp_path / "bad.gguf"
    huge = bytearray(data)
    huge[16:24] = struct.pack("<Q", 2**60)  # the metadata count
    bad.write_bytes(huge)
    _expect(bad, "cannot fit")
    long_key = bytearray(data)
    long_key[24:32] = struct.pack("<Q", 2**62)  # the first key's length
    bad.write_bytes(long_key)
    _expect(bad, "truncated or corrupt: metadata key 0 needs")
    version = bytearray(data)
    version[4:8] = struct.pack("<I", 7)
    bad.write_bytes(version)
    _expect(bad, "GGUF version 7 is not supported")


def test_unsupported_architecture(tmp_path):
    path = gguf_files.write(tmp_path / "phi.gguf", arch="phi3")
    _expect(path, "architecture 'phi3' is not supported; supported: llama, qwen2")


def test_unsupported_tensor_type(tmp_path):
    path = gguf_files.write(
        tmp_path / "ints.gguf", extra_tensors={"blk.0.attn_q.bias": np.zeros(256, np.int32)}
    )
    _expect(path, "tensor blk.0.attn_q.bias is I32, which gguf .* cannot dequantize")


def test_a_tensor_without_a_place(tmp_path):
    path = gguf_files.write(
        tmp_path / "extra.gguf", extra_tensors={"blk.0.mystery.weight": np.zeros(256, np.float32)}
    )
    _expect(path, "tensor blk.0.mystery.weight has no place")


def test_options_the_ladder_does_not_compute(tmp_path):
    partial = gguf_files.write(
        tmp_path / "p.gguf", metadata={"llama.rope.dimension_count": ("UINT32", 32)}
    )
    _expect(partial, "partial rotary is not implemented")
    scaled = gguf_files.write(
        tmp_path / "s.gguf", metadata={"llama.rope.scaling.type": ("STRING", "yarn")}
    )
    _expect(scaled, r"RoPE scaling \(yarn\)")
    missing = gguf_files.write(tmp_path / "m.gguf", metadata={"llama.block_count": None})
    _expect(missing, "the metadata has no llama.block_count")


def test_a_file_without_a_tokenizer(tmp_path):
    path = gguf_files.write(tmp_path / "bare.gguf", tokenizer=False)
    gguf.load(path)  # the weights load
    with pytest.raises(gguf.GGUFError, match="has no tokenizer"):
        gguf.load_tokenizer(path)


def test_ladder_answers_a_bad_file_with_one_line(tmp_path, capsys):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + bytes(3))
    status = ladder(["generate", "--model", str(bad), "--prompt", "hi", "--level", "1"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert "truncated" in err and "Traceback" not in err
