"""Data-parallel training on ``torch.distributed``: every rank a replica, a shard of each batch.

``ladder train ... --nproc N`` starts ``N`` processes with ``torchrun
--standalone --nproc_per_node N`` (which picks a free port and, when one
process fails, stops the others) and each runs the same training loop. The
one torchrun line that does the same by hand::

    torchrun --standalone --nproc_per_node 2 -m ladder train seq2seq --task reverse

What makes N processes train the model one process would:

* **The same batches.** The batch at step ``n`` is a pure function of the
  seed and ``n`` (``lab.data.BatchStream``), so every rank builds the whole
  global batch and keeps its rows ``rank, rank + N, ...`` (``shard``). No data
  is sent, and a run saved with N processes resumes with any M.
* **The same loss.** The loss is a mean over the global batch's scored tokens.
  Each rank sums over its own and divides by the global count; DDP averages
  the gradients over ranks, so each rank's loss is also multiplied by ``N``,
  and the averaged gradient is exactly the single-process one, up to the
  order of the floating-point sums (``loss_scale``).
* **The same update.** After the all-reduce every rank holds the same
  gradients, so clipping and AdamW give every replica the same parameters.

Rank 0 alone prints, evaluates and writes the checkpoint (atomically, as
always); the others wait for it at a barrier. Every collective has a timeout
(``TIMEOUT``), so a rank that dies takes the others down with an error
instead of a hang.

FSDP2 (``torch.distributed.fsdp.fully_shard``, ``--fsdp``) shards the
parameters, gradients and optimiser moments across ranks instead of
replicating them, each layer gathered for its forward and backward; it runs on
gloo here. The same loss scaling holds, since FSDP also averages gradients.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

from .data import Batch

TIMEOUT = timedelta(seconds=300)  # any collective: longer than rank 0's evaluation takes


@dataclass(frozen=True)
class World:
    """This process's place among the ranks of a run."""

    rank: int
    size: int

    @property
    def main(self) -> bool:
        return self.rank == 0


def from_environment() -> World | None:
    """The world ``torchrun`` describes in ``RANK`` and ``WORLD_SIZE``; None outside torchrun."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return World(rank=int(os.environ["RANK"]), size=int(os.environ["WORLD_SIZE"]))


def start(world: World, device: str) -> None:
    """Join the process group: gloo on the CPU, nccl on CUDA (one GPU per local rank)."""
    import torch
    import torch.distributed as dist

    backend = "gloo"
    if device.startswith("cuda"):
        backend = "nccl"
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, rank=world.rank, world_size=world.size, timeout=TIMEOUT)


def stop() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def join_group(
    rank: int, world: int, rendezvous: str | Path, *, backend: str = "gloo", timeout=TIMEOUT
) -> None:
    """Join a process group of ``spawn``ed ranks, which meet through the file ``rendezvous``
    (no port to pick, so none another process can take between the pick and the bind)."""
    import torch.distributed as dist

    dist.init_process_group(
        backend,
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=world,
        timeout=timeout,
    )


def spawn(
    fn,
    world: int,
    out_dir: str | Path,
    *args,
    deadline_s: float,
    backend: str = "gloo",
    timeout: timedelta = TIMEOUT,
) -> list[dict]:
    """Run ``fn(rank, world, *args) -> dict`` in ``world`` spawned processes, one rank each,
    and return what each rank's ``fn`` returned, in rank order.

    ``fn`` does only its rank's work: ``_rank`` around it joins the process group
    (``backend``: gloo, or nccl with one GPU per rank; collectives time out after
    ``timeout``), and after it waits for every rank, tears the group down, writes the
    result to ``out_dir/rank{r}.json`` and ends the process (``leave``). The ranks meet
    through a fresh file in ``out_dir`` (``join_group``). A rank that fails, a run past
    ``deadline_s`` seconds or Ctrl-C raises here, and every rank still alive is
    terminated: none is left behind.
    """
    import torch.multiprocessing as mp

    out_dir = Path(out_dir)
    rendezvous = out_dir / f"rendezvous-{fn.__name__}-{world}-{time.monotonic_ns()}"
    # The ranks start with Ctrl-C blocked (a signal mask outlives exec): a terminal's
    # Ctrl-C reaches this process, which stops them, instead of a traceback from each.
    # Here it is held while they start, and comes after.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        context = mp.start_processes(
            _rank, args=(fn, world, str(rendezvous), str(out_dir), backend, timeout, args),
            nprocs=world, join=False, start_method="spawn",
        )  # fmt: skip
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    deadline = time.monotonic() + deadline_s
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{fn.__name__} on {world} ranks ran past {deadline_s} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
            process.join(timeout=10)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def _rank(rank: int, fn, world: int, rendezvous: str, out_dir: str, backend: str, timeout, args):
    """One spawned rank of ``spawn``: join, run ``fn``, wait for the others, tear down, leave."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # the ranks share the machine's cores
    if backend == "nccl":
        torch.cuda.set_device(rank)
    join_group(rank, world, rendezvous, backend=backend, timeout=timeout)
    try:
        result = fn(rank, world, *args)
        dist.barrier()  # nobody tears the group down while another rank still talks
    finally:
        dist.destroy_process_group()  # also after a failure: the error, not a hang, ends it
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    leave(0)  # done: past gloo's teardown at exit, which can abort a rank


def leave(status: int = 0) -> NoReturn:
    """End a rank's process once its work is done and its process group destroyed.

    Python's own exit frees gloo's objects in no fixed order, and now and then
    one whose background thread still runs, which aborts the process (``terminate
    called without an active exception``, SIGABRT) after every result was written:
    1 in 25 spawned runs of the model test case here, none in 100 that ended with
    ``os._exit``, which skips that teardown. The streams are flushed first, and
    nothing else is left to run.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def shard(batch: Batch, world: World) -> Batch:
    """Rows ``rank, rank + size, ...`` of ``batch``: this rank's share of the global batch."""
    rows = slice(world.rank, None, world.size)
    pick = lambda a: None if a is None else a[rows]  # noqa: E731
    return replace(
        batch,
        inputs=batch.inputs[rows],
        valid=batch.valid[rows],
        targets=batch.targets[rows],
        scored=batch.scored[rows],
        src=pick(batch.src),
        src_valid=pick(batch.src_valid),
    )


def loss_scale(local: Batch, full: Batch, world: World) -> float:
    """What turns this rank's mean loss into its part of the global mean, times the world
    size (which the gradient average divides out): ``N * n_local / n_global``."""
    return world.size * local.n_scored / full.n_scored


def check_batch_size(batch_size: int, world: World) -> None:
    if batch_size < world.size:
        raise ValueError(
            f"a batch of {batch_size} rows cannot give each of {world.size} processes a row"
        )


def all_sum(value: float) -> float:
    """``value`` summed over the ranks (a float64 all-reduce)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0])


def launch(
    module: str, argv: list[str], nproc: int, extra_env: dict | None = None
) -> tuple[int, bool]:
    """Run ``python -m <module> <argv>`` in ``nproc`` processes under torchrun (with
    ``extra_env`` set for them) -> its exit status, and whether Ctrl-C stopped it.

    torchrun's stderr, which the ranks share, is passed on line by line as it comes: a
    failing rank's error and status come back through it. torchrun and its ranks run in a
    session of their own, so a terminal's Ctrl-C reaches this process alone, which passes
    it on to all of them at once, then waits for them and leaves out what torchrun says
    about stopping (its signal's traceback): the caller says it, in one line.
    """
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        module,
        *argv,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    process = subprocess.Popen(
        command,
        env=env | (extra_env or {}),
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,  # the terminal's Ctrl-C is this process's to pass on
    )
    stopping = threading.Event()

    def relay() -> None:
        for line in process.stderr:
            if not stopping.is_set():
                sys.stderr.write(line)
                sys.stderr.flush()

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        status, interrupted = process.wait(), False
    except KeyboardInterrupt:
        stopping.set()
        interrupted = True
        with contextlib.suppress(ProcessLookupError):  # unless it has just ended
            os.killpg(process.pid, signal.SIGINT)  # torchrun and every rank, as a terminal
        status = process.wait()
    reader.join(timeout=10)
    return status, interrupted
