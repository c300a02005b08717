"""The sweep: every workload of the plan on every backend, one ``Record`` each.

For each case the runner, in this order:

1. skips it if the backend cannot run it, or if it is over the size budget;
2. builds it (inputs converted to the native type, outside any timing);
3. warms up: ``policy.warmup`` untimed calls, the last one under the memory probe;
4. times it (``timing.measure``): CUDA events on a GPU, the wall clock around a
   synchronised call elsewhere;
5. computes the error against the float64 reference (untimed);
6. derives GFLOP/s, the fraction of the matmul peak and tokens/s.

A level that raises does not stop the sweep: its row says ``error: ...``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .backends import Backend
from .flops import matmul_flops
from .machine import Peak, describe_machine, measure_matmul_peak
from .memory import peak_memory
from .plan import Budget, Plan
from .records import OK, SKIPPED_BUDGET, Record
from .reference import Reference
from .scenarios import Workload
from .timing import Stats, TimingPolicy, cpu_timer, cuda_timer, measure

Progress = Callable[[str], None]  # called before each case with a label, once per case
PROBE_SLACK = 2.0  # a call measured over this many times the time cap is not sampled


def _family(workload: Workload) -> str:
    """Workloads whose FLOP rates are alike enough to extrapolate from one to another."""
    return "attention" if workload.scenario.startswith("attention") else "model"


@dataclass
class Pace:
    """What each backend has shown so far: the basis of the time budget.

    For a size of a scenario already measured, the prediction is the last time
    scaled by the FLOP ratio (the previous, smaller size). For a new scenario it
    is the FLOPs at the *best* rate the backend reached in the same family, an
    optimistic guess, so a scenario is skipped only when even that is too slow.
    """

    last: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    best_rate: dict[tuple[str, str], float] = field(default_factory=dict)  # FLOP/s

    def predict(self, backend: Backend, workload: Workload) -> float | None:
        seen = self.last.get((backend.name, workload.scenario))
        if seen is not None and seen[0] > 0:
            flops, seconds = seen
            return seconds * workload.flops() / flops
        rate = self.best_rate.get((backend.name, _family(workload)))
        return workload.flops() / rate if rate else None

    def record(self, backend: Backend, workload: Workload, seconds: float) -> None:
        flops = workload.flops()
        self.last[(backend.name, workload.scenario)] = (flops, seconds)
        key = (backend.name, _family(workload))
        if seconds > 0:
            self.best_rate[key] = max(self.best_rate.get(key, 0.0), flops / seconds)


def peak_dtype(device: str, dtype: str) -> str:
    """The dtype of the peak matmul: float32 on the CPU (float64 for a float64 run),
    bf16 on CUDA (float32 for a float32/float64 run, whose tensor-core rate differs)."""
    if device.startswith("cuda"):
        return "bfloat16" if dtype in ("bfloat16", "float16") else "float32"
    return "float64" if dtype == "float64" else "float32"


def peak_record(peak: Peak) -> Record:
    """The matmul peak as a record (level ``torch.matmul``); its rate is the fastest sample."""
    record = Record(
        level="torch.matmul",
        scenario="matmul peak",
        device=peak.device,
        dtype=peak.dtype,
        shape={"N": peak.n},
        flops=matmul_flops(peak.n),
        gflops=peak.gflops,
        peak_fraction=1.0,
        description=f"({peak.n}, {peak.n}) @ ({peak.n}, {peak.n}) torch.matmul",
        note="rate of the fastest sample, best of the start and the end of the run",
        **_times(peak.stats),
    )
    return record


def _times(stats: Stats) -> dict:
    return {
        "median_s": stats.median,
        "q1_s": stats.q1,
        "q3_s": stats.q3,
        "min_s": stats.min,
        "max_s": stats.max,
        "repeats": stats.n,
        "calls_per_sample": stats.number,
    }


def _timer(backend: Backend):
    if backend.kind == "torch" and backend.device.startswith("cuda"):
        return cuda_timer()
    return cpu_timer(backend.sync)


def _over_budget(backend: Backend, workload: Workload, plan: Plan, pace: Pace) -> str | None:
    budget = plan.budget_for(backend)
    gflop = workload.flops() / 1e9
    if gflop > budget.max_gflop:
        return f"{gflop:.3g} GFLOP per call > cap {budget.max_gflop:g}"
    predicted = pace.predict(backend, workload)
    if predicted is not None and predicted > budget.max_call_s:
        return f"about {predicted:.2g} s per call > cap {budget.max_call_s:g} s"
    return None


def run_case(
    backend: Backend,
    workload: Workload,
    *,
    dtype: str,
    plan: Plan,
    reference: Reference,
    peak: Peak | None,
    pace: Pace | None = None,
) -> Record:
    """Measure one workload on one backend (see the module docstring for the steps)."""
    pace = pace if pace is not None else Pace()
    flops = workload.flops()
    record = Record(
        level=backend.name,
        scenario=workload.scenario,
        device=backend.device,
        dtype=backend.effective_dtype(dtype),
        shape=workload.shape(),
        flops=flops,
        description=backend.description,
        memory_method=backend.memory_method,
    )
    why_not = workload.unsupported(backend) or backend.unsupported(dtype)
    if why_not:
        record.status = f"skipped: {why_not}"
        return record
    over = _over_budget(backend, workload, plan, pace)
    if over:
        record.status, record.note = SKIPPED_BUDGET, over
        return record
    try:
        _measure_into(
            record,
            backend,
            workload,
            dtype,
            plan.timing,
            reference,
            budget=plan.budget_for(backend),
        )
    except Exception as exc:  # a failing level must not stop the sweep
        record.status = f"error: {type(exc).__name__}: {exc}"[:300]
        return record
    if not record.ok:
        return record
    pace.record(backend, workload, record.median_s)
    record.gflops = flops / record.median_s / 1e9
    if peak is not None:
        record.peak_fraction = record.gflops / peak.gflops
    tokens = workload.tokens()
    if tokens:
        record.tokens_per_s = tokens / record.median_s
    return record


def _measure_into(
    record: Record,
    backend: Backend,
    workload: Workload,
    dtype: str,
    policy: TimingPolicy,
    reference: Reference,
    *,
    budget: Budget,
) -> None:
    # Level 0 computes in float64 whatever was asked; its reference must know that.
    case = workload.build(backend, backend.effective_dtype(dtype), reference)
    # The warm-up calls are untimed, so the last of them doubles as the memory probe,
    # after first-call effects (autotuning buffers, lazy initialisation) are over.
    for _ in range(policy.warmup - 1):
        case.fn()
    start = time.perf_counter()
    record.peak_memory_bytes = peak_memory(case.fn, backend.memory_method)
    probe_s = time.perf_counter() - start
    # A prediction can be wrong (a scenario far slower than the rate it was predicted
    # from); the probe call says so before the samples are taken. The factor 2 leaves
    # room for the probe's own overhead (tracemalloc slows pure Python down).
    if probe_s > PROBE_SLACK * budget.max_call_s:
        record.status = SKIPPED_BUDGET
        record.note = (
            f"one call took {probe_s:.2g} s > {PROBE_SLACK:g} x cap {budget.max_call_s:g} s"
        )
        return
    stats = measure(case.fn, _timer(backend), policy, warmed=policy.warmup)
    for key, value in _times(stats).items():
        setattr(record, key, value)
    record.status = OK
    if case.error is not None:
        record.error_of = case.error_of
        try:
            record.max_error = case.error()
        except LookupError as exc:  # the reference level is unavailable
            record.error_of = f"n/a ({exc})"
    record.padding_waste = case.extras.get("padding_waste")
    if case.note is not None:
        record.note = case.note()


def case_count(backends: list[Backend], plan: Plan) -> int:
    return sum(1 for _ in _pairs(backends, plan))


def _pairs(backends: list[Backend], plan: Plan):
    """(backend, workload) in sweep order: scenario, then size, then level.

    Backends without models (the SDPA peers) take part in attention only.
    """
    for workloads in plan.workloads.values():
        for workload in workloads:
            for backend in backends:
                if workload.unsupported(backend) == "attention only":
                    continue
                yield backend, workload


def run(
    backends: list[Backend],
    plan: Plan,
    *,
    device: str,
    dtype: str,
    unavailable: dict[str, str] | None = None,
    progress: Progress | None = None,
    reference: Reference | None = None,
) -> list[Record]:
    """The whole sweep; the first record is the matmul peak, then one per unavailable level.

    Every record is stamped with the machine and the start time of the run.
    """
    reference = reference if reference is not None else Reference(device)
    stamp = {
        "machine": describe_machine(device),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if progress is not None:
        progress(f"matmul peak ({plan.peak_n}^3)")
    pdtype = peak_dtype(device, dtype)
    peak = measure_matmul_peak(device, pdtype, plan.peak_n, plan.timing)
    records: list[Record] = []
    for name, why in (unavailable or {}).items():
        records.append(
            Record(
                level=name, scenario="-", device=device, dtype=dtype, status=f"unavailable: {why}"
            )
        )
    pace = Pace()
    measured = []
    for backend, workload in _pairs(backends, plan):
        if progress is not None:
            progress(f"{backend.name}  {workload.scenario}  T={workload.shape().get('T', '')}")
        measured.append(
            run_case(
                backend, workload, dtype=dtype, plan=plan, reference=reference, peak=None, pace=pace
            )
        )
    # The peak again at the end: a machine busy at the start must not set a low ceiling.
    again = measure_matmul_peak(device, pdtype, plan.peak_n, plan.timing)
    peak = max(peak, again, key=lambda p: p.gflops)
    for record in measured:
        if record.gflops is not None:
            record.peak_fraction = record.gflops / peak.gflops
    everything = [peak_record(peak), *records, *measured]
    for record in everything:
        record.machine, record.date = stamp["machine"], stamp["date"]
    return everything
