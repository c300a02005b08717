"""A request, and its state while it decodes.

``Request`` is what a caller asks for: a prompt's ids, how many tokens at most, how to
choose them (``Sampling`` and the generator its draws come from), what ends it (stop ids,
a stop string in its ``text``), and the parts a feature adds to it: a constraint on its
language, a draft that guesses its next tokens, a seq2seq model's ``source``.

``Sequence`` is one request on its way. It keeps its tokens and ``cached``, how many of
them the cache holds; what the next pass must feed (``todo``) and where (a token's
position is its index) are derived from those two, never stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from levels.common.sampling import Sampling
from levels.common.speculative import estimate_acceptance

from .protocols import Constraint, Draft, Text


@dataclass
class Counts:
    """What speculation did: target passes, tokens guessed and kept, in all and for each
    pass (``guessed``, ``kept``: what ``estimate_acceptance`` reads)."""

    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    guessed: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)

    def add(self, guessed: int, kept: int) -> None:
        self.drafted, self.accepted = self.drafted + guessed, self.accepted + kept
        self.guessed.append(guessed)
        self.kept.append(kept)

    @property
    def acceptance(self) -> float:
        """``a``: the share of the tested guesses that were kept (NaN when none was tested)."""
        return estimate_acceptance(self.kept, self.guessed)


@dataclass
class Request:
    """A prompt ``ids`` and at most ``max_tokens`` new tokens, chosen by ``sampling`` (its
    draws from a generator seeded by ``sampling.seed``, or fresh entropy). It ends after a
    token of ``stop_ids``, or when its ``text`` (output processing: ids to text, stop
    strings) says it stopped. ``constraint`` masks the logits before each choice; ``draft``
    guesses up to ``draft_tokens`` tokens a pass. ``source``: a seq2seq model's source ids
    (its prompt is then the target's start, BOS)."""

    ids: list[int]
    max_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    stop_ids: tuple[int, ...] = ()
    text: Text | None = None
    constraint: Constraint | None = None
    draft: Draft | None = None
    draft_tokens: int = 2
    source: list[int] | None = None


class Sequence:
    """One request while it decodes: ``tokens`` (the prompt's, then those taken), ``cached``
    (how many the cache holds), ``new`` (those taken in the engine's last step) and
    ``piece`` (their text, with a ``Text``), ``counts``, and how it ended (``finish``:
    ``"stop"``, ``"length"``, ``"cancelled"``, ``"error"`` with its ``error``, or None while
    it runs). The engine's
    scheduler gives it ``row`` (in a level's cache) or ``blocks`` (in a paged one)."""

    def __init__(self, request: Request, id: int):
        self.request, self.id = request, id
        self.tokens, self.prompt, self.cached = list(request.ids), len(request.ids), 0
        self.found: int | None = None  # prompt tokens the prefix cache held when it joined
        rngs = request.sampling.generators(1)  # None when greedy: no draw is made
        self.generator: np.random.Generator | None = None if rngs is None else rngs[0]
        self.new: list[int] = []
        self.piece = ""
        self.counts = Counts()
        self.finish: str | None = None
        self.error: Exception | None = None  # why it ended with ``finish`` ``"error"``
        self.row: int | None = None
        self.blocks: Any = None

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt :]

    @property
    def todo(self) -> list[int]:
        """What its next pass feeds: the prompt's rest, then the token taken last (and the
        tokens a batch's rollback took back out of the cache)."""
        return self.tokens[self.cached :]

    @property
    def room(self) -> int:
        """New tokens it may still take."""
        return self.request.max_tokens - len(self.generated)

    def take(self, token: int) -> bool:
        """Take ``token`` -> whether the sequence has ended (``finish`` says why)."""
        self.tokens.append(token)
        self.new.append(token)
        text = self.request.text
        if token in self.request.stop_ids:
            self.finish = "stop"
        elif text is not None:
            self.piece += text.push(token)
            self.finish = "stop" if text.stopped else None
        if self.finish is None and self.room <= 0:
            self.finish = "length"
        if self.finish is not None and text is not None:
            self.piece += text.close()  # what was held back, unless a stop string cut it
        return self.finish is not None

    def end(self, reason: str) -> None:
        """End it now (a client went away: ``"cancelled"``)."""
        self.finish = reason
