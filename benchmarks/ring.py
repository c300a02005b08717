"""The ``ring`` scenario: attention over a sequence sharded across processes, timed per process.

``ladder bench --scenario ring`` starts 1 and then 2 processes (gloo on the
CPU, nccl on CUDA with one GPU each) and times, on every rank, causal
attention of its shard of ``q, k, v (B, H, T/W, Dh)`` against all the keys:
``levels.parallel.ring_attention`` and ``allgather_attention``, forward only,
each block computed by level 3's attention. A record's time is the slowest
rank's median; its error is the worst rank's against the float64 reference on
the full sequence. The ranks must make the same calls, so every rank takes
the same fixed number of samples, each after a barrier (not the adaptive
sampling of ``timing.measure``, which could differ between ranks).

What the ratio to one process means depends on the machine: here two
processes share two CPU cores with everything else, and gloo moves the
blocks through shared memory, so it says little about a cluster. The
communication volume and memory per rank on paper, for any number of
processes, are in docs/beyond_one_device.md.
"""

from __future__ import annotations

import json
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

from .bounds import error_bound
from .flops import attention_flops
from .records import OK, WRONG, Record
from .reference import Reference
from .scenarios import scaled_error
from .timing import summarize

WORLDS = (1, 2)
METHODS = ("ring", "allgather")
B, H, DH = 1, 8, 64
WARMUP, REPEATS = 1, 5
DEADLINE_S = 300


def _inputs(T: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(T)
    return tuple(rng.standard_normal((B, H, T, DH)) for _ in range(3))  # float64


def _worker(rank: int, world: int, rendezvous: str, out: str, lengths, device: str) -> None:
    """One rank: for each length and method, the fixed samples and the error of its shard."""
    import torch
    import torch.distributed as dist

    from lab import distributed
    from levels import parallel

    torch.set_num_threads(1)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    distributed.join_group(rank, world, rendezvous, backend=backend, timeout=timedelta(seconds=120))
    results = {}
    try:
        for T in lengths:
            q, k, v = (
                parallel.shard(torch.from_numpy(x).float(), 2, rank, world).to(device)
                for x in _inputs(T)
            )
            for method in METHODS:
                fn = parallel.ring_attention if method == "ring" else parallel.allgather_attention

                def call(fn=fn, q=q, k=k, v=v):
                    with torch.no_grad():
                        return fn(q, k, v, causal=True)

                got = call()
                for _ in range(WARMUP):
                    call()
                samples = []
                for _ in range(REPEATS):
                    dist.barrier()
                    if device.startswith("cuda"):
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    call()
                    if device.startswith("cuda"):
                        torch.cuda.synchronize()
                    samples.append(time.perf_counter() - start)
                results[f"{method} {T}"] = {"samples": samples, "out": got.cpu().double().tolist()}
        dist.barrier()  # nobody tears the group down while another rank still talks
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()
    distributed.leave(0)  # done: past gloo's teardown at exit, which can abort a rank


def _spawn(world: int, lengths, device: str) -> list[dict]:
    from lab import distributed

    with tempfile.TemporaryDirectory() as out:
        return distributed.spawn(_worker, world, out, list(lengths), device, deadline_s=DEADLINE_S)


def ring_records(lengths, device: str = "cpu") -> list[Record]:
    """One record per (method, processes, T), timed as the module docstring says."""
    import torch

    from levels import parallel

    reference = Reference(device)  # on CUDA the float64 reference runs there too
    records = []
    for world in WORLDS:
        ranks = _spawn(world, lengths, device)
        for T in lengths:
            q, k, v = _inputs(T)
            want = torch.from_numpy(reference.attention(q, k, v, True))  # (B,H,T,Dh) float64
            for method in METHODS:
                key = f"{method} {T}"
                medians = [np.median(r[key]["samples"]) for r in ranks]
                slowest = ranks[int(np.argmax(medians))][key]["samples"]
                stats = summarize(slowest)
                error = max(
                    scaled_error(
                        np.asarray(r[key]["out"]),
                        parallel.shard(want, 2, rank, world).numpy(),
                    )
                    for rank, r in enumerate(ranks)
                )
                flops = attention_flops(B, H, T, T, DH, causal=True)
                bound = error_bound("float32")
                records.append(
                    Record(
                        level=f"{method} attention",
                        scenario="ring",
                        device=device,
                        dtype="float32",
                        shape={"W": world, "B": B, "H": H, "T": T, "Dh": DH, "causal": 1},
                        status=OK if error <= bound else WRONG,
                        gflops=flops / stats.median / 1e9,
                        median_s=stats.median,
                        q1_s=stats.q1,
                        q3_s=stats.q3,
                        min_s=stats.min,
                        max_s=stats.max,
                        repeats=stats.n,
                        flops=flops,
                        max_error=error,
                        error_of="output",
                        error_bound=bound,
                        description=f"levels.parallel.{method}_attention, level 3 blocks",
                        note=f"{world} process{'es' if world > 1 else ''}, slowest rank's median",
                    )
                )
    return records
