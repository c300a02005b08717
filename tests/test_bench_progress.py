"""What ``ladder bench`` says while it runs: each compile before it starts, an eta that is
never overrun by more than twice, and a "% bw" whose ceiling was timed in turn with the case.

The eta is checked on a made-up run with a clock the test moves (no timing here); the
compiles against the user's real model file, in a cache of the test's own with nothing
compiled; the read stream's turns with a workload that logs its calls and moves the clock.
"""

from __future__ import annotations

import itertools
import os

import pytest

import levels
from benchmarks.measure import READ_BYTES, TimingPolicy
from benchmarks.plan import Budget, Plan, default_plan
from benchmarks.real_model import Compile, RealModel
from benchmarks.reference import Case, Reference
from benchmarks.runner import BESIDE_BYTES, PAIRS, Pace, Step, run_case, screen, steps
from benchmarks.subjects import level_subject
from ladder import bench as ladder_bench

# ----------------------------------------------------------------------------- the eta


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Quiet:
    is_terminal = False


class _NoCompiles:
    def weigh(self, planned, scale):
        return [step.seconds * scale for step in planned]

    def announce(self, step):
        return []


def _shown_and_left(expected: list[float], took: list[float], monkeypatch) -> list[tuple]:
    """Run steps of ``expected`` seconds that take ``took``, on a clock the test moves, and
    read the eta every second: -> ``[(eta shown, seconds really left), ...]``."""
    clock = _Clock()
    monkeypatch.setattr(ladder_bench.time, "perf_counter", clock)
    planned = [Step(f"step {i}", x) for i, x in enumerate(expected)]
    progress = ladder_bench._Steps(_Quiet(), planned, _NoCompiles(), show=False)
    end, seen = sum(took), []
    with progress:
        for step, seconds in zip(planned, took, strict=True):
            progress.start(step)
            started = clock.now
            while clock.now < started + seconds:
                seen.append((progress.eta(), end - clock.now))
                clock.now = min(clock.now + 1.0, started + seconds)
            progress.finished([])
    assert progress.eta() == 0.0
    return seen


# A quick run's shape: many short steps, then long ones (a compile, the servers).
EXPECTED = [0.3] * 40 + [6.0, 66.0, 0.1, 8.0, 83.0, 170.0, 148.0, 6.0]


@pytest.mark.parametrize(
    "factor",
    [0.5, 1.0, 2.0, [2.0 if i % 2 else 0.5 for i in range(len(EXPECTED))]],
    ids=["half", "as planned", "twice (the limit)", "half and twice in turn"],
)
def test_the_eta_is_never_overrun_by_more_than_twice(factor, monkeypatch):
    """Whenever every step takes between half and twice its expected time (twice exactly
    included, the bound's edge), the time really left is at most twice the eta shown."""
    factors = factor if isinstance(factor, list) else [factor] * len(EXPECTED)
    took = [x * f for x, f in zip(EXPECTED, factors, strict=True)]
    for shown, left in _shown_and_left(EXPECTED, took, monkeypatch):
        assert left <= 2 * shown + 1e-9, (shown, left)


def test_a_step_far_over_its_expected_time_is_where_the_eta_can_be_overrun(monkeypatch):
    """Not a promise the eta can keep: a last step five times longer than expected leaves
    more than twice the eta shown at its start (so the plan's seconds must be honest)."""
    seen = _shown_and_left([10.0, 10.0], [10.0, 50.0], monkeypatch)
    assert any(left > 2 * shown for shown, left in seen)


def test_the_eta_counts_a_long_step_before_it_starts_not_once_it_is_reached(monkeypatch):
    """The issue of a bar counting steps: 150 of 153 done and "17 s left" before three
    minutes of servers. Weighted by seconds, the eta says the minutes at once."""
    expected = [0.3] * 150 + [170.0, 148.0, 6.0]
    shown, left = _shown_and_left(expected, expected, monkeypatch)[0]
    assert shown == pytest.approx(sum(expected)) and left == pytest.approx(sum(expected))


# ----------------------------------------------------------------------------- the compiles


def _empty_cache(tmp_path, monkeypatch, model) -> None:
    """A user's cache with nothing compiled, the model file the pulled one."""
    from benchmarks import real_model

    monkeypatch.setattr(real_model, "_file", lambda: model)
    monkeypatch.setenv("LADDER_CACHE", str(tmp_path))


def test_each_compile_of_a_quick_run_is_announced_once_and_weighs_its_expected_time(
    smollm2_gguf, tmp_path, monkeypatch
):
    """On an empty cache: the compiled decode case, the first chat (startup; the server
    then loads its step) and the speculative runs' two (the step of their context, the
    check of k = 2) are each announced before their step, with "about 1 minute", and add
    that minute to their step's weight; once the files are there, none is."""
    from levels.level3_sdpa_flash.compiled import compiler_missing
    from loading import compiles as decode_step

    if compiler_missing() is not None:
        pytest.skip(compiler_missing())
    _empty_cache(tmp_path, monkeypatch, smollm2_gguf)
    level3 = level_subject("level3_sdpa_flash", levels.load("3"), "cpu")
    compiled = level_subject("level3_sdpa_flash", level3.module, "cpu")
    compiled.name, compiled.options = "level3:compiled", {"compile": True}
    plan = default_plan("cpu", quick=True).only(["real-model", "startup", "serve", "speculative"])
    planned = steps([level3, compiled], plan)
    compiles = ladder_bench._Compiles("cpu", first=decode_step.FIRST_COMPILE_S)
    weights = compiles.weigh(planned)
    said = {step.label: compiles.announce(step) for step in planned}
    minute = decode_step.FIRST_COMPILE_S
    assert {label: len(lines) for label, lines in said.items() if lines} == {
        "level3:compiled  real decode float32": 1,
        "startup  (computed figures)": 1,
        "serve  (computed figures)": 1,  # at plan time; startup compiles it first
        "speculative  (computed figures)": 2,
    }
    assert said["level3:compiled  real decode float32"] == [
        "compiling the decode step of smollm2-135m for context 128, float32, 1 thread: about "
        "1 minute, once; later runs load it from the cache"
    ]
    assert said["speculative  (computed figures)"][1].startswith(
        "compiling the check of 2 guesses (--speculate) of smollm2-135m for context 768"
    )
    added = {s.label: w - s.seconds for s, w in zip(planned, weights, strict=True) if w > s.seconds}
    assert added == {
        "level3:compiled  real decode float32": minute,
        "startup  (computed figures)": minute,  # the server's is the same file: counted once
        "speculative  (computed figures)": 2 * minute,
    }
    for c in {c for step in planned for c in step.compiles}:  # now every one is cached
        path = decode_step.package(c.key_of(), c.threads, c.tokens)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    assert not any(compiles.announce(step) for step in planned)
    assert compiles.weigh(planned) == [step.seconds for step in planned]


def _load(monkeypatch, load: float, cores: int = 2) -> None:
    """The machine's load average and cores, as the harness reads them."""
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))


@pytest.mark.parametrize(
    ("load", "scale"), [(5.0, 1.0), (11.0, 2.0), (0.0, 1 / 3), (1.0, 1 / 3), (3.0, 2 / 3)]
)
def test_the_plans_seconds_scale_with_the_share_of_a_core_a_step_gets(load, scale, monkeypatch):
    """The seconds were timed on a third of a core (a load average of 5 on 2 cores, the run
    itself the sixth process): a run at that load sees them as they are; at a load of 11,
    12 processes share the 2 cores and a step takes twice as long; on an idle machine (or
    at a load of 1: two processes, a core each, the edge) a step has its whole core."""
    _load(monkeypatch, load)
    assert ladder_bench._scale() == pytest.approx(scale)


@pytest.mark.extended  # builds SmolLM2 at level 3 with its compiled step: a minute on 2 cores
def test_a_compile_s_key_is_the_one_the_model_s_own_step_is_kept_under(smollm2_gguf):
    """``Compile.key_of`` stands in for the model the step builds: the same file name."""
    from levels import gguf
    from loading import compiles as decode_step

    config, params = gguf.load(smollm2_gguf, max_seq_len=128)
    model = levels.load("3").DecoderOnlyTransformer(config, params, compile=True)
    for tokens in (1, 3):
        want = decode_step.package(model, 1, tokens)
        assert decode_step.package(Compile(128, 1, tokens).key_of(), 1, tokens) == want


def test_the_chat_s_default_context_is_the_one_the_bench_expects_it_to_compile():
    from benchmarks.startup import CHAT_CONTEXT
    from loading import DEFAULT_CONTEXT

    assert CHAT_CONTEXT == DEFAULT_CONTEXT


# ----------------------------------------------------------------------------- % bw


class _Reading:
    """A workload that reads ``nbytes`` a call, logs each call and moves the test's clock by
    ``seconds``."""

    scenario = "reading"

    def __init__(self, log: list[str], clock: _Clock, nbytes: float, seconds: float):
        self.log, self.clock, self.nbytes, self.seconds = log, clock, nbytes, seconds

    def shape(self):
        return {"T": 1}

    def flops(self):
        return 1.0

    def tokens(self):
        return 1

    def unsupported(self, subject):
        return None

    def build(self, subject, dtype, reference):
        def fn():
            self.log.append("case")
            self.clock.now += self.seconds

        def check():
            fn()
            return 0.0

        extras = {"bytes_read": self.nbytes}
        return Case(fn=fn, error=check, error_of="output", bound=1e-3, extras=extras)


@pytest.mark.parametrize("nbytes", [BESIDE_BYTES, BESIDE_BYTES - 1], ids=["memory", "cache"])
def test_a_case_read_from_memory_is_timed_in_turn_with_the_read_stream(nbytes, monkeypatch):
    """A case that reads ``BESIDE_BYTES`` a call or more (from memory: a real model's decode)
    is timed in turn with the read streams, a call then every stream, ``PAIRS`` times, and
    its "% bw" is the median over the calls of its GB/s over the fastest stream after it:
    a machine whose bandwidth moves (here the streams alternate 4 and 8 GB/s, the case
    reads at 2) cannot put a case over 100% by a ceiling timed at another moment. One byte
    less (bytes that may stay in a cache) is left to the stream timed at the run's end."""
    import benchmarks.measure as measure
    import benchmarks.runner as runner

    clock, log = _Clock(), []
    monkeypatch.setattr(measure.time, "perf_counter", clock)
    rates = itertools.cycle([4e9, 8e9])  # bytes/s of the streams' passes, in turn

    def pass_at(rate):
        def fn():
            log.append("stream")
            clock.now += READ_BYTES / rate

        return fn

    def streams(device, nbytes):
        assert nbytes == READ_BYTES
        return {"slow": pass_at(1e9), "fast": lambda: pass_at(next(rates))()}

    monkeypatch.setattr(runner, "read_streams", streams)
    policy = TimingPolicy(warmup=2, min_repeat=3, max_repeat=3, min_time_s=0.0, min_sample_s=0.0)
    plan = Plan({"reading": []}, {"numpy": Budget()}, policy)
    subject = level_subject("level1_numpy", levels.load("1"), "cpu")
    case = _Reading(log, clock, nbytes, seconds=nbytes / 2e9)  # 2 GB/s
    record = run_case(subject, case, dtype="float32", plan=plan, reference=Reference(), peak=None)
    assert record.ok and record.gbs == pytest.approx(nbytes / 1e9 / (nbytes / 2e9))
    if nbytes < BESIDE_BYTES:
        assert "stream" not in log and record.stream_gbs is None
        assert record.bandwidth_fraction is None  # the run's ceilings set it, at its end
        return
    turns = log[log.index("stream") :]  # the untimed passes, then the pairs
    assert turns == ["stream", "stream"] + ["case", "stream", "stream"] * PAIRS
    # The fast stream's passes: untimed 4, then 8, 4, 8, 4, 8 after the five calls.
    assert record.stream_gbs == pytest.approx(8.0)  # GB/s: 512 MiB read at 8e9 bytes/s
    assert record.bandwidth_fraction == pytest.approx(2 / 8)  # the median of 1/4 and 1/2s


# ----------------------------------------------------------------------------- the labels


def test_the_real_model_rows_of_level_0_and_4_say_what_they_compute_in_and_cost(
    smollm2_gguf, monkeypatch
):
    """Level 0 computes in float64 whatever the file holds; level 4 on a CPU is Triton's
    interpreter, and its row says the seconds a token it costs there, not "minutes"."""
    from benchmarks import real_model

    _load(monkeypatch, 5.0)  # a third of a core: the figures as they were measured
    plan, decode = default_plan("cpu", quick=True), RealModel("decode", "float32", 1)
    level0 = level_subject("level0_loops", levels.load("0"), "cpu")
    record = screen(level0, decode, dtype="float32", plan=plan, pace=Pace())
    assert record.dtype == "float64"
    seconds = real_model.PARAMS * real_model.LEVEL0_SECONDS_PER_MAC  # the measured figure
    assert (
        record.status == f"skipped: about {seconds:.0f} s a token (ladder chat --level 0 runs it)"
    )
    try:
        level4 = level_subject("level4_triton_kernel", levels.load("4"), "cpu")
    except levels.LevelUnavailable as exc:
        pytest.skip(str(exc))
    if not level4.interpreted:
        pytest.skip("level 4 runs on a GPU here")
    record = screen(level4, decode, dtype="float32", plan=plan, pace=Pace())
    seconds = real_model.LAYERS * real_model.INTERPRETED_SECONDS_PER_LAYER
    assert record.status == (
        f"skipped: about {seconds:.0f} s a token in Triton's interpreter "
        "(ladder chat --level 4 runs it)"
    )
    assert record.dtype == "float32"
