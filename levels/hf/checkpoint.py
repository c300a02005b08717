"""Reading a Hugging Face model directory: its ``config.json`` and its safetensors
weights (``model.safetensors``, or the shards ``model.safetensors.index.json`` lists)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..common.config import TransformerConfig
from .families import config_from_hf
from .layout import params_from_hf


def _read_tensors(path: Path, dtype: np.dtype) -> dict[str, np.ndarray]:
    """Every tensor of ``model.safetensors`` (or of the shards its index lists), as ``dtype``."""
    from safetensors import safe_open

    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.exists():
        files = [single]
    elif index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [path / name for name in sorted(set(weight_map.values()))]
    else:
        raise FileNotFoundError(
            f"{path} has neither model.safetensors nor model.safetensors.index.json"
        )
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        bf16 = []
        with safe_open(str(file), framework="np") as f:
            for name in f.keys():
                if f.get_slice(name).get_dtype() == "BF16":  # numpy has no bfloat16
                    bf16.append(name)
                else:
                    tensors[name] = f.get_tensor(name).astype(dtype)
        if bf16:
            with safe_open(str(file), framework="pt") as f:  # needs torch
                for name in bf16:
                    # bfloat16 -> float32 is exact (the same exponent, a shorter mantissa)
                    tensors[name] = f.get_tensor(name).float().numpy().astype(dtype)
    return tensors


def _read_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.exists():
        raise FileNotFoundError(f"{path} has no config.json")
    return json.loads(config_file.read_text())


def load_config(path, *, max_seq_len: int | None = None) -> TransformerConfig:
    """The ``TransformerConfig`` of the model directory ``path``, without reading its weights."""
    return config_from_hf(_read_config(Path(path)), max_seq_len=max_seq_len)


def load(
    path, *, max_seq_len: int | None = None, dtype=np.float64
) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """``(config, params)`` of the Hugging Face model directory ``path``, params in ``dtype``.

    float64 (the default) holds every float32, float16 and bfloat16 weight
    exactly; ``dtype=np.float32`` halves the memory of a large model, and
    is exact too for the float32 and half-precision checkpoints the Hub holds.

    ``max_seq_len`` (the longest sequence, and the KV cache's capacity) is the
    checkpoint's ``max_position_embeddings``, or the smaller value given here.
    ``pad_id`` is ``pad_token_id``, else the first ``eos_token_id``, else 0;
    ``bos_id`` and ``eos_id`` fall back to 0. (The models never infer padding
    from ``pad_id``: a padded batch passes ``valid``.)
    """
    path = Path(path)
    raw = _read_config(path)
    config = config_from_hf(raw, max_seq_len=max_seq_len)
    return config, params_from_hf(config, raw, _read_tensors(path, np.dtype(dtype)), where=path)
