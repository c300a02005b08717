"""``ladder bench``: load the levels, check and time the plan, print the tables, write the files.

Every output path is checked before the first case runs, so a long run never
ends by failing to write its results.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

from benchmarks.measure import cpu_threads, free_cores

from .cli import UsageError, check_device, check_output_path


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
    cuda = args.device.startswith("cuda")
    threads = args.threads or free_cores(os.cpu_count() or 1)
    with contextlib.nullcontext() if cuda else cpu_threads(threads):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import torch
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from benchmarks import subjects as B
    from benchmarks.measure import describe_machine
    from benchmarks.plan import default_plan
    from benchmarks.records import write_json
    from benchmarks.report import make_console, print_report
    from benchmarks.runner import case_count, run

    console = make_console()
    device = args.device
    cuda = device.startswith("cuda")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    plan = default_plan(device, quick=args.quick, seq_lens=args.seq_lens, causal=args.causal)
    if args.scenario:
        plan = plan.only(args.scenario)
    backends, unavailable = B.load_subjects(args.levels, device, dtype)
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

    start = time.perf_counter()
    if args.no_progress:
        records = run(backends, plan, device=device, dtype=dtype, unavailable=unavailable)
    else:
        columns = (
            TextColumn("{task.description:<60}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("benchmarking", total=case_count(backends, plan) + 1)
            steps = iter(range(10**9))

            def progress(label: str) -> None:
                if next(steps):  # the first call starts the bar; later ones finish a case
                    bar.advance(task)
                bar.update(task, description=label)

            records = run(
                backends,
                plan,
                device=device,
                dtype=dtype,
                unavailable=unavailable,
                progress=progress,
            )
    elapsed = time.perf_counter() - start
    if args.json:  # first: a run of minutes is kept even if its report cannot be printed
        write_json(records, args.json)
    print_report(records, machine, console)
    console.print(f"wall time {elapsed:.1f} s", markup=False)
    if args.json:
        console.print(f"records written to {args.json}", markup=False)
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
