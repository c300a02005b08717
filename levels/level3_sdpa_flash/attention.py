"""Attention through ``F.scaled_dot_product_attention`` with the ladder's semantics.

SDPA differs from the contract (docs/conventions.md) in a few places, handled
here before the call rather than patched after it:

* its ``is_causal`` is aligned top-left (``j <= i``); the ladder's is bottom-right
  (``j <= i + S - T``). The two agree when ``T == S``, and with ``T == 1`` the
  bottom-right rule masks nothing, so only ``1 < T < S`` needs more: PyTorch's
  ``causal_lower_right`` bias;
* a query row with no allowed key comes out of SDPA silently, as NaN or as
  zeros depending on the PyTorch version and backend (zeros on torch 2.13's
  CPU backends); here it is a ``ValueError``, decided from the shapes and the
  mask before any kernel runs;
* it has no sliding window: a window becomes part of the boolean mask, and
  over long sequences ``attention_in_chunks`` below cuts the queries into chunks so that the
  cost grows with ``T * W``, not ``T * S``;
* it does not return the log-sum-exp: ``lse.py`` gets it from the same fused
  CPU kernel SDPA runs (``return_lse=True``), a private op (``private.py``).

Grouped-query attention is SDPA's own (``enable_gqa=True``): the kernels read
each key/value head for its whole group of query heads, without copies.

Which kernel runs is SDPA's choice among the enabled backends, in PyTorch's
priority order. ``backend=`` narrows the choice to one backend through
``torch.nn.attention.sdpa_kernel``; ``which_backend`` reports the choice (the
order itself has no public reader: ``private.py``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..common.semantics import key_range, window_binds
from ..level2_torch_manual.attention import (
    as_4d,
    check_attention,
    position_mask,
    position_rule,
    visible_keys,
)
from ..level2_torch_manual.attention import (
    attend as written_out,
)
from .lse import attention_with_lse
from .private import priority_order

if TYPE_CHECKING:  # imported where it is used: see sdpa_mask
    from torch.nn.attention.bias import CausalBias

# The names accepted by ``backend=``. On a CPU build only "flash" (a fused,
# tiled CPU kernel) and "math" (the unfused reference) exist; "efficient"
# (memory-efficient attention) and "cudnn" are CUDA kernels.
BACKENDS: dict[str, SDPBackend] = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
BACKEND_CHOICES = ("auto", *BACKENDS)

# Whether a backend is enabled right now (sdpa_kernel flips these switches;
# despite the module name they govern CPU tensors too).
_ENABLED = {
    "flash": torch.backends.cuda.flash_sdp_enabled,
    "efficient": torch.backends.cuda.mem_efficient_sdp_enabled,
    "cudnn": torch.backends.cuda.cudnn_sdp_enabled,
    "math": torch.backends.cuda.math_sdp_enabled,
}


def check_backend(backend: str) -> str:
    if backend not in BACKEND_CHOICES:
        raise ValueError(f"backend must be one of {BACKEND_CHOICES}, got {backend!r}")
    return backend


def sdpa_mask(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    mask: torch.Tensor | None,
    window: int | None = None,
) -> tuple[torch.Tensor | CausalBias | None, bool]:
    """Translate the ladder's ``(causal, mask, window)`` into SDPA's ``(attn_mask, is_causal)``.

    For inputs ``check_attention`` accepts (every query row keeps a key), so SDPA
    never sees an empty row. Returns what to pass as ``attn_mask`` (a boolean mask,
    True = may attend, broadcastable to ``(B,H,T,S)``; a lower-right ``CausalBias``;
    or ``None``) and whether to set SDPA's (top-left) ``is_causal``.
    """
    T, S = q.shape[-2], k.shape[-2]
    if window is not None and not window_binds(T, S, causal=causal, window=window):
        window = None  # a window wider than the sequence changes nothing
    if mask is not None:
        mask = mask.to(q.device)
        if mask.dim() < 4:  # SDPA wants the leading axes spelled out (a model's mask has them)
            mask = as_4d(mask)
        if bool(mask.all()):
            # A mask that hides nothing is dropped: fused kernels that take no
            # mask at all (flash on CUDA) stay eligible, e.g. for unpadded decoding.
            mask = None
    if mask is not None or window is not None:
        # Padding or a window (and maybe causal): one explicit boolean mask.
        return visible_keys(T, S, causal=causal, mask=mask, window=window, device=q.device), False
    if not causal:
        return None, False
    if T == S:
        return None, True  # top-left and bottom-right coincide: SDPA's fast causal path
    if T == 1:
        return None, False  # j <= 0 + S - 1 holds for every key: nothing to mask
    # 1 < T < S (a chunk of queries after cached keys): on CUDA, PyTorch's lower-right
    # causal bias, which runs flash / efficient kernels with the bottom-right rule built
    # in (subject to the same sdpa_kernel switches). Elsewhere that bias only builds the
    # (T, S) mask and calls SDPA with it, so the mask is built here: importing
    # torch.nn.attention.bias imports torch._dynamo, one to two seconds the first time a
    # prompt is computed after cached keys (extend: a server's chunked or cached prompts).
    if q.device.type != "cuda":
        return position_mask(T, S, causal=True, window=None, device=q.device), False
    from torch.nn.attention.bias import causal_lower_right

    return causal_lower_right(T, S), False


def _backend_context(backend: str):
    """``sdpa_kernel`` restricted to one backend, or no restriction for ``"auto"``.

    With ``"auto"`` an enclosing ``sdpa_kernel(...)`` block chosen by the caller
    still applies, so a whole model can be steered from outside.
    """
    if check_backend(backend) == "auto":
        return contextlib.nullcontext()
    return sdpa_kernel([BACKENDS[backend]])


def sdpa(q, k, v, attn_mask, is_causal, *, scale=None, dropout_p=0.0, backend="auto"):
    """One SDPA call, restricted to ``backend``, with SDPA's own grouped-query attention
    when ``k`` and ``v`` have fewer heads than ``q``."""
    with _backend_context(backend):
        try:
            return F.scaled_dot_product_attention(
                q,  # (B,H,T,Dh)
                k,  # (B,Hkv,S,Dh)
                v,  # (B,Hkv,S,Dv)
                attn_mask=attn_mask,  # bool, broadcastable to (B,H,T,S), True = may attend
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=k.shape[1] != q.shape[1],
            )  # (B,H,T,Dv)
        except RuntimeError as exc:
            if backend == "auto":
                raise
            raise RuntimeError(
                f"SDPA backend {backend!r} cannot run these inputs "
                f"({q.dtype} on {q.device}, dropout_p={dropout_p}, "
                f"mask={'yes' if attn_mask is not None else 'no'}): {exc}"
            ) from exc


# ----------------------------------------------------------------------------- sliding windows
#
# Sliding-window attention in chunks of queries: time and memory grow with ``T * W``, not ``T * S``.
#
# SDPA has no window argument. A window written as a ``(T, S)`` boolean mask
# is correct, but SDPA still computes every score of that matrix (and the mask
# itself holds ``T * S`` booleans), so a window of 256 over 8192 tokens would
# cost as much as full attention. Instead the queries are cut into chunks of
# ``C``; the queries ``[a, a + C)`` can only see the keys
# ``[a + (S - T) - W + 1, a + C + (S - T))`` (causal) or one band wider (not
# causal), fewer than ``C + 2W`` keys, so each chunk is one SDPA call on a
# slice of the keys with a ``(C, C + W)`` mask: ``T / C`` calls of
# ``C * (C + W)`` scores each. Autograd runs through the slices and the
# concatenation unchanged.
#
# Why chunking rather than FlexAttention's block masks, which skip the same
# blocks inside one fused kernel: FlexAttention needs ``torch.compile`` to be
# fast, and on a CPU PyTorch 2.13 has no FlexAttention backward at all.
# Chunking is plain SDPA calls, so it runs forward and backward on every
# device, in every dtype SDPA supports, with no compilation.

MIN_CHUNK = 128  # queries per chunk at least: fewer would cost more in calls than it saves


def chunk_size(window: int) -> int:
    """``C``: a chunk of queries as wide as the window (at least ``MIN_CHUNK``), so each
    call's keys are at most ``C + 2W``, about three times its queries."""
    return max(window, MIN_CHUNK)


def chunking_pays(T: int, S: int, window: int) -> bool:
    """Chunk when a chunk's keys are clearly fewer than all of them and there are several chunks."""
    C = chunk_size(window)
    return T > C and C + 2 * window < S


def attention_in_chunks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    mask: torch.Tensor | None,
    scale: float | None,
    window: int,
    call: Callable[..., torch.Tensor],
) -> torch.Tensor:
    """``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)`` -> ``(B,H,T,Dv)``, chunk by chunk.

    ``call(q, k, v, attn_mask, is_causal, scale=...)`` is one SDPA call (level 3's
    ``sdpa``, with its backend), on inputs ``check_attention`` accepts: a row keeps its
    keys inside its chunk's slice, so no chunk has an empty row.
    """
    T, S = q.shape[-2], k.shape[-2]
    mask = None if mask is None else as_4d(mask.to(q.device))  # (b?, h?, t?, S)
    C = chunk_size(window)
    # One output written chunk by chunk (autograd records each slice's copy): a list of
    # chunks and a final cat would hold the output twice at the peak.
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])  # (B,H,T,Dv)
    for a in range(0, T, C):
        b = min(T, a + C)
        lo = key_range(a, T, S, causal=causal, window=window)[0]  # the chunk's first key
        hi = key_range(b - 1, T, S, causal=causal, window=window)[1]  # one past its last
        # Rows a..b-1, columns lo..hi-1 of the (T, S) position rule.
        d = torch.arange(a, b, device=q.device) + (S - T)  # where these queries sit
        j = torch.arange(lo, hi, device=q.device)  # the keys they may reach
        allowed = position_rule(d, j, causal=causal, window=window)  # (b - a, hi - lo)
        if mask is not None:
            rows = slice(a, b) if mask.shape[-2] != 1 else slice(None)
            allowed = allowed & mask[..., rows, lo:hi]  # (b?, h?, b - a, hi - lo)
        out[:, :, a:b] = call(
            q[:, :, a:b], k[:, :, lo:hi], v[:, :, lo:hi], allowed, False, scale=scale
        )  # (B,H,b-a,Dv)
    return out


def mask_chunks(mask: torch.Tensor, T: int, S: int) -> list[tuple[int, int, int, int]] | None:
    """Where a model's mask ``(B?,1,T,S)`` hides whole key ranges from chunks of queries (a
    sliding window, by position): ``(a, b, lo, hi)`` for each chunk of queries ``[a, b)``,
    ``[lo, hi)`` the keys any of its rows may see; None when the chunks would read most keys
    anyway. (A chunk with a padded query reads from key 0, which that query sees. One
    reduction of the mask and one small copy to the host: the long prompts of a windowed
    model are what pays for it.)"""
    C = MIN_CHUNK
    if T <= C:
        return None
    seen = mask.reshape(-1, T, S).any(dim=0)  # (T, S): any row of the batch
    n = -(-T // C)
    reach = torch.nn.functional.pad(seen, (0, 0, 0, n * C - T)).view(n, C, S).any(dim=1)  # (n, S)
    first = reach.int().argmax(dim=1)  # the first key a chunk reaches
    last = S - 1 - reach.flip(1).int().argmax(dim=1)  # its last
    bounds = torch.stack([first, last + 1], dim=1).tolist()
    chunks = [(a * C, min(T, a * C + C), lo, hi) for a, (lo, hi) in enumerate(bounds)]
    if sum((b - a) * (hi - lo) for a, b, lo, hi in chunks) > T * S * 3 // 4:
        return None
    return chunks


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    window: int | None = None,
    return_lse: bool = False,
    dropout_p: float = 0.0,
    backend: str = "auto",
):
    """``q (B,H,T,Dh)``, ``k (B,Hkv,S,Dh)``, ``v (B,Hkv,S,Dv)`` -> ``(B,H,T,Dv)`` via SDPA.

    Same contract as level 2's ``attention`` (True = may attend, bottom-right
    causal, the sliding ``window``, grouped-query heads, ``ValueError`` on an
    empty row, ``return_lse``). ``backend`` is ``"auto"`` (SDPA chooses) or one
    of ``BACKENDS``; a forced backend that cannot run these inputs raises
    ``RuntimeError`` saying so. ``scale`` defaults to ``1/sqrt(Dh)``.
    """
    check_attention(q, k, v, causal=causal, mask=mask, scale=scale, window=window)
    return attend(q, k, v, causal=causal, mask=mask, scale=scale, window=window,
                  return_lse=return_lse, dropout_p=dropout_p, backend=backend)  # fmt: skip


# fmt: off
def attend(q, k, v, *, causal=False, mask=None, scale=None, window=None, return_lse=False,
           dropout_p=0.0, backend="auto"):  # the arguments of ``attention``, which types them
    # fmt: on
    """``attention`` on inputs it would accept, unchecked: the core the models call
    (level 2's ``attend`` says what their edge has checked)."""
    T, S = q.shape[-2], k.shape[-2]
    if return_lse:
        if dropout_p > 0.0:
            raise ValueError("return_lse with attention dropout is not supported")
        if q.device.type != "cpu":  # the fused kernel lse.py calls is the CPU one
            kw = {"causal": causal, "mask": mask, "scale": scale, "window": window}
            return written_out(q, k, v, **kw, return_lse=True)
        attn_mask, is_causal = sdpa_mask(q, k, v, causal=causal, mask=mask, window=window)
        return attention_with_lse(q, k, v, attn_mask, is_causal, scale=scale)
    call = lambda *args, **kw: sdpa(*args, **kw, dropout_p=dropout_p, backend=backend)  # noqa: E731
    if window is not None and chunking_pays(T, S, window):
        return attention_in_chunks(
            q, k, v, causal=causal, mask=mask, scale=scale, window=window, call=call
        )  # fmt: skip
    chunks = None if mask is None or causal or window is not None else mask_chunks(mask, T, S)
    if chunks is not None:  # a model's windowed mask: each chunk of queries on its keys alone
        out = q.new_empty(q.shape[:-1] + v.shape[-1:])  # (B,H,T,Dv)
        for a, b, lo, hi in chunks:
            part = mask[..., a:b, lo:hi]  # (B?,1,b-a,hi-lo): every row keeps its keys
            out[:, :, a:b] = call(q[:, :, a:b], k[:, :, lo:hi], v[:, :, lo:hi], part, False, scale=scale)
        return out
    attn_mask, is_causal = sdpa_mask(q, k, v, causal=causal, mask=mask, window=window)
    return sdpa(
        q, k, v, attn_mask, is_causal, scale=scale, dropout_p=dropout_p, backend=backend
    )  # (B,H,T,Dv)


def _priority_order() -> list[str]:
    """Backend names in the order SDPA tries them."""
    names = {b: name for name, b in BACKENDS.items()}
    return [names[b] for b in priority_order() if b in names]


def which_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
) -> str:
    """The SDPA backend that ``attention`` runs for these inputs: ``"flash"``, ``"math"``, ...

    Found by experiment rather than by restating PyTorch's rules: each
    enabled backend, in SDPA's priority order, is forced alone, and the first
    one that accepts the inputs is the one the dispatcher picks (it applies
    the same per-backend checks in the same order, and skips backends that an
    enclosing ``sdpa_kernel`` block switched off, as this does). With a forced
    ``backend`` the answer is that backend, or ``RuntimeError`` if it cannot
    run. Runs the attention up to once per backend: call it to report, not in
    a hot loop. On CPU tensors "flash" means PyTorch's fused CPU kernel
    (tiled, with a running softmax), not the CUDA FlashAttention library.
    """
    if check_backend(backend) == "auto":
        candidates = [name for name in _priority_order() if _ENABLED[name]()]
    else:
        candidates = [backend]
    for name in candidates:
        with warnings.catch_warnings():
            # A backend that declines explains why in a UserWarning; we expect some to decline.
            warnings.simplefilter("ignore", UserWarning)
            try:
                attention(q, k, v, causal=causal, mask=mask, dropout_p=dropout_p, backend=name)
            except RuntimeError:
                if backend != "auto":
                    raise
                continue
        return name
    raise RuntimeError("no SDPA backend can run these inputs (are they all disabled?)")
