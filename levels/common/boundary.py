"""The models' public edge, written once for every level: which tokens are real, where each
sits, what each query may see.

Everything here is bookkeeping on small plain data (the ids and ``valid`` as numpy,
``(B, T)`` booleans, a length, a position per row), never a level's arithmetic, so one
copy serves the five rungs: the public methods check the inputs, plan a ``Step``,
convert what the architecture reads to the level's arrays once (its ``arrays``:
``to_numpy``, ``asarray``), and call it. The rules:

* **Real tokens.** ``valid (B, T)``, True = a real token, right-padded; without
  it every token is real. Padding is never inferred from token values: in a
  real checkpoint ``pad_id`` is the EOS token, which every chat turn contains.
  Every row needs one real token. The outputs at padded positions are zeroed
  by the model (``Step.padded``).
* **Keys.** A query may attend the real keys of its row: a ``(B, 1, 1, S)``
  mask, or none at all when every key is real (the common case, and every
  decode step of an unpadded cache). Under a sliding window a padded query may
  also see the padded keys of its window (its window may hold no real key; its
  output is zeroed anyway, and real queries never see padding).
* **Positions.** A slot's position (what RoPE rotates by, what a window
  measures) is the number of real slots before it in its row. Without padding
  that is the slot. After a prefill of prompts of different lengths the cache
  is *ragged*: decoding appends one slot per row, and a short row's new token
  sits past its padding but at the position after its last real token, which
  is what makes a batched row equal that row alone. Causal masking by slot
  stays right (slots are in time order); a window, which counts distance, is
  then a mask by position.
* **The cache.** ``CacheBook`` is what every level's KV cache knows besides its
  keys and values: capacity, batch, the filled length, each slot's validity,
  each row's real count. A step is planned (nothing written), the layers append
  their keys and values, and only ``commit`` makes the step count, so a step
  that fails half-way leaves the cache as it was.
* **Layers of several kinds.** Layers with different windows (Gemma 3's local
  and global ones) see different keys: a model's ``_plan`` gives a step per
  distinct window, each mask built once per pass, shared by its layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import checks
from .generation import generate_decoder_only, generate_seq2seq, stream_decoder_only

Rows = list[list[bool]]  # (B, T) booleans as plain lists


# ----------------------------------------------------------------------------- inputs


def all_real(valid: Rows) -> bool:
    return all(all(row) for row in valid)


def last_real(valid: Rows) -> list[int]:
    """Each row's last real slot (``checks.checked_valid`` made sure every row has one)."""
    return [max(i for i, real in enumerate(row) if real) for row in valid]


# ----------------------------------------------------------------------------- one step


@dataclass(frozen=True)
class Step:
    """One pass over ``T`` new tokens, after ``past`` filled positions of a cache (0 without one).

    ``valid (B,T)`` the new tokens; ``offset`` the first one's position (an int, or one
    per row when ragged); ``window`` the sliding window applied by slot (None when the
    ``mask`` carries it, or there is none); ``mask`` what the queries may see as nested
    lists, ``(B,1,1,S)`` or ``(B,1,T,S)``, None when every key is visible.
    """

    valid: Rows
    past: int
    offset: int | list[int]
    window: int | None
    mask: list | None

    @property
    def padded(self) -> bool:
        """Whether some new position is padding (its outputs are then zeroed)."""
        return not all_real(self.valid)


def key_mask(keys: Rows, T: int, window: int | None) -> list:
    """Key validity ``keys (B,S)``, some of them padding -> a mask ``(B,1,1,S)``
    (``(B,1,T,S)`` under a window, letting a padded query see its window's padded keys)."""
    if window is None:
        return [[[row]] for row in keys]
    S = len(keys[0])
    return [[[[k or not row[S - T + t] for k in row] for t in range(T)]] for row in keys]


def window_by_position(keys: Rows, T: int, window: int) -> list:
    """The sliding window in positions for the last ``T`` slots of ``keys (B,S)``: ``(B,1,T,S)``,
    True where a key is real and among its query's ``W`` latest positions. (A padded
    query sees its own slot only, so that no row is left without a key; its output is
    zeroed. Causal masking by slot still applies.)"""
    out = []
    for row in keys:
        pos, count = [], 0
        for real in row:
            pos.append(count - 1 if not real else count)  # a real slot's position
            count += real
        S = len(row)
        grid = []
        for t in range(S - T, S):
            if not row[t]:  # padding
                grid.append([j == t for j in range(S)])
                continue
            q = pos[t]
            grid.append([row[j] and pos[j] > q - window for j in range(S)])
        out.append([grid])
    return out


def plan(
    valid: Rows,
    *,
    window: int | None,
    cache: CacheBook | None = None,
    position_offset: int = 0,
) -> Step:
    """The ``Step`` of ``valid (B,T)`` new tokens: after ``cache``'s filled slots, or alone
    starting at ``position_offset`` (a shard of a longer sequence)."""
    if cache is None:  # no mask when every key is real
        mask = None if all_real(valid) else key_mask(valid, len(valid[0]), window)
        return Step(valid, 0, position_offset, window, mask)
    if cache.padded or not all_real(valid):
        return _after_padding(valid, window, cache)
    # Every key real: no mask, and the cache is not ragged, so the next position is its length.
    return Step(valid, cache.length, cache.length, window, None)


def _after_padding(valid: Rows, window: int | None, cache: CacheBook) -> Step:
    """``plan``'s step when some key, cached or new, is padding: a mask of the real keys, by
    position under a window once the cache is ragged (``window_by_position``)."""
    keys = [old + new for old, new in zip(cache.valid, valid, strict=True)]  # (B, past + T)
    T = len(valid[0])
    if cache.ragged and window is not None:
        mask = window_by_position(keys, T, window)
        return Step(valid, cache.length, cache.position_offset(), None, mask)
    return Step(valid, cache.length, cache.position_offset(), window, key_mask(keys, T, window))


# ----------------------------------------------------------------------------- the cache


class CacheBook:
    """What a KV cache keeps besides keys and values; every level's cache subclasses it.

    ``capacity`` (``max_seq_len``) positions for ``batch`` rows; ``length`` filled,
    the same for every row and layer; ``valid (B, length)`` each slot's validity;
    ``ragged`` once a prefill had padding, and then each row's real count. A
    step's keys are appended by the layers; ``commit(step)`` then makes it count.
    """

    def __init__(self, config, batch: int):
        self.capacity = config.max_seq_len
        self.batch = batch
        self.length = 0
        self.valid: Rows = [[] for _ in range(batch)]
        self.padded = False  # whether some filled slot is padding
        self.ragged = False
        self._real: list[int] | None = None
        self.cross: list[tuple[Any, Any] | None] = [None] * config.n_layers  # seq2seq memory
        self.memory_mask: Any = None  # seq2seq: the source's real keys, in the level's arrays

    def check(self, rows_: int, adding: int, what: str) -> None:
        """Room for ``adding`` positions of ``rows_`` rows, checked before anything is written."""
        checks.check_batch(rows_, self.batch, what=f"{what} for this cache")
        checks.check_cache_room(self.length, adding, self.capacity)

    def position_offset(self) -> int | list[int]:
        """Where the next step's first token sits: ``length``, or per row when ragged."""
        return list(self._real) if self.ragged else self.length

    def commit(self, step: Step) -> None:
        """Every layer has appended this step's keys and values: they now count."""
        if self.ragged or step.padded:  # from now on, each row counts its own positions
            counts = self._real if self.ragged else [self.length] * self.batch
            self._real = [n + sum(row) for n, row in zip(counts, step.valid, strict=True)]
            self.ragged = True
        for row, new in zip(self.valid, step.valid, strict=True):
            row.extend(new)  # in place: a decode step adds one slot per row
        self.padded = self.padded or step.padded
        self.length += len(step.valid[0])

    def rewind(self, length: int) -> None:
        """Forget every position past ``length``, as if only the first ``length`` had been
        decoded: a new continuation of the same prompt without a second prefill (the
        benchmark's repeated decode; a chat that resumes from a shared prefix). Only a
        cache without padding rewinds (a ragged one counts positions per row)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot rewind a cache of {self.length} positions to {length}")
        if self.padded:
            raise ValueError("a cache with padding cannot be rewound")
        self._forget(length)
        self.valid = [row[:length] for row in self.valid]
        self.length = length

    def _forget(self, length: int) -> None:
        """The level's part of ``rewind``: nothing where ``length`` already bounds every read."""

    def _left_aligned(self, counts: Sequence[int]) -> None:
        """The book of rows whose ``counts[b]`` real slots come first, then padding up to the
        longest: the layout of a batch of sequences in a paged cache
        (levels/level2_torch_manual/paged.py)."""
        self.length = max(counts)
        self.valid = [[True] * n + [False] * (self.length - n) for n in counts]
        self.padded = self.ragged = any(n < self.length for n in counts)
        self._real = list(counts) if self.ragged else None


# ----------------------------------------------------------------------------- the public methods


class _Edge:
    """The public methods of a model, written once: they read the inputs as numpy, check them,
    plan the pass and hand the architecture the level's arrays, converted once.

    A level's model supplies:

    - ``compute(ids, positions, sees, cache, last)`` (seq2seq: ``_encode`` and ``_decoder``):
      the architecture, on checked ids, with what each layer's queries may see (``_sees``);
    - ``arrays``: the level's array functions: its converters ``to_numpy(x)`` and
      ``asarray(np_array, device=)``, and ``zero_padded(x (B,T,N), valid)`` and
      ``last_position(x (B,T,N)) -> (B,N)``;
    - ``device``, and ``new_cache(batch)``: an empty cache (a ``CacheBook``);
    - ``_inference``: a decorator for the generation loops (torch's ``no_grad``, or
      nothing), and ``_converters()``: what they need to move ids to and from numpy.
    """

    def _ids(self, tokens, what: str, ndim: int = 2) -> np.ndarray:
        """``tokens`` checked (``ndim`` axes, none empty, integers in ``[0, V)``) as int64 numpy.
        An error names the caller's dtype (a torch one, say), not that of numpy's copy."""
        ids = checks.as_numpy(self.arrays.to_numpy, tokens, what=what)
        dtype = getattr(tokens, "dtype", None)
        return checks.checked_ids(ids, self.config.vocab_size, what=what, ndim=ndim, dtype=dtype)

    def _rows(self, ids: np.ndarray, valid, what: str) -> Rows:
        """``valid`` for ``ids (B,T)`` as checked ``Rows``; None: every token is real."""
        B, T = ids.shape
        if valid is None:
            return [[True] * T for _ in range(B)]
        valid = checks.as_numpy(self.arrays.to_numpy, valid, what=what)
        return checks.checked_valid(valid, ids.shape, what=what)

    def _one_position(self, tokens, what: str):
        """A decode step's ``tokens (B,)``, checked -> ``(B,1)`` ids and their ``(B,1)`` validity."""
        ids = self._ids(tokens, what, ndim=1)[:, None]  # (B,) -> (B,1)
        return ids, [[True] for _ in range(len(ids))]

    def _converted(self, array: np.ndarray):
        """A numpy array in the level's arrays, on the model's device."""
        return self.arrays.asarray(array, device=self.device)

    def _plan(self, rows_: Rows, **where) -> dict[int | None, Step]:
        """The pass over ``rows_ (B,T)``: a ``Step`` per distinct window among the layers
        (``config.layer_windows``: Gemma 3's local and global layers need two, most models
        one), each mask built once per pass for every layer of its window; ``where`` is
        ``cache=`` or ``position_offset=`` (``plan``)."""
        return {w: plan(rows_, window=w, **where) for w in dict.fromkeys(self.config.layer_windows)}

    def _sees(self, steps: dict) -> dict:
        """What each layer's queries may see: ``{window: (mask, window by slot)}``, each mask in
        the level's arrays (None: every key), built once per pass for all the layers of its window."""
        return {w: (self._mask(step), step.window) for w, step in steps.items()}

    def _mask(self, step: Step):
        """``step.mask`` in the level's arrays (None: every key may be seen)."""
        return None if step.mask is None else self._converted(np.array(step.mask, dtype=bool))

    def _offset(self, step: Step):
        """The step's first position: an int, or one per row in the level's arrays (ragged)."""
        if isinstance(step.offset, int):
            return step.offset
        return self._converted(np.array(step.offset))  # (B,)

    def _zeroed(self, logits, rows_: Rows):
        """Logits ``(B,T,V)`` with every padded position exactly zero."""
        return logits if all_real(rows_) else self.arrays.zero_padded(logits, rows_)


class DecoderOnlyEdge(_Edge):
    """``logits``, ``forward``, ``prefill``, ``decode_step``, ``extend``, ``generate`` and
    ``stream`` of a decoder-only model over its ``compute(ids, positions, sees, cache, last)``."""

    def _decoder(self, ids, steps: dict, cache, last=None):
        """The planned pass: raw logits ``(B,T,V)`` of checked ``ids (B,T)``, the level's arrays
        (``(B,1,V)`` at ``last``, a slot per row), and then the cache's new positions committed."""
        step = next(iter(steps.values()))  # what every window's step shares: the positions
        logits = self.compute(ids, self._offset(step), self._sees(steps), cache, last)
        if cache is not None:
            cache.commit(step)  # every layer has appended its keys: only now do they count
        return logits

    def logits(self, tokens, *, valid=None, position_offset: int = 0):
        """``(logits (B,T,V), valid (B,T))`` without zeroing the padded positions (for training)."""
        ids = self._ids(tokens, "tokens")
        checks.check_position_offset(position_offset, ids.shape[1], self.config.max_seq_len)
        rows_ = self._rows(ids, valid, "valid")
        steps = self._plan(rows_, position_offset=position_offset)
        return self._decoder(self._converted(ids), steps, None), rows_

    def forward(self, tokens, *, valid=None, position_offset: int = 0):
        """``tokens (B,T)`` ints, ``valid (B,T)`` bool (default: every token is real) -> ``(B,T,V)``.

        ``position_offset``: the position of the first token, for a shard of a longer
        sequence (context parallelism, ``levels.parallel``); RoPE rotates from there.
        """
        logits, rows_ = self.logits(tokens, valid=valid, position_offset=position_offset)
        return self._zeroed(logits, rows_)

    def prefill(self, tokens, *, valid=None, last_only: bool = False):
        """Run the prompt ``tokens (B,T)`` and keep its keys and values: ``(logits (B,T,V), cache)``;
        ``last_only``: the logits of each row's last real token only, ``(B,V)`` (what a
        generator needs)."""
        ids = self._ids(tokens, "tokens")
        rows_ = self._rows(ids, valid, "valid")
        checks.check_length(ids.shape[1], self.config.max_seq_len, what="tokens length")
        cache = self.new_cache(len(rows_))
        steps, ids = self._plan(rows_, cache=cache), self._converted(ids)
        if last_only:
            last = self._decoder(ids, steps, cache, last_real(rows_))  # (B,1,V)
            return self.arrays.last_position(last), cache
        return self._zeroed(self._decoder(ids, steps, cache), rows_), cache

    def decode_step(self, tokens, cache):
        """Append one position per row, ``tokens (B,)``, to ``cache`` in place -> logits ``(B,V)``."""
        ids, rows_ = self._one_position(tokens, "tokens")
        cache.check(len(rows_), 1, "tokens")  # raises before anything is written
        logits = self._decoder(self._converted(ids), self._plan(rows_, cache=cache), cache)
        return self.arrays.last_position(logits)  # (B,1,V) -> (B,V)

    def extend(self, tokens, cache, *, valid=None, last_only: bool = False):
        """Append ``tokens (B,T)`` to ``cache`` in place, as ``prefill`` would have taken them
        after the cache's positions -> logits ``(B,T,V)``, or ``(B,V)`` at each row's last
        real token with ``last_only``. A long prompt in pieces (a server's chunked
        prefill), or a prompt after a prefix already cached."""
        ids = self._ids(tokens, "tokens")
        rows_ = self._rows(ids, valid, "valid")
        cache.check(len(rows_), ids.shape[1], "tokens")  # raises before anything is written
        steps, ids = self._plan(rows_, cache=cache), self._converted(ids)
        if last_only:
            return self.arrays.last_position(self._decoder(ids, steps, cache, last_real(rows_)))
        return self._zeroed(self._decoder(ids, steps, cache), rows_)

    def generate(self, prefix, max_new_tokens, **options):
        """Continue ``prefix (B,P)`` -> ``(B, P + max_new_tokens)``; greedy by default.

        ``options``: ``valid``, ``use_cache``, ``temperature``, ``top_k``, ``top_p``,
        ``seed``, ``eos_id``, as ``levels.common.generation.generate_decoder_only`` takes them.
        """
        run = self._inference(generate_decoder_only)
        return run(self, prefix, max_new_tokens, **self._converters(), **options)

    def stream(self, prompt, max_new_tokens, **options):
        """Continue one prompt ``(P,)``, yielding each new token id as it is chosen (greedy by
        default); ``options`` as ``levels.common.generation.stream_decoder_only`` takes them.
        (``_inference`` wraps each step, not the time between them.)"""
        run = self._inference(stream_decoder_only)
        return run(self, prompt, max_new_tokens, **self._converters(), **options)


class Seq2SeqEdge(_Edge):
    """``logits``, ``forward``, ``encode``, ``prefill``, ``decode_step`` and ``generate`` of an
    encoder-decoder model over its ``_encode(src, sees)`` and
    ``_decoder(tgt, positions, sees, memory, memory_mask, cache)``."""

    def _target(self, tgt, steps: dict, memory, memory_mask, cache):
        """The planned pass of the decoder: raw logits ``(B,T,V)`` of checked ``tgt (B,T)``
        over ``memory (B,S,D)``, and then the cache's new positions committed."""
        step = next(iter(steps.values()))  # what every window's step shares: the positions
        sees = self._sees(steps)
        logits = self._decoder(tgt, self._offset(step), sees, memory, memory_mask, cache)
        if cache is not None:
            cache.commit(step)
        return logits

    def _source(self, src, src_valid):
        """Checked source ids, what the encoder's layers see (no cache), the cross-attention's
        mask of its real tokens (no window), and its rows."""
        src = self._ids(src, "source tokens")
        rows_ = self._rows(src, src_valid, "src_valid")
        checks.check_length(src.shape[1], self.config.max_seq_len, what="source length")
        memory_mask = self._mask(plan(rows_, window=None))
        return self._converted(src), self._sees(self._plan(rows_)), memory_mask, rows_

    def _inputs(self, src, tgt_in, src_valid, tgt_valid):
        """Both sequences checked, the target first, so that bad target input fails before
        the source is encoded (before any kernel launch)."""
        tgt = self._ids(tgt_in, "target tokens")
        rows_ = self._rows(tgt, tgt_valid, "tgt_valid")
        checks.check_length(tgt.shape[1], self.config.max_seq_len, what="target length")
        src, src_sees, memory_mask, src_rows = self._source(src, src_valid)
        checks.check_batch(len(rows_), len(src_rows), what="target tokens for this source")
        return src, src_sees, memory_mask, self._converted(tgt), rows_

    def logits(self, src, tgt_in, *, src_valid=None, tgt_valid=None):
        """``(logits (B,T,V), tgt_valid (B,T))`` without zeroing the padded targets (for training)."""
        src, src_sees, memory_mask, tgt, rows_ = self._inputs(src, tgt_in, src_valid, tgt_valid)
        memory = self._encode(src, src_sees)  # (B,S,D)
        return self._target(tgt, self._plan(rows_), memory, memory_mask, None), rows_

    def forward(self, src, tgt_in, *, src_valid=None, tgt_valid=None):
        """``src (B,S)``, ``tgt_in (B,T)`` -> teacher-forced logits ``(B,T,V)``, zero at padded targets."""
        logits, rows_ = self.logits(src, tgt_in, src_valid=src_valid, tgt_valid=tgt_valid)
        return self._zeroed(logits, rows_)

    def encode(self, src, *, src_valid=None):
        """``src (B,S)`` ids, ``src_valid (B,S)`` (default: every token is real) -> memory ``(B,S,D)``."""
        src, sees, _, _ = self._source(src, src_valid)
        return self._encode(src, sees)

    def prefill(self, src, tgt_in, *, src_valid=None, tgt_valid=None):
        """Encode ``src`` once and run ``tgt_in (B,T)``: ``(logits (B,T,V), cache)``.

        The cache keeps each decoder layer's cross-attention keys and values (of
        the encoded source) and its self-attention keys and values.
        """
        src, src_sees, memory_mask, tgt, rows_ = self._inputs(src, tgt_in, src_valid, tgt_valid)
        cache = self.new_cache(len(rows_))
        cache.memory_mask = memory_mask
        steps = self._plan(rows_, cache=cache)
        memory = self._encode(src, src_sees)  # (B,S,D)
        return self._zeroed(self._target(tgt, steps, memory, memory_mask, cache), rows_), cache

    def decode_step(self, tokens, cache):
        """Append one target position per row, ``tokens (B,)``, to ``cache`` -> logits ``(B,V)``."""
        ids, rows_ = self._one_position(tokens, "target tokens")
        cache.check(len(rows_), 1, "target tokens")
        steps, ids = self._plan(rows_, cache=cache), self._converted(ids)
        logits = self._target(ids, steps, None, cache.memory_mask, cache)
        return self.arrays.last_position(logits)  # (B,1,V) -> (B,V)

    def generate(self, src, **options):
        """Decoding from BOS -> ``(B, 1 + n)``; each row stops at its EOS, then pads.

        ``options``: ``src_valid``, ``bos_id``, ``eos_id``, ``max_new_tokens`` (default
        ``max_seq_len - 1``, the longest target that fits), ``use_cache``, ``temperature``,
        ``top_k``, ``top_p``, ``seed``, as ``levels.common.generation.generate_seq2seq``
        takes them.
        """
        return self._inference(generate_seq2seq)(self, src, **self._converters(), **options)
