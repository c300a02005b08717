"""What a run measures: the sizes per scenario, the size budget and the timing policy.

Two plans for the CPU (the default sweep and ``--quick``) and one for CUDA.
The sweep is over sequence length ``T``; the sizes are chosen so the default
run takes about three minutes on two cores and ``--quick`` under ninety
seconds, with every level measured at the sizes it can manage.

The size budget
---------------
Level 0 (pure Python) and the Triton interpreter are thousands of times
slower than the rest, so each kind of backend has a ``Budget``: a cap on the
estimated work of one call (GFLOP, from ``benchmarks/flops.py``), and a cap
on the predicted time of one call, extrapolated from the previous size of the
same scenario at the measured rate. A size over either cap is not run and
shows as "skipped (budget)", so a slow level runs the small sizes and never
hangs the sweep.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from levels.common.config import TransformerConfig

from .backends import Backend
from .scenarios import Attention, DecoderForward, Generate, VarlenBatch, Workload
from .timing import TimingPolicy

SCENARIOS = ("attention", "attention-bwd", "decoder", "generate", "varlen")
"""Scenario groups selectable with ``--scenario``; each expands to one or two record scenarios."""


@dataclass(frozen=True)
class Budget:
    """Caps on one call: estimated work and time predicted from the previous size."""

    max_gflop: float = float("inf")
    max_call_s: float = float("inf")


@dataclass(frozen=True)
class Plan:
    """Everything a run needs besides the levels: workloads, budgets, timing."""

    workloads: dict[str, list[Workload]]  # scenario group -> sizes, smallest first
    budgets: dict[str, Budget] = field(default_factory=dict)  # by budget_key(backend)
    timing: TimingPolicy = TimingPolicy()
    peak_n: int = 2048  # matmul size for the peak

    def budget_for(self, backend: Backend) -> Budget:
        return self.budgets.get(budget_key(backend), Budget())

    def only(self, groups: list[str]) -> Plan:
        """The same plan restricted to some scenario groups."""
        unknown = set(groups) - set(SCENARIOS)
        if unknown:
            raise ValueError(f"unknown scenario {sorted(unknown)}; choose from {SCENARIOS}")
        return replace(self, workloads={g: w for g, w in self.workloads.items() if g in groups})


def budget_key(backend: Backend) -> str:
    """``"interpreted"`` for the Triton interpreter, otherwise the backend's array kind."""
    return "interpreted" if backend.interpreted else backend.kind


def bench_model(max_seq_len: int = 2048) -> TransformerConfig:
    """The model of the decoder, generation and varlen scenarios.

    Small enough that level 1 generates without a cache in about a second on
    two cores, with GPT-2's head width (Dh = 64) so its attention has the
    same shape per head as the attention scenario's.
    """
    return TransformerConfig(
        vocab_size=512, d_model=128, n_heads=2, d_ff=512, n_layers=2, max_seq_len=max_seq_len
    )


def varlen_lengths(n: int, lo: int, hi: int, seed: int = 0) -> tuple[int, ...]:
    """``n`` sequence lengths drawn uniformly from ``[lo, hi]``."""
    return tuple(int(x) for x in np.random.default_rng(seed).integers(lo, hi + 1, size=n))


def _workloads(
    *,
    attn_T: list[int],
    bwd_T: list[int],
    model_T: list[int],
    gen: tuple[int, int],
    varlen: tuple[int, int, int, int],
    B: int,
    H: int,
    Dh: int,
    causal: bool,
) -> dict[str, list[Workload]]:
    config = bench_model(max(max(model_T), sum(gen), varlen[2], 16))
    prompt, new = gen
    n, lo, hi, batch = varlen
    lengths = varlen_lengths(n, lo, hi)
    return {
        "attention": [Attention(B, H, T, Dh, causal=causal) for T in attn_T],
        "attention-bwd": [Attention(B, H, T, Dh, causal=causal, backward=True) for T in bwd_T],
        "decoder": [DecoderForward(config, 1, T) for T in model_T],
        "generate": [Generate(config, 1, prompt, new, use_cache=c) for c in (False, True)],
        "varlen": [VarlenBatch(config, lengths, batch, bucketed=b) for b in (False, True)],
    }


def cpu_plan(
    *, quick: bool = False, seq_lens: list[int] | None = None, causal: bool = True
) -> Plan:
    """The CPU sweep: T = 32 .. 4096 by default, a few sizes with ``quick``."""
    if quick:
        attn_T = seq_lens or [32, 128, 512, 1024]
        workloads = _workloads(
            attn_T=attn_T,
            bwd_T=[t for t in attn_T if t <= 512],
            model_T=seq_lens or [8, 128, 512],
            gen=(8, 16),
            varlen=(12, 8, 64, 4),
            B=1,
            H=8,
            Dh=64,
            causal=causal,
        )
        timing = TimingPolicy(warmup=1, min_repeat=3, max_repeat=10, min_time_s=0.08)
        budgets = {
            "python": Budget(max_gflop=0.01, max_call_s=0.5),
            "interpreted": Budget(max_gflop=0.02, max_call_s=1.0),
            "numpy": Budget(max_call_s=1.0),
            "torch": Budget(max_call_s=1.0),
        }
        return Plan(workloads, budgets, timing, peak_n=1024)
    attn_T = seq_lens or [32, 64, 128, 256, 512, 1024, 2048, 4096]
    workloads = _workloads(
        attn_T=attn_T,
        bwd_T=[t for t in attn_T if t <= 2048],
        model_T=seq_lens or [8, 32, 128, 512, 1024, 2048],
        gen=(32, 96),
        varlen=(32, 8, 128, 8),
        B=1,
        H=8,
        Dh=64,
        causal=causal,
    )
    timing = TimingPolicy(warmup=1, min_repeat=5, max_repeat=30, min_time_s=0.5)
    budgets = {
        "python": Budget(max_gflop=0.04, max_call_s=2.0),
        "interpreted": Budget(max_gflop=0.2, max_call_s=2.0),
        "numpy": Budget(max_call_s=2.0),
        "torch": Budget(max_call_s=2.0),
    }
    return Plan(workloads, budgets, timing, peak_n=2048)


def cuda_plan(
    *, quick: bool = False, seq_lens: list[int] | None = None, causal: bool = True
) -> Plan:
    """The GPU sweep: longer sequences, more heads, CUDA-event timing with more samples."""
    attn_T = seq_lens or ([512, 2048, 8192] if quick else [256, 512, 1024, 2048, 4096, 8192, 16384])
    workloads = _workloads(
        attn_T=attn_T,
        bwd_T=attn_T,
        model_T=seq_lens or ([128, 1024] if quick else [128, 512, 1024, 2048, 4096]),
        gen=(128, 128),
        varlen=(128, 16, 1024, 16),
        B=4,
        H=16,
        Dh=64,
        causal=causal,
    )
    timing = TimingPolicy(warmup=5, min_repeat=10, max_repeat=100, min_time_s=0.2)
    budgets = {
        "python": Budget(max_gflop=0.04, max_call_s=2.0),
        "numpy": Budget(max_call_s=2.0),
        "torch": Budget(max_call_s=2.0),
    }
    return Plan(workloads, budgets, timing, peak_n=8192)


def default_plan(
    device: str, *, quick: bool = False, seq_lens: list[int] | None = None, causal: bool = True
) -> Plan:
    make = cuda_plan if device.startswith("cuda") else cpu_plan
    return make(quick=quick, seq_lens=seq_lens, causal=causal)
