"""The ladder under pytest-benchmark: one group per scenario and size, the levels side by side.

    pytest benchmarks/ --benchmark-only                  # time it (a few minutes)
    pytest benchmarks/ --benchmark-disable -q            # smoke test: every call once
    pytest benchmarks/ --benchmark-only --benchmark-group-by=group --benchmark-columns=median,iqr

The workloads, the size budget and the float64 check are those of
``ladder bench`` (``benchmarks/plan.py``, ``benchmarks/scenarios.py``,
``benchmarks/bounds.py``), in ``ladder bench``'s order: each case is first
checked against its float64 reference and must be within its dtype's bound
(the test fails otherwise, and nothing is timed); then pytest-benchmark times
it, with one untimed warm-up round, and each row's ``extra_info`` carries its
FLOPs, GFLOP/s, its error and what computes. A level that cannot be imported,
a scenario a level lacks (gradients at level 0) and a size over a level's
budget are reported as skipped with the reason. ``ladder bench`` remains the
place for the full sweep, memory and ratios.
"""

from __future__ import annotations

import pytest

import levels
from benchmarks.backends import load_backends
from benchmarks.plan import Budget, bench_model, budget_key, varlen_lengths
from benchmarks.reference import Reference
from benchmarks.scenarios import Attention, DecoderForward, Generate, TrainStep, VarlenBatch
from benchmarks.timing import summarize

DTYPE = "float32"
BACKENDS, UNAVAILABLE = load_backends(None, "cpu", DTYPE)
BY_NAME = {b.name: b for b in BACKENDS}
REFERENCE = Reference()

# Caps on the estimated work of one call (GFLOP), as in the quick plan: level 0 and
# the Triton interpreter run the small sizes only.
BUDGETS = {"python": Budget(max_gflop=0.01), "interpreted": Budget(max_gflop=0.02)}

# Small sizes: this suite is for side-by-side timing under pytest and for the CI smoke
# run; ``ladder bench`` sweeps the long sequences.
_MODEL = bench_model(256)
WORKLOADS = [
    *(Attention(B=1, H=8, T=T, Dh=64) for T in (32, 256)),
    *(Attention(B=1, H=8, T=T, Dh=64, backward=True) for T in (32, 256)),
    Attention(B=1, H=8, T=1, Dh=64, S=256),  # a decode step against 256 cached keys
    *(DecoderForward(_MODEL, 1, T) for T in (8, 128)),
    *(Generate(_MODEL, 1, 8, 4, use_cache=c) for c in (True, False)),
    *(VarlenBatch(_MODEL, varlen_lengths(6, 8, 40), 3, bucketed=b) for b in (False, True)),
    TrainStep(_MODEL, 2, 16),
]


def _label(workload) -> str:
    size = " ".join(f"{k}={v}" for k, v in workload.shape().items())
    return f"{workload.scenario} {size}"


@pytest.mark.parametrize("level", levels.LEVELS)
@pytest.mark.parametrize("workload", WORKLOADS, ids=[_label(w) for w in WORKLOADS])
def test_ladder(benchmark, workload, level):
    if level not in BY_NAME:
        pytest.skip(UNAVAILABLE[level])
    backend = BY_NAME[level]
    why_not = workload.unsupported(backend) or backend.unsupported(DTYPE)
    if why_not:
        pytest.skip(why_not)
    budget = BUDGETS.get(budget_key(backend), Budget())
    gflop = workload.flops() / 1e9
    if gflop > budget.max_gflop:
        pytest.skip(f"skipped (budget): {gflop:.3g} GFLOP per call > cap {budget.max_gflop:g}")

    dtype = backend.effective_dtype(DTYPE)
    case = workload.build(backend, dtype, REFERENCE)
    error = case.error()  # checked before it is timed; also the first warm-up call
    assert error <= case.bound, (
        f"{level} {_label(workload)}: {case.error_of} error {error:.3g} > bound {case.bound:g} ({dtype})"
    )

    def call():
        result = case.fn()
        backend.sync()  # on CUDA the timing must include the kernels, not just their launch
        return result

    benchmark.group = _label(workload)
    benchmark.extra_info.update(level=level, flops=workload.flops(), dtype=dtype, error=error)
    benchmark.extra_info["describe"] = backend.description
    slow = budget_key(backend) in ("python", "interpreted")
    benchmark.pedantic(call, rounds=3 if slow else 10, iterations=1, warmup_rounds=1)
    if benchmark.stats is not None:  # None under --benchmark-disable
        median = summarize(benchmark.stats.stats.data).median
        benchmark.extra_info["gflops"] = workload.flops() / median / 1e9
