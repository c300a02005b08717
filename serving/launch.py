"""``ladder serve`` as a process: started on 127.0.0.1 and a free port, waited for until it
answers ``/health``, and stopped (terminated, then killed) when the block ends, leaving no
process behind. Its output (a line per request among it) is read as it comes, so that a
long run never fills the pipe and stalls the server. The tests and the ``serve``
benchmark talk to the server this way."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator

START_S = 300  # seconds: a first start may compile level 3's decode step (a minute here)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(
    *flags: str, start_s: float = START_S, output: list[str] | None = None
) -> Iterator[str]:
    """``python -m ladder serve --port PORT *flags`` running for the block: -> its base URL,
    ``http://127.0.0.1:PORT``. Its output's lines (stdout and stderr) are appended to
    ``output`` as they come, when given. ``RuntimeError`` with its output if it does not
    come up."""
    port = free_port()
    command = [sys.executable, "-m", "ladder", "serve", "--port", str(port), *flags]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=os.environ | {"NO_COLOR": "1"},
        text=True,
        errors="replace",
    )
    lines = output if output is not None else []
    reader = threading.Thread(target=lines.extend, args=(process.stdout,), daemon=True)
    reader.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_s
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    process.wait()
                    reader.join(timeout=10)
                    raise RuntimeError(f"ladder serve did not start: {''.join(lines)}") from None
                time.sleep(0.2)
        yield base
    finally:
        stop(process)
        reader.join(timeout=10)
        process.stdout.close()


def stop(process: subprocess.Popen, wait_s: float = 30) -> None:
    """Terminate ``process``, and kill it if it has not ended within ``wait_s``."""
    process.terminate()
    try:
        process.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
