"""Command line for the training lab: ``ladder train`` and ``ladder preflight``.

The ``ladder`` console script (benchmarks/cli.py) calls :func:`add_parser`
with its subparsers; this module owns only these two commands::

    ladder train {seq2seq,decoder-only} --level L [--task copy|reverse] [--steps N] [--quick]
                 [--checkpoint PATH] [--resume] [--json PATH] [--plot PATH] [--seed S]
    ladder preflight {seq2seq,decoder-only} --level L [--task copy|reverse] [--seed S]

``--level`` takes a full name (``level2_torch_manual``), ``level2`` or ``2``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

KINDS = {"seq2seq": "seq2seq", "decoder-only": "decoder_only"}


def resolve_level(name: str):
    """Load a level from ``level2_torch_manual``, ``level2`` or ``2``."""
    import levels

    try:
        return levels.load(levels.level_name(name))
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=sorted(KINDS), help="model kind")
    p.add_argument(
        "--level", default="level2_torch_manual", help="level name or number (default: 2)"
    )
    p.add_argument(
        "--task",
        default=None,
        help="seq2seq: copy or reverse (default reverse); decoder-only: cycle",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds parameters, data and batch order")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: these matrices are too small to split across "
        "cores, and threads that spin-wait for each other stall badly on a shared machine)",
    )
    p.add_argument("--device", default=None, help="torch device (default cpu)")


def add_parser(subparsers: Any) -> None:
    """Register ``train`` and ``preflight`` on an ``argparse`` subparsers object."""
    t = subparsers.add_parser("train", help="train a model on a generated task and evaluate it")
    _common(t)
    t.add_argument("--steps", type=int, default=None, help="optimisation steps (default per task)")
    t.add_argument("--quick", action="store_true", help="a tiny smoke run (seconds)")
    t.add_argument(
        "--checkpoint",
        default=None,
        help="save the state here (atomically) every 200 steps and at the end",
    )
    t.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    t.add_argument("--json", default=None, help="write the metrics here")
    t.add_argument("--plot", default=None, help="write the loss curve (PNG) here")
    t.set_defaults(func=run_train)

    p = subparsers.add_parser("preflight", help="check the four properties on an untrained model")
    _common(p)
    p.set_defaults(func=run_preflight_command)


def _setup(args: argparse.Namespace):
    import torch

    torch.set_num_threads(args.threads)
    return resolve_level(args.level)


def _require_trainable(level, kind: str) -> None:
    from .backend import check_trainable

    try:
        check_trainable(level, kind)
    except ValueError as exc:  # level 0: no backward pass
        raise SystemExit(str(exc)) from exc


def run_preflight_command(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .preflight import run_preflight
    from .train import build_backend, default_spec

    level = _setup(args)
    try:
        spec = default_spec(KINDS[args.kind], args.task, seed=args.seed)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    _require_trainable(level, spec.kind)
    backend = build_backend(spec, level, device=args.device)
    checks = run_preflight(backend, spec.task, seed=args.seed)
    console = Console()
    for c in checks:
        mark = "[green]pass[/]" if c.ok else "[red]FAIL[/]"
        console.print(f"{mark}  {c.name:28s} {'' if c.ok else c.detail}")
    return 0 if all(c.ok for c in checks) else 1


def run_train(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .checkpoint import load_checkpoint
    from .preflight import PreflightError
    from .train import default_spec, plot_losses, spec_from_dict, train, write_json

    console = Console()
    level = _setup(args)
    if args.resume:
        if args.checkpoint is None:
            raise SystemExit("--resume needs --checkpoint PATH")
        if args.steps is not None or args.quick:
            raise SystemExit("--resume continues the saved run as planned: drop --steps/--quick")
        spec = spec_from_dict(load_checkpoint(args.checkpoint)["spec"])
    else:
        try:
            spec = default_spec(
                KINDS[args.kind], args.task, quick=args.quick, steps=args.steps, seed=args.seed
            )
        except ValueError as exc:  # a task that does not fit the kind
            raise SystemExit(str(exc)) from exc
    _require_trainable(level, spec.kind)
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    with bar:
        job = bar.add_task(
            f"{level.__name__.rsplit('.', 1)[-1]} {spec.kind} {spec.task.name}",
            total=spec.settings.steps,
            loss=float("nan"),
            tps=0.0,
        )
        started = time.perf_counter()
        try:
            result = train(
                spec,
                level,
                checkpoint=args.checkpoint,
                resume=args.resume,
                device=args.device,
                progress=lambda step, loss, tps: bar.update(
                    job, completed=step, loss=loss, tps=tps
                ),
            )
        except PreflightError as exc:
            console.print(f"[red]{exc}[/]")
            console.print("training not started: fix the failing properties first")
            return 2
    console.print(
        f"held-out: loss {result['heldout_loss']:.4f}  token acc {result['token_accuracy']:.4f}  "
        f"teacher-forced exact {result['teacher_forced_exact']:.4f}  "
        f"greedy exact {result['greedy_exact']:.4f}  (baseline acc {result['baseline_accuracy']:.4f})  "
        f"{time.perf_counter() - started:.1f} s"
    )
    if args.json:
        write_json(args.json, result)
    if args.plot:
        plot_losses(args.plot, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m lab.cli train ...``); ``ladder`` is the usual way in."""
    parser = argparse.ArgumentParser(prog="python -m lab.cli")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
