"""Who may attend whom: the rule of attention, written once for every level.

**One rule, by position** (``sees`` and ``visible``): each token carries its position
(``-1`` for padding), and every cache keeps its keys' positions beside them. A query at
``q`` may see a key at ``k`` when the key is real (``k >= 0``), not in the future
(``k <= q``; an encoder sees both ways) and, under a sliding window ``W``, within it
(``|q - k| < W``). Nothing here asks where a key sits in memory: a cache slot need not
equal a position, so prompts of different lengths share a batch and a rejected guess is
forgotten by moving a length back. A padded query (``q < 0``) sees its row's first key,
so that no row of scores is empty; its output is zeroed by the caller. ``sees`` is the
rule for one pair (level 0 loops over it); ``visible`` applies it to whole arrays (numpy
and torch alike), the mask every other level builds.

**The attention core's ``causal`` and ``window`` are the same rule at fixed places**
(``key_range`` and the helpers after it): the public ``attention(q, k, v, causal=,
window=)`` of the SPEC gives its ``S`` keys the positions ``0 .. S-1`` and its ``T``
queries the last ``T`` of them (bottom-right: query ``i`` at ``d = i + (S - T)``, so the
last query sees the last key). Level 0 loops over ``key_range`` row by row, level 1
vectorises it, the torch levels build the matrix on the device, level 3 hands SDPA its
causal path and level 4's kernel skips the key tiles outside it.

**What a model tells its cores** (``in_place``, ``told``): when a pass's positions are
those places, up to a shift (every row's keys consecutive and real, its queries the last
``T`` of them: an unpadded prefill, an unpadded decode step, a chunk of a prompt after
its cached start), the mask ``visible`` would build is exactly ``causal``/``window`` by
place, so the model hands the core those (``ByPlace``) instead of a mask, and the core
takes its fast path. Padded rows and keys out of order get the mask: exact either way.

Plain integers (or arrays) in, the same out: no check (``checks.py`` and
``levels.common.public`` validate the inputs before any of this runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def sees(q: int, k: int, window: int | None = None, *, causal: bool = True) -> bool:
    """May a query at position ``q`` see a key at position ``k``? (``-1``: padding.)

    The key must be real, not after the query (``causal``; an encoder's queries see
    both ways) and, with a ``window``, fewer than ``W`` positions away. A padded query
    sees nothing by this rule: ``visible`` gives it its row's first key.
    """
    if k < 0 or q < 0:
        return False
    if causal and k > q:
        return False
    return window is None or abs(q - k) < window


def positions_of(valid, start=0):
    """Each token's position: ``valid (B,T)`` right-padded (numpy) -> ``(B,T)`` int64,
    counting ``start, start + 1, ...`` over a row's real tokens and ``-1`` at its padding;
    ``start`` an int, or one per row ``(B,)`` (where each row of a cache stands)."""
    counted = np.cumsum(valid, axis=1) - 1 + np.asarray(start, dtype=np.int64)[..., None]
    return np.where(valid, counted, -1)


def visible(q_pos, k_pos, window: int | None = None, *, causal: bool = True):
    """``sees`` for every query and key of a batch: ``q_pos (B,T)``, ``k_pos (B,S)`` integer
    arrays (numpy or torch) -> ``(B,1,T,S)`` bool, True = may attend, one mask for every
    head. A padded query (``q_pos < 0``) sees its row's first key (slot 0), so that every
    row of scores keeps a key; its output is zeroed by the caller."""
    q = q_pos[:, None, :, None]  # (B,1,T,1)
    k = k_pos[:, None, None, :]  # (B,1,1,S)
    seen = (k >= 0) & (q >= 0)  # both real: (B,1,T,S)
    if causal:
        seen = seen & (k <= q)
    if window is not None:
        seen = seen & (abs(q - k) < window)
    seen[..., 0] = seen[..., 0] | (q[..., 0] < 0)  # a padded query: its row's first key
    return seen


@dataclass(frozen=True)
class ByPlace:
    """What a layer's queries may see, told as the attention core's own ``causal`` and
    ``window`` (by place, no mask): what ``told`` gives where the positions are the places."""

    causal: bool
    window: int | None = None


def in_place(q_pos, k_pos) -> bool:
    """Are these the places of the core's rule, up to a shift? ``q_pos (B,T)``, ``k_pos (B,S)``
    (numpy or torch): in every row the keys real and consecutive (``o, o + 1, ...``,
    ``o >= 0``) and the queries the last ``T`` of them. Then ``q - k`` is ``i + (S - T) - j``
    for query ``i`` and key ``j``, and ``visible`` is ``key_range``'s rule exactly. (One
    reduction of each and one read on the host.)"""
    T, S = q_pos.shape[1], k_pos.shape[1]
    if T > S:
        return False
    consecutive = ((k_pos[:, 1:] - k_pos[:, :-1]) == 1).all()  # (B,S-1): each key one on
    last = (q_pos == k_pos[:, S - T :]).all()  # the queries are the last T keys
    return bool((k_pos[:, :1] >= 0).all() & consecutive & last)


def told(q_pos, k_pos, window: int | None = None, *, causal: bool = True, placed=None):
    """What a core is told of ``q_pos (B,T)`` against ``k_pos (B,S)``: ``ByPlace(causal,
    window)`` when the positions are in place (``placed``, ``in_place``'s answer where the
    caller has it for several windows), else the mask ``visible`` builds, ``(B,1,T,S)``."""
    if in_place(q_pos, k_pos) if placed is None else placed:
        return ByPlace(causal, window)
    return visible(q_pos, k_pos, window, causal=causal)


def core_keywords(seen) -> dict:
    """The keywords of an attention core's call for what the queries may see: ``ByPlace`` as
    ``causal=`` and ``window=``, a mask (or None: every key) as ``mask=``."""
    if isinstance(seen, ByPlace):
        return {"causal": seen.causal, "window": seen.window}
    return {"mask": seen}


def group_size(q_shape, k_shape) -> int:
    """Grouped-query attention: ``G = H // Hkv`` query heads share each key/value head, and
    query head ``h`` reads key/value head ``h // G`` (q ``(B,H,T,Dh)``, k ``(B,Hkv,S,Dh)``)."""
    return int(q_shape[1]) // int(k_shape[1])


def causal_offset(T: int, S: int) -> int:
    """Bottom-right alignment: query ``i`` may attend key ``j`` iff ``j <= i + (S - T)``."""
    return S - T


def key_range(i: int, T: int, S: int, *, causal: bool, window: int | None) -> tuple[int, int]:
    """The keys ``[lo, hi)`` that query ``i`` may see by position alone (before any mask).

    With ``d = i + (S - T)``, the query's place among the keys (bottom-right):

    * causal: ``j <= d``; with a window ``W``, also ``j > d - W`` (its ``W`` latest keys);
    * not causal: every key; with a window, the band ``|j - d| < W``.
    """
    d = i + causal_offset(T, S)
    lo, hi = 0, S
    if causal:
        hi = min(S, d + 1)
    if window is not None:
        lo = max(0, d - window + 1)
        if not causal:
            hi = min(S, d + window)
    return lo, max(lo, hi)


def causal_binds(T: int, *, causal: bool) -> bool:
    """Whether bottom-right causal masking hides any key: only with more than one query.
    One query sits at the last key (``j <= 0 + S - 1`` for every key), as every decode
    step's does."""
    return causal and T > 1


def window_binds(T: int, S: int, *, causal: bool, window: int | None) -> bool:
    """Whether a window hides any key (one wider than the sequence changes nothing).

    The last query's window starts at ``S - W`` (so it binds when ``W < S``); without
    causal the first query's also ends at ``S - T + W`` (binding when ``W < T``).
    """
    if window is None:
        return False
    return window < S or (not causal and window < T)


def rows_without_keys(T: int, S: int, *, causal: bool, window: int | None) -> bool:
    """Whether position rules alone (causal, window) leave some query row empty.

    The first and the last rows are the tightest: ``lo`` and ``hi`` both grow with ``i``.
    """
    return any(
        key_range(i, T, S, causal=causal, window=window)[0]
        >= key_range(i, T, S, causal=causal, window=window)[1]
        for i in (0, T - 1)
    )
