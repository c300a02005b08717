"""Fast checks of the benchmark harness: statistics, FLOP formulas, the budget, the
JSON and the PNG, and a tiny ``ladder bench`` run through ``main``.

Expected numbers are worked out by hand in the comments, never by the harness.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import levels
from benchmarks import flops
from benchmarks.attention_scenarios import Attention
from benchmarks.measure import TimingPolicy, measure, peak_memory, summarize
from benchmarks.plan import Budget, Plan, kv_cache_figures
from benchmarks.records import (
    SKIPPED_BUDGET,
    WRONG,
    Ratio,
    Record,
    fmt_percent,
    read_json,
    read_ratios,
)
from benchmarks.reference import Reference
from benchmarks.report import RATIOS
from benchmarks.runner import run_case
from benchmarks.subjects import level_subject, sdpa_subject
from ladder import cli
from levels.common.config import TransformerConfig

ROOT = Path(__file__).resolve().parent.parent
COMMITTED_RUNS = ("cpu_default.json", "cpu_quick.json")  # in docs/data

FAST = TimingPolicy(warmup=1, min_repeat=2, max_repeat=3, min_time_s=0.0, min_sample_s=0.0)


def _load(name: str):
    try:
        return levels.load(name)
    except levels.LevelUnavailable as exc:
        pytest.skip(str(exc))


# --------------------------------------------------------------------------- statistics


def test_summarize_median_quartiles_and_extremes():
    stats = summarize([4.0, 1.0, 100.0, 3.0, 2.0])
    # Sorted: 1 2 3 4 100. Median is the middle one; numpy's linear quartiles of five
    # values fall exactly on the 2nd and 4th; the outlier moves only the max.
    assert (stats.median, stats.q1, stats.q3, stats.min, stats.max) == (3.0, 2.0, 4.0, 1.0, 100.0)
    assert stats.iqr == 2.0 and stats.n == 5


def test_measure_never_times_the_warm_up_and_loops_short_calls():
    calls = []

    def fake_timer(fn, number):  # a call "takes" 0.5 ms, whatever it is
        calls.append(number)
        return 5e-4

    policy = TimingPolicy(warmup=1, min_repeat=3, max_repeat=4, min_time_s=0.0, min_sample_s=2e-3)
    stats = measure(lambda: None, fake_timer, policy)
    # First one probe call; 2 ms / 0.5 ms = 4 calls per sample; the probe is dropped
    # because it was a single call, and three looped samples follow.
    assert calls == [1, 4, 4, 4]
    assert stats.n == 3 and stats.number == 4 and stats.median == 5e-4


def test_measure_keeps_sampling_until_min_time():
    times = iter([0.1] * 100)
    policy = TimingPolicy(warmup=1, min_repeat=2, max_repeat=50, min_time_s=0.45)
    stats = measure(lambda: None, lambda fn, n: next(times), policy)
    # Samples of 0.1 s each: the fifth brings the measured total to 0.5 s >= 0.45 s.
    assert stats.n == 5


def test_timing_policy_refuses_to_time_the_first_call():
    with pytest.raises(ValueError, match="first call"):
        TimingPolicy(warmup=0)


# --------------------------------------------------------------------------- FLOPs

TINY = TransformerConfig(vocab_size=10, d_model=8, n_heads=2, d_ff=16, n_layers=3)


def test_attention_flops_by_hand():
    # 4 * B*H*T*S*Dh = 4 * 2*3*5*7*11 = 9240; causal counts half.
    assert flops.attention_flops(2, 3, 5, 7, 11, causal=False) == 9240
    assert flops.attention_flops(2, 3, 5, 7, 11, causal=True) == 4620
    # Backward is 2.5x the forward, so forward + backward is 3.5 * 9240.
    assert flops.attention_fwd_bwd_flops(2, 3, 5, 7, 11, causal=False) == 32340


def test_windowed_attention_flops_count_the_pairs_in_the_window():
    # T = S = 5, W = 2: query 0 sees 1 key, the others 2, so 9 pairs; 4 * B*H*9*Dh.
    assert flops.attention_flops(1, 1, 5, 5, 3, causal=True, window=2) == 4 * 9 * 3
    # A window as long as the sequence is causal attention (15 pairs counted as T*S/2).
    assert flops.attention_flops(1, 1, 5, 5, 3, causal=True, window=5) == 4 * 12.5 * 3


def test_model_flops_by_hand():
    # Per layer 4*D^2 + 2*D*F = 256 + 256 = 512; three layers 1536; tied logits V*D = 80.
    assert flops.matmul_params(TINY) == 1616
    # B=2, T=4: 2 * 1616 * 8 tokens = 25856, plus 3 layers of causal attention over
    # H=2, Dh=4: 3 * 4*2*2*4*4*4 / 2 = 1536.
    assert flops.decoder_forward_flops(TINY, 2, 4) == 27392
    # Decode step, B=1, S=3: 2 * 1616 = 3232 plus 3 * 4*1*2*1*3*4 = 288 (not halved).
    assert flops.decode_step_flops(TINY, 1, 3) == 3520


def test_generation_flops_by_hand():
    # Prompt 2, 3 new tokens. Cached: forward(T=2) = 6464 + 3*64 = 6656, then decode
    # steps over S=3 (3520) and S=4 (3232 + 384 = 3616).
    assert flops.generation_flops(TINY, 1, 2, 3, use_cache=True) == 6656 + 3520 + 3616
    # Uncached: forwards over T=2, 3, 4: 6656, 9696 + 432, 12928 + 768.
    assert flops.generation_flops(TINY, 1, 2, 3, use_cache=False) == 6656 + 10128 + 13696


# --------------------------------------------------------------------------- memory


def test_tracemalloc_sees_a_numpy_buffer():
    peak = peak_memory(lambda: np.ones(1_000_000), "tracemalloc")  # 8 MB of float64
    # The buffer plus a few hundred bytes of Python objects around it.
    assert 8_000_000 <= peak < 8_100_000


def test_torch_profiler_sees_the_cpu_allocator():
    def two_buffers():
        a = torch.ones(1_000_000)  # 4 MB float32
        b = a + 1  # another 4 MB while a is alive
        return b

    peak = peak_memory(two_buffers, "torch.profiler")
    if peak is None:
        pytest.skip("this torch build does not expose the profiler's memory records")
    # Both buffers are alive at once; a small allocator rounding is allowed.
    assert 8_000_000 <= peak < 8_100_000


# --------------------------------------------------------------------------- runner


def _plan(budget: Budget) -> Plan:
    return Plan(
        workloads={}, budgets={"python": budget, "numpy": budget, "torch": budget}, timing=FAST
    )


def test_budget_skips_over_the_work_cap_without_running():
    subject = level_subject("level1_numpy", _load("level1_numpy"), "cpu")
    work = Attention(B=1, H=2, T=64, Dh=8)  # 4*2*64*64*8 / 2 = 131072 FLOPs
    record = run_case(
        subject,
        work,
        dtype="float32",
        plan=_plan(Budget(max_gflop=1e-4)),  # 100000 FLOPs < 131072
        reference=Reference(),
        peak=None,
    )
    assert record.status == SKIPPED_BUDGET
    assert record.median_s is None and "GFLOP" in record.note


def test_pace_extrapolates_the_growth_two_sizes_showed():
    from benchmarks.runner import Pace

    subject = level_subject("level1_numpy", _load("level1_numpy"), "cpu")
    # A window of 4: FLOPs grow with T, twice per doubling.
    a, b, c = (Attention(B=1, H=1, T=T, Dh=8, window=4) for T in (64, 128, 256))
    pace = Pace()
    pace.record(subject, a, 1.0)
    assert pace.predict(subject, b) == pytest.approx(1.0 * b.flops() / a.flops())  # one size
    pace.record(subject, b, 4.0)  # but time quadrupled: a (T, S) matrix, not the window
    p = math.log(4.0) / math.log(b.flops() / a.flops())
    assert pace.predict(subject, c) == pytest.approx(4.0 * (c.flops() / b.flops()) ** p)
    # Full causal attention is another series: nothing measured there yet, so the guess
    # is its FLOPs at the best rate seen.
    full = Attention(B=1, H=1, T=256, Dh=8, window=256)
    assert pace.predict(subject, full) == pytest.approx(full.flops() / (a.flops() / 1.0))


def test_budget_skips_a_size_predicted_too_slow():
    from benchmarks.runner import Pace

    subject = level_subject("level1_numpy", _load("level1_numpy"), "cpu")
    small, large = Attention(B=1, H=2, T=16, Dh=8), Attention(B=1, H=2, T=64, Dh=8)
    pace = Pace()
    pace.record(subject, small, 1.0)  # pretend the small size took 1 s
    # The large one is 16x the work, so it would take about 16 s > 5 s.
    record = run_case(
        subject,
        large,
        dtype="float32",
        plan=_plan(Budget(max_call_s=5.0)),
        reference=Reference(),
        peak=None,
        pace=pace,
    )
    assert record.status == SKIPPED_BUDGET and "16 s" in record.note


def test_run_case_measures_and_checks_against_float64():
    subject = level_subject("level2_torch_manual", _load("level2_torch_manual"), "cpu")
    _load("level1_numpy")  # the reference
    work = Attention(B=1, H=2, T=24, Dh=8)
    record = run_case(
        subject, work, dtype="float32", plan=_plan(Budget()), reference=Reference(), peak=None
    )
    assert record.ok, record.status
    assert record.q1_s <= record.median_s <= record.q3_s
    assert record.gflops == pytest.approx(work.flops() / record.median_s / 1e9)
    # float32 softmax-attention of O(1) values: eps = 1.2e-7, a few dozen roundings.
    assert 0 < record.max_error < 1e-5
    assert record.memory_method == "torch.profiler"


def test_sdpa_peer_runs_on_the_cpu_math_backend():
    _load("level1_numpy")
    work = Attention(B=1, H=2, T=24, Dh=8, backward=False)
    record = run_case(
        sdpa_subject("math", "cpu"),
        work,
        dtype="float32",
        plan=_plan(Budget()),
        reference=Reference(),
        peak=None,
    )
    assert record.ok, record.status
    assert record.level == "sdpa:math"
    # Same float32 reasoning as above.
    assert record.max_error < 1e-5


# --------------------------------------------------------------------------- ratios


def _rec(level, scenario, T, median, tokens=None):
    return Record(
        level=level,
        scenario=scenario,
        device="cpu",
        dtype="float32",
        shape={"T": T},
        median_s=median,
        tokens_per_s=tokens,
    )


def _readings(records, start):
    """The report's ratios read off ``records`` whose label starts with ``start``."""
    return [r for r in read_ratios(RATIOS, records) if r.label.startswith(start)]


@pytest.mark.parametrize("run", COMMITTED_RUNS)
def test_the_ratios_of_the_committed_runs_are_those_of_the_ten_old_functions(run):
    """The ratios became data (``report.RATIOS``); on the committed runs their table reads
    exactly as the hand-written functions it replaced made it (tests/data, computed then)."""
    fixture = json.loads((ROOT / "tests" / "data" / "ratios_of_committed_runs.json").read_text())
    records = read_json(ROOT / "docs" / "data" / run)
    got = [
        {"what": r.label, "value": r.value, "ratio": r.shown, "from": r.detail}
        for r in read_ratios(RATIOS, records)
    ]
    assert got == fixture["runs"][run]


L1, L2, L3 = "level1_numpy", "level2_torch_manual", "level3_sdpa_flash"


def test_the_long_prefills_read_level_over_transformers_at_each_prompt_length():
    def prefill(level, P, tokens):
        record = _rec(level, "real prefill float32", 0, P / tokens, tokens)
        record.shape = {"P": P, "new": 0, "threads": 1}
        return record

    records = [prefill(L3, 256, 300.0), prefill("transformers", 256, 250.0),
               prefill(L3, 2048, 200.0), prefill("transformers", 2048, 250.0)]  # fmt: skip
    got = [(r.label, r.value) for r in _readings(records, "real prefill")]
    assert got == [  # 300 / 250 and 200 / 250 tokens a second
        (f"real prefill P=256: {L3} / transformers tok/s", 1.2),
        (f"real prefill P=2048: {L3} / transformers tok/s", 0.8),
    ]


def test_each_level_is_over_the_next_one_up_at_the_longest_common_length():
    records = [
        _rec(L1, "attention fwd", 128, 2.0),
        _rec(L1, "attention fwd", 1024, 8.0),
        _rec(L2, "attention fwd", 128, 1.0),
        _rec(L2, "attention fwd", 1024, 2.0),
        _rec(L2, "attention fwd", 2048, 5.0),
        _rec(L3, "attention fwd", 2048, 0.5),
        _rec("sdpa:math", "attention fwd", 2048, 1.0),
    ]
    one, two, peer = _readings(records, "attention fwd:")
    assert (one.label, one.value, one.detail) == (
        f"attention fwd: {L1} / {L2}",
        4.0,
        "T=1024: 8 s / 2 s",
    )
    assert (two.value, two.detail) == (10.0, "T=2048: 5 s / 500 ms")  # level 2 over level 3
    # Then the top rung over each peer: 0.5 s / 1 s.
    assert peer.label == f"attention fwd: {L3} / sdpa:math" and peer.value == 0.5


def test_kv_cache_and_bucketing_ratios_pair_each_level_with_itself():
    records = [
        _rec(L1, "generate uncached", 64, 3.0),
        _rec(L2, "generate uncached", 64, 4.0),
        _rec(L1, "generate cached", 64, 0.5),
        _rec(L1, "varlen padded", 64, 1.0, tokens=100.0),
        _rec(L1, "varlen bucketed", 64, 1.0, tokens=250.0),
    ]
    (kv,) = _readings(records, "KV-cache speed-up")  # level 2 has no cached run
    (bucket,) = _readings(records, "bucketing")
    assert (kv.label, kv.value) == (f"KV-cache speed-up: {L1}", 6.0)  # 3 s / 0.5 s
    # Tokens/s bucketed over padded: 250 / 100; no waste recorded, so none in the detail.
    assert bucket.value == 2.5 and bucket.detail == "250 / 100 tok/s"


def test_window_ratio_is_full_over_window_at_the_longest_common_length():
    def rec(T, W, median, peak):
        r = _rec(L1, "attention window", T, median)
        r.shape |= {"W": W}
        r.peak_memory_bytes = peak
        return r

    records = [rec(1024, 256, 1.0, 10), rec(1024, 1024, 2.0, 10), rec(4096, 256, 3.0, 40)]
    records += [rec(4096, 4096, 12.0, 40), rec(8192, 256, 6.0, 80)]  # 8192: no full run
    (ratio,) = _readings(records, "full causal")
    assert (
        ratio.value == 4.0 and ratio.detail == "T=4096, W=256: 12 s / 3 s; peak memory 40 B / 40 B"
    )


def test_flash_decoding_ratio_is_keyed_by_the_cache_length():
    def rec(level, S, median):
        r = _rec(level, "decode attention", 1, median)
        r.shape |= {"S": S}
        return r

    records = [rec("level4:no-split", 4096, 2.0), rec("level4_triton_kernel", 4096, 1.0)]
    records += [rec("level4:no-split", 65536, 9.0), rec("level4_triton_kernel", 65536, 3.0)]
    records += [rec("level4:no-split", 131072, 20.0)]  # no split run at this length
    (ratio,) = _readings(records, "decode attention")
    assert ratio.value == 3.0 and ratio.detail.startswith("S=65536")  # 9 s / 3 s


def test_a_ratio_is_data_read_by_one_function():
    """The rules of ``Ratio`` on a made-up scenario: named fields pick the records, a
    record is never its own denominator, ``keep`` chooses among one label's pairs, and a
    detail part naming a value a record lacks is left out."""
    records = [_rec(L1, "s", T, m) for T, m in ((8, 1.0), (16, 4.0))]
    records += [_rec(L2, "s", T, m) for T, m in ((8, 2.0), (16, 2.0))]
    records[1].peak_memory_bytes = 3 * 2**20
    over = Ratio(
        "{num.level} over any",
        {"scenario": "s"},
        {"scenario": "s"},
        same=("T",),
        keep="T",
        detail=("T={num.T}", "{num.memory} / {den.memory}"),
    )
    a, b = read_ratios([over], records)  # level 1 over level 2 and level 2 over level 1
    assert (a.label, a.value, a.detail) == (f"{L1} over any", 2.0, "T=16")  # 4 s / 2 s
    assert (b.label, b.value) == (f"{L2} over any", 0.5)
    first = Ratio("{num.level}", {"scenario": "s", "level": L1}, {"scenario": "s", "level": L2})
    (reading,) = read_ratios([first], records)  # no same size asked for: the first pair
    assert reading.value == 0.5 and reading.shown == "0.5x"


def test_decode_attention_reads_k_and_v_once():
    case = Attention(B=2, H=3, T=1, Dh=4, S=5)
    # 2 (K and V) * B*H*S*Dh = 2 * 2*3*5*4 = 240 numbers; 4 bytes each in float32.
    assert case.bytes_read("float32") == 960 and case.bytes_read("bfloat16") == 480
    # One query sees every key: 4 * B*H*T*S*Dh = 4 * 120, causal or not.
    assert case.flops() == 480 and case.shape()["S"] == 5
    assert Attention(B=2, H=3, T=5, Dh=4).bytes_read("float32") is None


def test_percentages_keep_two_figures_and_no_exponent():
    assert [fmt_percent(x) for x in (0.0712, 0.5, 0.996, 1.004, 1.59)] == [
        "7.1%",
        "50%",
        "100%",
        "100%",
        "159%",
    ]


def test_kv_cache_figures_are_read_off_allocated_buffers():
    records = kv_cache_figures()
    per_token = {r.note.split(";")[0]: r.cache_bytes_per_token for r in records}
    # TinyLlama's shape in bfloat16: 2 (k and v) * 22 layers * Hkv * 64 * 2 bytes.
    assert per_token == {"MHA": 2 * 22 * 32 * 64 * 2, "GQA": 2 * 22 * 4 * 64 * 2, "MQA": 5632}
    assert [r.value for r in _readings(records, "KV-cache bytes")] == [8.0, 32.0]


# --------------------------------------------------------------------------- the command


def test_ladder_bench_tiny_run_writes_json_and_png(tmp_path, capsys):
    for name in ("level1_numpy", "level2_torch_manual"):
        _load(name)
    out, png = tmp_path / "out.json", tmp_path / "plot.png"
    code = cli.main(
        [
            "bench",
            "--quick",
            "--levels",
            "1,2",
            "--scenario",
            "attention",
            "--scenario",
            "decoder",
            "--seq-lens",
            "8,16",
            "--no-progress",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert code == 0
    records = json.loads(out.read_text())
    for r in records:
        assert {"level", "scenario", "device", "dtype", "median_s"} <= r.keys()
    measured = {
        (r["level"], r["scenario"], r["shape"].get("T")) for r in records if r["status"] == "ok"
    }
    for level in ("level1_numpy", "level2_torch_manual"):
        for scenario in ("attention fwd", "decoder fwd"):
            assert {(level, scenario, 8), (level, scenario, 16)} <= measured
    peak = next(r for r in records if r["scenario"] == "matmul peak")
    assert peak["gflops"] > 0
    for r in records:
        if r["status"] == "ok" and r["scenario"] != "matmul peak":
            assert math.isclose(r["peak_fraction"], r["gflops"] / peak["gflops"], rel_tol=1e-9)
            # float32 on O(1) attention outputs and logits of a two-layer model: the
            # shared suite's float32 tolerance (2e-5 relative) with room for |logits| ~ 5.
            assert r["max_error"] < 1e-4
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    assert levels.load("level1_numpy").describe() in text  # what computes is printed
    assert "Ratios within this run" in text


def test_a_run_into_a_file_prints_a_line_per_step_and_keeps_its_records(tmp_path, capsys):
    """Output to a file or a pipe (capsys here), where a bar prints nothing: one line per
    step as it ends (how many of how many, the time, what it measured), and the records
    in the user's cache when no --json names a file; --no-progress prints no such line."""
    _load("level1_numpy")
    argv = ["bench", "--quick", "--levels", "1", "--scenario", "attention", "--no-peers"]
    argv += ["--seq-lens", "8,16"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LADDER_CACHE", str(tmp_path))
        assert cli.main(argv) == 0
    out = capsys.readouterr().out
    steps = [line for line in out.splitlines() if line.startswith("[")]
    assert [re.match(r"\[(\d)/4 \d:\d\d:\d\d\] ", line)[1] for line in steps] == list("1234")
    assert re.search(r"\] level1_numpy  attention fwd  T=16: [\d.]+ [mu]s \([\d.]+ s\)$", steps[2])
    path = tmp_path / "bench" / "last.json"
    assert f"records written to {path}" in out
    assert {r.shape.get("T") for r in read_json(path) if r.scenario == "attention fwd"} == {8, 16}
    assert cli.main([*argv, "--no-progress", "--json", str(tmp_path / "x.json")]) == 0
    assert not any(line.startswith("[") for line in capsys.readouterr().out.splitlines())


def test_unavailable_level_is_reported(monkeypatch, tmp_path):
    def refuse(name):
        raise levels.LevelUnavailable(f"{name} is unavailable here: pretend")

    monkeypatch.setattr(levels, "load", refuse)
    out = tmp_path / "out.json"
    code = cli.main(
        ["bench", "--quick", "--levels", "2", "--scenario", "attention", "--seq-lens", "8"]
        + ["--no-progress", "--json", str(out)]
    )
    assert code == 0
    (row,) = [r for r in json.loads(out.read_text()) if r["level"] == "level2_torch_manual"]
    assert row["status"].startswith("unavailable: ") and "pretend" in row["status"]


def test_gpu_reference_path_agrees_with_level1_in_float64():
    for name in ("level1_numpy", "level2_torch_manual"):
        _load(name)
    q, k, v, _ = Attention(B=2, H=2, T=9, Dh=6).inputs()
    ref = Reference()
    # The CUDA path (level 2 in float64, one batch row at a time), run here on the CPU.
    on_device = ref._attention_on_device(q, k, v, True, None)
    # Both float64 with O(1) values; only summation order differs: a few ulps.
    np.testing.assert_allclose(on_device, ref.attention(q, k, v, True), rtol=0, atol=1e-13)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message on a machine without CUDA"
)
def test_device_cuda_without_cuda_says_so(capsys):
    assert cli.main(["bench", "--device", "cuda", "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.splitlines()  # one line, no traceback
    assert line == "ladder bench: error: --device cuda: torch sees no CUDA device here"


def test_measure_makes_the_warm_up_calls_itself():
    calls, timed = [], []

    def fn():
        calls.append(len(timed))  # 0 for an untimed call, else its rank among timed ones

    def timer(f, number):
        for _ in range(number):
            timed.append(1)
            f()
        return 1.0

    policy = TimingPolicy(warmup=3, min_repeat=2, max_repeat=2, min_time_s=0.0)
    measure(fn, timer, policy, warmed=1)
    # 3 warm-up calls less the 1 the caller made are untimed; then 2 timed samples.
    assert calls == [0, 0, 1, 2]


def test_level0_is_measured_in_float64_whatever_the_run_dtype():
    _load("level1_numpy")
    subject = level_subject("level0_loops", _load("level0_loops"), "cpu")
    record = run_case(
        subject,
        Attention(B=1, H=2, T=8, Dh=4),
        dtype="bfloat16",
        plan=_plan(Budget()),
        reference=Reference(),
        peak=None,
    )
    assert record.ok and record.dtype == "float64"
    # Compared with a reference on its own (unrounded) float64 inputs: a few ulps of O(1).
    assert record.max_error < 1e-13
    assert record.memory_method == "tracemalloc" and record.peak_memory_bytes > 0


class _Sleeper:
    """A stand-in workload whose call takes a known time, for the budget's last guard."""

    scenario = "sleep"

    def shape(self):
        return {"T": 1}

    def flops(self):
        return 1.0

    def tokens(self):
        return None

    def unsupported(self, subject):
        return None

    def __init__(self, error=0.0):
        self.error, self.calls = error, 0

    def build(self, subject, dtype, reference):
        from benchmarks.reference import Case

        def fn():
            self.calls += 1
            time.sleep(0.05)

        def check():  # the check runs the case once, as every workload's does
            fn()
            return self.error

        return Case(fn=fn, error=check, error_of="output", bound=1e-3)


def test_budget_stops_a_case_whose_first_call_is_far_over_the_cap():
    subject = level_subject("level1_numpy", _load("level1_numpy"), "cpu")
    record = run_case(
        subject,
        _Sleeper(),
        dtype="float32",
        plan=_plan(Budget(max_call_s=0.01)),  # 0.05 s > 2 x 0.01 s
        reference=Reference(),
        peak=None,
    )
    assert record.status == SKIPPED_BUDGET and record.note.startswith("one call took")
    assert record.median_s is None  # no samples were taken


def test_a_case_over_its_error_bound_is_reported_wrong_and_never_timed():
    subject = level_subject("level1_numpy", _load("level1_numpy"), "cpu")
    wrong = _Sleeper(error=0.5)  # bound 1e-3
    record = run_case(
        subject, wrong, dtype="float32", plan=_plan(Budget()), reference=Reference(), peak=None
    )
    assert record.status == WRONG and record.note == "output error 0.5 > bound 0.001"
    assert wrong.calls == 1  # the check only: no warm-up, no sample
    assert record.median_s is None and record.max_error == 0.5
    right = _Sleeper(error=1e-4)
    record = run_case(
        subject, right, dtype="float32", plan=_plan(Budget()), reference=Reference(), peak=None
    )
    assert record.ok and record.error_bound == 1e-3 and right.calls > 2


def test_a_nan_result_is_wrong():
    subject = level_subject("level1_numpy", _load("level1_numpy"), "cpu")
    record = run_case(
        subject,
        _Sleeper(error=float("nan")),
        dtype="float32",
        plan=_plan(Budget()),
        reference=Reference(),
        peak=None,
    )
    assert record.status == WRONG


def test_cpu_threads_are_set_for_the_run_and_restored():
    from threadpoolctl import threadpool_info

    from loading.threads import cpu_threads

    before = torch.get_num_threads()
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
        assert all(
            pool["num_threads"] == 1 for pool in threadpool_info() if pool["user_api"] == "blas"
        )
    assert torch.get_num_threads() == before


def _rendered(records, width: int) -> str:
    from rich.console import Console

    from benchmarks.report import print_report

    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    print_report(records, "a machine", console)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 120, 200])
def test_tables_never_break_or_crop_a_number(width):
    """Below the full width columns go (note first, then IQR, memory, ...), never digits."""
    from benchmarks.records import fmt_time
    from benchmarks.report import CEILINGS

    records = read_json(ROOT / "docs" / "data" / "cpu_quick.json")
    text = _rendered(records, width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "…" not in text  # rich's mark for a cropped cell
    # The ceilings (matmul peak, copy bandwidth) show as rates in the first table.
    medians = [fmt_time(r.median_s) for r in records if r.ok and r.scenario not in CEILINGS]
    rows = [line for line in lines if line.startswith("│")]
    for median in medians:  # every median appears whole on some table row
        assert any(median in row for row in rows), median


def test_user_text_is_not_read_as_markup():
    record = Record(
        level="level4_triton_kernel",
        scenario="-",
        device="cpu",
        dtype="float32",
        status="unavailable: pip install 'attention-ladder[triton]'",
    )
    assert "attention-ladder[triton]" in _rendered([record], 150)


def test_a_serve_record_is_right_only_when_every_answer_is_the_one_alone():
    """benchmarks/serve.py's record of a load run: tokens/s of the whole run, the waits from
    the server's timings, and ``wrong`` when any answer differs from the request asked alone
    or is missing (a request lost)."""
    from benchmarks.serve import _record

    def answer(text, tokens, queued, first):
        return {"choices": [{"message": {"content": text}}],
                "usage": {"completion_tokens": tokens},
                "timings": {"queued_s": queued, "time_to_first_token_s": first,
                            "time_per_output_token_s": 0.1}}  # fmt: skip

    answers = [answer("a", 4, 0.0, 0.5), answer("b", 6, 1.0, 0.5)]
    record = _record("s", 8, 2.0, answers, ["a", "b"], new=6)
    assert record.status == "ok" and record.tokens_per_s == 5.0  # 10 tokens in 2 s
    assert record.shape == {"clients": 8, "requests": 2, "new": 6}
    assert "p50 1.00 s" in record.note  # the waits 0.5 and 1.5, median 1.0
    assert _record("s", 8, 2.0, answers, ["a", "c"]).status == "wrong"
    assert _record("s", 8, 2.0, [answers[0], None], ["a", "b"]).status == "wrong"


@pytest.mark.extended  # compiles a decode step and a verification (about a minute)
def test_the_speculative_bench_checks_each_answer_and_reads_a_and_c_off_the_run(monkeypatch):
    """benchmarks/speculative.py over a small random model (its quick run: the n-gram draft,
    k = 2, the commands' default): a plain record and one a draft for each task, every answer equal to plain
    decoding's token for token, and the figures the formula reads, consistent with the
    counts they come from."""
    from types import SimpleNamespace

    from benchmarks import real_model, speculative
    from levels import TransformerConfig, init_params

    config = TransformerConfig(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2,
                               d_ff=64, max_seq_len=256)  # fmt: skip
    params = init_params(config, "decoder_only", seed=3, scheme="random")
    params = {name: np.asarray(p, dtype=np.float32) for name, p in params.items()}
    tokenizer = SimpleNamespace(
        encode=lambda text, add_special_tokens: SimpleNamespace(ids=[ord(c) % 64 for c in text])
    )
    template = SimpleNamespace(render=lambda messages, add_generation_prompt: messages[0]["content"][:60])  # fmt: skip
    monkeypatch.setattr(real_model, "_file", lambda: "a small random model")
    monkeypatch.setattr(speculative, "_loaded", lambda: (config, params, tokenizer, template))
    records = speculative.speculative_records(quick=True)
    # First the check's cost (benchmarks/check_cost.py): the pass of k + 1 = 3 tokens and the
    # step timed in turn with it, the pass's figures its cost in steps and its two limits.
    checks, records = records[:2], records[2:]
    assert [(r.scenario, r.shape) for r in checks] == [
        ("speculative check", {"T": 3}), ("speculative check step", {"T": 3}),
    ]  # fmt: skip
    steps = checks[0].median_s / checks[1].median_s
    assert checks[0].figures["steps"] == pytest.approx(steps)
    assert checks[0].figures["read_limit"] == 1.0 and checks[0].figures["arithmetic_limit"] > 0
    assert [(r.scenario, r.shape["task"]) for r in records] == [
        ("speculative plain", "grounded"), ("speculative", "grounded"),
        ("speculative plain", "chat"), ("speculative", "chat"),
    ]  # fmt: skip
    assert all(r.status == "ok" for r in records), [r.note for r in records]
    for r in records[1::2]:
        f = r.figures
        (k,) = speculative.KS_QUICK
        assert r.shape == {"task": r.shape["task"], "k": k, "new": speculative.NEW_QUICK}
        assert f["accepted"] <= f["drafted"] <= k * f["passes"]
        # Every token after the first comes from a pass: new - 1 = passes + accepted.
        assert f["passes"] + f["accepted"] == speculative.NEW_QUICK - 1
        assert f["tokens_a_pass"] == (speculative.NEW_QUICK - 1) / f["passes"]
        assert 0.0 <= f["c"] < 1.0 and f["verification"] > 0.0
