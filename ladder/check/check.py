"""Level 4 compiled for the GPUs it exists for, on a machine without one.

Motivation
----------
Without a GPU, level 4's kernels only ever run in Triton's interpreter, which
executes the Python of a kernel with numpy. It accepts programs the compiler
rejects, and it ignores everything that decides whether a kernel can run on a
real GPU: ``num_warps``, ``num_stages``, the shared memory one program may use,
the dtype rules of ``tl.dot`` on tensor cores. A kernel that passes every test
here can still fail to compile, or fail to launch, on the first GPU it meets.

Triton compiles ahead of time for a CUDA target on a machine with no GPU::

    triton.compile(ASTSource(fn=kernel, signature=..., constexprs=..., attrs=...),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})

runs its whole pipeline on the CPU (Triton IR, TritonGPU IR, LLVM IR, PTX, and
``ptxas``, which ships with triton, to a cubin) and the compiled kernel's
``metadata.shared`` is the shared memory one program needs. This module does
that for every job of matrix.py (every kernel, in every launch the autotuner
or a launcher can give it, in every dtype, at the head widths and flags a user
can reach) for sm_80 (A100) and sm_90 (H100, H200).

Shared memory
-------------
A launch fails when a program needs more shared memory than the GPU gives one
(``TARGETS``, in matrix.py; Triton checks the kernel's need against the
device's opt-in limit before launching). The need is known after the LLVM-IR
stage, where Triton allocates it; a kernel over its target's limit is stopped
there (``StopOverLimit``) instead of being handed to ``ptxas``, which can take
minutes on the largest fp32 tiles, only to produce a kernel that cannot launch.

The autotuner's candidates are one list per dtype class (level 4's tiles.py)
for every head width, and some of them do not fit everywhere (the widest tiles
at head 256). They are pruned before the autotuner compiles anything:
``tiles.CandidatePrune`` keeps the candidates whose measured need
(level 4's shared_memory.py, written by this check with
``--write-table``) is within the GPU's own limit. This check uses the same
decision (``tiles.fitting_shapes``) with the limits above, so what it reports as
pruned for a target is what the autotuner skips there; a pruned candidate is not
compiled here either (its measurement is the table's), unless ``--write-table``
measures everything again.

What is a failure
-----------------
* a job that does not compile (the message names kernel, tiles, dtype, size,
  variant and target, then the compiler's last lines);
* a job over its target's limit that the prune would keep (a fixed launch, or a
  candidate with no or a stale measurement);
* a measurement that no longer matches shared_memory.py (regenerate it);
* a (kernel, dtype, head width, target) left with no candidate.

Two processes
-------------
Compiling needs a process where Triton chose its compiler when it was imported,
and this one (which imported ``levels``) may have chosen the interpreter. The
compiles run in worker processes started with ``TRITON_INTERPRET=0``
(``python -m ladder.check``), which load the kernel modules on their
own (the package docstring, ladder/check/__init__.py, explains how,
and which kernel modules each process uses); a job goes to a worker as one line
of JSON and its result comes back as one. ``run`` (the ``ladder check``
command), the tests and ``compile_jobs`` use them; ``compile_one`` is what a
worker calls.

Cost
----
Compiled kernels go to Triton's own cache (``~/.triton/cache``, or
``TRITON_CACHE_DIR``), keyed by source, options and target, so a second run
recompiles only what changed: minutes cold, seconds warm (the appendix's
measurements). ``--write-table`` also compiles the pruned candidates, as far as the
LLVM-IR stage.

Run it as ``ladder check``
(``--help`` for the filters).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import triton

from . import kernels
from .matrix import FAMILY, KERNELS, MATRIX_DTYPES, TARGETS, Job, compile_inputs, plan

tiles = kernels().tiles  # level 4's tiles.py, as this process has it (the package docstring)
WORKER_TIMEOUT_S = 600.0  # one compile at most (the slowest fp32 tiles take about a minute)


# ---------------------------------------------------------------------------
# In a worker: one compile
# ---------------------------------------------------------------------------


class OverLimit(Exception):
    """A kernel needs more shared memory than its target gives one program."""

    def __init__(self, shared: int):
        super().__init__(f"needs {shared} bytes of shared memory")
        self.shared = shared  # bytes, as Triton allocated them


class StopOverLimit:
    """A Triton pipeline hook (``knobs.runtime.add_stages_inspection_hook``): after the
    LLVM-IR stage, where shared memory is allocated and known, stop a kernel that needs
    more than ``limit`` bytes instead of running PTX generation and ``ptxas`` on it."""

    def __init__(self, limit: int):
        self.limit = limit  # bytes

    def __call__(self, backend=None, stages=None, options=None, language=None, capability=None):
        if stages is None:  # triton.compile asks for the hook's part of the cache key
            key = f"level4-stop-over-{self.limit}"
            return key, hashlib.sha256(key.encode()).hexdigest()
        make_llir = stages["llir"]

        def make_llir_within_limit(src, metadata):
            llir = make_llir(src, metadata)
            if metadata["shared"] > self.limit:
                raise OverLimit(metadata["shared"])
            return llir

        stages["llir"] = make_llir_within_limit
        return None


def compile_one(job: Job) -> dict:
    """Compile ``job`` for its target (in a worker: ``TRITON_INTERPRET=0``).

    Returns the job's fields and ``status`` ("compiled", "over" the target's
    limit, or "error"), ``shared`` (bytes; None on error), ``seconds`` and
    ``error`` (the compiler's message, its last lines).
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = (TARGETS | FAMILY)[job.target]
    start = time.perf_counter()
    status, shared, error = "error", None, None
    triton.knobs.runtime.add_stages_inspection_hook = StopOverLimit(target.shared_limit)
    try:
        kernel, signature, constexprs, attrs, options = compile_inputs(job)
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(
            source, target=GPUTarget("cuda", target.arch, 32), options=options
        )
        status, shared = "compiled", compiled.metadata.shared
    except OverLimit as exc:
        status, shared = "over", exc.shared
    except Exception as exc:  # the compiler's own errors: report them, keep the worker
        lines = [line for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
        error = "\n".join(lines[-12:])
    finally:
        triton.knobs.runtime.add_stages_inspection_hook = None
    seconds = round(time.perf_counter() - start, 3)
    return job.to_dict() | {"status": status, "shared": shared, "seconds": seconds, "error": error}


def serve() -> int:
    """A worker's loop: one job as JSON per line on stdin, its result as one line on stdout."""
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else is printed (triton, ptxas) goes to stderr, not the results
    sys.stdout = sys.stderr
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("plan_only"):  # build the compile inputs, compile nothing
            job = Job.from_dict(request["job"])
            try:
                compile_inputs(job)
                answer = {"status": "planned", "error": None}
            except Exception as exc:  # an argument builder or a signature that breaks
                answer = {
                    "status": "error",
                    "error": f"{job.describe()}: {type(exc).__name__}: {exc}",
                }
            results.write(json.dumps(job.to_dict() | answer) + "\n")
        else:
            results.write(json.dumps(compile_one(Job.from_dict(request))) + "\n")
    return 0


# ---------------------------------------------------------------------------
# In the caller: workers, the prune, the verdict
# ---------------------------------------------------------------------------


class Worker:
    """One compile process: ``python -m ladder.check``, a job in, a result out."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.stderr = tempfile.TemporaryFile()  # read back only if the worker dies
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ladder.check"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            text=True,
        )

    def ask(self, request: dict, timeout_s: float) -> dict | str:
        """The worker's answer to one request, or why there is none (a string)."""
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        if not ready:
            self.close(kill=True)
            return f"no result after {timeout_s:.0f} s"
        line = self.process.stdout.readline()
        if not line:  # the worker died: its last words
            self.close(kill=True)
            self.stderr.seek(0)
            tail = self.stderr.read().decode(errors="replace").strip().splitlines()[-12:]
            return "the compile worker died:\n" + "\n".join(tail)
        return json.loads(line)

    def close(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        else:
            self.process.stdin.close()
        self.process.wait()


def worker_environment(cache_dir: str | None = None) -> dict[str, str]:
    """The workers' environment: the compiler chosen, this checkout importable, and
    optionally a Triton cache of their own (``cache_dir``; default: Triton's)."""
    root = str(Path(__file__).resolve().parents[2])  # the directory holding levels/
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    env = os.environ | {"TRITON_INTERPRET": "0", "PYTHONPATH": path}
    if cache_dir is not None:
        env["TRITON_CACHE_DIR"] = cache_dir
    return env


def compile_jobs(
    jobs: list[Job],
    *,
    workers: int | None = None,
    cache_dir: str | None = None,
    timeout_s: float = WORKER_TIMEOUT_S,
    plan_only: bool = False,
    on_result=None,
) -> list[dict]:
    """Results of ``jobs`` (``compile_one``'s dicts, in order), compiled by ``workers``
    processes at once (default: one per CPU). A compile that times out or kills its
    worker is an "error" result and the next job gets a fresh worker. ``plan_only``:
    each job's compile inputs are built, nothing compiled. ``on_result(result)`` is
    called as each result arrives (a progress bar)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = max(1, min(workers or cpus or 1, len(jobs)))
    env = worker_environment(cache_dir)
    pending = list(enumerate(jobs))
    results: list[dict | None] = [None] * len(jobs)
    lock = threading.Lock()

    def drain() -> None:
        worker = None
        while True:
            with lock:
                if not pending:
                    break
                index, job = pending.pop(0)
            worker = worker or Worker(env)
            request = {"plan_only": True, "job": job.to_dict()} if plan_only else job.to_dict()
            start = time.perf_counter()
            answer = worker.ask(request, timeout_s)
            if isinstance(answer, str):  # no result: the worker is gone
                worker = None
                answer = job.to_dict() | {
                    "status": "error",
                    "shared": None,
                    "seconds": round(time.perf_counter() - start, 3),
                    "error": answer,
                }
            results[index] = answer
            if on_result is not None:
                with lock:
                    on_result(answer)
        if worker is not None:
            worker.close()

    threads = [threading.Thread(target=drain) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def table_key(job: Job) -> tuple:
    """A tuned job's key in shared_memory.py (``tiles.shared_memory_need``'s arguments)."""
    return (KERNELS[job.kernel].function, job.target, job.dtype, job.block, job.tiles)


def pruned(job: Job) -> bool:
    """True if the autotuner's prune drops this candidate on its target (the table's limit)."""
    if not job.tuned:
        return False
    kernel = KERNELS[job.kernel].function
    kept = tiles.fitting_shapes(
        kernel, [job.tiles], target=job.target, dtype=job.dtype,
        head=tiles.table_head(job.block, job.block), limit=TARGETS[job.target].shared_limit,
    )  # fmt: skip
    return not kept


@dataclasses.dataclass
class Check:
    """The outcome of a run: every result, and what is wrong."""

    results: list[dict]  # compile_one's dicts; "pruned" for candidates the prune drops
    seconds: float  # wall time of the whole run
    measured: bool  # every candidate compiled, pruned ones too (--write-table)

    def failures(self) -> list[str]:
        """One message per failure (module docstring, "What is a failure")."""
        messages = []
        for r in self.results:
            job = Job.from_dict({k: r[k] for k in Job.__dataclass_fields__})
            limit = TARGETS[job.target].shared_limit
            if r["status"] == "error":
                messages.append(f"{job.describe()}: does not compile:\n{r['error']}")
            elif r["status"] == "over":  # (measured: a candidate over its limit is "pruned")
                if job.tuned:
                    need = tiles.shared_memory_need(*table_key(job))
                    why = (
                        f"shared_memory.py says {need}" if need else "it is not in shared_memory.py"
                    )
                    messages.append(
                        f"{job.describe()}: needs {r['shared']} bytes of shared memory, over "
                        f"{job.target}'s {limit}, and the prune keeps it ({why}): regenerate "
                        f"the table with --write-table"
                    )
                else:
                    messages.append(
                        f"{job.describe()}: a fixed launch that needs {r['shared']} bytes of "
                        f"shared memory, over {job.target}'s {limit}: change its tiles"
                    )
        if not self.measured:
            messages += self._stale()
        messages += self._uncovered()
        return messages

    def _stale(self) -> list[str]:
        """Measurements of kept candidates that differ from shared_memory.py."""
        largest: dict[tuple, int] = {}
        for r in self.results:
            if r["status"] == "compiled" and r["tuned"]:
                key = table_key(Job.from_dict({k: r[k] for k in Job.__dataclass_fields__}))
                largest[key] = max(largest.get(key, 0), r["shared"])
        messages = []
        for key, shared in largest.items():
            recorded = tiles.shared_memory_need(*key)
            if recorded != shared:
                messages.append(
                    f"{key}: compiles to {shared} bytes of shared memory, shared_memory.py says "
                    f"{recorded}: regenerate the table with --write-table"
                )
        return messages

    def _uncovered(self) -> list[str]:
        """(kernel, target, dtype, head block) with every candidate pruned or over."""
        kept: dict[tuple, bool] = defaultdict(bool)
        for r in self.results:
            if r["tuned"]:
                job = Job.from_dict({k: r[k] for k in Job.__dataclass_fields__})
                key = (job.kernel, job.target, job.dtype, job.block)
                kept[key] |= r["status"] == "compiled"
        return [
            f"{kernel} on {target} in {dtype} at head block {block}: every autotuning "
            f"candidate is pruned; add one that fits (levels/level4_triton_kernel/tiles.py)"
            for (kernel, target, dtype, block), any_kept in kept.items()
            if not any_kept
        ]


def check(
    jobs: list[Job],
    *,
    measure: bool = False,
    workers: int | None = None,
    cache_dir: str | None = None,
    timeout_s: float = WORKER_TIMEOUT_S,
    on_result=None,
) -> Check:
    """Compile ``jobs`` (the candidates the prune drops are not compiled, unless
    ``measure``: then everything is, for ``write_table``) and judge the results."""
    start = time.perf_counter()
    skipped = [] if measure else [job for job in jobs if pruned(job)]
    skip = set(skipped)
    results = compile_jobs(
        [job for job in jobs if job not in skip], workers=workers, cache_dir=cache_dir,
        timeout_s=timeout_s, on_result=on_result,
    )  # fmt: skip
    for job in skipped:
        need = tiles.shared_memory_need(*table_key(job))
        results.append(
            job.to_dict() | {"status": "pruned", "shared": need, "seconds": 0.0, "error": None}
        )
        if on_result is not None:
            on_result(results[-1])
    for r in results:  # a measured candidate over the limit is what the new table will prune
        if measure and r["tuned"] and r["status"] == "over":
            r["status"] = "pruned"
    return Check(results, round(time.perf_counter() - start, 1), measured=measure)


TABLE = Path(__file__).parents[2] / "levels" / "level4_triton_kernel" / "shared_memory.py"


def write_table(result: Check, path: Path = TABLE) -> int:
    """Rewrite shared_memory.py from a measured run: per tuned (kernel, target, dtype, head
    block, tiles), the largest need over the variants. Returns the number of entries."""
    largest: dict[tuple, int] = {}
    for r in result.results:
        if r["tuned"] and r["shared"] is not None:
            key = table_key(Job.from_dict({k: r[k] for k in Job.__dataclass_fields__}))
            largest[key] = max(largest.get(key, 0), r["shared"])
    lines = [
        '"""Shared memory each autotuning candidate needs, in bytes, measured by compiling it.',
        "",
        "Generated by ``ladder check --write-table``",
        "(ladder/check/check.py); do not edit. The largest need over the compile-time",
        "variants (a mask adds a pipelined tile); the prune in level 4's tiles.py compares it",
        "with the GPU's limit. Plain data: level 4 imports it, so it imports nothing.",
        '"""',
        "",
        f'TRITON_VERSION = "{triton.__version__}"',
        "# (kernel, target, dtype, head block, (BLOCK_M, BLOCK_N, num_warps, num_stages)) -> bytes",
        "SHARED_MEMORY: dict[tuple, int] = {",
        *(f"    {key!r}: {value}," for key, value in sorted(largest.items())),
        "}",
    ]
    path.write_text("\n".join(lines) + "\n")
    return len(largest)


# ---------------------------------------------------------------------------
# The command: ladder check
# ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """``ladder check``: compile the matrix, print per kernel and target the configurations
    kept and pruned with their shared memory; 0 if nothing failed, 1 otherwise.

    ``args``: ``targets``, ``dtypes``, ``kernels`` (lists or None: all), ``workers``
    (int or None), ``format`` ("table" or "json"), ``json`` (a Path or None),
    ``plan_only``, ``write_table``, ``cold`` (bools), ``timeout`` (seconds).
    """
    from ..console import make_console  # (the workers need no rich)
    from .report import print_check, progress

    jobs = plan(
        targets=args.targets or tuple(TARGETS),
        dtypes=args.dtypes or MATRIX_DTYPES,
        kernels=args.kernels,
    )
    console = make_console()
    if args.plan_only:
        results = compile_jobs(jobs, workers=args.workers, plan_only=True)
        failed = [r for r in results if r["status"] != "planned"]
        for r in failed:
            console.print(f"[red]{r.get('error')}[/red]", markup=True)
        console.print(
            f"{len(jobs) - len(failed)} of {len(jobs)} jobs planned: compile inputs built"
        )
        return 1 if failed else 0
    with tempfile.TemporaryDirectory(prefix="level4-triton-cache-") as cold_cache:
        with progress(console, len(jobs), enabled=args.format == "table") as advance:
            result = check(
                jobs, measure=args.write_table, workers=args.workers,
                cache_dir=cold_cache if args.cold else None, timeout_s=args.timeout,
                on_result=advance,
            )  # fmt: skip
    failures = result.failures()
    if args.write_table and not any(r["status"] == "error" for r in result.results):
        entries = write_table(result)
        console.print(f"shared_memory.py: {entries} measurements written")
    document = {"seconds": result.seconds, "results": result.results, "failures": failures}
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    if args.format == "json":
        print(json.dumps(document, indent=1))
    else:
        print_check(console, result, failures)
    return 1 if failures else 0
