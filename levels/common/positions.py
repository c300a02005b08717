"""Positions in a batch of prompts of different lengths, for every level's KV cache.

Prompts are right-padded, so in a prefill a real token's position is its
slot, and padding sits after every real token of its row. Decoding then
appends one slot per step to every row at once: the new token of a row whose
prompt was shorter than the batch's widest sits at a slot past its padding,
but its *position* (what RoPE rotates by and a sliding window measures) is
the number of real tokens before it in its row. That is what a row generated
alone would have, and what makes a batched row equal the row alone.

Both rules reduce to "positions count real tokens": the position of a slot
is the number of real slots before it in its row. For a cache without
padding that is the slot, and nothing changes.

Written once on array methods that numpy and torch share (``sum``,
``cumsum``, ``all``, comparisons, broadcasting), so the caches of levels 0
to 3 and the layers of both array families use the same code.
"""

from __future__ import annotations

from typing import Any

Array = Any  # np.ndarray or torch.Tensor


class RowPositions:
    """Mixed into a KV cache: whether its rows are ragged, and each row's next position.

    The cache calls ``_count_real(valid_new)`` when a step commits. A prefill
    with padding makes the cache *ragged* (one check, at the first step);
    from then on it counts each row's real tokens. Without padding it counts
    nothing and the position of the next token is ``length``, as before.
    """

    ragged: bool = False
    _real: Array | None = None  # (B,) real tokens per row, kept only when ragged

    def _count_real(self, valid_new: Array) -> None:
        """``valid_new (B,T)``: the step about to be committed (before ``length`` grows)."""
        if self.length == 0:
            self.ragged = not bool(valid_new.all())
            if self.ragged:
                self._real = valid_new.sum(1)  # (B,)
        elif self.ragged:
            self._real = self._real + valid_new.sum(1)  # (B,)

    def position_offset(self) -> int | Array:
        """Where the next step's first token sits: ``length``, or per row ``(B,)`` when ragged."""
        return self._real if self.ragged else self.length


def window_by_position(valid: Array, T: int, window: int) -> Array:
    """The sliding window measured in positions for the last ``T`` slots of ``valid (B,S)``:
    a ``(B,1,T,S)`` mask, True where a key is real and among its query's ``W`` latest
    positions. (The position of slot ``j`` is the count of real slots before it.)

    Slots are in time order, so causal masking by slot stays right; only the window,
    which counts distance, needs positions once a row has padding between its slots.
    """
    pos = valid.cumsum(1) - 1  # (B,S): each slot's position (meaningful where real)
    q_pos = pos[:, -T:]  # (B,T): the queries are the last T slots
    near = pos[:, None, None, :] > q_pos[:, None, :, None] - window  # (B,1,T,S)
    return valid[:, None, None, :] & near  # (B,1,T,S)


def ragged_window(
    valid: Array, T: int, window: int | None, cache
) -> tuple[Array | None, int | None]:
    """A self-attention step's window, as ``(mask by position, window)``.

    After a prefill of prompts of different lengths (``cache.ragged``) the window
    counts positions: ``(window_by_position(valid, T, window), None)``, the mask
    carrying it. Otherwise ``(None, window)``, and attention applies the window
    by slot as always.
    """
    if window is not None and cache is not None and cache.ragged:
        return window_by_position(valid, T, window), None
    return None, window
