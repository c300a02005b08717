"""A headless Chromium for the tests that look at a page as a reader does.

Debian's ``chromium`` (``.ci/run`` installs it; a browser that downloads itself cannot be
fetched here), started with a new empty profile and the flags a closed network needs, and
driven over its DevTools protocol (a JSON message per command on one websocket):

    with Browser() as browser:
        browser.open("http://127.0.0.1:8001/index.html")
        browser.evaluate("document.title")
        browser.screenshot(path)
        browser.errors  # every console error and uncaught exception since the start

Only loopback addresses are ever opened.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

# Without the background-networking flags Chromium tries Google's hosts at every start,
# and this machine's closed network refuses each connection.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--mute-audio",
)  # fmt: skip


def chromium() -> str | None:
    """The Chromium executable on ``PATH``, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class BrowserError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, width: int = 1280, height: int = 1000, timeout: float = 30.0):
        self.width, self.height, self.timeout = width, height, timeout
        self.errors: list[str] = []  # console errors, failed loads, uncaught exceptions
        self._ids = itertools.count(1)

    def __enter__(self) -> Browser:
        import websocket  # websocket-client, a test dependency ([dev])

        executable = chromium()
        if executable is None:
            raise BrowserError("no chromium on PATH (apt-get install chromium)")
        self._profile = tempfile.TemporaryDirectory(prefix="ladder-chromium-")
        self._process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self._profile.name}",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            port = self._devtools_port()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                page = next(t for t in json.load(r) if t["type"] == "page")
            self._socket = websocket.create_connection(
                page["webSocketDebuggerUrl"], timeout=self.timeout, suppress_origin=True
            )
            for domain in ("Page", "Runtime", "Log"):
                self.send(f"{domain}.enable")
            self.send(
                "Emulation.setDeviceMetricsOverride",
                width=self.width, height=self.height, deviceScaleFactor=1, mobile=False,
            )  # fmt: skip
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stop()

    def _stop(self) -> None:
        socket = getattr(self, "_socket", None)
        if socket is not None:
            socket.close()
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        for _ in range(20):  # Chromium's helper processes may still write as they exit
            try:
                self._profile.cleanup()
                return
            except OSError:
                time.sleep(0.1)
        self._profile.cleanup()

    def _devtools_port(self) -> int:
        """The port Chromium chose, from the file it writes in its profile."""
        active = Path(self._profile.name) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise BrowserError(f"chromium exited with status {self._process.returncode}")
            if active.is_file() and active.read_text().strip():
                return int(active.read_text().split()[0])
            time.sleep(0.05)
        raise BrowserError("chromium did not open its DevTools port")

    # ------------------------------------------------------------------------- the protocol

    def send(self, method: str, **params) -> dict:
        """Send one command and return its result, noting the events that arrive meanwhile."""
        ident = next(self._ids)
        self._socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = self._receive()
            if message.get("id") == ident:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message["result"]

    def _receive(self) -> dict:
        message = json.loads(self._socket.recv())
        self._note(message)
        return message

    def _note(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            texts = [a.get("value", a.get("description", "")) for a in params["args"]]
            self.errors.append("console: " + " ".join(map(str, texts)))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"uncaught: {text}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            self.errors.append(f"{entry['source']}: {entry['text']} {entry.get('url', '')}")

    def open(self, url: str) -> None:
        """Navigate and wait for the page's load event."""
        if not url.startswith(("http://127.0.0.1:", "http://localhost:", "about:")):
            raise BrowserError(f"only loopback pages are opened here, not {url}")
        self.send("Page.navigate", url=url)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self._receive().get("method") == "Page.loadEventFired":
                return
        raise BrowserError(f"{url} did not load in {self.timeout:.0f} s")

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.send(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:60]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 10.0):
        """Evaluate ``expression`` until it is truthy; its value (None after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        return None

    def screenshot(self, path: Path) -> Path:
        """A PNG of what the viewport shows."""
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
