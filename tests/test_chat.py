"""``ladder chat`` and ``ladder generate`` on the real model (SmolLM2-135M-Instruct).

What a user sees: the answer streamed on stdout, ended by the model's end-of-turn token (never
printed), a ``--stop`` string or ``--max-new-tokens``; one line of prompt and decode speeds
per answer on stderr; the conversation's history through the chat template, ``/clear`` and
``/quit``; greedy answers the same at every level. The tokens themselves are held to
transformers' in tests/test_real_models.py; here it is the command around them.
"""

from __future__ import annotations

import io
import re
import sys

import pytest

from ladder.cli import main as ladder

QUESTION = "What is the capital of France?"
SPEED = re.compile(
    r"^\[prompt (\d+) tokens in [\d.]+ s \([\d.]+ tok/s\) \| decode (\d+) tokens in "
)


def _chat(capsys, *argv, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    status = ladder(["chat", "--model", "smollm2-135m", *argv])
    out, err = capsys.readouterr()
    speeds = [tuple(map(int, m.groups())) for m in map(SPEED.match, err.splitlines()) if m]
    return status, out, err, speeds


@pytest.fixture(autouse=True)
def _pulled(smollm2_gguf):
    """The model is in the cache before the command runs (or the module is skipped)."""


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
    (["--max-new-tokens", "5000", "--context", "64", "-p", "x"], 2, "exceed the --context of 64"),
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
    assert status == 1 and "has no chat template; use ladder generate" in err


@pytest.mark.extended
@pytest.mark.real_model  # level 0: SmolLM2 as 4 GB of Python floats (test_real_gemma.py)
def test_level0_chats_slowly_and_says_so(capsys):
    argv = ["-p", "Hi", "--system", "Be brief.", "--temperature", "0", "--max-new-tokens", "3"]
    status, out, err, speeds = _chat(capsys, *argv, "--level", "0")
    assert status == 0 and "level 0 computes in pure Python" in err
    _, want, _, _ = _chat(capsys, *argv, "--level", "1")
    assert out == want and speeds[0][1] <= 2
