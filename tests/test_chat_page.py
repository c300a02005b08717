"""The chat page of ``ladder serve`` (``GET /``) in a real browser: Debian's Chromium, headless.

The test starts ``ladder serve`` (SmolLM2, level 3, eager, one thread) on a free port of
127.0.0.1 and Chromium on the page, drives it through Chrome's DevTools protocol as a
person would (types a question, presses Enter), waits for the streamed answer, and holds
it to the API's greedy answer to the same question; then a second question, answered
with the first turn kept (the API's answer to the whole conversation). A screenshot is
saved (its path is printed; ``-s`` shows it).

Chromium comes from Debian's package (``apt-get install chromium``; ``.ci/run``
installs it), started with the flags a closed network needs (no background
connections) and a fresh profile. In CI a missing browser fails the test; elsewhere it
is skipped with the reason.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.extended, pytest.mark.browser]

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1000,720", "--remote-debugging-port=0",
)  # fmt: skip
FIRST = "What is the capital of France?"
SECOND = "And of Germany?"


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        reason = "Chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


class Page:
    """One page over the DevTools protocol: ``call`` a method, ``evaluate`` JavaScript."""

    def __init__(self, socket):
        self.socket, self.sent = socket, 0

    def call(self, method: str, **params) -> dict:
        self.sent += 1
        self.socket.send(json.dumps({"id": self.sent, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == self.sent:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait_for(self, expression: str, seconds: float):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"the page never got to: {expression}")

    def type_and_enter(self, text: str) -> None:
        self.evaluate("document.getElementById('prompt').focus()")
        self.call("Input.insertText", text=text)
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                      windowsVirtualKeyCode=13)  # fmt: skip


@pytest.fixture
def browser(tmp_path):
    """Chromium, headless, with a fresh profile: -> a function opening a URL as a ``Page``."""
    from websockets.sync.client import connect

    from serving.launch import stop

    profile = tmp_path / "profile"
    process = None
    sockets = contextlib.ExitStack()

    def open_page(url: str) -> Page:
        nonlocal process
        command = [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", url]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            assert time.monotonic() < deadline and process.poll() is None, "Chromium did not start"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            (target,) = [t for t in json.load(r) if t["type"] == "page"]
        return Page(sockets.enter_context(connect(target["webSocketDebuggerUrl"], max_size=2**26)))

    yield open_page
    sockets.close()
    if process is not None:
        stop(process)


def _api_answer(base: str, messages: list[dict]) -> str:
    body = json.dumps({"messages": messages, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"{base}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.load(r)["choices"][0]["message"]["content"]


ANSWERS = "[...document.querySelectorAll('.assistant')]"  # the page's answers, in order


def test_the_page_streams_the_api_s_answers_and_keeps_the_conversation(
    smollm2_gguf, browser, tmp_path
):
    from serving.launch import serving

    with serving("--no-compile", "--threads", "1", start_s=120) as base:
        page = browser(f"{base}/")
        page.call("Runtime.enable")
        assert page.wait_for("document.getElementById('model').textContent === 'smollm2-135m'", 30)
        page.type_and_enter(FIRST)
        states = f"{ANSWERS}.map(a => a.dataset.state)"
        # The answer grows as it streams: seen part-way at least once, then done.
        partial = page.wait_for(f"{ANSWERS}[0]?.textContent.length > 0 && {states}[0]", 60)
        page.wait_for(f"{states}[0] === 'done'", 120)
        first = page.evaluate(f"{ANSWERS}[0].textContent")
        want = _api_answer(base, [{"role": "user", "content": FIRST}])
        assert first == want and "Paris" in first and partial in ("streaming", "done")
        page.type_and_enter(SECOND)
        page.wait_for(f"{states}.length === 2 && {states}[1] === 'done'", 120)
        second = page.evaluate(f"{ANSWERS}[1].textContent")
        conversation = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": first},
                        {"role": "user", "content": SECOND}]  # fmt: skip
        assert second == _api_answer(base, conversation)
        stats = page.evaluate("[...document.querySelectorAll('.stats')].map(s => s.textContent)")
        assert len(stats) == 2 and all("tok/s" in s and "smollm2-135m" in s for s in stats)
        shot = page.call("Page.captureScreenshot", format="png")
        path = Path(tmp_path) / "chat_page.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        print(f"\nscreenshot: {path}")
        assert path.stat().st_size > 10_000
