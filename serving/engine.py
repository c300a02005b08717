"""The engine: requests in, text out, one request decoded at a time.

A request is a prompt's token ids with its own sampling settings and limits; the
engine decodes it with the model's ``stream`` (``levels.common.generation``, the
loop ``ladder chat`` uses, so a greedy request gives ``ladder chat
--temperature 0``'s tokens), turns the ids into text as they come (the tokenizer's
stream decoder, holding back what could still become a stop string) and hands each
piece to the request's consumer. It ends at the model's end-of-turn ids, a stop
string (``finish_reason`` ``"stop"``) or ``max_tokens`` (``"length"``).

One worker thread runs the model, so the model's arithmetic never blocks the
server's event loop; requests wait in a queue of at most ``max_queue`` (a full queue
refuses a new one: ``QueueFull``, the server's 429). A request whose client went
away is cancelled: the worker stops it before its next token (or skips it if it
has not started). Each request reports its usage (prompt and completion tokens)
and its timings: the wait in the queue, the time to its first token, and the time
per output token after it.

This engine serves one request at a time: concurrent requests queue. Batching
several running requests into each decode step is the next rung (docs: serving).
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class QueueFull(RuntimeError):
    """The engine holds ``max_queue`` waiting requests already."""


@dataclass
class Request:
    """One completion asked for: ``ids``, the prompt's tokens, then at most ``max_tokens``."""

    ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    id: str = ""
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Stop it before its next token (or before it starts)."""
        self.cancelled.set()


@dataclass(frozen=True)
class Finished:
    """How a request ended: ``finish_reason`` (``"stop"``, ``"length"`` or
    ``"cancelled"``), its tokens, and its timings in seconds."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    queued_s: float
    first_token_s: float  # from the start of its turn to its first token (the prefill)
    per_token_s: float  # the mean time per token after the first (0 with one token)


# What a consumer receives, in order: zero or more str (the text, piece by piece), then
# one Finished, or one Exception (the request failed; the engine goes on).
Event = str | Finished | Exception
Deliver = Callable[[Event], None]


class Engine:
    """Decodes the requests given to ``submit``, one at a time, on a worker thread.

    ``loaded`` is ``ladder.chat.Loaded`` (the model, its tokenizer and end-of-turn ids);
    ``limit`` is entered on the worker thread (the CPU threads torch and BLAS use).
    """

    def __init__(self, loaded: Any, *, max_queue: int = 16, limit=None):
        self.loaded, self.max_queue = loaded, max_queue
        self._waiting: queue.Queue = queue.Queue()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._queued = 0
        self._limit = limit
        self._worker = threading.Thread(target=self._run, name="ladder-engine", daemon=True)
        self._worker.start()

    @property
    def context(self) -> int:
        """The tokens a request's prompt and completion may fill together."""
        return int(self.loaded.model.config.max_seq_len)

    def submit(self, request: Request, deliver: Deliver) -> Request:
        """Queue ``request``; ``deliver`` receives its events on the worker thread.
        ``QueueFull`` when ``max_queue`` requests wait already."""
        with self._lock:
            if self._queued >= self.max_queue:
                raise QueueFull(f"{self._queued} requests are waiting; try again later")
            self._queued += 1
        request.id = request.id or f"{next(self._ids)}"
        self._waiting.put((request, deliver, time.perf_counter()))
        return request

    def _run(self) -> None:
        with self._limit() if self._limit is not None else contextlib.nullcontext():
            while True:
                request, deliver, queued_at = self._waiting.get()
                with self._lock:
                    self._queued -= 1
                try:
                    self._decode(request, deliver, time.perf_counter() - queued_at)
                except Exception as exc:  # one request's failure, not the engine's
                    deliver(exc)

    def _decode(self, request: Request, deliver: Deliver, queued_s: float) -> None:
        from ladder.chat import Holdback
        from levels.tokenizer import StreamDecoder

        loaded = self.loaded
        count, start, first = 0, time.perf_counter(), None
        reason = "length"
        if request.cancelled.is_set():
            reason = "cancelled"
        else:
            decoder, holdback = StreamDecoder(loaded.tokenizer), Holdback(list(request.stop))
            tokens = loaded.model.stream(
                request.ids,
                request.max_tokens,
                temperature=request.temperature,
                top_k=request.top_k,
                top_p=request.top_p,
                seed=request.seed,
                stop_ids=loaded.stop_ids,
            )
            for token in tokens:
                count += 1
                first = first or time.perf_counter()
                if token in loaded.stop_ids:
                    reason = "stop"
                    break
                piece = holdback.add(decoder.push(token))
                if piece:
                    deliver(piece)
                if holdback.stopped:
                    reason = "stop"
                    break
                if request.cancelled.is_set():
                    reason = "cancelled"
                    break
            if reason != "cancelled":
                rest = (holdback.add(decoder.flush()) if not holdback.stopped else "") + (
                    holdback.finish()
                )
                if rest:
                    deliver(rest)
        end = time.perf_counter()
        first = first or end
        deliver(
            Finished(
                reason,
                len(request.ids),
                count,
                queued_s,
                first - start,
                (end - first) / (count - 1) if count > 1 else 0.0,
            )
        )
