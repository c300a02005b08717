"""The engine: requests in, text out, several requests decoded together.

A request is a prompt's token ids with its own sampling settings and limits. Its
tokens are picked as ``stream`` picks them for it alone (``levels.common.generation``,
the loop ``ladder chat`` runs: the same sampling, its seed its own generator), turned
into text as they come (the tokenizer's stream decoder, holding back what could still
become a stop string) and handed to the request's consumer piece by piece. It ends at
the model's end-of-turn ids or a stop string (``finish_reason`` ``"stop"``), or at
``max_tokens`` (``"length"``).

One worker thread runs the model, so its arithmetic never blocks the server's event
loop. Up to ``max_batch`` requests run together (continuous batching): between two
decode steps, waiting requests are prefilled (together, in one right-padded pass) and
join the running batch, and finished ones leave it; each step then decodes one token for
every running request, reading the weights once for all of them, which is most of a
step's cost at these sizes (docs/decoding.md). The KV cache is regrouped whenever its rows change
(``levels.level2_torch_manual.cache.regroup``): each row keeps its own real slots and
positions, so it decodes as it would alone, and padding between them is masked. Where
a model's cache cannot be regrouped (levels 0 and 1), or with ``max_batch`` 1, the
requests are decoded one at a time, each through the model's ``stream``.

Requests wait in a queue of at most ``max_queue`` (a full queue refuses a new one:
``QueueFull``, the server's 429). A request whose client went away is cancelled: it
stops before its next token (or is skipped if it has not started). Each request reports
its usage (prompt and completion tokens) and its timings: the wait in the queue, the
time to its first token, and the time per output token after it.
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

from levels.common.sampling import Sampling, pick


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
    """Decodes the requests given to ``submit`` on a worker thread: up to ``max_batch`` at
    once where the model's KV cache can be regrouped (levels 2 to 4), else one at a time.

    ``loaded`` is ``ladder.chat.Loaded`` (the model, its level, its tokenizer and end-of-turn
    ids); ``limit`` is entered on the worker thread (the CPU threads torch and BLAS use).
    """

    def __init__(self, loaded: Any, *, max_queue: int = 16, max_batch: int = 1, limit=None):
        self.loaded, self.max_queue = loaded, max_queue
        kv_cache = getattr(getattr(loaded.model, "kernels", None), "kv_cache", None)
        self.max_batch = max_batch if hasattr(kv_cache, "per_layer") else 1
        self._waiting: queue.Queue = queue.Queue()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._queued = 0
        self._limit = limit
        self.steps = 0  # decode steps run, and the rows they decoded: the batching, measured
        self.rows = 0
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

    def _next(self, block: bool) -> _Answer | None:
        """The next waiting request as an ``_Answer`` (None if none waits and not ``block``)."""
        try:
            request, deliver, queued_at = self._waiting.get(block=block)
        except queue.Empty:
            return None
        with self._lock:
            self._queued -= 1
        return _Answer(self.loaded, request, deliver, time.perf_counter() - queued_at)

    def _run(self) -> None:
        with self._limit() if self._limit is not None else contextlib.nullcontext():
            if self.max_batch > 1:
                self._run_batched()
            while True:
                answer = self._next(block=True)
                try:
                    self._alone(answer)
                except Exception as exc:  # one request's failure, not the engine's
                    answer.deliver(exc)

    def _alone(self, answer: _Answer) -> None:
        """One request through the model's own ``stream``, start to end."""
        request = answer.request
        if request.cancelled.is_set():
            return answer.finish("cancelled")
        tokens = self.loaded.model.stream(
            request.ids,
            request.max_tokens,
            temperature=request.temperature,
            top_k=request.top_k,
            top_p=request.top_p,
            seed=request.seed,
            stop_ids=self.loaded.stop_ids,
        )
        for token in tokens:
            if answer.take(token):
                return None
        return answer.finish("length")  # the stream ended without a reason (not reached)

    def _run_batched(self) -> None:
        """Continuous batching: between decode steps, waiting requests are prefilled (in one
        pass) and join the running batch, finished ones leave it; the KV cache is regrouped
        (``levels.level2_torch_manual.cache.regroup``) whenever its rows change, so each row
        keeps its own positions and decodes as it would alone."""
        import torch

        from levels.level2_torch_manual.cache import regroup

        model, to_numpy = self.loaded.model, self.loaded.level.to_numpy
        device = model.device
        running: list[_Answer] = []
        cache = None
        while True:
            kept = list(range(len(running)))
            arriving: list[_Answer] = []
            while len(running) + len(arriving) < self.max_batch:
                answer = self._next(block=not running and not arriving)
                if answer is None:
                    break
                if answer.request.cancelled.is_set():
                    answer.finish("cancelled")
                else:
                    arriving.append(answer)
            joined = self._prefill(arriving) if arriving else []
            if joined:
                parts = [(cache, i) for i in kept] + [(prefilled, j) for _, prefilled, j in joined]
                cache = regroup(parts, model.config)
                running += [answer for answer, _, _ in joined]
            if not running:
                continue
            tokens = torch.tensor([answer.last for answer in running], device=device)
            try:
                with torch.no_grad():
                    logits = to_numpy(model.decode_step(tokens, cache))  # (B,V)
            except Exception as exc:  # the batch failed: each of its requests is told
                for answer in running:
                    answer.deliver(exc)
                running, cache = [], None
                continue
            self.steps, self.rows = self.steps + 1, self.rows + len(running)
            kept = [i for i, a in enumerate(running) if not a.take(a.pick(logits[i : i + 1]))]
            if len(kept) < len(running):
                cache = regroup([(cache, i) for i in kept], model.config) if kept else None
                running = [running[i] for i in kept]

    def _prefill(self, arriving: list[_Answer]) -> list[tuple[_Answer, Any, int]]:
        """The prompts of ``arriving`` in one pass, right-padded into one batch (``valid``),
        and each one's first token, picked as alone; -> ``(answer, cache, row)`` of those
        that go on decoding. A failure is told to each of them."""
        import torch

        model, device = self.loaded.model, self.loaded.model.device
        longest = max(len(a.request.ids) for a in arriving)
        ids = [a.request.ids + [0] * (longest - len(a.request.ids)) for a in arriving]  # (J,P)
        valid = [[j < len(a.request.ids) for j in range(longest)] for a in arriving]  # (J,P)
        try:
            with torch.no_grad():
                logits, cache = model.prefill(
                    torch.tensor(ids, device=device),
                    valid=torch.tensor(valid, device=device),
                    last_only=True,
                )  # (J,V): each row at its last real token
            logits = self.loaded.level.to_numpy(logits)
        except Exception as exc:  # these requests' failure, not the running batch's
            for answer in arriving:
                answer.deliver(exc)
            return []
        return [
            (a, cache, j) for j, a in enumerate(arriving) if not a.take(a.pick(logits[j : j + 1]))
        ]


class _Answer:
    """One request on its way: the tokens it has taken, as text delivered piece by piece
    (held back where a stop string could still begin), its sampling and its timings."""

    def __init__(self, loaded: Any, request: Request, deliver: Deliver, queued_s: float):
        from ladder.chat import Holdback
        from levels.tokenizer import StreamDecoder

        self.request, self.deliver, self.queued_s = request, deliver, queued_s
        self.stop_ids = loaded.stop_ids
        self.decoder, self.holdback = StreamDecoder(loaded.tokenizer), Holdback(list(request.stop))
        # The draws of the request alone (``stream``'s): one generator, seeded by its seed.
        self.sampling = Sampling(request.temperature, request.top_k, request.top_p, request.seed)
        self.generators = self.sampling.generators(1)
        self.count, self.start, self.first, self.last = 0, time.perf_counter(), None, None

    def pick(self, logits) -> int:
        """The next token from its logits ``(1, V)``, as the request alone would pick it."""
        return int(pick(logits, self.sampling, self.generators)[0])

    def take(self, token: int) -> bool:
        """Take the next token; -> whether the request is done (and then finished)."""
        self.count, self.last = self.count + 1, token
        self.first = self.first or time.perf_counter()
        if token in self.stop_ids:
            return self.finish("stop")
        piece = self.holdback.add(self.decoder.push(token))
        if piece:
            self.deliver(piece)
        if self.holdback.stopped:
            return self.finish("stop")
        if self.count >= self.request.max_tokens:
            return self.finish("length")
        if self.request.cancelled.is_set():
            return self.finish("cancelled")
        return False

    def finish(self, reason: str) -> bool:
        """The text held back (unless cancelled or cut at a stop string), then ``Finished``."""
        if reason != "cancelled" and self.count:
            rest = "" if self.holdback.stopped else self.holdback.add(self.decoder.flush())
            rest += self.holdback.finish()
            if rest:
                self.deliver(rest)
        end = time.perf_counter()
        first = self.first or end
        per_token = (end - first) / (self.count - 1) if self.count > 1 else 0.0
        self.deliver(
            Finished(reason, len(self.request.ids), self.count, self.queued_s,
                     first - self.start, per_token)
        )  # fmt: skip
        return True
