"""Timing: warm up, synchronise, repeat, and summarise as a median with its spread.

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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

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
