"""``ladder serve`` as people run it: ``response_format``, ``/metrics``, ``/health``, the page.

In the extended run (CI makes it), a module fixture starts ``python -m ladder serve`` on
SmolLM2 (level 3, eager, one thread) on 127.0.0.1 and a free port. Held there:

* ``response_format`` (a JSON schema, any JSON object, a regex) on both routes, whole
  and streamed: the answer parses and ``jsonschema`` validates it, the stream's text is
  the whole answer's; four requests at once, under different formats and none, each
  answered as it is alone (the worker's batch, each request its own automaton state:
  held to the letter in float64 on a small model below, turn by turn);
* a bad format (an unsupported keyword, a malformed schema, a pattern that matches
  nothing, a ``maxLength`` of 10^6) is a 400 with OpenAI's error body naming it, and
  the server keeps serving;
* ``/metrics`` parses with the Prometheus client's own parser, and its counters move by
  what a request did; ``/health`` names the model and the queue;
* ``/`` is the chat page: one file, no external assets, only the server's own routes
  (the page in a real browser: tests/test_chat_page.py).

In the default run, without a server: the formats refused by name, the metrics counted
from a request's events and read back by Prometheus's parser, the page's file, and the
worker's batch of constrained requests turn by turn.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from test_constrained import EOS, VOCAB

from constrained import Index, Language, Tokens
from constrained.examples import SCHEMAS

jsonschema = pytest.importorskip("jsonschema")  # a dev dependency: a test peer only

PERSON = SCHEMAS["person"]
QUESTION = [{"role": "user", "content": "Describe a person as JSON."}]


def schema_format(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    """The server (a test that asks for it is extended: a model load and its answers)."""
    from serving.launch import serving

    with serving("--no-compile", "--threads", "1", start_s=120) as base:
        yield base


def _post(server: str, path: str, body, timeout: float = 120) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{server}{path}", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def _stream(server: str, path: str, body) -> str:
    """The text of a streamed answer, its pieces joined."""
    request = urllib.request.Request(
        f"{server}{path}", data=json.dumps(body | {"stream": True}).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    pieces = []
    with urllib.request.urlopen(request, timeout=120) as r:
        for line in r:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                choice = json.loads(line[6:])["choices"]
                if choice:
                    pieces.append(
                        choice[0].get("delta", {}).get("content") or choice[0].get("text") or ""
                    )
    return "".join(pieces)


def _get(server: str, path: str) -> str:
    with urllib.request.urlopen(f"{server}{path}", timeout=30) as r:
        return r.read().decode()


# ----------------------------------------------------------------------------- formats


@pytest.mark.extended
def test_a_chat_answer_follows_its_schema_whole_and_streamed(server):
    body = {"messages": QUESTION, "temperature": 0, "response_format": schema_format(PERSON)}
    status, reply = _post(server, "/v1/chat/completions", body)
    assert status == 200, reply
    text = reply["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(text), PERSON)
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert _stream(server, "/v1/chat/completions", body) == text


@pytest.mark.extended
def test_completions_take_json_object_and_regex(server):
    body = {"prompt": "A cat as a JSON object: ", "temperature": 0, "max_tokens": 60,
            "response_format": {"type": "json_object"}}  # fmt: skip
    status, reply = _post(server, "/v1/completions", body)
    assert status == 200 and reply["choices"][0]["finish_reason"] == "stop", reply
    assert isinstance(json.loads(reply["choices"][0]["text"]), dict)
    date = {"type": "regex", "regex": r"\d{4}-\d{2}-\d{2}"}
    body = {"prompt": "The date of the first moon landing, as YYYY-MM-DD:", "temperature": 1.0,
            "seed": 3, "response_format": date}  # fmt: skip
    status, reply = _post(server, "/v1/completions", body)
    assert status == 200 and re.fullmatch(r"\d{4}-\d{2}-\d{2}", reply["choices"][0]["text"])
    assert _stream(server, "/v1/completions", body) == reply["choices"][0]["text"]  # seeded


@pytest.mark.extended
def test_four_requests_at_once_under_different_formats_answer_as_alone(server):
    """A schema, a regex, any object and none, sent together (one batch): each answer is
    the one that request gets alone; the first two end whole, the third (cut at
    ``max_tokens``) is still the start of a JSON object."""
    pattern = "(yes|no), because [a-z ]{1,30}\\."
    formats = [
        schema_format(PERSON),
        {"type": "regex", "regex": pattern},
        {"type": "json_object"},
        None,
    ]
    bodies = [{"messages": QUESTION, "temperature": 0, "max_tokens": 24}
              | ({"response_format": f} if f else {}) for f in formats]  # fmt: skip
    alone = [_post(server, "/v1/chat/completions", b)[1] for b in bodies]
    together: list = [None] * 4

    def ask(i: int) -> None:
        together[i] = _post(server, "/v1/chat/completions", bodies[i])[1]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    texts = [r["choices"][0]["message"]["content"] for r in together]
    assert texts == [r["choices"][0]["message"]["content"] for r in alone]
    assert [r["choices"][0]["finish_reason"] for r in together[:2]] == ["stop", "stop"]
    jsonschema.validate(json.loads(texts[0]), PERSON)
    assert re.fullmatch(pattern, texts[1])
    assert Language.json_object().dfa.walk(0, texts[2].encode()) >= 0  # a prefix of an object


# What each answer may cost: the server's default max_tokens under a response_format.
ANSWER_TOKENS = 512
SAMPLINGS = [(0.0, None), (1.0, 0), (1.0, 1), (1.0, 2)]  # greedy, and three seeded samples


def _cases() -> list[tuple[str, dict, object, list]]:
    """``(name, response_format, schema, messages)``: any object, asked as a user would ask
    for it, and each schema of ``constrained.examples``, asked with the schema in the prompt."""
    cases = [("json_object", {"type": "json_object"}, None,
              [{"role": "user", "content": "A person, as JSON"}])]  # fmt: skip
    for name, schema in SCHEMAS.items():
        question = f"Give an example of {name} as JSON following this schema: {json.dumps(schema)}"
        cases.append((name, schema_format(schema), schema, [{"role": "user", "content": question}]))
    return cases


@pytest.mark.extended
@pytest.mark.real_model
def test_every_constrained_answer_ends_within_its_budget_and_validates(server):
    """``json_object`` and each schema of the examples, greedy and at temperature 1 (three
    seeds), no ``max_tokens`` given, sent eight at a time: every answer ends with
    ``finish_reason`` "stop" within 512 tokens, parses, and ``jsonschema`` validates it.
    SmolLM2 alone, greedy, writes digits into ``json_object``'s string until its tokens run
    out; the budget closes it. Run with ``-s`` for the table."""
    from concurrent.futures import ThreadPoolExecutor

    asks = [(case, t, seed) for case in _cases() for t, seed in SAMPLINGS]

    def ask(item) -> dict:
        (name, response_format, _, messages), temperature, seed = item
        body = {
            "messages": messages,
            "temperature": temperature,
            "response_format": response_format,
        }
        if seed is not None:
            body["seed"] = seed
        status, reply = _post(server, "/v1/chat/completions", body, timeout=1200)  # in a batch
        assert status == 200, reply
        return reply

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(ask, asks))
    print("\n| format | temperature | seed | finish | tokens | answer |")
    print("| --- | ---: | ---: | --- | ---: | --- |")
    for ((name, _, _, _), t, seed), reply in zip(asks, replies, strict=True):
        text, finish = (
            reply["choices"][0]["message"]["content"],
            reply["choices"][0]["finish_reason"],
        )
        tokens = reply["usage"]["completion_tokens"]
        print(f"| {name} | {t:g} | {seed} | {finish} | {tokens} | `{text[:60]}` |")
    for ((name, _, schema, _), t, seed), reply in zip(asks, replies, strict=True):
        text, finish = (
            reply["choices"][0]["message"]["content"],
            reply["choices"][0]["finish_reason"],
        )
        assert finish == "stop" and reply["usage"]["completion_tokens"] <= ANSWER_TOKENS, (
            name,
            t,
            seed,
        )
        value = json.loads(text)
        if schema is None:
            assert isinstance(value, dict), (name, text)
        else:
            jsonschema.validate(value, schema)


BAD_FORMATS = [
    (schema_format({"type": "string", "format": "hostname"}), 'format "hostname" is not'),
    (schema_format({"type": "object", "properties": {"a": {"not": {}}}}), "'not' is not"),
    (
        schema_format({"oneOf": [{"type": "string"}, {"maxLength": 3, "type": "string"}]}),
        "oneOf branches 0 and 1 may both hold one value",
    ),
    (schema_format({"type": "string", "maxLength": 10**6}), "maxLength 1000000 is over the limit"),
    (schema_format([1, 2]), "must be a JSON schema"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs json_schema.schema"),
    ({"type": "regex", "regex": "[^\\u{0}-\\u{10FFFF}]"}, "no string matches"),
    ({"type": "regex", "regex": "(a"}, "never closed"),
    ({"type": "xml"}, "'xml' is not supported"),
    ("json", "must be an object"),
]


@pytest.mark.extended
@pytest.mark.parametrize("response_format, says", BAD_FORMATS, ids=[s for _, s in BAD_FORMATS])
def test_a_format_that_cannot_be_honoured_is_a_400_naming_why(server, response_format, says):
    for path, body in (
        ("/v1/chat/completions", {"messages": QUESTION}),
        ("/v1/completions", {"prompt": "x"}),
    ):
        status, reply = _post(server, path, body | {"response_format": response_format})
        assert status == 400, reply
        error = reply["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["param"] == "response_format" and says in error["message"], error
    assert json.loads(_get(server, "/health"))["status"] == "ok"  # still serving


# ----------------------------------------------------------------------------- metrics, health, page


def _metrics(server: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    samples = {}
    for family in text_string_to_metric_families(_get(server, "/metrics")):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@pytest.mark.extended
def test_the_metrics_parse_and_move_by_what_a_request_did(server):
    before = _metrics(server)
    status, reply = _post(
        server, "/v1/chat/completions", {"messages": QUESTION, "temperature": 0, "max_tokens": 5}
    )
    assert status == 200
    _post(server, "/v1/chat/completions", {"messages": "nonsense"})  # a 400
    after = _metrics(server)

    def moved(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    usage = reply["usage"]
    route = {"route": "/v1/chat/completions"}
    assert moved("ladder_requests_total", **route, status="200") == 1
    assert moved("ladder_requests_total", **route, status="400") == 1
    assert moved("ladder_prompt_tokens_total") == usage["prompt_tokens"]
    assert moved("ladder_generation_tokens_total") == usage["completion_tokens"] == 5
    assert moved("ladder_request_finished_total", reason="length") == 1
    assert moved("ladder_time_to_first_token_seconds_count") == 1
    assert moved("ladder_time_per_output_token_seconds_count") == 1
    first = reply["timings"]["time_to_first_token_s"]
    assert moved("ladder_time_to_first_token_seconds_sum") == pytest.approx(
        first, abs=1e-5
    )  # rounded to 1 us in timings
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert moved("ladder_prefix_cache_hit_tokens_total") == cached
    assert after[("ladder_kv_blocks_total", ())] > 0
    assert after[("ladder_requests_running", ())] == after[("ladder_requests_waiting", ())] == 0


@pytest.mark.extended
def test_health_names_the_model_and_the_queue(server):
    health = json.loads(_get(server, "/health"))
    assert health["model"] == "smollm2-135m" and health["queue"] == {"waiting": 0, "running": 0}


@pytest.mark.parametrize("response_format, says", BAD_FORMATS, ids=[s for _, s in BAD_FORMATS])
def test_a_format_that_cannot_be_honoured_is_refused_before_any_model_work(response_format, says):
    """What the server's 400 says, from the formats alone (no vocabulary is read for them)."""
    from serving.structured import FormatError, Formats

    with pytest.raises(FormatError, match=re.escape(says)):
        Formats(tokenizer=None, stop_ids=(0,)).index(response_format)


def test_the_metrics_count_a_request_s_events():
    """A request's events through ``Metrics.watch``: waiting, then running at its first
    text, then counted when it finishes; the text parses with Prometheus's own parser."""
    from types import SimpleNamespace

    from prometheus_client.parser import text_string_to_metric_families

    from serving.metrics import Metrics
    from serving.worker import Finished, Piece

    pool = SimpleNamespace(blocks=10, available=7)
    metrics = Metrics(SimpleNamespace(pool=pool))
    seen = []
    deliver = metrics.watch(seen.append)
    assert metrics.queue == {"waiting": 1, "running": 0}
    deliver(Piece("Hello"))
    assert metrics.queue == {"waiting": 0, "running": 1}
    deliver(Finished("stop", prompt_tokens=30, completion_tokens=4, cached_tokens=16,
                     queued_s=0.5, first_token_s=0.2, per_token_s=0.05, drafted_tokens=6,
                     accepted_tokens=2))  # fmt: skip
    refused = metrics.watch(seen.append)
    metrics.refused(refused)  # a full queue: never taken
    assert metrics.queue == {"waiting": 0, "running": 0} and seen[0] == Piece("Hello")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.text().decode())
        for s in family.samples
    }
    assert samples[("ladder_prompt_tokens_total", ())] == 30
    assert samples[("ladder_generation_tokens_total", ())] == 4
    assert samples[("ladder_prefix_cache_hit_tokens_total", ())] == 16
    assert samples[("ladder_prefix_cache_hits_total", ())] == 1
    assert samples[("ladder_draft_tokens_total", ())] == 6
    assert samples[("ladder_draft_accepted_tokens_total", ())] == 2
    assert samples[("ladder_request_finished_total", (("reason", "stop"),))] == 1
    assert samples[("ladder_time_to_first_token_seconds_sum", ())] == 0.2
    assert samples[("ladder_time_to_first_token_seconds_bucket", (("le", "0.25"),))] == 1
    assert samples[("ladder_time_to_first_token_seconds_bucket", (("le", "0.1"),))] == 0
    assert samples[("ladder_time_per_output_token_seconds_sum", ())] == 0.05
    assert samples[("ladder_queue_time_seconds_count", ())] == 1
    assert (
        samples[("ladder_kv_blocks_used", ())] == 3
        and samples[("ladder_kv_blocks_total", ())] == 10
    )


def test_the_page_is_one_file_over_the_server_s_own_routes():
    """No external asset (no src, href, URL, import; the icon is a data URI, inline), and
    only the server's own routes."""
    from serving.api import _page

    page = _page()
    assert page.startswith("<!doctype html>") and "<script>" in page
    assert 'rel="icon" href="data:image/svg+xml;base64,' in page  # no request for an icon
    outside = r'(src|href)\s*=\s*"(?!data:)|https?://|@import|url\('
    assert not re.search(outside, page)  # nothing from outside
    assert set(re.findall(r'fetch\("([^"]+)"', page)) == {"/v1/models", "/v1/chat/completions"}


# ----------------------------------------------------------------------------- the worker


def test_batched_constrained_requests_are_each_answered_as_alone():
    """The worker stepped by hand (float64, level 2): seven requests, three at a time,
    under three languages and none, greedy and sampled: each request's tokens are those of
    ``stream`` on it alone under a fresh constraint, and each constrained text is whole."""
    import levels
    from levels import TransformerConfig, init_params
    from serving.worker import Completion, Finished, Worker

    tokens = Tokens.from_list(VOCAB)
    languages = [Language.regex('\\{"k":(?:[0-9]|12)\\}'), Language.schema(PERSON),
                 Language.regex("[a-z€]{2,6}"), None]  # fmt: skip
    level = levels.load("level2_torch_manual")
    config = TransformerConfig(vocab_size=len(VOCAB), d_model=16, n_heads=4, n_kv_heads=2,
                               n_layers=2, d_ff=32, max_seq_len=96)  # fmt: skip
    model = level.DecoderOnlyTransformer(
        config,
        init_params(config, "decoder_only", seed=2, scheme="random"),
        dtype=__import__("torch").float64,
    )

    class Bytes:
        def decode(self, ids, skip_special_tokens=True):
            return b"".join(VOCAB[i] or b"" for i in ids).decode(errors="replace")

        def get_added_tokens_decoder(self):
            return {}

        def token_to_id(self, token):
            return None

    from types import SimpleNamespace

    loaded = SimpleNamespace(model=model, level=level, tokenizer=Bytes(), stop_ids=(EOS,))
    worker = Worker(loaded, max_batch=3, block_size=4, prefill_tokens=8, start=False)
    rng = np.random.default_rng(7)
    requests, indexes, taken, texts = [], [], {}, [""] * 7
    for i in range(7):
        language = languages[i % 4]
        index = None if language is None else Index(language, tokens, (EOS,))
        sampled = i % 3 == 1
        request = Completion([int(t) for t in rng.integers(3, len(VOCAB), int(rng.integers(1, 6)))], 40,
                          temperature=0.9 if sampled else 0.0, seed=10 + i if sampled else None,
                          constraint=None if index is None else index.constraint())  # fmt: skip
        requests.append(request)
        indexes.append(index)
        worker.submit(request, lambda e, i=i: taken.__setitem__(i, e) if isinstance(e, Finished)
                      else texts.__setitem__(i, texts[i] + e.text))  # fmt: skip
    for _ in range(400):
        worker.turn()
        if len(taken) == 7:
            break
    assert len(taken) == 7 and worker.engine.rows > worker.engine.steps  # batched
    for i, request in enumerate(requests):
        fresh = None if indexes[i] is None else indexes[i].constraint()
        alone = list(model.stream(request.ids, 40, temperature=request.temperature, seed=request.seed,
                                  stop_ids=(EOS,), constraint=fresh))  # fmt: skip
        assert taken[i].completion_tokens == len(alone), i
        assert texts[i] == Bytes().decode([t for t in alone if t != EOS]), i
        if indexes[i] is not None:
            assert (
                alone[-1] == EOS
                and request.constraint.ended
                and request.constraint.state == fresh.state
            )
            text = b"".join(VOCAB[t] for t in alone[:-1])
            assert indexes[i].language.accepts(text), (i, text)
