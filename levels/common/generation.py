"""Generation, written once for every level: loops over the plain model.

A level's ``generate`` (``levels.common.public``) hands this loop its model. The loop
checks every argument once, before the first model call (also when there is nothing to
generate), with the same messages at every level, then calls the plain pass
``model.transformer(ids, positions, cache)`` itself, with positions it keeps: each
row's next position is its prompt's real length plus the tokens it has taken. It asks
for logits in one of two ways:

* ``use_cache=False``: run the pass over everything generated so far and read each
  row's last real position (quadratic in the length, but obviously right);
* ``use_cache=True``: run the prompt once into a new cache, then one token a row at a
  time against it.

The two must give identical tokens; the test suite holds every level to that. Tokens
are chosen by ``levels.common.sampling`` (greedy by default: ties in the argmax go to
the lowest token id) from float64 copies of the logits, so every level picks the same
tokens from the same logits.

Prompts of different lengths share one batch: right-padded, with ``valid``. A short
row's padding takes cache slots with position ``-1`` (never seen) and its new tokens
come after them at the positions after its own last real token, which is what makes
each row equal the row generated alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from . import public, speculative
from .sampling import Sampling, pick

Native = Any  # a level's array type (nested lists, np.ndarray, torch.Tensor)


def _check_token_id(name: str, value: object, vocab_size: int) -> None:
    """A special token (``bos_id``, ``eos_id``) is one integer id in ``[0, vocab_size)``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an integer token id, got {value!r}")
    public.check_tokens(int(value), int(value), vocab_size, what=name)


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
    draft: speculative.Draft | None = None,
    draft_tokens: int = 2,
    counts: speculative.Counts | None = None,
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

    ``draft`` (``levels.common.speculative``: an ``NGramDraft``, a ``ModelDraft``)
    decodes speculatively, up to ``draft_tokens`` guesses a pass: greedy, the same tokens
    as without it; sampled, the same law. ``counts`` (a ``speculative.Counts``) adds up
    its passes and the tokens drafted and kept.
    """
    config = model.config
    sampling = Sampling(temperature, top_k, top_p, seed)
    tokens = public.ids_of(model, prefix, "prefix")  # (B, P)
    public.check_new_tokens(max_new_tokens)
    B, P = tokens.shape
    real = public.valid_of(model, valid, (B, P))  # (B, P)
    lengths = real.sum(axis=1)  # (B,) real tokens a prompt: each row's next position
    if eos_id is not None:
        _check_token_id("eos_id", eos_id, config.vocab_size)
    longest = int(lengths.max())
    if longest + max_new_tokens > config.max_seq_len:
        raise ValueError(
            f"prefix length {longest} + max_new_tokens {max_new_tokens} exceeds "
            f"max_seq_len={config.max_seq_len}"
        )
    _check_draft(draft, draft_tokens, use_cache)
    generators = sampling.generators(B)
    out = np.full((B, P + max_new_tokens), config.pad_id, dtype=np.int64)  # (B, P + N)
    out[:, :P] = np.where(real, tokens, config.pad_id)
    real = real[:, :longest]  # trailing columns of padding only: never computed
    done = np.zeros(B, dtype=bool)
    native, to_numpy = _converters(model)
    if draft is not None and max_new_tokens:
        stops = () if eos_id is None else (eos_id,)
        passes = speculative.speculate(model, out[:, :longest], lengths, max_new_tokens, draft=draft, k=draft_tokens,
                                       sampling=sampling, generators=generators, stop_ids=stops, counts=counts)  # fmt: skip
        made = np.zeros(B, dtype=np.int64)  # each row's new tokens so far
        for new in passes:
            for b, tokens in enumerate(new):
                out[b, lengths[b] + made[b] : lengths[b] + made[b] + len(tokens)] = tokens
                made[b] += len(tokens)
        return native(out)

    def pass_(ids: np.ndarray, positions: np.ndarray, cache=None, last=True) -> np.ndarray:
        """``(B, V)`` logits, float64 numpy, of each row's last real position (or of the
        single new one)."""
        logits = model.transformer(native(ids), native(positions), cache, last=last)
        return to_numpy(logits)[:, -1].astype(np.float64)

    with model.arrays.inference():
        cache = model.new_cache(B) if use_cache and max_new_tokens else None
        for step in range(max_new_tokens):
            if cache is None:  # everything so far, each row right-padded after its own tokens
                width = longest + step
                seen = np.arange(width)[None, :] < (lengths + step)[:, None]  # (B, width)
                logits = pass_(out[:, :width], public.positions_of(seen))
            elif step == 0:  # the prompt; the head runs on each row's last real token only
                logits = pass_(out[:, :longest], public.positions_of(real), cache)
            else:  # each row's newest token, at the position after its last
                newest = (lengths + step - 1)[:, None]  # (B, 1): its place in out, and position
                logits = pass_(np.take_along_axis(out, newest, 1), newest, cache, last=False)
            chosen = np.where(done, config.pad_id, pick(logits, sampling, generators, ~done))
            out[np.arange(B), lengths + step] = chosen  # (B,); a finished row writes its padding
            if eos_id is not None:
                done |= chosen == eos_id
                if done.all():
                    break
    return native(out)


def _check_draft(draft, draft_tokens: object, use_cache: bool) -> None:
    """A draft proposes (a ``propose`` method), ``draft_tokens`` is an integer >= 1, and the
    target keeps a cache (speculation rolls it back)."""
    if draft is None:
        return
    if not callable(getattr(draft, "propose", None)):
        raise TypeError(f"draft must have a propose(context, k) method, got {type(draft).__name__}")
    if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or draft_tokens < 1:
        raise ValueError(f"draft_tokens must be an integer >= 1, got {draft_tokens!r}")
    if not use_cache:
        raise ValueError("speculative decoding (draft=) verifies against the cache: use_cache=True")


def _converters(model):
    """The model's conversions: numpy to its arrays on its device, and back."""

    def native(array: np.ndarray) -> Native:
        return model.arrays.asarray(array, device=model.device)

    return native, model.arrays.to_numpy


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
    draft: speculative.Draft | None = None,
    draft_tokens: int = 2,
    counts: speculative.Counts | None = None,
    constraint: Any = None,
    prefill_piece: int | None = None,
    on_prefill: Callable[[int], None] | None = None,
) -> Iterator[int]:
    """Continue one prompt ``(P,)`` token by token: yield each new id as soon as it is chosen.

    The tokens are ``generate``'s for the same prompt and options (one row,
    the KV cache, the same sampling): this is that loop with the batch taken
    out and each token handed over at once, for a chat that prints them as
    they come. The first ``next()`` runs the prompt; each later one a decode
    step. It ends after ``max_new_tokens`` tokens, or after yielding a token
    of ``stop_ids`` (the model's end-of-turn ids); a caller may stop earlier
    (a stop string in the text). Arguments are checked before any model call;
    the model runs without autograd during each step, not between them. ``draft``,
    ``draft_tokens`` and ``counts`` as ``generate_decoder_only``'s: a pass may then yield
    several tokens at once.
    ``constraint`` (``constrained.Constraint``: ``apply(logits)``, ``advance(token)``)
    masks the logits before each pick and takes each token picked (with a draft, the
    guesses are verified under the mask). ``prefill_piece``: the prompt goes through the
    model that many positions at a time, each piece against the cache of those before (the
    same logits as one pass up to rounding, exactly at level 0), ``on_prefill(positions
    done)`` called after each; for a rung that takes seconds a token, whose user wants to
    see the prompt advance (``ladder chat --level 0``). Without a draft only.
    """
    config = model.config
    sampling = Sampling(temperature, top_k, top_p, seed)
    tokens = public.ids_of(model, np.asarray(prompt)[None], "prompt")  # (1, P)
    public.check_new_tokens(max_new_tokens)
    for stop in stop_ids:
        _check_token_id("a stop id", stop, config.vocab_size)
    P = tokens.shape[1]
    if P + max_new_tokens > config.max_seq_len:
        raise ValueError(
            f"prompt length {P} + max_new_tokens {max_new_tokens} exceeds "
            f"max_seq_len={config.max_seq_len}"
        )
    _check_draft(draft, draft_tokens, True)
    if prefill_piece is not None:
        if isinstance(prefill_piece, bool) or not isinstance(prefill_piece, int | np.integer):
            raise TypeError(f"prefill_piece must be an integer, got {prefill_piece!r}")
        if prefill_piece < 1:
            raise ValueError(f"prefill_piece must be at least 1, got {prefill_piece}")
        if draft is not None:
            raise ValueError("prefill_piece is for plain decoding: give it no draft")
    if max_new_tokens == 0:
        return
    generators = sampling.generators(1)
    if draft is not None:
        passes = speculative.speculate(model, tokens, np.array([P]), max_new_tokens, draft=draft, k=draft_tokens,
                                       sampling=sampling, generators=generators, stop_ids=tuple(stop_ids), counts=counts,
                                       constraints=None if constraint is None else [constraint])  # fmt: skip
        yield from (token for new in passes for token in new[0])
        return
    native, to_numpy = _converters(model)
    cache = model.new_cache(1)
    start = _prefill_pieces(model, tokens, cache, prefill_piece, on_prefill)
    ids, positions = tokens[:, start:], np.arange(start, P)[None]  # (1, P - start): the rest
    for step in range(max_new_tokens):
        with model.arrays.inference():
            logits = model.transformer(native(ids), native(positions), cache, last=step == 0)
            last = to_numpy(logits)[:, -1].astype(np.float64)  # (1, V)
        if step == 0 and on_prefill is not None:
            on_prefill(P)
        if constraint is not None:
            last = constraint.apply(last)
        token = int(pick(last, sampling, generators)[0])
        if constraint is not None:
            constraint.advance(token)
        yield token
        if token in stop_ids:
            return
        ids, positions = np.array([[token]]), np.array([[P + step]])  # (1, 1)


def _prefill_pieces(model, tokens: np.ndarray, cache, piece: int | None, on_prefill) -> int:
    """All but the last piece of the prompt ``tokens (1, P)`` into ``cache``, ``piece``
    positions each (``on_prefill`` after each) -> the positions done. Their logits are not
    read: ``last=True`` keeps the output layer to one position a piece."""
    if piece is None:
        return 0
    native, _ = _converters(model)
    P, done = tokens.shape[1], 0
    while P - done > piece:
        ids, positions = tokens[:, done : done + piece], np.arange(done, done + piece)[None]
        with model.arrays.inference():
            model.transformer(native(ids), native(positions), cache, last=True)
        done += piece
        if on_prefill is not None:
            on_prefill(done)
    return done


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
) -> Native:
    """Decode from BOS for every row of ``src (B, S)``; each row stops at its EOS.

    Returns ``(B, 1 + n)`` tokens starting with BOS, where ``n <= max_new_tokens``
    is the number of steps until every row has produced EOS; a finished row is
    filled with ``pad_id`` after its EOS. ``max_new_tokens`` defaults to
    ``max_seq_len - 1``, the longest target that fits; ``bos_id`` and
    ``eos_id`` default to the config's. ``temperature``, ``top_k``, ``top_p``
    and ``seed`` choose the tokens as for the decoder-only model (greedy by default).
    The source is encoded once; each step runs the decoder over the target so far
    (``use_cache=False``) or over its newest token against the cache.
    """
    config = model.config
    sampling = Sampling(temperature, top_k, top_p, seed)
    bos_id = config.bos_id if bos_id is None else bos_id
    eos_id = config.eos_id if eos_id is None else eos_id
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        _check_token_id(name, value, config.vocab_size)
    max_new_tokens = config.max_seq_len - 1 if max_new_tokens is None else max_new_tokens
    public.check_new_tokens(max_new_tokens)
    if 1 + max_new_tokens > config.max_seq_len:
        raise ValueError(
            f"1 + max_new_tokens = {1 + max_new_tokens} exceeds max_seq_len={config.max_seq_len}"
        )
    ids = public.ids_of(model, src, "source tokens")  # (B, S)
    public.check_length(ids.shape[1], config.max_seq_len, what="source length")
    src_real = public.valid_of(model, src_valid, ids.shape, "src_valid")  # (B, S)
    B = ids.shape[0]
    generators = sampling.generators(B)
    out = np.full((B, 1), bos_id, dtype=np.int64)  # (B, 1)
    done = np.zeros(B, dtype=bool)
    native, to_numpy = _converters(model)
    with model.arrays.inference():
        src_positions = native(public.positions_of(src_real))  # (B, S)
        memory = model.memory(native(ids), src_positions)  # (B, S, D)
        cache = model.new_cache(B) if use_cache else None
        for step in range(max_new_tokens):
            if done.all():
                break
            if cache is None:  # the whole target so far
                ids_, positions = out, np.arange(step + 1)[None].repeat(B, 0)
            else:  # the newest token; the memory's keys are in the cache after the first step
                ids_, positions = out[:, -1:], np.full((B, 1), step)
            logits = model.transformer(
                native(ids_), native(positions), memory, src_positions, cache
            )  # (B, T, V)
            last = to_numpy(logits)[:, -1].astype(np.float64)  # (B, V)
            nxt = np.where(done, config.pad_id, pick(last, sampling, generators, ~done))
            done |= nxt == eos_id
            out = np.concatenate([out, nxt[:, None]], axis=1)
    return native(out)
