"""The engine on a worker thread, with a queue in front: what ``ladder serve`` answers from.

The HTTP handlers (``api.py``) turn a request into a ``Completion`` and ``submit`` it with a
``deliver`` callback; the worker thread moves it into the engine (``engine.Engine``) between
turns, steps the engine, and hands each completion's events to its callback as they come:
its text, piece by piece (held back where a stop string could still begin) with the
log-probabilities of the tokens taken since the last (``Piece``), then one ``Finished``
(or one ``Exception``: it failed, the others go on). The model's arithmetic
never blocks the server's event loop.

At levels 2 to 4 with ``max_batch`` above one, the engine batches over a paged KV cache
(continuous batching, prefix caching, chunked prefill, preemption: engine/scheduler.py);
otherwise (levels 0 and 1, or ``max_batch`` 1) it decodes one completion at a time over
the level's own cache (level 3's compiled step among them).

Completions wait in a queue of at most ``max_queue`` (a full queue refuses a new one:
``QueueFull``, the server's 429). A completion whose client went away is cancelled: it
stops before its next token. Each reports its usage (prompt, cached and completion
tokens) and its timings: the wait in the queue, the time to its first token, and the
time per output token after it.
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

from engine import Engine, Request, Sequence
from levels.common.sampling import Sampling


class QueueFull(RuntimeError):
    """The worker holds ``max_queue`` waiting completions already."""


@dataclass
class Completion:
    """One completion asked for: ``ids``, the prompt's tokens, then at most ``max_tokens``,
    sampled as OpenAI's API says (``temperature`` 1 by default), ending at the model's
    end-of-turn ids or a ``stop`` string; ``constraint``, ``draft``, ``draft_tokens``,
    ``logprobs`` and ``echo`` as ``engine.Request``'s, the penalties and ``logit_bias`` as
    ``Sampling``'s. ``after``: another completion of the same prompt (a choice of ``n``),
    which this one joins the engine behind once it has its first token, so that the
    prompt's blocks it computed are found in the prefix cache, not computed again."""

    ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    id: str = ""
    cancelled: threading.Event = field(default_factory=threading.Event)
    constraint: Any = None
    draft: Any = None
    draft_tokens: int | None = None  # None: paced (levels.common.speculative.PACED at most)
    logprobs: int | None = None
    echo: bool = False
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    after: Completion | None = None

    def cancel(self) -> None:
        """Stop it before its next token (or before it starts)."""
        self.cancelled.set()


@dataclass(frozen=True)
class Finished:
    """How a completion ended: ``finish_reason`` (``"stop"``, ``"length"`` or
    ``"cancelled"``), its tokens (the prompt's, those of them cached, the completion's),
    its timings in seconds, and its draft's guesses and those kept."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose keys and values came from the prefix cache
    queued_s: float
    first_token_s: float  # from the start of its turn to its first token (the prefill)
    per_token_s: float  # the mean time per token after the first (0 with one token)
    drafted_tokens: int = 0
    accepted_tokens: int = 0


@dataclass(frozen=True)
class Piece:
    """Text to show, and the ``Logprob``s (``levels.common.logprobs``) of the tokens taken
    since the last piece (none unless asked); the first piece of an ``echo`` completion
    has its prompt's too, ``prompt`` (the first None)."""

    text: str
    logprobs: tuple = ()
    prompt: tuple | None = None


# What a consumer receives, in order: zero or more Piece, then one Finished, or one
# Exception (the completion failed; the worker goes on).
Event = Piece | Finished | Exception
Deliver = Callable[[Event], None]


@dataclass
class _Job:
    """A completion on its way: its callback, its sequence in the engine, its clock."""

    completion: Completion
    deliver: Deliver
    submitted: float
    seq: Sequence | None = None
    started: float = 0.0
    first: float | None = None
    sent: int = 0  # the Logprobs delivered so far
    echoed: bool = False  # the prompt's Logprobs delivered


class Worker:
    """Decodes the completions given to ``submit`` on a worker thread, over ``loaded`` (the
    model, its tokenizer and end-of-turn ids: ``loading.Loaded``). ``max_batch``, ``blocks``,
    ``block_size``, ``prefill_tokens`` and ``prefix_cache`` as ``engine.Engine``'s; ``limit``
    is entered on the worker thread (the CPU threads torch and BLAS use). ``start`` False
    leaves the thread unstarted: the caller steps the engine a turn at a time (``turn``)."""

    def __init__(self, loaded: Any, *, max_queue: int = 16, max_batch: int = 1, blocks=None,
                 block_size=None, prefill_tokens=None, prefix_cache: bool = True, limit=None,
                 start: bool = True):  # fmt: skip
        self.loaded, self.max_queue, self._limit = loaded, max_queue, limit
        paged = max_batch > 1 and hasattr(loaded.model, "kernels")
        self.max_batch = max_batch if paged else 1
        options = {} if prefill_tokens is None else {"prefill_tokens": prefill_tokens}
        self.engine = Engine(loaded.model, cache="paged" if paged else "level",
                             max_batch=self.max_batch, blocks=blocks, block_size=block_size,
                             prefix_cache=prefix_cache, isolate=True, **options)  # fmt: skip
        self._incoming: queue.Queue[_Job] = queue.Queue()
        self._jobs: dict[Sequence, _Job] = {}
        self._held: list[_Job] = []  # choices waiting for the first of their prompt
        self._choices: dict[int, _Job] = {}  # id(completion) -> job, for ``after``
        self._lock, self._queued, self._ids = threading.Lock(), 0, itertools.count(1)
        self.turns = 0
        self._thread = threading.Thread(target=self._run, name="ladder-engine", daemon=True)
        if start:
            self._thread.start()

    @property
    def pool(self):
        return self.engine.pool

    @property
    def context(self) -> int:
        """The tokens a prompt and its completion may fill together: the model's context, or
        the pool's positions where that is less."""
        context = int(self.loaded.model.config.max_seq_len)
        pool = self.engine.pool
        return context if pool is None else min(context, pool.blocks * pool.block_size)

    def submit(self, completion: Completion, deliver: Deliver) -> Completion:
        """Queue ``completion``; ``deliver`` receives its events on the worker thread.
        ``ValueError`` when it would not fit in ``context``, ``QueueFull`` when ``max_queue``
        completions wait already."""
        return self.submit_all([completion], [deliver])[0]

    def submit_all(self, completions: list[Completion], delivers: list[Deliver]) -> list:
        """Queue ``completions`` together (the choices of one request), or none of them:
        ``submit``'s errors, checked for all first."""
        for c in completions:
            if len(c.ids) + c.max_tokens > self.context:
                raise ValueError(f"the prompt's {len(c.ids)} tokens and {c.max_tokens} new ones exceed the context of {self.context} tokens")  # fmt: skip
        with self._lock:
            if self._queued + len(completions) > self.max_queue:
                raise QueueFull(f"{self._queued} requests are waiting; try again later")
            self._queued += len(completions)
        for completion, deliver in zip(completions, delivers, strict=True):
            completion.id = completion.id or f"{next(self._ids)}"
            self._incoming.put(_Job(completion, deliver, time.perf_counter()))
        return completions

    def turn(self) -> str:
        """One turn on the caller's thread, for a worker made with ``start=False`` (a trace to
        read, a test to step) -> what the engine did, one line (empty if nothing)."""
        if self._thread.is_alive():
            raise RuntimeError("turn() steps a worker made with start=False")
        return self._turn(block=False)

    def _run(self) -> None:
        with self._limit() if self._limit is not None else contextlib.nullcontext():
            while True:
                self._turn(block=True)

    def _turn(self, block: bool) -> str:
        """Take the completions submitted since the last turn, step the engine, deliver."""
        self._take(block and not self.engine.busy)
        for job in list(self._jobs.values()):
            if job.completion.cancelled.is_set():
                self.engine.abort(job.seq)
                self._finish(job)
        for seq in self.engine.step():
            job = self._jobs.get(seq)
            if job is not None:
                self._deliver(job)
        said = self.engine.said
        if not said:
            return ""
        self.turns += 1
        return f"turn {self.turns}: " + "; ".join(said)

    def _take(self, block: bool) -> None:
        """The completions submitted since the last turn, into the engine (waiting for one
        when ``block`` and the engine is idle), each behind the choice it comes after."""
        held, self._held = self._held, []
        while True:
            try:
                job = self._incoming.get(block=block and not held)
            except queue.Empty:
                break
            block = False
            with self._lock:
                self._queued -= 1
            held.append(job)
        for job in held:
            first = self._choices.get(id(job.completion.after))
            if first is not None and (first.seq is None or not (first.seq.generated or first.seq.finish)):  # fmt: skip
                self._held.append(job)
                continue
            job.started = time.perf_counter()
            job.seq = self.engine.add(self._request(job.completion))
            self._jobs[job.seq] = job
            self._choices[id(job.completion)] = job
            if job.seq.finish is not None:  # nothing to compute (an echo of one token)
                self._deliver(job)

    def _request(self, c: Completion) -> Request:
        from levels.tokenizer import Text

        loaded = self.loaded
        sampling = Sampling(c.temperature, c.top_k, c.top_p, c.seed, c.frequency_penalty,
                            c.presence_penalty, c.logit_bias)  # fmt: skip
        return Request(c.ids, c.max_tokens, sampling, tuple(loaded.stop_ids),
                       Text(loaded.tokenizer, c.stop), c.constraint, c.draft, c.draft_tokens,
                       logprobs=c.logprobs, echo=c.echo)  # fmt: skip

    def _deliver(self, job: _Job) -> None:
        """What the last turn did for ``job``: its text, then how it ended."""
        seq = job.seq
        if seq.new and job.first is None:
            job.first = time.perf_counter()
        logprobs, job.sent = tuple(seq.logprobs[job.sent :]), len(seq.logprobs)
        prompt = None
        if seq.scored is not None and not seq.scoring and not job.echoed:
            prompt, job.echoed = tuple(seq.scored), True
        if seq.piece or logprobs or prompt is not None:
            job.deliver(Piece(seq.piece, logprobs, prompt))
        if seq.finish is not None:
            self._finish(job)

    def _finish(self, job: _Job) -> None:
        self._jobs.pop(job.seq, None)
        self._choices.pop(id(job.completion), None)
        seq = job.seq
        if seq.finish == "error":
            return job.deliver(seq.error)
        end = time.perf_counter()
        first, n = job.first or end, len(seq.generated)
        per_token = (end - first) / (n - 1) if n > 1 else 0.0
        job.deliver(
            Finished(seq.finish, seq.prompt, n, seq.found or 0, job.started - job.submitted,
                     first - job.started, per_token, seq.counts.drafted, seq.counts.accepted)
        )  # fmt: skip
