"""How one call becomes numbers: its time, its peak memory, and the machine's ceilings.

Timing
------
The rules, which every number in the benchmark tables follows:

* never time the first call: compilation, autotuning, lazy allocation and cold
  caches all land there. ``measure`` makes ``policy.warmup`` untimed calls first;
* synchronise: on CUDA a kernel launch returns before the kernel has run, so
  the time is taken between two CUDA events recorded on the stream (and read
  after a synchronise); on the CPU the wall clock is read around the call;
* repeat and report the median (robust to the odd slow sample from a busy
  machine) with the interquartile range as the spread;
* a call shorter than ``min_sample_s`` is repeated ``number`` times inside one
  sample, so the clock's own resolution and overhead stay negligible.

Caches are not flushed between calls (``triton.testing.do_bench`` can do that on
a GPU): repeated calls on the same inputs measure the steady state of a loop
that reuses its buffers, which is what a training or decoding loop sees.

Peak memory
-----------
Measured by whichever method sees the level's allocations:

* Pure Python and numpy (levels 0-1): ``tracemalloc`` traces Python objects and,
  since numpy registers its buffers with it, numpy arrays as well.
* torch on the CPU: the allocator is invisible to ``tracemalloc``; the torch
  profiler with ``profile_memory=True`` records every allocation and free, and
  the peak is the highest running sum of those records in time order.
* torch on CUDA: ``torch.cuda.max_memory_allocated`` after a reset.
* the Triton interpreter: none of these sees its scratch buffers (it emulates
  the GPU with numpy arrays it manages itself), so the figure is ``None``, shown as n/a.

Every figure is the peak *above* what was allocated before the call, so it
includes the call's outputs and temporaries but not its inputs or weights.

The machine and its ceilings
----------------------------
The "% peak" column divides a level's GFLOP/s by the rate of one large dense
matmul measured in the same process, at the start and at the end of the run
(the better of the two): a float32 ``torch.matmul`` on the CPU, a bf16 one on
CUDA, at each thread count a record ran at (a real-model record's
``threads``, else the run's). That is an *achieved* peak, not the datasheet's,
so a level can be compared with the best this machine did on the same day
under the same load.

Decoding one token reads every weight and the whole KV cache for a handful of
FLOPs, so its ceiling is memory bandwidth, not the matmul peak: the "% bw"
column divides the bytes a generation reads per second by the rate of the
fastest read-only stream (a reduction over 512 MiB: ``torch.sum``, BLAS's dot
product and matrix-vector product), at the same thread count. A copy, which
also writes what it reads, is measured beside it and is not the ceiling: a
matrix-vector product only reads its weights, and can read faster than a
copy moves.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .flops import matmul_flops

# --------------------------------------------------------------------------- timing

Timer = Callable[[Callable[[], object], int], float]
"""``timer(fn, number)`` calls ``fn`` ``number`` times and returns seconds per call."""


@dataclass(frozen=True)
class Stats:
    """Summary of per-call times in seconds."""

    median: float
    q1: float  # 25th percentile
    q3: float  # 75th percentile
    min: float
    max: float
    n: int  # number of samples
    number: int = 1  # calls averaged inside each sample

    @property
    def iqr(self) -> float:
        """Interquartile range ``q3 - q1``: the spread the tables report."""
        return self.q3 - self.q1


def summarize(samples: Sequence[float], *, number: int = 1) -> Stats:
    """Median, quartiles (linear interpolation, numpy's default) and extremes of ``samples``."""
    if len(samples) == 0:
        raise ValueError("summarize needs at least one sample")
    a = np.asarray(samples, dtype=np.float64)
    q1, median, q3 = np.percentile(a, [25.0, 50.0, 75.0])
    return Stats(
        median=float(median),
        q1=float(q1),
        q3=float(q3),
        min=float(a.min()),
        max=float(a.max()),
        n=len(a),
        number=number,
    )


@dataclass(frozen=True)
class TimingPolicy:
    """How long to warm up and how many samples to take."""

    warmup: int = 1  # untimed calls before the first sample (at least one)
    min_repeat: int = 3  # samples at the very least, however slow the call
    max_repeat: int = 25  # samples at most, however fast the call
    min_time_s: float = 0.3  # keep sampling until this much time was measured
    min_sample_s: float = 2e-3  # shorter calls are looped inside one sample

    def __post_init__(self) -> None:
        if self.warmup < 1:
            raise ValueError("warmup must be at least 1: the first call is never timed")
        if not 1 <= self.min_repeat <= self.max_repeat:
            raise ValueError("need 1 <= min_repeat <= max_repeat")


def cpu_timer(sync: Callable[[], None] | None = None) -> Timer:
    """Wall-clock timer; ``sync`` (if given) runs before the start and before the stop."""

    def timer(fn: Callable[[], object], number: int) -> float:
        if sync is not None:
            sync()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        if sync is not None:
            sync()
        return (time.perf_counter() - start) / number

    return timer


def cuda_timer() -> Timer:
    """CUDA-event timer: the interval between two events on the current stream.

    The same method as ``triton.testing.do_bench``: events measure GPU time, not
    launch time, and ``synchronize`` makes the end event readable.
    """
    import torch

    def timer(fn: Callable[[], object], number: int) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(number):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / number  # elapsed_time is in ms

    return timer


def measure(
    fn: Callable[[], object], timer: Timer, policy: TimingPolicy, *, warmed: int = 0
) -> Stats:
    """Warm ``fn`` up, then time it under ``policy``.

    ``policy.warmup`` untimed calls come first, less the ``warmed`` calls the
    caller already made (the runner's memory probe is one). The first sample is
    a single call; it decides how many calls go into each later sample. When
    that number is one, the first sample is kept (it is not the first call of
    ``fn``: the warm-up was).
    """
    for _ in range(policy.warmup - warmed):
        fn()
    first = timer(fn, 1)
    number = (
        1 if first >= policy.min_sample_s else math.ceil(policy.min_sample_s / max(first, 1e-9))
    )
    samples = [first] if number == 1 else []
    while len(samples) < policy.max_repeat and (
        len(samples) < policy.min_repeat or sum(samples) * number < policy.min_time_s
    ):
        samples.append(timer(fn, number))
    return summarize(samples, number=number)


# --------------------------------------------------------------------------- memory

METHODS = ("tracemalloc", "torch.profiler", "cuda", "n/a")


def peak_tracemalloc(fn: Callable[[], object]) -> int:
    """Peak bytes traced by ``tracemalloc`` while ``fn`` runs (and holds its result)."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
        del result
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return peak - before


def peak_torch_profiler(fn: Callable[[], object]) -> int | None:
    """Peak bytes of the torch CPU allocator during ``fn``, from profiler memory records.

    Returns ``None`` if this torch build does not expose the raw records.
    """
    from torch.profiler import ProfilerActivity, profile

    with (
        _stderr_silenced(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        result = fn()
        del result
    try:
        events = prof.profiler.kineto_results.events()
        records = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    except AttributeError:
        return None
    # Allocations are positive, frees negative; the peak is the largest running sum.
    running = peak = 0
    for _, nbytes in records:
        running += nbytes
        peak = max(peak, running)
    return peak


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Point file descriptor 2 at /dev/null: the profiler's C++ layer logs a line to it
    at every start and stop, which would break up the progress bar and the tables."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_cuda(fn: Callable[[], object]) -> int:
    """Peak bytes of the CUDA caching allocator during ``fn``, above what it held before."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    del result
    return torch.cuda.max_memory_allocated() - before


def peak_memory(fn: Callable[[], object], method: str) -> int | None:
    """Run ``fn`` once under ``method`` (one of ``METHODS``); peak bytes, or None for n/a."""
    if method == "tracemalloc":
        return peak_tracemalloc(fn)
    if method == "torch.profiler":
        return peak_torch_profiler(fn)
    if method == "cuda":
        return peak_cuda(fn)
    if method == "n/a":
        fn()
        return None
    raise ValueError(f"unknown memory method {method!r}; choose one of {METHODS}")


# --------------------------------------------------------------------------- the machine


@dataclass(frozen=True)
class Peak:
    """The measured matmul rate."""

    n: int  # (n, n) @ (n, n)
    dtype: str
    device: str
    stats: Stats

    @property
    def gflops(self) -> float:
        """The rate of the fastest sample: a peak is a ceiling, so noise only lowers it."""
        return matmul_flops(self.n) / self.stats.min / 1e9


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe_machine(device: str) -> str:
    """One line: the device, and for the CPU its model, core count and torch threads."""
    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__})"
    cores, threads = os.cpu_count(), torch.get_num_threads()
    blas = os.environ.get("OPENBLAS_NUM_THREADS")
    return (
        f"{cpu_model()}, {cores} cores, torch {torch.__version__} "
        f"with {threads} thread{'' if threads == 1 else 's'}"
        + (f", OPENBLAS_NUM_THREADS={blas}" if blas else "")
    )


def measure_matmul_peak(device: str, dtype: str, n: int, policy: TimingPolicy) -> Peak:
    """Time ``(n, n) @ (n, n)`` in ``dtype`` on ``device`` with the harness's own rules."""
    import torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=getattr(torch, dtype))
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=getattr(torch, dtype))
    timer = cuda_timer() if device.startswith("cuda") else cpu_timer()
    stats = measure(lambda: torch.matmul(a, b), timer, policy)
    return Peak(n=n, dtype=dtype, device=device, stats=stats)


COPY_BYTES = 256 * 2**20  # far past any cache, so the copy streams from memory
READ_BYTES = 512 * 2**20  # a read-only stream as long as SmolLM2's float32 weights


@dataclass(frozen=True)
class Bandwidth:
    """A measured memory rate: ``moved * nbytes`` per call (``moved`` 2 for a copy, which
    reads and writes them, 1 for a read-only stream), by ``how``."""

    nbytes: int
    device: str
    stats: Stats
    moved: int = 2
    how: str = "copy_"

    @property
    def gbs(self) -> float:
        """GB/s of the fastest sample (1 GB = 1e9 bytes)."""
        return self.moved * self.nbytes / self.stats.min / 1e9


def measure_copy_bandwidth(
    device: str, policy: TimingPolicy, nbytes: int = COPY_BYTES
) -> Bandwidth:
    """Time ``dst.copy_(src)`` of ``nbytes`` float32 on ``device`` with the harness's rules."""
    import torch

    src = torch.ones(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    timer = cuda_timer() if device.startswith("cuda") else cpu_timer()
    stats = measure(lambda: dst.copy_(src), timer, policy)
    return Bandwidth(nbytes=nbytes, device=device, stats=stats)


def read_streams(device: str, nbytes: int) -> dict[str, Callable[[], object]]:
    """Reductions that read ``nbytes`` of float32 once and write next to nothing: PyTorch's
    ``sum``, and on a CPU BLAS's dot product and matrix-vector product (numpy's), each
    vectorised differently. A decode step only reads its weights, so its ceiling is the
    fastest of these, not a copy (which also writes)."""
    import torch

    src = torch.ones(nbytes // 4, device=device)
    streams = {"torch sum": lambda: src.sum()}
    if not device.startswith("cuda"):
        flat = src.numpy()
        rows, ones = flat.reshape(-1, 1024), np.ones(1024, np.float32)
        streams["BLAS dot"] = lambda: np.dot(flat, flat)  # one stream: x . x
        streams["BLAS gemv"] = lambda: rows @ ones  # (n/1024, 1024) @ (1024,)
    return streams


def measure_read_bandwidth(
    device: str, policy: TimingPolicy, nbytes: int = READ_BYTES
) -> Bandwidth:
    """The fastest of ``read_streams`` over ``nbytes`` (each timed with the harness's rules)."""
    timer = cuda_timer() if device.startswith("cuda") else cpu_timer()
    measured = [
        Bandwidth(nbytes, device, measure(fn, timer, policy), moved=1, how=how)
        for how, fn in read_streams(device, nbytes).items()
    ]
    return max(measured, key=lambda b: b.gbs)


# The share of a core a one-thread run had when the seconds the commands expect were measured
# (the plans' steps, the slow rungs' tokens: load averages of 4.7 to 5.5 on 2 cores, the run
# itself one more process: about 2 / 6).
MEASURED_SHARE = 1 / 3


def core_share() -> float:
    """The share of a core a one-thread process gets now: the cores over the processes that
    want them (the 1-minute load average's and this one), at most a whole core."""
    cores = os.cpu_count() or 1
    return min(1.0, cores / (os.getloadavg()[0] + 1))


def at_this_load(seconds: float) -> float:
    """``seconds`` measured at ``MEASURED_SHARE`` of a core, on the share a process gets now
    (a one-thread run's time goes as one over its share)."""
    return seconds * MEASURED_SHARE / core_share()


def free_cores(default: int) -> int:
    """CPU threads for the run: the cores the other processes leave free (the 1-minute
    load average), at least 1, at most ``default``.

    On a busy machine every parallel region of a multi-threaded op waits until all of
    its threads get a core, which can make a small op a hundred times slower; one
    thread per free core avoids that.
    """
    cores = os.cpu_count() or 1
    return max(1, min(default, cores - round(os.getloadavg()[0])))


@contextlib.contextmanager
def cpu_threads(n: int):
    """torch's intra-op threads and numpy's BLAS threads (``threadpoolctl``) set to ``n``
    for the run, and restored after it."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with threadpool_limits(limits=n, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(before)
