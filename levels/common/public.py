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

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from .sampling import Sampling
from .semantics import positions_of

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


def check_token_id(name: str, value: object, vocab_size: int) -> None:
    """A special token (``bos_id``, ``eos_id``, a stop id) is one integer id in ``[0, V)``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer token id, got {value!r}")
    check_tokens(int(value), int(value), vocab_size, what=name)


def check_draft(draft, draft_tokens: object, use_cache: bool = True) -> None:
    """A draft proposes (a ``propose`` method), ``draft_tokens`` is an integer >= 1 (or None:
    paced, as many a pass as pay), and the model keeps a cache (speculation rolls it back)."""
    if draft is None:
        return
    if not callable(getattr(draft, "propose", None)):
        raise TypeError(f"draft must have a propose(context, k) method, got {type(draft).__name__}")
    paced = draft_tokens is None
    if not paced and (isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or draft_tokens < 1):  # fmt: skip
        raise ValueError(f"draft_tokens must be an integer >= 1 or None (paced), got {draft_tokens!r}")  # fmt: skip
    if not use_cache:
        raise ValueError("speculative decoding (draft=) verifies against the cache: use_cache=True")


def check_fits(length: int, max_new_tokens: int, max_seq_len: int, what: str) -> None:
    if length + max_new_tokens > max_seq_len:
        raise ValueError(f"{what} {length} + max_new_tokens {max_new_tokens} exceeds max_seq_len={max_seq_len}")  # fmt: skip


def generate(model, prefix, max_new_tokens, *, valid=None, use_cache: bool = True,
             temperature: float = 0.0, top_k=None, top_p=None, seed=None, eos_id=None,
             draft=None, draft_tokens: int = 2, counts=None):  # fmt: skip
    """Continue every row of ``prefix (B,P)`` by ``max_new_tokens`` tokens -> ``(B, P + N)``.

    ``valid (B,P)`` marks right-padded prompts of different lengths (None: every token is
    real). Each row continues from its own last real token, at its own positions, and the
    result holds each row's prompt, its continuation, then ``pad_id``: row ``b`` equals that
    row generated alone. ``temperature``, ``top_k``, ``top_p`` and ``seed`` choose the
    tokens (``levels.common.sampling``; greedy by default; row ``b`` draws with ``seed + b``,
    or the ``b``-th of a list of seeds). With ``eos_id`` a row stops after producing it;
    without, every row gets ``max_new_tokens``. ``use_cache=False`` runs each pass over
    everything so far (obviously right, and the same tokens). ``draft``
    (``engine.NGramDraft``, ``engine.ModelDraft``) decodes speculatively, up to
    ``draft_tokens`` guesses a pass: greedy, the same tokens; sampled, the same law;
    ``counts`` (``engine.Counts``) adds up its passes and the guesses made and kept.
    Every argument is checked before the model runs; the decoding is the engine's.
    """
    from engine import Engine, Request

    sampling = Sampling(temperature, top_k, top_p, seed)
    tokens = ids_of(model, prefix, "prefix")  # (B, P)
    check_new_tokens(max_new_tokens)
    B, P = tokens.shape
    lengths = valid_of(model, valid, (B, P)).sum(axis=1)  # (B,) real tokens a prompt
    if eos_id is not None:
        check_token_id("eos_id", eos_id, model.config.vocab_size)
    check_fits(int(lengths.max()), max_new_tokens, model.config.max_seq_len, "prefix length")
    check_draft(draft, draft_tokens, use_cache)
    stops = () if eos_id is None else (int(eos_id),)
    requests = [Request(tokens[b, : lengths[b]].tolist(), max_new_tokens, row, stops, draft=draft,
                        draft_tokens=draft_tokens) for b, row in enumerate(sampling.rows(B))]  # fmt: skip
    engine = Engine(model, cache="level" if use_cache else "none", max_batch=B, counts=counts)
    out = np.full((B, P + max_new_tokens), model.config.pad_id, dtype=np.int64)  # (B, P + N)
    for b, seq in enumerate(engine.generate(requests)):
        out[b, : len(seq.tokens)] = seq.tokens
    return model.arrays.asarray(out, device=model.device)


def stream(model, prompt, max_new_tokens, *, temperature: float = 0.0, top_k=None,
           top_p=None, seed=None, stop_ids=(), draft=None, draft_tokens: int = 2, counts=None,
           constraint=None, prefill_piece=None, on_prefill=None) -> Iterator[int]:  # fmt: skip
    """Continue one prompt ``(P,)`` token by token: yield each new id as soon as it is chosen.

    The tokens are ``generate``'s for the same prompt and options (one row, the same
    sampling), each handed over at once, for a chat that prints them as they come. It ends
    after ``max_new_tokens`` tokens, or after yielding a token of ``stop_ids`` (the model's
    end-of-turn ids); a caller may stop earlier. Arguments are checked before the model
    runs. ``draft``, ``draft_tokens`` and ``counts`` as ``generate``'s (a pass may then
    yield several tokens at once); ``constraint`` (``constrained.Constraint``) masks the
    logits before each choice and takes each token chosen (guesses are checked under it).
    ``prefill_piece``: the prompt goes through the model that many positions a pass, each
    piece against the cache of those before (the same logits as one pass up to rounding,
    exactly at level 0), ``on_prefill(positions done)`` called after each: for a rung that
    takes seconds a token, whose user wants to see the prompt advance. Without a draft.
    """
    from engine import Engine, Request

    sampling = Sampling(temperature, top_k, top_p, seed)
    tokens = ids_of(model, np.asarray(prompt)[None], "prompt")  # (1, P)
    check_new_tokens(max_new_tokens)
    for stop in stop_ids:
        check_token_id("a stop id", stop, model.config.vocab_size)
    check_fits(tokens.shape[1], max_new_tokens, model.config.max_seq_len, "prompt length")
    check_draft(draft, draft_tokens)
    if prefill_piece is not None:
        if isinstance(prefill_piece, bool) or not isinstance(prefill_piece, int | np.integer):
            raise TypeError(f"prefill_piece must be an integer, got {prefill_piece!r}")
        if prefill_piece < 1:
            raise ValueError(f"prefill_piece must be at least 1, got {prefill_piece}")
        if draft is not None:
            raise ValueError("prefill_piece is for plain decoding: give it no draft")
    request = Request(tokens[0].tolist(), max_new_tokens, sampling, tuple(stop_ids),
                      constraint=constraint, draft=draft, draft_tokens=draft_tokens)  # fmt: skip
    engine = Engine(model, counts=counts, prefill_tokens=prefill_piece)
    seq = engine.add(request)
    while seq.finish is None:
        engine.step()
        if on_prefill is not None and (seq.cached < seq.prompt or seq.new == seq.generated):
            on_prefill(min(seq.cached, seq.prompt) if not seq.generated else seq.prompt)
        yield from seq.new


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


def seq2seq_generate(model, src, *, src_valid=None, bos_id=None, eos_id=None,
                     max_new_tokens=None, use_cache: bool = True, temperature: float = 0.0,
                     top_k=None, top_p=None, seed=None):  # fmt: skip
    """Decoding from BOS for every row of ``src (B,S)`` -> ``(B, 1 + n)``; each row stops at
    its EOS, then pads.

    ``n <= max_new_tokens`` is the number of steps until every row has produced EOS;
    ``max_new_tokens`` defaults to ``max_seq_len - 1``, the longest target that fits;
    ``bos_id`` and ``eos_id`` to the config's. ``temperature``, ``top_k``, ``top_p`` and
    ``seed`` choose the tokens as for the decoder-only model (greedy by default). The
    source is encoded once; each step runs the decoder over its newest token against the
    cache, or over the target so far (``use_cache=False``).
    """
    from engine import Engine, Request

    config = model.config
    sampling = Sampling(temperature, top_k, top_p, seed)
    bos_id = config.bos_id if bos_id is None else bos_id
    eos_id = config.eos_id if eos_id is None else eos_id
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        check_token_id(name, value, config.vocab_size)
    max_new_tokens = config.max_seq_len - 1 if max_new_tokens is None else max_new_tokens
    check_new_tokens(max_new_tokens)
    if 1 + max_new_tokens > config.max_seq_len:
        raise ValueError(f"1 + max_new_tokens = {1 + max_new_tokens} exceeds max_seq_len={config.max_seq_len}")  # fmt: skip
    ids = ids_of(model, src, "source tokens")  # (B, S)
    check_length(ids.shape[1], config.max_seq_len, what="source length")
    lengths = valid_of(model, src_valid, ids.shape, "src_valid").sum(axis=1)  # (B,)
    requests = [Request([int(bos_id)], max_new_tokens, row, (int(eos_id),),
                        source=ids[b, : lengths[b]].tolist())
                for b, row in enumerate(sampling.rows(len(ids)))]  # fmt: skip
    engine = Engine(model, cache="level" if use_cache else "none", max_batch=len(ids))
    seqs = engine.generate(requests)
    out = np.full((len(ids), max(len(s.tokens) for s in seqs)), config.pad_id, dtype=np.int64)
    for b, seq in enumerate(seqs):
        out[b, : len(seq.tokens)] = seq.tokens
    return model.arrays.asarray(out, device=model.device)


# ----------------------------------------------------------------------------- the classes


class DecoderOnly:
    """The public methods of every rung's decoder-only model, defined once: a rung's
    ``DecoderOnlyTransformer`` lists this class first among its bases, before its plain
    ``Transformer``, whose ``forward`` it keeps as ``transformer``."""

    logits, forward, prefill, decode_step = logits, forward, prefill, decode_step
    extend, generate, stream = extend, generate, stream


class Seq2Seq:
    """The public methods of every rung's encoder-decoder model, defined once (as
    ``DecoderOnly``, before the rung's ``EncoderDecoder``)."""

    logits, forward, encode = seq2seq_logits, seq2seq_forward, encode
    prefill, decode_step, generate = seq2seq_prefill, seq2seq_decode_step, seq2seq_generate
