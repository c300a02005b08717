"""What a run measures: the sizes per scenario, the size budget and the timing policy.

Four ``Sizes`` declarations: ``CPU`` (the default sweep), ``CPU_QUICK``
(``--quick``), ``CUDA`` and ``CUDA_QUICK``. The sweep is over sequence length
``T``; the CPU sizes are chosen so that ``--quick`` takes minutes on two cores
(most of it the real model's scenarios, the servers' and the compiles they need;
docs/benchmarks.md has a measured run), with every level measured at the sizes it
can manage. ``Sizes.seconds`` says what each step should take, for the run's
progress.

The size budget
---------------
Level 0 (pure Python) and the Triton interpreter are thousands of times
slower than the rest, so each kind of subject has a ``Budget``: a cap on the
estimated work of one call (GFLOP, from ``benchmarks/flops.py``), and a cap
on the predicted time of one call, extrapolated from the previous size of the
same scenario (or, for a scenario's first size, from the best rate the level
reached in a similar scenario; see ``runner.Pace``). A size over either cap is not run and
shows as "skipped (budget)", so a slow level runs the small sizes and never
hangs the sweep.

Computed figures
----------------
Two scenarios compute a figure rather than time a call (recorded with status
``"figure"``), and the ring scenario times its own processes; the plan lists
the functions that make their records beside the timed workloads:

* ``kv cache``: KV-cache bytes per token of multi-head, grouped-query and
  multi-query attention, read off the buffers level 3's static cache allocates
  for TinyLlama-1.1B's attention shape (and checked against the formula);
* ``padding waste``: of length bucketing on a long-tailed mix of lengths:
  10,000 lengths drawn from a Pareto(1.5) distribution (most sequences short,
  a few very long, as in real corpora; capped at 2048), batched in arrival
  order or by length (``levels.common.bucketing``), with a fixed number of
  sequences per batch or a budget of padded tokens per batch. The timed
  ``varlen`` scenario measures what such waste costs; this says how much of
  it there is at the scale of a real data set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

import levels
from levels.common.bucketing import make_batches, padding_waste
from levels.common.config import TransformerConfig
from levels.common.params import kv_bytes_per_token

from . import SCENARIOS
from .attention_scenarios import Attention, ring_records
from .measure import TimingPolicy
from .model_scenarios import DecoderForward, Generate, TrainStep, VarlenBatch
from .real_model import Compile, RealModel
from .real_model import workloads as real_model_workloads
from .records import FIGURE, Record
from .serve import serve_compiles, serve_records
from .speculative import speculative_compiles, speculative_records
from .startup import startup_compiles, startup_records
from .subjects import Subject

Workload = Attention | DecoderForward | Generate | VarlenBatch | TrainStep | RealModel


@dataclass(frozen=True)
class Budget:
    """Caps on one call: estimated work and time predicted from the previous size."""

    max_gflop: float = float("inf")
    max_call_s: float = float("inf")


@dataclass(frozen=True)
class Figure:
    """A step of computed figures: the function making its records, and the compiled passes
    it needs (compiled in the step where the user's cache lacks them)."""

    make: Callable[[], list[Record]]
    compiles: tuple[Compile, ...] = ()


@dataclass(frozen=True)
class Plan:
    """Everything a run needs besides the levels: workloads, budgets, timing."""

    workloads: dict[str, list[Workload]]  # scenario group -> sizes, smallest first
    budgets: dict[str, Budget] = field(default_factory=dict)  # by budget_key(subject)
    timing: TimingPolicy = TimingPolicy()
    peak_n: int = 2048  # matmul size for the peak
    # Computed figures (no timing) by scenario group.
    figures: dict[str, list[Figure]] = field(default_factory=dict)
    # Scenarios whose calls may take longer than the cap, by this factor (the budget's work
    # cap is unchanged): a comparison that is only worth its longest size.
    stretch: dict[str, float] = field(default_factory=dict)
    # What a step should take, in seconds, compiles aside (``Sizes.seconds``): the weights
    # of a run's progress.
    seconds: dict[str, float] = field(default_factory=dict)

    def budget_for(self, subject: Subject, scenario: str = "") -> Budget:
        budget = self.budgets.get(budget_key(subject), Budget())
        factor = self.stretch.get(scenario, 1.0)
        return replace(budget, max_call_s=budget.max_call_s * factor)

    def step_seconds(self, group: str) -> float:
        """What a step of ``group`` (a case of its, or its computed figures; ``"peak"`` and
        ``"ceilings"`` the run's first and last) should take, compiles aside."""
        return self.seconds.get(group, self.seconds.get("case", CASE_S))

    def only(self, groups: list[str]) -> Plan:
        """The same plan restricted to some scenario groups."""
        unknown = set(groups) - set(SCENARIOS)
        if unknown:
            raise ValueError(f"unknown scenario {sorted(unknown)}; choose from {SCENARIOS}")
        return replace(
            self,
            workloads={g: w for g, w in self.workloads.items() if g in groups},
            figures={g: f for g, f in self.figures.items() if g in groups},
        )


CASE_S = 0.3  # seconds: a step the plan's sizes say nothing of (a small case: check, time)


def budget_key(subject: Subject) -> str:
    """``"interpreted"`` for the Triton interpreter, otherwise the subject's array kind."""
    return "interpreted" if subject.interpreted else subject.kind


def bench_model(max_seq_len: int = 2048) -> TransformerConfig:
    """The model of the decoder, generation and varlen scenarios.

    Small enough that level 1 generates without a cache in about a second on
    two cores, with GPT-2's head width (Dh = 64) so its attention has the
    same shape per head as the attention scenario's.
    """
    return TransformerConfig(
        vocab_size=512, d_model=128, n_heads=2, d_ff=512, n_layers=2, max_seq_len=max_seq_len
    )


def llama_model(max_seq_len: int) -> TransformerConfig:
    """The model of the comparison with ``transformers``: a small Llama (RMSNorm, SwiGLU,
    RoPE, untied head) that ``levels.hf.save`` writes as a ``LlamaForCausalLM``."""
    return TransformerConfig(
        vocab_size=1024,
        d_model=256,
        n_heads=8,
        d_ff=1024,
        n_layers=4,
        max_seq_len=max_seq_len,
        norm="rmsnorm",
        ffn="swiglu",
        bias=False,
        scale_embeddings=False,
        tie_embeddings=False,
    )


def varlen_lengths(n: int, lo: int, hi: int, seed: int = 0) -> tuple[int, ...]:
    """``n`` sequence lengths drawn uniformly from ``[lo, hi]``."""
    return tuple(int(x) for x in np.random.default_rng(seed).integers(lo, hi + 1, size=n))


@dataclass(frozen=True)
class Sizes:
    """The sizes and limits of one plan, declared in one place."""

    attn_T: tuple[int, ...]  # attention sweep
    bwd_max_T: int  # forward + backward only up to here
    window: tuple[int, tuple[int, ...]]  # (W, the T sweep) of sliding-window attention
    decode: tuple[int, tuple[int, ...]]  # (H, the S sweep) of one query against S keys, B = 1
    model_T: tuple[int, ...]  # decoder forward sweep
    gen: tuple[int, int]  # (prompt, new tokens)
    batching: tuple[int, int, int, int]  # (prompts, shortest, longest, new tokens)
    llama: tuple[tuple[int, ...], int, int]  # (batch sizes, prompt, new tokens), vs transformers
    varlen: tuple[int, int, int, int]  # (sequences, shortest, longest, batch size)
    train: tuple[int, int]  # (batch, tokens per row) of the training step
    ring: tuple[int, ...]  # sequence lengths of ring attention across processes
    B: int
    H: int
    Dh: int
    timing: TimingPolicy
    budgets: dict[str, Budget]
    peak_n: int
    seconds: dict[str, float] = field(default_factory=dict)  # Plan.seconds


CPU = Sizes(
    attn_T=(32, 64, 128, 256, 512, 1024, 2048, 4096),
    bwd_max_T=2048,
    window=(256, (1024, 2048, 8192)),
    decode=(8, (1024, 8192)),
    model_T=(8, 32, 128, 512, 1024, 2048),
    gen=(64, 128),
    batching=(8, 8, 64, 128),
    llama=((1, 8), 64, 128),
    varlen=(32, 8, 128, 8),
    train=(8, 128),
    ring=(1024, 4096),
    B=1,
    H=8,
    Dh=64,
    timing=TimingPolicy(warmup=1, min_repeat=3, max_repeat=30, min_time_s=0.5),
    budgets={
        "python": Budget(max_gflop=0.04, max_call_s=2.0),
        "interpreted": Budget(max_gflop=0.2, max_call_s=2.0),
        "numpy": Budget(max_call_s=2.0),
        "torch": Budget(max_call_s=2.0),
    },
    peak_n=2048,
    # Scaled from the quick run's (below) by each step's work: the full run was not timed
    # step by step. The calibration of the progress bar corrects the scale as it runs.
    seconds={
        "compile": 120.0,
        "peak": 10.0,
        "case": 1.0,
        "transformers": 3.0,
        "real-model": 10.0,
        "ring": 20.0,
        "startup": 90.0,
        "serve": 400.0,
        "speculative": 550.0,
        "ceilings": 20.0,
    },  # fmt: skip
)

CPU_QUICK = replace(
    CPU,
    attn_T=(32, 128, 512, 1024),
    bwd_max_T=512,
    window=(256, (1024,)),  # a longer T: seconds a call of full causal at levels 1 and 2
    decode=(8, (1024,)),
    model_T=(8, 128, 512),
    gen=(8, 16),
    batching=(4, 4, 16, 8),
    llama=((1, 4), 16, 16),
    varlen=(12, 8, 64, 4),
    train=(4, 32),
    ring=(512,),
    timing=TimingPolicy(warmup=1, min_repeat=3, max_repeat=10, min_time_s=0.08),
    budgets={
        "python": Budget(max_gflop=0.01, max_call_s=0.5),
        "interpreted": Budget(max_gflop=0.02, max_call_s=1.0),
        "numpy": Budget(max_call_s=1.0),
        "torch": Budget(max_call_s=1.0),
    },
    peak_n=1024,
    # A step's seconds in the quick run of 2026-12-07 (2 cores, a load average of 5.5 at its
    # start, 5 to 7 through it: measure.MEASURED_SHARE; a run at another load scales them,
    # ladder/bench.py, and its pace corrects the rest as it goes), its compiles left out: a case about 0.3 s; a real-model case
    # 1.4 to 9 s (the first prompt computes the float64 reference; transformers' first
    # loads its model, 15 s; a decode times the read stream beside it, a second or two
    # more); the servers' 170 s; the speculative runs' 28 s.
    seconds={
        "compile": 120.0,  # one of level 3's passes, where none was timed here (79 to 161 s)
        "peak": 6.0,
        "case": 0.3,
        "transformers": 1.1,
        "real-model": 7.0,
        "kv-cache": 0.1,
        "varlen": 0.3,
        "ring": 8.0,
        "startup": 23.0,
        "serve": 170.0,
        "speculative": 28.0,
        "ceilings": 6.0,
    },  # fmt: skip
)

# On a GPU: longer sequences, more heads, more warm-up (compilation and autotuning
# happen in the first calls) and more samples, since CUDA-event samples are cheap.
CUDA = Sizes(
    attn_T=(256, 512, 1024, 2048, 4096, 8192, 16384),
    bwd_max_T=16384,
    window=(256, (2048, 8192, 32768)),
    decode=(16, (4096, 16384, 65536)),
    model_T=(128, 512, 1024, 2048, 4096),
    gen=(128, 128),
    batching=(32, 16, 512, 128),
    llama=((1, 8, 32), 128, 128),
    varlen=(128, 16, 1024, 16),
    train=(16, 512),
    ring=(8192, 32768),
    B=4,
    H=16,
    Dh=64,
    timing=TimingPolicy(warmup=5, min_repeat=10, max_repeat=100, min_time_s=0.2),
    budgets={
        "python": Budget(max_gflop=0.04, max_call_s=2.0),
        "numpy": Budget(max_call_s=2.0),
        "torch": Budget(max_call_s=2.0),
    },
    peak_n=8192,
)

CUDA_QUICK = replace(
    CUDA, attn_T=(512, 2048, 8192), bwd_max_T=8192, window=(256, (8192,)), model_T=(128, 1024)
)


def plan_from(
    sizes: Sizes,
    *,
    seq_lens: list[int] | None = None,
    causal: bool = True,
    device: str = "cpu",
) -> Plan:
    """The workloads of ``sizes``; ``seq_lens`` replaces both T sweeps."""
    quick = sizes is CPU_QUICK or sizes is CUDA_QUICK
    attn_T = tuple(seq_lens) if seq_lens else sizes.attn_T
    model_T = tuple(seq_lens) if seq_lens else sizes.model_T
    prompt, new = sizes.gen
    n, lo, hi, batch = sizes.varlen
    prompts, shortest, longest, batch_new = sizes.batching
    llama_B, llama_prompt, llama_new = sizes.llama
    config = bench_model(max(max(model_T), prompt + new, hi, longest + batch_new, 16))
    llama = llama_model(llama_prompt + llama_new)
    prompt_lengths = varlen_lengths(prompts, shortest, longest, seed=1)
    lengths = varlen_lengths(n, lo, hi)
    attention = [Attention(sizes.B, sizes.H, T, sizes.Dh, causal=causal) for T in attn_T]
    W, window_T = sizes.window
    # Each T twice: the window, then a window of T keys, which is full causal attention
    # (the same code path a window that binds nothing takes at every level).
    window = [Attention(sizes.B, sizes.H, T, sizes.Dh, window=w) for T in window_T for w in (W, T)]
    workloads: dict[str, list[Workload]] = {
        "attention": attention,
        "attention-bwd": [replace(a, backward=True) for a in attention if a.T <= sizes.bwd_max_T],
        "window": window,
        "decode": [Attention(1, sizes.decode[0], 1, sizes.Dh, S=S) for S in sizes.decode[1]],
        "decoder": [DecoderForward(config, 1, T) for T in model_T],
        # Uncached first: its time at the best rate of the decoder forward is the honest
        # budget estimate; the cached run's per-step overhead would overstate it.
        "generate": [Generate(config, 1, prompt, new, use_cache=c) for c in (False, True)],
        # One at a time first, as uncached above: the slower run sets the honest pace.
        "batching": [
            Generate(
                config,
                prompts,
                max(prompt_lengths),
                batch_new,
                use_cache=True,
                lengths=prompt_lengths,
                one_at_a_time=alone,
            )
            for alone in (True, False)
        ],  # fmt: skip
        "transformers": [
            Generate(llama, B, llama_prompt, llama_new, use_cache=True, label="generate llama")
            for B in llama_B
        ],
        "varlen": [VarlenBatch(config, lengths, batch, bucketed=b) for b in (False, True)],
        "train": [TrainStep(config, *sizes.train)],
        "real-model": real_model_workloads(quick=quick),
    }

    def on_a_cpu(records, compiles) -> list[Figure]:  # the commands' scenarios: a CPU's
        return [] if device.startswith("cuda") else [Figure(partial(records, quick), compiles)]

    figures = {
        "kv-cache": [Figure(kv_cache_figures)],
        "varlen": [Figure(padding_figures)],
        "ring": [Figure(partial(ring_records, sizes.ring, device))],
        "startup": on_a_cpu(startup_records, startup_compiles(quick)),
        "serve": on_a_cpu(serve_records, serve_compiles(quick)),
        "speculative": on_a_cpu(speculative_records, speculative_compiles(quick)),
    }
    # Full causal attention at the window's longest T is the point of the comparison; at
    # level 3 on two cores it takes about 3 s a call, past the CPU cap of 2 s. A batch of 8
    # is predicted from the batch of 1 by its FLOPs, 8x, but decoding reads the same
    # weights for any batch and takes about twice as long: let the prediction be 3x off.
    # The real model's calls are a prefill or 16 decode steps of a 135M-parameter model:
    # seconds, and tens of seconds in bfloat16 on a CPU without bfloat16 arithmetic; the
    # workload the ladder is for, so measured at every format rather than skipped.
    stretch = {"attention window": 2.0, "generate llama": 3.0}
    stretch |= {w.scenario: 15.0 for w in workloads["real-model"]}
    return Plan(
        workloads,
        sizes.budgets,
        sizes.timing,
        peak_n=sizes.peak_n,
        figures=figures,
        stretch=stretch,
        seconds=sizes.seconds,
    )


def default_plan(
    device: str, *, quick: bool = False, seq_lens: list[int] | None = None, causal: bool = True
) -> Plan:
    """The plan ``ladder bench`` runs: ``CPU`` / ``CPU_QUICK`` / ``CUDA`` / ``CUDA_QUICK``."""
    if device.startswith("cuda"):
        sizes = CUDA_QUICK if quick else CUDA
    else:
        sizes = CPU_QUICK if quick else CPU
    return plan_from(sizes, seq_lens=seq_lens, causal=causal, device=device)


# --------------------------------------------------------------------------- computed figures

PARETO_N, PARETO_SHAPE, PARETO_SCALE, PARETO_MAX = 10_000, 1.5, 32, 2048


def pareto_lengths(seed: int = 0) -> np.ndarray:
    """``PARETO_N`` sequence lengths, at least 1 and at most ``PARETO_MAX``."""
    rng = np.random.default_rng(seed)
    lengths = 1 + (rng.pareto(PARETO_SHAPE, PARETO_N) * PARETO_SCALE).astype(int)
    return np.minimum(lengths, PARETO_MAX)


def padding_figures() -> list[Record]:
    """Padded / real positions, arrival order vs bucketed, per batching rule."""
    lengths = pareto_lengths()
    shape = {"N": len(lengths), "median": int(np.median(lengths)), "max": int(lengths.max())}
    records = []
    for rule, kw in (
        ("batch_size=32", {"batch_size": 32}),
        ("max_tokens=16384", {"max_tokens": 16384}),
    ):
        for bucketed in (False, True):
            waste = padding_waste(make_batches(lengths, bucketed=bucketed, **kw), lengths)
            records.append(
                Record(
                    level="levels.common.bucketing",
                    scenario="padding waste",
                    device="-",
                    dtype="-",
                    shape=shape,
                    status=FIGURE,
                    padding_waste=waste,
                    description="make_batches + padding_waste",
                    note=f"{rule}, {'bucketed' if bucketed else 'arrival order'}",
                )
            )
    return records


# TinyLlama-1.1B's attention shape; its checkpoint uses 4 KV heads.
KV_MODEL = TransformerConfig(
    vocab_size=32000, d_model=2048, n_heads=32, d_ff=5632, n_layers=22, max_seq_len=16
)
KV_HEADS = (("MHA", 32), ("GQA", 4), ("MQA", 1))
CONTEXT = 2048  # tokens, for the note's per-sequence figure


def kv_cache_figures() -> list[Record]:
    """Bytes per cached position for MHA, GQA and MQA, measured on allocated buffers."""
    import torch

    static_cache = levels.load("level3_sdpa_flash").StaticKVCache
    records = []
    for kind, n_kv in KV_HEADS:
        config = replace(KV_MODEL, n_kv_heads=n_kv)
        cache = static_cache(config, 1, dtype=torch.bfloat16)
        per_token = (cache.k.nbytes + cache.v.nbytes) // (cache.batch * cache.capacity)
        formula = kv_bytes_per_token(config, torch.bfloat16.itemsize)
        if per_token != formula:  # the buffers are the truth; the formula must agree
            raise AssertionError(f"{kind}: allocated {per_token} B/token, formula {formula}")
        records.append(
            Record(
                level="level3_sdpa_flash.StaticKVCache",
                scenario="kv cache",
                device="-",
                dtype="bfloat16",
                shape={"L": config.n_layers, "H": config.n_heads, "Hkv": n_kv, "Dh": config.d_head},
                status=FIGURE,
                cache_bytes_per_token=per_token,
                description="StaticKVCache(k, v).nbytes / (B C)",
                note=f"{kind}; {per_token * CONTEXT / 2**20:.4g} MiB per {CONTEXT}-token sequence",
            )
        )
    return records
