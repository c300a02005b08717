"""The public methods of every rung's models: a thin checked layer over the plain model.

A rung's model file holds the transformer itself, ``Transformer.forward(ids, positions,
cache=None)``: token ids and each token's position in, logits out, its inputs trusted.
The methods a user calls (``forward(tokens, *, valid=None)``, ``prefill``,
``decode_step``, ``extend``, ``generate``, ``stream``; the seq2seq model's) are the
functions below, which every rung's public class takes as its methods. Each one:

1. reads its inputs as numpy and checks them against the error table of
   docs/conventions.md (token ids in ``[0, V)``, ``valid`` right-padded with a real
   token in every row, lengths and the cache's room), before any state changes;
2. makes the positions: ``cumsum(valid) - 1`` at the real tokens and ``-1`` at the
   padding, counted on from where the cache's rows stand (``cache.next_positions()``);
3. calls the plain pass, as ``model.transformer`` (the name under which the public
   class keeps ``Transformer.forward``, since its own ``forward`` is this layer's);
4. zeroes the outputs at the padded positions.

What a model gives these functions: ``config``; the plain pass ``transformer(ids,
positions, cache=None, last=False)`` (seq2seq: ``memory(src, positions)`` for the encoder
and ``transformer(ids, positions, memory, memory_positions, cache=None)`` for the
decoder); ``new_cache(batch)``; and ``arrays``, the rung's array functions (``asarray(np,
device=)``, ``to_numpy``, ``zero_padded``, ``inference``), with its ``device``.

Engines (the generation loops, level 3's compiled step, the server) call the plain pass
themselves, with positions they hold: they check their inputs once, not every step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

LEFT_PADDING_MESSAGE = (
    "a sequence is not right-padded (a real token after padding): its real tokens come "
    "first, then the padding"
)
NO_VALID_TOKEN_MESSAGE = "a sequence has no valid token (every position is padding)"
SHAPE_NAMES = {1: "(B,)", 2: "(B, T)"}


# ----------------------------------------------------------------------------- the checks


RAGGED_MESSAGE = "{what}: rows of different lengths (not a (B, T) array)"


def as_numpy(to_numpy: Callable, x, *, what: str) -> np.ndarray:
    """``x`` (a level's array, numpy, or nested lists) as numpy, by the level's ``to_numpy``;
    rows of different lengths are refused with one message at every level."""
    try:
        return np.asarray(to_numpy(x))
    except ValueError:  # numpy: an inhomogeneous shape
        raise ValueError(RAGGED_MESSAGE.format(what=what)) from None


def outside(bad: int, vocab_size: int, what: str) -> ValueError:
    """The error of a token id outside ``[0, vocab_size)``."""
    return ValueError(f"{what} {bad} is outside [0, vocab_size={vocab_size})")


def check_tokens(lo: int, hi: int, vocab_size: int, *, what: str = "token id") -> None:
    """Token ids must lie in ``[0, vocab_size)``; a kernel must never gather out of bounds."""
    if lo < 0 or hi >= vocab_size:
        raise outside(lo if lo < 0 else hi, vocab_size, what)


def ids_of(model, tokens, what: str = "tokens", ndim: int = 2) -> np.ndarray:
    """``tokens`` (any array or nested lists) checked, as int64 numpy: ``ndim`` axes, none
    empty, integer ids in ``[0, V)`` (a kernel must never gather out of bounds)."""
    try:
        ids = np.asarray(model.arrays.to_numpy(tokens))
    except ValueError:  # numpy: an inhomogeneous shape
        raise ValueError(RAGGED_MESSAGE.format(what=what)) from None
    if ids.ndim != ndim or 0 in ids.shape:
        raise ValueError(f"{what} must be a non-empty {SHAPE_NAMES[ndim]} array of token ids, got shape {ids.shape}")  # fmt: skip
    if ids.dtype.kind not in "iu":  # named as the caller's (numpy's copy of bfloat16 is float32)
        name = str(getattr(tokens, "dtype", ids.dtype)).replace("torch.", "")
        raise TypeError(f"{what} must be integer token ids, got dtype {name}")
    lo, hi, V = int(ids.min()), int(ids.max()), model.config.vocab_size
    if lo < 0 or hi >= V:
        raise outside(lo if lo < 0 else hi, V, f"{what}: token id")
    return ids.astype(np.int64)


def check_length(length: int, max_seq_len: int, *, what: str = "sequence length") -> None:
    if length > max_seq_len:
        raise ValueError(f"{what} {length} exceeds max_seq_len={max_seq_len}")
    if length <= 0:
        raise ValueError(f"{what} must be positive, got {length}")


def check_position_offset(offset: object, T: int, max_seq_len: int) -> None:
    """``position_offset`` of a forward: an integer >= 0 with ``offset + T <= max_seq_len``."""
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise TypeError(f"position_offset must be an integer, got {offset!r}")
    if offset < 0 or offset + T > max_seq_len:
        raise ValueError(f"position_offset must be >= 0 with position_offset + length <= max_seq_len={max_seq_len}, got {offset} + {T}")  # fmt: skip


def check_batch(got: int, expected: int, *, what: str) -> None:
    """Two inputs of one call must have the same number of rows."""
    if got != expected:
        raise ValueError(f"{what}: got {got} rows for a batch of {expected}")


def check_room(cache, batch: int, adding: int, what: str) -> None:
    """``cache`` holds ``batch`` rows and has room for ``adding`` more slots: checked
    *before* anything is written, so a refused step leaves the cache as it was."""
    if batch != cache.batch:
        check_batch(batch, cache.batch, what=f"{what} for this cache")
    if cache.length + adding > cache.capacity:
        raise ValueError(f"KV cache overflow: {cache.length} positions filled + {adding} new > capacity {cache.capacity} (max_seq_len); the cache was left unchanged")  # fmt: skip


def check_valid_shape(
    valid_shape: Sequence[int], tokens_shape: Sequence[int], is_bool: bool, *, what: str = "valid"
) -> None:
    if not is_bool:
        raise TypeError(f"{what} must be a boolean (B, T) mask, True = real token")
    if tuple(valid_shape) != tuple(tokens_shape):
        raise ValueError(
            f"{what} has shape {tuple(valid_shape)}, tokens have {tuple(tokens_shape)}"
        )


def checked_valid(valid: np.ndarray, shape: Sequence[int], *, what: str = "valid") -> np.ndarray:
    """``valid (B, T)``, checked: boolean, of the tokens' shape, a real token in every row,
    and its padding last (sequences are right-padded)."""
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
    return valid


def valid_of(model, valid, shape, what: str = "valid") -> np.ndarray:
    """``valid`` for tokens of ``shape (B, T)``, checked, as numpy; None: every token real."""
    if valid is None:
        return np.ones(shape, dtype=bool)
    return checked_valid(as_numpy(model.arrays.to_numpy, valid, what=what), shape, what=what)


def check_new_tokens(max_new_tokens: object) -> int:
    """``max_new_tokens`` of ``generate``: an integer >= 0."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    return max_new_tokens


# ----------------------------------------------------------------------------- positions


def positions_of(valid: np.ndarray, start=0) -> np.ndarray:
    """Each token's position: ``valid (B,T)`` right-padded -> ``(B,T)`` int64, counting
    ``start, start + 1, ...`` over a row's real tokens and ``-1`` at its padding;
    ``start`` an int, or one per row ``(B,)`` (where each row of a cache stands)."""
    counted = np.cumsum(valid, axis=1) - 1 + np.asarray(start, dtype=np.int64)[..., None]
    return np.where(valid, counted, -1)


def _native(model, *arrays: np.ndarray) -> tuple:
    """Numpy arrays in the model's own arrays, on its device."""
    return tuple(model.arrays.asarray(a, device=model.device) for a in arrays)


def _zeroed(model, logits, real: np.ndarray):
    """Logits ``(B,T,V)`` exactly zero at the padded positions."""
    return logits if real.all() else model.arrays.zero_padded(logits, real)


# ----------------------------------------------------------------------------- decoder-only


def logits(model, tokens, *, valid=None, position_offset: int = 0):
    """``(logits (B,T,V), valid (B,T))`` of ``tokens (B,T)``, the padded positions not zeroed
    (for training); ``position_offset``: the first token's position (a shard of a longer
    sequence, ``levels.parallel``)."""
    ids = ids_of(model, tokens)
    check_position_offset(position_offset, ids.shape[1], model.config.max_seq_len)
    real = valid_of(model, valid, ids.shape)
    positions = positions_of(real, position_offset)
    return model.transformer(*_native(model, ids, positions)), real


def forward(model, tokens, *, valid=None, position_offset: int = 0):
    """``tokens (B,T)`` ints, ``valid (B,T)`` bool (default: every token real) -> logits
    ``(B,T,V)``, zero at the padded positions; ``position_offset`` as ``logits``'."""
    return _zeroed(model, *logits(model, tokens, valid=valid, position_offset=position_offset))


def prefill(model, tokens, *, valid=None, last_only: bool = False):
    """Run the prompt ``tokens (B,T)`` into a new cache -> ``(logits (B,T,V), cache)``;
    ``last_only``: the logits of each row's last real token only, ``(B,V)``."""
    ids = ids_of(model, tokens)
    real = valid_of(model, valid, ids.shape)
    check_length(ids.shape[1], model.config.max_seq_len, what="tokens length")
    cache = model.new_cache(len(ids))
    out = model.transformer(*_native(model, ids, positions_of(real)), cache, last=last_only)
    return (model.arrays.last_position(out) if last_only else _zeroed(model, out, real)), cache


def decode_step(model, tokens, cache):
    """Append one token per row, ``tokens (B,)``, to ``cache`` in place -> logits ``(B,V)``."""
    ids = ids_of(model, tokens, ndim=1)[:, None]  # (B,) -> (B,1)
    check_room(cache, len(ids), 1, "tokens")  # raises before anything is written
    positions = cache.next_positions()[:, None]  # (B,1): each row's next position
    ids, positions = (model.arrays.asarray(a, device=cache.device) for a in (ids, positions))
    return model.arrays.last_position(model.transformer(ids, positions, cache))  # (B,V)


def extend(model, tokens, cache, *, valid=None, last_only: bool = False):
    """Append ``tokens (B,T)`` to ``cache`` in place, as ``prefill`` would have taken them after
    the cache's positions -> logits ``(B,T,V)``, or ``(B,V)`` at each row's last real token
    with ``last_only``: a long prompt in pieces, or a prompt after a prefix already cached."""
    ids = ids_of(model, tokens)
    real = valid_of(model, valid, ids.shape)
    check_room(cache, len(ids), ids.shape[1], "tokens")
    positions = positions_of(real, cache.next_positions())
    out = model.transformer(*_native(model, ids, positions), cache, last=last_only)
    return model.arrays.last_position(out) if last_only else _zeroed(model, out, real)


def generate(model, prefix, max_new_tokens, **options):
    """Continue ``prefix (B,P)`` -> ``(B, P + max_new_tokens)``; greedy by default.

    ``options``: ``valid``, ``use_cache``, ``temperature``, ``top_k``, ``top_p``, ``seed``,
    ``eos_id``, as ``levels.common.generation.generate_decoder_only`` takes them.
    """
    from .generation import generate_decoder_only

    return generate_decoder_only(model, prefix, max_new_tokens, **options)


def stream(model, prompt, max_new_tokens, **options):
    """Continue one prompt ``(P,)``, yielding each new token id as it is chosen (greedy by
    default); ``options`` as ``levels.common.generation.stream_decoder_only`` takes them."""
    from .generation import stream_decoder_only

    return stream_decoder_only(model, prompt, max_new_tokens, **options)


# ----------------------------------------------------------------------------- seq2seq


def _source(model, src, src_valid):
    """Checked source ids and their positions, in the model's arrays."""
    ids = ids_of(model, src, "source tokens")
    real = valid_of(model, src_valid, ids.shape, "src_valid")
    check_length(ids.shape[1], model.config.max_seq_len, what="source length")
    return _native(model, ids, positions_of(real))


def _pair(model, src, tgt_in, src_valid, tgt_valid):
    """Both sequences checked, the target first (bad target input fails before the source
    is encoded) -> the source's ids and positions, the target's, and its ``valid``."""
    tgt = ids_of(model, tgt_in, "target tokens")
    real = valid_of(model, tgt_valid, tgt.shape, "tgt_valid")
    check_length(tgt.shape[1], model.config.max_seq_len, what="target length")
    src, src_positions = _source(model, src, src_valid)
    check_batch(len(real), len(src), what="target tokens for this source")
    return src, src_positions, *_native(model, tgt, positions_of(real)), real


def seq2seq_logits(model, src, tgt_in, *, src_valid=None, tgt_valid=None):
    """``(logits (B,T,V), tgt_valid (B,T))`` without zeroing the padded targets (for training)."""
    src, src_positions, tgt, positions, real = _pair(model, src, tgt_in, src_valid, tgt_valid)
    memory = model.memory(src, src_positions)  # (B,S,D)
    return model.transformer(tgt, positions, memory, src_positions), real


def seq2seq_forward(model, src, tgt_in, *, src_valid=None, tgt_valid=None):
    """``src (B,S)``, ``tgt_in (B,T)`` -> teacher-forced logits ``(B,T,V)``, zero at padded targets."""
    out, real = seq2seq_logits(model, src, tgt_in, src_valid=src_valid, tgt_valid=tgt_valid)
    return _zeroed(model, out, real)


def encode(model, src, *, src_valid=None):
    """``src (B,S)`` ids, ``src_valid (B,S)`` (default: every token is real) -> memory ``(B,S,D)``."""
    return model.memory(*_source(model, src, src_valid))


def seq2seq_prefill(model, src, tgt_in, *, src_valid=None, tgt_valid=None):
    """Encode ``src`` once and run ``tgt_in (B,T)`` into a new cache: ``(logits (B,T,V), cache)``.
    The cache keeps each decoder layer's cross-attention keys and values (of the encoded
    source), the source's positions, and its self-attention keys and values."""
    src, src_positions, tgt, positions, real = _pair(model, src, tgt_in, src_valid, tgt_valid)
    cache = model.new_cache(len(real))
    cache.memory_positions = src_positions  # what each later step's cross-attention sees
    out = model.transformer(tgt, positions, model.memory(src, src_positions), src_positions, cache)
    return _zeroed(model, out, real), cache


def seq2seq_decode_step(model, tokens, cache):
    """Append one target position per row, ``tokens (B,)``, to ``cache`` -> logits ``(B,V)``."""
    ids = ids_of(model, tokens, "target tokens", ndim=1)[:, None]  # (B,1)
    check_room(cache, len(ids), 1, "target tokens")
    positions = cache.next_positions()[:, None]  # (B,1)
    ids, positions = _native(model, ids, positions)
    logits = model.transformer(ids, positions, None, cache.memory_positions, cache)  # (B,1,V)
    return model.arrays.last_position(logits)  # (B,V)


def seq2seq_generate(model, src, **options):
    """Decoding from BOS -> ``(B, 1 + n)``; each row stops at its EOS, then pads.

    ``options``: ``src_valid``, ``bos_id``, ``eos_id``, ``max_new_tokens`` (default
    ``max_seq_len - 1``, the longest target that fits), ``use_cache``, ``temperature``,
    ``top_k``, ``top_p``, ``seed``, as ``levels.common.generation.generate_seq2seq`` takes them.
    """
    from .generation import generate_seq2seq

    return generate_seq2seq(model, src, **options)
