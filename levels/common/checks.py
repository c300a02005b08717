"""The attention core's input checks, shared by every level, so the errors are identical.

These functions look at shapes, dtype kinds and a few plain integers, never at a
level's array type, so each level calls them with facts read off its own arrays. Each
message is written once, here. (The models' own inputs, token ids, ``valid``, lengths
and the cache's room, are checked by ``levels.common.public``.) The error table they
implement is in docs/conventions.md.

``kind`` is numpy's one-letter dtype kind: ``"b"`` bool, ``"i"`` / ``"u"``
signed / unsigned integer, ``"f"`` float, ``"c"`` complex (anything else
is reported as it is).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

EMPTY_ROW_MESSAGE = (
    "a query row has no key it may attend to (check the mask, the padding, the window "
    "and the causal alignment: with causal=True and T > S the first T - S queries see nothing)"
)


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
