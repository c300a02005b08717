"""The training loop: one loop for every level, through a trainer backend.

A run is described by a :class:`RunSpec` (task, model config, training
settings); ``default_spec`` holds the defaults that solve each task on a
laptop CPU in under a minute. ``train`` then

1. builds the model from the canonical initial parameters (``init_params``),
2. runs the preflight (``lab.preflight``) and stops, naming the property, if
   any fails,
3. optimises the masked cross-entropy with AdamW: linear warm-up, cosine decay,
   global-norm clipping, length-bucketed batches,
4. writes a checkpoint, and evaluates on the held-out set.

Everything random is seeded from ``settings.seed``: initial parameters,
training and held-out data (independent streams), batch order (per epoch) and
the torch generator, so two runs with the same spec follow the same loss
curve, and a run resumed from a checkpoint continues it exactly.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from levels.common.config import TransformerConfig
from levels.common.params import init_params
from levels.common.tasks import CycleTask, Seq2SeqTask, majority_baseline, make_task

from .backend import OptimizerSettings, TrainerBackend, make_backend
from .checkpoint import load_checkpoint, save_checkpoint
from .data import BatchStream
from .evaluate import evaluate
from .preflight import require, run_preflight

Task = Seq2SeqTask | CycleTask


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 600
    batch_size: int = 64
    lr: float = 5e-3  # peak; small models on toy tasks tolerate (and need) a high rate
    warmup_steps: int = 50  # Adam's second-moment estimates are noisy for the first steps
    final_lr_fraction: float = 0.05  # cosine decay ends at this fraction of the peak
    n_train: int = 20_000
    n_heldout: int = 512
    eval_batch_size: int = 256
    seed: int = 0
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)


@dataclass(frozen=True)
class RunSpec:
    kind: str  # "seq2seq" or "decoder_only"
    task: Task
    config: TransformerConfig
    settings: TrainSettings


def default_spec(
    kind: str,
    task: str | None = None,
    *,
    quick: bool = False,
    steps: int | None = None,
    seed: int = 0,
) -> RunSpec:
    """The defaults: models 64 wide that solve each task in under a minute on a CPU.

    Seq2seq uses 3 layers per stack: with 2, copy stalls near 0.99 exact match,
    missing mostly the longest strings. Decoder-only uses 2, the least an
    induction head needs. Two heads of width 32 rather than four of 16: more
    rotary frequency pairs per head sharpen position-based attention.

    ``quick`` is a smoke run (a smaller model, 60 steps): it checks that
    everything runs, not that anything is learned.
    """
    the_task = make_task(kind, task)
    config = TransformerConfig(
        vocab_size=the_task.vocab_size,
        d_model=32 if quick else 64,
        n_heads=2,
        d_ff=64 if quick else 128,
        n_layers=1 if quick else (3 if kind == "seq2seq" else 2),
        max_seq_len=the_task.max_seq_len,
    )
    # The decoder-only task needs an induction head to form, which takes more
    # steps; its steps are cheaper (one stack, no cross-attention).
    settings = TrainSettings(seed=seed, steps=600 if kind == "seq2seq" else 1500)
    if quick:
        settings = dataclasses.replace(settings, n_train=2_000, n_heldout=128, steps=60)
    if steps is not None:
        settings = dataclasses.replace(settings, steps=steps)
    return RunSpec(kind, the_task, config, settings)


def learning_rate(step: int, settings: TrainSettings) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine decay to
    ``final_lr_fraction * lr`` at the last step."""
    peak, warm, total = settings.lr, settings.warmup_steps, settings.steps
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    floor = settings.final_lr_fraction
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def spec_to_dict(spec: RunSpec) -> dict[str, Any]:
    return {
        "kind": spec.kind,
        "task": dataclasses.asdict(spec.task),
        "config": dataclasses.asdict(spec.config),
        "settings": dataclasses.asdict(spec.settings),
    }


def spec_from_dict(d: dict[str, Any]) -> RunSpec:
    settings = dict(d["settings"])
    optimizer = dict(settings.pop("optimizer"))
    optimizer["betas"] = tuple(optimizer["betas"])
    task = dict(d["task"])
    return RunSpec(
        kind=d["kind"],
        task=make_task(d["kind"], task.pop("name"), **task),
        config=TransformerConfig(**d["config"]),
        settings=TrainSettings(**settings, optimizer=OptimizerSettings(**optimizer)),
    )


def build_backend(
    spec: RunSpec, level: ModuleType, *, device: str | None = None, world=None, fsdp: bool = False
) -> TrainerBackend:
    """A backend holding a fresh model, initialised from ``spec.settings.seed`` (one
    replica of a data-parallel run when ``world`` is given; ``lab.distributed``)."""
    params = init_params(spec.config, spec.kind, spec.settings.seed)
    return make_backend(
        level,
        spec.config,
        spec.kind,
        params,
        spec.settings.optimizer,
        device=device,
        world=world,
        fsdp=fsdp,
    )


Progress = Callable[[int, float, float], None]  # (step, loss, tokens per second)


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training: where the run stopped and what is saved.

    ``step`` is the number of steps done, None while the run was still being
    prepared (the model built, the preflight, the data, a checkpoint read);
    ``saved_step`` the step of the last checkpoint written (None if none was),
    at ``checkpoint``; ``resumed``: the run continues ``checkpoint``, which a
    run stopped while preparing has left as it was.
    """

    def __init__(
        self,
        step: int | None,
        checkpoint: str | Path | None,
        saved_step: int | None,
        *,
        resumed: bool = False,
    ):
        self.step, self.checkpoint, self.saved_step = step, checkpoint, saved_step
        if checkpoint is None:
            where = "no checkpoint (run with --checkpoint PATH to keep the state)"
        elif saved_step is not None:
            where = f"last checkpoint: {checkpoint} (step {saved_step})"
        elif resumed:
            where = f"the checkpoint {checkpoint} is as it was"
        else:
            where = f"no checkpoint written yet to {checkpoint}"
        when = "before the first step" if step is None else f"at step {step}"
        super().__init__(f"interrupted {when}; {where}")


def check_resumable(saved_spec: dict, spec: RunSpec, checkpoint: str | Path) -> None:
    """Refuse to resume ``checkpoint`` as a run it is not: kind, task, model, settings."""
    saved = spec_to_dict(spec_from_dict(saved_spec))
    wanted = spec_to_dict(spec)
    for key in ("kind", "task", "config", "settings"):
        if saved[key] != wanted[key]:
            raise ValueError(
                f"{checkpoint} was written for another run: {key} {_short(saved[key])} there, "
                f"{_short(wanted[key])} asked for"
            )


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


def train(
    spec: RunSpec,
    level: ModuleType,
    *,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    stop_after: int | None = None,
    checkpoint_every: int | None = 200,
    preflight: bool = True,
    evaluation: bool = True,
    progress: Progress | None = None,
    device: str | None = None,
    world=None,
    fsdp: bool = False,
) -> dict[str, Any]:
    """Train ``level`` on ``spec``; return the metrics, the per-step ``losses``
    and, under ``"backend"``, the trained backend itself (left out of the JSON).

    With a ``checkpoint`` path the state is saved there every
    ``checkpoint_every`` steps and at the end. ``resume`` continues from it
    (it must have been written for the same spec). ``stop_after`` ends the run
    after that many steps *of the schedule of ``spec.settings.steps``*, as an
    interruption would.

    With ``world`` (a ``lab.distributed.World``, the process group started) this
    process is one rank of a data-parallel run: it computes its shard of every
    batch, and only rank 0 reports progress, writes the checkpoint and (with
    DDP) evaluates; the result of another rank holds no evaluation.
    """
    from . import distributed

    started = time.perf_counter()
    settings = spec.settings
    main = world is None or world.main
    if world is not None:
        distributed.check_batch_size(settings.batch_size, world)
    if resume and checkpoint is None:
        raise ValueError("resume needs a checkpoint path")
    try:
        backend = build_backend(spec, level, device=device, world=world, fsdp=fsdp)
        checks = run_preflight(backend, spec.task, seed=settings.seed) if preflight else []
        require(checks)

        train_set = spec.task.sample(settings.n_train, settings.seed, "train")
        heldout = spec.task.sample(settings.n_heldout, settings.seed, "heldout")
        stream = BatchStream(
            train_set, settings.batch_size, seed=settings.seed, pad_id=spec.config.pad_id
        )

        start, losses, grad_norms = 0, [], []
        backend.seed(settings.seed)
        saved_step = None
        if resume:
            saved = load_checkpoint(checkpoint)
            check_resumable(saved["spec"], spec, checkpoint)
            backend.load_state(saved)
            start, losses = int(saved["step"]), [float(x) for x in saved["losses"]]
            saved_step = start
    except KeyboardInterrupt:  # Ctrl-C while preparing: nothing trained, nothing written
        raise TrainingInterrupted(None, checkpoint, None, resumed=resume) from None

    stop = settings.steps if stop_after is None else min(stop_after, settings.steps)
    train_started = time.perf_counter()
    real_tokens = 0
    done = start
    try:
        for step in range(start, stop):
            batch = stream.batch_at(step)
            loss = backend.loss_and_grads(batch)
            if not math.isfinite(loss):
                raise FloatingPointError(f"the training loss became {loss} at step {step}")
            grad_norms.append(backend.step(learning_rate(step, settings)))
            losses.append(loss)
            real_tokens += batch.n_real
            done = step + 1
            if progress is not None and main:
                progress(done, loss, real_tokens / (time.perf_counter() - train_started))
            if checkpoint is not None and (
                done == stop or (checkpoint_every and done % checkpoint_every == 0)
            ):
                state = backend.state()  # with FSDP every rank takes part in gathering it
                if main:
                    save_checkpoint(
                        checkpoint,
                        {**state, "spec": spec_to_dict(spec), "step": done, "losses": losses},
                    )
                saved_step = done
    except KeyboardInterrupt:
        raise TrainingInterrupted(done, checkpoint, saved_step) from None
    train_seconds = time.perf_counter() - train_started

    token, baseline = majority_baseline(train_set, heldout)
    seen = set(train_set)  # examples are frozen dataclasses, so hashable
    result: dict[str, Any] = {
        "level": level.__name__.rsplit(".", 1)[-1],
        "describe": level.FACTS.description,
        "kind": spec.kind,
        "task": spec.task.name,
        "steps": stop,
        "preflight": {c.name: c.detail for c in checks},
        "baseline_accuracy": baseline,
        "baseline_token": token,
        "heldout_seen_in_train": float(np.mean([e in seen for e in heldout])),
        "padding_waste": stream.padding_waste(),
        "train_seconds": train_seconds,
        "tokens_per_second": real_tokens / max(train_seconds, 1e-9),
        "final_train_loss": float(np.mean(losses[-20:])) if losses else float("nan"),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "spec": spec_to_dict(spec),
        "losses": losses,
        "grad_norms": grad_norms,  # before clipping, from this session's steps
    }
    if world is not None:
        result["processes"] = world.size
    # FSDP's parameters are sharded: evaluating gathers them, which every rank must join.
    if evaluation and (main or fsdp):
        result |= evaluate(backend, heldout, settings.eval_batch_size, seen=seen)
    distributed.barrier()  # the others wait while rank 0 evaluates and writes
    result["seconds"] = time.perf_counter() - started
    result["backend"] = backend
    return result


def write_json(path: str | Path, result: dict[str, Any]) -> None:
    """The metrics as JSON (without the live backend)."""
    clean = {k: v for k, v in result.items() if k != "backend"}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(clean, indent=2) + "\n")


def plot_losses(path: str | Path, result: dict[str, Any]) -> None:
    """The training-loss curve (log scale) with the held-out loss, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    losses = np.asarray(result["losses"])
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(np.arange(1, len(losses) + 1), losses, lw=0.8, alpha=0.5, label="train (per step)")
    window = min(25, len(losses))
    if window > 1:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(
            np.arange(window, len(losses) + 1), smooth, lw=1.5, label=f"train ({window}-step mean)"
        )
    if "heldout_loss" in result:
        ax.axhline(result["heldout_loss"], color="k", ls="--", lw=1, label="held-out (final)")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(f"{result['level']}: {result['kind']} {result['task']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
