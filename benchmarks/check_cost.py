"""The check of ``k`` guesses, in decode steps: what speculative decoding's pass costs.

Speculative decoding (docs/speculative.md) pays one pass of ``k + 1`` tokens for up to
``k + 1`` tokens, so what it buys is bounded by that pass's cost over a one-token step.
Level 3's compiled passes on SmolLM2, float32, one thread: for ``T = k + 1`` from 2 to 9,
the pass of ``T`` tokens a row (``prepare_decode(1, T)``) and the decode step are timed in
turn, from the same cache, each sample the median of ``REPEATS`` calls; the record is
the pass's time in steps, beside its two limits:

* the read: both read every weight once, so a pass costs at least one step;
* the arithmetic: ``T`` tokens of ``2 * weights`` FLOPs at the run's own matmul peak
  (a large float32 GEMM, one thread), over the step's measured time.

A pass is at its limit when it costs the larger of the two.
"""

from __future__ import annotations

import statistics
import time

from .records import OK, Record

TOKENS = range(2, 10)  # T = k + 1: one to eight guesses
TOKENS_QUICK = (3,)  # the quick run: the commands' default of two guesses
PROMPT = 96  # positions in the cache before the pass: a short chat's
REPEATS = 9


def check_cost_records(model, config, compiles: list[str], quick: bool) -> list[Record]:
    """Two records a ``T``: the compiled pass of ``T`` tokens (its figures: its cost in steps
    and the two limits) and the step timed in turn with it (both prepared by the caller:
    ``prepare_decode(1)`` and ``prepare_decode(1, T)``); the report's ratio is the cost."""
    import torch

    from .flops import matmul_params
    from .measure import TimingPolicy, measure_matmul_peak

    peak = measure_matmul_peak("cpu", "float32", 1024, TimingPolicy(min_repeat=5)).stats
    flops_per_s = 2 * 1024**3 / peak.min
    flops_per_token = 2.0 * matmul_params(config)
    prompt = torch.arange(1, PROMPT + 1)[None] % config.vocab_size  # (1, PROMPT)
    _, cache = model.prefill(prompt)

    def timed(T: int) -> float:
        ids = torch.ones(1, T, dtype=torch.long)  # (1,T)
        positions = torch.arange(PROMPT, PROMPT + T)[None]  # (1,T)
        start = time.perf_counter()
        model.transformer(ids, positions, cache)  # (1,T,V)
        seconds = time.perf_counter() - start
        cache.rollback(PROMPT)
        return seconds

    records = []
    for T in TOKENS_QUICK if quick else TOKENS:
        timed(1), timed(T)  # warm-up
        steps, passes = [], []
        for _ in range(REPEATS):  # in turn: the machine's moods reach both alike
            steps.append(timed(1))
            passes.append(timed(T))
        step_s, pass_s = statistics.median(steps), statistics.median(passes)
        arithmetic = T * flops_per_token / flops_per_s / step_s  # in steps
        figures = {"steps": pass_s / step_s, "read_limit": 1.0, "arithmetic_limit": arithmetic}
        note = (
            f"T = {T}: {pass_s / step_s:.2f} steps ({pass_s * 1e3:.1f} ms against a step's "
            f"{step_s * 1e3:.1f} ms); limits: read 1 step, arithmetic {arithmetic:.2f} steps "
            f"(at {flops_per_s / 1e9:.0f} GFLOP/s); " + "; ".join(compiles)
        )
        for scenario, samples, note_of in (
            ("speculative check", passes, note),
            ("speculative check step", steps, f"the decode step, timed in turn with T = {T}"),
        ):
            records.append(
                Record(
                    level="level3:compiled",
                    scenario=scenario,
                    device="cpu",
                    dtype="float32",
                    shape={"T": T},
                    status=OK,
                    median_s=statistics.median(samples),
                    q1_s=min(samples),
                    q3_s=max(samples),
                    min_s=min(samples),
                    max_s=max(samples),
                    repeats=REPEATS,
                    description="SmolLM2, float32, 1 thread: a pass of T tokens, a step",
                    note=note_of,
                    figures=figures if scenario == "speculative check" else {},
                )  # fmt: skip
            )
    return records
