"""The two models, their KV cache, and incremental decoding, written against the ops namespace.

Like ``pieces.py`` this module holds architecture only; ``bind.py`` gives it a
level's arithmetic. A decoder pass over ``T`` new tokens always runs through
one method, ``_decode``, which reads the positions already in a ``KVCache``
and appends the new ones: a full ``forward`` is a pass against an empty
cache, ``decode_step`` a pass of one token against a filled one.
"""

from __future__ import annotations

import math
from typing import Any

from ..common import checks
from ..common.generation import greedy_decoder_only, greedy_seq2seq
from ..common.params import check_params, param_shapes
from .pieces import Component

Native = Any


class KVCache:
    """What incremental decoding keeps between steps, in the level's arrays.

    ``self_kv[i]``: layer ``i``'s self-attention ``(k, v)``, each ``(B,H,S,Dh)``
    (None before the first pass); ``key_valid (B,S)``: which cached positions
    are real tokens; ``length``: ``S``, the positions filled; ``capacity``:
    ``max_seq_len``. For seq2seq also ``cross_kv[i]``, the encoder memory's keys
    and values for decoder layer ``i`` (computed once per source), and
    ``memory_valid (B,S_src)``. Levels 0 and 1 grow the cache by appending.
    """

    def __init__(self, n_layers, batch, capacity, *, cross_kv=None, memory_valid=None):
        self.self_kv: list = [None] * n_layers
        self.key_valid: Native | None = None
        self.length = 0
        self.batch = batch
        self.capacity = capacity
        self.cross_kv = cross_kv
        self.memory_valid = memory_valid

    def commit(self, self_kv: list, key_valid: Native, added: int) -> None:
        """Store a finished pass; called only after every layer succeeded."""
        self.self_kv = self_kv
        self.key_valid = key_valid
        self.length += added


class _Model(Component):
    """What both models share: input checks, the decoder pass, decode_step."""

    kind: str

    def _start(self, config, params, device, dtype) -> dict:
        """Check the whole parameter dict; return the pieces' keyword arguments."""
        check_params(params, param_shapes(config, self.kind))
        self._setup(config, device, dtype)
        return {"device": device, "dtype": dtype}

    def _check_ids(self, tokens: Native, ndim: int, what: str) -> tuple[int, ...]:
        """Integer token ids of ``ndim`` axes, none empty, all in ``[0, V)``; returns the shape."""
        ops = self.ops
        shape = ops.shape(tokens)
        if len(shape) != ndim or 0 in shape:
            raise ValueError(f"{what} must be a non-empty {ndim}-D array of token ids, got {shape}")
        if not ops.is_integer(tokens):
            raise TypeError(f"{what} must be integer token ids")
        checks.check_tokens(*ops.value_range(tokens), self.config.vocab_size, what=f"{what} id")
        return shape

    def _check_sequence(self, tokens: Native, valid: Native | None, what: str) -> Native:
        """Check ``tokens (B,T)`` and ``valid``; return ``valid (B,T)`` (default ``tokens != pad_id``)."""
        ops = self.ops
        shape = self._check_ids(tokens, 2, what)
        checks.check_length(shape[1], self.config.max_seq_len, what=f"{what} length")
        if valid is None:
            valid = ops.not_equal(tokens, self.config.pad_id)
        else:
            checks.check_valid_shape(
                ops.shape(valid), shape, ops.is_bool(valid), what=f"{what} valid"
            )
        if not ops.every_row_has_true(valid):
            raise ValueError(f"{what}: {checks.NO_VALID_TOKEN_MESSAGE}")
        return valid

    def _new_cache(self, batch: int, **cross) -> KVCache:
        return KVCache(self.config.n_layers, batch, self.config.max_seq_len, **cross)

    def _layer_inputs(self, cache: KVCache, i: int) -> dict:
        """Extra keyword arguments of decoder layer ``i``'s ``step``."""
        raise NotImplementedError

    def _decode(self, tokens: Native, valid: Native, cache: KVCache) -> Native:
        """Decoder stack over ``tokens (B,T)`` at positions ``cache.length ..``; returns logits ``(B,T,V)``.

        Attends to the cached positions and appends the new ones to ``cache``
        only once every layer has run, so a failure leaves the cache unchanged.
        Logits at padded positions are exactly zero.
        """
        ops, config = self.ops, self.config
        T = ops.shape(tokens)[1]
        checks.check_cache_room(cache.length, T, cache.capacity)
        # Embeddings are scaled by sqrt(D) so the residual stream starts at unit variance.
        x = ops.embed(self._embedding, tokens, math.sqrt(config.d_model))  # (B,T,D)
        key_valid = valid if cache.key_valid is None else ops.concat(cache.key_valid, valid, axis=1)
        new_kv = []
        for i, layer in enumerate(self._decoder_layers):
            x, kv = layer.step(
                x,
                key_valid=key_valid,  # (B,S) with S = cache.length + T
                past=cache.self_kv[i],
                position_offset=cache.length,
                **self._layer_inputs(cache, i),
            )
            new_kv.append(kv)
        x = self._final_norm(x)  # (B,T,D)
        logits = ops.linear(x, self._projection, None)  # (B,T,D) @ (D,V) -> (B,T,V)
        logits = ops.zero_invalid(logits, valid)
        cache.commit(new_kv, key_valid, T)
        return logits

    def decode_step(self, tokens: Native, cache: KVCache) -> Native:
        """Feed one token per row, ``tokens (B,)``; returns logits ``(B,V)`` and appends to ``cache``.

        The new token is real (valid) and sits at position ``cache.length``.
        """
        (B,) = self._check_ids(tokens, 1, "tokens")
        if B != cache.batch:
            raise ValueError(f"decode_step got {B} tokens for a cache of batch {cache.batch}")
        column = self.ops.as_column(tokens)  # (B,1)
        logits = self._decode(column, self.ops.all_valid(B, 1), cache)  # (B,1,V)
        return self.ops.take_position(logits, 0)  # (B,V)

    def _generation_io(self) -> dict:
        """The converters the shared greedy loop needs (it works on numpy token arrays)."""
        return {
            "to_native": lambda array: self.convert.asarray(array, device=self.device),
            "to_numpy": self.convert.to_numpy,
        }


class DecoderOnlyTransformer(_Model):
    """A GPT-style decoder-only transformer (causal pre-norm blocks, tied logits).

    ``forward(tokens (B,T), *, valid=None) -> logits (B,T,V)``, ``prefill``,
    ``decode_step`` and greedy ``generate``. Dropout is not applied (inference only).
    """

    kind = "decoder_only"

    def __init__(self, config, params, *, device=None, dtype=None):
        kw = self._start(config, params, device, dtype)
        self.token_embedding = self._native(params["token_embedding.weight"])  # (V, D)
        self.layers = [
            self.classes.EncoderLayer(config, params, prefix=f"layers.{i}.", **kw)
            for i in range(config.n_layers)
        ]
        self.norm = self.classes.LayerNorm(config, params, prefix="norm.", **kw)
        # The decoder pass of _Model reads these names.
        self._embedding = self._projection = self.token_embedding  # tied: logits = h @ E.T
        self._decoder_layers, self._final_norm = self.layers, self.norm

    def _layer_inputs(self, cache, i):
        return {"causal": True}

    def prefill(self, tokens, *, valid=None):
        """Run the prompt ``tokens (B,T)``; returns ``(logits (B,T,V), cache)``."""
        valid = self._check_sequence(tokens, valid, "tokens")
        cache = self._new_cache(self.ops.shape(tokens)[0])
        return self._decode(tokens, valid, cache), cache

    def forward(self, tokens, *, valid=None):
        """``tokens (B,T)`` ints, ``valid (B,T)`` bool (default ``tokens != pad_id``) -> ``(B,T,V)``."""
        return self.prefill(tokens, valid=valid)[0]

    __call__ = forward

    def generate(self, prefix, max_new_tokens, *, use_cache=True):
        """Greedy continuation of ``prefix (B,P)`` (all real tokens) -> ``(B, P + max_new_tokens)``."""
        return greedy_decoder_only(
            self,
            prefix,
            max_new_tokens,
            use_cache=use_cache,
            **self._generation_io(),
        )


class Seq2SeqTransformer(_Model):
    """An encoder-decoder transformer (``nn.Transformer`` with ``norm_first=True``, plus RoPE).

    ``forward(src (B,S), tgt_in (B,T), *, src_valid=None, tgt_valid=None) -> (B,T,V)``,
    ``prefill``, ``decode_step``, greedy ``generate``. Dropout is not applied.
    """

    kind = "seq2seq"

    def __init__(self, config, params, *, device=None, dtype=None):
        kw = self._start(config, params, device, dtype)
        pieces = self.classes
        self.source_embedding = self._native(params["source_embedding.weight"])  # (V, D)
        self.target_embedding = self._native(params["target_embedding.weight"])  # (V, D)
        self.output_projection = self._native(params["output_projection.weight"])  # (V, D)
        self.encoder_layers = [
            pieces.EncoderLayer(config, params, prefix=f"encoder.layers.{i}.", **kw)
            for i in range(config.n_layers)
        ]
        self.encoder_norm = pieces.LayerNorm(config, params, prefix="encoder.norm.", **kw)
        self.decoder_layers = [
            pieces.DecoderLayer(config, params, prefix=f"decoder.layers.{i}.", **kw)
            for i in range(config.n_layers)
        ]
        self.decoder_norm = pieces.LayerNorm(config, params, prefix="decoder.norm.", **kw)
        # The decoder pass of _Model reads these names.
        self._embedding, self._projection = self.target_embedding, self.output_projection
        self._decoder_layers, self._final_norm = self.decoder_layers, self.decoder_norm

    def _layer_inputs(self, cache, i):
        return {"cross_kv": cache.cross_kv[i], "memory_valid": cache.memory_valid}

    def encode(self, src, *, src_valid=None):
        """``src (B,S)`` ids, ``src_valid (B,S)`` (default ``src != pad_id``) -> memory ``(B,S,D)``."""
        return self._encode(src, self._check_sequence(src, src_valid, "source"))

    def _encode(self, src, src_valid):
        """The encoder stack and its final norm, on checked inputs."""
        x = self.ops.embed(self.source_embedding, src, math.sqrt(self.config.d_model))  # (B,S,D)
        for layer in self.encoder_layers:
            x = layer(x, valid=src_valid)
        return self.encoder_norm(x)

    def prefill(self, src, tgt_in, *, src_valid=None, tgt_valid=None):
        """Encode ``src`` once and run ``tgt_in (B,T)``; returns ``(logits (B,T,V), cache)``.

        The cache holds the cross-attention keys and values of the memory and
        the decoder's self-attention keys and values.
        """
        src_valid = self._check_sequence(src, src_valid, "source")
        tgt_valid = self._check_sequence(tgt_in, tgt_valid, "target")
        B, B_tgt = self.ops.shape(src)[0], self.ops.shape(tgt_in)[0]
        if B != B_tgt:
            raise ValueError(f"source batch {B} != target batch {B_tgt}")
        memory = self._encode(src, src_valid)  # (B,S,D)
        cross_kv = [layer.multihead_attn.keys_values(memory) for layer in self.decoder_layers]
        cache = self._new_cache(B, cross_kv=cross_kv, memory_valid=src_valid)
        return self._decode(tgt_in, tgt_valid, cache), cache

    def forward(self, src, tgt_in, *, src_valid=None, tgt_valid=None):
        """Teacher-forced logits ``(B,T,V)``; zero at padded target positions."""
        return self.prefill(src, tgt_in, src_valid=src_valid, tgt_valid=tgt_valid)[0]

    __call__ = forward

    def generate(
        self, src, *, src_valid=None, bos_id=None, eos_id=None, max_new_tokens=None, use_cache=True
    ):
        """Greedy decoding from BOS -> ``(B, 1 + n)``; each row stops at its EOS, then pads.

        ``max_new_tokens`` defaults to ``max_seq_len - 1`` (the longest target that fits).
        """
        config = self.config
        return greedy_seq2seq(
            self,
            src,
            src_valid=src_valid,
            bos_id=config.bos_id if bos_id is None else bos_id,
            eos_id=config.eos_id if eos_id is None else eos_id,
            max_new_tokens=config.max_seq_len - 1 if max_new_tokens is None else max_new_tokens,
            use_cache=use_cache,
            **self._generation_io(),
        )
