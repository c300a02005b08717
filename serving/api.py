"""OpenAI's HTTP API over the engine: what ``ladder serve`` answers.

Routes (the subset of https://platform.openai.com/docs/api-reference a local model
can honour):

* ``POST /v1/chat/completions``: ``messages`` through the model's chat template;
  ``stream`` as server-sent events (a chunk per piece of text, ended by
  ``data: [DONE]``), ``stream_options.include_usage`` (a last chunk with the usage);
* ``POST /v1/completions``: a ``prompt`` string continued as it is, no template;
* ``GET /v1/models``: the one model served; ``GET /health`` (the model, the requests
  waiting and running, and the KV cache's blocks, total and free);
* ``GET /``: a page to chat with the model in a browser (``static/chat.html``: one file,
  no external assets, over the routes above); ``GET /metrics``: Prometheus's text
  format (``metrics.py``).

``response_format`` holds the output to a JSON schema, any JSON object, or a regex
(``structured.py``), streaming or not; a schema outside the subset is a 400 naming
the keyword.

Sampling as OpenAI's defaults: ``temperature`` 1 (0 is greedy, the tokens of
``ladder chat``), ``top_p`` 1; ``top_k`` as an extra field; ``seed`` makes a
sampled answer repeat; ``stop``, a string or up to four; ``max_tokens`` (or
``max_completion_tokens``) defaults to what the context leaves after the prompt
(under a ``response_format``, to at most ``structured.MAX_TOKENS``: the mask then
keeps room to end the text within it, ``constrained.masks.Constraint``).
``n`` other than 1, ``logprobs`` and tools are refused by name rather than
ignored. The usage counts ``prompt_tokens_details.cached_tokens`` (the prompt's
tokens found in the engine's prefix cache) and each response carries ``timings`` (the wait in the queue,
the time to the first token, the time per output token), as llama.cpp's server does.

Speculative decoding: the server's draft (``ladder serve --speculate``) guesses each
request's tokens unless the request says otherwise, with extra fields of our own:
``speculate`` (``"ngram"``, ``"none"``, or the server's draft by its name) and
``draft_tokens`` (the guesses a step, at least 1; absent, the server's: paced unless
``--draft-tokens`` fixes it). The usage then counts
``completion_tokens_details.accepted_prediction_tokens`` and
``rejected_prediction_tokens``, OpenAI's names for the guessed tokens kept and not.

Every error is answered with OpenAI's error body, ``{"error": {"message", "type",
"param", "code"}}``: malformed JSON or a wrong field (400), an unknown model (404), a
body over the size limit (413), a prompt that leaves no room for one token (400,
``context_length_exceeded``), a full queue (429), a route that does not exist (404,
``not_found``) or a method a route does not take (405, ``method_not_allowed``, with
``Allow``), and the server's own failure (500). A client that leaves mid-stream
cancels its request; the engine goes on with the others.

With a ``log`` (``ladder serve`` prints to stderr unless ``--quiet``), each request
ends with one line, as the servers a user knows write one: the time, the client, the
method, the route, the status, then the prompt's and the answer's tokens, the time to
the first token and the total (``Exchange.line``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request as HTTPRequest
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .metrics import Metrics, StatusCounter
from .structured import MAX_TOKENS, FormatError, Formats
from .worker import Completion, Finished, QueueFull, Worker

MAX_BODY = 1 << 20  # bytes: a request body larger than this is refused (413)
MAX_STOPS = 4  # as OpenAI
FINISH_WAIT_S = 5.0  # the longest a log line waits for a cut stream's request to stop


class APIError(Exception):
    """A request refused: its HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, param=None, code=None, kind=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        error = {"message": self.message, "type": self.kind, "param": self.param}
        body = {"error": error | {"code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=headers)


# ----------------------------------------------------------------------------- the log


@dataclass
class Exchange:
    """One HTTP request as its log line tells it: what the handlers learnt along the way
    (the prompt's tokens, the refusal, how the answer finished)."""

    method: str
    route: str
    client: str
    start: float = field(default_factory=time.perf_counter)
    status: int | None = None
    prompt_tokens: int | None = None
    error: str | None = None
    finished: Finished | None = None
    submitted: bool = False  # the engine took it: a Finished will come
    done: asyncio.Event = field(default_factory=asyncio.Event)  # set with ``finished``

    def line(self, clock: str) -> str:
        """``12:04:31 127.0.0.1 POST /v1/chat/completions 200 | prompt 37 tokens (0 cached)
        | 7 generated (stop) | first token 0.23 s | total 0.41 s``."""
        parts = [f"{clock} {self.client} {self.method} {self.route} {self.status or '-'}"]
        if self.error is not None:
            parts.append(self.error)
        done = self.finished
        if done is not None:
            parts.append(f"prompt {done.prompt_tokens} tokens ({done.cached_tokens} cached)")
            parts.append(f"{done.completion_tokens} generated ({done.finish_reason})")
            if done.completion_tokens:
                first = done.queued_s + done.first_token_s  # from its arrival at the engine
                parts.append(f"first token {first:.2f} s")
        elif self.prompt_tokens is not None:
            parts.append(f"prompt {self.prompt_tokens} tokens")
        parts.append(f"total {time.perf_counter() - self.start:.2f} s")
        return " | ".join(parts)


class _Logged:
    """ASGI middleware: an ``Exchange`` in each HTTP request's scope (``request.state``),
    and its line written when the response is over. A stream the client cut is logged
    once its request has stopped (at most ``FINISH_WAIT_S`` later), with what it made."""

    def __init__(self, app, write: Callable[[str], None]):
        self.app, self.write = app, write

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        client = scope.get("client")
        exchange = Exchange(scope["method"], scope["path"], client[0] if client else "-")
        scope.setdefault("state", {})["exchange"] = exchange

        async def sending(message):
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if exchange.submitted and not exchange.done.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(exchange.done.wait(), FINISH_WAIT_S)
            self.write(exchange.line(time.strftime("%H:%M:%S")))


def _exchange(http: HTTPRequest) -> Exchange | None:
    """The request's ``Exchange``, where the server logs (``_Logged``)."""
    return getattr(http.state, "exchange", None)


# ----------------------------------------------------------------------------- the fields


def _field(body: dict, name: str, types, default=None, *, check=None, what: str = ""):
    """``body[name]`` if it is one of ``types`` (and passes ``check``), else ``default``
    when absent or null; a wrong type or value is a 400 naming the field."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        value = object()  # JSON true is not a number here
    if not isinstance(value, types) or (check is not None and not check(value)):
        raise APIError(400, f"'{name}' must be {what}, got {json.dumps(body[name])}", param=name)
    return value


def _sampling(body: dict) -> dict[str, Any]:
    """The request's sampling settings and limits, checked."""
    number = (int, float)
    _field(body, "n", int, 1, check=lambda v: v == 1, what="1 (one choice per request)")
    for unsupported in ("logprobs", "tools", "functions", "logit_bias"):
        if body.get(unsupported) not in (None, False, [], {}):
            raise APIError(400, f"'{unsupported}' is not supported here", param=unsupported)
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stops is not None and not (
        isinstance(stops, list)
        and len(stops) <= MAX_STOPS
        and all(isinstance(s, str) for s in stops)
    ):
        raise APIError(400, f"'stop' must be a string or up to {MAX_STOPS} strings", param="stop")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = _field(
        {name: max_tokens}, name, int, None, check=lambda v: v >= 1, what="an integer >= 1"
    )
    return {
        "temperature": float(
            _field(body, "temperature", number, 1.0, check=lambda v: 0 <= v <= 2, what="in [0, 2]")
        ),
        "top_p": _top_p(
            _field(body, "top_p", number, 1.0, check=lambda v: 0 < v <= 1, what="in (0, 1]")
        ),
        "top_k": _field(body, "top_k", int, None, check=lambda v: v >= 1, what="an integer >= 1"),
        "seed": _field(body, "seed", int, None, check=lambda v: v >= 0, what="an integer >= 0"),
        "stop": tuple(stops or ()),
        "max_tokens": max_tokens,
    }


def _top_p(p: float) -> float | None:
    return None if p >= 1 else float(p)  # 1 keeps every token: no nucleus at all


def _messages(body: dict) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            parts = [p.get("text") for p in content if isinstance(p, dict)]
            content = "".join(parts) if all(isinstance(p, str) for p in parts) else None
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("system", "user", "assistant", "developer") or not isinstance(content, str):
            raise APIError(
                400,
                f"messages[{i}] must have a role (system, user, assistant) and text content",
                param=f"messages[{i}]",
            )
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


# ----------------------------------------------------------------------------- the server


class Server:
    """The routes over one ``Worker`` serving the model named ``model_name``; ``log``, if
    given, is called with each request's line when it ends."""

    def __init__(
        self,
        worker: Worker,
        model_name: str,
        *,
        max_body: int = MAX_BODY,
        log: Callable[[str], None] | None = None,
        speculate: str | None = None,
        draft_tokens: int | None = None,
    ):
        self.worker, self.model_name, self.max_body = worker, model_name, max_body
        self.log = log
        # The server's draft, by name (None: no speculation unless a request asks for ngram).
        self.speculate, self.draft_tokens = speculate, draft_tokens
        self.created = int(time.time())
        self.formats = Formats(worker.loaded.tokenizer, worker.loaded.stop_ids)
        self.metrics = Metrics(worker)

    def app(self):
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/", self.page, methods=["GET"]),
            Route("/metrics", self.scrape, methods=["GET"]),
        ]
        self.routes = ", ".join(f"{sorted(r.methods - {'HEAD'})[0]} {r.path}" for r in routes)
        handlers = {HTTPException: self._http_error, Exception: self._failure}
        counted = Middleware(StatusCounter, metrics=self.metrics, routes=[r.path for r in routes])
        app = Starlette(routes=routes, middleware=[counted], exception_handlers=handlers)
        return app if self.log is None else _Logged(app, self.log)

    async def page(self, request: HTTPRequest) -> HTMLResponse:
        """The chat page: one static file, read once."""
        return HTMLResponse(_page())

    async def scrape(self, request: HTTPRequest) -> Response:
        """``/metrics``: the counters, in Prometheus's text format."""
        return Response(self.metrics.text(), media_type=self.metrics.content_type)

    async def _http_error(self, http: HTTPRequest, exc: HTTPException) -> JSONResponse:
        """Starlette's own refusals (no such route, a method the route does not take) in
        OpenAI's error body."""
        where = f"{http.method} {http.url.path}"
        if exc.status_code == 404:
            error = APIError(404, f"no route {where}; this server answers {self.routes}",
                             code="not_found")  # fmt: skip
        elif exc.status_code == 405:
            allowed = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow", "")
            error = APIError(405, f"{where}: the method is not allowed here (allowed: {allowed})",
                             code="method_not_allowed")  # fmt: skip
        else:
            error = APIError(exc.status_code, exc.detail or f"HTTP {exc.status_code}")
        return self._refused(http, error, headers=exc.headers)

    async def _failure(self, http: HTTPRequest, exc: Exception) -> JSONResponse:
        """A failure of the server itself (500), in OpenAI's error body; the traceback
        still goes to the server's log."""
        return self._refused(http, APIError(500, f"the server failed: {type(exc).__name__}"))

    @staticmethod
    def _refused(http: HTTPRequest, error: APIError, headers=None) -> JSONResponse:
        exchange = _exchange(http)
        if exchange is not None:
            exchange.error = error.message
        return error.response(headers)

    async def health(self, request: HTTPRequest) -> JSONResponse:
        """``{"status": "ok"}``, the model's name, the requests waiting (no token yet) and
        running, and the KV cache's blocks where requests share a pool: how many there are,
        and how many no running request holds (a finished or cancelled one's come back;
        those holding a prefix stay findable until taken)."""
        body = {"status": "ok", "model": self.model_name, "queue": self.metrics.queue}
        pool = self.worker.pool
        if pool is not None:
            body["kv_blocks"] = {"total": pool.blocks, "free": pool.available}
        return JSONResponse(body)

    async def models(self, request: HTTPRequest) -> JSONResponse:
        card = {"id": self.model_name, "object": "model", "created": self.created}
        return JSONResponse({"object": "list", "data": [card | {"owned_by": "attention-ladder"}]})

    async def chat(self, request: HTTPRequest):
        return await self._complete(request, chat=True)

    async def completions(self, request: HTTPRequest):
        return await self._complete(request, chat=False)

    async def _complete(self, http: HTTPRequest, *, chat: bool):
        try:
            body = await self._body(http)
            model = body.get("model")
            if model is not None and model != self.model_name:
                raise APIError(
                    404, f"the model '{model}' does not exist here (this server has "
                    f"'{self.model_name}')", param="model", code="model_not_found",
                )  # fmt: skip
            ids = self._prompt(body, chat)
            if _exchange(http) is not None:
                _exchange(http).prompt_tokens = len(ids)
            settings = _sampling(body)
            stream = _field(body, "stream", bool, False, what="true or false")
            options = body.get("stream_options") or {}
            if not isinstance(options, dict):
                raise APIError(400, "'stream_options' must be an object", param="stream_options")
            usage_chunk = bool(options.get("include_usage")) and stream
            request = self._request(ids, settings)
            request.draft, request.draft_tokens = self._draft(body)
            request.constraint = await self._format(body, request)
            events = self._submit(request, _exchange(http))
        except APIError as exc:
            return self._refused(http, exc)
        kind = "chat.completion" if chat else "text_completion"
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
                "created": int(time.time()), "model": self.model_name}  # fmt: skip
        if stream:
            return StreamingResponse(
                self._chunks(request, events, head, kind, chat, usage_chunk),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return await self._whole(request, events, head, kind, chat)

    async def _body(self, http: HTTPRequest) -> dict:
        declared = http.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise APIError(413, f"the request body is over {self.max_body} bytes")
        raw = b""
        async for chunk in http.stream():
            raw += chunk
            if len(raw) > self.max_body:
                raise APIError(413, f"the request body is over {self.max_body} bytes")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise APIError(400, "the body must be a JSON object")
        return body

    def _prompt(self, body: dict, chat: bool) -> list[int]:
        loaded = self.worker.loaded
        if chat:
            if loaded.template is None:
                raise APIError(400, "this model has no chat template: use /v1/completions")
            try:
                text = loaded.template.render(_messages(body), add_generation_prompt=True)
            except ValueError as exc:
                raise APIError(400, str(exc), param="messages") from None
        else:
            text = body.get("prompt")
            if isinstance(text, list) and len(text) == 1:
                text = text[0]
            if not isinstance(text, str):
                raise APIError(400, "'prompt' must be a string", param="prompt")
        # The template writes the special tokens itself; a plain prompt has none.
        ids = loaded.tokenizer.encode(text, add_special_tokens=not chat).ids
        if not ids:
            raise APIError(400, "the prompt is empty", param="messages" if chat else "prompt")
        return ids

    def _request(self, ids: list[int], settings: dict) -> Completion:
        room = self.worker.context - len(ids)
        asked = settings.pop("max_tokens")
        if room < (asked or 1):
            raise APIError(
                400,
                f"the prompt's {len(ids)} tokens and {asked or 1} new ones exceed the context "
                f"of {self.worker.context} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        return Completion(ids, asked or room, **settings)

    def _draft(self, body: dict) -> tuple[object, int]:
        """The request's draft and guesses a step: its ``speculate`` and ``draft_tokens``, or the
        server's."""
        from engine import commands_ngram

        name = _field(body, "speculate", str, self.speculate or "none", what="a draft's name")
        k = _field(body, "draft_tokens", int, self.draft_tokens, check=lambda v: v >= 1,
                   what="an integer >= 1")  # fmt: skip
        if name == "none":
            return None, k
        if name == self.speculate and self.worker.loaded.draft is not None:
            return self.worker.loaded.draft, k
        if name == "ngram":
            return commands_ngram(), k
        served = f", or '{self.speculate}'" if self.speculate else ""
        raise APIError(400, f"'speculate' must be 'ngram' or 'none'{served}, got {name!r}",
                       param="speculate")  # fmt: skip

    async def _format(self, body: dict, request: Completion):
        """The request's ``response_format`` as its own ``Constraint`` (None: none), compiled
        off the event loop (a first compile takes milliseconds to a second), with its
        ``max_tokens`` as its budget (``structured.MAX_TOKENS`` at most where none was asked)."""
        try:
            index = await asyncio.to_thread(self.formats.index, body.get("response_format"))
        except FormatError as exc:
            raise APIError(400, str(exc), param="response_format") from None
        if index is None:
            return None
        if body.get("max_completion_tokens", body.get("max_tokens")) is None:
            request.max_tokens = min(request.max_tokens, MAX_TOKENS)
        return index.constraint(budget=request.max_tokens)

    def _submit(self, request: Completion, exchange: Exchange | None) -> asyncio.Queue:
        loop, events = asyncio.get_running_loop(), asyncio.Queue()

        def arrived(event) -> None:  # on the event loop, in the order the engine sent them
            if exchange is not None and isinstance(event, Finished | Exception):
                if isinstance(event, Finished):
                    exchange.finished = event
                else:
                    exchange.error = f"the model failed: {event}"
                exchange.done.set()
            events.put_nowait(event)

        deliver = self.metrics.watch(lambda e: loop.call_soon_threadsafe(arrived, e))
        try:
            self.worker.submit(request, deliver)
        except QueueFull as exc:
            self.metrics.refused(deliver)
            raise APIError(429, str(exc), kind="rate_limit_error", code="queue_full") from None
        if exchange is not None:
            exchange.submitted = True
        return events

    @staticmethod
    def _usage(done: Finished) -> dict:
        return {
            "prompt_tokens": done.prompt_tokens,
            "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
            "completion_tokens_details": {
                "accepted_prediction_tokens": done.accepted_tokens,
                "rejected_prediction_tokens": done.drafted_tokens - done.accepted_tokens,
            },
        }

    @staticmethod
    def _timings(done: Finished) -> dict:
        return {
            "queued_s": round(done.queued_s, 6),
            "time_to_first_token_s": round(done.first_token_s, 6),
            "time_per_output_token_s": round(done.per_token_s, 6),
        }

    async def _whole(self, request, events, head, kind, chat) -> JSONResponse:
        pieces = []
        try:
            while True:
                event = await events.get()
                if isinstance(event, Exception):
                    return APIError(500, f"the model failed: {event}").response()
                if isinstance(event, Finished):
                    break
                pieces.append(event)
        finally:
            request.cancel()  # a no-op once finished; stops the work if the client left
        text = "".join(pieces)
        choice = {"index": 0, "finish_reason": event.finish_reason}
        choice |= {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        body = head | {"object": kind, "choices": [choice | {"logprobs": None}]}
        return JSONResponse(body | {"usage": self._usage(event), "timings": self._timings(event)})

    async def _chunks(self, request, events, head, kind, chat, usage_chunk):
        kind = "chat.completion.chunk" if chat else kind

        def chunk(delta=None, finish=None, **extra) -> str:
            if chat:
                choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
            else:
                choice = {
                    "index": 0,
                    "text": (delta or {}).get("content", ""),
                    "finish_reason": finish,
                }
            body = head | {"object": kind, "choices": [choice | {"logprobs": None}]} | extra
            return f"data: {json.dumps(body)}\n\n"

        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            while True:
                event = await events.get()
                if isinstance(event, Exception):
                    error = {"message": f"the model failed: {event}", "type": "server_error"}
                    yield f"data: {json.dumps({'error': error})}\n\n"
                    break
                if isinstance(event, Finished):
                    yield chunk(finish=event.finish_reason, timings=self._timings(event))
                    if usage_chunk:
                        last = head | {"object": kind, "choices": [], "usage": self._usage(event)}
                        yield f"data: {json.dumps(last)}\n\n"
                    break
                yield chunk({"content": event})
            yield "data: [DONE]\n\n"
        finally:
            request.cancel()  # the client left, or the answer is done: either way, stop


@functools.cache
def _page() -> str:
    """``static/chat.html``, read on first use."""
    return (Path(__file__).parent / "static" / "chat.html").read_text()
