"""The benchmark harness: one place that checks, warms up, synchronises, repeats, and reports.

A level contributes only callables (its ``attention``, its models); everything
that turns a call into a number lives here, one idea a module, in the order a
case meets them:

* ``subjects``             who is measured: a level, or a peer beside it, through one adapter;
* ``attention_scenarios``  the attention workloads, and ``ring`` across processes;
* ``model_scenarios``      the model workloads: forward, generation, batching, varlen, training;
* ``flops``                what a call costs: FLOP and byte formulas, with their sources;
* ``reference``            what is right: the float64 reference, the error, each dtype's bound;
* ``real_model``           the real model's prompt and decode, per weight format;
* ``startup``              a cached ``ladder chat``'s seconds to its first token, a process each;
* ``serve``                ``ladder serve`` under load: clients at once, random arrivals, a shared prefix;
* ``speculative``          speculative decoding on the real model: each draft's speed-up, beside its formula;
* ``plan``                 what a run measures: sizes, the size budget, computed figures;
* ``runner``               the sweep: screen, check, then time every case;
* ``measure``              how a call becomes numbers: timing, peak memory, the machine's ceilings;
* ``records``              the record, its JSON, its numbers as text, ratios read off records;
* ``report``               the tables and the ratios a run ends with; ``plot`` the PNG.

``test_ladder.py`` hands the same cases to pytest-benchmark. The ``ladder``
command (``ladder/``) runs the harness, and the docs' generated tables
(``docs/tools/``) read its JSON; nothing here imports either.

Run ``ladder bench`` (or ``python -m ladder bench``); docs/benchmarks.md
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
    "real-model",
    "startup",
    "serve",
    "speculative",
)
"""Scenario groups selectable with ``--scenario``, in the order they run (here, so that the
``ladder`` parser lists them without importing the harness)."""
