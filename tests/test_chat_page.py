"""The chat page of ``ladder serve`` (``GET /``) in a real browser: Debian's Chromium, headless.

A module fixture starts ``ladder serve`` (SmolLM2, level 3, eager, one thread) on a free
port of 127.0.0.1, keeping its log (a line per request); each test opens the page in
Chromium (``tests/browser.py``, over Chrome's DevTools protocol) and uses it as a person
would: types a question, presses Enter, waits for the streamed answer, and holds it to
the API's greedy answer to the same question; then a second question, answered with the
first turn kept (the API's answer to the whole conversation). The page asks the server
for nothing but its own routes (no ``/favicon.ico``), and logs no error. A schema box that
is not JSON is said under the box, and nothing is sent until it is fixed. Screenshots are
saved in ``out/chat_page/`` for a person to look at (their paths are printed; ``-s``
shows them).

Chromium comes from Debian's package (``apt-get install chromium``; ``.ci/run``
installs it). In CI a missing browser fails the test; elsewhere it is skipped with the
reason.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request

import pytest
from browser import Browser, chromium
from markdown_blocks import ROOT

pytestmark = [pytest.mark.extended, pytest.mark.browser]

FIRST = "What is the capital of France?"
SECOND = "And of Germany?"
SCREENSHOTS = ROOT / "out" / "chat_page"
ANSWERS = "[...document.querySelectorAll('.assistant')]"  # the page's answers, in order
STATES = f"{ANSWERS}.map(a => a.dataset.state)"


@pytest.fixture(scope="module")
def served(smollm2_gguf):
    """The server, eager on one thread: its base URL and its output's lines so far."""
    from serving.launch import serving

    output: list[str] = []
    with serving("--no-compile", "--threads", "1", start_s=120, output=output) as base:
        yield base, output


@pytest.fixture
def page(served):
    """Chromium on the chat page, its model's name shown: -> (browser, base URL, log lines)."""
    if chromium() is None:
        reason = "Chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(reason)
        pytest.skip(reason)
    base, output = served
    with Browser(width=1000, height=720, timeout=60) as browser:
        browser.open(f"{base}/")
        shown = "document.getElementById('model').textContent === 'smollm2-135m'"
        assert browser.wait_for(shown, 30), "the page never showed the model's name"
        yield browser, base, output


def _type_and_enter(browser: Browser, box: str, text: str) -> None:
    """Focus the ``box`` (an element's id), type ``text`` as a keyboard would, press Enter
    (in the prompt's box, Enter sends)."""
    browser.evaluate(f"document.getElementById('{box}').focus()")
    browser.send("Input.insertText", text=text)
    for kind in ("keyDown", "keyUp"):
        browser.send("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                     windowsVirtualKeyCode=13)  # fmt: skip


def _wait(browser: Browser, expression: str, seconds: float):
    value = browser.wait_for(expression, seconds)
    assert value, f"the page never got to: {expression}"
    return value


def _api_answer(base: str, messages: list[dict], **extra) -> str:
    body = json.dumps({"messages": messages, "temperature": 0, **extra}).encode()
    request = urllib.request.Request(
        f"{base}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.load(r)["choices"][0]["message"]["content"]


def _screenshot(browser: Browser, name: str) -> None:
    path = browser.screenshot(SCREENSHOTS / name)
    print(f"\nscreenshot: {path}")
    assert path.stat().st_size > 10_000


def _requests(output: list[str]) -> list[str]:
    """The method and route of each request the server logged: ``["GET /", ...]``."""
    return [" ".join(line.split()[2:4]) for line in output if line[:2].isdigit()]


def test_the_page_streams_the_api_s_answers_and_keeps_the_conversation(page):
    browser, base, output = page
    _type_and_enter(browser, "prompt", FIRST)
    # The answer grows as it streams: seen part-way at least once, then done.
    partial = _wait(browser, f"{ANSWERS}[0]?.textContent.length > 0 && {STATES}[0]", 60)
    _wait(browser, f"{STATES}[0] === 'done'", 120)
    first = browser.evaluate(f"{ANSWERS}[0].textContent")
    want = _api_answer(base, [{"role": "user", "content": FIRST}])
    assert first == want and "Paris" in first and partial in ("streaming", "done")
    _type_and_enter(browser, "prompt", SECOND)
    _wait(browser, f"{STATES}.length === 2 && {STATES}[1] === 'done'", 120)
    second = browser.evaluate(f"{ANSWERS}[1].textContent")
    conversation = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": first},
                    {"role": "user", "content": SECOND}]  # fmt: skip
    assert second == _api_answer(base, conversation)
    stats = browser.evaluate("[...document.querySelectorAll('.stats')].map(s => s.textContent)")
    assert len(stats) == 2 and all("tok/s" in s and "smollm2-135m" in s for s in stats)
    _screenshot(browser, "conversation.png")
    # What the page itself asked for: its own routes, and never an icon the server lacks.
    asked = set(_requests(output)) - {"GET /health", "POST /v1/chat/completions"}  # the tests'
    assert asked == {"GET /", "GET /v1/models"}, _requests(output)
    assert browser.errors == []


SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
          "required": ["city"]}  # fmt: skip


def test_a_schema_box_that_is_not_json_is_said_under_it_and_nothing_is_sent(page):
    browser, base, output = page
    browser.evaluate(
        "(s => { s.value = 'json_schema'; s.dispatchEvent(new Event('change')); })"
        "(document.getElementById('format'))"
    )
    said = "document.getElementById('schema-error').textContent"
    for text, says in [
        ("", "The schema box is empty"),
        ("{type: object}", "The schema box is not JSON ("),
        ("[1, 2]", "The schema box holds JSON but not an object"),
    ]:
        browser.evaluate(f"document.getElementById('schema').value = {json.dumps(text)}")
        asked = len(_requests(output))
        _type_and_enter(browser, "prompt", FIRST)
        assert browser.evaluate(said).startswith(says), browser.evaluate(said)
        assert browser.evaluate("document.activeElement.id") == "schema"
        # Nothing sent, nothing shown in the conversation, the question still in its box.
        assert browser.evaluate("document.querySelectorAll('.message').length") == 0
        assert browser.evaluate("document.getElementById('prompt').value") == FIRST
        time.sleep(0.5)  # a request the page made would be in the log by now
        assert len(_requests(output)) == asked
        if "not JSON" in says:
            _screenshot(browser, "schema_not_json.png")
        browser.evaluate("document.getElementById('prompt').value = ''")
    # Fixed, the same question is sent under the schema, and the message is gone.
    browser.evaluate(f"document.getElementById('schema').value = {json.dumps(json.dumps(SCHEMA))}")
    _type_and_enter(browser, "prompt", FIRST)
    _wait(browser, f"{STATES}[0] === 'done'", 120)
    assert browser.evaluate(said) == ""
    answer = browser.evaluate(f"{ANSWERS}[0].textContent")
    messages = [{"role": "user", "content": FIRST}]
    form = {"type": "json_schema", "json_schema": {"name": "page", "schema": SCHEMA}}
    assert answer == _api_answer(base, messages, response_format=form)
    assert set(json.loads(answer)) == {"city"}
    assert browser.errors == []
