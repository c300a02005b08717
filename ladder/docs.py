"""``ladder docs``: build the course as a site, strictly, and serve it on 127.0.0.1.

The build is ``mkdocs build --strict`` of the checkout's ``mkdocs.yml`` (a broken link,
a missing page or image, any warning fails it, as in CI); the site is then served from
its folder by Python's own HTTP server, on the loopback address only, until Ctrl-C (one
line and exit status 130, as every command stops). A path that is no page gets the site's
own 404 page (the theme builds ``404.html``) with status 404. The default port is 8001,
beside ``ladder serve``'s 8000, so the course and a model can be open at once.
Nothing is fetched: the theme, the search index and the math (KaTeX, in
``docs/assets/katex``) are all files of the site.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import os
import subprocess
import sys
from http import HTTPStatus
from pathlib import Path

from .cli import Interrupted, UsageError

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "mkdocs.yml"


def build(site_dir: Path) -> int:
    """``mkdocs build --strict`` into ``site_dir``; mkdocs's exit status (its messages on
    stderr)."""
    if not CONFIG.is_file():
        raise UsageError(f"ladder docs builds the course of a checkout; {CONFIG} is missing")
    try:
        import material  # noqa: F401  (the theme)
        import mkdocs  # noqa: F401
    except ImportError:
        raise UsageError("ladder docs needs the docs extra: pip install -e '.[docs]'") from None
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # the theme's notice, not a warning of ours
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean"]
    command += ["--config-file", str(CONFIG), "--site-dir", str(site_dir)]
    return subprocess.run(command, env=env, check=False).returncode


def listen(site_dir: Path, port: int) -> http.server.ThreadingHTTPServer:
    """A server of ``site_dir`` bound to 127.0.0.1:``port`` (0: a free port), not yet serving:
    bound before the build, so that a port in use is said at once."""
    handler = functools.partial(SiteHandler, directory=str(site_dir))
    try:
        return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise UsageError(
            f"cannot serve on 127.0.0.1:{port} ({exc.strerror}); --port N, or --port 0 for a free one"
        ) from None


def serve(server: http.server.ThreadingHTTPServer) -> None:
    """Serve until Ctrl-C, which ends the command as every command ends (130, one line)."""
    address = f"http://127.0.0.1:{server.server_address[1]}/"
    print(f"the course: {address} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; stopped serving the course on {address}") from None


class SiteHandler(http.server.SimpleHTTPRequestHandler):
    """A built site's files, quietly (a line a request would bury the address printed
    above); a missing one is answered with the site's ``404.html``, status 404."""

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass

    def send_error(self, code, message=None, explain=None):
        page = Path(self.directory) / "404.html"
        if code != HTTPStatus.NOT_FOUND or not page.is_file():
            super().send_error(code, message, explain)
            return
        body = page.read_bytes()
        self.send_response(code, message)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def run(args: argparse.Namespace) -> int:
    if args.port > 65535:
        raise UsageError(f"--port {args.port}: a port is at most 65535")
    site_dir = (args.site_dir or ROOT / "site").resolve()
    if site_dir.exists() and not site_dir.is_dir():
        raise UsageError(f"--site-dir {site_dir} is a file")
    server = None if args.no_serve else listen(site_dir, args.port)
    with server or contextlib.nullcontext():
        if build(site_dir) != 0:
            print(
                "ladder docs: error: the strict build failed (its messages above)", file=sys.stderr
            )
            return 1
        print(f"built: {site_dir}", file=sys.stderr)
        if server is not None:
            serve(server)
    return 0
