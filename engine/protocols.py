"""What the engine asks of the things it is given, as ``typing.Protocol``s.

A model at any level, a cache, a constraint, a draft and a text are duck-typed: the
engine imports no level. These classes say which methods it calls, and with what.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Cache(Protocol):
    """A level's KV cache (``levels.common.cache``): ``batch`` rows, ``capacity`` slots,
    ``length`` of them filled; a pass appends its slots, ``rollback`` forgets the last ones."""

    batch: int
    capacity: int
    length: int

    def rollback(self, length: int) -> None: ...


class Arrays(Protocol):
    """A level's array functions: numpy in (``asarray``), numpy out (``to_numpy``), and the
    context its loops run the model in (``inference``: no autograd)."""

    def asarray(self, array: np.ndarray, *, device=None) -> Any: ...
    def to_numpy(self, x: Any) -> np.ndarray: ...
    def inference(self) -> Any: ...


class Model(Protocol):
    """A decoder-only model's plain pass: ``transformer(ids (B,T), positions (B,T), cache,
    last) -> logits (B,T,V)`` (``last``: each row's last real token only, ``(B,1,V)``),
    ``-1`` at padding; ``new_cache(batch)``; its ``config``, ``arrays`` and ``device``. A
    seq2seq model has ``memory(src, positions)`` and takes ``memory, memory_positions``
    after ``positions`` instead of ``last``."""

    config: Any
    arrays: Arrays
    device: Any

    def transformer(self, ids, positions, cache=None, last: bool = False) -> Any: ...
    def new_cache(self, batch: int) -> Cache: ...


class Constraint(Protocol):
    """A request's place in a language (``constrained.Constraint``): ``apply(logits (1, V))``
    masks what the language refuses (``ValueError`` when it refuses every token);
    ``advance(token)`` moves on (``ValueError`` for a refused token). ``copy.copy`` of it
    is an independent state (speculation tests guesses on a copy)."""

    def apply(self, logits: np.ndarray) -> np.ndarray: ...
    def advance(self, token: int) -> None: ...


class Draft(Protocol):
    """What guesses: ``propose(context, k, row, sampling) -> (tokens, q_rows)``, at most ``k``
    tokens continuing ``context`` for sequence ``row``, and the ``(len(tokens), V)``
    distributions they were drawn from, or None when chosen deterministically."""

    def propose(self, context: list[int], k: int, row: int = 0, sampling=None) -> tuple: ...


class Text(Protocol):
    """Output processing (``levels.tokenizer.Text``): ``push(token)`` -> the text that may be
    shown now; ``stopped`` once a stop string has appeared; ``close()`` -> the rest."""

    stopped: bool

    def push(self, token: int) -> str: ...
    def close(self) -> str: ...
