"""A request, and its state while it decodes.

``Request`` is what a caller asks for: a prompt's ids, how many tokens at most, how to
choose them, what ends them, and what a feature adds (a constraint on the language, a
draft that guesses, a seq2seq model's source). ``Sequence`` is one request on its way: its
tokens and ``cached``, how many of them the cache holds. What the next pass feeds
(``todo``) and where (a token's position is its index) follow from those two.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from levels.common.sampling import Sampling
from levels.common.speculative import Counts

from .protocols import Constraint, Draft, Text


@dataclass
class Request:
    """A prompt ``ids`` and at most ``max_tokens`` new tokens, chosen by ``sampling`` (drawn
    from a generator of ``sampling.seed``). It ends after a token of ``stop_ids``, or when
    its ``text`` (ids to text, stop strings) has stopped. ``constraint`` masks the logits
    before each choice; ``draft`` guesses up to ``draft_tokens`` tokens a pass. ``source``:
    a seq2seq model's source ids (the prompt is then the target's start, BOS)."""

    ids: list[int]
    max_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    stop_ids: tuple[int, ...] = ()
    text: Text | None = None
    constraint: Constraint | None = None
    draft: Draft | None = None
    draft_tokens: int = 2
    source: list[int] | None = None
    logprobs: int | None = None  # each token's log-probability, and this many alternatives
    echo: bool = False  # the prompt's tokens' too (with max_tokens 0: the prompt scored only)


class Sequence:
    """One request while it decodes: ``tokens`` (the prompt's, then those taken), ``cached``,
    ``new`` and ``piece`` (the tokens taken in the engine's last step, and their text),
    ``counts`` (its draft's guesses), ``found`` (prompt tokens the prefix cache held when it
    joined) and ``finish``: ``"stop"``, ``"length"``, ``"cancelled"``, ``"error"`` (with
    ``error``), None while it runs. ``logprobs``: a ``Logprob`` a token taken, where asked;
    ``scored``: the prompt's with ``echo`` (the first None: no context), ``scoring`` while
    some are to come. The scheduler gives it a ``row`` of a level's cache, or ``blocks``."""

    def __init__(self, request: Request, id: int):
        self.request, self.id = request, id
        self.tokens, self.prompt, self.cached = list(request.ids), len(request.ids), 0
        draws = request.sampling.generators(1)  # None when greedy: no draw is made
        self.generator = None if draws is None else draws[0]
        self.new, self.piece, self.counts = [], "", Counts()
        self.finish, self.error, self.logprobs = None, None, []
        self.found = self.row = self.blocks = None  # set by the scheduler's cache
        self.scored: list | None = [None] * self.prompt if request.echo else None

    generated = property(lambda self: self.tokens[self.prompt :])
    scoring = property(lambda self: self.scored is not None and None in self.scored[1:])

    @property
    def todo(self) -> list[int]:
        """What its next pass feeds: the prompt's rest, then the token taken last (and what a
        batch's rollback took back out of the cache)."""
        return self.tokens[self.cached :]

    room = property(lambda self: self.request.max_tokens - len(self.generated))  # tokens left

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

    def end(self, reason: str, error: Exception | None = None) -> None:
        """End it now (``"cancelled"``: its client went away; ``"error"``: ``error``)."""
        self.finish, self.error = reason, error
