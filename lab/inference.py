"""Using a trained model: load a checkpoint of ``ladder train`` at any level and continue an input.

    from lab.inference import load_model, continue_symbols
    model, spec = load_model("runs/reverse.pt", "level3_sdpa_flash")
    continue_symbols(model, spec, [5, 9, 4, 7])   # -> [7, 4, 9, 5] once trained on reverse

This is what ``ladder generate --checkpoint PATH --input "5 9 4 7"`` runs.
Inputs are the task's content symbols (ids ``3 .. vocab_size - 1``); the
framing (BOS, EOS) is the task's, added here.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import levels
from levels.common.tasks import BOS_ID, EOS_ID, FIRST_SYMBOL

from .checkpoint import load_checkpoint
from .train import RunSpec, spec_from_dict


def load_model(
    checkpoint: str | Path, level: str | ModuleType, *, device=None
) -> tuple[Any, RunSpec]:
    """The trained model of ``checkpoint`` built at ``level`` (a name or a loaded level),
    and the run's spec. The checkpoint is verified first (``load_checkpoint``)."""
    saved = load_checkpoint(checkpoint)
    spec = spec_from_dict(saved["spec"])
    module = levels.load(level) if isinstance(level, str) else level
    cls = module.Seq2SeqTransformer if spec.kind == "seq2seq" else module.DecoderOnlyTransformer
    kwargs = {} if module.FACTS.array != "torch" or device is None else {"device": device}
    return cls(spec.config, saved["params"], **kwargs), spec


def continue_symbols(
    model: Any, spec: RunSpec, symbols: list[int], *, max_new_tokens: int | None = None
) -> list[int]:
    """The model's greedy output for the content ``symbols``.

    Seq2seq: the source is ``[BOS] + symbols + [EOS]`` and the output runs up to
    its EOS (left out). Decoder-only: the prompt is ``[BOS] + symbols`` and the
    continuation has ``max_new_tokens`` tokens (default: up to ``max_seq_len``).
    """
    config = spec.config
    bad = [s for s in symbols if not FIRST_SYMBOL <= s < config.vocab_size]
    if not symbols or bad:
        raise ValueError(
            f"the input must be content symbols in [{FIRST_SYMBOL}, {config.vocab_size}); "
            f"got {symbols if not symbols else bad}"
        )
    # Every level's generate takes numpy token arrays and returns its own array type.
    if spec.kind == "seq2seq":
        src = np.array([[BOS_ID, *symbols, EOS_ID]], dtype=np.int64)  # (1, S)
        out = _numpy(model.generate(src, max_new_tokens=max_new_tokens))[0]  # (1 + n,)
        body = [int(t) for t in out[1:]]
        return body[: body.index(EOS_ID)] if EOS_ID in body else body
    prompt = np.array([[BOS_ID, *symbols]], dtype=np.int64)  # (1, P)
    n = config.max_seq_len - prompt.shape[1] if max_new_tokens is None else max_new_tokens
    out = _numpy(model.generate(prompt, n))[0]  # (P + n,)
    return [int(t) for t in out[prompt.shape[1] :]]


def _numpy(x: Any) -> np.ndarray:
    """A level's token array (nested lists, numpy, a tensor) as numpy."""
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
