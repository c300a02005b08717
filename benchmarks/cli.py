"""The ``ladder`` command: ``ladder bench`` here; other subcommands plug in lazily.

A subcommand provider is a module with ``add_parser(subparsers)`` that adds
its sub-parsers and gives each a handler with ``set_defaults(func=handler)``,
where ``handler(args)`` returns an exit code (or None for 0). Providers other
than this module are listed in ``PROVIDERS`` with the command names they add,
and imported only when one of their commands is asked for; a provider that is
not installed still shows in ``ladder --help`` and says so when called.
Adding a subcommand is one line in ``PROVIDERS``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Sequence

PROVIDERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    # (module, the commands it adds, one-line help shown before it is imported)
    ("lab.cli", ("train", "preflight"), "the training lab"),
    ("levels.show", ("show",), "show a level's code and docs"),
)


def _level_names(text: str) -> list[str]:
    """``--levels`` for argparse: ``levels.level_names``, its error as a usage message."""
    import levels

    try:
        return levels.level_names(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _int_list(text: str) -> list[int]:
    try:
        values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from exc
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError("sequence lengths must be positive integers")
    return sorted(values)


def free_cores(default: int) -> int:
    """Threads for torch on the CPU: the cores the other processes leave free (the 1-minute
    load average), at least 1, at most ``default``.

    On a busy machine every parallel region of a multi-threaded op waits until all of
    its threads get a core, which can make a small op a hundred times slower; one
    thread per free core avoids that.
    """
    cores = os.cpu_count() or 1
    return max(1, min(default, cores - round(os.getloadavg()[0])))


def add_bench_parser(subparsers) -> None:
    from .plan import SCENARIOS

    p = subparsers.add_parser(
        "bench",
        help="benchmark every available level (attention, decoder, generation, bucketing)",
        description=(
            "Sweep the levels over sequence length and print one table per scenario. "
            "Compare ratios within one run: absolute times drift on a shared machine."
        ),
    )
    p.add_argument("--quick", action="store_true", help="a few sizes only (under 90 s on 2 cores)")
    p.add_argument(
        "--levels", type=_level_names, default=None, help="comma-separated levels, e.g. 1,2,3"
    )
    p.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="scenario group to run (repeatable; default: all)",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument(
        "--dtype",
        default=None,
        choices=("float64", "float32", "float16", "bfloat16"),
        help="float32 on cpu, bfloat16 on cuda by default (level 0 always computes in float64)",
    )
    p.add_argument(
        "--seq-lens", type=_int_list, default=None, help="override the T sweep, e.g. 64,256"
    )
    p.add_argument(
        "--no-causal", dest="causal", action="store_false", help="full (non-causal) attention"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: the cores other processes leave free, at least 1)",
    )
    p.add_argument("--json", metavar="PATH", help="write the records as a JSON list")
    p.add_argument("--plot", metavar="PATH", help="write time and GFLOP/s against T as a PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--no-peers", action="store_true", help="on CUDA, leave out the SDPA backends as peers"
    )
    p.set_defaults(func=bench)


def bench(args: argparse.Namespace) -> int:
    """``ladder bench``: load levels, run the plan, print, and write JSON / PNG if asked."""
    if not args.device.startswith("cuda"):
        # Level 4's kernels can run on the CPU only under the Triton interpreter, which
        # must be switched on before the module defining them is imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    threads = torch.get_num_threads()
    try:
        return _bench(args)
    finally:
        torch.set_num_threads(threads)  # main() may be called in a longer-lived process


def _bench(args: argparse.Namespace) -> int:
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import backends as B
    from .machine import describe_machine
    from .plan import default_plan
    from .records import write_json
    from .report import make_console, print_report
    from .runner import case_count, run

    console = make_console()
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        console.print("[red]--device cuda: torch sees no CUDA device here[/red]")
        return 2
    if not device.startswith("cuda"):
        torch.set_num_threads(args.threads or free_cores(torch.get_num_threads()))
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    plan = default_plan(device, quick=args.quick, seq_lens=args.seq_lens, causal=args.causal)
    if args.scenario:
        plan = plan.only(args.scenario)
    backends, unavailable = B.load_backends(args.levels, device, dtype)
    if device.startswith("cuda") and not args.no_peers:
        backends += [B.sdpa_backend(which, device) for which in B.SDPA_BACKENDS]
    machine = describe_machine(device)
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if not device.startswith("cuda") and load >= 1.0:
        console.print(
            f"[yellow]load average {load:.1f} on {cores} cores before the run: other processes "
            f"compete for the CPU, so torch runs {torch.get_num_threads()} thread(s) (--threads "
            "to override). Compare ratios within this run, not absolute times.[/yellow]"
        )

    start = time.perf_counter()
    if args.no_progress:
        records = run(backends, plan, device=device, dtype=dtype, unavailable=unavailable)
    else:
        columns = (
            TextColumn("{task.description:<60}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
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
    console.print(f"wall time {elapsed:.1f} s")
    if args.json:
        write_json(records, args.json)
        console.print(f"records written to {args.json}")
    if args.plot:
        from .plot import plot

        plot(records, args.plot, title=f"{machine}; {records[0].date}")
        console.print(f"plot written to {args.plot}")
    return 0


def _missing(module: str, what: str, error: ImportError):
    def handler(args: argparse.Namespace) -> int:
        print(f"{what} is not installed ({module}: {error})", file=sys.stderr)
        return 1

    handler.takes_any_arguments = True  # whatever was meant for the missing command
    return handler


def _placeholder(subparsers, command: str, help: str) -> argparse.ArgumentParser:
    """A command listed in --help whose provider is not imported (or not installed)."""
    return subparsers.add_parser(command, help=help, add_help=False)


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The top-level parser. Only the provider of the requested command is imported."""
    parser = argparse.ArgumentParser(prog="ladder", description="The attention ladder.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_bench_parser(subparsers)
    requested = next((a for a in argv if not a.startswith("-")), None)
    for module, commands, help in PROVIDERS:
        if requested not in commands:
            for command in commands:
                _placeholder(subparsers, command, help)
            continue
        try:
            provider = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module.startswith(exc.name):
                raise  # the provider exists but something it imports is broken: say so
            for command in commands:
                _placeholder(subparsers, command, help).set_defaults(
                    func=_missing(module, help, exc)
                )
            continue
        provider.add_parser(subparsers)
    return parser


BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def limit_blas_threads(argv: Sequence[str]) -> None:
    """Size numpy's BLAS thread pool for ``ladder bench`` on the CPU, before numpy loads.

    A BLAS library reads its thread count once, when it is loaded, and a
    multi-threaded BLAS call on a busy CPU waits for all its threads just as
    torch does (``free_cores``). So the count (``--threads``, else the free cores)
    goes into the environment before anything imports numpy. A variable the user
    set is left alone; in a process where numpy is already loaded this does nothing.
    """
    if "numpy" in sys.modules or "bench" not in argv:
        return
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=None)
    pre.add_argument("--device", default="cpu")
    known, _ = pre.parse_known_args(argv)
    if known.device.startswith("cuda"):
        return
    threads = known.threads or free_cores(os.cpu_count() or 1)
    for name in BLAS_THREAD_VARIABLES:
        os.environ.setdefault(name, str(threads))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    limit_blas_threads(argv)
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    func = getattr(args, "func", None)
    if extra and not getattr(func, "takes_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if func is None:
        parser.print_help()
        return 0 if args.command is None else 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
