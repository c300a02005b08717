"""The ``startup`` scenario: how long a cached ``ladder chat -p`` takes to print its first token.

What a user waits for before anything happens, measured from outside, as they see it:
a fresh ``python -m ladder chat -p QUESTION --max-new-tokens 1 --threads 1`` process,
from its start to the first byte of the answer on its stdout (the model already pulled,
a compiled decode step already in the cache: one untimed run first makes sure of both).
Everything counts: the interpreter, the imports (torch's alone is a second or two), the
GGUF file's header, tokenizer and weights, the model's construction, loading the
compiled step, the prompt's prefill. The first token is checked against the float64
reference's greedy token before the samples are taken.

Level 3 runs twice, with ``--no-compile`` (eager decode) and as ``level3:compiled``
(its compiled step loaded from the cache before the first answer); levels 1 and 2
join in the full run. The records are timed by this module (each sample a process),
so they come with the plan's computed figures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

from .measure import summarize
from .real_model import Compile
from .records import OK, WRONG, Record

TIMEOUT_S = 300  # a first run that compiles the decode step takes a few minutes here
# The context of the step `ladder chat` and `ladder serve` compile by default: the model's,
# at most ladder/chat.py's DEFAULT_CONTEXT (SmolLM2 allows 8192).
CHAT_CONTEXT = 2048


def startup_compiles(quick: bool) -> tuple[Compile, ...]:
    """What the untimed first run of ``level3:compiled`` compiles where the cache lacks it."""
    return (Compile(CHAT_CONTEXT, threads=1),)


def _command(level: str, compile: bool) -> list[str]:
    from .real_model import QUESTION

    flags = ["--level", level, "--compile" if compile else "--no-compile"]
    if not level.startswith("level3"):
        flags = flags[:2]
    return [sys.executable, "-m", "ladder", "chat", "-p", QUESTION, "--max-new-tokens", "1",
            "--threads", "1", *flags]  # fmt: skip


def first_token(command: list[str]) -> tuple[float, str]:
    """Seconds from the process's start to its first byte on stdout, and that output; the
    process is then left to finish (its exit is not part of the figure)."""
    start = time.perf_counter()
    # Unbuffered: the one byte read here is the only one taken from the pipe, and
    # communicate() gets the rest (a buffered read would keep them from it).
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        env=os.environ | {"NO_COLOR": "1"},
    )
    try:
        first = process.stdout.read(1)
        elapsed = time.perf_counter() - start
        rest, errors = process.communicate(timeout=TIMEOUT_S)
    except BaseException:
        process.kill()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {process.returncode}: {errors.decode()}")
    return elapsed, (first + rest).decode("utf-8", "replace")


def _expected_first_word() -> str:
    """The first word the float64 reference picks greedily after the chat prompt."""
    from levels import gguf

    from .real_model import _file, _truth

    token = int(np.argmax(_truth()))
    return gguf.load_tokenizer(_file()).decode([token]).strip()


def startup_records(quick: bool) -> list[Record]:
    """One record per way of running: the median seconds to the first token (``quick``: one
    sample each, level 3 only; otherwise three, and levels 1 and 2 too)."""
    from .real_model import MODEL, _file

    if _file() is None:
        return [
            Record(
                level="ladder chat",
                scenario="startup",
                device="cpu",
                dtype="float32",
                status=f"skipped: {MODEL} is not cached: ladder pull {MODEL}",
            )
        ]
    ways = [("level3_sdpa_flash", False), ("level3:compiled", True)]
    if not quick:
        ways = [("level1_numpy", False), ("level2_torch_manual", False), *ways]
    expected, samples_each = _expected_first_word(), 1 if quick else 3
    records = []
    for name, compile in ways:
        command = _command(name.split(":")[0], compile)
        first_token(command)  # untimed: the model pulled, the compiled step in the cache
        samples, outputs = zip(*(first_token(command) for _ in range(samples_each)), strict=True)
        stats = summarize(samples)
        right = all(out.strip().startswith(expected) for out in outputs)
        records.append(
            Record(
                level=name,
                scenario="startup",
                device="cpu",
                dtype="float32",
                shape={"P": 37, "threads": 1},
                status=OK if right else WRONG,
                median_s=stats.median,
                q1_s=stats.q1,
                q3_s=stats.q3,
                min_s=stats.min,
                max_s=stats.max,
                repeats=stats.n,
                max_error=0.0 if right else 1.0,
                error_of="first token != reference",
                error_bound=0.0,
                description=f"{' '.join(command[1:4])} ... (a new process, cached model)",
                note=f"seconds to the first token; the first answered {outputs[0].strip()!r}",
            )
        )
    return records
