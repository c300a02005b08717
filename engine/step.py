"""The step: a sequence's logits in, the tokens it takes out.

After a pass a sequence has ``rows (n + 1, V)``: the logits after its last fed token, then
after each of its draft's ``n`` guesses (none without a draft). Then, in float64 at every
level, so the same logits give the same tokens:

0. **report**, where asked: each token taken, its log-probability from its row as the model
   gave it (``levels.common.logprobs``); ``score``: the prompt's, from a prefill's rows;
1. **adjust**: logit bias and penalties (``levels.common.sampling.penalized``);
2. **mask**: row ``i`` under its constraint's language after guesses ``0 .. i - 1`` (a guess
   the language refuses has ``p = 0``, and the rule rejects it);
3. **choose**: speculative decoding's rule (``levels.common.speculative.verify``) over the
   processed distributions (``levels.common.sampling.distribution``) keeps a prefix of the
   guesses and draws one token more; with no guess, one draw: plain decoding;
4. **advance**: the sequence takes those tokens until one ends it (a stop id, a stop string
   in its text, ``max_tokens``), its constraint moving on by each.
"""

from __future__ import annotations

import numpy as np

from levels.common.logprobs import entries
from levels.common.sampling import distribution, penalized
from levels.common.speculative import masked_rows, verify

from .request import Sequence


def advance(seq: Sequence, rows: np.ndarray, guesses: list[int], q_rows) -> int:
    """Choose and take ``seq``'s next tokens from ``rows (n + 1, V)`` float64, ``guesses (n,)``
    drawn from ``q_rows`` (None: chosen deterministically) -> how many guesses it kept."""
    request = seq.request
    constraint, sampling = request.constraint, request.sampling
    chosen = penalized(rows, sampling, seq.generated, guesses)  # (n + 1, V)
    if constraint is not None:
        chosen = masked_rows(chosen, guesses, constraint)
    p_rows = distribution(chosen, sampling)  # (n + 1, V)
    n, last = verify(p_rows, q_rows, guesses, seq.generator)
    if guesses:
        seq.counts.add(len(guesses), n)
    before = len(seq.tokens)
    for token in [*guesses[:n], last]:
        if constraint is not None:
            constraint.advance(token)
        if seq.take(token):
            break
    if request.logprobs is not None:  # of the rows as the model gave them
        seq.logprobs += entries(rows, seq.tokens[before:], request.logprobs)
    return n


def score(seq: Sequence, rows: np.ndarray, start: int) -> None:
    """The prompt's tokens' log-probabilities from ``rows (n, V)``, the logits after positions
    ``start .. start + n - 1``: row ``i`` gives token ``start + i + 1`` its own (those already
    scored, by a pass before a preemption, are kept)."""
    todo = [at for at in range(start + 1, min(start + 1 + len(rows), seq.prompt)) if seq.scored[at] is None]  # fmt: skip
    if todo:
        a, b = todo[0], todo[-1] + 1
        seq.scored[a:b] = entries(rows[a - start - 1 :], seq.tokens[a:b], seq.request.logprobs or 0)
