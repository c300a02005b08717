"""Generation, written once for every level.

A level's ``generate`` hands this loop its model and two converters; the loop
itself works on numpy token arrays, so the only per-level work inside it is
the model call. It asks the model for logits in one of two ways:

* ``use_cache=False``: run the full ``forward`` over everything generated so
  far and read the last position (quadratic in the length, but obviously right);
* ``use_cache=True``: ``prefill`` the prefix once, then feed one token at a
  time to ``decode_step``, which attends over the KV cache.

The two must give identical tokens; the test suite holds every level to that.
Every argument is checked before the first model call (also when there is
nothing to generate), with the same messages at every level. Ties in the
argmax go to the lowest token id (``np.argmax``'s rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import checks

Native = Any  # a level's array type (nested lists, np.ndarray, torch.Tensor)
ToNative = Callable[[np.ndarray], Native]
ToNumpy = Callable[[Native], np.ndarray]


def _pick(logits_last: np.ndarray) -> np.ndarray:
    """Greedy choice from ``(B, V)`` logits -> ``(B,)`` int64 token ids."""
    return np.asarray(logits_last).argmax(axis=-1).astype(np.int64)


def checked_ids(tokens: np.ndarray, vocab_size: int, what: str) -> np.ndarray:
    """``tokens (B, L)`` as int64 after the model boundary's checks (shape, dtype, range)."""
    tokens = np.asarray(tokens)
    checks.check_token_ids(
        tokens.shape,
        tokens.dtype.kind,
        tokens.dtype,
        lambda: (int(tokens.min()), int(tokens.max())),
        vocab_size,
        what=what,
    )
    return tokens.astype(np.int64)


def generate_decoder_only(
    model: Any,
    prefix: Native,
    max_new_tokens: int,
    *,
    use_cache: bool,
    to_native: ToNative | None = None,
    to_numpy: ToNumpy | None = None,
) -> Native:
    """Extend every row of ``prefix (B, P)`` by ``max_new_tokens`` greedy tokens.

    Every prefix token is taken as real (``valid`` all True).
    Returns ``(B, P + max_new_tokens)`` in the level's native type.
    ``to_native`` / ``to_numpy`` default to ``model.ops.asarray`` / ``model.ops.to_numpy``.
    """
    to_native = to_native or model.ops.asarray
    to_numpy = to_numpy or model.ops.to_numpy
    config = model.config
    tokens = checked_ids(to_numpy(prefix), config.vocab_size, "prefix")  # (B, P)
    checks.check_new_tokens(max_new_tokens)
    B, P = tokens.shape
    if P + max_new_tokens > config.max_seq_len:
        raise ValueError(
            f"prefix length {P} + max_new_tokens {max_new_tokens} exceeds "
            f"max_seq_len={config.max_seq_len}"
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


def generate_seq2seq(
    model: Any,
    src: Native,
    *,
    src_valid: Native | None = None,
    bos_id: int | None = None,
    eos_id: int | None = None,
    max_new_tokens: int | None = None,
    use_cache: bool,
    to_native: ToNative | None = None,
    to_numpy: ToNumpy | None = None,
) -> Native:
    """Decode greedily from BOS for every row of ``src (B, S)``; each row stops at its EOS.

    Returns ``(B, 1 + n)`` tokens starting with BOS, where ``n <= max_new_tokens``
    is the number of steps until every row has produced EOS; a finished row is
    filled with ``pad_id`` after its EOS. ``max_new_tokens`` defaults to
    ``max_seq_len - 1``, the longest target that fits; ``bos_id`` and
    ``eos_id`` default to the config's.
    """
    to_native = to_native or model.ops.asarray
    to_numpy = to_numpy or model.ops.to_numpy
    config = model.config
    bos_id = config.bos_id if bos_id is None else bos_id
    eos_id = config.eos_id if eos_id is None else eos_id
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an integer token id, got {value!r}")
        checks.check_tokens(int(value), int(value), config.vocab_size, what=name)
    max_new_tokens = config.max_seq_len - 1 if max_new_tokens is None else max_new_tokens
    checks.check_new_tokens(max_new_tokens)
    if 1 + max_new_tokens > config.max_seq_len:
        raise ValueError(
            f"1 + max_new_tokens = {1 + max_new_tokens} exceeds max_seq_len={config.max_seq_len}"
        )
    ids = checked_ids(to_numpy(src), config.vocab_size, "source tokens")  # (B, S)
    checks.check_length(ids.shape[1], config.max_seq_len, what="source length")
    if src_valid is not None:
        valid = np.asarray(to_numpy(src_valid))
        checks.check_valid_shape(valid.shape, ids.shape, valid.dtype == np.bool_, what="src_valid")
    B = ids.shape[0]
    pad = config.pad_id
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
