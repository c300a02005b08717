"""Log-probabilities as a client reads them: the model's own distribution, in float64.

A token's log-probability is ``log softmax(logits)[token]`` of the logits it was chosen
from, over the whole vocabulary, at temperature 1: before temperature, top-k, top-p,
logit bias, penalties and a constraint's mask (as OpenAI's API and vLLM report them).
So it says what the model thinks of the token, whatever chose it; a token a mask forced
has the log-probability the model gives it, however low.

``log_softmax`` works in float64 whatever the level computed in: ``z - max(z)``
first (no ``exp`` overflows, the largest term is ``exp(0) = 1``, so the sum is in
``[1, V]`` and its log loses nothing), then ``z - max - log(sum(exp(z - max)))``.

``top_tokens`` ranks by log-probability, highest first; tokens of exactly equal
log-probability are ranked by id, lowest first (docs/conventions.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP = 20  # the most alternatives a token reports, as OpenAI's top_logprobs


@dataclass(frozen=True)
class Logprob:
    """A token taken or scored, its log-probability, and the ``top`` most likely tokens at
    its place with theirs (``(id, logprob)``, most likely first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """``logits (n, V)`` -> ``(n, V)`` float64 log-probabilities (each row's exp sums to 1)."""
    z = np.asarray(logits, dtype=np.float64)  # (n, V)
    shifted = z - z.max(axis=-1, keepdims=True)  # (n, V), each row's largest is 0
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def top_tokens(row: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` ids of ``row (V,)`` with the largest values, largest first, equal values
    lowest id first: ``(k,)`` int64."""
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    k = min(k, len(row))
    kth = np.partition(row, len(row) - k)[len(row) - k]  # the k-th largest value
    candidates = np.flatnonzero(row >= kth)  # (>= k,) ascending ids, ties at kth included
    order = np.argsort(-row[candidates], kind="stable")  # stable: equal values keep id order
    return candidates[order[:k]].astype(np.int64)


def entries(logits: np.ndarray, tokens: list[int], top: int) -> list[Logprob]:
    """Row ``i`` of ``logits (n, V)`` chose ``tokens[i]`` -> each one's ``Logprob`` with its
    ``top`` alternatives (``len(tokens) <= n``; later rows are not read)."""
    if not tokens:
        return []
    lsm = log_softmax(np.asarray(logits)[: len(tokens)])  # (len(tokens), V)
    out = []
    for row, token in zip(lsm, tokens, strict=True):
        best = top_tokens(row, top)
        out.append(Logprob(int(token), float(row[token]), tuple((int(t), float(row[t])) for t in best)))  # fmt: skip
    return out
