"""``ladder serve`` (serving/) on the real model, through OpenAI's own client.

A module fixture starts ``python -m ladder serve`` on 127.0.0.1 and a free port (level 3,
eager: the compile is ``ladder chat``'s business, tested there), waits for ``/health``,
and stops it at the end, leaving no process behind. The answers are held to ``ladder
chat --temperature 0`` and ``ladder generate``; the bad requests to OpenAI's error body
and status; after each of them, and after a client that leaves mid-stream, the server
still answers. The queue's limit is the worker's own test, on a model that waits.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from _helpers import discriminating_params

from ladder.cli import main as ladder

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def served(smollm2_gguf):
    """The server on a free port of 127.0.0.1, eager (the compile is ``ladder chat``'s to
    test), with a small body limit to reach: its base URL and its output's lines so far."""
    from serving.launch import serving

    output: list[str] = []
    flags = ("--no-compile", "--threads", "1", "--max-body", "200000")
    with serving(*flags, start_s=120, output=output) as base:
        yield base, output


@pytest.fixture(scope="module")
def server(served):
    return served[0]


def _logged(output: list[str], route: str, since: int) -> str:
    """The first line the server logged for ``route`` after its first ``since`` lines (a
    line is written when its response is over: a moment after the client has it)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in output[since:]:
            if f" {route} " in line:
                return line.rstrip("\n")
        time.sleep(0.05)
    raise AssertionError(f"no line for {route} in {output[since:]}")


LOG_LINE = re.compile(  # time, client, method, route, status, then the parts it has
    r"\d\d:\d\d:\d\d \S+ (?P<method>[A-Z]+) (?P<route>\S+) (?P<status>\d{3})"
    r"(?P<rest>(?: \| [^|]+)*) \| total (?P<total>\d+\.\d\d) s"
)


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")  # a dev dependency: present wherever tests run
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=60)


def _ladder(capsys, *argv) -> str:
    assert ladder([*argv, "--level", "3", "--no-compile", "--threads", "1"]) == 0
    return capsys.readouterr().out


def _post(server: str, path: str, body, *, raw: bytes | None = None) -> tuple[int, dict]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{server}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def _get(server: str, path: str, method: str = "GET") -> tuple[int, dict, str | None]:
    """``method path`` with no body -> (status, JSON body, its Allow header)."""
    request = urllib.request.Request(f"{server}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, json.load(r), r.headers.get("Allow")
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc), exc.headers.get("Allow")


# ----------------------------------------------------------------------------- answers


def test_chat_answers_as_ladder_chat_does(client, capsys):
    want = _ladder(capsys, "chat", "-p", QUESTION, "--temperature", "0").strip()
    reply = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": QUESTION}], temperature=0
    )
    (choice,) = reply.choices
    assert choice.message.content == want and "Paris" in want
    assert choice.finish_reason == "stop"  # the model's end-of-turn token
    usage = reply.usage
    assert usage.prompt_tokens == 37 and usage.total_tokens == 37 + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0


def test_streaming_gives_the_same_text_and_the_usage_last(client):
    messages = [{"role": "user", "content": QUESTION}]
    whole = client.chat.completions.create(model="smollm2-135m", messages=messages, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="smollm2-135m",
            messages=messages,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3  # pieces
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_completions_continue_the_text_as_ladder_generate(client, capsys):
    prompt = "The capital of France is"
    want = _ladder(capsys, "generate", "-p", prompt, "--max-new-tokens", "8")
    reply = client.completions.create(
        model="smollm2-135m", prompt=prompt, max_tokens=8, temperature=0
    )
    assert prompt + reply.choices[0].text == want.rstrip("\n")  # generate prints the prompt too
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 8


def test_models_lists_the_one_served(client):
    assert [m.id for m in client.models.list().data] == ["smollm2-135m"]


def test_limits_stops_and_seeds(client):
    messages = [{"role": "user", "content": QUESTION}]
    one = client.chat.completions.create(
        model="smollm2-135m", messages=messages, temperature=0, max_tokens=1
    )
    assert one.choices[0].finish_reason == "length" and one.usage.completion_tokens == 1
    assert one.choices[0].message.content == "The"
    cut = client.chat.completions.create(
        model="smollm2-135m", messages=messages, temperature=0, stop=[" Paris"]
    )
    assert cut.choices[0].message.content == "The capital of France is"
    assert cut.choices[0].finish_reason == "stop"
    drawn = [
        client.chat.completions.create(
            model="smollm2-135m", messages=messages, temperature=1.0, seed=seed, max_tokens=12
        )
        .choices[0]
        .message.content
        for seed in (7, 7, 8)
    ]
    assert drawn[0] == drawn[1]  # a seed repeats a sampled answer


def test_a_request_without_a_temperature_samples_at_openai_s_default_of_1(client):
    """A plain curl's answer is sampled (the README says so, and shows the greedy one): it
    is temperature 1's for the same seed, on a seed whose sampled answer is not greedy's."""
    messages = [{"role": "user", "content": QUESTION}]

    def ask(**sampling) -> str:
        reply = client.chat.completions.create(
            model="smollm2-135m", messages=messages, max_tokens=12, **sampling
        )
        return reply.choices[0].message.content

    greedy = ask(temperature=0)
    seed = next((s for s in range(1, 9) if ask(temperature=1.0, seed=s) != greedy), None)
    assert seed is not None, "eight seeds drew greedy's answer at temperature 1"
    assert ask(seed=seed) == ask(temperature=1.0, seed=seed) != greedy


def test_a_speculated_answer_is_the_plain_one_and_its_usage_counts_the_guesses(client):
    # A grounded question: the answer repeats the prompt's words, which the n-gram draft finds.
    text = "The river Ness runs from Loch Ness to the sea at Inverness. " * 3
    messages = [{"role": "user", "content": f"{text}Repeat the first sentence."}]
    ask = dict(model="smollm2-135m", messages=messages, temperature=0, max_tokens=24)
    plain = client.chat.completions.create(**ask)
    guessed = client.chat.completions.create(
        **ask, extra_body={"speculate": "ngram", "draft_tokens": 4}
    )
    assert guessed.choices[0].message.content == plain.choices[0].message.content
    assert guessed.usage.completion_tokens == plain.usage.completion_tokens
    details = guessed.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0  # the repeated sentence is guessed and kept
    assert details.accepted_prediction_tokens < guessed.usage.completion_tokens
    none = plain.usage.completion_tokens_details
    assert (none.accepted_prediction_tokens, none.rejected_prediction_tokens) == (0, 0)


# ----------------------------------------------------------------------------- bad requests


def _error(status: int, body: dict, code: int, param=None, error_code=None) -> None:
    assert status == code, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param and error["code"] == error_code


@pytest.mark.parametrize(
    "body, code, param, error_code",
    [
        ({"messages": "hello"}, 400, "messages", None),
        ({"messages": []}, 400, "messages", None),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0]", None),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "temperature", None),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 2.5}, 400, "temperature", None),
        ({"messages": [{"role": "user", "content": "x"}], "top_p": 0}, 400, "top_p", None),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, 400, "max_tokens", None),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}, 400, "max_tokens", None),
        ({"messages": [{"role": "user", "content": "x"}], "n": 0}, 400, "n", None),
        ({"messages": [{"role": "user", "content": "x"}], "n": 999}, 400, "n", None),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens", None),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, 400, "logprobs", None),
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "top_logprobs", None),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", None),
        ({"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 2.5}, 400, "frequency_penalty", None),
        ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": "x"}, 400, "presence_penalty", None),
        ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}}, 400, "logit_bias", None),
        ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"49152": 1}}, 400, "logit_bias", None),
        ({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 101}}, 400, "logit_bias", None),
        ({"messages": [{"role": "user", "content": "x"}], "logit_bias": [5]}, 400, "logit_bias", None),
        ({"messages": [{"role": "user", "content": "x"}], "functions": [{"name": "f"}]}, 400, "functions", None),
        ({"messages": [{"role": "user", "content": "x"}], "stop": ["a"] * 5}, 400, "stop", None),
        ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"}, 404, "model", "model_not_found"),
        ({"messages": [{"role": "user", "content": "word " * 2100}]}, 400, "messages", "context_length_exceeded"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4000}, 400, "messages", "context_length_exceeded"),
        ({"messages": [{"role": "user", "content": "x"}], "speculate": "eagle"}, 400, "speculate", None),
        ({"messages": [{"role": "user", "content": "x"}], "draft_tokens": 0}, 400, "draft_tokens", None),
    ],
)  # fmt: skip
def test_a_bad_request_is_refused_with_the_field_named(server, body, code, param, error_code):
    status, answer = _post(server, "/v1/chat/completions", body)
    _error(status, answer, code, param, error_code)
    _all_blocks_free(server)  # still up, and nothing held


def _all_blocks_free(server: str) -> None:
    """``/health`` answers, and every KV block is back in the pool (within a few seconds: a
    request leaves the batch at the worker's next turn)."""
    deadline = time.monotonic() + 5
    while True:
        with urllib.request.urlopen(f"{server}/health", timeout=10) as r:
            health = json.load(r)
        blocks = health["kv_blocks"]
        if blocks["free"] == blocks["total"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert health["status"] == "ok" and blocks["free"] == blocks["total"] > 0


@pytest.mark.parametrize(
    "method, path, code, allow",
    [
        ("GET", "/v1/engines", 404, None),
        ("POST", "/", 405, "GET"),  # the chat page
        ("POST", "/v1/models", 405, "GET"),
        ("GET", "/v1/chat/completions", 405, "POST"),
        ("DELETE", "/health", 405, "GET"),
    ],
)
def test_an_unknown_route_or_method_is_openais_error_body(server, method, path, code, allow):
    status, body, allowed = _get(server, path, method)
    error_code = {404: "not_found", 405: "method_not_allowed"}[code]
    _error(status, body, code, error_code=error_code)
    assert f"{method} {path}" in body["error"]["message"]
    if allow is not None:  # the Allow header says what the route takes, as HTTP asks
        assert allow in allowed.split(", ") and allow in body["error"]["message"]
    else:  # and a wrong route lists the right ones
        assert "POST /v1/chat/completions" in body["error"]["message"]


def test_a_failure_of_the_server_is_openais_error_body_and_a_log_line():
    """A handler that raises: 500 with OpenAI's body (the traceback is the server's to log),
    and the request's line; without a log (``--quiet``), no line at all."""
    from types import SimpleNamespace

    from starlette.testclient import TestClient

    from serving.api import Server

    class Failing(Server):
        async def models(self, request):
            raise RuntimeError("a broken disk")

    loaded = SimpleNamespace(tokenizer=None, stop_ids=(0,))
    worker = SimpleNamespace(pool=None, loaded=loaded)
    lines: list[str] = []
    with TestClient(
        Failing(worker, "m", log=lines.append).app(), raise_server_exceptions=False
    ) as c:
        response = c.get("/v1/models")
        health = c.get("/health")
    _error(response.status_code, response.json(), 500)
    assert response.json()["error"]["type"] == "server_error" and health.status_code == 200
    assert [LOG_LINE.fullmatch(line)["status"] for line in lines] == ["500", "200"]
    assert " GET /v1/models 500 | the server failed: RuntimeError | total " in lines[0]
    quiet = Failing(worker, "m", log=None).app()
    with TestClient(quiet, raise_server_exceptions=False) as c:
        assert c.get("/v1/nothing").status_code == 404
    assert type(quiet).__name__ == "Starlette"  # no logging middleware around it


def test_malformed_json_and_a_body_too_large(server):
    status, body = _post(server, "/v1/chat/completions", None, raw=b'{"messages": [')
    _error(status, body, 400)
    status, body = _post(server, "/v1/completions", None, raw=b"[1, 2]")
    _error(status, body, 400)
    big = json.dumps({"prompt": "x" * 300_000}).encode()  # the fixture's --max-body is 200000
    status, body = _post(server, "/v1/completions", None, raw=big)
    _error(status, body, 413)
    status, body = _post(server, "/v1/completions", {"prompt": 5})
    _error(status, body, 400, "prompt")
    _all_blocks_free(server)


def test_a_client_that_leaves_mid_stream_stops_its_request(served, client):
    """A stream of up to 400 tokens read for two chunks, then closed: the server stops that
    request (the next one waits for no more than a few of its tokens), logs it as cancelled
    with the tokens it made, and answers again."""
    server, output = served
    since = len(output)
    body = {"messages": [{"role": "user", "content": "Count from 1 to 500."}], "temperature": 0,
            "max_tokens": 400, "stream": True}  # fmt: skip
    request = urllib.request.Request(
        f"{server}/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    response = urllib.request.urlopen(request, timeout=60)
    lines = [response.readline() for _ in range(4)]  # two events and their blank lines
    assert lines[0].startswith(b"data: ")
    response.close()  # the client goes away
    start = time.monotonic()
    reply = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": QUESTION}], temperature=0
    )
    assert "Paris" in reply.choices[0].message.content
    # 400 tokens eager take ten seconds or more here; a stopped request leaves the next
    # one waiting a token or two (plus the time for the server to see the close).
    assert reply.model_extra["timings"]["queued_s"] < 5.0
    assert time.monotonic() - start < 10.0
    _all_blocks_free(server)  # the cancelled request's blocks came back
    line = _logged(output, "/v1/chat/completions", since)  # the cut one: it came first
    made = re.search(
        r" 200 \| prompt \d+ tokens \(\d+ cached\) \| (\d+) generated \(cancelled\)", line
    )
    assert made and 1 <= int(made[1]) < 400, line


def test_each_request_is_one_line_in_the_log(served, client):
    """A completion, a refused request and a wrong route: a line each, with the method,
    the route, the status, the tokens (the prompt's, the answer's, why it ended), the time
    to the first token and the total."""
    server, output = served
    since = len(output)
    reply = client.completions.create(
        model="smollm2-135m", prompt="The capital of France is", max_tokens=5, temperature=0
    )
    line = _logged(output, "/v1/completions", since)
    m = LOG_LINE.fullmatch(line)
    assert m and (m["method"], m["route"], m["status"]) == ("POST", "/v1/completions", "200")
    prompt, generated, first = m["rest"].split(" | ")[1:]
    assert prompt == f"prompt {reply.usage.prompt_tokens} tokens (0 cached)"
    assert generated == f"{reply.usage.completion_tokens} generated (length)"
    ttft = float(re.fullmatch(r"first token (\d+\.\d\d) s", first)[1])
    assert 0 < ttft <= float(m["total"])  # the first token comes before the end

    since = len(output)
    status, _ = _post(server, "/v1/completions", {"prompt": "Hi", "temperature": 9})
    line = _logged(output, "/v1/completions", since)
    assert status == 400 and LOG_LINE.fullmatch(line), line
    assert " 400 | 'temperature' must be in [0, 2], got 9 | prompt " in line

    since = len(output)
    status, _, _ = _get(server, "/v1/engines")
    line = _logged(output, "/v1/engines", since)
    assert status == 404 and LOG_LINE.fullmatch(line) and " GET /v1/engines 404 | no route" in line


# ----------------------------------------------------------------------------- the worker


class _Letters:
    """A tokenizer for a small random model: id ``i`` is the character ``chr(0x100 + i)``."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(0x100 + i) for i in ids)

    def get_added_tokens_decoder(self):
        return {}

    def token_to_id(self, token):
        return None


class _Counting:
    """A plain model whose next token is the position after the last one it was fed, mod
    ``V`` (the only token of finite logit, at any temperature), and whose passes wait for
    ``release``: enough to watch a queue at work."""

    def __init__(self, release: threading.Event, V: int = 8):
        from types import SimpleNamespace

        from levels.common.cache import Cache

        self.release, self.V, self.device = release, V, None
        self.config = SimpleNamespace(max_seq_len=64, pad_id=0, vocab_size=V, n_layers=1)
        self.arrays = SimpleNamespace(asarray=lambda a, device=None: np.asarray(a),
                                      to_numpy=np.asarray, inference=contextlib.nullcontext)  # fmt: skip
        self.new_cache = lambda batch: Cache(self.config, batch)

    def transformer(self, ids, positions, cache=None, last=False):
        self.release.wait(10)
        cache.length += ids.shape[1]
        at = positions.max(axis=1, keepdims=True) if last else positions  # (B, T')
        return np.where(np.eye(self.V, dtype=bool)[(at + 1) % self.V], 0.0, -np.inf)  # (B,T',V)


def test_the_engine_queues_at_most_max_queue_and_decodes_in_order():
    """On a model that waits until released: one request decoding, ``max_queue`` waiting,
    the next refused (``QueueFull``, the server's 429); then all of them finish, in order."""
    from types import SimpleNamespace

    from serving.worker import Completion, Finished, QueueFull, Worker

    release = threading.Event()
    loaded = SimpleNamespace(model=_Counting(release), tokenizer=_Letters(), stop_ids=(0,))
    worker = Worker(loaded, max_queue=2)
    done, texts = [], {}

    def deliver(name):
        def take(event):
            if isinstance(event, Finished):
                done.append((name, event.finish_reason, event.completion_tokens))
            else:
                texts[name] = texts.get(name, "") + event.text

        return take

    worker.submit(Completion([1, 2], 3), deliver("a"))
    deadline = time.monotonic() + 5
    while worker._queued and time.monotonic() < deadline:  # "a" leaves the queue to decode
        time.sleep(0.01)
    worker.submit(Completion([1], 2), deliver("b"))
    worker.submit(Completion([1], 1), deliver("c"))
    with pytest.raises(QueueFull):
        worker.submit(Completion([1], 1), deliver("d"))
    release.set()
    deadline = time.monotonic() + 10
    while len(done) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done == [("a", "length", 3), ("b", "length", 2), ("c", "length", 1)]
    text = _Letters().decode
    assert texts == {"a": text([2, 3, 4]), "b": text([1, 2]), "c": text([1])}


def test_an_address_that_cannot_be_listened_on_is_one_line_before_the_model_loads(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        assert ladder(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"--port {port}: cannot listen there" in err
    assert err.endswith("; --port N for another port")  # as ladder docs says it
    assert time.monotonic() - start < 5  # refused before any model loads


def test_blocks_without_a_batch_is_one_line_before_the_model_loads(capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free once closed
    start = time.monotonic()
    assert ladder(["serve", "--port", str(port), "--max-batch", "1", "--blocks", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--blocks" in err and "--max-batch 2" in err
    assert time.monotonic() - start < 5  # refused before any model loads


@pytest.mark.parametrize(
    "argv, says",
    [
        (["chat", "--weights", "blocked", "--compile"], "--compile"),
        (["chat", "--weights", "blocked", "--dtype", "float64"], "float32 on a CPU"),
        (["generate", "--weights", "blocked", "--level", "2"], "level 3"),
    ],
    ids=["with the compiled step", "float64", "level 2"],
)
def test_blocked_weights_misused_is_one_line_before_the_model_loads(argv, says, capsys):
    start = time.monotonic()
    assert ladder([*argv, "-p", "Hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--weights blocked" in err and says in err
    assert time.monotonic() - start < 5  # refused before any model loads


def test_serve_blocks_a_float32_batch_at_level_3_on_a_cpu_by_default():
    """``ladder serve``'s default weights for a batch: blocked where oneDNN's product runs
    (level 3, float32, a CPU), floats everywhere else; ``--weights`` overrides it."""
    from ladder.cli import build_parser
    from ladder.serve import _blocked_fits
    from levels.level3_sdpa_flash.private import blocked_missing

    def fits(*flags: str) -> bool:
        return _blocked_fits(build_parser().parse_args(["serve", *flags]))

    assert fits() == (blocked_missing() is None)  # level 3, float32, cpu: the defaults
    assert not fits("--level", "2")
    assert not fits("--dtype", "bfloat16")


# ----------------------------------------------------------------------------- batching


# The batching tests' end-of-turn id: a token the discriminating toy model writes now and then
# (about one token in fifty), so that some answers stop and most run their length.
STOP = 14


def _engine_run(level_name: str, requests: list, arrivals: list[int], draft=None, **options):
    """``requests`` submitted to an worker over a small float64 model of ``level_name``
    (``options`` the worker's), request ``i`` once the worker has run ``arrivals[i]`` decode
    steps; ``draft(model)``, when given, the draft every request speculates with; -> (texts,
    reasons: (finish reason, completion tokens, cached tokens, drafted, accepted) each, the
    worker, the model)."""
    from types import SimpleNamespace

    import torch

    import levels
    from levels import TransformerConfig
    from serving.worker import Finished, Worker

    level = levels.load(level_name)
    config = TransformerConfig(vocab_size=40, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2,
                               d_ff=32, max_seq_len=48, tie_embeddings=False)  # fmt: skip
    model = level.DecoderOnlyTransformer(config, discriminating_params(config), dtype=torch.float64)
    loaded = SimpleNamespace(model=model, level=level, tokenizer=_Letters(), stop_ids=(STOP,))
    worker = Worker(loaded, max_queue=64, **options)
    if draft is not None:
        shared = draft(model)
        for request in requests:
            request.draft, request.draft_tokens = shared, 3
    texts, reasons, done = [""] * len(requests), [None] * len(requests), threading.Event()

    def deliver(i):
        def take(event):
            if isinstance(event, Finished):
                reasons[i] = (event.finish_reason, event.completion_tokens, event.cached_tokens,
                              event.drafted_tokens, event.accepted_tokens)  # fmt: skip
                if all(reasons):
                    done.set()
            elif isinstance(event, Exception):
                reasons[i] = ("error", str(event))
                done.set()
            else:
                texts[i] += event.text

        return take

    for i in sorted(range(len(requests)), key=lambda i: arrivals[i]):
        # Until the worker has run arrivals[i] steps, or stands idle (all it had is done).
        seen, changed = worker.engine.steps, time.monotonic()
        while worker.engine.steps < arrivals[i] and time.monotonic() - changed < 0.5:
            time.sleep(0.001)
            if worker.engine.steps != seen:
                seen, changed = worker.engine.steps, time.monotonic()
        worker.submit(requests[i], deliver(i))
    assert done.wait(120), reasons
    return texts, reasons, worker, model


def _alone(model, request) -> str:
    tokens = list(
        model.stream(request.ids, request.max_tokens, temperature=request.temperature,
                     top_k=request.top_k, top_p=request.top_p, seed=request.seed, stop_ids=(STOP,))
    )  # fmt: skip
    return _Letters().decode([t for t in tokens if t != STOP])


@pytest.mark.parametrize("level_name", ["level2_torch_manual", "level3_sdpa_flash"])
def test_continuous_batching_answers_each_request_as_it_is_answered_alone(level_name):
    """Ten requests of different lengths, limits and sampling (greedy, and seeded draws at
    temperature 0.9 with top-k and top-p) arriving while others decode, at most four at
    once: each request's text is the text of ``stream`` on it alone (its seed its own
    generator, as alone), and the steps decoded several rows at a time."""
    from serving.worker import Completion

    rng = np.random.default_rng(0)
    requests, arrivals = [], []
    for i in range(10):
        ids = [int(t) for t in rng.integers(8, 40, size=int(rng.integers(1, 12)))]
        sampled = i % 3 == 2
        requests.append(Completion(ids, int(rng.integers(1, 14)), temperature=0.9 if sampled else 0.0,
                                top_k=12 if sampled else None, top_p=0.95 if sampled else None,
                                seed=100 + i if sampled else None))  # fmt: skip
        arrivals.append([0, 0, 0, 1, 2, 2, 4, 5, 9, 12][i])
    texts, reasons, worker, model = _engine_run(level_name, requests, arrivals, max_batch=4)
    _assert_alone(requests, texts, reasons, worker, model)
    assert worker.engine.rows > worker.engine.steps  # some steps decoded several requests
    assert worker.engine.rows / worker.engine.steps <= 4  # never more than max_batch


def _assert_alone(requests, texts, reasons, worker, model) -> None:
    """Each request's text is its text alone; each ended as it should; and every block went
    back to the pool."""
    for i, request in enumerate(requests):
        assert texts[i] == _alone(model, request), f"request {i}: {reasons[i]}"
        assert reasons[i][0] in ("stop", "length") and 1 <= reasons[i][1] <= request.max_tokens
    deadline = time.monotonic() + 5  # the last request's blocks are freed after its Finished
    while worker.pool.available < worker.pool.blocks and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.pool.available == worker.pool.blocks and not any(worker.pool.refs)


def _requests(n: int, seed: int, prefix=(), longest=12, most_tokens=14):
    """``n`` requests with prompts of 1 to ``longest`` tokens after ``prefix``, greedy, and
    every third one sampled (seeded, temperature 0.9, top-k and top-p)."""
    from serving.worker import Completion

    rng = np.random.default_rng(seed)
    requests = []
    for i in range(n):
        ids = list(prefix) + [
            int(t) for t in rng.integers(8, 40, size=int(rng.integers(1, longest)))
        ]
        sampled = i % 3 == 2
        requests.append(Completion(ids, int(rng.integers(1, most_tokens)),
                                temperature=0.9 if sampled else 0.0, top_k=12 if sampled else None,
                                top_p=0.95 if sampled else None, seed=100 + i if sampled else None))  # fmt: skip
    return requests


def test_the_choices_of_n_find_their_prompt_s_blocks_and_each_seed_repeats():
    """Three choices of one prompt (``after`` the first, as the server's ``n`` submits them):
    the second and third join once the first has its first token and find the prompt's
    full blocks in the prefix cache; each is its prompt alone with its own seed."""
    from serving.worker import Completion

    prompt = list(range(10, 27))  # 17 tokens: four full blocks of 4 to find, the last computed
    first = Completion(prompt, 8, temperature=0.9, seed=5)
    choices = [first] + [Completion(prompt, 8, temperature=0.9, seed=5 + i, after=first) for i in (1, 2)]  # fmt: skip
    texts, reasons, worker, model = _engine_run("level2_torch_manual", choices, [0, 0, 0],
                                                max_batch=4, blocks=40, block_size=4)  # fmt: skip
    _assert_alone(choices, texts, reasons, worker, model)
    assert [r[2] for r in reasons] == [0, 16, 16]  # cached: the first computed them for all


@pytest.mark.parametrize("drafter", ["itself", "another model"])
def test_speculated_requests_in_a_batch_answer_as_alone(drafter):
    """Eight greedy requests behind a shared prefix, four at once in a pool too small for all,
    each speculating with a draft: the model itself (every guess kept, runs that cross
    blocks) or another model (most guesses rejected, their slots rolled back). Each text is
    its text alone, plain; prefix hits and preemptions happen on the way; the usage counts
    the guesses; and every block, a rejected guess's included, is back in the pool."""
    import torch

    from engine import ModelDraft
    from levels import init_params

    def draft(model):
        if drafter == "itself":
            return ModelDraft(model)
        params = init_params(model.config, "decoder_only", seed=2, scheme="random")
        return ModelDraft(type(model)(model.config, params, dtype=torch.float64))

    requests = _requests(8, seed=6, prefix=list(range(10, 23)), longest=8, most_tokens=14)
    for request in requests:  # greedy: the speculated tokens are the plain ones
        request.temperature, request.top_k, request.top_p, request.seed = 0.0, None, None, None
    texts, reasons, worker, model = _engine_run(
        "level2_torch_manual", requests, [0, 0, 0, 0, 1, 2, 3, 4], draft=draft, max_batch=4,
        blocks=20, block_size=4,
    )  # fmt: skip
    _assert_alone(requests, texts, reasons, worker, model)
    assert worker.engine.preempted > 0 and any(r[2] for r in reasons)  # preempted; prefixes found
    drafted, accepted = (sum(r[i] for r in reasons) for i in (3, 4))
    assert drafted >= 20 and (accepted == drafted if drafter == "itself" else accepted < drafted)


def test_a_seeded_speculated_request_repeats_its_answer_in_any_batch():
    """Sampled, seeded requests speculating with another model: the draft's draws are the
    request's seed's, so each answer is the same whether it ran with others or alone (its
    distribution is the plain one: ``verify``'s proof, tests/test_speculative.py)."""
    import torch

    from engine import ModelDraft

    def draft(model):  # a near copy of the model: its guesses right at times
        rng = np.random.default_rng(0)
        params = {k: v * (1 + 0.05 * rng.standard_normal(v.shape)) if v.ndim == 2 else v
                  for k, v in discriminating_params(model.config).items()}  # fmt: skip
        return ModelDraft(type(model)(model.config, params, dtype=torch.float64))

    def run(indices, arrivals):
        requests = _requests(6, seed=8, longest=8, most_tokens=14)
        for request in requests:
            request.temperature, request.top_k, request.top_p = 0.9, 12, 0.95
            # Seeds under which each of the first five requests has guesses kept and refused.
            request.seed = 100 + requests.index(request)
        chosen = [requests[i] for i in indices]
        texts, reasons, *_ = _engine_run("level2_torch_manual", chosen, arrivals, draft=draft,
                                         max_batch=4, blocks=40, block_size=4)  # fmt: skip
        return dict(zip(indices, texts, strict=True)), reasons

    together, reasons = run(list(range(6)), [0, 0, 0, 1, 2, 3])
    assert all(r[3] > r[4] > 0 for r in reasons[:5])  # guesses made, some kept, some not
    for i in (0, 3, 4):
        assert run([i], [0])[0][i] == together[i], f"request {i}"


def test_a_pool_too_small_for_all_preempts_the_newest_and_each_answer_is_unchanged():
    """Eight requests, four at once, in a pool of 12 blocks of 4 positions (48 for four
    requests of up to 29): the newest running requests are preempted, compute again what
    they had and go on, and each text is still its text alone."""
    requests = _requests(8, seed=4, longest=16, most_tokens=14)
    texts, reasons, worker, model = _engine_run(
        "level2_torch_manual", requests, [0, 0, 0, 0, 1, 2, 3, 4], max_batch=4, blocks=12,
        block_size=4,
    )  # fmt: skip
    _assert_alone(requests, texts, reasons, worker, model)
    assert worker.engine.preempted > 0


@pytest.mark.parametrize("level_name", ["level2_torch_manual", "level3_sdpa_flash"])
def test_a_shared_prefix_is_computed_once_and_answers_are_unchanged(level_name):
    """Six requests behind one 13-token prefix (three blocks of 4 and one token more): the
    first computes it, the later ones find its three whole blocks in the pool (12 cached
    tokens, counted in their usage) and compute only the rest; each text is its text alone.
    A prompt of exactly three blocks finds two: its last token is always computed."""
    prefix = list(range(10, 23))
    requests = _requests(6, seed=5, prefix=prefix, longest=6)
    requests[5].ids = prefix[:12]  # three whole blocks exactly
    arrivals = [0, 3, 3, 4, 6, 8]
    texts, reasons, worker, model = _engine_run(level_name, requests, arrivals, max_batch=3,
                                                block_size=4)  # fmt: skip
    _assert_alone(requests, texts, reasons, worker, model)
    cached = [r[2] for r in reasons]
    assert cached[0] == 0 and cached[1:5] == [12] * 4 and cached[5] == 8
    assert worker.engine.computed == sum(len(r.ids) for r in requests) - sum(cached)


def test_without_the_prefix_cache_every_prompt_is_computed_whole():
    prefix = list(range(10, 23))
    requests = _requests(3, seed=5, prefix=prefix, longest=6)
    texts, reasons, worker, model = _engine_run("level2_torch_manual", requests, [0, 3, 3],
                                                max_batch=3, block_size=4, prefix_cache=False)  # fmt: skip
    _assert_alone(requests, texts, reasons, worker, model)
    assert [r[2] for r in reasons] == [0, 0, 0]
    assert worker.engine.computed == sum(len(r.ids) for r in requests)


def test_a_long_prompt_is_prefilled_in_pieces_while_the_others_decode():
    """A budget of 5 prompt positions a turn: a 30-token prompt arriving while two requests
    decode takes six turns to compute, and the two decode between its pieces; every
    text is its text alone."""
    from serving.worker import Completion

    requests = _requests(2, seed=6, longest=4, most_tokens=2) + [
        Completion(list(range(8, 38)), 4, temperature=0.0)
    ]
    requests[0].max_tokens = requests[1].max_tokens = 16
    texts, reasons, worker, model = _engine_run(
        "level3_sdpa_flash", requests, [0, 0, 2], max_batch=3, prefill_tokens=5
    )
    _assert_alone(requests, texts, reasons, worker, model)
    assert worker.engine.prefills >= 2 + 6  # the two short prompts, and six pieces of the long one


def test_the_engine_decodes_without_reading_its_ids_back(monkeypatch):
    """The batching loop calls the plain pass, ``model.transformer(ids, positions, cache)``,
    with ids and positions it made as tensors from what it holds, as a model runner does:
    no id goes back to numpy or to the host between steps, and no public method (which
    reads the ids on the host to check them) runs."""
    from types import SimpleNamespace

    import torch

    import levels
    from levels import TransformerConfig, init_params
    from levels.common import public
    from serving.worker import Completion, Finished, Worker

    level = levels.load("level2_torch_manual")
    config = TransformerConfig(vocab_size=40, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2,
                               d_ff=32, max_seq_len=48)  # fmt: skip
    model = level.DecoderOnlyTransformer(config, init_params(config, "decoder_only", seed=1))
    loaded = SimpleNamespace(model=model, level=level, tokenizer=_Letters(), stop_ids=(7,))
    worker = Worker(loaded, max_batch=2, start=False)
    passed, copied, plain = [], [], model.transformer

    def transformer(ids, positions, cache=None, last=False):
        passed.append(ids)
        return plain(ids, positions, cache, last)

    monkeypatch.setattr(model, "transformer", transformer)
    for name in ("numpy", "tolist", "cpu", "item", "__array__"):  # every way to the host
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            if any(self is ids for ids in passed):
                copied.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, spy)
    monkeypatch.setattr(public, "ids_of", lambda *a, **k: pytest.fail("a public method ran"))
    done = []
    for prompt in ([10, 11, 12], [13, 14]):
        request = Completion(prompt, 5, temperature=0.0)
        worker.submit(request, lambda e: done.append(e) if isinstance(e, Finished) else None)
    for _ in range(20):
        worker.turn()
    assert len(done) == 2 and worker.engine.steps >= 4  # both answered, decoding together
    assert any(tuple(ids.shape) == (2, 1) for ids in passed)  # a step of two rows
    assert all(isinstance(ids, torch.Tensor) and ids.dtype == torch.long for ids in passed)
    assert copied == []


def test_a_preempted_request_resumes_from_its_own_blocks_turn_by_turn():
    """The worker stepped by hand (``start=False``), deterministic: a pool of six blocks of
    four, three requests, four prompt positions a turn. The newest request is preempted
    twice (once its prompt was computed, once while decoding), comes back, finds the
    blocks it had filed (8 of its 10 tokens), computes the rest and ends as it would alone;
    the oldest, decoding throughout, is never preempted."""
    from types import SimpleNamespace

    import torch

    import levels
    from levels import TransformerConfig, init_params
    from serving.worker import Completion, Finished, Worker

    level = levels.load("level2_torch_manual")
    config = TransformerConfig(vocab_size=40, d_model=16, n_heads=4, n_kv_heads=2, n_layers=2,
                               d_ff=32, max_seq_len=48)  # fmt: skip
    params = init_params(config, "decoder_only", seed=1, scheme="random")
    model = level.DecoderOnlyTransformer(config, params, dtype=torch.float64)
    loaded = SimpleNamespace(model=model, level=level, tokenizer=_Letters(), stop_ids=(7,))
    worker = Worker(loaded, max_batch=3, blocks=6, block_size=4, prefill_tokens=4, start=False)
    requests = [Completion([10, 11], 14, temperature=0.0), Completion(list(range(12, 24)), 2, temperature=0.0),
                Completion([24, 25], 10, temperature=0.0)]  # fmt: skip
    texts, done = ["", "", ""], [None, None, None]
    for i, request in enumerate(requests):
        worker.submit(request, lambda e, i=i: done.__setitem__(i, e) if isinstance(e, Finished)
                      else texts.__setitem__(i, texts[i] + e.text))  # fmt: skip
    trace = [line for line in (worker.turn() for _ in range(30)) if line]
    preempted = [line for line in trace if "preempted" in line]
    assert len(preempted) == 2 and all("r2 preempted" in line for line in preempted)
    assert any("r2 joins (10 tokens, 8 found cached)" in line for line in trace)
    assert all(texts[i] == _alone(model, r) for i, r in enumerate(requests))
    assert [d.finish_reason for d in done] == ["length"] * 3
    assert worker.pool.available == worker.pool.blocks and worker.engine.preempted == 2
