"""The attention ladder: one transformer written five times.

``LEVELS`` names the rungs in order; ``load(name)`` imports one and explains
why when it cannot (for instance triton missing for level 4). Every level
exposes the same interface (docs/conventions.md):

    asarray, to_numpy, attention, attend, merge_attention, describe,
    LayerNorm, RMSNorm, FeedForward, MultiHeadAttention, EncoderLayer, DecoderLayer,
    DecoderOnlyTransformer, Seq2SeqTransformer

(``attend`` is ``attention`` without its checks: what the layers call, on inputs
the model's edge has checked), builds from the canonical parameters made by
``init_params``, and states what it is once, in ``FACTS``
(``levels.common.facts.Facts``), which the harness and the tests read:

    FACTS.array        "python", "numpy" or "torch": the native array type
    FACTS.gradients    None, "hand-written" or "autograd"
    FACTS.interpreted  True when the kernels run in an emulator (Triton's interpreter)
    FACTS.dtypes       the float dtypes it computes in, most precise first
    FACTS.devices      where it runs ("cpu", "cuda")
    FACTS.description  one line on what computes (``describe()`` may say more)
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from .common.config import TransformerConfig
from .common.params import init_params, param_shapes


def _choose_triton_interpreter() -> None:
    """Without a GPU, level 4's kernels can only run in Triton's interpreter.

    Triton decides between compiling and interpreting when it is first
    imported, and torch imports it as a side effect of some of its own modules
    (``torch.nn.attention.bias``, which level 3 uses). So the choice cannot wait
    until level 4 is loaded: it is made here, when the package is imported,
    and this is the one place in the project that makes it. On a machine with
    no GPU driver (neither NVIDIA's nor AMD's device nodes),
    ``TRITON_INTERPRET=1`` unless the user already set the variable either way.
    (Importing torch to ask it would make ``import levels`` pay for torch even
    for level 0; the driver's device nodes answer without it.)
    """
    if not any(os.path.exists(node) for node in ("/dev/nvidiactl", "/dev/kfd")):
        os.environ.setdefault("TRITON_INTERPRET", "1")


_choose_triton_interpreter()

LEVELS: tuple[str, ...] = (
    "level0_loops",
    "level1_numpy",
    "level2_torch_manual",
    "level3_sdpa_flash",
    "level4_triton_kernel",
)


class LevelUnavailable(ImportError):
    """A level that cannot be imported on this machine; the message says why."""


def level_name(spec: str) -> str:
    """The full level name for ``spec``: a name (``"level2_torch_manual"``), its short
    form (``"level2"``) or the rung's number (``"2"``). ``ValueError`` if unknown."""
    spec = spec.strip()
    for number, name in enumerate(LEVELS):
        if spec in (name, f"level{number}", str(number)):
            return name
    raise ValueError(
        f"unknown level {spec!r}; choose one of {', '.join(LEVELS)} (or 0-{len(LEVELS) - 1})"
    )


def level_names(specs: str | None) -> list[str]:
    """A comma-separated list of levels (``"0,2,level3_sdpa_flash"``) -> full names, in
    the order given; empty or None means every level, in ladder order."""
    if not specs:
        return list(LEVELS)
    return [level_name(part) for part in specs.split(",") if part.strip()]


def load(name: str) -> ModuleType:
    """Import a level: a name of ``LEVELS``, its short form (``"level2"``) or its number (``"2"``).

    Raises ``ValueError`` for an unknown name and ``LevelUnavailable`` (an
    ``ImportError``) naming the missing piece when the level cannot run here.
    """
    name = level_name(str(name))
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ImportError as exc:
        raise LevelUnavailable(f"{name} is unavailable here: {exc}") from exc


def available() -> dict[str, ModuleType | str]:
    """Every level mapped to its module, or to the reason it cannot be loaded."""
    result: dict[str, ModuleType | str] = {}
    for name in LEVELS:
        try:
            result[name] = load(name)
        except LevelUnavailable as exc:
            result[name] = str(exc)
    return result


__all__ = [
    "LEVELS",
    "LevelUnavailable",
    "TransformerConfig",
    "available",
    "init_params",
    "level_name",
    "level_names",
    "load",
    "param_shapes",
]
