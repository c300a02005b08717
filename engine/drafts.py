"""A draft that is a model (``protocols.Draft``): what guesses a sequence's next tokens by
decoding them with another model. (The n-gram draft, which needs no model, is
``levels.common.speculative.NGramDraft``.) The step checks the guesses against the
model's own distributions in one pass (``step.py``): a draft changes the speed, never the
tokens' law."""

from __future__ import annotations

import os

import numpy as np

from levels.common.sampling import Sampling, distribution, draw

from .runner import Runner

DRAFT_STREAM = 0xD4AF7  # what sets a draft's stream apart from its sequence's, same seed


class ModelDraft:
    """A draft that is a model: any level's of the same vocabulary, a cheaper copy of the
    target (level 3's int8 or int4 weights), or the target's first layers
    (``model.first_layers(n)``).

    It guesses ``k`` tokens a pass at a time (the engine's runner, one token a row), each
    drawn from its processed distribution under the target's sampling, which it reports as
    ``q``: greedy, its argmax. It keeps a cache for each sequence (``row``) and, before
    guessing, brings it to the context: the longest prefix it holds is kept (a rollback
    drops the rest, its own rejected guesses among them), the context's rest runs in one
    pass. Its draws come from the sequence's seed (``open``), or ``seed`` and the row.
    """

    def __init__(self, model, *, seed: int | None = None):
        self.model, self.seed, self.runner = model, seed, Runner(model)
        self._rows: dict[int, tuple[object, list[int], np.random.Generator]] = {}

    def open(self, row: int, seed: int | None = None) -> None:
        """Start sequence ``row`` afresh, its draws seeded by ``seed`` (its request's), in a
        stream of their own: a draft drawing the very uniforms the rule then tests its
        guesses with would make the two agree too often, and the tokens' law would no
        longer be the model's."""
        entropy = [seed, DRAFT_STREAM] if seed is not None else (None if self.seed is None else [self.seed, row])  # fmt: skip
        self._rows[row] = (self.model.new_cache(1), [], np.random.default_rng(entropy))

    def forget(self, row: int) -> None:
        self._rows.pop(row, None)

    def propose(self, context: list[int], k: int, row: int = 0, sampling: Sampling | None = None):
        sampling = sampling or Sampling()
        if row not in self._rows:
            self.open(row)
        cache, held, rng = self._rows[row]
        common = len(os.path.commonprefix([held, context[:-1]]))  # kept; its last is re-run
        cache.rollback(common)
        tokens, rows, new = [], [], context[common:]  # the context's rest, then each guess
        for _ in range(k):
            logits = self.runner.logits([new], [common], cache, width=len(new), last=True)
            q = distribution(logits[:, -1], sampling)  # (1, V)
            tokens.append(int(q[0].argmax()) if sampling.greedy else draw(q[0], rng.random()))
            rows.append(q[0])
            common, new = common + len(new), tokens[-1:]
        self._rows[row] = (cache, (context + tokens)[:common], rng)
        return tokens, np.array(rows) if rows else None
