"""What clients send beyond a plain prompt, through ``ladder serve`` on the real model:
log-probabilities (chat's and completions', ``echo``, scoring with ``max_tokens`` 0,
streaming), prompts as token ids and lists of prompts, ``n`` choices, penalties and
``logit_bias``; the answers read by OpenAI's own client where it has the field.

A module fixture starts ``python -m ladder serve`` (level 3, float32, eager, a batch over
the paged cache: the defaults) on 127.0.0.1 and a free port and stops it at the end. The
extended test holds every log-probability to ``transformers``' float32 ``log_softmax`` on
the same weights and tokens.
"""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Level 3 float32 against itself in another batch (a choice finding its prompt's blocks in
# the prefix cache, a prompt scored whole): the same numbers summed in another order, about
# 1e-6 apart on log-probabilities of order 1 to 20 (measured 1.3e-6); bitwise equality is
# not promised at float32 (docs/serving.md).
REORDERED = 1e-4


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    from serving.launch import serving

    with serving("--no-compile", "--threads", "1", start_s=120) as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def _post(server: str, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{server}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def _stream(server: str, path: str, body: dict) -> list[dict]:
    request = urllib.request.Request(f"{server}{path}", data=json.dumps(body | {"stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as r:
        lines = [line.decode().strip() for line in r]
    data = [line[len("data: ") :] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf):
    from levels import gguf

    return gguf.load_tokenizer(smollm2_gguf)


# ----------------------------------------------------------------------------- prompts


def test_a_prompt_as_text_as_ids_or_in_a_list_answers_alike(client, tokenizer):
    """The same prompt as a string and as its token ids gives the same greedy text and the
    same scores; a list of prompts (text or ids) gives a choice each, ``index`` in order,
    each the answer it has alone, the usage adding their prompts."""
    text, other = "def fibonacci(n):", "The capital of France is"
    ids = tokenizer.encode(text).ids

    def complete(prompt, **fields):
        return client.completions.create(model="smollm2-135m", prompt=prompt, temperature=0, **fields)  # fmt: skip

    plain, by_ids = complete(text, max_tokens=5), complete(ids, max_tokens=5)
    assert by_ids.choices[0].text == plain.choices[0].text and plain.choices[0].text
    scored, scored_ids = (complete(p, max_tokens=0, echo=True, logprobs=1) for p in (text, ids))
    assert scored.choices[0].text == scored_ids.choices[0].text == text
    assert scored.choices[0].logprobs.tokens == scored_ids.choices[0].logprobs.tokens
    assert scored.usage.prompt_tokens == len(ids) and scored.usage.completion_tokens == 0
    both = complete([ids, other], max_tokens=5)
    alone = complete(other, max_tokens=5)
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.text for c in both.choices] == [plain.choices[0].text, alone.choices[0].text]
    assert both.usage.prompt_tokens == len(ids) + alone.usage.prompt_tokens


@pytest.mark.parametrize(
    "prompt", [[], [[]], [1, -1], [49152], [[1], 2], ["a", 3], [True], {"a": 1}, 5]
)
def test_a_prompt_that_is_not_text_or_ids_is_refused(server, prompt):
    status, body = _post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    assert status == 400 and body["error"]["param"] == "prompt", body


# ----------------------------------------------------------------------------- log-probabilities


def _check_ranked(top: dict | list, chosen: float | None = None) -> None:
    """Alternatives in descending order (chat's list) and finite; the chosen among them when
    it is the likeliest."""
    values = [t.logprob for t in top] if isinstance(top, list) else sorted(top.values(), reverse=True)  # fmt: skip
    assert values == sorted(values, reverse=True) and all(np.isfinite(values))
    assert all(v <= 0 for v in values)


def test_chat_logprobs_stream_as_they_answer_whole(server, client):
    """Chat's ``logprobs`` and ``top_logprobs``: an entry a token, its text the answer's, its
    alternatives descending; greedy, the token is its own first alternative; streamed, the
    same entries piece by piece."""
    body = {"messages": QUESTION, "temperature": 0, "max_tokens": 8, "logprobs": True, "top_logprobs": 3}  # fmt: skip
    whole = client.chat.completions.create(model="smollm2-135m", **body)
    entries = whole.choices[0].logprobs.content
    assert len(entries) == whole.usage.completion_tokens == 8
    # The end-of-turn token is reported too (under its name; it adds no text).
    assert whole.choices[0].finish_reason == "stop" and entries[-1].token == "<|im_end|>"
    assert "".join(e.token for e in entries[:-1]) == whole.choices[0].message.content
    for e in entries:
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == e.logprob
        _check_ranked(e.top_logprobs)
        assert bytes(e.bytes).decode() == e.token  # (every token here is whole UTF-8)
    chunks = _stream(server, "/v1/chat/completions", body)
    streamed = [e for c in chunks for ch in c["choices"] for e in ((ch.get("logprobs") or {}).get("content") or [])]  # fmt: skip
    assert [e["token"] for e in streamed] == [e.token for e in entries]
    got = np.array([e["logprob"] for e in streamed])
    assert np.abs(got - [e.logprob for e in entries]).max() < REORDERED


def test_echo_scores_the_prompt_the_first_token_null(server, client, tokenizer):
    """``echo`` with ``logprobs``: the prompt's tokens, then the answer's, the first ``None``;
    ``max_tokens`` 0 scores without generating, the scores those of a request that
    generates; each token's dict holds its alternatives and itself; streamed, the prompt
    and its scores come first."""
    prompt = "The capital of France is"
    n = len(tokenizer.encode(prompt).ids)
    scored = client.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=0, echo=True, logprobs=2)  # fmt: skip
    more = client.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=3, echo=True, logprobs=2, temperature=0)  # fmt: skip
    a, b = scored.choices[0].logprobs, more.choices[0].logprobs
    assert len(a.tokens) == n and len(b.tokens) == n + 3 and b.tokens[:n] == a.tokens
    assert a.token_logprobs[0] is None and a.top_logprobs[0] is None
    assert more.choices[0].text.startswith(prompt) and "".join(b.tokens) == more.choices[0].text
    assert np.abs(np.array(a.token_logprobs[1:]) - b.token_logprobs[1:n]).max() < REORDERED
    for token, value, top in zip(b.tokens[1:], b.token_logprobs[1:], b.top_logprobs[1:], strict=True):  # fmt: skip
        assert top[token] == value and 2 <= len(top) <= 3
        _check_ranked(top)
    assert b.text_offset == [sum(len(t) for t in b.tokens[:i]) for i in range(len(b.tokens))]
    body = {"prompt": prompt, "max_tokens": 3, "echo": True, "logprobs": 2, "temperature": 0}
    chunks = [c["choices"][0] for c in _stream(server, "/v1/completions", body)]
    assert "".join(c["text"] for c in chunks) == more.choices[0].text  # the prompt first
    streamed = [t for c in chunks if c["logprobs"] for t in c["logprobs"]["tokens"]]
    assert streamed == b.tokens and chunks[0]["logprobs"]["token_logprobs"][0] is None


def test_n_choices_share_the_prompt_and_a_seed_repeats_each(client):
    """``n`` 3, seeded: choice ``i`` is the answer of the same request seeded ``seed + i``;
    the prompt is counted once (that the choices share its blocks is the worker's test,
    tests/test_serve.py)."""
    body = {"model": "smollm2-135m", "messages": QUESTION, "max_tokens": 6, "temperature": 1.0}
    three = client.chat.completions.create(n=3, seed=11, **body)
    assert [c.index for c in three.choices] == [0, 1, 2]
    for i, choice in enumerate(three.choices):
        alone = client.chat.completions.create(seed=11 + i, **body)
        assert choice.message.content == alone.choices[0].message.content
    one = client.chat.completions.create(seed=11, **body)
    assert three.usage.prompt_tokens == one.usage.prompt_tokens
    assert len({c.message.content for c in three.choices}) > 1  # sampled: they differ


def test_logit_bias_forces_or_bans_and_a_penalty_breaks_a_repetition(client, tokenizer):
    """``logit_bias`` of 100 makes every token that one, greedy; -100 on the greedy first
    token moves off it; a frequency penalty of 2 breaks a repetition."""
    body = {"model": "smollm2-135m", "temperature": 0, "max_tokens": 4}
    forced_id = tokenizer.encode(" banana").ids[0]
    forced = client.completions.create(prompt="I like", logit_bias={str(forced_id): 100}, **body)
    assert forced.choices[0].text == tokenizer.decode([forced_id] * 4)
    plain = client.completions.create(prompt="I like", logprobs=1, **body)
    first = plain.choices[0].logprobs.tokens[0]
    first_id = tokenizer.encode("I like" + first).ids[-1]
    banned = client.completions.create(prompt="I like", logit_bias={str(first_id): -100}, logprobs=1, **body)  # fmt: skip
    assert banned.choices[0].logprobs.tokens[0] != first
    # The report is the model's own: the banned token is still the likeliest there.
    assert max(banned.choices[0].logprobs.top_logprobs[0], key=banned.choices[0].logprobs.top_logprobs[0].get) == first  # fmt: skip
    loop = {"prompt": "one one one one one one", "max_tokens": 8}
    repeated = client.completions.create(**(body | loop))
    penalized = client.completions.create(frequency_penalty=2.0, **(body | loop))
    # Greedy, the model goes on "-to-many-to-many"; penalized, it leaves the loop.
    assert repeated.choices[0].text.count("many") > penalized.choices[0].text.count("many") > 0


# ----------------------------------------------------------------------------- against transformers

# transformers' own float32 logits are 4.3e-5 .. 8.9e-5 off the float64 truth on these prompts
# (tests/test_real_models.py), level 3's up to 2.3x that; a log-probability is a logit less
# the log of a sum, so its error is about twice a logit's: 1e-4 is the target (issue 56),
# met with room where the two float32 sides err in opposite directions at most.
TRANSFORMERS_ATOL = 1e-4


@pytest.mark.extended
@pytest.mark.real_model
def test_every_log_probability_is_transformers_float32_log_softmax(client, smollm2_gguf):
    """The three prompts of tests/test_real_models.py as token ids, echoed with 8 greedy tokens
    and 5 alternatives each: every log-probability, the prompt's and the answer's, within
    ``TRANSFORMERS_ATOL`` of ``log_softmax`` of transformers' float32 logits on the same
    weights and tokens, and the alternatives in its order (up to values closer than that)."""
    import torch
    import transformers
    from test_real_models import CHAT, hf_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)  # fmt: skip
    peer = hf_model(smollm2_gguf, torch.float32)
    prompts = [tokenizer("The capital of France is").input_ids,
               tokenizer("def fibonacci(n):\n    if n < 2:\n").input_ids,
               tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]]  # fmt: skip
    worst = 0.0
    for ids in prompts:
        with torch.no_grad():  # transformers' own greedy tokens (the ladder's, test_real_models)
            full = peer.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)[0].tolist()
            logits = peer(torch.tensor([full])).logits[0]  # (T, V) float32
            lsm = torch.log_softmax(logits, -1).double().numpy()  # in float32, widened
        answer = client.completions.create(model="smollm2-135m", prompt=ids, max_tokens=8, echo=True,
                                           logprobs=5, temperature=0)  # fmt: skip
        got = answer.choices[0].logprobs
        assert "".join(got.tokens) == tokenizer.decode(full) and len(got.tokens) == len(full)
        assert got.token_logprobs[0] is None
        for i in range(1, len(full)):
            error = abs(got.token_logprobs[i] - lsm[i - 1, full[i]])
            worst = max(worst, error)
            assert error < TRANSFORMERS_ATOL, (i, got.tokens[i], error)
            order = np.argsort(-lsm[i - 1], kind="stable")[:5]  # transformers' top 5
            mine = sorted(got.top_logprobs[i].values(), reverse=True)[:5]
            assert np.abs(np.array(mine) - lsm[i - 1, order]).max() < TRANSFORMERS_ATOL
    print(f"worst difference from transformers' float32 log_softmax: {worst:.2e}")


# ----------------------------------------------------------------------------- tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                          "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}  # fmt: skip
ASKED = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize("samples", [pytest.param(50, marks=pytest.mark.extended), 8])
def test_a_required_call_s_arguments_always_validate(client, samples):
    """``tool_choice`` required, sampled at temperature 1 under ``samples`` seeds: every answer
    is a call of the function, ``finish_reason`` ``tool_calls``, its arguments valid under
    its parameters by ``jsonschema``."""
    jsonschema = pytest.importorskip("jsonschema")
    answers = []
    for seed in range(0, samples, 8):
        reply = client.chat.completions.create(model="smollm2-135m", messages=ASKED, tools=[WEATHER],
                                               tool_choice="required", temperature=1.0, seed=seed,
                                               n=min(8, samples - seed), max_tokens=60)  # fmt: skip
        answers += reply.choices
    assert len(answers) == samples
    for choice in answers:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_a_named_call_streams_as_openai_streams_one_and_its_result_goes_on(server, client):
    """A named function, streamed: the call's id, type and name first, then its arguments piece
    by piece, then
    ``finish_reason`` ``tool_calls``; the same call whole. The next turn, with the call and
    the tool's result, goes through the template and answers in text under ``none``."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    body = {"messages": ASKED, "tools": [WEATHER], "tool_choice": named, "temperature": 0, "max_tokens": 60}  # fmt: skip
    whole = client.chat.completions.create(model="smollm2-135m", **body)
    (call,) = whole.choices[0].message.tool_calls
    chunks = _stream(server, "/v1/chat/completions", body)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"] == {"name": "get_weather", "arguments": ""}  # fmt: skip
    assert "".join(c["function"]["arguments"] for c in calls) == call.function.arguments
    assert len(calls) > 3  # the arguments as they come, a piece a turn
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    result = {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}
    turn = {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]}
    after = client.chat.completions.create(model="smollm2-135m", messages=ASKED + [turn, result], tools=[WEATHER],
                                           tool_choice="none", temperature=0, max_tokens=12)  # fmt: skip
    assert after.choices[0].message.content and after.choices[0].message.tool_calls is None
    assert after.usage.prompt_tokens > whole.usage.prompt_tokens  # the call and its result read


@pytest.mark.parametrize(
    "fields, param",
    [({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools"),
     ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
     ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
     ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}],
       "tool_choice": "required"}, "tools")],
)  # fmt: skip
def test_tools_that_cannot_be_honoured_are_a_400_naming_the_field(server, fields, param):
    status, body = _post(server, "/v1/chat/completions", {"messages": ASKED, "max_tokens": 4} | fields)  # fmt: skip
    assert status == 400 and body["error"]["param"] == param, body


def test_health_says_the_server_is_not_batch_invariant(server):
    """SPEC (2026-12-07): where a request's numbers may move with its batch, the server says so."""
    with urllib.request.urlopen(f"{server}/health", timeout=10) as r:
        assert json.load(r)["batch_invariant"] is False


def test_under_auto_a_text_answer_streams_as_text(server, client):
    """``auto``, greedy: SmolLM2 answers this in text; streamed, the same text comes in
    several pieces (not held to its end), ``finish_reason`` not ``tool_calls``."""
    body = {"messages": ASKED, "tools": [WEATHER], "temperature": 0, "max_tokens": 12}
    whole = client.chat.completions.create(model="smollm2-135m", **body)
    assert whole.choices[0].message.tool_calls is None and whole.choices[0].message.content
    chunks = [
        c["choices"][0] for c in _stream(server, "/v1/chat/completions", body) if c["choices"]
    ]
    pieces = [c["delta"]["content"] for c in chunks if c["delta"].get("content")]
    assert "".join(pieces) == whole.choices[0].message.content and len(pieces) > 2
    assert chunks[-1]["finish_reason"] == whole.choices[0].finish_reason != "tool_calls"
