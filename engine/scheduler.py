"""The scheduler: which sequences run, and what each pass of a turn feeds.

Over a level's own cache a batch forms when the last has ended: up to ``max_batch``
waiting sequences, a row each until every row has ended. Over a paged cache, sequences
join whenever the batch has a place and the pool the blocks (continuous batching), each
holding the published blocks its tokens begin with (prefix caching). A turn admits, then:

* **prefill**: what is not cached before the last token taken (a prompt, or what a
  preempted sequence had): a fixed batch's prompts in one padded pass; a paged batch's, at
  most ``prefill_tokens`` a turn, a sequence a pass, oldest first (chunked prefill);
* **decode**: every sequence with a token to feed feeds it, and its guesses, in one pass.

When the pool lacks blocks for a pass, the newest running sequences are preempted: their
blocks go back and they wait first in line, to compute again what they had.
"""

from __future__ import annotations

from collections import deque

from .request import Sequence


class Scheduler:
    """``waiting`` in line, ``running`` in order of arrival, over ``kv`` (``runner.py``)."""

    def __init__(self, kv, *, max_batch: int, prefill_tokens: int):
        self.kv, self.max_batch, self.prefill_tokens = kv, max_batch, prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preempted = 0
        self.said: list[str] = []  # what this turn did (the engine's trace)

    def admit(self) -> list[Sequence]:
        """Waiting sequences that join now (a fixed batch: a new one, once the last ended)."""
        if self.kv.fixed:
            if self.running or not self.waiting:
                return []
            n = min(self.max_batch, len(self.waiting))
            self.running = [self.waiting.popleft() for _ in range(n)]
            self.kv.open(self.running)
            return self.running
        joined = []
        while self.waiting and len(self.running) < self.max_batch:
            if not self.kv.admit(self.waiting[0]):
                break  # no room in the pool yet: it waits first in line
            joined.append(self.waiting.popleft())
            self.running.append(joined[-1])
        return joined

    def prefills(self) -> list[tuple[list[Sequence], list[int]]]:
        """This turn's prefill passes: ``(sequences, tokens each feeds)``."""
        active = [s for s in self.running if s.finish is None]
        if self.kv.fixed:  # the rows whose prompt is not through yet, together: a piece each
            piece = self.prefill_tokens or max(len(s.todo) for s in self.running)
            sizes = [0 if s.generated or s.finish else min(len(s.todo), piece) for s in self.running]  # fmt: skip
            return [(self.running, sizes)] if any(sizes) else []
        passes, budget = [], self.prefill_tokens
        for seq in active:
            if len(seq.todo) > 1 and budget > 0:
                n = min(len(seq.todo), budget)
                passes.append(([seq], [n]))
                budget -= n
        return passes

    def decoding(self) -> list[Sequence]:
        """This turn's decode pass: every running sequence with its next token to take (a
        fixed batch: every row, an ended one feeding nothing)."""
        if self.kv.fixed:
            started = self.running and all(s.generated or s.finish for s in self.running)
            return self.running if started and any(s.finish is None for s in self.running) else []
        return [s for s in self.running if s.finish is None and len(s.todo) == 1]

    def room(self, seqs: list[Sequence], adding: int) -> list[Sequence]:
        """Blocks for ``adding`` more positions of each of ``seqs``, preempting the newest
        running sequences while the pool has too few -> those of ``seqs`` still running."""
        if self.kv.fixed:
            return seqs
        pool = self.kv.pool
        while True:
            staying = [s for s in seqs if s in self.running]
            if not staying or pool.needed([s.blocks for s in staying], adding) <= pool.available:
                return staying
            self.preempt(self.running[-1])

    def preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks; it waits first in line."""
        self.said.append(f"r{seq.id} preempted")
        self.kv.release(seq)
        self.running.remove(seq)
        self.waiting.appendleft(seq)
        self.preempted += 1

    def leave(self, seq: Sequence) -> None:
        """An ended sequence leaves a paged batch, its blocks back in the pool; a fixed
        batch keeps its row until every row has ended, then lets its cache go."""
        if not self.kv.fixed:
            if seq in self.running:
                self.kv.release(seq)
                self.running.remove(seq)
        elif all(s.finish is not None for s in self.running):
            self.kv.close(self.running)
            self.running = []
