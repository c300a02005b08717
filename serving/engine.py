"""The engine: requests in, text out, several requests decoded together.

A request is a prompt's token ids with its own sampling settings and limits. Its
tokens are picked as ``stream`` picks them for it alone (``levels.common.generation``,
the loop ``ladder chat`` runs: the same sampling, its seed its own generator), turned
into text as they come (the tokenizer's stream decoder, holding back what could still
become a stop string) and handed to the request's consumer piece by piece. It ends at
the model's end-of-turn ids or a stop string (``finish_reason`` ``"stop"``), or at
``max_tokens`` (``"length"``).

One worker thread runs the model, so its arithmetic never blocks the server's event
loop. At levels 2 to 4, up to ``max_batch`` requests run together over one paged KV
cache (``levels.level2_torch_manual.paged``: a pool of blocks, a block table per
request). Each turn of the worker's loop:

1. **admits** waiting requests while fewer than ``max_batch`` run and the pool has
   blocks for the new one's prompt (continuous batching: requests join between steps,
   not when a batch ends). A prompt's first whole blocks that some earlier request
   computed are taken from the pool by reference (**prefix caching**; its usage counts
   them as ``cached_tokens``);
2. **prefills** what the admitted requests still have to compute, at most
   ``prefill_tokens`` positions a turn, oldest request first (**chunked prefill**: a
   long prompt is computed over several turns, and the running requests decode a token
   between its pieces instead of waiting for all of it). A request whose last prompt
   position is computed picks its first token from those logits;
3. **decodes** one token for every request that has one to take, in one step, reading
   the weights once for all of them (most of a step's cost at these sizes:
   docs/decoding.md). Each row keeps its own positions, so it decodes as it would alone.

Each pass calls the model's plain pass, ``model.transformer(ids, positions, cache)``,
with inputs made as a model runner makes them: the ids from the token lists the engine
holds and each sequence's positions from its count, as tensors on the model's device.
Nothing is checked per step (a request's tokens come from the tokenizer, and its length
is checked when it is submitted) and no id goes back to numpy between steps.

When the pool has no block for a step, the newest requests are **preempted**: their
blocks are freed and they wait first in line; admitted again, they compute their
prompt and the tokens they had taken (a prefix-cache hit, mostly) and go on where they
stopped, with the same generator, so their text is the text they would have had.
A finished request's blocks go back to the pool; its full blocks stay findable by their
tokens until the pool needs them.

Where a model has no torch cache (levels 0 and 1), or with ``max_batch`` 1, the
requests are decoded one at a time, each through the model's ``stream``.

Requests wait in a queue of at most ``max_queue`` (a full queue refuses a new one:
``QueueFull``, the server's 429). A request whose client went away is cancelled: it
stops before its next token (or is skipped if it has not started). Each request reports
its usage (prompt, cached and completion tokens) and its timings: the wait in the
queue, the time to its first token, and the time per output token after it.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
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
    constraint: Any = None  # its own constrained.Constraint: the logits masked before its pick
    draft: Any = None  # speculative decoding: what guesses its tokens (levels.common.speculative)
    draft_tokens: int = 2  # at most this many guesses a step

    def cancel(self) -> None:
        """Stop it before its next token (or before it starts)."""
        self.cancelled.set()


@dataclass(frozen=True)
class Finished:
    """How a request ended: ``finish_reason`` (``"stop"``, ``"length"`` or
    ``"cancelled"``), its tokens (the prompt's, those of them cached, the completion's),
    and its timings in seconds."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens whose keys and values came from the prefix cache
    queued_s: float
    first_token_s: float  # from the start of its turn to its first token (the prefill)
    per_token_s: float  # the mean time per token after the first (0 with one token)
    drafted_tokens: int = 0  # speculative decoding: the guesses its draft made
    accepted_tokens: int = 0  # and those the model kept


# What a consumer receives, in order: zero or more str (the text, piece by piece), then
# one Finished, or one Exception (the request failed; the engine goes on).
Event = str | Finished | Exception
Deliver = Callable[[Event], None]


PREFILL_TOKENS = 256  # prompt positions computed per turn, at most: a long prompt's piece


class Engine:
    """Decodes the requests given to ``submit`` on a worker thread: up to ``max_batch`` at
    once over a paged KV cache where the model's arrays are torch's (levels 2 to 4), else
    one at a time.

    ``loaded`` is ``ladder.chat.Loaded`` (the model, its level, its tokenizer and end-of-turn
    ids); ``limit`` is entered on the worker thread (the CPU threads torch and BLAS use).
    The pool holds ``blocks`` blocks of ``block_size`` positions (default: the whole
    context for each of ``max_batch`` requests, so that only a smaller pool preempts);
    ``prefix_cache`` False computes every prompt whole. ``start`` False leaves the worker
    thread unstarted: the caller runs the batching loop a turn at a time (``turn``).
    """

    def __init__(
        self,
        loaded: Any,
        *,
        max_queue: int = 16,
        max_batch: int = 1,
        blocks: int | None = None,
        block_size: int | None = None,
        prefill_tokens: int = PREFILL_TOKENS,
        prefix_cache: bool = True,
        limit=None,
        start: bool = True,
    ):
        self.loaded, self.max_queue, self.prefix_cache = loaded, max_queue, prefix_cache
        self.max_batch = max_batch if hasattr(loaded.model, "kernels") else 1
        self.prefill_tokens = prefill_tokens
        self.pool = self._pool(blocks, block_size) if self.max_batch > 1 else None
        self._waiting: queue.Queue = queue.Queue()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._queued = 0
        self._limit = limit
        # What the batching did, counted: decode steps and the rows they decoded, prefill
        # passes and the positions they computed, requests preempted.
        self.steps = self.rows = self.prefills = self.computed = self.preempted = 0
        self._batch = _Batch(self) if self.max_batch > 1 else None
        self._worker = threading.Thread(target=self._run, name="ladder-engine", daemon=True)
        if start:
            self._worker.start()

    def turn(self) -> str:
        """One turn of the batching loop on the caller's thread, for an engine made with
        ``start=False`` (a trace to read, a test to step) -> what it did, one line."""
        if self._worker.is_alive() or self._batch is None:
            raise RuntimeError("turn() steps a batching engine made with start=False")
        return self._batch.turn(block=False)

    def _pool(self, blocks: int | None, block_size: int | None):
        from levels.level2_torch_manual.paged import BLOCK_SIZE, BlockPool

        model, size = self.loaded.model, block_size or BLOCK_SIZE
        blocks = blocks or self.max_batch * -(-model.config.max_seq_len // size)
        return BlockPool(
            model.config, blocks, block_size=size, device=model.device, dtype=model.dtype
        )

    @property
    def context(self) -> int:
        """The tokens a request's prompt and completion may fill together: the model's
        context, or the pool's positions where that is less."""
        context = int(self.loaded.model.config.max_seq_len)
        if self.pool is not None:
            context = min(context, self.pool.blocks * self.pool.block_size)
        return context

    def submit(self, request: Request, deliver: Deliver) -> Request:
        """Queue ``request``; ``deliver`` receives its events on the worker thread.
        ``ValueError`` when it would not fit in ``context``, ``QueueFull`` when ``max_queue``
        requests wait already."""
        if len(request.ids) + request.max_tokens > self.context:
            raise ValueError(
                f"the prompt's {len(request.ids)} tokens and {request.max_tokens} new ones "
                f"exceed the context of {self.context} tokens"
            )
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
            if self._batch is not None:
                self._batch.run()
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
            constraint=request.constraint,
            **answer.speculation(),
        )
        for token in tokens:
            if answer.take(token):
                return None
        return answer.finish("length")  # the stream ended without a reason (not reached)


class _Batch:
    """The batching loop of an ``Engine`` (the module's docstring: admit, prefill, decode).

    ``active`` holds the admitted requests in the order they came; each has a ``Sequence``
    in the pool and ``todo``, the tokens it has taken that the cache has not: more than one
    while its prompt is being computed, then one, the token it took last.
    """

    def __init__(self, engine: Engine):
        self.engine, self.pool, self.model = engine, engine.pool, engine.loaded.model
        # The level's paged cache over the pool (level 4's attends through the block table).
        self.cache = partial(self.model.kernels.paged_kv_cache, self.pool, config=self.model.config)
        self.active: list[_Answer] = []
        self.resumed: collections.deque[_Answer] = collections.deque()  # preempted ones, first
        self.turns, self.said = 0, []  # what the current turn did, for ``Engine.turn``'s trace

    def run(self) -> None:
        while True:
            self.turn(block=True)

    def turn(self, block: bool) -> str:
        """One turn: admit, prefill, decode -> what it did, one line (empty if nothing).
        ``block``: wait for a request when none is running."""
        import torch

        self.said = []
        self._admit(block)
        with torch.no_grad():
            self._prefill([a for a in self.active if len(a.todo) > 1])
            self._decode([a for a in self.active if len(a.todo) == 1])
        if not self.said:
            return ""
        self.turns += 1
        return f"turn {self.turns}: " + "; ".join(self.said)

    def _say(self, what: str) -> None:
        self.said.append(what)

    def _admit(self, block: bool) -> None:
        """Waiting requests join while there is room in the batch and in the pool."""
        engine = self.engine
        while len(self.active) < engine.max_batch:
            answer = self.resumed.popleft() if self.resumed else engine._next(block=False)
            if answer is None and not self.active and block:
                answer = engine._next(block=True)  # nothing to do until a request comes
            if answer is None:
                return
            if answer.request.cancelled.is_set():
                answer.finish("cancelled")
                continue
            history = answer.history
            # Whole blocks of the prompt found in the pool; the last token always computed,
            # since its logits pick the next one.
            matched = self.pool.match(history[:-1] if engine.prefix_cache else [])
            if self.pool.needed([matched], len(history) - matched.count) > self.pool.available:
                self.pool.free(matched)  # no room yet: it waits first in line
                self.resumed.appendleft(answer)
                return
            answer.admit(matched)
            self.active.append(answer)
            found = f", {matched.count} found cached" if matched.count else ""
            self._say(f"{answer.name} joins ({len(history)} tokens{found})")

    def _prefill(self, prefilling: list[_Answer]) -> None:
        """At most ``prefill_tokens`` positions of the prompts still to compute, oldest first,
        one request a pass (no padding); a request whose prompt is done takes a token."""
        budget = self.engine.prefill_tokens
        for answer in prefilling:
            if budget <= 0:
                return
            if answer not in self.active:  # preempted for an older one's blocks
                continue
            if answer.request.cancelled.is_set():
                self._finish(answer, "cancelled")
                continue
            n = min(len(answer.todo), budget)
            if not self._room([answer], n):
                continue
            ids, positions = self._inputs([answer.todo[:n]], [answer.seq.count], n)  # (1,n) each
            pass_ = partial(self.model.transformer, ids, positions, last=True)  # (1,1,V)
            logits = self._pass([answer], pass_)
            if logits is None:
                continue
            self._publish([answer])
            logits = logits[:, -1]  # (1,V)
            budget -= n
            self.engine.prefills += 1
            self.engine.computed += n
            self._say(f"prefill {answer.name} {n}")
            if not answer.todo:  # the prompt's last position: its logits pick a token
                self._take(answer, logits[0:1])

    def _decode(self, decoding: list[_Answer]) -> None:
        """One step for every request that has a token to take: its token, and the guesses of
        its draft where it speculates, all in one pass that reads the weights once."""
        decoding = [a for a in decoding if not self._cancelled(a)]
        guesses = {a: a.guess() for a in decoding}  # ([], None) without a draft
        T = 1 + max((len(g[0]) for g in guesses.values()), default=0)
        if not decoding or not self._room(decoding, T):
            return
        decoding = [a for a in decoding if a in self.active]  # some may have been preempted
        fed = [[a.todo[0], *guesses[a][0]] for a in decoding]
        ids, positions = self._inputs(fed, [a.seq.count for a in decoding], T)
        starts = [a.seq.count for a in decoding]
        logits = self._pass(decoding, partial(self.model.transformer, ids, positions))  # (B,T,V)
        if logits is None:
            return
        self.engine.steps += 1
        self.engine.rows += len(decoding)
        self._say("decode " + " ".join(a.name for a in decoding))
        for i, answer in enumerate(decoding):
            tokens, q = guesses[answer]
            if not tokens:
                self.pool.trim(answer.seq)  # blocks taken for a longer row's guesses go back
                self._take(answer, logits[i, :1])
                continue
            n, last = answer.verify(logits[i, : len(tokens) + 1], tokens, q)
            answer.seq.count = starts[i] + 1 + n  # its token and the guesses kept
            self.pool.trim(answer.seq)  # the blocks of the guesses it did not keep go back
            for token in [*tokens[:n], last]:
                if answer.take(token):
                    self._say(f"{answer.name} done ({answer.reason}, {answer.count} tokens)")
                    self._drop(answer)
                    break
        self._publish(decoding)

    def _pass(self, answers: list[_Answer], step: Callable) -> Any:
        """``step(cache=)`` over the answers' sequences -> its logits ``(B,T,V)`` as numpy, or None
        (failed: each of them told and finished)."""
        try:
            logits = step(cache=self.cache([a.seq for a in answers]))  # (B,T,V)
            logits = self.engine.loaded.level.to_numpy(logits)
        except Exception as exc:  # these requests' failure, not the engine's
            for answer in answers:
                answer.deliver(exc)
                self._drop(answer)
            return None
        return logits

    def _publish(self, answers: list[_Answer]) -> None:
        """The full blocks the answers still running filled, filed for later prompts."""
        if self.engine.prefix_cache:
            for answer in answers:
                if answer in self.active:
                    self.pool.publish(answer.seq, answer.history)

    def _room(self, answers: list[_Answer], adding: int) -> bool:
        """Blocks for ``adding`` more positions of each of ``answers``, preempting the newest
        active requests while the pool has too few; -> whether any of them is left."""
        while True:
            staying = [a for a in answers if a in self.active]
            if not staying:
                return False
            if self.pool.needed([a.seq for a in staying], adding) <= self.pool.available:
                return True
            self._preempt(self.active[-1])

    def _preempt(self, answer: _Answer) -> None:
        """Free the blocks of ``answer``; it waits first in line, to compute again what it had."""
        self._say(f"{answer.name} preempted")
        self.pool.free(answer.seq)
        self.active.remove(answer)
        self.resumed.appendleft(answer)
        self.engine.preempted += 1

    def _take(self, answer: _Answer, logits) -> None:
        try:
            token = answer.pick(logits)
        except ValueError as exc:  # its constraint allows no token: its failure alone
            answer.deliver(exc)
            return self._drop(answer)
        if answer.take(token):
            self._say(f"{answer.name} done ({answer.reason}, {answer.count} tokens)")
            self._drop(answer)

    def _cancelled(self, answer: _Answer) -> bool:
        if answer.request.cancelled.is_set():
            self._finish(answer, "cancelled")
            return True
        return False

    def _finish(self, answer: _Answer, reason: str) -> None:
        answer.finish(reason)
        self._say(f"{answer.name} done ({reason}, {answer.count} tokens)")
        self._drop(answer)

    def _drop(self, answer: _Answer) -> None:
        """``answer`` leaves the batch; its blocks go back to the pool."""
        self.pool.free(answer.seq)
        self.active.remove(answer)

    def _inputs(self, ids: list[list[int]], starts: list[int], T: int) -> tuple[Any, Any]:
        """The plain pass's inputs, as a model runner makes them: ``ids (B,T)`` from the token
        lists the engine holds, and their positions, row ``b`` from ``starts[b]`` on (a
        sequence's count: its slots are its positions), a short row padded at position -1,
        made on the model's device."""
        import torch

        pad, device = self.model.config.pad_id, self.model.device
        rows = [row + [pad] * (T - len(row)) for row in ids]  # (B,T)
        positions = [[start + t if t < len(row) else -1 for t in range(T)]
                     for start, row in zip(starts, ids, strict=True)]  # fmt: skip
        return torch.tensor(rows, device=device), torch.tensor(positions, device=device)


class _Answer:
    """One request on its way: the tokens it has taken, as text delivered piece by piece
    (held back where a stop string could still begin), its sampling and its timings."""

    def __init__(self, loaded: Any, request: Request, deliver: Deliver, queued_s: float):
        from levels.tokenizer import Holdback, StreamDecoder

        self.request, self.deliver, self.queued_s = request, deliver, queued_s
        self.stop_ids = loaded.stop_ids
        self.decoder, self.holdback = StreamDecoder(loaded.tokenizer), Holdback(list(request.stop))
        # The draws of the request alone (``stream``'s): one generator, seeded by its seed.
        self.sampling = Sampling(request.temperature, request.top_k, request.top_p, request.seed)
        self.generators = self.sampling.generators(1)
        self.count, self.start, self.first, self.last = 0, time.perf_counter(), None, None
        self.name = f"r{request.id}"
        self.reason: str | None = None  # its finish_reason, once finished
        self.generated: list[int] = []
        self.seq = None  # its place in the engine's pool while admitted (``Sequence``)
        self.cached: int | None = None  # prompt tokens found in the pool when first admitted
        self.counts = _counts()  # what its draft guessed and the model kept
        start = getattr(request.draft, "open", None)  # a model draft's row for it, its seed
        if start is not None:
            start(request.id, request.seed)

    @property
    def history(self) -> list[int]:
        """Its prompt and the tokens it has taken."""
        return self.request.ids + self.generated

    @property
    def todo(self) -> list[int]:
        """What its cache has not computed yet: the prompt's rest, then the token taken last."""
        return self.history[self.seq.count :]

    def admit(self, seq) -> None:
        """It runs, in ``seq`` (its prefix already there, found in the pool)."""
        self.seq = seq
        if self.cached is None:
            self.cached = seq.count

    def speculation(self) -> dict:
        """Its draft, as ``stream`` takes it (nothing without one)."""
        request = self.request
        if request.draft is None:
            return {}
        return {"draft": request.draft, "draft_tokens": request.draft_tokens, "counts": self.counts}

    def guess(self) -> tuple[list[int], Any]:
        """Its draft's guesses of its next tokens after the one it took last, ``(tokens,
        q_rows)``: as many as ``draft_tokens`` and what it may still take allow, none without
        a draft."""
        request = self.request
        room = min(request.draft_tokens, request.max_tokens - self.count - 1)
        if request.draft is None or room < 1:
            return [], None
        return request.draft.propose(self.history, room, row=request.id, sampling=self.sampling)

    def verify(self, logits, tokens: list[int], q_rows) -> tuple[int, int]:
        """``levels.common.speculative.verify`` of its guesses ``tokens`` against ``logits
        (n + 1, V)``, under its constraint and with its own generator -> ``(kept, next token)``;
        the constraint takes the tokens it emits."""
        from levels.common import speculative
        from levels.common.sampling import distribution

        constraint = self.request.constraint
        rows = logits if constraint is None else speculative.masked(logits, tokens, constraint)
        rng = None if self.sampling.greedy else self.generators[0]
        n, last = speculative.verify(distribution(rows, self.sampling), q_rows, tokens, rng)
        self.counts.passes += 1
        self.counts.drafted, self.counts.accepted = (
            self.counts.drafted + len(tokens),
            self.counts.accepted + n,
        )
        for token in [*tokens[:n], last] if constraint is not None else ():
            constraint.advance(token)
        return n, last

    def pick(self, logits) -> int:
        """The next token from its logits ``(1, V)``, as the request alone would pick it
        (under its constraint, which then takes the token)."""
        constraint = self.request.constraint
        if constraint is not None:
            logits = constraint.apply(logits)
        token = int(pick(logits, self.sampling, self.generators)[0])
        if constraint is not None:
            constraint.advance(token)
        return token

    def take(self, token: int) -> bool:
        """Take the next token; -> whether the request is done (and then finished)."""
        self.count, self.last = self.count + 1, token
        self.generated.append(token)
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
        self.reason = reason
        if reason != "cancelled" and self.count:
            rest = "" if self.holdback.stopped else self.holdback.add(self.decoder.flush())
            rest += self.holdback.finish()
            if rest:
                self.deliver(rest)
        end = time.perf_counter()
        first = self.first or end
        per_token = (end - first) / (self.count - 1) if self.count > 1 else 0.0
        forget = getattr(self.request.draft, "forget", None)  # a model draft's cache of it
        if forget is not None:
            forget(self.request.id)
        self.deliver(
            Finished(reason, len(self.request.ids), self.count, self.cached or 0, self.queued_s,
                     first - self.start, per_token, self.counts.drafted, self.counts.accepted)
        )  # fmt: skip
        return True


def _counts():
    from levels.common.speculative import Counts

    return Counts()
