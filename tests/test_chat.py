"""``ladder chat`` and ``ladder generate`` on the real model (SmolLM2-135M-Instruct).

What a user sees: the answer streamed on stdout, ended by the model's end-of-turn token (never
printed), a ``--stop`` string or ``--max-new-tokens``; one line of prompt and decode speeds
per answer on stderr; the conversation's history through the chat template, ``/clear`` and
``/quit``; greedy answers the same at every level. The tokens themselves are held to
transformers' in tests/test_real_models.py; here it is the command around them.

The conversation's own rules (what fits the context, the commands, the speeds line, the
threads) are checked on a fake model too, which answers at once: ``fake`` below.
"""

from __future__ import annotations

import io
import os
import re
import select
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import levels
from ladder import chat as ladder_chat
from ladder.cli import main as ladder

QUESTION = "What is the capital of France?"
# The decode part is there only when there were decode steps (two new tokens or more).
SPEED = re.compile(
    r"^\[prompt (\d+) tokens? in [\d.]+ s \([\d.]+ tok/s\)(?: \| decode (\d+) tokens? in )?"
)


def _chat(capsys, *argv, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    status = ladder(["chat", "--model", "smollm2-135m", *argv])
    out, err = capsys.readouterr()
    speeds = [(int(m[1]), int(m[2] or 0)) for m in map(SPEED.match, err.splitlines()) if m]
    return status, out, err, speeds


@pytest.fixture(autouse=True)
def _pulled(request):
    """The real model is in the cache before a command runs it (or the test is skipped);
    the tests on the fake model need none."""
    if not {"fake", "terminal"} & set(request.fixturenames):
        request.getfixturevalue("smollm2_gguf")


def test_one_question_greedy_is_answered_and_stops_at_eos(capsys):
    status, out, err, speeds = _chat(capsys, "-p", QUESTION, "--temperature", "0", "--level", "3")
    assert status == 0, err
    assert "Paris" in out and "<|im_end|>" not in out
    ((prompt, decode),) = speeds  # one answer, one line of speeds
    assert prompt > 20 and 0 < decode < 255  # stopped at EOS, long before the token limit


def test_the_default_answer_is_greedy(capsys):
    """Greedy unless asked: at temperature 0.2, seed 2 starts this answer in French at
    level 1 (measured: 'L' has probability 0.36 there), so a sampling default would fail."""
    _, greedy, _, _ = _chat(capsys, "-p", QUESTION, "--level", "1", "--temperature", "0")
    _, sampled, _, _ = _chat(
        capsys, "-p", QUESTION, "--level", "1", "--temperature", "0.2", "--seed", "2",
        "--max-new-tokens", "8",
    )  # fmt: skip
    _, default, _, _ = _chat(capsys, "-p", QUESTION, "--level", "1", "--seed", "2")
    assert sampled != greedy[: len(sampled)]  # the seed does draw another answer
    assert default == greedy  # a seed changes nothing without sampling


@pytest.mark.parametrize("number", ["1", "2"])
def test_greedy_answers_are_the_same_at_every_level(capsys, number):
    _, three, _, _ = _chat(capsys, "-p", QUESTION, "--temperature", "0", "--level", "3")
    _, other, _, _ = _chat(capsys, "-p", QUESTION, "--temperature", "0", "--level", number)
    assert other == three


def test_a_seed_repeats_a_sampled_answer(capsys):
    argv = ["-p", "Write a short poem.", "--temperature", "0.9", "--seed", "7"]
    _, first, _, _ = _chat(capsys, *argv, "--max-new-tokens", "12")
    _, again, _, _ = _chat(capsys, *argv, "--max-new-tokens", "12")
    assert first == again and first.strip()


def test_stop_strings_and_the_token_limit(capsys):
    _, out, _, speeds = _chat(capsys, "-p", QUESTION, "--temperature", "0", "--stop", "Paris")
    assert out.strip() == "The capital of France is"  # cut before the stop string
    _, out, _, speeds = _chat(capsys, "-p", QUESTION, "--temperature", "0", "--max-new-tokens", "2")
    assert speeds[0][1] == 1  # two new tokens: one from the prompt's pass, one decode step


def test_a_conversation_keeps_its_history_until_cleared(capsys, monkeypatch):
    turns = "Name a prime number.\nAnd another one?\n/clear\nName a prime number.\n/quit\nignored\n"
    status, out, err, speeds = _chat(
        capsys, "--temperature", "0", stdin=turns, monkeypatch=monkeypatch
    )
    assert status == 0 and "(conversation cleared)" in err
    assert len(speeds) == 3  # three answers; the line after /quit is never read
    (p1, _), (p2, _), (p3, _) = speeds
    assert p2 > p1  # the second prompt carries the first question and its answer
    assert p3 == p1  # cleared: the same prompt as the first


def test_a_system_message_replaces_the_templates(capsys):
    _, _, _, default = _chat(capsys, "-p", "Hi", "--temperature", "0", "--max-new-tokens", "1")
    _, _, _, short = _chat(
        capsys, "-p", "Hi", "--system", "Be brief.", "--temperature", "0", "--max-new-tokens", "1"
    )
    # SmolLM2's template adds its own system message when none is given.
    assert short[0][0] < default[0][0]


def test_generate_continues_text_without_the_template(capsys):
    status = ladder(["generate", "-p", "The capital of France is", "--max-new-tokens", "4"])
    out, err = capsys.readouterr()
    assert status == 0 and out.startswith("The capital of France is Paris")
    assert SPEED.match(err.splitlines()[-1])


CHAT_MISUSES = [
    (["--model", "nothing-here"], 2, "no such file or directory, and not a model the ladder knows"),
    (["--dtype", "float32", "--level", "0", "-p", "x"], 2, "computes in float64"),
    (["--temperature", "-1", "-p", "x"], 2, "must lie in [0.0, 100.0]"),
    (["--top-p", "0", "-p", "x"], 2, "must lie in (0.0, 1.0]"),
    (["--context", "9000", "-p", "x"], 2, "exceeds the model's 8192 tokens"),
    (
        ["--max-new-tokens", "5000", "--context", "64", "-p", "x"],
        2,
        "; --context 64 leaves room for 33 tokens, not --max-new-tokens 5000 (the model allows "
        "8192: try --context 8192)",
    ),
    (["--max-new-tokens", "0", "-p", "x"], 2, "--max-new-tokens: must be at least 1, got 0"),
]


@pytest.mark.parametrize(("extra", "code", "message"), CHAT_MISUSES)
def test_chat_misuse_is_one_line(capsys, extra, code, message):
    status = ladder(
        ["chat", *extra] if "--model" in extra else ["chat", "-m", "smollm2-135m", *extra]
    )
    err = capsys.readouterr().err
    assert status == code and len(err.splitlines()) == 1 and message in err, err


@pytest.mark.extended  # reading Gemma's 262k-token vocabulary takes 15 s
def test_chat_refuses_a_model_without_a_template(capsys, gemma3_gguf):
    status = ladder(["chat", "--model", str(gemma3_gguf), "-p", "x", "--level", "1"])
    err = capsys.readouterr().err
    assert status == 2 and "has no chat template; use ladder generate" in err  # a misuse


# ----------------------------------------------------------------------------- on a fake model

EOS = 3  # the fake's end-of-turn id (a control character: never in a test's text)
REPLY = "ok"


class FakeTokenizer:
    """One token per character, its code point: what ``StreamDecoder`` and ``_fit`` call."""

    def encode(self, text: str, add_special_tokens: bool = True):
        return SimpleNamespace(ids=[ord(c) for c in text])

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if i != EOS)

    def get_added_tokens_decoder(self) -> dict:
        return {}

    def token_to_id(self, token: str) -> None:
        return None


class FakeTemplate:
    def render(self, messages, *, add_generation_prompt: bool = False) -> str:
        turns = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return turns + ("<assistant>" if add_generation_prompt else "")


class FakeModel:
    """Answers every prompt with ``REPLY`` then EOS, at once; records what it was asked."""

    def __init__(self, context: int):
        self.config = SimpleNamespace(max_seq_len=context)
        self.calls: list[tuple[str, int]] = []  # (prompt text, max_new_tokens)

    def stream(self, ids, max_new_tokens, **sampling):
        self.calls.append(("".join(map(chr, ids)), max_new_tokens))
        yield from [*map(ord, REPLY), EOS][:max_new_tokens]


def prompt_tokens(*turns: str) -> int:
    """The fake's prompt length for these user turns (one token per character)."""
    messages = [{"role": "user", "content": t} for t in turns]
    return len(FakeTemplate().render(messages, add_generation_prompt=True))


@pytest.fixture
def fake(monkeypatch):
    """``ladder chat`` and ``generate`` on a fake model: a 2048-token context (the default),
    8192 allowed by the model, as SmolLM2's; the model, to read what it was asked."""
    model = FakeModel(2048)
    loaded = ladder_chat.Loaded(
        model, SimpleNamespace(__name__="levels.fake"), "fake", FakeTokenizer(), FakeTemplate(),
        stop_ids=(EOS,), dtype="float64", model_context=8192,
    )  # fmt: skip
    monkeypatch.setattr(ladder_chat, "load", lambda args, chat: loaded)
    return model


def _one_error(capsys, argv: list[str]) -> str:
    assert ladder(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err.strip()


def test_a_prompt_that_does_not_fit_says_what_to_change(capsys, fake):
    """The prompt, the room, the --context in use and how far the model goes; never a
    --max-new-tokens that was not given."""
    long = "x" * 2400
    n = prompt_tokens(long)
    assert _one_error(capsys, ["chat", "-p", long]) == (
        f"ladder chat: error: the prompt is {n} tokens; --context 2048 (the default) leaves no "
        "room for an answer (the model allows 8192: try --context 4096)"
    )
    short = prompt_tokens("Hi")
    assert _one_error(capsys, ["chat", "-p", "Hi", "--max-new-tokens", "3000"]) == (
        f"ladder chat: error: the prompt is {short} tokens; --context 2048 (the default) leaves "
        f"room for {2048 - short} tokens, not --max-new-tokens 3000 (the model allows 8192: "
        "try --context 4096)"
    )
    huge = "x" * 9000
    assert _one_error(capsys, ["generate", "-p", huge]).endswith(
        "leaves no room for an answer (the model allows at most 8192: a shorter prompt)"
    )
    assert fake.calls == []  # nothing reached the model
    assert capsys.readouterr().out == ""  # not even generate's echo of the prompt


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"], ids=["empty", "spaces", "blank lines"])
@pytest.mark.parametrize("command", ["chat", "generate"])
def test_a_prompt_with_no_text_is_one_line_before_the_model_loads(
    capsys, monkeypatch, fake, command, prompt
):
    """Not a silent exit 0 with nothing printed: the same line and status from both."""
    loads = []
    monkeypatch.setattr(ladder_chat, "load", lambda args, chat: loads.append(args))
    error = _one_error(capsys, [command, "-p", prompt])
    assert error == f"ladder {command}: error: --prompt has no text (it is empty, or only spaces)"
    assert loads == [] and fake.calls == []


def test_a_prompt_that_fits_answers_in_the_room_left(capsys, fake):
    """Without --max-new-tokens, a prompt that leaves fewer than 256 tokens gets what is left."""
    text = "x" * (2048 - 10 - prompt_tokens(""))  # leaves 10 tokens
    assert ladder(["chat", "-p", text]) == 0
    assert fake.calls[-1][1] == 10
    assert ladder(["chat", "-p", "Hi"]) == 0
    assert fake.calls[-1][1] == ladder_chat.DEFAULT_NEW_TOKENS


def test_the_repl_commands_and_a_turn_too_long_are_answered_locally(capsys, monkeypatch, fake):
    turns = ["Hi", "/help", "/what now", "y" * 3000, "Again", "/clear", "Hi", "/quit", "never"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(turns) + "\n"))
    assert ladder(["chat"]) == 0
    out, err = capsys.readouterr()
    assert "/help   this list" in err and "/clear  forget" in err and "/quit   leave" in err
    assert "unknown command /what; /help lists them" in err
    # Refused as -p refuses it (the history was no help: the turn alone is too long), and the
    # conversation goes on with its history as it was.
    n = prompt_tokens("y" * 3000)
    assert f"not sent: the prompt is {n} tokens; --context 2048 (the default) leaves no " in err
    prompts = [text for text, _ in fake.calls]  # no command, no refused turn, reached the model
    assert prompts == [
        "<user>Hi\n<assistant>",
        "<user>Hi\n<assistant>ok\n<user>Again\n<assistant>",
        "<user>Hi\n<assistant>",  # after /clear
    ]
    assert out == "ok\n" * 3


SPEEDS = {  # (prompt tokens, prompt s, new tokens, decode s) -> the line
    (37, 0.25, 8, 0.5): "[prompt 37 tokens in 0.25 s (148.0 tok/s) | decode 7 tokens in 0.50 s (14.0 tok/s) | w]",
    (37, 0.25, 2, 0.5): "[prompt 37 tokens in 0.25 s (148.0 tok/s) | decode 1 token in 0.50 s (2.0 tok/s) | w]",
    # One new token is the prompt's pass alone: no decode to report.
    (37, 0.25, 1, 0.0): "[prompt 37 tokens in 0.25 s (148.0 tok/s) | w]",
    # Interrupted before the prompt's pass ended: no rate.
    (37, 0.3, 0, 0.0): "[prompt 37 tokens, no new token after 0.30 s | w]",
    # A clock that saw no time pass: no rate either, rather than a division by zero.
    (1, 0.0, 3, 0.0): "[prompt 1 token in 0.00 s (-) | decode 2 tokens in 0.00 s (-) | w]",
}  # fmt: skip


@pytest.mark.parametrize("number", [2, 3])  # level 4 builds as level 3 does
def test_a_chat_model_takes_the_weights_it_is_handed(number):
    """``build(owned=True)`` (what ``ladder chat`` does with the weights it just read) makes
    the torch levels' parameters of the arrays themselves where they fit (float32, and
    row-major as the compiled step holds them): no second copy of every weight; without it
    every parameter is a copy, and a caller's arrays never change with the model."""
    import numpy as np
    import torch

    import levels
    import loading
    from levels.common.params import init_params
    from levels.level2_torch_manual.arrays import row_major

    level = levels.load(str(number))
    config = levels.TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1, d_ff=16)
    params = init_params(config, "decoder_only", seed=0, scheme="random")
    params = {k: np.ascontiguousarray(v, np.float32) for k, v in params.items()}
    before = {k: v.copy() for k, v in params.items()}

    def shared(model):
        addresses = {p.data_ptr() for p in model.parameters()}
        return {k for k, v in params.items() if v.ctypes.data in addresses}

    copied = loading.build(level, config, params, "float32", "cpu")
    assert shared(copied) == set()
    with row_major():  # every matrix in the arrays' own layout, as a compiled model holds them
        owned = loading.build(level, config, params, "float32", "cpu", owned=True)
    assert shared(owned) == set(params)
    owned64 = loading.build(level, config, params, "float64", "cpu", owned=True)
    assert shared(owned64) == set()  # another dtype: a cast, so a copy
    with torch.no_grad():
        copied.norm.weight.add_(1.0)
        owned64.norm.weight.add_(1.0)
    assert all((params[k] == before[k]).all() for k in params)  # the copies are apart
    with torch.no_grad():
        owned.norm.weight.add_(1.0)
    assert (params["norm.weight"] == before["norm.weight"] + 1).all()  # the adopted are not


@pytest.mark.parametrize("speed", list(SPEEDS), ids=str)
def test_the_speeds_line(speed):
    assert ladder_chat.Speed(*speed).line("w") == SPEEDS[speed]


def test_the_speeds_line_after_one_and_two_new_tokens(capsys, fake):
    assert ladder(["chat", "-p", "Hi", "--max-new-tokens", "1", "--threads", "2"]) == 0
    line = capsys.readouterr().err.strip()
    assert re.fullmatch(
        rf"\[prompt {prompt_tokens('Hi')} tokens in [\d.]+ s \([\d.]+ tok/s\) \| "
        r"fake, float64, 2 threads \(--threads\)\]",
        line,
    ), line
    assert ladder(["chat", "-p", "Hi", "--max-new-tokens", "2"]) == 0
    assert "| decode 1 token in " in capsys.readouterr().err
    _one_error(capsys, ["chat", "-p", "Hi", "--max-new-tokens", "0"])  # refused, never -1


@pytest.mark.parametrize(
    ("cores", "load", "argv", "said"),
    [
        (2, 1.2, [], "1 thread (load average 1.2 on 2 cores; --threads 2 for every core)"),
        (2, 2.6, [], "1 thread (load average 2.6 on 2 cores; --threads 2 for every core)"),
        (2, 0.2, [], "2 threads (every core)"),
        (16, 0.0, [], "8 threads (at most 8 by default; --threads 16 for every core)"),
        (16, 12.4, [], "4 threads (load average 12.4 on 16 cores; --threads 16 for every core)"),
        (2, 1.2, ["--threads", "2"], "2 threads (--threads)"),
    ],
)  # fmt: skip
def test_the_threads_and_why(monkeypatch, cores, load, argv, said):
    from ladder.cli import build_parser

    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    args = build_parser().parse_args(["chat", *argv])
    assert str(ladder_chat._threads(args)) == said


class FakeCompiledModel(FakeModel):
    """The fake with level 3's compiled decode step: ``prepare_decode`` "compiles" (writes
    the step's file, for the thread count torch has now) or loads what is there, and says
    which as level 3 does; every call is recorded in ``events``, beside the lines printed."""

    def __init__(self, context: int, events: list):
        super().__init__(context)
        self.config = SimpleNamespace(max_seq_len=context)
        self.compiled_decode, self.decode_report, self.device = True, None, "cpu"
        self.events = events

    def prepare_decode(self, batch: int, tokens: int = 1):
        import torch

        from levels.level3_sdpa_flash import compiled

        path = compiled.package_path(self, batch, tokens=tokens)
        how = "loaded" if path.is_file() else "compiled"
        path.write_bytes(b"step")
        passes = "" if tokens == 1 else f" ({tokens} tokens a pass)"
        self.events.append(f"{how} for {torch.get_num_threads()} threads{passes}")
        self.decode_report = compiled.CompileReport(how, 42.0, path)
        return self.decode_report


@pytest.fixture
def compiled_fake(monkeypatch, tmp_path):
    """``ladder chat`` on a fake whose decode step is compiled, with a cache of its own: a
    step's file is named by what level 3's key holds that matters here (the context and
    the threads torch runs with); -> a function that builds the model of a run."""
    import torch

    from levels.level3_sdpa_flash import compiled

    def package_path(model, batch, cache_dir=None, tokens=1):
        threads = torch.get_num_threads()
        return tmp_path / f"decode-{model.config.max_seq_len}-{threads}-{tokens}.pt2"

    monkeypatch.setattr(compiled, "package_path", package_path)
    monkeypatch.setattr(compiled, "compiler_missing", lambda: None)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    events: list[str] = []

    def run(capsys, argv: list[str], context: int = 2048, load: float = 0.0, draft=None):
        model = FakeCompiledModel(context, events)
        loaded = ladder_chat.Loaded(
            model, SimpleNamespace(__name__="levels.fake"), "fake", FakeTokenizer(),
            FakeTemplate(), stop_ids=(EOS,), dtype="float32", model_context=8192, draft=draft,
        )  # fmt: skip
        monkeypatch.setattr(ladder_chat, "load", lambda args, chat: loaded)
        monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
        events.clear()
        assert ladder(["chat", "-p", "Hi", *argv]) == 0
        return [*capsys.readouterr().err.splitlines(), *events]

    return run


def test_a_compile_is_announced_before_it_starts_with_its_expected_time(capsys, compiled_fake):
    """The first chat of a model says what it compiles and for how long, before the compile
    (whose report follows); the next one loads the step without a word of compiling."""
    first = compiled_fake(capsys, [])  # a quiet machine of 4 cores: 4 threads
    assert first[0] == (
        "compiling the decode step of fake for context 2048, float32, 4 threads: about 1 "
        "minute, once; later runs load it from the cache"
    )
    assert first[1].startswith("decode compiled in 42.0 s, once") and first[-1] == (
        "compiled for 4 threads"
    )
    again = compiled_fake(capsys, [])
    assert not any("compiling" in line for line in again) and again[-1] == "loaded for 4 threads"


def test_a_speculating_chat_prepares_the_check_of_its_guesses_once(capsys, compiled_fake):
    """With a draft, the pass that checks ``--draft-tokens`` guesses is compiled too, after
    the decode step and announced as the decode step is, with the time the decode step's
    compile just took (no check was compiled here before); the next chat loads both."""
    from engine import NGramDraft

    first = compiled_fake(capsys, ["--draft-tokens", "3"], draft=NGramDraft())
    assert first[2] == (
        "compiling the check of 3 guesses (--speculate) of fake for context 2048, float32, "
        "4 threads: about 42 s, as this model's last compile here, once; later runs load it "
        "from the cache"
    )
    assert first[-2:] == ["compiled for 4 threads", "compiled for 4 threads (4 tokens a pass)"]
    again = compiled_fake(capsys, ["--draft-tokens", "3"], draft=NGramDraft())
    assert not any("compiling" in line for line in again)
    assert again[-2:] == ["loaded for 4 threads", "loaded for 4 threads (4 tokens a pass)"]


def test_another_load_average_runs_the_cached_step_instead_of_compiling(capsys, compiled_fake):
    """Compiled at 4 threads on a quiet machine; at a load average that leaves 1 core free,
    the chat runs the step it has (and says why), where it used to compile one for 1."""
    compiled_fake(capsys, [])
    busy = compiled_fake(capsys, [], load=3.0)
    assert busy[-1] == "loaded for 4 threads" and not any("compiling" in line for line in busy)
    assert busy[-2].endswith(
        "4 threads (the count its cached decode step is compiled for; --threads 1, as the "
        "load average gives, would compile one)]"
    )
    # Asked for outright, another count compiles, and says so first with the time the
    # model's last compile took, and what is cached instead.
    asked = compiled_fake(capsys, ["--threads", "2"], load=3.0)
    assert asked[0] == (
        "compiling the decode step of fake for context 2048, float32, 2 threads: about 42 s, "
        "as its last compile here, once (cached here for context 2048, float32, 4 threads); "
        "later runs load it from the cache"
    )
    assert asked[-1] == "compiled for 2 threads"
    # With steps for 2 and 4 cached and 1 core free, the nearest count runs: 2.
    assert compiled_fake(capsys, [], load=3.0)[-1] == "loaded for 2 threads"


def test_another_context_is_announced_with_what_is_cached(capsys, compiled_fake):
    compiled_fake(capsys, [])
    other = compiled_fake(capsys, ["--context", "4096"], context=4096)
    assert other[0].startswith(
        "compiling the decode step of fake for context 4096, float32, 4 threads: about 42 s"
    )
    assert "(cached here for context 2048, float32, 4 threads)" in other[0]
    assert other[-1] == "compiled for 4 threads"


def test_the_slow_rungs_seconds_a_token_are_one_figure_wherever_they_are_said(
    smollm2_gguf, monkeypatch
):
    """The README, run a real model's page, chat's warnings and the benchmark's rows
    (``loading.slow``'s figures) say the same seconds a token for SmolLM2 at level 0
    and at level 4 on a CPU (the README said 3 where the warning said 5; the benchmark said
    "minutes a token" for level 4, which took seconds)."""
    from benchmarks.real_model import LAYERS, PARAMS
    from levels import gguf
    from loading import slow
    from loading.slow import INTERPRETED_SECONDS_PER_LAYER, LEVEL0_SECONDS_PER_MAC

    level0, level4 = (
        round(PARAMS * LEVEL0_SECONDS_PER_MAC),
        round(LAYERS * INTERPRETED_SECONDS_PER_LAYER),
    )
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"every token written takes level 0 about {level0} s here" in readme
    assert f"every token written takes level 4 about {level4} s here" in readme
    checkpoints = " ".join((ROOT / "docs" / "checkpoints.md").read_text().split())
    assert f"about {level0} s a token for this model" in checkpoints
    config = gguf.config_of(smollm2_gguf)
    # At a load average of 5 on 2 cores, a third of a core: the share the figures were timed
    # on. At 11, a sixth: twice the seconds (loading/slow.py says them at the load it finds).
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 5.0, 5.0))
    assert f"takes about {level0} s a new token here" in slow.warning(levels.load("0"), config)
    monkeypatch.setattr(os, "getloadavg", lambda: (11.0, 11.0, 11.0))
    twice = round(2 * PARAMS * LEVEL0_SECONDS_PER_MAC)
    assert f"takes about {twice} s a new token here" in slow.warning(levels.load("0"), config)
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 5.0, 5.0))
    assert slow.warning(levels.load("3"), config) is None
    try:
        four = levels.load("4")
    except levels.LevelUnavailable as exc:
        pytest.skip(str(exc))
    said = slow.warning(four, config)
    assert said.startswith("level 4 runs its kernels in Triton's interpreter here (no GPU)")
    assert f"takes about {level4} s a new token here" in said
    assert slow.warning(four, config, "cuda") is None  # compiled kernels on a GPU


# ----------------------------------------------------------------------------- on a terminal

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 60  # for the child's output or its reading: its imports (numpy) on a busy machine
ESCAPES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")  # readline's terminal controls (bracketed paste)
TURNS = """\
import sys
from ladder.chat import _lines
for turn in _lines():
    print("TURN", len(turn), repr(turn[:20]), flush=True)
print("readline" in sys.modules, "END", flush=True)
"""


class Terminal:
    """A child process on a pseudo-terminal: what it prints, what the keyboard sends."""

    def __init__(self, code: str):
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: stdin, stdout and stderr are the terminal
            os.chdir(ROOT)
            os.execv(sys.executable, [sys.executable, "-c", code])
        self.out = b""

    def _read(self, timeout: float) -> None:
        if select.select([self.fd], [], [], timeout)[0]:
            try:
                self.out += os.read(self.fd, 1 << 16)
            except OSError:  # the child has exited and closed the terminal
                pass

    def send(self, data: bytes) -> None:
        """Type (or paste) ``data``, reading what the child echoes meanwhile: the terminal's
        buffers are small, and a child blocked on its echo would never read the rest."""
        deadline = time.monotonic() + WAIT_S
        while data:
            assert time.monotonic() < deadline, (
                f"the terminal took no more input: {self.out[-300:]!r}"
            )
            self._read(0)
            if select.select([], [self.fd], [], 0.1)[1]:
                data = data[os.write(self.fd, data[:1024]) :]

    def expect(self, pattern: bytes) -> None:
        """Wait until the output matches ``pattern``."""
        deadline = time.monotonic() + WAIT_S
        while not re.search(pattern, self.out, re.S):
            assert time.monotonic() < deadline, f"waited for {pattern!r}, got {self.out[-300:]!r}"
            self._read(0.1)


@pytest.fixture
def terminal():
    pytest.importorskip("pty")  # Unix only, as the terminal behaviour it checks
    pytest.importorskip("readline")
    term = Terminal(TURNS)
    yield term
    if os.waitpid(term.pid, os.WNOHANG) == (0, 0):  # still waiting for input: a failed test
        os.kill(term.pid, signal.SIGKILL)
        os.waitpid(term.pid, 0)
    os.close(term.fd)


def test_the_terminal_edits_lines_keeps_long_turns_and_pastes_whole(terminal):
    """readline is on; a turn longer than the 4095 bytes the terminal's canonical mode would
    keep (what cut an 8760-character paste to 1239 tokens) arrives whole; the lines of a
    paste are one turn, bracketed (readline 8.1's default) or not; Ctrl-D ends the line."""
    terminal.expect(rb">>> ")
    terminal.send(b"typed\r")
    terminal.expect(rb"TURN 5 'typed'.*>>> ")  # the next prompt: the typed turn is over
    terminal.send(b"a" * 8760 + b"\r")
    terminal.expect(rb"TURN 8760 .*>>> ")
    terminal.send(b"line one\rline two\r")  # a paste, in one write
    terminal.expect(rb"TURN 17 'line one\\nline two'.*>>> ")
    terminal.send(b"\x1b[200~p one\rp two\x1b[201~\r")  # as a terminal brackets a paste
    terminal.expect(rb"TURN 11 'p one\\np two'.*>>> ")
    terminal.send(b"\x04")  # Ctrl-D
    terminal.expect(rb"END\r\n")
    assert ESCAPES.sub(b"", terminal.out).endswith(b">>> \r\nTrue END\r\n")
