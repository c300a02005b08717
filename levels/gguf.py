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

The file format itself is the job of ``gguf``, llama.cpp's own Python reader
(``GGUFReader``), and so is dequantisation (``gguf.quants.dequantize``: every
type it implements, blocks of 32 or 256 weights sharing a scale and maybe a
minimum, unpacked to float32). What this module adds:

* **An untrusted file is checked before it is read.** ``check_header`` walks
  the header with every length, count, shape and offset compared against the
  file's size (nothing is allocated from a number the file claims before that
  number is known to fit), so a truncated, corrupt or hostile file is one
  ``GGUFError`` naming what is wrong, never a deep traceback or a huge allocation.
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
from functools import lru_cache
from pathlib import Path

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

    def __init__(self, path: Path, data: bytes | memoryview, order: str):
        self.path, self.data, self.order, self.at = path, data, order, 0

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise GGUFError(
                f"{self.path}: truncated or corrupt: {what} needs {n} bytes at offset "
                f"{self.at}, past the end of the {len(self.data)}-byte file"
            )
        view = memoryview(self.data)[self.at : self.at + n]
        self.at += n
        return view

    def number(self, fmt: str, what: str):
        return struct.unpack(self.order + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        raw = self.take(self.number("Q", f"the length of {what}"), what)
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: corrupt: {what} is not UTF-8 text") from None

    def skip_value(self, kind: int, what: str, depth: int = 0):
        """Step over one value of type ``kind``; -> it, when it is a small scalar."""
        if kind in _SCALARS:
            return self.number(_SCALARS[kind], what)
        if kind == _STRING:
            self.take(self.number("Q", f"the length of {what}"), what)
            return None
        if kind != _ARRAY or depth >= _MAX_DEPTH:
            raise GGUFError(f"{self.path}: corrupt: {what} has an unknown value type {kind}")
        item, count = self.number("I", f"{what}'s item type"), self.number("Q", f"{what}'s length")
        if item in _SCALARS:  # fixed-size items: one bounds check for all of them
            self.take(count * struct.calcsize(_SCALARS[item]), f"{what}'s {count} items")
        else:
            if count > len(self.data) - self.at:  # every item takes at least one byte
                raise GGUFError(f"{self.path}: corrupt: {what} claims {count} items")
            for i in range(count):
                self.skip_value(item, f"{what}[{i}]", depth + 1)
        return None


def check_header(path) -> None:
    """Walk the header of ``path`` and check it against the file; ``GGUFError`` if it lies.

    Checked: the magic and version; the counts against the bytes left; every
    key, string and array length; each tensor's rank, shape, type (one ``gguf``
    knows), alignment, and its bytes lying inside the file's data section.
    Nothing else is read, and nothing is allocated from a size the file claims.
    """
    import gguf

    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: no such file")
    with open(path, "rb") as f:
        data = np.memmap(f, mode="r") if path.stat().st_size else b""
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
    alignment = 32  # GGUF's default
    for i in range(n_keys):
        key = cursor.string(f"metadata key {i}")
        value = cursor.skip_value(cursor.number("I", f"the type of {key}"), key)
        if key == "general.alignment":
            alignment = value
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{path}: general.alignment={alignment!r} is not a power of two")
    tensors = []
    for i in range(n_tensors):
        name = cursor.string(f"tensor name {i}")
        rank = cursor.number("I", f"the rank of {name}")
        if not 1 <= rank <= _MAX_DIMS:
            raise GGUFError(f"{path}: corrupt: tensor {name} has {rank} dimensions")
        shape = [cursor.number("Q", f"a dimension of {name}") for _ in range(rank)]
        kind, offset = cursor.number("I", f"the type of {name}"), cursor.number("Q", f"{name}")
        tensors.append((name, shape, kind, offset))
    start = -(-cursor.at // alignment) * alignment  # the data section, aligned
    for name, shape, kind, offset in tensors:
        try:
            qtype = gguf.GGMLQuantizationType(kind)
        except ValueError:
            raise GGUFError(f"{path}: tensor {name} has an unknown type {kind}") from None
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        elements = int(np.prod(shape, dtype=object))
        if min(shape) < 1 or shape[0] % block:
            raise GGUFError(
                f"{path}: corrupt: tensor {name} of shape {shape} does not split into "
                f"{qtype.name} blocks of {block}"
            )
        end = start + offset + elements // block * size
        if offset % alignment or end > len(data):
            raise GGUFError(
                f"{path}: truncated or corrupt: tensor {name} ({qtype.name}, {shape}) lies at "
                f"bytes [{start + offset}, {end}) of a {len(data)}-byte file"
            )


def read(path):
    """``(reader, metadata)`` of a checked GGUF file: ``gguf.GGUFReader`` over it (the
    tensors memory-mapped, not read) and its metadata as plain Python values.

    Kept for the last few files (keyed by path, size and modification time): the
    reader walks every token string of the vocabulary (seconds for 50k), and a chat
    asks for the weights, the tokenizer and the template of the same file.
    """
    path = Path(path)
    stat = path.stat() if path.is_file() else None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns) if stat else (str(path), 0, 0)
    return _read(*key)


@lru_cache(maxsize=2)
def _read(path: str, size: int, mtime_ns: int):
    import gguf

    check_header(path)
    try:
        reader = gguf.GGUFReader(path)
        metadata = {name: field.contents() for name, field in reader.fields.items()}
    except (ValueError, IndexError, OverflowError) as exc:
        raise GGUFError(f"{path}: gguf cannot read it: {exc}") from None
    return reader, metadata


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


def _dequantize(path, tensor, dtype: np.dtype) -> np.ndarray:
    """One tensor as a ``dtype`` array in PyTorch's layout: ``(out, in)`` for a matrix."""
    from gguf import quants

    try:
        if tensor.data.dtype.kind == "f":  # F32, F16, F64: the reader has typed them already
            values = tensor.data
        else:  # blocks of packed integers and scales -> float32
            values = quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        raise GGUFError(
            f"{path}: tensor {tensor.name} is {tensor.tensor_type.name}, which gguf "
            f"{_gguf_version()} cannot dequantize"
        ) from None
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest axis first
    return values.reshape(shape).astype(dtype)


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
    reader, metadata = read(path)
    names = {t.name for t in reader.tensors}
    raw = hf_config(path, metadata, names)
    try:
        config = hf.config_from_hf(raw, max_seq_len=max_seq_len)
    except ValueError as exc:
        raise GGUFError(f"{path}: {exc}") from None
    arch = metadata["general.architecture"]
    tensors = {}
    for tensor in reader.tensors:
        name = hf_name(path, tensor.name, arch)
        value = _dequantize(path, tensor, np.dtype(dtype))
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


def load_tokenizer(path):
    """The ``tokenizers.Tokenizer`` described by the file's metadata (``levels.tokenizer``)."""
    from .tokenizer import tokenizer_from_gguf

    _, metadata = read(path)
    try:
        return tokenizer_from_gguf(metadata)
    except ValueError as exc:
        raise GGUFError(f"{path}: {exc}") from None


def load_chat_template(path, required: bool = True):
    """The file's chat template (``levels.tokenizer.ChatTemplate``); without one, a
    ``GGUFError`` when ``required``, else None."""
    from .tokenizer import ChatTemplate

    _, metadata = read(path)
    if not metadata.get("tokenizer.chat_template") and not required:
        return None
    try:
        return ChatTemplate.from_gguf(metadata)
    except ValueError as exc:
        raise GGUFError(f"{path}: {exc}") from None


def end_of_turn_ids(path) -> tuple[int, ...]:
    """The ids that end a model's turn: its EOS, and the end-of-turn and end-of-message
    tokens llama.cpp's converter records for chat models that have them."""
    _, metadata = read(path)
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
