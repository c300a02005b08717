"""Peak memory of one call, measured by whichever method sees the level's allocations.

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
"""

from __future__ import annotations

import contextlib
import os
import sys
import tracemalloc
from collections.abc import Callable, Iterator

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
