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
  over long sequences ``windowed.py`` cuts the queries into chunks so that the
  cost grows with ``T * W``, not ``T * S``;
* it does not return the log-sum-exp: ``lse.py`` gets it from the same fused
  CPU kernel SDPA runs (``return_lse=True``).

Grouped-query attention is SDPA's own (``enable_gqa=True``): the kernels read
each key/value head for its whole group of query heads, without copies.

Which kernel runs is SDPA's choice among the enabled backends, in PyTorch's
priority order. ``backend=`` narrows the choice to one backend through
``torch.nn.attention.sdpa_kernel``; ``which_backend`` reports the choice.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalBias, causal_lower_right

from ..common.checks import EMPTY_ROW_MESSAGE, rows_without_keys, window_binds
from ..level2_torch_manual import attention as written_out
from ..level2_torch_manual.attention import allowed_keys, as_4d, check_inputs
from .lse import attention_with_lse
from .windowed import attention_in_chunks, chunking_pays

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
    checked: bool = False,
) -> tuple[torch.Tensor | CausalBias | None, bool]:
    """Translate the ladder's ``(causal, mask, window)`` into SDPA's ``(attn_mask, is_causal)``.

    Validates shapes and the mask (unless the caller has: ``checked=True``), and
    raises ``ValueError`` for a query row with no allowed key, so SDPA never
    sees one. Returns what to pass as ``attn_mask`` (a boolean mask, True = may
    attend, broadcastable to ``(B,H,T,S)``; a lower-right ``CausalBias``; or
    ``None``) and whether to set SDPA's (top-left) ``is_causal``.
    """
    if not checked:
        check_inputs(q, k, v, mask, window=window)
    T, S = q.shape[-2], k.shape[-2]
    if window is not None and not window_binds(T, S, causal=causal, window=window):
        window = None  # a window wider than the sequence changes nothing
    if mask is not None:
        mask = as_4d(mask.to(q.device))  # SDPA wants the leading axes spelled out
        if bool(mask.all()):
            # A mask that hides nothing is dropped: fused kernels that take no
            # mask at all (flash on CUDA) stay eligible, e.g. for unpadded decoding.
            mask = None
    if mask is not None or window is not None:
        # Padding or a window (and maybe causal): one explicit boolean mask,
        # checked for empty rows.
        return allowed_keys(q, k, v, causal=causal, mask=mask, window=window), False
    if not causal:
        return None, False
    if rows_without_keys(T, S, causal=True, window=None):
        raise ValueError(EMPTY_ROW_MESSAGE)  # T > S: the first T - S queries would see no key
    if T == S:
        return None, True  # top-left and bottom-right coincide: SDPA's fast causal path
    if T == 1:
        return None, False  # j <= 0 + S - 1 holds for every key: nothing to mask
    # 1 < T < S (a chunk of queries after cached keys): PyTorch's lower-right
    # causal bias. On CUDA it runs flash / efficient kernels with the
    # bottom-right rule built in (subject to the same sdpa_kernel switches);
    # elsewhere it materialises the (T, S) mask and calls SDPA with it.
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
    B, H, T, S, _, _ = check_inputs(q, k, v, mask, scale=scale, window=window)
    if return_lse:
        if dropout_p > 0.0:
            raise ValueError("return_lse with attention dropout is not supported")
        if q.device.type != "cpu":  # the fused kernel lse.py calls is the CPU one
            kw = {"causal": causal, "mask": mask, "scale": scale, "window": window}
            return written_out(q, k, v, **kw, return_lse=True)
        attn_mask, is_causal = sdpa_mask(
            q, k, v, causal=causal, mask=mask, window=window, checked=True
        )
        return attention_with_lse(q, k, v, attn_mask, is_causal, scale=scale)
    if window is not None and chunking_pays(T, S, window):
        return attention_in_chunks(
            q, k, v, causal=causal, mask=mask, scale=scale, window=window,
            call=lambda *args, **kw: sdpa(*args, **kw, dropout_p=dropout_p, backend=backend),
        )  # fmt: skip
    attn_mask, is_causal = sdpa_mask(q, k, v, causal=causal, mask=mask, window=window, checked=True)
    return sdpa(
        q, k, v, attn_mask, is_causal, scale=scale, dropout_p=dropout_p, backend=backend
    )  # (B,H,T,Dv)


def _priority_order() -> list[str]:
    """Backend names in the order SDPA tries them."""
    try:
        order = [SDPBackend(i) for i in torch._C._get_sdp_priority_order()]
    except (AttributeError, TypeError, ValueError):
        # Older builds without the query: PyTorch's documented default order.
        order = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    names = {b: name for name, b in BACKENDS.items()}
    return [names[b] for b in order if b in names]


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
