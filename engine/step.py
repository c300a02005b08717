"""The step: a sequence's logits in, the tokens it takes out.

After a pass a sequence has ``rows (n + 1, V)``: the logits after its last fed token, then
after each of its draft's ``n`` guesses (none without a draft). Then, in float64 at every
level, so the same logits give the same tokens:

1. **mask**: row ``i`` under its constraint's language after guesses ``0 .. i - 1`` (a guess
   the language refuses has ``p = 0``, and the rule rejects it);
2. **choose**: speculative decoding's rule (``levels.common.speculative.verify``) over the
   processed distributions (``levels.common.sampling.distribution``) keeps a prefix of the
   guesses and draws one token more; with no guess, one draw: plain decoding;
3. **advance**: the sequence takes those tokens until one ends it (a stop id, a stop string
   in its text, ``max_tokens``), its constraint moving on by each.
"""

from __future__ import annotations

import copy

import numpy as np

from levels.common.sampling import distribution
from levels.common.speculative import verify

from .request import Sequence


def advance(seq: Sequence, rows: np.ndarray, guesses: list[int], q_rows) -> int:
    """Choose and take ``seq``'s next tokens from ``rows (n + 1, V)`` float64, ``guesses (n,)``
    drawn from ``q_rows`` (None: chosen deterministically) -> how many guesses it kept."""
    constraint = seq.request.constraint
    if constraint is not None:
        rows = masked(rows, guesses, constraint)
    p_rows = distribution(rows, seq.request.sampling)  # (n + 1, V)
    n, last = verify(p_rows, q_rows, guesses, seq.generator)
    if guesses:
        seq.counts.add(len(guesses), n)
    for token in [*guesses[:n], last]:
        if constraint is not None:
            constraint.advance(token)
        if seq.take(token):
            break
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
