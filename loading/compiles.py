"""Level 3's compiled passes as a run meets them (``ladder chat``, ``generate --compile``,
``serve --max-batch 1``, the bench): prepared before the first answer, announced before a
compile, and remembered.

A compiled step is kept in the user's cache under a key of what it was compiled for
(``levels.level3_sdpa_flash.compiled.cache_key``): the model, its context, dtype and weight
format, and the thread count, since inductor splits the step's loops over the threads it
compiles for (a step compiled for one thread runs on one; one compiled for two runs no
faster than eager on one). Any of them new costs a compile of about a minute. So:

* **the thread count** (unless ``--threads`` gives one; ``threads.py``) is one a step of
  this model is cached for: the count the load average leaves free if that one is cached, else the
  cached count nearest to it. The load average picks the count of a first compile only,
  and a chat at another load runs the step it has instead of compiling a second one.
  (One step for every count would be a one-thread step, which leaves every other core
  idle on a quiet machine; and a compile costs more than a chat's whole answer gains from
  one more thread.)
* **a compile is announced** before it starts, with what it is for, what this model has
  cached instead, and how long it should take: as long as this model's last compile of
  the same pass here, else its last of any pass (the check of guesses compiles about as
  long as the decode step), else about a minute (48.9 to 71.4 s for SmolLM2 on two cores,
  docs/decoding.md).
* **each compile leaves a note** beside its step (``decode-<key>.json``: the model, the
  context, dtype, weights and threads, the seconds it took), which the announcement reads.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable
from pathlib import Path

FIRST_COMPILE_S = 60.0  # a model's first compile here, before any was timed (see above)
SHOWN = 3  # cached steps named in an announcement, at most


def compiles(model, tokens: int = 1) -> bool:
    """Whether ``model``'s pass of ``tokens`` tokens a row (the decode step: one) is still to
    be compiled or loaded ahead of time here: level 3 with ``compile`` on, on a CPU with a
    C++ compiler (a GPU compiles at the first step, with no file to find; without a
    compiler the step runs eager)."""
    if not getattr(model, "compiled_decode", False):
        return False
    if tokens == 1 and model.decode_report is not None:
        return False
    if str(getattr(model, "device", "cpu")).startswith("cuda"):
        return False
    from levels.level3_sdpa_flash import compiled

    return compiled.compiler_missing() is None


def package(model, threads: int, tokens: int = 1) -> Path:
    """Where ``model``'s step of ``tokens`` tokens a row compiled for ``threads`` threads is
    kept (whether or not it is)."""
    import torch

    from levels.level3_sdpa_flash import compiled

    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # the key reads the count torch runs with
    try:
        return compiled.package_path(model, 1, tokens=tokens)
    finally:
        torch.set_num_threads(before)


def cached_counts(model, most: int) -> list[int]:
    """The thread counts from 1 to ``most`` that a step of ``model`` is cached for."""
    return [n for n in range(1, most + 1) if package(model, n).is_file()]


def _note_path(step: Path) -> Path:
    return step.with_suffix(".json")


def remember(step: Path, model_name: str, model, dtype: str, threads: int, seconds: float,
             tokens: int = 1):  # fmt: skip
    """The note of a compile, beside the step it made (written whole, then renamed)."""
    note = {
        "tokens": tokens,
        "model": model_name,
        "context": int(model.config.max_seq_len),
        "dtype": dtype,
        "weights": getattr(model, "weights", "float"),
        "threads": threads,
        "seconds": round(seconds, 1),
        "date": datetime.date.today().isoformat(),
    }
    path = _note_path(step)
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    scratch.write_text(json.dumps(note, indent=1) + "\n")
    os.replace(scratch, path)


def _notes(folder: Path, model_name: str, tokens: int | None = 1) -> list[dict]:
    """The notes of this model's compiles of ``tokens`` tokens a row (None: of any pass)
    whose steps are still cached, newest first."""
    notes = []
    for path in folder.glob("decode-*.json"):
        try:
            note = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a note is a hint: an unreadable one is no note
        if note.get("model") != model_name or tokens not in (None, note.get("tokens", 1)):
            continue
        if path.with_suffix(".pt2").is_file():
            notes.append(note)
    return sorted(notes, key=lambda n: n.get("date", ""), reverse=True)


def _describe(context: int, dtype: str, weights: str, threads: int) -> str:
    fmt = dtype if weights == "float" else f"{weights} weights"
    return f"context {context}, {fmt}, {threads} thread{'' if threads == 1 else 's'}"


def expected_seconds(
    model_name: str, model, threads: int, tokens: int = 1, first: float = FIRST_COMPILE_S
) -> float:
    """How long a compile of ``model``'s pass of ``tokens`` tokens a row should take here: as
    long as this model's last one of that pass (its note), else its last one of any pass
    (the check of guesses compiles about as long as the decode step), else ``first``."""
    folder = package(model, threads, tokens).parent
    notes = _notes(folder, model_name, tokens) or _notes(folder, model_name, None)
    return float(notes[0]["seconds"]) if notes else first


def announcement(
    model_name: str,
    model,
    dtype: str,
    threads: int,
    tokens: int = 1,
    first: float = FIRST_COMPILE_S,
) -> str:
    """The line before a compile: what it is for, how long it should take (``first`` where
    no compile of this model was timed here), what is cached for the model instead (a
    ``--context``, ``--dtype``, ``--weights`` or ``--threads`` that matches one of those
    loads it instead)."""
    weights = getattr(model, "weights", "float")
    what = _describe(int(model.config.max_seq_len), dtype, weights, threads)
    folder = package(model, threads, tokens).parent
    notes, other = _notes(folder, model_name, tokens), _notes(folder, model_name, None)
    seconds = expected_seconds(model_name, model, threads, tokens, first)
    if notes:
        when = f"about {seconds:.0f} s, as its last compile here"
    elif other:
        when = f"about {seconds:.0f} s, as this model's last compile here"
    else:
        minutes = round(seconds / 60)
        when = f"about {minutes} minute{'' if minutes == 1 else 's'}"
    step = "decode step" if tokens == 1 else f"check of {tokens - 1} guesses (--speculate)"
    line = f"compiling the {step} of {model_name} for {what}: {when}, once"
    if notes:
        cached = [_describe(n["context"], n["dtype"], n["weights"], n["threads"]) for n in notes]
        more = f" and {len(cached) - SHOWN} more" if len(cached) > SHOWN else ""
        line += f" (cached here for {'; '.join(cached[:SHOWN])}{more})"
    return line + "; later runs load it from the cache"


def prepare(loaded, threads: int, say: Callable[[str], None], model=None, tokens: int = 1) -> None:
    """With ``compile``, level 3's pass of ``tokens`` tokens a row for ``model`` (the loaded
    model's by default, or a draft's) compiled now (or loaded from the cache), once for
    ``loaded``, saying which (``say``): a compile says so before it starts, with its
    expected time. ``tokens`` is 1 for the decode step, ``K + 1`` for a check of ``K``
    guesses. A run prepares before its first answer (after the prompt is known to fit: a
    refused prompt costs no compile), so that the answer's tokens/s are the compiled step's."""
    model = model or loaded.model
    if not getattr(model, "compiled_decode", False) or (id(model), tokens) in loaded.prepared:
        return
    if tokens == 1 and model.decode_report is not None:  # prepared before it was loaded here
        return
    loaded.prepared.add((id(model), tokens))
    step = package(model, threads, tokens) if compiles(model, tokens) else None
    if step is not None and not step.is_file():
        say(announcement(loaded.name, model, loaded.dtype, threads, tokens))
    report = model.prepare_decode(1, tokens)
    say(report.line())
    if report.how == "compiled" and step is not None and step.is_file():
        remember(step, loaded.name, model, loaded.dtype, threads, report.seconds, tokens)


def prepare_all(loaded, threads: int, say: Callable[[str], None], draft_tokens: int | None) -> None:
    """Every compiled pass an answer runs: the decode step and, with a draft, the check of
    ``draft_tokens`` guesses (None: paced, the most a paced pass makes) and the draft
    model's own decode step."""
    from levels.common.speculative import PACED

    prepare(loaded, threads, say)
    if loaded.draft is not None:
        prepare(loaded, threads, say, tokens=(draft_tokens or PACED) + 1)
        if hasattr(loaded.draft, "model"):
            prepare(loaded, threads, say, model=loaded.draft.model)
