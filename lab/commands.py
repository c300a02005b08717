"""The training lab's commands: ``ladder train``, ``ladder preflight`` and ``ladder generate``.

The arguments are declared in ``benchmarks/cli.py`` (the one ``ladder``
parser); these functions run them. Everything a run needs is checked before
the first step: the level loads and has gradients, the device exists, the
task fits the kind, every output path is writable, and a checkpoint to resume
is verified and belongs to the run asked for.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from pathlib import Path

from benchmarks.cli import Interrupted, UsageError, check_device, check_output_path
from benchmarks.report import make_console

KINDS = {"seq2seq": "seq2seq", "decoder-only": "decoder_only"}
INTERPRETER_WARNING_S = 60.0  # warn before a run predicted to take longer than this


def _level(args: argparse.Namespace):
    """The level of ``--level``, with torch's threads set; refused if it cannot train."""
    import torch

    import levels

    from .backend import check_trainable

    check_device(args.device)
    torch.set_num_threads(args.threads)
    level = levels.load(args.level)  # LevelUnavailable (one line) if it cannot load here
    try:
        check_trainable(level, KINDS[args.kind])
    except ValueError as exc:  # level 0: no backward pass
        raise UsageError(str(exc)) from None
    return level


def _spec(args: argparse.Namespace, *, quick: bool = False, steps: int | None = None):
    from .train import default_spec

    try:
        seed = 0 if args.seed is None else args.seed
        return default_spec(KINDS[args.kind], args.task, quick=quick, steps=steps, seed=seed)
    except ValueError as exc:  # a task that does not fit the kind
        raise UsageError(str(exc)) from None


def preflight(args: argparse.Namespace) -> int:
    from .preflight import run_preflight
    from .train import build_backend

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
    from .checkpoint import load_checkpoint
    from .train import spec_from_dict

    if args.checkpoint is None:
        raise UsageError("--resume needs --checkpoint PATH")
    if args.steps is not None or args.quick:
        raise UsageError("--resume continues the saved run as planned: drop --steps/--quick")
    saved = load_checkpoint(args.checkpoint)  # CheckpointError (one line) if unusable
    spec = spec_from_dict(saved["spec"])
    asked = {"kind": args.kind, "task": args.task, "seed": args.seed}
    there = {"kind": _kind_name(spec.kind), "task": spec.task.name, "seed": spec.settings.seed}
    for key, value in asked.items():
        if value is not None and value != there[key]:
            raise UsageError(
                f"{args.checkpoint} holds a run with {key} {there[key]!r}, the command line asks "
                f"for {value!r}; "
                + (f"give kind {there[key]}" if key == "kind" else f"leave --{key} out")
                + " or another --checkpoint"
            )
    return spec, int(saved["step"])


def _kind_name(kind: str) -> str:
    """``decoder_only`` as the command line spells it, ``decoder-only``."""
    return next(name for name, value in KINDS.items() if value == kind)


def _estimate(spec, level, device) -> float:
    """Seconds a run will take, from one timed training step on a throwaway model (for
    levels that run interpreted, where a step takes seconds)."""
    from .data import BatchStream
    from .train import build_backend

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
    from . import distributed

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
        finally:
            distributed.stop()
        distributed.leave(status)  # past gloo's teardown at exit, which can abort a rank
    return _train(args, level, None)


def _launch_ranks(args: argparse.Namespace, level) -> int:
    """``--nproc N``: check what can be checked here, then run this command in N processes."""
    from . import distributed
    from .backend import check_trainable

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
    status = distributed.launch(argv, args.nproc)
    if status in (130, -signal.SIGINT):
        raise Interrupted(f"interrupted; {args.nproc} processes stopped")
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

    from .preflight import PreflightError
    from .train import TrainingInterrupted, plot_losses, write_json
    from .train import train as run_training

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
        if level.INTERPRETED and args.quick:
            spec = _interpreter_quick(spec)
    name = level.__name__.rsplit(".", 1)[-1]
    if level.INTERPRETED and main:
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
    with bar if main else contextlib.nullcontext():
        job = bar.add_task(
            f"{name} {spec.kind} {spec.task.name}",
            total=spec.settings.steps,
            completed=start_step,
            loss=float("nan"),
            tps=0.0,
        )
        try:
            result = run_training(
                spec,
                level,
                checkpoint=args.checkpoint,
                resume=args.resume,
                device=args.device,
                progress=lambda step, loss, tps: bar.update(
                    job, completed=step, loss=loss, tps=tps
                ),
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
    return 0


def _interpreter_quick(spec):
    """``--quick`` at a level that runs interpreted: fewer steps and a smaller held-out set,
    so the smoke run stays a smoke run (the interpreter takes seconds per step)."""
    import dataclasses

    settings = dataclasses.replace(
        spec.settings, steps=8, batch_size=8, n_train=256, n_heldout=8, eval_batch_size=8
    )
    return dataclasses.replace(spec, settings=settings)


def generate(args: argparse.Namespace) -> int:
    check_device(args.device)
    if args.hf is not None:
        return _generate_text(args)
    from .inference import continue_symbols, load_model

    for flag, value in (("--prompt", args.prompt), ("--dtype", args.dtype)):
        if value is not None:
            raise UsageError(f"{flag} goes with --hf; a trained checkpoint takes --input")
    if args.input is None:
        raise UsageError("--checkpoint needs --input, the content symbols to continue")
    try:
        symbols = [int(s) for s in args.input.replace(",", " ").split()]
    except ValueError:
        raise UsageError(
            f"--input must be integers separated by spaces, got {args.input!r}"
        ) from None
    model, spec = load_model(Path(args.checkpoint), args.level, device=args.device)
    try:
        out = continue_symbols(model, spec, symbols, max_new_tokens=args.max_new_tokens)
    except ValueError as exc:
        raise UsageError(f"--input: {exc}") from None
    print(
        f"{spec.kind} {spec.task.name}: {' '.join(map(str, symbols))} -> {' '.join(map(str, out))}"
    )
    return 0


HF_NEW_TOKENS = 32  # --max-new-tokens when a Hugging Face model is given none


def _generate_text(args: argparse.Namespace) -> int:
    """``ladder generate --hf PATH --prompt TEXT``: greedy text from a Hugging Face model."""
    import numpy as np

    import levels
    from levels import hf

    if args.input is not None:
        raise UsageError("--input goes with --checkpoint; a Hugging Face model takes --prompt")
    if args.prompt is None:
        raise UsageError("--hf needs --prompt, the text to continue")
    if not args.hf.is_dir():
        raise UsageError(f"--hf {args.hf}: not a directory")
    level = levels.load(args.level)
    dtype = args.dtype or ("float32" if "float32" in level.DTYPES else level.DTYPES[0])
    if dtype not in level.DTYPES:
        raise UsageError(f"--dtype {dtype}: {args.level} computes in {', '.join(level.DTYPES)}")
    tokenizer = hf.load_tokenizer(args.hf)
    prompt = tokenizer.encode(args.prompt).ids
    if not prompt:
        raise UsageError(f"--prompt {args.prompt!r} encodes to no tokens")
    new = HF_NEW_TOKENS if args.max_new_tokens is None else args.max_new_tokens
    # The model is built for this prompt and continuation only: the KV cache and the
    # RoPE tables are as long as they need to be, not the checkpoint's whole context.
    config = hf.load_config(args.hf)
    if len(prompt) + new > config.max_seq_len:
        raise UsageError(
            f"{len(prompt)} prompt tokens + --max-new-tokens {new} exceed the model's "
            f"context of {config.max_seq_len}"
        )
    config, params = hf.load(
        args.hf,
        max_seq_len=len(prompt) + new,
        dtype=np.float64 if dtype == "float64" else np.float32,
    )
    kwargs = {}
    if level.ARRAY == "numpy":
        kwargs["dtype"] = np.dtype(dtype)
    elif level.ARRAY == "torch":
        import torch

        kwargs |= {"dtype": getattr(torch, dtype), "device": args.device}
    model = level.DecoderOnlyTransformer(config, params, **kwargs)
    started = time.perf_counter()
    text = hf.generate_text(model, tokenizer, args.prompt, new)
    seconds = time.perf_counter() - started
    print(args.prompt + text)
    print(
        f"{new} new tokens in {seconds:.3g} s ({new / seconds:.3g} tok/s) at {args.level}, "
        f"{dtype}, {args.device}",
        file=sys.stderr,
    )
    return 0
