"""OpenAI's HTTP API over the engine: what ``ladder serve`` answers.

Routes (the subset of https://platform.openai.com/docs/api-reference a local model
can honour):

* ``POST /v1/chat/completions``: ``messages`` through the model's chat template;
  ``stream`` as server-sent events (a chunk per piece of text, ended by
  ``data: [DONE]``), ``stream_options.include_usage`` (a last chunk with the usage);
* ``POST /v1/completions``: a ``prompt`` continued as it is, no template;
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
``logprobs`` (chat's ``top_logprobs``, completions' count and ``echo``, ``max_tokens``
0 to score a prompt only), ``n`` choices, ``frequency_penalty``, ``presence_penalty`` and
``logit_bias`` as OpenAI defines them (``answers.py`` writes the choices); a completion's
``prompt`` is a string, token ids, or a list of either; chat's ``tools`` and
``tool_choice`` (``tools.py``) answer ``tool_calls``; ``functions`` is refused by name
rather than ignored. The usage counts ``prompt_tokens_details.cached_tokens`` (the prompt's
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
import dataclasses
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

from levels.common.logprobs import MAX_TOP

from .answers import Choices, Spelling
from .metrics import Metrics, StatusCounter
from .structured import MAX_TOKENS, FormatError, Formats
from .tools import ToolError, Tools, turn
from .worker import Completion, Finished, Piece, QueueFull, Worker

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


def _sampling(body: dict, chat: bool, vocab: int) -> dict[str, Any]:
    """The request's sampling settings, limits and reports, checked."""
    number = (int, float)
    if body.get("functions") not in (None, False, [], {}):  # the API's older form
        raise APIError(400, "'functions' is not supported here (use 'tools')", param="functions")
    if not chat and body.get("tools") not in (None, []):
        raise APIError(400, "'tools' are for /v1/chat/completions", param="tools")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stops is not None and not (
        isinstance(stops, list)
        and len(stops) <= MAX_STOPS
        and all(isinstance(s, str) for s in stops)
    ):
        raise APIError(400, f"'stop' must be a string or up to {MAX_STOPS} strings", param="stop")
    echo = False if chat else _field(body, "echo", bool, False, what="true or false")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    least = 0 if echo else 1  # 0 with echo: the prompt scored, nothing generated
    max_tokens = _field({name: max_tokens}, name, int, None, check=lambda v: v >= least,
                        what=f"an integer >= {least}" + ("" if echo else " (0 only with 'echo')"))  # fmt: skip
    penalty = {"check": lambda v: -2 <= v <= 2, "what": "a number in [-2, 2]"}
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
        "frequency_penalty": float(_field(body, "frequency_penalty", number, 0.0, **penalty)),
        "presence_penalty": float(_field(body, "presence_penalty", number, 0.0, **penalty)),
        "logit_bias": _logit_bias(body.get("logit_bias"), vocab),
        "logprobs": _logprobs(body, chat),
        "echo": echo,
    }


def _logit_bias(bias, vocab: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: token ids (as strings) to numbers in [-100, 100]."""
    if bias is None:
        return ()
    if not isinstance(bias, dict):
        raise APIError(400, "'logit_bias' must be an object of token ids to numbers", param="logit_bias")  # fmt: skip
    out = []
    for key, value in bias.items():
        if not (key.isdigit() and int(key) < vocab):
            raise APIError(400, f"'logit_bias' key {key!r} is not a token id in [0, {vocab})", param="logit_bias")  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:  # fmt: skip
            raise APIError(400, f"'logit_bias' value for {key} must be a number in [-100, 100], got {json.dumps(value)}", param="logit_bias")  # fmt: skip
        out.append((int(key), float(value)))
    return tuple(out)


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many alternatives each token reports (None: no log-probabilities): chat's
    ``logprobs`` (true or false) and ``top_logprobs``, completions' ``logprobs`` (a count)."""
    most = f"an integer in [0, {MAX_TOP}]"
    if not chat:
        return _field(body, "logprobs", int, None, check=lambda v: 0 <= v <= MAX_TOP, what=most)  # fmt: skip
    asked = _field(body, "logprobs", bool, False, what="true or false")
    top = _field(body, "top_logprobs", int, None, check=lambda v: 0 <= v <= MAX_TOP, what=most)
    if top is not None and not asked:
        raise APIError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if asked else None


def _top_p(p: float) -> float | None:
    return None if p >= 1 else float(p)  # 1 keeps every token: no nucleus at all


def _messages(body: dict, native: bool) -> list[dict]:
    """The chat's messages, checked; a tool call and a tool's result as the template reads
    them (``native``: a template that takes tools; ``tools.turn``)."""
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
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls is not None and content is None:
            content = ""  # a turn that only called a tool
        if role not in ("system", "user", "assistant", "developer", "tool") or not isinstance(content, str):  # fmt: skip
            raise APIError(
                400,
                f"messages[{i}] must have a role (system, user, assistant, tool) and text content",
                param=f"messages[{i}]",
            )
        message = {"role": "system" if role == "developer" else role, "content": content}
        if calls is not None:
            if not isinstance(calls, list) or not calls:
                raise APIError(400, f"messages[{i}].tool_calls must be a non-empty list", param=f"messages[{i}]")  # fmt: skip
            message["tool_calls"] = calls
        if role == "tool" and isinstance(m.get("tool_call_id"), str):
            message["tool_call_id"] = m["tool_call_id"]
        try:
            out.append(turn(message, native))
        except ToolError as exc:
            raise APIError(400, f"messages[{i}]: {exc}", param=f"messages[{i}]") from None
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
        """``{"status": "ok"}``, the model's name, ``batch_invariant`` (false: the mode it runs
        in), the requests waiting (no token yet) and running, and the KV cache's blocks where requests share a pool: how many there are,
        and how many no running request holds (a finished or cancelled one's come back;
        those holding a prefix stay findable until taken)."""
        # A request's numbers may move in their last bits with the batch it runs in (the
        # products' summation order follows the rows; docs/serving.md): said, not hidden.
        body = {"status": "ok", "model": self.model_name, "queue": self.metrics.queue,
                "batch_invariant": False}  # fmt: skip
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
            prompts = self._prompts(body, chat)
            if _exchange(http) is not None:
                _exchange(http).prompt_tokens = sum(len(ids) for ids, _ in prompts)
            settings = _sampling(body, chat, int(self.worker.loaded.model.config.vocab_size))
            n = _field(body, "n", int, 1, check=lambda v: v >= 1, what="an integer >= 1")
            if n * len(prompts) > self.worker.max_queue:
                raise APIError(400, f"{n * len(prompts)} choices asked; this server queues at most {self.worker.max_queue}", param="n")  # fmt: skip
            stream = _field(body, "stream", bool, False, what="true or false")
            options = body.get("stream_options") or {}
            if not isinstance(options, dict):
                raise APIError(400, "'stream_options' must be an object", param="stream_options")
            usage_chunk = bool(options.get("include_usage")) and stream
            requests = await self._requests(body, prompts, settings, n)
            native = chat and "tools" in getattr(self.worker.loaded.template, "source", "")
            choices = Choices(self.spelling, [(text, ids[0]) for ids, text in prompts for _ in range(n)],
                              chat=chat, logprobs=settings["logprobs"] is not None,
                              tools=self._tools(body) if chat else None, native=native)  # fmt: skip
            events = self._submit(requests, _exchange(http))
        except APIError as exc:
            return self._refused(http, exc)
        kind = "chat.completion" if chat else "text_completion"
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
                "created": int(time.time()), "model": self.model_name}  # fmt: skip
        if stream:
            return StreamingResponse(
                self._chunks(requests, choices, events, head, kind, usage_chunk),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return await self._whole(requests, choices, events, head, kind)

    @staticmethod
    def _tools(body: dict) -> Tools | None:
        try:
            return Tools.parse(body)
        except ToolError as exc:
            raise APIError(400, str(exc), param=exc.param) from None

    async def _requests(self, body: dict, prompts, settings: dict, n: int) -> list[Completion]:
        """A ``Completion`` a choice: ``n`` a prompt, choice ``i`` seeded ``seed + i``, each
        after the prompt's first (its blocks then found in the prefix cache)."""
        out, tools = [], self._tools(body) if "messages" in body else None
        for ids, _ in prompts:
            first = None
            for i in range(n):
                choice = dict(settings)
                if choice["seed"] is not None:
                    choice["seed"] += i
                request = self._request(ids, choice)
                request.after = first
                request.draft, request.draft_tokens = self._draft(body)
                request.constraint = await self._format(body, request, tools)
                first = first or request
                out.append(request)
        return out

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

    @functools.cached_property
    def spelling(self) -> Spelling:
        return Spelling(self.worker.loaded.tokenizer)

    def _prompts(self, body: dict, chat: bool) -> list[tuple[list[int], str]]:
        """The request's prompts, each as ids and as text: chat's messages through the
        template; completions' ``prompt`` a string, a list of token ids, or a list of either
        (a choice each, in order)."""
        loaded = self.worker.loaded
        if chat:
            if loaded.template is None:
                raise APIError(400, "this model has no chat template: use /v1/completions")
            native = "tools" in getattr(loaded.template, "source", "")  # its own tool format
            messages, variables = _messages(body, native), {}
            tools = self._tools(body)
            if tools is not None:
                messages, variables = tools.prompt(messages, native)
            try:
                text = loaded.template.render(messages, add_generation_prompt=True, **variables)
            except ValueError as exc:
                raise APIError(400, str(exc), param="messages") from None
            # The template writes the special tokens itself.
            ids = loaded.tokenizer.encode(text, add_special_tokens=False).ids
            if not ids:
                raise APIError(400, "the prompt is empty", param="messages")
            return [(ids, text)]
        prompt = body.get("prompt")
        single = isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt))  # fmt: skip
        out = [self._one_prompt(p) for p in ([prompt] if single else prompt if isinstance(prompt, list) else [None])]  # fmt: skip
        if not out:
            raise APIError(400, "'prompt' must not be an empty list", param="prompt")
        return out

    def _one_prompt(self, prompt) -> tuple[list[int], str]:
        tokenizer, vocab = self.worker.loaded.tokenizer, self.worker.loaded.model.config.vocab_size
        what = "a string, a list of token ids, or a list of either"
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt, add_special_tokens=True).ids  # a plain prompt has none
            if not ids:
                raise APIError(400, "the prompt is empty", param="prompt")
            return ids, prompt
        if not isinstance(prompt, list) or not prompt or not all(_is_id(t) for t in prompt):
            raise APIError(400, f"'prompt' must be {what}", param="prompt")
        if not all(0 <= t < vocab for t in prompt):
            bad = next(t for t in prompt if not 0 <= t < vocab)
            raise APIError(400, f"'prompt' has token id {bad}, outside [0, {vocab})", param="prompt")  # fmt: skip
        return list(prompt), tokenizer.decode(prompt, skip_special_tokens=False)

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
        return Completion(ids, room if asked is None else asked, **settings)

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

    async def _format(self, body: dict, request: Completion, tools: Tools | None = None):
        """The request's ``response_format``, or its tools' calls (``tools.py``), as its own
        ``Constraint`` (None: none), compiled off the event loop (a first compile takes
        milliseconds to a second), with its ``max_tokens`` as its budget
        (``structured.MAX_TOKENS`` at most where none was asked)."""
        if tools is not None and tools.choice != "none":
            if body.get("response_format") not in (None, {"type": "text"}):
                raise APIError(400, "'response_format' and 'tools' together: the answer is a call or text", param="response_format")  # fmt: skip
            native = "tools" in getattr(self.worker.loaded.template, "source", "")
            key = "tools " + json.dumps([tools.called(), tools.choice, native], sort_keys=True)
            compile_ = functools.partial(tools.language, native)
            param = "tools"
        else:
            key, compile_, param = None, None, "response_format"
        try:
            index = await asyncio.to_thread(self.formats.index, body.get("response_format"), key, compile_)  # fmt: skip
        except FormatError as exc:
            raise APIError(400, str(exc), param=param) from None
        if index is None:
            return None
        if body.get("max_completion_tokens", body.get("max_tokens")) is None:
            request.max_tokens = min(request.max_tokens, MAX_TOKENS)
        return index.constraint(budget=request.max_tokens)

    def _submit(self, requests: list[Completion], exchange: Exchange | None) -> asyncio.Queue:
        """Queue the choices -> one queue of ``(index, event)`` as they come."""
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        finished: dict[int, Finished] = {}

        def arrived(index, event) -> None:  # on the event loop, in the order the engine sent them
            if exchange is not None and isinstance(event, Finished | Exception):
                if isinstance(event, Finished):
                    finished[index] = event
                    if len(finished) == len(requests):
                        exchange.finished = _together(requests, finished)
                else:
                    exchange.error = f"the model failed: {event}"
                if exchange.error is not None or exchange.finished is not None:
                    exchange.done.set()
            events.put_nowait((index, event))

        def deliver(index):
            return self.metrics.watch(lambda e: loop.call_soon_threadsafe(arrived, index, e))

        delivers = [deliver(i) for i in range(len(requests))]
        try:
            self.worker.submit_all(requests, delivers)
        except QueueFull as exc:
            for d in delivers:
                self.metrics.refused(d)
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

    async def _whole(self, requests, choices: Choices, events, head, kind) -> JSONResponse:
        try:
            while not choices.done:
                index, event = await events.get()
                if isinstance(event, Exception):
                    return APIError(500, f"the model failed: {event}").response()
                choices.add(index, event)
        finally:
            for request in requests:
                request.cancel()  # a no-op once finished; stops the work if the client left
        done = _together(requests, {i: c.finished for i, c in enumerate(choices.choices)})
        body = head | {"object": kind, "choices": [choices.whole(i) for i in range(len(requests))]}
        return JSONResponse(body | {"usage": self._usage(done), "timings": self._timings(done)})

    async def _chunks(self, requests, choices: Choices, events, head, kind, usage_chunk):
        chat = choices.chat
        kind = "chat.completion.chunk" if chat else kind

        def chunk(choice: dict, **extra) -> str:
            return f"data: {json.dumps(head | {'object': kind, 'choices': [choice]} | extra)}\n\n"

        try:
            if chat:
                for i in range(len(requests)):
                    start = {"role": "assistant", "content": ""}
                    yield chunk({"index": i, "delta": start, "logprobs": None, "finish_reason": None})  # fmt: skip
            while not choices.done:
                index, event = await events.get()
                if isinstance(event, Exception):
                    error = {"message": f"the model failed: {event}", "type": "server_error"}
                    yield f"data: {json.dumps({'error': error})}\n\n"
                    break
                choices.add(index, event)
                if choices.held:  # an answer that may be a call
                    for held in choices.held_chunks(index):
                        yield chunk(held)
                    if isinstance(event, Piece):
                        continue
                elif isinstance(event, Piece):
                    yield chunk(choices.chunk(index, event))
                    continue
                reason = "tool_calls" if choices.calls(index) else event.finish_reason
                end = {"index": index, ("delta" if chat else "text"): {} if chat else "",
                       "logprobs": None, "finish_reason": reason}  # fmt: skip
                yield chunk(end, timings=self._timings(event))
            else:
                if usage_chunk:
                    done = _together(requests, {i: c.finished for i, c in enumerate(choices.choices)})  # fmt: skip
                    last = head | {"object": kind, "choices": [], "usage": self._usage(done)}
                    yield f"data: {json.dumps(last)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            for request in requests:
                request.cancel()  # the client left, or the answer is done: either way, stop


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _together(requests: list[Completion], finished: dict[int, Finished]) -> Finished:
    """The choices' ``Finished`` as one, for the usage and the log: each prompt counted once
    (not again for each of its ``n`` choices; its cached tokens those its first choice
    found), completion tokens and guesses added up, the first choice's timings and finish
    reason."""
    first, all_ = finished[0], [finished[i] for i in range(len(requests))]
    once = [f for r, f in zip(requests, all_, strict=True) if r.after is None]
    return dataclasses.replace(
        first,
        prompt_tokens=sum(f.prompt_tokens for f in once),
        cached_tokens=sum(f.cached_tokens for f in once),
        completion_tokens=sum(f.completion_tokens for f in all_),
        drafted_tokens=sum(f.drafted_tokens for f in all_),
        accepted_tokens=sum(f.accepted_tokens for f in all_),
    )


@functools.cache
def _page() -> str:
    """``static/chat.html``, read on first use."""
    return (Path(__file__).parent / "static" / "chat.html").read_text()
