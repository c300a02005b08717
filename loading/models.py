"""A model source to a model at a level, with its tokenizer, chat template, stop ids and draft.

A source is a name the ladder knows (its file pulled into the cache on first use), a GGUF
file, a Hugging Face directory, or a ``ladder train`` checkpoint (a task's symbols, not
text). ``source`` says which a path is; ``load`` builds the chosen level's decoder-only
model from the canonical parameters as for any other run, with what turns text into its
tokens and back, the ids that end a turn, and a draft for speculative decoding.
A source that cannot be loaded as asked is a ``LoadError`` naming what is wrong.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import slow

DEFAULT_CONTEXT = 2048  # tokens: the KV cache a model allocates unless asked otherwise
DRAFTS = ("ngram", "int8", "int4", "layers:N")


class LoadError(ValueError):
    """A source that cannot be loaded as asked: a missing file, a file of another kind, an
    option the model or level does not take. The message says which."""


@dataclass
class Loaded:
    """A model built at a level, with what turns text into its tokens and back."""

    model: Any
    level: Any  # the level's module
    name: str  # what the user asked for, as it is reported
    tokenizer: Any = None  # tokenizers.Tokenizer, None for a trained task model
    template: Any = None  # levels.tokenizer.ChatTemplate, None without one
    stop_ids: tuple[int, ...] = ()
    dtype: str = "float64"
    spec: Any = None  # a trained checkpoint's RunSpec
    model_context: int | None = None  # the longest context the model allows (its file's)
    draft: Any = None  # a draft for speculative decoding (engine.drafts)
    prepared: set = field(default_factory=set)  # (model's id, tokens) of passes compiled or loaded
    cost: Any = None  # at a rung that takes seconds a token, what it costs (slow.Cost)


def source(model: str | Path | None = None, *, hf: Path | None = None, checkpoint: Path | None = None,
           fetch: Callable[[str], Path] | None = None) -> tuple[str, Path]:  # fmt: skip
    """``(kind, path)`` of a source: ``"gguf"``, ``"hf"`` or ``"checkpoint"``. ``checkpoint``
    and ``hf`` say the kind outright; ``model`` is recognised by what it is, and a known
    name is fetched first (``fetch``, default ``levels.registry.pull``)."""
    from levels import registry

    if checkpoint is not None:
        return "checkpoint", Path(checkpoint)
    if hf is not None:
        if not Path(hf).is_dir():
            raise LoadError(f"--hf {hf}: not a directory")
        return "hf", Path(hf)
    text = str(model or registry.DEFAULT_MODEL)
    if text in registry.MODELS:
        return "gguf", (fetch or (lambda name: registry.pull(name)[0]))(text)
    path = Path(text)
    if path.is_dir():
        if not (path / "config.json").exists():
            raise LoadError(f"--model {path}: a directory without config.json")
        return "hf", path
    if not path.is_file():
        raise LoadError(f"--model {text}: no such file or directory, and not a model the ladder knows ({', '.join(registry.MODELS)})")  # fmt: skip
    with open(path, "rb") as f:
        head = f.read(32)
    if head.startswith(b"GGUF") or path.suffix == ".gguf":
        return "gguf", path
    from lab.checkpoint import MAGIC

    if head.startswith(MAGIC):
        return "checkpoint", path
    raise LoadError(f"--model {path}: neither a GGUF file, a Hugging Face directory nor a `ladder train` checkpoint")  # fmt: skip


def default_dtype(level, asked: str | None = None) -> str:
    """``asked``, or the level's: float32 where it computes in it, else its first dtype."""
    dtype = asked or ("float32" if "float32" in level.FACTS.dtypes else level.FACTS.dtypes[0])
    if dtype not in level.FACTS.dtypes:
        raise LoadError(f"--dtype {dtype}: {level.__name__} computes in {', '.join(level.FACTS.dtypes)}")  # fmt: skip
    return dtype


def build(level, config, params, dtype: str, device: str = "cpu", *, weights="float",
          compile=False, owned=False):  # fmt: skip
    """The level's decoder-only model of ``(config, params)`` in ``dtype`` on ``device``;
    level 3 takes ``weights`` (``"int8"``, ``"int4"``, ``"blocked"``) and ``compile``.
    ``owned``: the caller hands ``params`` over (a torch level's parameters may then be
    those very arrays, not copies: ``levels.level2_torch_manual.arrays.adopt``)."""
    kwargs: dict[str, Any] = {}
    if level.FACTS.array == "numpy":
        kwargs["dtype"] = np.dtype(dtype)
    elif level.FACTS.array == "torch":
        import torch

        kwargs |= {"dtype": getattr(torch, dtype), "device": device}
    if weights != "float":
        kwargs["weights"] = weights
    if compile:
        kwargs["compile"] = True
    handover = contextlib.nullcontext()
    if owned and level.FACTS.array == "torch":
        from levels.level2_torch_manual.arrays import adopt

        handover = adopt()
    with handover:
        return level.DecoderOnlyTransformer(config, params, **kwargs)


def load(kind: str, path: Path, *, level, name: str, dtype: str | None = None, device="cpu",
         context: int | None = None, weights="float", compile=False, draft: str | None = None,
         seed: int | None = None, chat: bool = True,
         warn: Callable[[str], None] = lambda line: None) -> Loaded:  # fmt: skip
    """The model of ``(kind, path)`` (``source``'s) built at ``level`` (a module) -> ``Loaded``.

    ``context`` tokens of KV cache (default ``DEFAULT_CONTEXT``, or the model's if less);
    ``weights`` and ``compile`` as ``build``'s; ``draft`` names the draft (``DRAFTS``;
    ``seed`` seeds a model draft's draws); ``chat``: the template is needed. ``warn``
    receives a line before the build at a rung that takes seconds a token (``slow``)."""
    from levels import gguf, hf, unpacked

    dtype = default_dtype(level, dtype)
    if kind == "checkpoint":
        from lab.inference import load_model

        model, spec = load_model(path, level, device=device)
        return Loaded(model, level, str(path), spec=spec)
    if kind == "gguf":
        template = gguf.load_chat_template(path, chat)  # first: it may refuse the file
        tokenizer = gguf.load_tokenizer(path)  # Gemma 3's 262k pieces take a while
        config, params = unpacked.load(path, dtype=_numpy_dtype(dtype))  # kept unpacked
        stops = set(gguf.end_of_turn_ids(path))
    else:
        template = hf.load_chat_template(path, chat)
        tokenizer = hf.load_tokenizer(path)
        config, params = hf.load(path, dtype=_numpy_dtype(dtype))
        stops = set()
    context = context or min(config.max_seq_len, DEFAULT_CONTEXT)
    if context > config.max_seq_len:
        raise LoadError(f"--context {context} exceeds the model's {config.max_seq_len} tokens")
    longest = config.max_seq_len
    # The KV cache and RoPE tables are built for this context, not the file's whole one.
    config = dataclasses.replace(config, max_seq_len=context)
    warning = slow.warning(level, config, device)  # level 0, level 4 interpreted
    if warning is not None:
        warn(warning)
    stops.add(config.eos_id)
    check_draft(level, config, draft)
    copy = draft in ("int8", "int4")  # a second model over the same floats: not handed over
    model = build(level, config, params, dtype, device, weights=weights, compile=compile, owned=not copy)  # fmt: skip

    def make(weights: str, n_layers: int | None = None):
        from levels.common.params import param_shapes

        cfg = config if n_layers is None else config.first_layers(n_layers)
        kept = param_shapes(cfg, "decoder_only")
        subset = {k: v for k, v in params.items() if k in kept}
        return build(level, cfg, subset, dtype, device, weights=weights, compile=compile)

    guesser = draft_of(draft, model, make, seed)
    return Loaded(model, level, name, tokenizer, template, tuple(sorted(stops)), dtype,
                  model_context=longest, draft=guesser, cost=slow.cost(level, config, device))  # fmt: skip


def check_draft(level, config, draft: str | None) -> None:
    """A draft that fits this model and level: int8 and int4 copies are level 3's, ``layers:N``
    needs fewer layers than the model has; checked before the model is built."""
    if draft in ("int8", "int4") and not level.__name__.endswith("level3_sdpa_flash"):
        raise LoadError(f"--speculate {draft} drafts with level 3's {draft} weights (--level 3)")
    if draft and draft.startswith("layers:"):
        n = int(draft.partition(":")[2])
        if not 1 <= n < config.n_layers:
            raise LoadError(f"--speculate {draft}: the model has {config.n_layers} layers; N must be 1 to {config.n_layers - 1}")  # fmt: skip


def draft_of(name: str | None, model, make: Callable[..., Any], seed: int | None = None):
    """The draft ``name`` names, or None: the n-gram lookup, a copy of the model in int8 or
    int4 weights, or the model's first N layers (``model.first_layers``: a model of their
    own over the same parameters). ``make(weights, n_layers=None)`` builds a model of the
    loaded parameters in ``weights`` (of its first ``n_layers`` only, when given)."""
    if name is None:
        return None
    from engine import ModelDraft, commands_ngram

    if name == "ngram":
        return commands_ngram()
    if name.startswith("layers:"):
        n, weights = int(name.partition(":")[2]), getattr(model, "weights", "float")
        return ModelDraft(model.first_layers(n) if weights == "float" else make(weights, n), seed=seed)  # fmt: skip
    return ModelDraft(make(name), seed=seed)


def _numpy_dtype(dtype: str):
    # Parameters as float64 for the float64 levels; float32 holds every other dtype's
    # weights exactly (GGUF dequantizes to float32; half precision is a subset).
    return np.float64 if dtype == "float64" else np.float32
