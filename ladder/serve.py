"""``ladder serve``: one model at one level, answering OpenAI's HTTP API.

The model loads as ``ladder chat`` loads it (``--model``, ``--level``, ``--dtype``,
``--context``, level 3's ``--compile`` and ``--weights``); its decode step is compiled
(or loaded from the cache) before the first request. Then uvicorn serves
``serving.api`` on ``--host`` (127.0.0.1 by default: this machine only) and
``--port`` until Ctrl-C. Sampling is each request's own (OpenAI's defaults).
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
import sys

from .cli import UsageError


def serve(args: argparse.Namespace) -> int:
    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"ladder serve needs {', '.join(missing)}: pip install 'attention-ladder[serve]'"
        )
    _check_address(args.host, args.port)  # before the model loads
    import uvicorn

    from serving.api import Server
    from serving.engine import Engine

    from .chat import _prepare_decode, _threads, load

    loaded = load(args, chat=True)
    threads = _threads(args)
    with threads.limit():  # the step is compiled for the threads the engine will decode with
        _prepare_decode(loaded.model)
    engine = Engine(loaded, max_queue=args.max_queue, limit=threads.limit)
    server = Server(engine, loaded.name, max_body=args.max_body)
    print(
        f"serving {loaded.name} at {loaded.level.__name__.rsplit('.', 1)[-1]} ({threads}) on "
        f"http://{args.host}:{args.port}/v1 (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(server.app(), host=args.host, port=args.port, log_level="warning")
    return 0


def _check_address(host: str, port: int) -> None:
    """The address can be bound now (a port in use is one line, before the model loads)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise UsageError(
                f"--host {host} --port {port}: cannot listen there ({exc.strerror})"
            ) from None
