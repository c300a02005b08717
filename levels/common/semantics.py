"""Who may attend whom, by position: the rules of causal and windowed attention (and which
key/value head a query head reads, ``group_size``).

Every level reads its masks off these few lines, so the rules are written once:
level 0 loops over ``key_range`` row by row, level 1 vectorises it into a
``(T, S)`` matrix, the torch levels build the same matrix on the device, and
level 4's kernel skips the key tiles outside it. Queries sit bottom-right: with
``T`` queries and ``S`` keys, query ``i`` is placed at ``d = i + (S - T)``, so
the last query sees the last key (what decoding against a cache needs).
Plain integers in, plain integers out: no array type, no check (``checks.py``
validates the inputs before any of this runs).
"""

from __future__ import annotations


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
