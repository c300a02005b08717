"""Writing a Hugging Face model directory: ``config.json`` and ``model.safetensors``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..common.config import TransformerConfig
from ..common.params import check_params, param_shapes
from .families import config_to_hf
from .layout import params_to_hf


def save(path, config: TransformerConfig, params: Mapping[str, object]) -> None:
    """Write ``config`` and ``params`` as a Hugging Face model directory (float32 safetensors).

    The family follows from the config: GPT-NeoX for LayerNorm + GELU with
    biases; Llama for RMSNorm + SwiGLU without a window (``attention_bias`` for
    matching q/k/v and output biases, ``mlp_bias`` for ``bias``); Mistral for
    RMSNorm + SwiGLU with a window and no biases; Qwen2 for q/k/v biases only.
    Anything else is a ``ValueError`` naming the option no family expresses.
    ``dropout`` is a training setting and is not written.
    """
    from safetensors.numpy import save_file

    raw = config_to_hf(config)  # refuses first what no family expresses
    check_params(params, param_shapes(config, "decoder_only"))
    arrays = {name: np.asarray(value, dtype=np.float64) for name, value in params.items()}
    hf = params_to_hf(config, raw, arrays)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    tensors = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in hf.items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
