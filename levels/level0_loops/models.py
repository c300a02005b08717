"""The two models at level 0, their KV cache, and incremental decoding.

Like ``layers.py`` these compute through ``self.ops``; level 1 subclasses
them with numpy's. Each model's public methods are the boundary: they check
their inputs (with numpy, on the host, before any arithmetic) and build the
masks; the layers below see only checked arrays.

A decoder pass over ``T`` new tokens always runs through one method,
``_causal_step``, which reads the positions already in a ``KVCache`` and
appends the new ones: ``forward`` is a pass without a cache, ``prefill`` a
pass against an empty one, ``decode_step`` a pass of one token against a
filled one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..common import checks
from ..common.generation import generate_decoder_only, generate_seq2seq
from ..common.params import check_params, param_shapes
from ..common.positions import RowPositions
from .layers import DecoderLayer, EncoderLayer, Module, norm_class

Native = Any


class KVCache(RowPositions):
    """What incremental decoding keeps between steps; capacity ``max_seq_len``.

    Per layer the self-attention keys and values of the positions decoded so
    far, each ``(B,Hkv,length,Dh)`` in the level's arrays, grown by appending
    (``ops.concat``); ``cross[i]``: decoder layer ``i``'s cross-attention
    ``(k, v)`` of the encoded source, computed once; ``memory_valid (B,S)``
    the source's validity. The validity of the cached positions is numpy, as
    the models' masks are.

    The models call it as level 2's cache is called, for every step of ``T``
    new positions: ``check_room(T)`` before anything is written;
    ``key_valid(valid_new)``; ``append(index, k_new, v_new)`` once per layer;
    then ``advance(valid_new)``. Appended keys stay pending until ``advance``,
    so a step that fails half-way leaves the cache as it was. After a prefill
    of prompts of different lengths, ``position_offset()`` gives each row's
    next position (``levels.common.positions``).
    """

    def __init__(self, config, batch: int, *, ops):
        self._concat = ops.concat  # (B,H,length,Dh) + (B,H,T,Dh) along time
        self.capacity = config.max_seq_len
        self.batch = batch
        self.length = 0  # filled positions, shared by every layer
        self._kv: list[tuple[Native, Native] | None] = [None] * config.n_layers
        self._pending: dict[int, tuple[Native, Native]] = {}
        self._valid = np.zeros((batch, 0), dtype=bool)  # (B, length)
        self.cross: list[tuple[Native, Native] | None] = [None] * config.n_layers
        self.memory_valid: np.ndarray | None = None  # (B, S), seq2seq only

    def check_room(self, adding: int) -> None:
        checks.check_cache_room(self.length, adding, self.capacity)

    def key_valid(self, valid_new: np.ndarray) -> np.ndarray:
        """The validity of the cached keys, then of the new ones: ``(B, length + T)``."""
        return np.concatenate([self._valid, valid_new], axis=1)

    def append(self, index: int, k_new: Native, v_new: Native) -> tuple[Native, Native]:
        """Layer ``index``'s keys and values over the cached and the new positions."""
        past = self._kv[index]
        if past is None:
            k, v = k_new, v_new  # (B,Hkv,T,Dh)
        else:
            k = self._concat(past[0], k_new, axis=2)  # (B,Hkv,length+T,Dh)
            v = self._concat(past[1], v_new, axis=2)
        self._pending[index] = (k, v)
        return k, v

    def advance(self, valid_new: np.ndarray) -> None:
        """Commit the step: every layer has run, its keys now count as cached."""
        for index, kv in self._pending.items():
            self._kv[index] = kv
        self._pending.clear()
        self._count_real(valid_new)
        self._valid = self.key_valid(valid_new)
        self.length += valid_new.shape[1]


class _Model(Module):
    """What both models share: the input checks, the cache and the causal step."""

    kind: str

    def __init__(self, config, params, *, ops=None, device=None, dtype=None):
        check_params(params, param_shapes(config, self.kind))  # every problem, named, up front
        super().__init__(config, ops=ops, device=device, dtype=dtype)

    # -- the boundary ---------------------------------------------------------

    def _ids(self, tokens, what: str = "tokens", ndim: int = 2) -> np.ndarray:
        """``tokens`` as checked int64 numpy ids: ``ndim`` axes, none empty, all in ``[0, V)``."""
        ids = np.asarray(self.ops.to_numpy(tokens))
        checks.check_token_ids(
            ids.shape,
            ids.dtype.kind,
            ids.dtype,
            lambda: (int(ids.min()), int(ids.max())),
            self.config.vocab_size,
            what=what,
            ndim=ndim,
        )
        return ids.astype(np.int64)

    def _valid(self, ids: np.ndarray, valid, what: str = "valid") -> np.ndarray:
        """``valid (B,T)`` as numpy bool, default ``ids != pad_id``; every row needs a real token."""
        if valid is None:
            valid = ids != self.config.pad_id
        else:
            valid = np.asarray(self.ops.to_numpy(valid))
            checks.check_valid_shape(valid.shape, ids.shape, valid.dtype == np.bool_, what=what)
        if not valid.any(axis=1).all():
            raise ValueError(f"{what}: {checks.NO_VALID_TOKEN_MESSAGE}")
        return valid

    def _check_step(self, ids: np.ndarray, cache: KVCache | None, what: str) -> None:
        """Room for ``ids (B,T)``: at most ``max_seq_len``, or what the cache has left."""
        if cache is None:
            checks.check_length(ids.shape[1], self.config.max_seq_len, what=f"{what} length")
        else:
            checks.check_batch(ids.shape[0], cache.batch, what=f"{what} for this cache")
            cache.check_room(ids.shape[1])  # raises before anything is written

    def _zero_padding(self, logits: Native, valid: np.ndarray) -> Native:
        """Logits ``(B,T,V)`` with every padded position set to exactly zero."""
        out = np.where(valid[..., None], self.ops.to_numpy(logits), 0.0)  # (B,T,V)
        return self._native(out)

    def new_cache(self, batch: int) -> KVCache:
        """An empty KV cache of capacity ``max_seq_len`` for ``batch`` rows."""
        return KVCache(self.config, batch, ops=self.ops)

    def _causal_step(
        self, ids, valid, cache, *, embedding, blocks, head, position_offset: int = 0
    ) -> Native:
        """Logits ``(B,T,V)`` for ``ids (B,T)`` placed after the cache's filled positions.

        ``blocks(x (B,T,D), key_valid (B, length+T), position_offset) -> (B,T,D)`` runs the layers
        and ``head`` maps ``(B,T,D) -> (B,T,V)``. Inputs are checked already;
        the cache's length grows only after the last layer. The logits at padded
        positions are not zeroed here (``_zero_padding`` does that). Without a
        cache the first position is ``position_offset`` (a shard of a longer sequence).
        """
        key_valid = valid if cache is None else cache.key_valid(valid)  # (B, length + T)
        # An int, or (B,) when ragged.
        offset = position_offset if cache is None else cache.position_offset()
        # sqrt(D) (by default) so that the stream starts at unit variance.
        x = self.ops.embed(embedding, self.ops.asarray(ids), self.config.embedding_scale)  # (B,T,D)
        logits = head(blocks(x, key_valid, offset))  # (B,T,V)
        if cache is not None:
            cache.advance(valid)
        return logits

    def _last(self, logits: Native) -> Native:
        """``(B,1,V) -> (B,V)``: a decode step's logits."""
        return self._native(self.ops.to_numpy(logits)[:, 0])


class DecoderOnlyTransformer(_Model):
    """A GPT-style decoder-only transformer (causal pre-norm blocks, tied logits by default).

    ``forward(tokens (B,T), *, valid=None) -> logits (B,T,V)``, ``prefill``,
    ``decode_step`` and ``generate``. Dropout is not applied (inference only).
    """

    kind = "decoder_only"

    def __init__(self, config, params, *, ops=None, device=None, dtype=None):
        super().__init__(config, params, ops=ops, device=device, dtype=dtype)
        kw = self._children()
        self.token_embedding = self._native(params["token_embedding.weight"])  # (V, D)
        self.layers = [
            EncoderLayer(config, params, prefix=f"layers.{i}.", **kw)
            for i in range(config.n_layers)
        ]
        self.norm = norm_class(config)(config, params, prefix="norm.", **kw)
        # Tied: logits = h @ E^T with the input embedding E; untied: a matrix of its own.
        name = "token_embedding.weight" if config.tie_embeddings else "output_projection.weight"
        self.output_projection = self._native(params[name])  # (V, D)

    def _step(
        self, ids: np.ndarray, valid: np.ndarray, cache: KVCache | None, position_offset: int = 0
    ) -> Native:
        """Raw logits ``(B,T,V)`` for ``ids (B,T)`` following the cache's filled positions."""

        def blocks(x, key_valid, offset):
            for i, layer in enumerate(self.layers):
                x = layer(
                    x, valid=key_valid, causal=True, position_offset=offset, cache=cache, index=i
                )
            return x  # (B,T,D)

        def logits(x):
            return self.ops.linear(self.norm(x), self.output_projection, None)  # (B,T,D) @ (D,V)

        self._check_step(ids, cache, "tokens")
        return self._causal_step(
            ids,
            valid,
            cache,
            embedding=self.token_embedding,
            blocks=blocks,
            head=logits,
            position_offset=position_offset,
        )

    def logits(self, tokens, *, valid=None, position_offset=0) -> tuple[Native, np.ndarray]:
        """``(logits (B,T,V), valid (B,T))`` without zeroing the padded positions (for training)."""
        ids = self._ids(tokens)
        checks.check_position_offset(position_offset, ids.shape[1], self.config.max_seq_len)
        valid = self._valid(ids, valid)
        return self._step(ids, valid, None, position_offset), valid

    def forward(self, tokens, *, valid=None, position_offset=0) -> Native:
        """``tokens (B,T)`` ints, ``valid (B,T)`` bool (default ``tokens != pad_id``) -> ``(B,T,V)``;
        ``position_offset``: the first token's position (RoPE starts there)."""
        return self._zero_padding(
            *self.logits(tokens, valid=valid, position_offset=position_offset)
        )

    __call__ = forward

    def prefill(self, tokens, *, valid=None) -> tuple[Native, KVCache]:
        """Run the prompt ``tokens (B,T)`` and keep its keys and values: ``(logits (B,T,V), cache)``."""
        ids = self._ids(tokens)
        valid = self._valid(ids, valid)
        self._check_step(ids, None, "tokens")
        cache = self.new_cache(ids.shape[0])
        return self._zero_padding(self._step(ids, valid, cache), valid), cache

    def decode_step(self, tokens, cache: KVCache) -> Native:
        """Append one position per row, ``tokens (B,)``, to ``cache`` in place -> logits ``(B,V)``."""
        ids = self._ids(tokens, ndim=1)[:, None]  # (B,) -> (B,1)
        return self._last(self._step(ids, np.ones(ids.shape, dtype=bool), cache))

    def generate(self, prefix, max_new_tokens, **options):
        """Continue ``prefix (B,P)`` -> ``(B, P + max_new_tokens)``; greedy by default.

        ``options``: ``valid``, ``use_cache``, ``temperature``, ``top_k``, ``top_p``,
        ``seed``, ``eos_id``, as ``levels.common.generation.generate_decoder_only`` takes them.
        """
        return generate_decoder_only(self, prefix, max_new_tokens, **options)


class Seq2SeqTransformer(_Model):
    """An encoder-decoder transformer (``nn.Transformer`` with ``norm_first=True``, plus RoPE).

    ``forward(src (B,S), tgt_in (B,T), *, src_valid=None, tgt_valid=None) -> (B,T,V)``,
    ``encode``, ``prefill``, ``decode_step`` and ``generate``. Dropout is not applied.
    """

    kind = "seq2seq"

    def __init__(self, config, params, *, ops=None, device=None, dtype=None):
        super().__init__(config, params, ops=ops, device=device, dtype=dtype)
        kw = self._children()
        n = range(config.n_layers)
        self.source_embedding = self._native(params["source_embedding.weight"])  # (V, D)
        self.target_embedding = self._native(params["target_embedding.weight"])  # (V, D)
        self.output_projection = self._native(params["output_projection.weight"])  # (V, D)
        self.encoder_layers = [
            EncoderLayer(config, params, prefix=f"encoder.layers.{i}.", **kw) for i in n
        ]
        self.encoder_norm = norm_class(config)(config, params, prefix="encoder.norm.", **kw)
        self.decoder_layers = [
            DecoderLayer(config, params, prefix=f"decoder.layers.{i}.", **kw) for i in n
        ]
        self.decoder_norm = norm_class(config)(config, params, prefix="decoder.norm.", **kw)

    def _inputs(self, src, tgt_in, src_valid, tgt_valid):
        """Check both sequences (the target first) -> ``(src, src_valid, tgt, tgt_valid)`` in numpy."""
        tgt = self._ids(tgt_in, "target tokens")
        tgt_valid = self._valid(tgt, tgt_valid, "tgt_valid")
        self._check_step(tgt, None, "target")
        src, src_valid = self._source(src, src_valid)
        checks.check_batch(tgt.shape[0], src.shape[0], what="target tokens for this source")
        return src, src_valid, tgt, tgt_valid

    def _source(self, src, src_valid) -> tuple[np.ndarray, np.ndarray]:
        ids = self._ids(src, "source tokens")
        checks.check_length(ids.shape[1], self.config.max_seq_len, what="source length")
        return ids, self._valid(ids, src_valid, "src_valid")

    def _encode(self, src: np.ndarray, src_valid: np.ndarray) -> Native:
        """The encoder stack and its final norm on checked inputs -> memory ``(B,S,D)``."""
        scale = self.config.embedding_scale
        x = self.ops.embed(self.source_embedding, self.ops.asarray(src), scale)  # (B,S,D)
        for layer in self.encoder_layers:
            x = layer(x, valid=src_valid)  # bidirectional over the real tokens
        return self.encoder_norm(x)

    def encode(self, src, *, src_valid=None) -> Native:
        """``src (B,S)`` ids, ``src_valid (B,S)`` (default ``src != pad_id``) -> memory ``(B,S,D)``."""
        return self._encode(*self._source(src, src_valid))

    def _decode(self, tgt, tgt_valid, memory, cache: KVCache | None, memory_valid) -> Native:
        """Raw logits ``(B,T,V)`` for checked ``tgt (B,T)`` following the cache's positions."""

        def blocks(x, key_valid, offset):
            for i, layer in enumerate(self.decoder_layers):
                x = layer(
                    x,
                    memory,
                    valid=key_valid,
                    memory_valid=memory_valid,
                    position_offset=offset,
                    cache=cache,
                    index=i,
                )
            return x  # (B,T,D)

        def logits(x):
            return self.ops.linear(self.decoder_norm(x), self.output_projection, None)  # (B,T,V)

        return self._causal_step(
            tgt, tgt_valid, cache, embedding=self.target_embedding, blocks=blocks, head=logits
        )

    def logits(self, src, tgt_in, *, src_valid=None, tgt_valid=None) -> tuple[Native, np.ndarray]:
        """``(logits (B,T,V), tgt_valid (B,T))`` without zeroing the padded targets (for training)."""
        src, src_valid, tgt, tgt_valid = self._inputs(src, tgt_in, src_valid, tgt_valid)
        memory = self._encode(src, src_valid)  # (B,S,D)
        return self._decode(tgt, tgt_valid, memory, None, src_valid), tgt_valid

    def forward(self, src, tgt_in, *, src_valid=None, tgt_valid=None) -> Native:
        """Teacher-forced logits ``(B,T,V)``; zero at padded target positions."""
        return self._zero_padding(
            *self.logits(src, tgt_in, src_valid=src_valid, tgt_valid=tgt_valid)
        )

    __call__ = forward

    def prefill(self, src, tgt_in, *, src_valid=None, tgt_valid=None) -> tuple[Native, KVCache]:
        """Encode ``src`` once and run ``tgt_in (B,T)``: ``(logits (B,T,V), cache)``.

        The cache keeps each decoder layer's cross-attention keys and values (of
        the encoded source) and its self-attention keys and values.
        """
        src, src_valid, tgt, tgt_valid = self._inputs(src, tgt_in, src_valid, tgt_valid)
        memory = self._encode(src, src_valid)  # (B,S,D)
        cache = self.new_cache(src.shape[0])
        cache.memory_valid = src_valid
        logits = self._decode(tgt, tgt_valid, memory, cache, src_valid)
        return self._zero_padding(logits, tgt_valid), cache

    def decode_step(self, tokens, cache: KVCache) -> Native:
        """Append one target position per row, ``tokens (B,)``, to ``cache`` -> logits ``(B,V)``."""
        ids = self._ids(tokens, "target tokens", ndim=1)[:, None]  # (B,1)
        self._check_step(ids, cache, "target tokens")
        valid = np.ones(ids.shape, dtype=bool)
        return self._last(self._decode(ids, valid, None, cache, cache.memory_valid))

    def generate(self, src, **options):
        """Decoding from BOS -> ``(B, 1 + n)``; each row stops at its EOS, then pads.

        ``options``: ``src_valid``, ``bos_id``, ``eos_id``, ``max_new_tokens`` (default
        ``max_seq_len - 1``, the longest target that fits), ``use_cache``, ``temperature``,
        ``top_k``, ``top_p``, ``seed``, as ``levels.common.generation.generate_seq2seq``
        takes them.
        """
        return generate_seq2seq(self, src, **options)
