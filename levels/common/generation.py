"""Greedy generation, written once for every level.

A level supplies its model and two converters; the loop itself works on numpy
token arrays, so the only per-level work inside it is the model call. The loop
asks the model for logits in one of two ways:

* ``use_cache=False``: run the full ``forward`` over everything generated so
  far and read the last position (quadratic in the length, but obviously right);
* ``use_cache=True``: ``prefill`` the prefix once, then feed one token at a
  time to ``decode_step``, which attends over the KV cache.

The two must give identical tokens; the test suite holds every level to that.
Ties in the argmax go to the lowest token id (``np.argmax``'s rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Native = Any  # a level's array type (nested lists, np.ndarray, torch.Tensor)


def _pick(logits_last: np.ndarray) -> np.ndarray:
    """Greedy choice from ``(B, V)`` logits -> ``(B,)`` int64 token ids."""
    return np.asarray(logits_last).argmax(axis=-1).astype(np.int64)


def greedy_decoder_only(
    model: Any,
    prefix: Native,
    max_new_tokens: int,
    *,
    use_cache: bool,
    to_native: Callable[[np.ndarray], Native],
    to_numpy: Callable[[Native], np.ndarray],
) -> Native:
    """Extend every row of ``prefix (B, P)`` by ``max_new_tokens`` greedy tokens.

    Every prefix token is taken as real (``valid`` all True): batched prompts of
    different lengths would need left padding, which the right-padding
    convention of this project does not cover, so generate those one row at a time.
    Returns ``(B, P + max_new_tokens)`` in the level's native type.
    """
    tokens = np.asarray(to_numpy(prefix)).astype(np.int64)  # (B, P)
    if tokens.ndim != 2 or tokens.shape[1] == 0:
        raise ValueError(
            f"prefix must be a non-empty (B, P) array of token ids, got {tokens.shape}"
        )
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    B, P = tokens.shape
    total = P + max_new_tokens
    if total > model.config.max_seq_len:
        raise ValueError(
            f"prefix length {P} + max_new_tokens {max_new_tokens} exceeds "
            f"max_seq_len={model.config.max_seq_len}"
        )
    if max_new_tokens == 0:
        return to_native(tokens)

    def all_valid(n: int) -> Native:
        return to_native(np.ones((B, n), dtype=bool))

    if use_cache:
        logits, cache = model.prefill(to_native(tokens), valid=all_valid(P))
        nxt = _pick(to_numpy(logits)[:, -1])  # (B,)
        out = [tokens, nxt[:, None]]
        for _ in range(max_new_tokens - 1):
            nxt = _pick(to_numpy(model.decode_step(to_native(nxt), cache)))
            out.append(nxt[:, None])
        return to_native(np.concatenate(out, axis=1))

    for _ in range(max_new_tokens):
        logits = model.forward(to_native(tokens), valid=all_valid(tokens.shape[1]))
        nxt = _pick(to_numpy(logits)[:, -1])
        tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
    return to_native(tokens)


def greedy_seq2seq(
    model: Any,
    src: Native,
    *,
    src_valid: Native | None,
    bos_id: int,
    eos_id: int,
    max_new_tokens: int,
    use_cache: bool,
    to_native: Callable[[np.ndarray], Native],
    to_numpy: Callable[[Native], np.ndarray],
) -> Native:
    """Decode greedily from BOS for every row of ``src (B, S)``; each row stops at its EOS.

    Returns ``(B, 1 + n)`` tokens starting with BOS, where ``n <= max_new_tokens``
    is the number of steps until every row has produced EOS. A row that has
    finished is filled with ``pad_id`` after its EOS.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if 1 + max_new_tokens > model.config.max_seq_len:
        raise ValueError(
            f"1 + max_new_tokens = {1 + max_new_tokens} exceeds max_seq_len={model.config.max_seq_len}"
        )
    B = len(src)  # rows of (B, S): nested lists, arrays and tensors all answer len()
    pad = model.config.pad_id
    out = np.full((B, 1), bos_id, dtype=np.int64)  # (B, 1)
    done = np.zeros(B, dtype=bool)
    cache = None
    for _ in range(max_new_tokens):
        if done.all():
            break
        if use_cache and cache is None:
            logits, cache = model.prefill(
                src,
                to_native(out),
                src_valid=src_valid,
                tgt_valid=to_native(np.ones_like(out, bool)),
            )
            last = to_numpy(logits)[:, -1]
        elif use_cache:
            last = to_numpy(model.decode_step(to_native(out[:, -1]), cache))
        else:
            logits = model.forward(
                src,
                to_native(out),
                src_valid=src_valid,
                tgt_valid=to_native(np.ones_like(out, bool)),
            )
            last = to_numpy(logits)[:, -1]
        nxt = np.where(done, pad, _pick(last))
        done |= nxt == eos_id
        out = np.concatenate([out, nxt[:, None]], axis=1)
    return to_native(out)
