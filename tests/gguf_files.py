"""Tiny GGUF files written with ``gguf``'s own writer, for the loader's tests.

Random weights in a chosen tensor type per matrix (round-robin over ``TYPES``,
quantized by ``gguf.quants.quantize``), a llama, qwen2 or gemma3 architecture,
tied or untied. They are written in the layout llama.cpp's converter produces, which
is all the loader may assume; whether that layout is read right is decided by
``transformers`` reading the same file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SIZES = dict(D=256, H=4, Hkv=2, F=512, L=2, V=320)
# Gemma 3: six layers (the last one global), heads of 128 (not D / H = 64), a window of 4.
GEMMA3 = dict(L=6, Dh=128, window=4)


def types():
    from gguf import GGMLQuantizationType as Q

    # Every type gguf can also *write* (its K-quants it reads only; the real models hold
    # Q4_K, Q6_K and Q5_0, tests/test_real_models.py).
    return [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.BF16, Q.F16, Q.F32]


def write(
    path: Path,
    *,
    arch: str = "llama",
    tie: bool = True,
    seed: int = 0,
    metadata: dict | None = None,
    tokenizer: bool = True,
    extra_tensors: dict | None = None,
) -> Path:
    """A tiny model at ``path``; ``metadata`` overrides or adds keys (``{key: (type, value)}``
    with type a ``gguf.GGUFValueType`` name, or None to drop a key the writer would add);
    ``extra_tensors`` adds numpy arrays under GGUF names, typed by their dtype."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    D, H, Hkv, F, L, V = (SIZES[k] for k in ("D", "H", "Hkv", "F", "L", "V"))
    Dh = D // H
    gemma = arch == "gemma3"
    if gemma:
        L, Dh = GEMMA3["L"], GEMMA3["Dh"]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    keys = {
        f"{arch}.block_count": ("UINT32", L),
        f"{arch}.context_length": ("UINT32", 128),
        f"{arch}.embedding_length": ("UINT32", D),
        f"{arch}.feed_forward_length": ("UINT32", F),
        f"{arch}.attention.head_count": ("UINT32", H),
        f"{arch}.attention.head_count_kv": ("UINT32", Hkv),
        f"{arch}.rope.freq_base": ("FLOAT32", 50000.0),
        f"{arch}.attention.layer_norm_rms_epsilon": ("FLOAT32", 1e-5),
        f"{arch}.vocab_size": ("UINT32", V),
        f"{arch}.rope.dimension_count": ("UINT32", Dh),
        "tokenizer.ggml.bos_token_id": ("UINT32", 1),
        "tokenizer.ggml.eos_token_id": ("UINT32", 2),
    }
    if gemma:  # as llama.cpp's converter writes a Gemma 3 file
        keys |= {
            f"{arch}.attention.key_length": ("UINT32", Dh),
            f"{arch}.attention.value_length": ("UINT32", Dh),
            f"{arch}.attention.sliding_window": ("UINT32", GEMMA3["window"]),
            f"{arch}.rope.dimension_count": None,
        }
    keys |= metadata or {}
    for key, entry in keys.items():
        if entry is not None:
            kind, value = entry
            writer.add_key_value(key, value, getattr(gguf.GGUFValueType, kind))
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list([f"t{i}" for i in range(V)])
        writer.add_token_merges([])
    kinds = iter(types() * 8)

    def tensor(name: str, shape: tuple[int, ...], qtype=Q.F32) -> None:
        if len(shape) == 2:
            a = rng.normal(0.0, 1.0 / np.sqrt(shape[1]), shape).astype(np.float32)
        else:  # gains around 1, biases around 0
            a = rng.normal(1.0 if name.endswith("norm.weight") else 0.0, 0.1, shape)
            a = a.astype(np.float32)
        if qtype == Q.F32:
            writer.add_tensor(name, a)
        elif qtype == Q.F16:
            writer.add_tensor(name, a.astype(np.float16))
        else:
            packed = quants.quantize(a, qtype)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=qtype)

    tensor("token_embd.weight", (V, D), Q.Q8_0)
    for i in range(L):
        tensor(f"blk.{i}.attn_norm.weight", (D,))
        shapes = {
            "attn_q": (H * Dh, D),
            "attn_k": (Hkv * Dh, D),
            "attn_v": (Hkv * Dh, D),
            "attn_output": (D, H * Dh),
            "ffn_gate": (F, D),
            "ffn_up": (F, D),
            "ffn_down": (D, F),
        }
        for name, shape in shapes.items():
            tensor(f"blk.{i}.{name}.weight", shape, next(kinds))
        if arch == "qwen2":
            for name in ("attn_q", "attn_k", "attn_v"):
                tensor(f"blk.{i}.{name}.bias", (shapes[name][0],))
        tensor(f"blk.{i}.ffn_norm.weight", (D,))
        if gemma:  # QK-norm, and a norm after each sublayer (gains around 1: 1 + w, stored)
            tensor(f"blk.{i}.attn_q_norm.weight", (Dh,))
            tensor(f"blk.{i}.attn_k_norm.weight", (Dh,))
            tensor(f"blk.{i}.post_attention_norm.weight", (D,))
            tensor(f"blk.{i}.post_ffw_norm.weight", (D,))
    tensor("output_norm.weight", (D,))
    if not tie:
        tensor("output.weight", (V, D), Q.Q4_0)
    for name, array in (extra_tensors or {}).items():
        writer.add_tensor(name, array)  # as given: its numpy dtype decides the GGUF type
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
