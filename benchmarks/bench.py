"""``ladder bench``: load the levels, check and time the plan, print the tables, write the files.

Every output path is checked before the first case runs, so a long run never
ends by failing to write its results.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

from .cli import UsageError, check_device, check_output_path


def free_cores(default: int) -> int:
    """CPU threads for the run: the cores the other processes leave free (the 1-minute
    load average), at least 1, at most ``default``.

    On a busy machine every parallel region of a multi-threaded op waits until all of
    its threads get a core, which can make a small op a hundred times slower; one
    thread per free core avoids that.
    """
    cores = os.cpu_count() or 1
    return max(1, min(default, cores - round(os.getloadavg()[0])))


@contextlib.contextmanager
def cpu_threads(n: int):
    """torch's intra-op threads and numpy's BLAS threads (``threadpoolctl``) set to ``n``
    for the run, and restored after it."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with threadpool_limits(limits=n, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(before)


def run(args: argparse.Namespace) -> int:
    from .plot import SWEPT

    check_device(args.device)
    check_output_path(args.json, "--json")
    check_output_path(args.plot, "--plot")
    groups = args.scenario or []
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

    from . import backends as B
    from .machine import describe_machine
    from .plan import default_plan
    from .records import write_json
    from .report import make_console, print_report
    from .runner import case_count, run

    console = make_console()
    device = args.device
    cuda = device.startswith("cuda")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    plan = default_plan(device, quick=args.quick, seq_lens=args.seq_lens, causal=args.causal)
    if args.scenario:
        plan = plan.only(args.scenario)
    backends, unavailable = B.load_backends(args.levels, device, dtype)
    if not args.no_peers and plan.workloads.get("attention"):
        backends += B.sdpa_peers(device, dtype)
    if not args.no_peers and cuda and plan.workloads.get("decode"):
        peer = B.unsplit_decode_peer(device, dtype)
        if peer is not None:
            backends.append(peer)
    if not args.no_peers and plan.workloads.get("transformers"):
        peer = B.transformers_peer(device)
        if peer is None:
            unavailable["transformers"] = "not installed (pip install transformers)"
        else:
            backends.append(peer)
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
    print_report(records, machine, console)
    console.print(f"wall time {elapsed:.1f} s", markup=False)
    if args.json:
        write_json(records, args.json)
        console.print(f"records written to {args.json}", markup=False)
    if args.plot:
        from .plot import plot

        plot(records, args.plot, title=f"{machine}; {records[0].date}")
        console.print(f"plot written to {args.plot}", markup=False)
    return 0
