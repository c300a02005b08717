"""What the machine is, and what its matmul peak and copy bandwidth are in this run.

The "% peak" column divides a level's GFLOP/s by the rate of one large dense
matmul measured in the same process, just before the levels run: a float32
``torch.matmul`` on the CPU, a bf16 one on CUDA. That is an *achieved* peak,
not the datasheet's, so a level can be compared with the best this machine
did on the same day under the same load.

Decoding one token reads every weight and the whole KV cache for a handful of
FLOPs, so its ceiling is memory bandwidth, not the matmul peak: the "% bw"
column divides the bytes a generation reads per second by the rate of one
large ``copy_`` (bytes read plus bytes written), measured the same way.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from .flops import matmul_flops
from .timing import Stats, TimingPolicy, cpu_timer, cuda_timer, measure


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


@dataclass(frozen=True)
class Bandwidth:
    """The measured copy rate: ``2 * nbytes`` moved (read and written) per call."""

    nbytes: int
    device: str
    stats: Stats

    @property
    def gbs(self) -> float:
        """GB/s of the fastest sample (1 GB = 1e9 bytes), read plus written."""
        return 2 * self.nbytes / self.stats.min / 1e9


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
