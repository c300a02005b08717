"""What every level's KV cache keeps besides its keys and values.

A cache holds ``capacity`` (``max_seq_len``) slots for ``batch`` rows, ``length`` of them
filled; each level's class adds the keys and values and every slot's position, in its
own arrays (level 0's lists, numpy, torch), with ``extend(positions)`` and
``update(index, k, v)``. Two things are the same at every level and live here: a
rollback (the length set back: the slots after it are forgotten, which is how
speculative decoding forgets a rejected guess) and, for an encoder-decoder, the
memory's keys and values, computed once per generation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Cache:
    """``capacity`` slots for ``batch`` rows on ``device``, ``length`` filled; ``cross[i]``
    decoder layer ``i``'s cross-attention ``(k, v)`` of the encoded source, and
    ``memory_positions`` the source's (an encoder-decoder's)."""

    def __init__(self, config, batch: int, device=None):
        self.capacity, self.batch, self.length, self.device = config.max_seq_len, batch, 0, device
        self.cross: list[tuple[Any, Any] | None] = [None] * config.n_layers
        self.memory_positions: Any = None

    def rollback(self, length: int) -> None:
        """Forget every slot after the first ``length``: the cache as it was then."""
        if (
            isinstance(length, bool)
            or not isinstance(length, int)
            or not 0 <= length <= self.length
        ):
            raise ValueError(f"cannot roll a cache of {self.length} slots back to {length!r}")
        self.length = length

    def memory_keys(self, index: int, keys_values: Callable[[], tuple[Any, Any]]):
        """Decoder layer ``index``'s cross-attention keys and values, ``keys_values()`` on its
        first call and kept: the source is encoded once a generation."""
        if self.cross[index] is None:
            self.cross[index] = keys_values()
        return self.cross[index]
