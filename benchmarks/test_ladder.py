"""The ladder under pytest-benchmark: ``ladder bench --quick``'s cases, timed by pytest-benchmark.

    pytest benchmarks/ --benchmark-only                  # time it (a few minutes)
    pytest benchmarks/ --benchmark-disable -q            # smoke test: every call once (CI)
    pytest benchmarks/ --benchmark-only --benchmark-group-by=group --benchmark-columns=median,iqr

A thin adapter over the harness: the workloads and the size budget are the quick
plan's (``plan.default_plan``), the subjects are every level, and each case goes
through the runner's own first steps in the sweep's order (``runner.screen``, then
``runner.check``). A level that cannot be imported, a workload a level cannot run
(gradients at level 0) and a size over the budget are skipped with the reason; a
case over its error bound against the float64 reference fails, and is never timed.
Only then does the checked call go to pytest-benchmark's ``benchmark`` fixture,
one group per scenario and size, instead of to the harness's own timing. Memory,
the machine's ceilings, the computed figures and the ratios are ``ladder bench``'s.
"""

from __future__ import annotations

import os
import time

import pytest

import levels
from benchmarks.measure import summarize
from benchmarks.plan import budget_key, default_plan
from benchmarks.records import WRONG, size_label
from benchmarks.reference import Reference
from benchmarks.runner import Pace, check, pairs, screen
from benchmarks.subjects import load_subjects
from loading.threads import cpu_threads, free_cores

DTYPE = "float32"
PLAN = default_plan("cpu", quick=True)
SUBJECTS, UNAVAILABLE = load_subjects(None, "cpu", DTYPE)
CASES = list(pairs(SUBJECTS, PLAN))  # scenario, then size, then level: the sweep's order
REFERENCE, PACE = Reference(), Pace()  # shared, as in one sweep: the budget learns the pace


def _label(workload) -> str:
    return f"{workload.scenario} {size_label(workload.shape())}"


@pytest.fixture(scope="module", autouse=True)
def _threads():
    """As ``ladder bench`` runs: a thread per core the other processes leave free (on a busy
    CPU, a multi-threaded op waits for all of its threads and measures the neighbours)."""
    with cpu_threads(free_cores(os.cpu_count() or 1)):
        yield


@pytest.mark.parametrize("level", levels.LEVELS)
def test_level_loads(level):
    if level in UNAVAILABLE:
        pytest.skip(UNAVAILABLE[level])  # its cases are not collected


@pytest.mark.parametrize(
    ("subject", "workload"), CASES, ids=[f"{_label(w)}-{s.name}" for s, w in CASES]
)
def test_ladder(benchmark, subject, workload):
    record = screen(subject, workload, dtype=DTYPE, plan=PLAN, pace=PACE)
    start = time.perf_counter()
    case = check(record, subject, workload, plan=PLAN, reference=REFERENCE) if record.ok else None
    checked_s = time.perf_counter() - start  # one call, with the build and the reference
    if record.status == WRONG:
        pytest.fail(f"{subject.name} {_label(workload)} ({record.dtype}): {record.note}")
    if case is None:
        pytest.skip("; ".join(filter(None, (record.status, record.note))))

    def call():
        result = case.fn()
        subject.sync()  # on CUDA the timing must include the kernels, not just their launch
        return result

    benchmark.group = _label(workload)
    benchmark.extra_info.update(level=subject.name, flops=record.flops, dtype=record.dtype)
    benchmark.extra_info.update(error=record.max_error, describe=subject.description)
    slow = budget_key(subject) in ("python", "interpreted")
    start = time.perf_counter()
    benchmark.pedantic(call, rounds=3 if slow else 10, iterations=1, warmup_rounds=1)
    if benchmark.stats is None:  # --benchmark-disable: one call; the faster of the two here
        seconds = min(time.perf_counter() - start, checked_s)  # is the budget's estimate
    else:
        seconds = summarize(benchmark.stats.stats.data).median
        benchmark.extra_info["gflops"] = record.flops / seconds / 1e9
    PACE.record(subject, workload, seconds)
