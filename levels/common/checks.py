"""Input validation shared by every level, so the errors are identical everywhere.

These functions look at shapes, dtype kinds and a few plain integers (and at token
ids as numpy, which is how the models' edge reads every level's), never at a level's
array type, so each level calls them with facts read off its own arrays. Each
message is written once, here. The error table they implement is in
docs/conventions.md.

``kind`` is numpy's one-letter dtype kind: ``"b"`` bool, ``"i"`` / ``"u"``
signed / unsigned integer, ``"f"`` float, ``"c"`` complex (anything else
is reported as it is).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

EMPTY_ROW_MESSAGE = (
    "a query row has no key it may attend to (check the mask, the padding, the window "
    "and the causal alignment: with causal=True and T > S the first T - S queries see nothing)"
)
NO_VALID_TOKEN_MESSAGE = "a sequence has no valid token (every position is padding)"
LEFT_PADDING_MESSAGE = (
    "a sequence is not right-padded (a real token after padding): its real tokens come "
    "first, then the padding"
)

SHAPE_NAMES = {1: "(B,)", 2: "(B, T)"}


def attention_dims(
    q_shape: Sequence[int], k_shape: Sequence[int], v_shape: Sequence[int]
) -> tuple[int, int, int, int, int, int]:
    """Validate q ``(B,H,T,Dh)``, k ``(B,Hkv,S,Dh)``, v ``(B,Hkv,S,Dv)``; return ``(B,H,T,S,Dh,Dv)``.

    ``Hkv`` (the key/value heads) must divide ``H``: each group of ``H // Hkv``
    query heads shares one key/value head (grouped-query attention; ``Hkv = 1``
    is multi-query attention, ``Hkv = H`` the usual multi-head attention).
    """
    q_shape, k_shape, v_shape = tuple(q_shape), tuple(k_shape), tuple(v_shape)
    shapes = f"q {q_shape}, k {k_shape}, v {v_shape}"
    if not (len(q_shape) == len(k_shape) == len(v_shape) == 4):
        raise ValueError(
            f"attention expects 4-D q (B,H,T,Dh), k (B,Hkv,S,Dh), v (B,Hkv,S,Dv); got {shapes}"
        )
    B, H, T, Dh = q_shape
    if k_shape[0] != B or v_shape[0] != B:
        raise ValueError(f"q, k and v must share the batch size B; got {shapes}")
    Hkv = k_shape[1]
    if v_shape[1] != Hkv:
        raise ValueError(f"k and v must have the same number of heads Hkv; got {shapes}")
    if Hkv <= 0 or H % Hkv != 0:
        raise ValueError(
            f"the query heads H={H} must be a multiple of the key/value heads Hkv={Hkv} "
            f"(each group of H // Hkv query heads shares one); got {shapes}"
        )
    if k_shape[3] != Dh:
        raise ValueError(f"q and k must have the same head width Dh; got {shapes}")
    S = k_shape[2]
    if v_shape[2] != S:
        raise ValueError(f"k and v must have the same length S; got {shapes}")
    if min(B, H, T, S, Dh, v_shape[3]) <= 0:
        raise ValueError(f"attention needs non-empty q, k and v; got {shapes}")
    return B, H, T, S, Dh, v_shape[3]


def check_float_inputs(kinds: Sequence[str], dtypes: Sequence[object]) -> None:
    """Attention computes on real floating-point q, k, v (not integers, bools or complex),
    all of one dtype: it converts none of them (numpy would promote to the widest, a
    product of torch tensors to the first's or to an error, SDPA refuses)."""
    names = [str(d).replace("torch.", "") for d in dtypes]
    if any(kind != "f" for kind in kinds):
        raise TypeError("attention needs floating-point q, k and v; got " + ", ".join(names))
    if len(set(names)) > 1:
        raise TypeError("attention needs q, k and v of one dtype; got " + ", ".join(names))


def check_mask(mask_shape: Sequence[int], is_bool: bool, target: Sequence[int]) -> None:
    """A mask must be boolean (True = may attend) and broadcastable to ``target`` (B,H,T,S)."""
    if not is_bool:
        raise TypeError("mask must be boolean, True = may attend (got a non-boolean mask)")
    mask_shape, target = tuple(mask_shape), tuple(target)
    ok = len(mask_shape) <= len(target) and all(
        m in (1, t) for m, t in zip(reversed(mask_shape), reversed(target), strict=False)
    )
    if not ok:
        raise ValueError(f"mask of shape {mask_shape} is not broadcastable to (B,H,T,S) = {target}")


def check_scale(scale: float | None) -> None:
    """``scale`` multiplies every score: it must be a positive finite number (or None)."""
    if scale is None:
        return
    if (
        isinstance(scale, bool)
        or not isinstance(scale, int | float)
        or not (math.isfinite(scale) and scale > 0)
    ):
        raise ValueError(f"scale must be a positive finite number (or None), got {scale!r}")


def check_window(window: int | None) -> None:
    """A sliding window is a positive number of keys (None: unlimited)."""
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ValueError(f"window must be a positive integer (or None), got {window!r}")


def as_numpy(to_numpy: Callable, x, *, what: str) -> np.ndarray:
    """``x`` (a level's array, numpy, or nested lists) as numpy, by the level's ``to_numpy``;
    rows of different lengths are refused with one message at every level."""
    try:
        return np.asarray(to_numpy(x))
    except ValueError:  # numpy: an inhomogeneous shape
        raise ValueError(f"{what}: rows of different lengths (not a (B, T) array)") from None


def checked_ids(
    ids: np.ndarray, vocab_size: int, *, what: str = "tokens", ndim: int = 2, dtype=None
) -> np.ndarray:
    """Token ids as int64: a non-empty ``ndim``-D integer array, every id in ``[0, V)`` (a
    kernel must never gather out of bounds). Every level's ids come here as numpy; ``dtype``
    is the caller's, which an error names (numpy's copy of a bfloat16 tensor is float32)."""
    if ids.ndim != ndim or 0 in ids.shape:
        raise ValueError(
            f"{what} must be a non-empty {SHAPE_NAMES[ndim]} array of token ids, "
            f"got shape {ids.shape}"
        )
    if ids.dtype.kind not in "iu":
        name = str(ids.dtype if dtype is None else dtype).replace("torch.", "")
        raise TypeError(f"{what} must be integer token ids, got dtype {name}")
    check_tokens(int(ids.min()), int(ids.max()), vocab_size, what=f"{what}: token id")
    return ids.astype(np.int64)


def check_tokens(lo: int, hi: int, vocab_size: int, *, what: str = "token id") -> None:
    """Token ids must lie in ``[0, vocab_size)``; a kernel must never gather out of bounds."""
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{what} {bad} is outside [0, vocab_size={vocab_size})")


def check_length(length: int, max_seq_len: int, *, what: str = "sequence length") -> None:
    if length > max_seq_len:
        raise ValueError(f"{what} {length} exceeds max_seq_len={max_seq_len}")
    if length <= 0:
        raise ValueError(f"{what} must be positive, got {length}")


def check_position_offset(offset: object, T: int, max_seq_len: int) -> None:
    """``position_offset`` of a forward: an integer >= 0 with ``offset + T <= max_seq_len``."""
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"position_offset must be an integer, got {offset!r}")
    if offset < 0:
        raise ValueError(f"position_offset must be >= 0, got {offset}")
    check_length(offset + T, max_seq_len, what="position_offset + length")


def check_batch(got: int, expected: int, *, what: str) -> None:
    """Two inputs of one call must have the same number of rows."""
    if got != expected:
        raise ValueError(f"{what}: got {got} rows for a batch of {expected}")


def check_cache_room(filled: int, adding: int, capacity: int) -> None:
    """Called *before* a cache is written, so an overflow leaves it unchanged."""
    if filled + adding > capacity:
        raise ValueError(
            f"KV cache overflow: {filled} positions filled + {adding} new > capacity {capacity} "
            f"(max_seq_len); the cache was left unchanged"
        )


def check_valid_shape(
    valid_shape: Sequence[int], tokens_shape: Sequence[int], is_bool: bool, *, what: str = "valid"
) -> None:
    if not is_bool:
        raise TypeError(f"{what} must be a boolean (B, T) mask, True = real token")
    if tuple(valid_shape) != tuple(tokens_shape):
        raise ValueError(
            f"{what} has shape {tuple(valid_shape)}, tokens have {tuple(tokens_shape)}"
        )


def checked_valid(
    valid: np.ndarray, shape: Sequence[int], *, what: str = "valid"
) -> list[list[bool]]:
    """``valid (B, T)`` (as numpy: the edge and the generation loops read every level's so) as
    checked plain lists. Every row needs a real token, and its padding comes last
    (sequences are right-padded)."""
    T = shape[1]
    check_valid_shape(valid.shape, shape, valid.dtype == np.bool_, what=what)
    lengths = valid.sum(axis=1)  # (B,) real tokens a row
    if not lengths.all():
        raise ValueError(f"{what}: {NO_VALID_TOKEN_MESSAGE}")
    # A right-padded row is True on its first lengths[b] slots and False after them.
    unpadded = (valid != (np.arange(T) < lengths[:, None])).any(axis=1)  # (B,)
    if unpadded.any():
        raise ValueError(
            f"{what}: {LEFT_PADDING_MESSAGE} (row(s) {np.flatnonzero(unpadded).tolist()})"
        )
    return valid.tolist()


def check_new_tokens(max_new_tokens: object) -> int:
    """``max_new_tokens`` of ``generate``: an integer >= 0."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    return max_new_tokens
