"""``ladder bench``: load the levels, check and time the plan, print the tables, write the files.

Every output path is checked before the first case runs, so a long run never
ends by failing to write its results. The records are written as each step of the
run ends (to ``--json``, else to the user's cache, ``bench/last.json``), so that
Ctrl-C keeps what was measured, and says where. A run shows its progress: a bar on a
terminal (the step, how many of how many, the time elapsed and left), a line per step
where the output goes to a file or a pipe.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

from loading.threads import cpu_threads, free_cores

from .cli import Interrupted, UsageError, check_device, check_output_path

LAST_RUN = "bench/last.json"  # in the user's cache: the records of a run without --json


def run(args: argparse.Namespace) -> int:
    from benchmarks.plot import SWEPT

    check_device(args.device)
    check_output_path(args.json, "--json")
    check_output_path(args.plot, "--plot")
    check_output_path(args.roofline, "--roofline")
    groups = args.scenario or []
    if args.roofline and groups and "real-model" not in groups:
        raise UsageError("--roofline draws the real-model decode; add --scenario real-model")
    swept_groups = {"attention", "attention-bwd", "decoder"}
    if args.plot and groups and not swept_groups & set(groups):
        raise UsageError(
            f"--plot draws the scenarios swept over T ({', '.join(SWEPT)}); "
            f"--scenario {' '.join(groups)} has none of them"
        )
    path = _records_path(args.json)
    cuda = args.device.startswith("cuda")
    threads = args.threads or free_cores(os.cpu_count() or 1)
    with contextlib.nullcontext() if cuda else cpu_threads(threads):
        return _run(args, path)


def _run(args: argparse.Namespace, path: Path) -> int:
    import torch

    from benchmarks import subjects as B
    from benchmarks.measure import describe_machine
    from benchmarks.plan import default_plan
    from benchmarks.records import write_json
    from benchmarks.report import make_console, print_report
    from benchmarks.runner import run, step_count

    console = make_console()
    device = args.device
    cuda = device.startswith("cuda")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    plan = default_plan(device, quick=args.quick, seq_lens=args.seq_lens, causal=args.causal)
    if args.scenario:
        plan = plan.only(args.scenario)
    backends, unavailable = B.load_subjects(args.levels, device, dtype)
    for folder in (
        args.rung or ()
    ):  # learners' rungs, beside the levels (one line if one fails to load)
        backends.append(B.rung_subject(folder, device, dtype))
    if not args.no_peers and plan.workloads.get("attention"):
        backends += B.sdpa_peers(device, dtype)
    if not args.no_peers and cuda and plan.workloads.get("decode"):
        peer = B.unsplit_decode_peer(device, dtype)
        if peer is not None:
            backends.append(peer)
    if not args.no_peers and (
        plan.workloads.get("transformers") or plan.workloads.get("real-model")
    ):
        peer = B.transformers_peer(device)
        if peer is None:
            unavailable["transformers"] = "not installed (pip install transformers)"
        else:
            backends.append(peer)
    compiled = _compiled_peer(args, backends, plan, device, dtype, console)
    if compiled is not None:
        backends.append(compiled)
    machine = describe_machine(device)
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if not cuda and load >= 1.0:
        console.print(
            f"load average {load:.1f} on {cores} cores before the run: other processes compete "
            f"for the CPU, so it runs {torch.get_num_threads()} thread(s) (--threads to "
            "override). Compare ratios within this run, not absolute times.",
            style="yellow",
            markup=False,
        )

    kept: list = []  # the records of the steps done, written after each one
    steps = _Steps(console, step_count(backends, plan), show=not args.no_progress)

    def done(made) -> None:
        kept.extend(made)
        write_json(kept, path)
        steps.finished(made)

    start = time.perf_counter()
    with steps:
        try:
            records = run(
                backends,
                plan,
                device=device,
                dtype=dtype,
                unavailable=unavailable,
                progress=steps.start,
                done=done,
            )
        except KeyboardInterrupt:
            raise Interrupted(
                f"interrupted in step {steps.count + 1} of {steps.total} ({steps.label.strip()})"
                f" after {time.perf_counter() - start:.0f} s; {len(kept)} record"
                f"{'' if len(kept) == 1 else 's'} of the steps done written to {path}"
            ) from None
    elapsed = time.perf_counter() - start
    write_json(records, path)  # first: a run of minutes is kept even if its report cannot print
    print_report(records, machine, console)
    console.print(f"wall time {elapsed:.1f} s", markup=False)
    console.print(f"records written to {path}", markup=False)
    if args.plot:
        from benchmarks.plot import plot

        plot(records, args.plot, title=f"{machine}; {records[0].date}")
        console.print(f"plot written to {args.plot}", markup=False)
    if args.roofline:
        from benchmarks.plot import roofline

        roofline(records, args.roofline, title=f"{machine}; {records[0].date}")
        console.print(f"roofline written to {args.roofline}", markup=False)
    return 0


def _compiled_peer(args, backends, plan, device: str, dtype: str, console):
    """Level 3 with its decode compiled, beside level 3 in the real model's decode: by
    default where level 3 runs and a C++ compiler is found (one line says why not)."""
    from benchmarks import subjects as B
    from levels.level3_sdpa_flash.compiled import compiler_missing

    if args.compile is False or not plan.workloads.get("real-model"):
        return None
    if args.compile is None and os.environ.get("LADDER_COMPILE") == "0":
        return None  # as ladder chat: the default made eager
    if not any(b.name == B.SDPA_LEVEL for b in backends):
        if args.compile:
            raise UsageError("--compile is level 3's: add level 3 to --levels")
        return None
    missing = None if device.startswith("cuda") else compiler_missing()
    if missing is not None:
        if args.compile:
            raise UsageError(f"--compile: {missing}")
        console.print(f"level3:compiled left out: {missing}", style="yellow", markup=False)
        return None
    return B.compiled_peer(device, dtype, quick=args.quick)


def _records_path(asked: Path | None) -> Path:
    """Where the run's records go: ``--json``, else ``bench/last.json`` in the user's cache
    (the previous run's, replaced)."""
    if asked is not None:
        return asked
    from levels.registry import cache_dir

    path = cache_dir() / LAST_RUN
    check_output_path(path, "the records' file")
    return path


class _Steps:
    """A run's progress, step by step (``benchmarks.runner.run``'s): rich's bar on a
    terminal, a line per step elsewhere, where a bar would print nothing (a log, a pipe),
    nothing at all when not ``show``."""

    def __init__(self, console, total: int, *, show: bool):
        self.console, self.total, self.count, self.label = console, total, 0, ""
        self.bar = None
        if show and console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            columns = (
                TextColumn("{task.description:<60}", markup=False),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
            )
            self.bar = Progress(*columns, console=console, transient=True)
            self.task = self.bar.add_task("benchmarking", total=total)
        self.lines = show and self.bar is None
        self.started = self.step_started = time.perf_counter()

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False

    def start(self, label: str) -> None:
        self.label, self.step_started = label, time.perf_counter()
        if self.bar is not None:
            self.bar.update(self.task, description=label)

    def finished(self, made: list) -> None:
        self.count += 1
        if self.bar is not None:
            self.bar.advance(self.task)
        if not self.lines:
            return
        now = time.perf_counter()
        elapsed = int(now - self.started)
        clock = f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}"
        self.console.print(
            f"[{self.count:>{len(str(self.total))}}/{self.total} {clock}] {self.label}: "
            f"{_outcome(made)} ({now - self.step_started:.1f} s)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _outcome(made: list) -> str:
    """A step's records in a few words: one case's time or status, else how many."""
    from benchmarks.records import fmt_time

    if not made:
        return "done"
    if len(made) > 1:
        return f"{len(made)} records"
    (record,) = made
    return fmt_time(record.median_s) if record.ok else record.status[:100]
