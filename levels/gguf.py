"""GGUF files (llama.cpp's format) in and out of the canonical parameters.

``load(path)`` reads a ``.gguf`` file of the ``llama``, ``qwen2`` or ``gemma3``
architecture and returns ``(TransformerConfig, params)``, the same canonical
parameters ``levels.hf.load`` gives for the same model, so every level runs
it. ``load_tokenizer(path)`` and ``load_chat_template(path)`` give its text
side, from the same file's metadata (``levels.tokenizer``).

A GGUF file is a header, then the tensors' bytes:

    "GGUF"  version  tensor count  metadata count
    metadata: key -> typed value (numbers, strings, arrays; the config and the tokenizer)
    tensor infos: name, shape, type (F32, F16, Q4_1, Q8_0, Q4_K, ...), offset
    padding to the alignment, then the data

The header is read here, in one walk that checks as it reads (below), and
dequantisation is ``gguf``'s, llama.cpp's own Python package (every type it
implements: blocks of 32 or 256 weights sharing a scale and maybe a minimum,
unpacked to float32), but for the two formats of the ladder's registry models
(Q4_1, Q8_0), decoded here in place to the same bits. What this module adds:

* **An untrusted file is checked as it is read.** The header walk compares
  every length, count, shape and offset against the file's size (nothing is
  allocated from a number the file claims before that number is known to
  fit), so a truncated, corrupt or hostile file is one ``GGUFError`` naming
  what is wrong, never a deep traceback or a huge allocation. The tensors'
  bytes are memory-mapped and read only when a tensor is dequantized.
* **The config from the metadata**, translated to the ``config.json`` keys a
  Hugging Face checkpoint of the same family would have, so one set of rules
  (``levels.hf.config_from_hf``) decides and refuses what the ladder runs.
* **The tensors under Hugging Face's names** (``blk.3.attn_q.weight`` ->
  ``model.layers.3.self_attn.q_proj.weight``), handed to
  ``levels.hf.params_from_hf``. One layout differs: llama.cpp's converter
  permutes the q and k rows of the ``llama`` architecture within each head
  into adjacent pairs, the order of GGML's rotary kernel (which, by no
  accident, is the ladder's); it is undone here, back to Hugging Face's
  ``rotate_half`` order, so that both loaders share one path (which permutes
  them once more, into the ladder's order). ``qwen2`` and ``gemma3`` files keep
  Hugging Face's order (llama.cpp rotates them with its "NEOX" kernel).
* **Gemma 3** (``gemma3``): llama.cpp's converter adds Gemma's 1 to every norm's
  weight (its graph multiplies by the weight; Hugging Face's ``Gemma3RMSNorm`` by
  ``1 + weight``), so the loader subtracts it, as ``transformers`` does. What the
  metadata leaves out is what ``transformers`` assumes (and llama.cpp, but for
  one case): every sixth layer global (``sliding_window_pattern`` 6), the local
  layers' RoPE base 10000, the scores scaled by ``256 ** -0.5``
  (``query_pre_attn_scalar``; llama.cpp ``1 / sqrt(key_length)``, the same for
  every Gemma 3 but the 27B model). Its ``ffn_norm`` is the
  norm before the MLP, ``post_attention_norm`` and ``post_ffw_norm`` the norms
  after the two sublayers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from . import hf
from .common.config import TransformerConfig

ARCHITECTURES = ("llama", "qwen2", "gemma3")

# GGUF's value types: struct format of the fixed-size ones (STRING = 8 and ARRAY = 9 are not).
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_DEPTH = 4  # arrays of arrays nested deeper than this are not a model file


class GGUFError(ValueError):
    """A file that is not a GGUF model the ladder can read; the message is one line."""


# ----------------------------------------------------------------------------- the header


class _Cursor:
    """Reads the header front to back, refusing any read past the end of the file."""

    def __init__(self, path: Path, data, order: str):
        self.path, self.data, self.order, self.at = path, data, order, 0
        self.view = memoryview(data)

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise GGUFError(
                f"{self.path}: truncated or corrupt: {what} needs {n} bytes at offset "
                f"{self.at}, past the end of the {len(self.data)}-byte file"
            )
        view = self.view[self.at : self.at + n]
        self.at += n
        return view

    def number(self, fmt: str, what: str):
        return struct.unpack(self.order + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        raw = self.take(self.number("Q", f"the length of {what}"), what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: corrupt: {what} is not UTF-8 text") from None

    def value(self, kind: int, what: str, depth: int = 0):
        """One value of type ``kind``: a number, a string or a list of them."""
        if kind in _SCALARS:
            return self.number(_SCALARS[kind], what)
        if kind == _STRING:
            return self.string(what)
        if kind != _ARRAY or depth >= _MAX_DEPTH:
            raise GGUFError(f"{self.path}: corrupt: {what} has an unknown value type {kind}")
        item, count = self.number("I", f"{what}'s item type"), self.number("Q", f"{what}'s length")
        if item in _SCALARS:  # fixed-size items: one bounds check, one conversion for all
            fmt = self.order + _SCALARS[item]
            raw = self.take(count * struct.calcsize(fmt), f"{what}'s {count} items")
            return np.frombuffer(raw, dtype=np.dtype(fmt)).tolist()
        if count > len(self.data) - self.at:  # every item takes at least one byte
            raise GGUFError(f"{self.path}: corrupt: {what} claims {count} items")
        if item == _STRING:  # a vocabulary: tens of thousands of strings, read in one loop
            return self._strings(count, what)
        return [self.value(item, f"{what}[{i}]", depth + 1) for i in range(count)]

    def _strings(self, count: int, what: str) -> list[str]:
        """``count`` strings, each a length and its UTF-8 bytes (one bounds check apiece)."""
        length = struct.Struct(self.order + "Q")
        data, end, at, out = self.view, len(self.data), self.at, []
        for i in range(count):
            if at + 8 > end:
                self.at = at
                self.take(8, f"the length of {what}[{i}]")  # raises, naming the offset
            n = length.unpack_from(data, at)[0]
            at += 8
            if at + n > end:
                self.at = at
                self.take(n, f"{what}[{i}]")  # raises
            try:
                out.append(str(data[at : at + n], "utf-8"))
            except UnicodeDecodeError:
                raise GGUFError(f"{self.path}: corrupt: {what}[{i}] is not UTF-8 text") from None
            at += n
        self.at = at
        return out


@dataclass(frozen=True)
class Tensor:
    """One tensor of the file: its name, ``shape`` as GGUF lists it (the fastest axis first),
    its ``kind`` (a ``gguf.GGMLQuantizationType``) and its bytes ``[start, start + size)``."""

    name: str
    shape: tuple[int, ...]
    kind: Any
    start: int
    size: int


@dataclass(frozen=True)
class GGUFFile:
    """A checked GGUF file: its ``metadata`` as plain Python values (numbers, strings, lists),
    its ``tensors``, and its bytes memory-mapped (read only where a tensor is dequantized)."""

    path: Path
    metadata: dict[str, Any]
    tensors: tuple[Tensor, ...]
    data: Any  # np.memmap of the whole file

    def raw(self, tensor: Tensor) -> np.ndarray:
        """The tensor's bytes, as ``uint8``, without a copy."""
        return self.data[tensor.start : tensor.start + tensor.size]


def _parse(path: Path) -> GGUFFile:
    """Walk the header of ``path``, checking it against the file; ``GGUFError`` if it lies.

    Checked: the magic and version; the counts against the bytes left; every
    key, string and array length; each tensor's rank, shape, type (one ``gguf``
    knows), alignment, and its bytes lying inside the file's data section.
    Nothing is allocated from a size the file claims before that size is known to
    fit in the file, and the tensors' bytes are not read.
    """
    import gguf

    if not path.is_file():
        raise GGUFError(f"{path}: no such file")
    with open(path, "rb") as f:
        data = np.memmap(f, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)
    if bytes(data[:4]) != b"GGUF":
        raise GGUFError(
            f"{path}: not a GGUF file (it starts with {bytes(data[:4])!r}, not b'GGUF')"
        )
    order = "<"
    if len(data) >= 8 and struct.unpack("<I", bytes(data[4:8]))[0] & 0xFFFF == 0:
        order = ">"  # written on a big-endian machine: the version reads as a multiple of 2^16
    cursor = _Cursor(path, data, order)
    cursor.take(4, "the magic")
    version = cursor.number("I", "the version")
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_keys = cursor.number("Q", "the tensor count"), cursor.number("Q", "the key count")
    # The smallest metadata entry is 13 bytes, the smallest tensor info 24: counts that
    # cannot fit in the file are refused before anything is walked.
    if 13 * n_keys + 24 * n_tensors > len(data) - cursor.at:
        raise GGUFError(
            f"{path}: truncated or corrupt: {n_keys} metadata entries and {n_tensors} tensors "
            f"cannot fit in {len(data)} bytes"
        )
    metadata = {}
    for i in range(n_keys):
        key = cursor.string(f"metadata key {i}")
        metadata[key] = cursor.value(cursor.number("I", f"the type of {key}"), key)
    alignment = metadata.get("general.alignment", 32)  # GGUF's default
    if (
        isinstance(alignment, bool)
        or not isinstance(alignment, int)
        or alignment <= 0
        or (alignment & (alignment - 1))
    ):
        raise GGUFError(f"{path}: general.alignment={alignment!r} is not a power of two")
    infos = []
    for i in range(n_tensors):
        name = cursor.string(f"tensor name {i}")
        rank = cursor.number("I", f"the rank of {name}")
        if not 1 <= rank <= _MAX_DIMS:
            raise GGUFError(f"{path}: corrupt: tensor {name} has {rank} dimensions")
        shape = tuple(cursor.number("Q", f"a dimension of {name}") for _ in range(rank))
        kind, offset = cursor.number("I", f"the type of {name}"), cursor.number("Q", f"{name}")
        infos.append((name, shape, kind, offset))
    start = -(-cursor.at // alignment) * alignment  # the data section, aligned
    tensors = []
    for name, shape, kind, offset in infos:
        try:
            qtype = gguf.GGMLQuantizationType(kind)
        except ValueError:
            raise GGUFError(f"{path}: tensor {name} has an unknown type {kind}") from None
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        elements = int(np.prod(shape, dtype=object))
        if min(shape) < 1 or shape[0] % block:
            raise GGUFError(
                f"{path}: corrupt: tensor {name} of shape {list(shape)} does not split into "
                f"{qtype.name} blocks of {block}"
            )
        nbytes = elements // block * size
        if offset % alignment or start + offset + nbytes > len(data):
            raise GGUFError(
                f"{path}: truncated or corrupt: tensor {name} ({qtype.name}, {list(shape)}) lies "
                f"at bytes [{start + offset}, {start + offset + nbytes}) of a "
                f"{len(data)}-byte file"
            )
        tensors.append(Tensor(name, shape, qtype, start + offset, nbytes))
    return GGUFFile(path, metadata, tuple(tensors), data)


def check_header(path) -> None:
    """Check the header of ``path`` (``_parse``); ``GGUFError`` naming what is wrong."""
    read(path)


def read(path) -> GGUFFile:
    """The checked GGUF file ``path``: its metadata and tensor table (``GGUFFile``).

    Kept for the last few files (keyed by path, size and modification time): a chat
    asks for the weights, the tokenizer and the template of the same file. The
    header walk is this module's own (``_Cursor``): one pass that checks every
    length as it reads, and the vocabulary's strings in one tight loop (``gguf``'s
    ``GGUFReader`` builds a numpy view per field part, seconds for 50k tokens).
    """
    path = Path(path)
    stat = path.stat() if path.is_file() else None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns) if stat else (str(path), 0, 0)
    return _read(*key)


@lru_cache(maxsize=2)
def _read(path: str, size: int, mtime_ns: int) -> GGUFFile:
    return _parse(Path(path))


# ----------------------------------------------------------------------------- the config


def _architecture(path, metadata: dict) -> str:
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"{path}: architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}"
        )
    return arch


def hf_config(path, metadata: dict, tensor_names: set[str]) -> dict:
    """The ``config.json`` a Hugging Face checkpoint of the same model would have."""
    arch = _architecture(path, metadata)

    def get(key: str, default=None, *, required: bool = False):
        value = metadata.get(f"{arch}.{key}", default)
        if required and value is None:
            raise GGUFError(f"{path}: the metadata has no {arch}.{key}")
        return value

    D, H = get("embedding_length", required=True), get("attention.head_count", required=True)
    tokens = metadata.get("tokenizer.ggml.tokens")
    raw = {
        "model_type": "gemma3_text" if arch == "gemma3" else arch,
        "hidden_size": D,
        "intermediate_size": get("feed_forward_length", required=True),
        "num_hidden_layers": get("block_count", required=True),
        "num_attention_heads": H,
        "num_key_value_heads": get("attention.head_count_kv", H),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", required=True),
        "max_position_embeddings": get("context_length", required=True),
        "vocab_size": get("vocab_size", len(tokens) if tokens else None, required=True),
        "rope_parameters": {"rope_type": "default", "rope_theta": get("rope.freq_base", 10000.0)},
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "head_dim": get("attention.key_length", D // H),
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": metadata.get("tokenizer.ggml.padding_token_id"),
    }
    if arch == "gemma3":
        raw |= _gemma3_config(path, get, raw["head_dim"])
    elif raw["head_dim"] != D // H:
        raise GGUFError(f"{path}: heads of {raw['head_dim']} features, not D/H = {D // H}")
    rotary = get("rope.dimension_count", raw["head_dim"])
    if rotary != raw["head_dim"]:
        raise GGUFError(
            f"{path}: {arch}.rope.dimension_count={rotary} rotates part of a head of "
            f"{raw['head_dim']}; the ladder rotates all of it (partial rotary is not implemented)"
        )
    scaling = get("rope.scaling.type", "none")
    if scaling not in ("none", None) or "rope_freqs.weight" in tensor_names:
        raise GGUFError(
            f"{path}: {arch} RoPE scaling ({scaling}) rescales positions; the ladder "
            "implements plain RoPE only"
        )
    if arch == "llama":
        bias = "blk.0.attn_q.bias" in tensor_names
        raw |= {"attention_bias": bias, "mlp_bias": "blk.0.ffn_up.bias" in tensor_names}
    return raw


def _gemma3_config(path, get, head_dim: int) -> dict:
    """The ``gemma3_text`` keys of a Gemma 3 file (``get(key)`` reads ``gemma3.<key>``)."""
    if get("attention.value_length", head_dim) != head_dim:
        raise GGUFError(f"{path}: keys and values of different widths are not implemented")
    raw = {
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": get("attention.sliding_window"),
        # Not in the file: what transformers' Gemma3TextConfig and llama.cpp assume. The
        # scores' scale, query_pre_attn_scalar ** -0.5, is left to transformers' default, 256
        # (every Gemma 3 but 27B, whose 168 llama.cpp takes as D / H; 256 is also its
        # head_dim in the others, which llama.cpp scales by).
        "sliding_window_pattern": 6,
        "rope_local_base_freq": get("rope.freq_base_swa", 10000.0),
    }
    raw["rope_parameters"] = {
        "full_attention": {"rope_type": "default", "rope_theta": get("rope.freq_base", 10000.0)},
        "sliding_attention": {"rope_type": "default", "rope_theta": raw["rope_local_base_freq"]},
    }
    for key, theirs in (
        ("final_logit_softcapping", "final_logit_softcapping"),
        ("attention.logit_softcapping", "attn_logit_softcapping"),
    ):  # Gemma 2's; hf refuses them by name
        if get(key) is not None:
            raw[theirs] = get(key)
    return raw


# ----------------------------------------------------------------------------- the tensors


# blk.{i}.<gguf> -> model.layers.{i}.<hf>, and the tensors outside the blocks.
_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 has a norm before and after each sublayer, and QK-norm: its ffn_norm is the one
# before the MLP, post_attention_norm (Hugging Face's post_attention_layernorm) the one after
# the attention.
_GEMMA3_BLOCK = _BLOCK | {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(path, name: str, arch: str = "llama") -> str:
    """The Hugging Face name of the GGUF tensor ``name`` of an ``arch`` file; ``GGUFError`` if
    it has none."""
    block = _GEMMA3_BLOCK if arch == "gemma3" else _BLOCK
    stem, _, suffix = name.rpartition(".")  # suffix: weight or bias
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in block:
        return f"model.layers.{parts[1]}.{block[parts[2]]}.{suffix}"
    if stem in _GLOBAL:
        return f"{_GLOBAL[stem]}.{suffix}"
    raise GGUFError(f"{path}: tensor {name} has no place in the ladder's model")


# The types held as plain numbers: the file's bytes are the values.
_PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def _dequantize(file: GGUFFile, tensor: Tensor, dtype: np.dtype) -> np.ndarray:
    """One tensor as a ``dtype`` array in PyTorch's layout: ``(out, in)`` for a matrix.

    A quantized tensor is a run of blocks (32 or 256 weights sharing a scale, and
    maybe a minimum); ``gguf``'s own block decoder unpacks every block of the
    tensor in one call, instead of ``gguf.quants.dequantize``'s groups of 16 rows
    (four times faster on SmolLM2's 135M weights).
    """
    from gguf import GGML_QUANT_SIZES, quants

    raw = file.raw(tensor)
    plain = _PLAIN.get(tensor.kind.name)
    if plain is not None:
        values = raw.view(np.dtype(plain).newbyteorder(_byte_order(file)))
    else:
        trait = quants._type_traits.get(tensor.kind)
        if trait is None:
            raise GGUFError(
                f"{file.path}: tensor {tensor.name} is {tensor.kind.name}, which gguf "
                f"{_gguf_version()} cannot dequantize"
            )
        size = GGML_QUANT_SIZES[tensor.kind][1]
        blocks = raw.reshape(-1, size)  # (blocks, bytes per block)
        decode = _DECODERS.get(tensor.kind.name)
        if decode is None:
            trait.init_grid()  # the lookup tables of the i-quants; nothing for the others
            decode = trait.dequantize_blocks
        values = decode(blocks)  # (blocks, block) float32
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest axis first
    # A plain tensor is a view of the read-only file: copied. Dequantized blocks are a fresh
    # float32 array, cast only if another dtype is asked for.
    return values.reshape(shape).astype(dtype, copy=plain is not None)


def _halves(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at bytes ``[start, start + 2)`` of every block, as ``(blocks, 1)`` float32."""
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    """Q8_0: a float16 scale ``d``, then 32 int8 ``q``; the weights are ``d * q``."""
    out = blocks[:, 2:].view(np.int8).astype(np.float32)  # (blocks, 32)
    out *= _halves(blocks, 0)
    return out


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    """Q4_1: float16 ``d`` and ``m``, then 16 bytes whose low nibbles are weights 0-15 and
    high nibbles 16-31; the weights are ``d * q + m``."""
    packed = blocks[:, 4:]  # (blocks, 16) uint8
    out = np.empty((len(blocks), 32), np.float32)
    np.bitwise_and(packed, 15, out=out[:, :16], casting="unsafe")
    np.right_shift(packed, 4, out=out[:, 16:], casting="unsafe")
    out *= _halves(blocks, 0)
    out += _halves(blocks, 2)
    return out


# The block formats of the ladder's registry models, decoded here in place: gguf's
# decoders compute the same float32 numbers (tests/test_gguf.py holds them to it bit for
# bit) through a temporary array per operation, a third more time for SmolLM2's 135M
# weights, time a chat waits for at its start. Every other format is gguf's.
_DECODERS = {"Q8_0": _q8_0, "Q4_1": _q4_1}


def _byte_order(file: GGUFFile) -> str:
    """``<`` or ``>``: the file's byte order (a big-endian file's version reads as a multiple
    of 2^16 in little-endian)."""
    return ">" if struct.unpack("<I", bytes(file.data[4:8]))[0] & 0xFFFF == 0 else "<"


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def load(
    path, *, max_seq_len: int | None = None, dtype=np.float64
) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """``(config, params)`` of the GGUF file ``path``, params dequantized to ``dtype``.

    The keywords are ``levels.hf.load``'s: ``max_seq_len`` is the file's
    ``context_length`` or the smaller value given; float64 (the default) holds
    every dequantized weight exactly (they are float32 numbers).
    """
    path = Path(path)
    file, raw, config = _described(path, max_seq_len)
    arch = file.metadata["general.architecture"]
    tensors = {}
    for tensor in file.tensors:
        name = hf_name(path, tensor.name, arch)
        value = _dequantize(file, tensor, np.dtype(dtype))
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = config.n_heads if ".q_proj." in name else config.kv_heads
            value = hf.to_rotate_half(value, heads)  # undo llama.cpp's pairs, per head
        if arch == "gemma3" and name.endswith("norm.weight"):
            # llama.cpp stores Gemma's gain, 1 + w; Hugging Face's weight is w (exact in
            # float64; in float32 transformers' own subtraction).
            value = value - 1
        tensors[name] = value
    try:
        return config, hf.params_from_hf(config, raw, tensors, where=path)
    except ValueError as exc:
        raise GGUFError(str(exc)) from None


def config_of(path, *, max_seq_len: int | None = None) -> TransformerConfig:
    """The config ``load`` gives for the file ``path``, from its header alone."""
    return _described(Path(path), max_seq_len)[2]


def _described(path: Path, max_seq_len: int | None) -> tuple[GGUFFile, dict, TransformerConfig]:
    """``(file, raw, config)``: the checked file, its ``config.json`` keys and its config."""
    file = read(path)
    raw = hf_config(path, file.metadata, {t.name for t in file.tensors})
    try:
        return file, raw, hf.config_from_hf(raw, max_seq_len=max_seq_len)
    except ValueError as exc:
        raise GGUFError(f"{path}: {exc}") from None


def load_tokenizer(path):
    """The ``tokenizers.Tokenizer`` described by the file's metadata (``levels.tokenizer``)."""
    from .tokenizer import tokenizer_from_gguf

    try:
        return tokenizer_from_gguf(read(path).metadata)
    except ValueError as exc:
        raise GGUFError(f"{path}: {exc}") from None


def load_chat_template(path, required: bool = True):
    """The file's chat template (``levels.tokenizer.ChatTemplate``); without one, a
    ``GGUFError`` when ``required``, else None."""
    from .tokenizer import ChatTemplate

    metadata = read(path).metadata
    if not metadata.get("tokenizer.chat_template") and not required:
        return None
    try:
        return ChatTemplate.from_gguf(metadata)
    except ValueError as exc:
        raise GGUFError(f"{path}: {exc}") from None


def end_of_turn_ids(path) -> tuple[int, ...]:
    """The ids that end a model's turn: its EOS, and the end-of-turn and end-of-message
    tokens llama.cpp's converter records for chat models that have them."""
    metadata = read(path).metadata
    keys = ("eos_token_id", "eot_token_id", "eom_token_id")
    return tuple(
        sorted(
            {
                int(metadata[f"tokenizer.ggml.{k}"])
                for k in keys
                if f"tokenizer.ggml.{k}" in metadata
            }
        )
    )
