"""The engine: requests in, tokens out, a turn at a time.

``add`` a request (it waits in line), then ``step``: the scheduler admits what fits; each
pass of the turn makes the guesses of every sequence that drafts, the runner's pass over
what each feeds, the step for each that has a token to take, and the cache keeps what each
kept. ``generate`` runs requests to their end. Every decode of the ladder comes through here.
"""

from __future__ import annotations

import itertools
import time

from levels.common.speculative import Counts, Pace

from .request import Request, Sequence
from .runner import LevelCache, NoCache, PagedCache, Runner
from .scheduler import Scheduler
from .step import advance, score

PREFILL_TOKENS = 256  # prompt positions computed per turn, at most: a long prompt's piece


class Engine:
    """Decodes ``model``'s requests over a cache: ``"level"`` (its own, a fixed batch of up
    to ``max_batch`` rows), ``"paged"`` (``blocks`` blocks of ``block_size`` positions:
    continuous batching, ``prefix_cache``, chunked prefill of ``prefill_tokens`` a turn) or
    ``"none"``; a level's cache takes its prompts whole, or ``prefill_tokens`` a pass where
    given. ``isolate``: a failing pass or step ends its sequences (``finish`` ``"error"``), not
    the engine. ``counts`` adds up every draft's guesses and the passes."""

    def __init__(self, model, *, cache: str = "level", max_batch: int = 1, blocks=None,
                 block_size=None, prefill_tokens: int | None = None, prefix_cache: bool = True,
                 isolate: bool = False, counts: Counts | None = None):  # fmt: skip
        self.runner, self.isolate = Runner(model), isolate
        if cache == "paged":
            self.kv = PagedCache(model, max_batch, blocks, block_size, prefix_cache)
            prefill_tokens = prefill_tokens or PREFILL_TOKENS
        else:
            self.kv = {"level": LevelCache, "none": NoCache}[cache](model)
        self.scheduler = Scheduler(self.kv, max_batch=max_batch, prefill_tokens=prefill_tokens)
        self.counts = Counts() if counts is None else counts
        # Decode passes and the rows they decoded, prefill passes and the positions computed.
        self.steps = self.rows = self.prefills = self.computed = 0
        self.said: list[str] = []  # what the last turn did, a line a thing
        self._ids, self._memory = itertools.count(), None
        self.pace = Pace()  # when guessing pays, for the requests whose draft_tokens is None

    pool = property(lambda self: getattr(self.kv, "pool", None))
    preempted = property(lambda self: self.scheduler.preempted)
    busy = property(lambda self: bool(self.scheduler.running or self.scheduler.waiting))

    def add(self, request: Request) -> Sequence:
        """Queue ``request`` -> its sequence (ended at once if it asks for no token)."""
        seq = Sequence(request, next(self._ids))
        start = getattr(request.draft, "open", None)  # a model draft's row, seeded as it is
        if start is not None:
            start(seq.id, request.sampling.seed)
        if request.max_tokens < 1 and not seq.scoring:  # (scoring a prompt is a pass)
            seq.end("length")
        else:
            self.scheduler.waiting.append(seq)
        return seq

    def abort(self, seq: Sequence, reason: str = "cancelled") -> None:
        """End ``seq`` before its next token, waiting or running."""
        if seq.finish is None:
            seq.end(reason)
            if seq in self.scheduler.waiting:
                self.scheduler.waiting.remove(seq)
            self._leave(seq)

    def generate(self, requests: list[Request]) -> list[Sequence]:
        """Every request to its end -> their sequences, in order."""
        seqs = [self.add(r) for r in requests]
        while any(s.finish is None for s in seqs):
            self.step()
            if not self.said:  # nothing joined, ran or ended, and nothing else will
                raise RuntimeError(f"the engine is stuck with {len(self.scheduler.waiting)} waiting")  # fmt: skip
        return seqs

    def step(self) -> list[Sequence]:
        """One turn: admit, prefill, decode -> the sequences that took tokens or ended."""
        self.said = self.scheduler.said = []
        touched: dict[Sequence, None] = {}
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:  # a preempted one too
            seq.new, seq.piece = [], ""
        for seq in self.scheduler.admit():
            found = f", {seq.cached} found cached" if seq.cached else ""
            self.said.append(f"r{seq.id} joins ({len(seq.tokens)} tokens{found})")
        for seqs, sizes in self.scheduler.prefills():
            self._pass(seqs, sizes, touched)
        decoding = self.scheduler.decoding()
        if decoding:
            self._pass(decoding, [len(s.todo) for s in decoding], touched, decode=True)
        return list(touched)

    def _pass(self, seqs: list[Sequence], sizes: list[int], touched: dict, *, decode=False):
        """One pass: each of ``seqs`` feeds ``sizes`` of its todo (an ended one, nothing) and,
        decoding, its draft's guesses; each that fed its whole todo takes tokens."""
        live = [s.finish is None and n > 0 for s, n in zip(seqs, sizes, strict=True)]
        paced = self._paced(seqs, live) if decode else 0
        guesses = [self._guess(s, paced) if decode and a else ([], None) for s, a in zip(seqs, live, strict=True)]  # fmt: skip
        drafting = [decode and a and s.request.draft is not None for s, a in zip(seqs, live, strict=True)]  # fmt: skip
        k = max((s.request.draft_tokens or paced for s, d in zip(seqs, drafting, strict=True) if d), default=0)  # fmt: skip
        T = max(n + len(g) if a else 0 for n, a, (g, _) in zip(sizes, live, guesses, strict=True))
        width = self.kv.width(T, k)
        if not self.kv.fixed:  # the blocks for it, preempting the newest where the pool lacks
            staying = self.scheduler.room(seqs, width)
            keep = [i for i, s in enumerate(seqs) if s in staying]
            seqs, sizes, live, guesses, drafting = ([x[i] for i in keep] for x in (seqs, sizes, live, guesses, drafting))  # fmt: skip
            if not seqs:
                return
        fed = [s.todo[:n] + g if a else [] for s, n, a, (g, _) in zip(seqs, sizes, live, guesses, strict=True)]  # fmt: skip
        if self.runner.seq2seq and self._memory is None:
            self._memory = self.runner.memory([s.request.source for s in seqs])
        last = not any(g for g, _ in guesses) and not any(s.scoring for s in seqs)
        try:
            cache = self.kv.cache(seqs, width)
            start = time.perf_counter()
            logits = self.runner.logits(fed, [s.cached for s in seqs], cache, width=width,
                                        last=last, memory=self._memory)  # fmt: skip
        except Exception as exc:
            return self._fail(seqs, exc)
        if decode:
            self.pace.passed(len(seqs), width, time.perf_counter() - start)
        self._count(seqs, sizes, live, drafting, decode)
        kept, ended = [], []
        for b, (seq, n, (tokens, q)) in enumerate(zip(seqs, sizes, guesses, strict=True)):
            if live[b] and seq.scoring:
                score(seq, logits[b, :n], seq.cached)
                touched[seq] = None
            if not live[b] or n < len(seq.todo) or seq.room < 1:  # ended, a piece, scored only
                if live[b] and n == len(seq.todo):
                    seq.end("length")
                    ended.append(seq)
                kept.append(None)
                continue
            at = 0 if last else n - 1  # the row after its last fed token, then each guess's
            try:
                taken = advance(seq, logits[b, at : at + len(tokens) + 1], tokens, q)
            except ValueError as exc:  # its constraint refused every token: its failure
                if not self.isolate:
                    raise
                seq.end("error", exc)
                taken = len(tokens)
            touched[seq] = None
            if tokens:
                self.counts.add(len(tokens), taken)
            kept.append(None if seq.finish or taken == len(tokens) else n + taken)
            if seq.finish is not None:
                ended.append(seq)
        self.kv.keep(seqs, [len(f) for f in fed], kept, width)
        for seq in ended:
            self._leave(seq)

    def _guess(self, seq: Sequence, paced: int):
        """Its draft's guesses after its last token: as many as ``draft_tokens`` (or the pace,
        where it has none) allows past what it feeds already, and it may still take."""
        request = seq.request
        room = min((request.draft_tokens or paced) + 1 - len(seq.todo), seq.room - 1)
        if request.draft is None or room < 1:
            return [], None
        start = time.perf_counter()
        tokens, q = request.draft.propose(seq.tokens, room, row=seq.id, sampling=request.sampling)
        if tokens and seq.counts.guessed:  # a first proposal feeds the draft the prompt too
            self.pace.guessed((time.perf_counter() - start) / len(tokens))
        return tokens, q

    def _paced(self, seqs, live) -> int:
        """This pass's guesses for the sequences whose draft is paced (``draft_tokens`` None),
        by their acceptance (``Pace.for_counts``). Greedy tokens never change with it."""
        paced = [s.counts for s, a in zip(seqs, live, strict=True) if a and s.request.draft and s.request.draft_tokens is None]  # fmt: skip
        return self.pace.for_counts(paced, sum(live) - len(paced), lambda k: self.kv.width(1 + k, k) if k else 1)  # fmt: skip

    def _count(self, seqs, sizes, live, drafting, decode: bool) -> None:
        """The pass counted and said: decode passes and their rows, prefill passes and their
        positions, the passes that checked guesses."""
        names = " ".join(f"r{s.id}" for s, a in zip(seqs, live, strict=True) if a)
        if decode:
            self.steps, self.rows = self.steps + 1, self.rows + sum(live)
            self.said.append(f"decode {names}")
        else:
            self.prefills, self.computed = self.prefills + 1, self.computed + sum(sizes)
            self.said.append(f"prefill {names} {sum(sizes)}")
        self.counts.passes += any(drafting)
        for seq, d in zip(seqs, drafting, strict=True):
            seq.counts.passes += d

    def _fail(self, seqs: list[Sequence], exc: Exception) -> None:
        if not self.isolate:
            raise exc
        for seq in seqs:
            seq.end("error", exc)
            self._leave(seq)

    def _leave(self, seq: Sequence) -> None:
        """An ended sequence: its blocks back, its draft's row let go."""
        if seq.finish != "cancelled":
            self.said.append(f"r{seq.id} done ({seq.finish}, {len(seq.generated)} tokens)")
        self.scheduler.leave(seq)
        forget = getattr(seq.request.draft, "forget", None)
        if forget is not None:
            forget(seq.id)
