"""``ladder bench``: load the levels, check and time the plan, print the tables, write the files.

Every output path is checked before the first case runs, so a long run never
ends by failing to write its results. The records are written as each step of the
run ends (to ``--json``, else to the user's cache, ``bench/last.json``), so that
Ctrl-C keeps what was measured, and says where. A run shows its progress: a bar on a
terminal (the step, how many of how many, the time elapsed and left, the bar filled by
each step's expected seconds), a line per step where the output goes to a file or a pipe;
and before a step that compiles level 3's decode step (or its check of guesses), a line
on stderr for each compile, with its expected time, as ``ladder chat`` says it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from rich.progress import ProgressColumn
from rich.text import Text

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
    from benchmarks.runner import run
    from benchmarks.runner import steps as steps_of

    console = make_console()
    device = args.device
    cuda = device.startswith("cuda")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    plan = default_plan(device, quick=args.quick, seq_lens=args.seq_lens, causal=args.causal)
    if args.scenario:
        plan = plan.only(args.scenario)
    backends, unavailable = B.load_subjects(args.levels, device, dtype)
    for folder in args.rung or ():  # learners' rungs, beside the levels
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
    planned = steps_of(backends, plan)
    scale = 1.0 if cuda else _scale()
    compiles = _Compiles(device, first=plan.step_seconds("compile") * scale)
    steps = _Steps(console, planned, compiles, show=not args.no_progress, scale=scale)

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
    """A run's progress, step by step (``benchmarks.runner.run``'s ``steps``): rich's bar on a
    terminal, a line per step elsewhere, where a bar would print nothing (a log, a pipe),
    nothing at all when not ``show``; and, before a step that compiles, a line on stderr for
    each compile, with its expected time, as ``ladder chat`` says it.

    The bar counts the work, not the steps: each step weighs the seconds it should take (the
    plan's figure, scaled to the machine's load now, ``_scale``, and each compile it makes,
    the first time one is needed: ``_Compiles``). What is left is those seconds scaled by
    how this run has kept to them so far (``pace``),
    and of the step under way, ``max(x - e / 2, e / 2)`` after ``e`` seconds of an expected
    ``x``: half of what would be left if it took twice as long as expected, or half of
    "as long again" once it runs over. A step that takes up to twice its expected time (at
    the run's pace) never leaves the eta shown overrun by more than twice."""

    def __init__(
        self, console, planned: list, compiles: _Compiles, *, show: bool, scale: float = 1.0
    ):
        self.console, self.planned, self.compiles = console, planned, compiles
        self.total, self.count, self.label, self.scale = len(planned), 0, "", scale
        self.expected = compiles.weigh(planned, scale)  # seconds, a step each
        self.took: list[float] = []  # seconds, each step done
        self.bar = None
        if show and console.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (
                TextColumn("{task.description:<60}", markup=False),
                BarColumn(),
                TextColumn("{task.fields[count]}"),
                TimeElapsedColumn(),
                _EtaColumn(self),
            )
            self.bar = Progress(*columns, console=console, transient=True)
            self.task = self.bar.add_task(
                "benchmarking", total=sum(self.expected), count=self._count()
            )
        self.lines = show and self.bar is None
        self.started = self.step_started = time.perf_counter()

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
        self.started = self.step_started = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False

    def _count(self) -> str:
        return f"{self.count}/{self.total}"

    def start(self, step) -> None:
        for line in self.compiles.announce(step):
            print(line, file=sys.stderr, flush=True)
        # Weighed again now: a compile of the run so far may have left a note (its time).
        self.expected[self.count] = self.compiles.weigh([step], self.scale)[0]
        self.label, self.step_started = step.label, time.perf_counter()
        if self.bar is not None:
            self.bar.update(self.task, description=step.label, total=sum(self.expected))

    def finished(self, made: list) -> None:
        now = time.perf_counter()
        self.took.append(now - self.step_started)
        self.count += 1
        if self.bar is not None:
            done = sum(self.expected[: self.count])
            self.bar.update(self.task, completed=done, count=self._count())
        if not self.lines:
            return
        self.console.print(
            f"[{self.count:>{len(str(self.total))}}/{self.total} {_clock(now - self.started)}] "
            f"{self.label}: {_outcome(made)} ({now - self.step_started:.1f} s)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    def pace(self) -> float:
        """This run's seconds over the plan's, over the steps done (1 until they weigh
        ``PACE_AFTER_S``), within ``PACE_RANGE``."""
        planned = sum(self.expected[: len(self.took)])
        if planned < PACE_AFTER_S:
            return 1.0
        low, high = PACE_RANGE
        return min(max(sum(self.took) / planned, low), high)

    def eta(self, now: float | None = None) -> float:
        """Seconds left, as the class says."""
        now = time.perf_counter() if now is None else now
        if self.count >= self.total:
            return 0.0
        pace, elapsed = self.pace(), now - self.step_started
        current = max(pace * self.expected[self.count] - elapsed / 2, elapsed / 2)
        return current + pace * sum(self.expected[self.count + 1 :])


PACE_AFTER_S = 10.0  # planned seconds done before the run's pace is read from them
PACE_RANGE = (0.5, 3.0)  # how far the pace may move the plan's seconds, either way


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class _EtaColumn(ProgressColumn):
    """The eta of a ``_Steps``, read again at every refresh (rich's own moves only when a
    step ends, from the steps' count)."""

    def __init__(self, steps: _Steps):
        super().__init__()
        self.steps = steps

    def render(self, task) -> Text:
        return Text(f"eta {_clock(self.steps.eta())}", style="progress.remaining")


class _Compiles:
    """The compiled passes a run's steps need (``benchmarks.real_model.Compile``), looked up
    in the user's cache as ``ladder chat`` looks it up (``loading.compiles``): none where nothing
    compiles (a GPU, no C++ compiler, the model not pulled). A compile takes as long as
    this model's last one here (its note), else ``first`` seconds."""

    def __init__(self, device: str, first: float):
        from benchmarks.real_model import MODEL, _file
        from levels.level3_sdpa_flash.compiled import compiler_missing

        cpu = not device.startswith("cuda")
        self.on = cpu and compiler_missing() is None and _file() is not None
        self.model_name, self.first = MODEL, first
        self._models: dict = {}

    def _model(self, compile):
        if compile not in self._models:
            self._models[compile] = compile.key_of()
        return self._models[compile]

    def missing(self, compile) -> bool:
        from loading import compiles as decode_step

        path = decode_step.package(self._model(compile), compile.threads, compile.tokens)
        return self.on and not path.is_file()

    def weigh(self, planned: list, scale: float = 1.0) -> list[float]:
        """Each step's seconds: the plan's times ``scale``, and each compile the cache lacks,
        at the first step that needs it."""
        from loading import compiles as decode_step

        weights, counted = [], set()
        for step in planned:
            seconds = step.seconds * scale
            for c in step.compiles:
                if c not in counted and self.missing(c):
                    counted.add(c)
                    model = self._model(c)
                    seconds += decode_step.expected_seconds(
                        self.model_name, model, c.threads, c.tokens, self.first
                    )
            weights.append(seconds)
        return weights

    def announce(self, step) -> list[str]:
        """The lines before ``step``: one per compile it will make."""
        from loading import compiles as decode_step

        return [
            decode_step.announcement(
                self.model_name, self._model(c), "float32", c.threads, c.tokens, self.first
            )
            for c in step.compiles
            if self.missing(c)
        ]


def _scale() -> float:
    """The plans' seconds on this machine now: as the share of a core a one-thread step gets
    now over the share it had when they were measured (``loading.threads.at_this_load``)."""
    from loading.threads import at_this_load

    return at_this_load(1.0)


def _outcome(made: list) -> str:
    """A step's records in a few words: one case's time or status, else how many."""
    from benchmarks.records import fmt_time

    if not made:
        return "done"
    if len(made) > 1:
        return f"{len(made)} records"
    (record,) = made
    return fmt_time(record.median_s) if record.ok else record.status[:100]
