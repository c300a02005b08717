"""The benchmark harness: one place that warms up, synchronises, repeats, and reports.

A level contributes only callables (its ``attention``, its models); everything
that turns a call into a number lives here:

* ``timing``    warm-up, repetition, CUDA-event or wall-clock timing, median and spread;
* ``flops``     the FLOP formulas behind every GFLOP/s figure, with their sources;
* ``memory``    peak memory of one call, by the method that fits the level;
* ``machine``   the matmul peak measured in the same run, and what the CPU is;
* ``backends``  a level (or a PyTorch SDPA backend) seen through one small adapter;
* ``scenarios`` the workloads: attention, decoder forward, generation, bucketing;
* ``runner``    the sweep over levels, scenarios and sizes, with the size budget;
* ``report``    the rich tables and the ratios; ``plot`` the PNG;
* ``cli``       the ``ladder`` command.

Run ``ladder bench`` (or ``python -m benchmarks.cli bench``); docs/benchmarks.md
explains every column.
"""

SCENARIOS = (
    "attention",
    "attention-bwd",
    "window",
    "decode",
    "kv-cache",
    "decoder",
    "generate",
    "batching",
    "transformers",
    "varlen",
    "train",
    "ring",
)
"""Scenario groups selectable with ``--scenario``, in the order they run (here, so that the
``ladder`` parser lists them without importing the harness)."""
