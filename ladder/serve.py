"""``ladder serve``: one model at one level, answering OpenAI's HTTP API.

The model loads as ``ladder chat`` loads it (``--model``, ``--level``, ``--dtype``,
``--context``, level 3's ``--weights``). Up to ``--max-batch`` requests (8) are decoded
together, a row each in every step, eagerly, over a paged KV cache of ``--blocks``
blocks with prefix caching (the engine, on a worker thread: ``serving.worker``), and at
level 3 in float32 on a CPU with the matrices in oneDNN's layout for a few rows
(``--weights blocked``, unless ``--weights`` says otherwise); ``--max-batch 1`` decodes one request at a
time, and at level 3 with the compiled step (compiled, or loaded from the cache, before
the first request). Then uvicorn serves ``serving.api`` on ``--host`` (127.0.0.1 by
default: this machine only) and ``--port`` until Ctrl-C, writing a line per request to
stderr (``--quiet``: none). Sampling is each request's own (OpenAI's defaults).
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
import sys

from .cli import Interrupted, UsageError


def serve(args: argparse.Namespace) -> int:
    missing = [m for m in ("starlette", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"ladder serve needs {', '.join(missing)}: pip install 'attention-ladder[serve]'"
        )
    _check_address(args.host, args.port)  # before the model loads
    import uvicorn

    import loading
    from serving.api import Server
    from serving.worker import Worker

    from .chat import load

    if args.max_batch > 1 and args.compile:
        raise UsageError(
            "--compile decodes one request at a time: give --max-batch 1 with it (a batch "
            "decodes eagerly, its rows changing at every step)"
        )
    if args.blocks is not None and args.max_batch == 1:
        raise UsageError("--blocks is the cache a batch shares: give --max-batch 2 or more")
    if args.max_batch > 1:
        args.compile = False  # the compiled step is for one row; a batch decodes eagerly
        if args.weights is None and _blocked_fits(args):
            args.weights = "blocked"  # oneDNN's product of a few rows: about one row's time
    loaded = load(args, chat=True)
    threads = loading.choose(args.threads, loaded.model)
    with threads.limit():  # the step is compiled for the threads the engine will decode with
        loading.prepare_all(loaded, threads.n, _log, args.draft_tokens)
    worker = Worker(
        loaded,
        max_queue=args.max_queue,
        max_batch=args.max_batch,
        blocks=args.blocks,
        prefix_cache=args.prefix_cache,
        limit=threads.limit,
    )
    log = None if args.quiet else _log
    server = Server(worker, loaded.name, max_body=args.max_body, log=log,
                    speculate=getattr(args, "speculate", None), draft_tokens=args.draft_tokens)  # fmt: skip
    batch = "one at a time"
    if worker.pool is not None:
        pool = worker.pool
        blocked = ", matrices blocked for oneDNN" if args.weights == "blocked" else ""
        batch = (
            f"up to {worker.max_batch} requests at once over {pool.blocks} KV blocks of "
            f"{pool.block_size} positions ({(pool.k.nbytes + pool.v.nbytes) / 2**20:.0f} MiB){blocked}"
        )
    print(
        f"serving {loaded.name} at {loaded.level.__name__.rsplit('.', 1)[-1]}, {batch} "
        f"({threads}), on http://{args.host}:{args.port}/v1, a chat page at "
        f"http://{args.host}:{args.port}/ (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    # uvicorn.Server, not uvicorn.run, which swallows the Ctrl-C that stops it: a server
    # stopped by Ctrl-C ends as every command does, one line and exit status 130.
    http = uvicorn.Server(
        uvicorn.Config(server.app(), host=args.host, port=args.port, log_level="warning")
    )
    try:
        http.run()
    except KeyboardInterrupt:
        raise Interrupted(
            f"interrupted; stopped serving on http://{args.host}:{args.port}"
        ) from None
    if not http.started:
        raise RuntimeError(f"uvicorn could not start on {args.host}:{args.port} (see above)")
    return 0


def _log(line: str) -> None:
    """A request's line (``serving.api.Exchange.line``), on stderr with the server's others."""
    print(line, file=sys.stderr, flush=True)


def _blocked_fits(args: argparse.Namespace) -> bool:
    """Whether a batch's matrices go in oneDNN's blocked layout by default: level 3, float32,
    on a CPU, with oneDNN's ops in this torch (levels/level3_sdpa_flash/blocked.py)."""
    if args.level != "level3_sdpa_flash" or args.dtype not in (None, "float32"):
        return False  # --level is a full name by now (the parser's _level)
    from levels.level3_sdpa_flash.blocked import refusal

    return refusal(None, args.device) is None


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
                f"--host {host} --port {port}: cannot listen there ({exc.strerror}); "
                "--port N for another port"
            ) from None
