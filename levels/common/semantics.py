"""Who may attend whom: the rules of attention, written once for every level.

Two rules, one for each caller:

* **The models' rule, by position** (``sees`` and ``visible``): each token carries its
  position (``-1`` for padding), and every cache keeps its keys' positions beside them.
  A query at ``q`` may see a key at ``k`` when the key is real (``k >= 0``), not in the
  future (``k <= q``; an encoder sees both ways) and, under a sliding window ``W``,
  within it (``q - k < W``). Nothing here asks where a key sits in memory: a cache slot
  need not equal a position, so prompts of different lengths share a batch and a
  rejected guess is forgotten by moving a length back. A padded query (``q < 0``) sees
  its row's first key, so that no row of scores is empty; its output is zeroed by the
  caller. ``sees`` is the rule for one pair (level 0 loops over it); ``visible``
  applies it to whole arrays (numpy and torch alike), the mask every other level builds.
* **The attention core's rule, by place** (``key_range`` and the helpers after it): the
  public ``attention(q, k, v, causal=, window=)`` of the SPEC places its ``T`` queries
  bottom-right among ``S`` keys (query ``i`` at ``d = i + (S - T)``, so the last query
  sees the last key). Level 0 loops over ``key_range`` row by row, level 1 vectorises
  it, the torch levels build the matrix on the device, and level 4's kernel skips the
  key tiles outside it.

Plain integers (or arrays) in, the same out: no check (``checks.py`` and
``levels.common.public`` validate the inputs before any of this runs).
"""

from __future__ import annotations

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
