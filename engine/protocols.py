"""What the engine asks of what it is given, as ``typing.Protocol``s: a model, its cache, a
constraint, a draft, a text. All are duck-typed (the engine imports no level)."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Cache(Protocol):
    """A level's KV cache: ``capacity`` slots a row, ``length`` filled; a pass appends its
    slots, ``rollback(length)`` forgets those after ``length``."""

    capacity: int
    length: int

    def rollback(self, length: int) -> None: ...


class Model(Protocol):
    """A model's plain pass, ``transformer(ids (B,T), positions (B,T), cache, last) -> logits
    (B,T,V)`` (``-1`` at padding; ``last``: each row's last real token, ``(B,1,V)``), and
    ``new_cache(batch)``, ``config``, ``device``, ``arrays`` (``asarray``, ``to_numpy``,
    ``inference``). A seq2seq model has ``memory(src, positions)`` and takes ``memory,
    memory_positions`` where a decoder-only one takes ``last``."""

    config: Any
    arrays: Any
    device: Any

    def transformer(self, ids, positions, cache=None, last: bool = False) -> Any: ...
    def new_cache(self, batch: int) -> Cache: ...


class Constraint(Protocol):
    """A place in a language: ``apply(logits (1,V))`` masks what it refuses (``ValueError``:
    every token); ``advance(token)`` moves on (``ValueError``: a refused token). A
    ``copy.copy`` of it is a state of its own."""

    def apply(self, logits: np.ndarray) -> np.ndarray: ...
    def advance(self, token: int) -> None: ...


class Draft(Protocol):
    """``propose(context, k, row, sampling) -> (tokens, q_rows)``: at most ``k`` tokens after
    ``context`` for sequence ``row``, and the ``(len(tokens), V)`` distributions they were
    drawn from (None: chosen deterministically). A draft with state per sequence may have
    ``open(row, seed)`` and ``forget(row)``, which the engine calls."""

    def propose(self, context: list[int], k: int, row: int = 0, sampling=None) -> tuple: ...


class Text(Protocol):
    """``push(token)`` -> the text to show; ``stopped`` after a stop string; ``close()``."""

    stopped: bool

    def push(self, token: int) -> str: ...
    def close(self) -> str: ...
