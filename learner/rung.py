"""Writing a rung into a folder, importing it back, and telling whose code a stage runs.

``new(folder, take=())`` copies the scaffold (``scaffold/``), with the files of the
stages in ``take`` from ``taken/`` (level 1's pieces). ``load(folder)`` imports the
package found there under a name of its own (the folder's, and a hash of its path, so
two rungs never share one) and checks that it exposes every name of ``NAMES``; anything
that goes wrong is a ``RungError`` of one line, naming the file and line of the
learner's code where it failed. ``origin`` says whether a stage's entry is the learner's
or the ladder's, and ``stage_entries`` gives the code of each stage's entries, by which
the suite tells which stage a ``NotImplementedError`` came from.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import sys
import traceback
from pathlib import Path
from types import CodeType, ModuleType

from .stages import STAGES, stage

HERE = Path(__file__).resolve().parent
SCAFFOLD, TAKEN = HERE / "scaffold", HERE / "taken"

# What a rung offers the suite and the bench: what a level offers (levels/__init__.py), less
# what no stage asks for (the encoder-decoder, the decoder block, merge_attention), plus
# its own functions and classes, one for each stage.
NAMES = (
    "FACTS", "describe", "asarray", "to_numpy", "attention", "attend", "softmax", "rope",
    "layer_norm", "rms_norm", "ops", "LayerNorm", "RMSNorm", "FeedForward",
    "MultiHeadAttention", "EncoderLayer", "KVCache", "DecoderOnlyTransformer",
)  # fmt: skip


class RungError(ValueError):
    """A rung that cannot be written or imported; the message is one line."""


def new(folder, take: tuple[str, ...] = ()) -> list[Path]:
    """Write a rung into ``folder`` (new, or empty): the scaffold, with the stages named in
    ``take`` (``stages.stage_names``) taken from level 1. -> the files written."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise RungError(f"{folder} exists and is not an empty folder: a rung is written into a new one")  # fmt: skip
    taken = {stage(name).file for name in take}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for source in sorted(SCAFFOLD.glob("*.py")):
            target = folder / source.name
            shutil.copyfile(TAKEN / source.name if source.name in taken else source, target)
            written.append(target)
    except OSError as exc:
        raise RungError(f"cannot write a rung into {folder}: {exc.strerror}") from None
    return written


def load(folder) -> ModuleType:
    """Import the rung in ``folder``; ``RungError`` (one line) when it is not a package, does
    not import, or lacks a name of ``NAMES``."""
    folder = Path(folder).resolve()
    init = folder / "__init__.py"
    if not folder.is_dir():
        raise RungError(f"{folder}: no such folder (`ladder rung new {folder}` writes a rung)")
    if not init.is_file():
        raise RungError(f"{folder} holds no rung: it has no __init__.py (`ladder rung new` writes one)")  # fmt: skip
    digest = hashlib.sha256(str(folder).encode()).hexdigest()[:8]
    name = f"rung_{re.sub(r'[^0-9a-zA-Z_]', '_', folder.name)}_{digest}"
    for old in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[old]  # a second load sees the files as they are now
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # No bytecode is written beside the learner's files: none can then be read back stale
    # (its timestamp is in whole seconds), and their folder stays theirs.
    writing, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the learner's code: any error is theirs to read, in one line
        for partial in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[partial]
        raise RungError(f"your rung at {folder} does not import: {failure(exc, folder)}") from None
    finally:
        sys.dont_write_bytecode = writing
    missing = [n for n in NAMES if not hasattr(module, n)]
    if missing:
        raise RungError(f"your rung at {folder} lacks {', '.join(missing)} (its __init__.py names them: compare with `ladder rung new`'s)")  # fmt: skip
    return module


def failure(exc: BaseException, folder: Path) -> str:
    """``exc`` in one line, with where in ``folder``'s files it was raised (the innermost
    frame there), e.g. ``IndexError: ... (attention.py:23, in attention)``."""
    text = " ".join(str(exc).split())
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{_relative(exc.filename, folder)}:{exc.lineno}"
        return f"SyntaxError: {exc.msg} ({where})"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if inside(f.filename, folder)]
    where = f" ({_relative(frames[-1].filename, folder)}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""  # fmt: skip
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


def inside(filename: str, folder: Path) -> bool:
    """Whether ``filename`` is one of ``folder``'s files (the learner's code)."""
    return Path(filename).resolve().is_relative_to(folder)


def _relative(filename: str, folder: Path) -> str:
    path = Path(filename).resolve()
    return str(path.relative_to(folder)) if path.is_relative_to(folder) else str(path)


def _entry(module: ModuleType, dotted: str):
    """The function ``dotted`` names on the rung (``"attention"``, ``"KVCache.update"``)."""
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def origin(module: ModuleType, name: str) -> str | None:
    """Whose code stage ``name`` runs: None for the learner's, or the ladder's module whose
    entries it takes (``"levels.level1_numpy.ops"``)."""
    found = {getattr(_entry(module, e), "__module__", "") for e in stage(name).entries}
    ladders = sorted(m for m in found if m.split(".")[0] == "levels")
    return ladders[0] if ladders else None


def stage_entries(module: ModuleType) -> dict[CodeType, str]:
    """The code object of every stage entry the learner's package defines -> its stage."""
    codes = {}
    for s in STAGES:
        for dotted in s.entries:
            code = getattr(_entry(module, dotted), "__code__", None)
            if code is not None:
                codes[code] = s.name
    return codes
