"""How many CPU threads a model runs with, and why that many.

On a busy machine every parallel region of a multi-threaded op waits until all of its
threads get a core, which can make a small op a hundred times slower: a run takes one
thread per core the load average leaves free (``free_cores``), unless told. A model that
decodes with a compiled step takes a count its step is compiled for instead, when the
load's is not (``compiles.py``: a compile costs more than a thread more or less).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

DEFAULT_THREADS = 8  # at most, unless told: a 135M model's decode gains little past a few


@dataclass(frozen=True)
class Threads:
    """The CPU threads a run uses, and why that many (the commands' speed lines say both)."""

    n: int
    why: str

    def __str__(self) -> str:
        return f"{self.n} thread{'' if self.n == 1 else 's'} ({self.why})"

    def limit(self):
        """A context in which torch and BLAS use ``n`` threads."""
        return cpu_threads(self.n)


# The share of a core a one-thread run had when the seconds a run is told to expect were
# measured (the bench's steps, the slow rungs' tokens: load averages of 4.7 to 5.5 on 2 cores,
# the run itself one more process: about 2 / 6).
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
    load average), at least 1, at most ``default``."""
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


def choose(asked: int | None = None, model=None, *, flag: str = "--threads") -> Threads:
    """``asked``, else one thread per core the load average leaves free (at most
    ``DEFAULT_THREADS``); where ``model`` decodes with a compiled step, a count its step is
    cached for instead, when the load's is not. ``flag`` names the option that sets it."""
    if asked:
        return Threads(asked, flag)
    cores = os.cpu_count() or 1
    n = free_cores(DEFAULT_THREADS)
    if model is not None:
        from . import compiles

        if compiles.compiles(model):
            cached = compiles.cached_counts(model, min(cores, DEFAULT_THREADS))
            if cached and n not in cached:
                m = min(cached, key=lambda c: (abs(c - n), c))  # the nearest, then the fewer
                return Threads(m, f"the count its cached decode step is compiled for; {flag} {n}, as the load average gives, would compile one")  # fmt: skip
    if n == cores:
        return Threads(n, "every core")
    if n == DEFAULT_THREADS:
        return Threads(n, f"at most {n} by default; {flag} {cores} for every core")
    load = os.getloadavg()[0]  # what free_cores read: other processes' share of the cores
    return Threads(n, f"load average {load:.1f} on {cores} cores; {flag} {cores} for every core")
