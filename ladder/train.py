"""``ladder train`` and ``ladder preflight``: the lab's models (``ladder generate`` runs them too).

The arguments are declared in ``ladder/cli.py`` (the one parser); these
functions run them over the training lab (``lab``). Everything a run needs is checked before
the first step: the level loads and has gradients, the device exists, the
task fits the kind, every output path is writable, and a checkpoint to resume
is verified and belongs to the run asked for.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from .cli import (
    KINDS,
    RANK_NOTE,
    Interrupted,
    UsageError,
    check_device,
    check_output_path,
    kind_argument,
    say_interrupted,
)
from .console import make_console
from .interrupts import CtrlC

INTERPRETER_WARNING_S = 60.0  # warn before a run predicted to take longer than this


def _level(args: argparse.Namespace):
    """The level of ``--level``, with torch's threads set; refused if it cannot train."""
    import torch

    import levels
    from lab.backend import check_trainable

    check_device(args.device)
    torch.set_num_threads(args.threads)
    level = levels.load(args.level)  # LevelUnavailable (one line) if it cannot load here
    try:
        check_trainable(level, KINDS[args.kind])
    except ValueError as exc:  # level 0: no backward pass
        raise UsageError(str(exc)) from None
    return level


def _spec(args: argparse.Namespace, *, quick: bool = False, steps: int | None = None):
    from lab.train import default_spec

    try:
        seed = 0 if args.seed is None else args.seed
        return default_spec(KINDS[args.kind], args.task, quick=quick, steps=steps, seed=seed)
    except ValueError as exc:  # a task that does not fit the kind
        raise UsageError(str(exc)) from None


def preflight(args: argparse.Namespace) -> int:
    from lab.preflight import run_preflight
    from lab.train import build_backend

    level = _level(args)
    spec = _spec(args)
    backend = build_backend(spec, level, device=args.device)
    name = level.__name__.rsplit(".", 1)[-1]
    print(
        f"preflight of an untrained {spec.kind} model ({_model_line(spec)}) at {name}, "
        f"task {spec.task.name}, seed {spec.settings.seed}"
    )
    checks = run_preflight(backend, spec.task, seed=spec.settings.seed)
    for c in checks:
        mark = "pass" if c.ok else "FAIL"
        print(f"{mark}  {c.name:28s} {'' if c.ok else c.detail}".rstrip())
    return 0 if all(c.ok for c in checks) else 1


def _model_line(spec) -> str:
    c = spec.config
    return f"D={c.d_model}, {c.n_layers} layer(s), {c.n_heads} heads, V={c.vocab_size}"


def _resumed_spec(args: argparse.Namespace):
    """The spec saved in ``--checkpoint``, refused if it is not the run the command line names."""
    from lab.checkpoint import load_checkpoint
    from lab.train import spec_from_dict

    if args.checkpoint is None:
        raise UsageError("--resume needs --checkpoint PATH")
    if args.steps is not None or args.quick:
        raise UsageError("--resume continues the saved run as planned: drop --steps/--quick")
    saved = load_checkpoint(args.checkpoint)  # CheckpointError (one line) if unusable
    spec = spec_from_dict(saved["spec"])
    asked = {"kind": args.kind, "task": args.task, "seed": args.seed}
    there = {"kind": kind_argument(spec.kind), "task": spec.task.name, "seed": spec.settings.seed}
    for key, value in asked.items():
        if value is not None and value != there[key]:
            raise UsageError(
                f"{args.checkpoint} holds a run with {key} {there[key]!r}, the command line asks "
                f"for {value!r}; "
                + (f"give kind {there[key]}" if key == "kind" else f"leave --{key} out")
                + " or another --checkpoint"
            )
    return spec, int(saved["step"])


def _estimate(spec, level, device) -> float:
    """Seconds a run will take, from one timed training step on a throwaway model (for
    levels that run interpreted, where a step takes seconds)."""
    from lab.data import BatchStream
    from lab.train import build_backend

    backend = build_backend(spec, level, device=device)
    stream = BatchStream(
        spec.task.sample(spec.settings.batch_size, spec.settings.seed, "train"),
        spec.settings.batch_size,
        seed=spec.settings.seed,
        pad_id=spec.config.pad_id,
    )
    start = time.perf_counter()
    backend.loss_and_grads(stream.batch_at(0))
    backend.step(0.0)
    step_s = time.perf_counter() - start
    # Preflight and evaluation cost about as much as a dozen training steps (measured at
    # level 4 under the interpreter: 8 steps of --quick and the rest, 43 s in all).
    return step_s * (spec.settings.steps + 12)


def train(args: argparse.Namespace) -> int:
    from lab import distributed

    world = distributed.from_environment()
    if args.fsdp and args.nproc == 1 and world is None:
        raise UsageError("--fsdp shards across processes: give --nproc 2 or more")
    for flag, path in (
        ("--checkpoint", args.checkpoint),
        ("--json", args.json),
        ("--plot", args.plot),
    ):
        check_output_path(path, flag)
    level = _level(args)
    if args.nproc > 1 and world is None:
        return _launch_ranks(args, level)
    if world is not None:
        distributed.start(world, args.device)
        try:
            status = _train(args, level, world)
        except (Interrupted, KeyboardInterrupt) as exc:
            say_interrupted("ladder train", exc)  # to the launcher, which says it once
            status = 130
        finally:
            distributed.stop()
        distributed.leave(status)  # past gloo's teardown at exit, which can abort a rank
    return _train(args, level, None)


def _launch_ranks(args: argparse.Namespace, level) -> int:
    """``--nproc N``: check what can be checked here, then run this command in N processes."""
    from lab import distributed
    from lab.backend import check_trainable

    try:
        check_trainable(level, KINDS[args.kind], parallel=True)
    except ValueError as exc:
        raise UsageError(f"--nproc: {exc}") from None
    if args.device.startswith("cuda"):
        import torch

        if torch.cuda.device_count() < args.nproc:
            raise UsageError(
                f"--nproc {args.nproc} on CUDA needs a GPU per process; torch sees "
                f"{torch.cuda.device_count()}"
            )
    spec = (
        _resumed_spec(args)[0] if args.resume else _spec(args, quick=args.quick, steps=args.steps)
    )
    try:
        distributed.check_batch_size(spec.settings.batch_size, distributed.World(0, args.nproc))
    except ValueError as exc:
        raise UsageError(f"--nproc: {exc}") from None
    argv = _argv_without_nproc(sys.argv[1:])
    fd, name = tempfile.mkstemp(prefix="ladder-rank-note-")
    os.close(fd)
    note = Path(name)  # rank 0's line if it is interrupted: where the run stopped
    try:
        status, interrupted = distributed.launch("ladder", argv, args.nproc, {RANK_NOTE: str(note)})
        said = note.read_text().strip()
    finally:
        note.unlink(missing_ok=True)
    if interrupted or status in (130, -signal.SIGINT):
        raise Interrupted(said or f"interrupted; {args.nproc} processes stopped")
    if status != 0:
        raise RuntimeError(f"a training process failed (torchrun exit status {status}); see above")
    return 0


def _argv_without_nproc(argv: list[str]) -> list[str]:
    """The command line each rank runs: this one without ``--nproc N`` (or ``--nproc=N``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def _train(args: argparse.Namespace, level, world) -> int:
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from lab.preflight import PreflightError
    from lab.train import TrainingInterrupted, plot_losses, write_json
    from lab.train import train as run_training

    main = world is None or world.main
    console = make_console()
    start_step = 0
    if args.resume:
        spec, start_step = _resumed_spec(args)
        if start_step >= spec.settings.steps:
            print(
                f"{args.checkpoint}: the run is finished ({start_step} of {spec.settings.steps} "
                "steps); nothing to resume"
            )
            return 0
    else:
        spec = _spec(args, quick=args.quick, steps=args.steps)
        if level.FACTS.interpreted and args.quick:
            spec = _interpreter_quick(spec)
    name = level.__name__.rsplit(".", 1)[-1]
    if level.FACTS.interpreted and main:
        seconds = _estimate(spec, level, args.device)
        if seconds > INTERPRETER_WARNING_S:
            print(
                f"warning: {name} runs its kernels in Triton's interpreter here (no GPU); this "
                f"run should take about {seconds / 60:.0f} minutes (level 2 or 3 trains the same "
                "model in seconds)",
                file=sys.stderr,
            )
    bar = Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TextColumn("{task.fields[tps]:,.0f} tok/s"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    resuming = f", resuming at step {start_step}" if start_step else ""
    ranks = f" on {world.size} processes ({'FSDP2' if args.fsdp else 'DDP'})" if world else ""
    if main:
        print(
            f"training {name} {spec.kind} {spec.task.name}: {spec.settings.steps} steps"
            f"{ranks}{resuming}",
            flush=True,
        )
    started = time.perf_counter()
    stop = CtrlC()
    with stop, bar if main else contextlib.nullcontext():
        job = bar.add_task(
            f"{name} {spec.kind} {spec.task.name}",
            total=spec.settings.steps,
            completed=start_step,
            loss=float("nan"),
            tps=0.0,
        )

        def report(step: int, loss: float, tps: float) -> None:
            stop.check()
            bar.update(job, completed=step, loss=loss, tps=tps)

        try:
            result = run_training(
                spec,
                level,
                checkpoint=args.checkpoint,
                resume=args.resume,
                device=args.device,
                progress=report,
                world=world,
                fsdp=args.fsdp,
            )
        except PreflightError as exc:
            raise UsageError(
                f"{exc}; training not started: fix the failing properties first"
            ) from None
        except TrainingInterrupted as exc:
            raise Interrupted(str(exc)) from None
    if not main:
        return 0  # rank 0 reports and writes the outputs
    print(
        f"held-out: loss {result['heldout_loss']:.4f}  token acc {result['token_accuracy']:.4f}  "
        f"teacher-forced exact {result['teacher_forced_exact']:.4f}  "
        f"greedy exact {result['greedy_exact']:.4f}  (baseline acc {result['baseline_accuracy']:.4f})  "
        f"{time.perf_counter() - started:.1f} s"
    )
    if args.json:
        write_json(args.json, result)
    if args.plot:
        plot_losses(args.plot, result)
    print(_saved(args, result["steps"]))
    return 0


def _saved(args: argparse.Namespace, step: int) -> str:
    """The line that ends a training run: each file it wrote, and what each one is."""
    files = [
        (args.checkpoint, f"the checkpoint, step {step}"),
        (args.json, "the metrics"),
        (args.plot, "the loss curve"),
    ]
    written = [f"{path} ({what})" for path, what in files if path is not None]
    if not written:
        return "nothing saved (--checkpoint PATH keeps the trained model)"
    return "saved: " + ", ".join(written)


def _interpreter_quick(spec):
    """``--quick`` at a level that runs interpreted: fewer steps and a smaller held-out set,
    so the smoke run stays a smoke run (the interpreter takes seconds per step)."""
    import dataclasses

    settings = dataclasses.replace(
        spec.settings, steps=8, batch_size=8, n_train=256, n_heldout=8, eval_batch_size=8
    )
    return dataclasses.replace(spec, settings=settings)
