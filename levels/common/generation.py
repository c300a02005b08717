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
nothing to generate), with the same messages at every level. Tokens are
chosen by ``levels.common.sampling`` (greedy by default: ties in the argmax
go to the lowest token id) from float64 copies of the logits, so every level
picks the same tokens from the same logits.

Prompts of different lengths share one batch: right-padded, with ``valid``.
The cache holds one slot per step for every row, so a short row's new tokens
sit after its padding; its positions count real tokens only
(``levels.common.boundary``), which is what makes each row equal the row
generated alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import checks
from .sampling import Sampling, pick

Native = Any  # a level's array type (nested lists, np.ndarray, torch.Tensor)
ToNative = Callable[[np.ndarray], Native]
ToNumpy = Callable[[Native], np.ndarray]


def _check_token_id(name: str, value: object, vocab_size: int) -> None:
    """A special token (``bos_id``, ``eos_id``) is one integer id in ``[0, vocab_size)``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer token id, got {value!r}")
    checks.check_tokens(int(value), int(value), vocab_size, what=name)


def generate_decoder_only(
    model: Any,
    prefix: Native,
    max_new_tokens: int,
    *,
    valid: Native | None = None,
    use_cache: bool = True,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | list[int] | None = None,
    eos_id: int | None = None,
    to_native: ToNative | None = None,
    to_numpy: ToNumpy | None = None,
) -> Native:
    """Continue every row of ``prefix (B, P)`` by ``max_new_tokens`` tokens.

    ``valid (B, P)`` marks right-padded prompts of different lengths (None:
    every token is real). Each row continues from its own last real token,
    at its own positions, and the result ``(B, P + max_new_tokens)`` holds
    each row's prompt, its continuation, then ``pad_id``: row ``b`` equals
    that row generated alone. ``temperature``, ``top_k``, ``top_p`` and
    ``seed`` choose the tokens (``levels.common.sampling``; the default is
    greedy). With ``eos_id``, a row stops after producing it and is filled
    with ``pad_id``; without, every row gets ``max_new_tokens`` tokens. The
    longest prompt plus ``max_new_tokens`` must fit in ``max_seq_len``.
    ``to_native`` / ``to_numpy`` default to ``model.ops.asarray`` / ``model.ops.to_numpy``.
    """
    to_native = to_native or model.ops.asarray
    to_numpy = to_numpy or model.ops.to_numpy
    config = model.config
    sampling = Sampling(temperature, top_k, top_p, seed)
    prefix_np = checks.as_numpy(to_numpy, prefix, what="prefix")
    tokens = checks.checked_ids(prefix_np, config.vocab_size, what="prefix")  # (B, P)
    checks.check_new_tokens(max_new_tokens)
    B, P = tokens.shape
    if valid is None:
        lengths = np.full(B, P)  # (B,) real tokens a prompt
    else:
        valid_np = checks.as_numpy(to_numpy, valid, what="valid")
        lengths = np.sum(checks.checked_valid(valid_np, (B, P)), axis=1)
    if eos_id is not None:
        _check_token_id("eos_id", eos_id, config.vocab_size)
    longest = int(lengths.max())
    if longest + max_new_tokens > config.max_seq_len:
        raise ValueError(
            f"prefix length {longest} + max_new_tokens {max_new_tokens} exceeds "
            f"max_seq_len={config.max_seq_len}"
        )
    generators = sampling.generators(B)
    rows = np.arange(B)
    out = np.full((B, P + max_new_tokens), config.pad_id, dtype=np.int64)  # (B, P + N)
    real = np.arange(P)[None, :] < lengths[:, None]  # (B, P)
    out[:, :P] = np.where(real, tokens, config.pad_id)
    tokens = tokens[:, :longest]  # trailing columns of padding only: never computed
    done = np.zeros(B, dtype=bool)

    def next_logits(step: int, cache) -> tuple[np.ndarray, Any]:
        """``(B, V)`` logits of each row's next token, and the cache."""
        if use_cache and step == 0:
            # The logits of each row's last real token only (B, V): the head, the largest
            # product, runs once a row instead of once a prompt position.
            valid = to_native(real[:, :longest])
            logits, cache = model.prefill(to_native(tokens), valid=valid, last_only=True)
            return to_numpy(logits), cache
        if use_cache:
            return to_numpy(model.decode_step(to_native(last_tokens), cache)), cache
        # Without a cache, everything so far, each row right-padded after its own tokens.
        width = longest + step
        seq_valid = np.arange(width)[None, :] < (lengths + step)[:, None]  # (B, width)
        logits = model.forward(to_native(out[:, :width]), valid=to_native(seq_valid))
        return to_numpy(logits)[rows, lengths + step - 1], None

    cache = None
    for step in range(max_new_tokens):
        logits, cache = next_logits(step, cache)  # (B, V)
        last_tokens = np.where(done, config.pad_id, pick(logits, sampling, generators, ~done))
        out[rows, lengths + step] = last_tokens  # (B,); a finished row writes its padding
        if eos_id is not None:
            done |= last_tokens == eos_id
            if done.all():
                break
    return to_native(out)


def stream_decoder_only(
    model: Any,
    prompt: Native,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_ids: tuple[int, ...] = (),
    constraint: Any = None,
    to_native: ToNative | None = None,
    to_numpy: ToNumpy | None = None,
) -> Iterator[int]:
    """Continue one prompt ``(P,)`` token by token: yield each new id as soon as it is chosen.

    The tokens are ``generate``'s for the same prompt and options (one row,
    the KV cache, the same sampling): this is that loop with the batch taken
    out and each token handed over at once, for a chat that prints them as
    they come. The first ``next()`` runs the prefill; each later one a decode
    step. It ends after ``max_new_tokens`` tokens, or after yielding a token
    of ``stop_ids`` (the model's end-of-turn ids); a caller may stop earlier
    (a stop string in the text). Arguments are checked before any model call.
    ``constraint`` (``constrained.Constraint``: ``apply(logits)``, ``advance(token)``)
    masks the logits before each pick and takes each token picked.
    """
    to_native = to_native or model.ops.asarray
    to_numpy = to_numpy or model.ops.to_numpy
    config = model.config
    sampling = Sampling(temperature, top_k, top_p, seed)
    tokens = checks.checked_ids(np.asarray(prompt)[None], config.vocab_size, what="prompt")
    checks.check_new_tokens(max_new_tokens)
    for stop in stop_ids:
        _check_token_id("a stop id", stop, config.vocab_size)
    if tokens.shape[1] + max_new_tokens > config.max_seq_len:
        raise ValueError(
            f"prompt length {tokens.shape[1]} + max_new_tokens {max_new_tokens} exceeds "
            f"max_seq_len={config.max_seq_len}"
        )
    if max_new_tokens == 0:
        return
    generators = sampling.generators(1)
    logits, cache = model.prefill(to_native(tokens), last_only=True)
    last = to_numpy(logits)  # (1, V): the head on the prompt's last position only
    for step in range(max_new_tokens):
        if constraint is not None:
            last = constraint.apply(last)
        token = int(pick(last, sampling, generators)[0])
        if constraint is not None:
            constraint.advance(token)
        yield token
        if token in stop_ids or step == max_new_tokens - 1:
            return
        last = to_numpy(model.decode_step(to_native(np.array([token])), cache))  # (1, V)


def generate_seq2seq(
    model: Any,
    src: Native,
    *,
    src_valid: Native | None = None,
    bos_id: int | None = None,
    eos_id: int | None = None,
    max_new_tokens: int | None = None,
    use_cache: bool = True,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | list[int] | None = None,
    to_native: ToNative | None = None,
    to_numpy: ToNumpy | None = None,
) -> Native:
    """Decode from BOS for every row of ``src (B, S)``; each row stops at its EOS.

    Returns ``(B, 1 + n)`` tokens starting with BOS, where ``n <= max_new_tokens``
    is the number of steps until every row has produced EOS; a finished row is
    filled with ``pad_id`` after its EOS. ``max_new_tokens`` defaults to
    ``max_seq_len - 1``, the longest target that fits; ``bos_id`` and
    ``eos_id`` default to the config's. ``temperature``, ``top_k``, ``top_p``
    and ``seed`` choose the tokens as for the decoder-only model (greedy by default).
    """
    to_native = to_native or model.ops.asarray
    to_numpy = to_numpy or model.ops.to_numpy
    config = model.config
    sampling = Sampling(temperature, top_k, top_p, seed)
    bos_id = config.bos_id if bos_id is None else bos_id
    eos_id = config.eos_id if eos_id is None else eos_id
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        _check_token_id(name, value, config.vocab_size)
    max_new_tokens = config.max_seq_len - 1 if max_new_tokens is None else max_new_tokens
    checks.check_new_tokens(max_new_tokens)
    if 1 + max_new_tokens > config.max_seq_len:
        raise ValueError(
            f"1 + max_new_tokens = {1 + max_new_tokens} exceeds max_seq_len={config.max_seq_len}"
        )
    src_np = checks.as_numpy(to_numpy, src, what="source tokens")
    ids = checks.checked_ids(src_np, config.vocab_size, what="source tokens")  # (B, S)
    checks.check_length(ids.shape[1], config.max_seq_len, what="source length")
    if src_valid is not None:  # checked whole before the first step (the encoder checks it too)
        src_valid_np = checks.as_numpy(to_numpy, src_valid, what="src_valid")
        checks.checked_valid(src_valid_np, ids.shape, what="src_valid")
    B = ids.shape[0]
    generators = sampling.generators(B)
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
        nxt = np.where(done, pad, pick(last, sampling, generators, ~done))
        done |= nxt == eos_id
        out = np.concatenate([out, nxt[:, None]], axis=1)
    return to_native(out)
