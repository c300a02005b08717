"""The attention scenarios: the attention core alone, in one process and across processes.

``Attention`` is one call of a subject's ``attention`` on random ``q, k, v
(B,H,T,Dh)``, built as a ``Case`` (the callable to time, inputs already native,
and its check against the float64 reference). Its ``flops()`` and ``shape()``
need no arrays, so the runner applies the size budget before anything is
allocated. Scenario names (the ``scenario`` field of every record):

* ``attention fwd`` / ``attention fwd+bwd``: ``S = T``, causal; the backward
  pass where a level has gradients (autograd at the torch levels, level 1's
  hand-written one);
* ``attention window``: causal with a sliding window of ``W`` keys;
* ``decode attention``: one query against ``S`` cached keys (GB/s: K and V read),
  where level 4 splits the keys on a GPU (flash-decoding) and, as a peer, does not;
* ``ring``: attention over a sequence sharded across processes (below).

The ``ring`` scenario
---------------------
``ladder bench --scenario ring`` starts 1 and then 2 processes (gloo on the
CPU, nccl on CUDA with one GPU each) and times, on every rank, causal
attention of its shard of ``q, k, v (B, H, T/W, Dh)`` against all the keys:
``levels.parallel.ring_attention`` and ``allgather_attention``, forward only,
each block computed by level 3's attention. A record's time is the slowest
rank's median; its error is the worst rank's against the float64 reference on
the full sequence. The ranks must make the same calls, so every rank takes
the same fixed number of samples, each after a barrier (not the adaptive
sampling of ``measure.measure``, which could differ between ranks).

What the ratio to one process means depends on the machine: here two
processes share two CPU cores with everything else, and gloo moves the
blocks through shared memory, so it says little about a cluster. The
communication volume and memory per rank on paper, for any number of
processes, are in docs/beyond_one_device.md.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from . import flops as F
from .measure import summarize
from .records import OK, WRONG, Record
from .reference import Case, Reference, error_bound, round_to, scaled_error
from .subjects import Subject


@dataclass(frozen=True)
class Attention:
    """Attention core, ``q (B,H,T,Dh)``, ``k, v (B,H,S,Dh)`` with ``S = T``; a sliding
    ``window`` of ``W`` keys makes it the ``attention window`` scenario, and a few
    queries against ``S`` keys (``S`` given, ``T <= 16``) ``decode attention``."""

    B: int
    H: int
    T: int
    Dh: int
    causal: bool = True
    backward: bool = False
    window: int | None = None
    seed: int = 0
    S: int | None = None  # keys; None: S = T

    @property
    def keys(self) -> int:
        return self.T if self.S is None else self.S

    @property
    def scenario(self) -> str:
        if self.S is not None:
            return "decode attention"
        if self.window is not None:
            return "attention window"
        return "attention fwd+bwd" if self.backward else "attention fwd"

    def shape(self) -> dict[str, int]:
        shape = {"B": self.B, "H": self.H, "T": self.T, "S": self.keys, "Dh": self.Dh}
        shape |= {"causal": int(self.causal)}
        return shape if self.window is None else shape | {"W": self.window}

    def flops(self) -> float:
        f = F.attention_fwd_bwd_flops if self.backward else F.attention_flops
        # A decode step's few queries see (nearly) every key: not halved for causal.
        causal = self.causal and self.S is None
        return f(self.B, self.H, self.T, self.keys, self.Dh, causal=causal, window=self.window)

    def bytes_read(self, dtype: str) -> float | None:
        """A decode step reads all of K and V, ``2 B H S Dh`` numbers: its real cost."""
        if self.S is None:
            return None
        return 2.0 * self.B * self.H * self.S * self.Dh * F.element_bytes(dtype)

    def tokens(self) -> int | None:
        return None

    def unsupported(self, subject: Subject) -> str | None:
        if self.backward and not subject.has_grad:
            return "no gradients at this level"
        return None

    def inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``q (B,H,T,Dh)``, ``k, v (B,H,S,Dh)`` and the upstream gradient ``dout (B,H,T,Dh)``,
        float64."""
        rng = np.random.default_rng(self.seed)
        B, H, T, S, Dh = self.B, self.H, self.T, self.keys, self.Dh
        return tuple(rng.standard_normal((B, H, n, Dh)) for n in (T, S, S, T))

    def build(self, subject: Subject, dtype: str, reference: Reference) -> Case:
        q64, k64, v64, dout64 = self.inputs()
        q, k, v = (subject.asarray(x, dtype) for x in (q64, k64, v64))
        # The reference sees the inputs as the level sees them (rounded to its dtype),
        # so the error measures the computation, not the rounding of the inputs.
        qr, kr, vr, dr = (round_to(x, dtype) for x in (q64, k64, v64, dout64))
        attention, causal = subject.attention, self.causal
        window = {} if self.window is None else {"window": self.window}
        if not self.backward:
            fn = subject.calls(lambda: attention(q, k, v, causal=causal, **window), grad=False)

            def error() -> float:
                want = reference.attention(qr, kr, vr, causal, window=self.window)
                return scaled_error(subject.to_numpy(fn()), want)

            extras = {"bytes_read": self.bytes_read(dtype)}
            return Case(
                fn=fn, error=error, error_of="output", bound=error_bound(dtype), extras=extras
            )

        dout = subject.asarray(dout64, dtype)
        if subject.kind == "torch":
            for x in (q, k, v):
                x.requires_grad_(True)

            def step() -> list:
                q.grad = k.grad = v.grad = None
                attention(q, k, v, causal=causal).backward(dout)
                return [q.grad, k.grad, v.grad]

        else:  # GRADIENTS == "hand-written": the level's own attention_grads (level 1)

            def step() -> list:
                return list(subject.module.attention_grads(q, k, v, dout, causal=causal))

        fn = subject.calls(step, grad=True)

        def grad_error() -> float:
            got = [subject.to_numpy(g) for g in fn()]
            want = reference.attention_grads(qr, kr, vr, dr, causal)
            return max(scaled_error(g, w) for g, w in zip(got, want, strict=True))

        return Case(fn=fn, error=grad_error, error_of="dq,dk,dv", bound=error_bound(dtype))


# --------------------------------------------------------------------------- ring

WORLDS = (1, 2)
METHODS = ("ring", "allgather")
RING_B, RING_H, RING_DH = 1, 8, 64  # B, H and Dh of every ring case
WARMUP, REPEATS = 1, 5
DEADLINE_S = 300


def _inputs(T: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(T)
    return tuple(rng.standard_normal((RING_B, RING_H, T, RING_DH)) for _ in range(3))  # float64


def _worker(rank: int, world: int, lengths, device: str) -> dict:
    """One rank: for each length and method, the fixed samples and the error of its shard."""
    import torch
    import torch.distributed as dist

    from levels import parallel

    if device.startswith("cuda"):
        device = f"cuda:{rank}"  # spawn gave each rank its own GPU
    results = {}
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
    return results


def _spawn(world: int, lengths, device: str) -> list[dict]:
    from lab import distributed

    backend = "nccl" if device.startswith("cuda") else "gloo"
    with tempfile.TemporaryDirectory() as out:
        return distributed.spawn(
            _worker, world, out, list(lengths), device,
            deadline_s=DEADLINE_S, backend=backend, timeout=timedelta(seconds=120),
        )  # fmt: skip


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
                flops = F.attention_flops(RING_B, RING_H, T, T, RING_DH, causal=True)
                bound = error_bound("float32")
                records.append(
                    Record(
                        level=f"{method} attention",
                        scenario="ring",
                        device=device,
                        dtype="float32",
                        shape={
                            "W": world,
                            "B": RING_B,
                            "H": RING_H,
                            "T": T,
                            "Dh": RING_DH,
                            "causal": 1,
                        },
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
