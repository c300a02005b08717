"""The step: a sequence's logits in, the tokens it takes out.

After a pass a sequence has ``rows (n + 1, V)``: the logits after its last fed token, then
after each of its draft's ``n`` guesses (none without a draft). Then, in float64 at every
level, so the same logits give the same tokens:

0. **report**, where asked: each token taken gets its log-probability from its own row as
   the model gave it, before anything below (``levels.common.logprobs``); a kept guess's
   row is the target's, so a speculated token reports what it would have unspeculated;
   ``score`` gives the prompt's tokens theirs from a prefill pass's rows;
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

import copy

import numpy as np

from levels.common.logprobs import entries
from levels.common.sampling import distribution, penalized
from levels.common.speculative import verify

from .request import Sequence


def advance(seq: Sequence, rows: np.ndarray, guesses: list[int], q_rows) -> int:
    """Choose and take ``seq``'s next tokens from ``rows (n + 1, V)`` float64, ``guesses (n,)``
    drawn from ``q_rows`` (None: chosen deterministically) -> how many guesses it kept."""
    request = seq.request
    constraint, sampling = request.constraint, request.sampling
    chosen = penalized(rows, sampling, seq.generated, guesses)  # (n + 1, V)
    if constraint is not None:
        chosen = masked(chosen, guesses, constraint)
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


def masked(rows: np.ndarray, guesses: list[int], constraint) -> np.ndarray:
    """``rows (n + 1, V)``, row ``i`` masked by the language after ``guesses[:i]`` (on a copy
    of ``constraint``: the sequence's own moves on by what is kept). After a guess the
    language refuses, the rows are that guess's own: it has ``p = 0`` and is rejected
    there, so no later row is read."""
    state, out = copy.copy(constraint), []
    for i in range(len(rows)):
        out.append(state.apply(rows[i][None])[0])
        if i < len(guesses):
            try:
                state.advance(guesses[i])
            except ValueError:  # refused: p(guesses[i]) = 0 in the row just masked
                out += [out[-1]] * (len(rows) - 1 - i)
                break
    return np.array(out)


def score(seq: Sequence, rows: np.ndarray, start: int) -> None:
    """The prompt's tokens' log-probabilities from ``rows (n, V)``, the logits after positions
    ``start .. start + n - 1``: row ``i`` gives token ``start + i + 1`` its own (those already
    scored, by a pass before a preemption, are kept)."""
    ahead = range(start + 1, min(start + 1 + len(rows), seq.prompt))
    todo = [at for at in ahead if seq.scored[at] is None]
    if todo:
        scored = entries(rows[todo[0] - start - 1 :], seq.tokens[todo[0] : todo[-1] + 1], seq.request.logprobs or 0)  # fmt: skip
        seq.scored[todo[0] : todo[-1] + 1] = scored
