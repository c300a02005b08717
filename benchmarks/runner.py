"""The sweep: every workload of the plan on every subject, one ``Record`` each.

For each case the runner, in this order (llm.c's: check, then time):

1. skips it if the subject cannot run it, or if it is over the size budget (``screen``);
2. builds it (inputs converted to the native type, outside any timing);
3. checks it against the float64 reference (2 and 3: ``check``). This first call
   is also the first warm-up and the budget's last guard (a call far over the
   time cap is not sampled). A case whose error is over its dtype's bound
   (``reference.error_bound``) is reported as wrong and is not timed;
4. warms up (``policy.warmup`` untimed calls in all, the last one under the
   memory probe) and times it (``measure.measure``): CUDA events on a GPU, the
   wall clock around a synchronised call elsewhere. A case that reads more from
   memory than a cache holds (``BESIDE_BYTES`` a call: a real model's decode) is then
   timed in turn with the read streams, at its threads (``_in_turn``): its ceiling,
   taken at the same moments, since the machine's bandwidth moves by a factor of two
   within seconds while other work runs;
5. derives GFLOP/s, the fraction of the matmul peak, tokens/s, and GB/s with its
   fraction of the read stream ("% bw": of the streams timed in turn with it; a case
   reading less, whose bytes may stay in cache, divides by the stream timed at the
   run's end).

``run_case`` is those five steps; the pytest-benchmark suite
(``benchmarks/test_ladder.py``) takes steps 1 to 3 from here and hands the
checked call to pytest-benchmark instead of step 4.

A level that raises does not stop the sweep: its row says ``error: ...``.
Computed figures that involve no timing (padding waste) come from
``plan.figures`` and are recorded as they are.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np

from loading.threads import cpu_threads

from .flops import matmul_flops
from .measure import (
    READ_BYTES,
    Bandwidth,
    Peak,
    Stats,
    TimingPolicy,
    cpu_timer,
    cuda_timer,
    describe_machine,
    measure,
    measure_copy_bandwidth,
    measure_matmul_peak,
    measure_read_bandwidth,
    peak_memory,
    read_streams,
)
from .plan import Plan, Workload
from .records import SKIPPED_BUDGET, WRONG, Record
from .reference import Case, Reference
from .subjects import Subject

Done = Callable[[list[Record]], None]  # called after each step with the records it made
PROBE_SLACK = 2.0  # a call measured over this many times the time cap is not sampled
# Bytes a call reads from which it is timed in turn with the read streams: past the
# last-level caches of CPUs (32 MiB here) and near a GPU's.
BESIDE_BYTES = 256 * 2**20
PAIRS = 5  # calls of such a case, each followed by the read streams


def _family(workload: Workload) -> str:
    """Workloads whose FLOP rates are alike enough to extrapolate from one to another."""
    return "attention" if workload.scenario.startswith("attention") else "model"


def _series(workload: Workload) -> tuple[str, bool]:
    """The sizes of one series differ in ``T`` only. A window that binds (``W < T``) and
    one as long as the sequence (full causal) are two series of one scenario."""
    window = getattr(workload, "window", None)
    return workload.scenario, window is not None and window < workload.T


GROWTH_EXPONENTS = (1.0, 3.0)  # the range of time ~ FLOPs^p a prediction may assume


@dataclass
class Pace:
    """What each subject has shown so far: the basis of the time budget.

    For a size of a series already measured, the prediction extrapolates the
    last time along the FLOPs: in proportion after one size, and after two
    with the growth they showed, ``time ~ FLOPs^p`` with ``p`` in ``[1, 3]``
    (a level that computes a windowed attention as a full ``(T, S)`` matrix
    grows faster than the window's FLOPs; one slower than them is read as
    proportional). For a new scenario it is the FLOPs at the *best* rate the
    subject reached in the same family, an optimistic guess, so a scenario is
    skipped only when even that is too slow.
    """

    last: dict[tuple, list[tuple[float, float]]] = field(default_factory=dict)
    best_rate: dict[tuple[str, str], float] = field(default_factory=dict)  # FLOP/s

    def predict(self, subject: Subject, workload: Workload) -> float | None:
        seen = self.last.get((subject.name, _series(workload)), [])
        if seen and seen[-1][0] > 0:
            flops, seconds = seen[-1]
            p = 1.0
            if len(seen) == 2 and seen[0][0] < flops and seen[0][1] > 0:
                (f0, t0), lo_hi = seen[0], GROWTH_EXPONENTS
                p = min(max(math.log(seconds / t0) / math.log(flops / f0), lo_hi[0]), lo_hi[1])
            return seconds * (workload.flops() / flops) ** p
        rate = self.best_rate.get((subject.name, _family(workload)))
        return workload.flops() / rate if rate else None

    def record(self, subject: Subject, workload: Workload, seconds: float) -> None:
        flops = workload.flops()
        series = self.last.setdefault((subject.name, _series(workload)), [])
        series[:] = [*series[-1:], (flops, seconds)]  # the last two sizes
        key = (subject.name, _family(workload))
        if seconds > 0:
            self.best_rate[key] = max(self.best_rate.get(key, 0.0), flops / seconds)


def peak_dtype(device: str, dtype: str) -> str:
    """The dtype of the peak matmul: float32 on the CPU (float64 for a float64 run),
    bf16 on CUDA (float32 for a float32/float64 run, whose tensor-core rate differs)."""
    if device.startswith("cuda"):
        return "bfloat16" if dtype in ("bfloat16", "float16") else "float32"
    return "float64" if dtype == "float64" else "float32"


def peak_record(peak: Peak, threads: int | None = None) -> Record:
    """The matmul peak as a record (level ``torch.matmul``); its rate is the fastest sample."""
    record = Record(
        level="torch.matmul",
        scenario="matmul peak",
        device=peak.device,
        dtype=peak.dtype,
        shape={"N": peak.n} | ({} if threads is None else {"threads": threads}),
        flops=matmul_flops(peak.n),
        gflops=peak.gflops,
        peak_fraction=1.0,
        description=f"({peak.n}, {peak.n}) @ ({peak.n}, {peak.n}) torch.matmul",
        note="rate of the fastest sample, best of the start and the end of the run",
        **_times(peak.stats),
    )
    return record


def bandwidth_record(bandwidth: Bandwidth, threads: int | None = None) -> Record:
    """A memory rate as a record: the read-only stream (the 100% of "% bw" for the records
    not timed in turn with the streams) or the copy beside it (bytes read + written)."""
    MiB = bandwidth.nbytes // 2**20
    read = bandwidth.moved == 1
    return Record(
        level=bandwidth.how,
        scenario="read stream" if read else "copy bandwidth",
        device=bandwidth.device,
        dtype="float32",
        shape={"MiB": MiB} | ({} if threads is None else {"threads": threads}),
        bytes_read=bandwidth.moved * float(bandwidth.nbytes),
        gbs=bandwidth.gbs,
        bandwidth_fraction=1.0 if read else None,
        description=(
            f"{bandwidth.how} reading {MiB} MiB once, the fastest of the read-only streams"
            if read
            else f"copy_ of {MiB} MiB (bytes read + written)"
        ),
        note="rate of the fastest sample",
        **_times(bandwidth.stats),
    )


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


def _timer(subject: Subject):
    if subject.kind == "torch" and subject.device.startswith("cuda"):
        return cuda_timer()
    return cpu_timer(subject.sync)


def _over_budget(subject: Subject, workload: Workload, plan: Plan, pace: Pace) -> str | None:
    budget = plan.budget_for(subject, workload.scenario)
    gflop = workload.flops() / 1e9
    if gflop > budget.max_gflop:
        return f"{gflop:.3g} GFLOP per call > cap {budget.max_gflop:g}"
    predicted = pace.predict(subject, workload)
    if predicted is not None and predicted > budget.max_call_s:
        return f"about {predicted:.2g} s per call > cap {budget.max_call_s:g} s"
    return None


def screen(subject: Subject, workload: Workload, *, dtype: str, plan: Plan, pace: Pace) -> Record:
    """Step 1: the case's record, with its status ``"skipped: <why>"`` when the subject
    cannot run the workload and ``"skipped (budget)"`` when it is over the size budget;
    otherwise ``"ok"``, still to be checked and measured."""
    record_dtype = getattr(workload, "record_dtype", None)  # a workload that says otherwise
    record = Record(
        level=subject.name,
        scenario=workload.scenario,
        device=subject.device,
        dtype=record_dtype(subject, dtype) if record_dtype else subject.effective_dtype(dtype),
        shape=workload.shape(),
        flops=workload.flops(),
        description=subject.description,
        memory_method=subject.memory_method,
    )
    why_not = workload.unsupported(subject) or subject.unsupported(dtype)
    if why_not:
        record.status = f"skipped: {why_not}"
        return record
    over = _over_budget(subject, workload, plan, pace)
    if over:
        record.status, record.note = SKIPPED_BUDGET, over
    return record


def check(
    record: Record, subject: Subject, workload: Workload, *, plan: Plan, reference: Reference
) -> Case | None:
    """Steps 2 and 3: build the case, then check it against the float64 reference.

    That call is untimed, the first warm-up, and the budget's last guard. Returns
    the case, or None when it is wrong or its first call was far over the time cap
    (the record says which, and nothing more may run).
    """
    budget = plan.budget_for(subject, workload.scenario)
    # Level 0 computes in float64 whatever was asked; its reference must know that.
    case = workload.build(subject, record.dtype, reference)
    start = time.perf_counter()
    record.max_error = case.error()
    record.error_of, record.error_bound = case.error_of, case.bound
    check_s = time.perf_counter() - start
    if not record.max_error <= case.bound:  # also catches NaN
        record.status = WRONG
        record.note = f"{case.error_of} error {record.max_error:.3g} > bound {case.bound:g}"
        return None
    # A prediction can be wrong (a scenario far slower than the rate it was predicted
    # from); the checked call says so before any sample is taken. The factor leaves
    # room for the check's own work (the reference, the comparison).
    if check_s > PROBE_SLACK * budget.max_call_s:
        record.status = SKIPPED_BUDGET
        record.note = (
            f"one call took {check_s:.2g} s > {PROBE_SLACK:g} x cap {budget.max_call_s:g} s"
        )
        return None
    return case


def _measure(record: Record, subject: Subject, case: Case, policy: TimingPolicy) -> None:
    """Step 4: the warm-up (the check was the first call; the last warm-up call is the
    memory probe, after first-call effects such as autotuning are over), then the samples,
    between two read streams where the case reads a known number of bytes."""
    for _ in range(policy.warmup - 2):
        case.fn()
    record.peak_memory_bytes = peak_memory(case.fn, subject.memory_method)
    record.bytes_read = case.extras.get("bytes_read")
    stats = measure(case.fn, _timer(subject), policy, warmed=policy.warmup)
    for key, value in _times(stats).items():
        setattr(record, key, value)
    if (record.bytes_read or 0) >= BESIDE_BYTES:
        _in_turn(record, subject, case)
    record.padding_waste = case.extras.get("padding_waste")
    record.note = case.extras.get("note") or record.note


def _in_turn(record: Record, subject: Subject, case: Case) -> None:
    """ "% bw" of a case that reads from memory: ``PAIRS`` calls, each followed by a pass of
    every read stream at the case's threads (its ``threads``, else the run's); the median
    over the calls of a call's GB/s over the fastest stream timed right after it
    (``bandwidth_fraction``), and the median of those streams (``stream_gbs``). A ceiling
    timed at another moment, even seconds away, can be the machine's at another load."""
    import torch

    device = subject.device
    cuda = device.startswith("cuda")
    threads = record.shape.get("threads", torch.get_num_threads())
    stream_timer = cuda_timer() if cuda else cpu_timer()
    fractions, rates = [], []
    with contextlib.nullcontext() if cuda else cpu_threads(threads):
        streams = list(read_streams(device, READ_BYTES).values())
        for fn in streams:
            fn()  # the buffer's pages touched once, untimed
        for _ in range(PAIRS):
            gbs = record.bytes_read / _timer(subject)(case.fn, 1) / 1e9
            rate = max(READ_BYTES / stream_timer(fn, 1) / 1e9 for fn in streams)
            fractions.append(gbs / rate)
            rates.append(rate)
    record.stream_gbs = float(np.median(rates))
    record.bandwidth_fraction = float(np.median(fractions))


def run_case(
    subject: Subject,
    workload: Workload,
    *,
    dtype: str,
    plan: Plan,
    reference: Reference,
    peak: Peak | None,
    pace: Pace | None = None,
) -> Record:
    """Check, then measure, one workload on one subject (see the module docstring)."""
    pace = pace if pace is not None else Pace()
    record = screen(subject, workload, dtype=dtype, plan=plan, pace=pace)
    if not record.ok:
        return record
    try:
        case = check(record, subject, workload, plan=plan, reference=reference)
        if case is not None:
            _measure(record, subject, case, plan.timing)
    except NotImplementedError as exc:  # a learner's rung with a stage still a stub
        record.status = f"skipped: not written yet ({exc})"[:300]
        return record
    except Exception as exc:  # a failing level must not stop the sweep
        record.status = f"error: {type(exc).__name__}: {exc}"[:300]
        return record
    if not record.ok:
        return record
    # Step 5: the derived figures.
    pace.record(subject, workload, record.median_s)
    record.gflops = record.flops / record.median_s / 1e9
    if peak is not None:
        record.peak_fraction = record.gflops / peak.gflops
    tokens = workload.tokens()
    if tokens:
        record.tokens_per_s = tokens / record.median_s
    if record.bytes_read:
        record.gbs = record.bytes_read / record.median_s / 1e9
    return record


def case_count(subjects: list[Subject], plan: Plan) -> int:
    return sum(1 for _ in pairs(subjects, plan))


@dataclass(frozen=True)
class Step:
    """One step of a run, as its progress shows it: what it does, the seconds it should take
    on two cores (``Plan.step_seconds``; nothing where the case cannot run), and the
    compiled passes it needs (``real_model.Compile``), which it compiles where the user's
    cache lacks them."""

    label: str
    seconds: float
    compiles: tuple = ()


def steps(subjects: list[Subject], plan: Plan) -> list[Step]:
    """The steps ``run`` takes, in its order: the peak, each case, each computed figure, the
    ceilings again."""
    found = [Step(f"matmul peak ({plan.peak_n}^3)", plan.step_seconds("peak"))]
    for group, subject, workload in _cases(subjects, plan):
        T = workload.shape().get("T")
        label = f"{subject.name}  {workload.scenario}" + ("" if T is None else f"  T={T}")
        runs = workload.unsupported(subject) is None
        compiles = workload.compiles(subject) if hasattr(workload, "compiles") else ()
        found.append(Step(label, plan.step_seconds(group) if runs else 0.0, compiles))
    for group, figures in plan.figures.items():
        for figure in figures:
            label = f"{group}  (computed figures)"
            found.append(Step(label, plan.step_seconds(group), figure.compiles))
    found.append(Step("the machine's ceilings again, at the end", plan.step_seconds("ceilings")))
    return found


def pairs(subjects: list[Subject], plan: Plan) -> Iterator[tuple[Subject, Workload]]:
    """(subject, workload) in sweep order: scenario, then size, then level.

    Subjects without models (the SDPA peers) take part in attention only, and
    a peer with ``only`` scenarios (transformers) in those.
    """
    for _, subject, workload in _cases(subjects, plan):
        yield subject, workload


def _cases(subjects: list[Subject], plan: Plan) -> Iterator[tuple[str, Subject, Workload]]:
    """``pairs``, each with its scenario group."""
    for group, workloads in plan.workloads.items():
        for workload in workloads:
            for subject in subjects:
                if workload.unsupported(subject) == "attention only":
                    continue
                if subject.only and workload.scenario not in subject.only:
                    continue  # a peer outside the comparison it is here for
                yield group, subject, workload


def run(
    subjects: list[Subject],
    plan: Plan,
    *,
    device: str,
    dtype: str,
    unavailable: dict[str, str] | None = None,
    progress: Callable[[Step], None] | None = None,
    reference: Reference | None = None,
    done: Done | None = None,
) -> list[Record]:
    """The whole sweep; the first records are the ceilings (the matmul peak first), then one
    per unavailable level, the cases, the computed figures.

    Every record is stamped with the machine and the start time of the run. The run goes
    in ``steps``: the peak, each case, each group of computed figures, the ceilings again
    at the end. ``progress(step)`` is called before each step and ``done(records)`` after
    it, with the records it made (none for the first peak, whose record comes with the
    ceilings), so that a caller can keep what a run has measured as it goes, and an
    interrupted run loses only the step it was in.
    """
    reference = reference if reference is not None else Reference(device)
    stamp = {
        "machine": describe_machine(device),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    planned = iter(steps(subjects, plan))

    def step() -> None:
        now = next(planned)
        if progress is not None:
            progress(now)

    def made(records: list[Record]) -> list[Record]:
        for record in records:
            record.machine, record.date = stamp["machine"], stamp["date"]
        if done is not None:
            done(records)
        return records

    step()  # the peak
    pdtype = peak_dtype(device, dtype)
    peak = measure_matmul_peak(device, pdtype, plan.peak_n, plan.timing)
    records = [
        Record(level=name, scenario="-", device=device, dtype=dtype, status=f"unavailable: {why}")
        for name, why in (unavailable or {}).items()
    ]
    made(records)
    pace = Pace()
    measured = []
    for subject, workload in pairs(subjects, plan):
        step()
        record = run_case(
            subject, workload, dtype=dtype, plan=plan, reference=reference, peak=None, pace=pace
        )
        measured.extend(made([record]))
    figures = []
    for group in plan.figures.values():
        for figure in group:
            step()
            figures.extend(made(figure.make()))
    step()  # the ceilings again
    ceilings = made(_ceilings(measured, peak, device=device, dtype=pdtype, plan=plan))
    return [*ceilings, *records, *measured, *figures]


def _ceilings(measured: list[Record], first: Peak, *, device: str, dtype: str, plan: Plan):
    """The ceilings the records are fractions of, measured at each thread count the records
    ran at (a record's ``threads``, else the run's): the matmul peak ("% peak"; the best of
    the run's start, ``first``, and its end) and, where a record reads a known number of
    bytes, the read-only stream with the copy beside it: the "% bw" of a record that was not
    timed in turn with the streams (``BESIDE_BYTES``). On a GPU, one of each."""
    import torch

    cuda = device.startswith("cuda")
    run_threads = None if cuda else torch.get_num_threads()

    def threads_of(record: Record) -> int | None:
        return None if cuda else record.shape.get("threads", run_threads)

    counts = sorted({threads_of(r) for r in measured if r.ok} | {run_threads}, key=str)
    reading = any(r.gbs for r in measured)
    peaks, reads, ceilings = {}, {}, []
    for n in counts:
        with contextlib.nullcontext() if n is None else cpu_threads(n):
            # The peak again at the end: a machine busy at the start must not set a low one.
            peak = measure_matmul_peak(device, dtype, plan.peak_n, plan.timing)
            if n == run_threads:
                peak = max(first, peak, key=lambda p: p.gflops)
            peaks[n] = peak
            ceilings.append(peak_record(peak, n))
            if reading:  # only generation reads enough to ask
                reads[n] = measure_read_bandwidth(device, plan.timing)
                ceilings.append(bandwidth_record(reads[n], n))
                ceilings.append(bandwidth_record(measure_copy_bandwidth(device, plan.timing), n))
    for record in measured:
        n = threads_of(record)
        if record.gflops is not None and n in peaks:
            record.peak_fraction = record.gflops / peaks[n].gflops
        if record.gbs is not None and record.stream_gbs is None and n in reads:
            record.bandwidth_fraction = record.gbs / reads[n].gbs
    return ceilings
