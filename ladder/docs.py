"""``ladder docs``: build the course as a site, strictly, and serve it on 127.0.0.1.

The build is ``mkdocs build --strict`` of the checkout's ``mkdocs.yml`` (a broken link,
a missing page or image, any warning fails it, as in CI); the site is then served from
its folder by Python's own HTTP server, on the loopback address only, until Ctrl-C.
Nothing is fetched: the theme, the search index and the math (KaTeX, in
``docs/assets/katex``) are all files of the site.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import subprocess
import sys
from pathlib import Path

from .cli import UsageError

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


def serve(site_dir: Path, port: int) -> None:
    """Serve ``site_dir`` on 127.0.0.1:``port`` (0: a free port) until Ctrl-C."""
    handler = functools.partial(_QuietHandler, directory=str(site_dir))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise UsageError(
            f"cannot serve on 127.0.0.1:{port} ({exc.strerror}); --port N, or --port 0 for a free one"
        ) from None
    with server:
        print(
            f"the course: http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)", flush=True
        )
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            print("stopped", file=sys.stderr)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass  # a request a line would bury the address printed above


def run(args: argparse.Namespace) -> int:
    if args.port > 65535:
        raise UsageError(f"--port {args.port}: a port is at most 65535")
    site_dir = (args.site_dir or ROOT / "site").resolve()
    if site_dir.exists() and not site_dir.is_dir():
        raise UsageError(f"--site-dir {site_dir} is a file")
    status = build(site_dir)
    if status != 0:
        print("ladder docs: error: the strict build failed (its messages above)", file=sys.stderr)
        return 1
    print(f"built: {site_dir}", file=sys.stderr)
    if not args.no_serve:
        serve(site_dir, args.port)
    return 0
