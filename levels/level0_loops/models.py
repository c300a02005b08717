"""The two models at level 0, their KV cache, and incremental decoding.

Like ``layers.py`` these compute through ``self.ops``; level 1 subclasses
them with numpy's. The architecture is the methods ``_decoder`` (embed,
blocks, norm, head) and ``_encode``; the public methods around it check the
inputs and plan each pass with ``levels.common.boundary`` (which tokens are
real, their positions, what each query sees: a step per distinct window of the
layers, ``config.layer_windows``), written once for every level.

``forward`` is a pass without a cache, ``prefill`` a pass into an empty one,
``decode_step`` one token into a filled one: the same ``_decoder``.
"""

from __future__ import annotations

from typing import Any

from ..common import boundary, checks
from ..common.generation import generate_decoder_only, generate_seq2seq, stream_decoder_only
from ..common.params import check_params, param_shapes
from .layers import DecoderLayer, EncoderLayer, Module, Native, norm_class


class KVCache(boundary.CacheBook):
    """What incremental decoding keeps between steps; capacity ``max_seq_len``.

    Per layer the self-attention keys and values decoded so far, each
    ``(B,Hkv,length,Dh)`` in the level's arrays, grown by appending
    (``ops.concat``); ``cross[i]``: decoder layer ``i``'s cross-attention
    ``(k, v)`` of the encoded source, computed once. The positions, their
    validity and the length are ``boundary.CacheBook``'s. Appended keys stay
    pending until ``commit``, so a step that fails half-way leaves the cache as it was.
    """

    def __init__(self, config, batch: int, *, ops):
        super().__init__(config, batch)
        self._concat = ops.concat  # (B,Hkv,length,Dh) + (B,Hkv,T,Dh) along time
        self._first = ops.first_positions  # (B,Hkv,S,Dh) -> (B,Hkv,n,Dh)
        self._kv: list[tuple[Native, Native] | None] = [None] * config.n_layers
        self._pending: dict[int, tuple[Native, Native]] = {}

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

    def _forget(self, length: int) -> None:
        """Cut every layer's keys and values to their first ``length`` positions."""
        cut = self._first
        self._kv = [
            None if kv is None else (cut(kv[0], length), cut(kv[1], length)) for kv in self._kv
        ]

    def commit(self, step: boundary.Step) -> None:
        """Every layer has run: its keys now count as cached."""
        for index, kv in self._pending.items():
            self._kv[index] = kv
        self._pending.clear()
        super().commit(step)


class _Model(Module):
    """What both models share: the parameter check and the checks of the inputs."""

    kind: str

    def __init__(self, config, params, *, ops=None, device=None, dtype=None):
        check_params(params, param_shapes(config, self.kind))  # every problem, named, up front
        super().__init__(config, ops=ops, device=device, dtype=dtype)

    def _ids(self, tokens, what: str = "tokens", ndim: int = 2):
        """``tokens`` checked (``ndim`` axes, none empty, every id in ``[0, V)``), as the level's."""
        boundary.check_ids(
            self.ops.token_facts(tokens), self.config.vocab_size, what=what, ndim=ndim
        )
        return tokens

    def _rows(self, ids, valid, what: str = "valid") -> boundary.Rows:
        shape = self.ops.token_facts(ids)[0]
        is_bool = valid is None or self.ops.token_facts(valid)[1] == "b"
        return boundary.rows(valid, shape, is_bool, what=what)

    def _mask(self, step: boundary.Step):
        return None if step.mask is None else self.ops.bools(step.mask)

    def _plan(self, rows: boundary.Rows, **where) -> dict[int | None, boundary.Step]:
        """The pass over ``rows (B,T)``: a step per distinct window of the layers; ``where``
        is ``cache=`` or ``position_offset=`` (``boundary.plan_layers``)."""
        return boundary.plan_layers(rows, windows=self.config.layer_windows, **where)

    def _sees(self, steps: dict) -> dict:
        """What each layer's queries may see: ``{window: (mask, window by slot)}``, each mask in
        this level's arrays, built once per pass for all the layers of its window."""
        return {w: (self._mask(step), step.window) for w, step in steps.items()}

    def _zeroed(self, logits, rows: boundary.Rows):
        """Logits ``(B,T,V)`` with every padded position exactly zero."""
        return logits if boundary.all_real(rows) else self.ops.zero_padded(logits, rows)

    def _layers(self, config, params, prefix: str, Layer) -> list:
        """``Layer`` ``{prefix}{i}.`` for each layer ``i``, each with its RoPE base."""
        kw = self._children()
        return [
            Layer(config, params, prefix=f"{prefix}{i}.", rope_base=config.rope_base_of(w), **kw)
            for i, w in enumerate(config.layer_windows)
        ]

    def new_cache(self, batch: int) -> KVCache:
        """An empty KV cache of capacity ``max_seq_len`` for ``batch`` rows."""
        return KVCache(self.config, batch, ops=self.ops)

    def _one_position(self, tokens, what: str):
        """A decode step's ``tokens (B,)``, checked -> ``(B,1)`` ids and their ``(B,1)`` validity."""
        ids = self.ops.unsqueeze_time(self._ids(tokens, what, ndim=1))  # (B,) -> (B,1)
        return ids, [[True] for _ in range(len(ids))]


class DecoderOnlyTransformer(_Model):
    """A GPT-style decoder-only transformer (causal pre-norm blocks, tied logits by default).

    ``forward(tokens (B,T), *, valid=None) -> logits (B,T,V)``, ``prefill``,
    ``decode_step``, ``generate`` and ``stream``. Dropout is not applied (inference only).
    """

    kind = "decoder_only"

    def __init__(self, config, params, *, ops=None, device=None, dtype=None):
        super().__init__(config, params, ops=ops, device=device, dtype=dtype)
        kw = self._children()
        self.token_embedding = self._native(params["token_embedding.weight"])  # (V, D)
        self.layers = self._layers(config, params, "layers.", EncoderLayer)
        self.norm = norm_class(config)(config, params, prefix="norm.", **kw)
        # Tied: logits = h @ E^T with the input embedding E itself (one copy: as Python
        # floats Gemma 3's 262k x 640 table alone is 5 GB); untied: a matrix of its own.
        self.output_projection = self.token_embedding  # (V, D)
        if not config.tie_embeddings:
            self.output_projection = self._native(params["output_projection.weight"])

    def _decoder(self, ids, steps: dict, cache: KVCache | None, last=None) -> Native:
        """The architecture: raw logits ``(B,T,V)`` of checked ``ids (B,T)`` for ``steps``
        (one per window, ``_plan``); with ``last`` (a slot per row), ``(B,1,V)`` there only."""
        ops, sees = self.ops, self._sees(steps)
        step = next(iter(steps.values()))  # what every window's step shares: the positions
        # sqrt(D) (by default) so that the stream starts at unit variance.
        x = ops.embed(self.token_embedding, ids, self.config.embedding_scale)  # (B,T,D)
        for i, (layer, w) in enumerate(zip(self.layers, self.config.layer_windows, strict=True)):
            mask, window = sees[w]
            x = layer(
                x,
                mask=mask,
                causal=True,
                window=window,
                position_offset=step.offset,
                cache=cache,
                index=i,
            )  # (B,T,D)
        if last is not None:  # the head is the largest product (V x D a position): skip the rest
            x = ops.at_positions(x, last)  # (B,T,D) -> (B,1,D)
        logits = ops.linear(self.norm(x), self.output_projection, None)  # (B,T,D) @ (D,V)
        if cache is not None:
            cache.commit(step)  # only now do the step's keys count
        return logits

    def logits(self, tokens, *, valid=None, position_offset=0) -> tuple[Native, boundary.Rows]:
        """``(logits (B,T,V), valid (B,T))`` without zeroing the padded positions (for training)."""
        ids = self._ids(tokens)
        T = len(ids[0])
        checks.check_position_offset(position_offset, T, self.config.max_seq_len)
        rows = self._rows(ids, valid)
        return self._decoder(ids, self._plan(rows, position_offset=position_offset), None), rows

    def forward(self, tokens, *, valid=None, position_offset=0) -> Native:
        """``tokens (B,T)`` ints, ``valid (B,T)`` bool (default: every token is real) -> ``(B,T,V)``;
        ``position_offset``: the first token's position (RoPE starts there)."""
        logits, rows = self.logits(tokens, valid=valid, position_offset=position_offset)
        return self._zeroed(logits, rows)

    __call__ = forward

    def prefill(self, tokens, *, valid=None, last_only=False) -> tuple[Native, KVCache]:
        """Run the prompt ``tokens (B,T)`` and keep its keys and values: ``(logits (B,T,V), cache)``;
        ``last_only``: the logits of each row's last real token only, ``(B,V)`` (what a
        generator needs)."""
        ids = self._ids(tokens)
        rows = self._rows(ids, valid)
        checks.check_length(len(rows[0]), self.config.max_seq_len, what="tokens length")
        cache = self.new_cache(len(rows))
        steps = self._plan(rows, cache=cache)
        if last_only:
            last = boundary.last_real(rows)
            return self.ops.last_position(self._decoder(ids, steps, cache, last)), cache
        return self._zeroed(self._decoder(ids, steps, cache), rows), cache

    def decode_step(self, tokens, cache: KVCache) -> Native:
        """Append one position per row, ``tokens (B,)``, to ``cache`` in place -> logits ``(B,V)``."""
        ids, rows = self._one_position(tokens, "tokens")
        cache.check(len(rows), 1, "tokens")  # raises before anything is written
        steps = self._plan(rows, cache=cache)
        return self.ops.last_position(self._decoder(ids, steps, cache))  # (B,V)

    def generate(self, prefix, max_new_tokens, **options):
        """Continue ``prefix (B,P)`` -> ``(B, P + max_new_tokens)``; greedy by default.

        ``options``: ``valid``, ``use_cache``, ``temperature``, ``top_k``, ``top_p``,
        ``seed``, ``eos_id``, as ``levels.common.generation.generate_decoder_only`` takes them.
        """
        return generate_decoder_only(self, prefix, max_new_tokens, **options)

    def stream(self, prompt, max_new_tokens, **options):
        """Continue one prompt ``(P,)``, yielding each new token id as it is chosen (greedy by
        default); ``options`` as ``levels.common.generation.stream_decoder_only`` takes them."""
        return stream_decoder_only(self, prompt, max_new_tokens, **options)


class Seq2SeqTransformer(_Model):
    """An encoder-decoder transformer (``nn.Transformer`` with ``norm_first=True``, plus RoPE).

    ``forward(src (B,S), tgt_in (B,T), *, src_valid=None, tgt_valid=None) -> (B,T,V)``,
    ``encode``, ``prefill``, ``decode_step`` and ``generate``. Dropout is not applied.
    """

    kind = "seq2seq"

    def __init__(self, config, params, *, ops=None, device=None, dtype=None):
        super().__init__(config, params, ops=ops, device=device, dtype=dtype)
        kw = self._children()
        self.source_embedding = self._native(params["source_embedding.weight"])  # (V, D)
        self.target_embedding = self._native(params["target_embedding.weight"])  # (V, D)
        self.output_projection = self._native(params["output_projection.weight"])  # (V, D)
        self.encoder_layers = self._layers(config, params, "encoder.layers.", EncoderLayer)
        self.encoder_norm = norm_class(config)(config, params, prefix="encoder.norm.", **kw)
        self.decoder_layers = self._layers(config, params, "decoder.layers.", DecoderLayer)
        self.decoder_norm = norm_class(config)(config, params, prefix="decoder.norm.", **kw)

    # -- the architecture ---------------------------------------------------------

    def _encode(self, src, src_steps: dict) -> Native:
        """The encoder stack and its final norm -> memory ``(B,S,D)``, bidirectional over the
        real tokens."""
        x = self.ops.embed(self.source_embedding, src, self.config.embedding_scale)  # (B,S,D)
        sees = self._sees(src_steps)
        for layer, w in zip(self.encoder_layers, self.config.layer_windows, strict=True):
            mask, window = sees[w]
            x = layer(x, mask=mask, window=window)  # (B,S,D)
        return self.encoder_norm(x)

    def _decoder(self, tgt, steps: dict, memory, memory_mask, cache) -> Native:
        """Raw logits ``(B,T,V)`` of checked ``tgt (B,T)`` following the cache's positions."""
        ops, sees = self.ops, self._sees(steps)
        step = next(iter(steps.values()))  # what every window's step shares: the positions
        x = ops.embed(self.target_embedding, tgt, self.config.embedding_scale)  # (B,T,D)
        windows = self.config.layer_windows
        for i, (layer, w) in enumerate(zip(self.decoder_layers, windows, strict=True)):
            mask, window = sees[w]
            x = layer(
                x,
                memory,
                mask=mask,
                memory_mask=memory_mask,
                window=window,
                position_offset=step.offset,
                cache=cache,
                index=i,
            )  # (B,T,D)
        logits = ops.linear(self.decoder_norm(x), self.output_projection, None)  # (B,T,V)
        if cache is not None:
            cache.commit(step)
        return logits

    # -- the boundary --------------------------------------------------------------

    def _source(self, src, src_valid) -> tuple[Any, dict, Any, boundary.Rows]:
        """Checked source ids, the encoder's steps (no cache), the cross-attention's mask of
        its real tokens (no window), and its rows."""
        src = self._ids(src, "source tokens")
        rows = self._rows(src, src_valid, "src_valid")
        checks.check_length(len(rows[0]), self.config.max_seq_len, what="source length")
        return src, self._plan(rows), self._mask(boundary.plan(rows, window=None)), rows

    def _target(self, tgt_in, tgt_valid) -> tuple[Any, boundary.Rows]:
        tgt = self._ids(tgt_in, "target tokens")
        rows = self._rows(tgt, tgt_valid, "tgt_valid")
        checks.check_length(len(rows[0]), self.config.max_seq_len, what="target length")
        return tgt, rows

    def logits(self, src, tgt_in, *, src_valid=None, tgt_valid=None):
        """``(logits (B,T,V), tgt_valid (B,T))`` without zeroing the padded targets (for training)."""
        tgt, rows = self._target(tgt_in, tgt_valid)  # the target first: its errors before encoding
        src, src_steps, memory_mask, src_rows = self._source(src, src_valid)
        checks.check_batch(len(rows), len(src_rows), what="target tokens for this source")
        memory = self._encode(src, src_steps)  # (B,S,D)
        return self._decoder(tgt, self._plan(rows), memory, memory_mask, None), rows

    def forward(self, src, tgt_in, *, src_valid=None, tgt_valid=None) -> Native:
        """Teacher-forced logits ``(B,T,V)``; zero at padded target positions."""
        logits, rows = self.logits(src, tgt_in, src_valid=src_valid, tgt_valid=tgt_valid)
        return self._zeroed(logits, rows)

    __call__ = forward

    def encode(self, src, *, src_valid=None) -> Native:
        """``src (B,S)`` ids, ``src_valid (B,S)`` (default: every token is real) -> memory ``(B,S,D)``."""
        src, steps, _, _ = self._source(src, src_valid)
        return self._encode(src, steps)

    def prefill(self, src, tgt_in, *, src_valid=None, tgt_valid=None) -> tuple[Native, KVCache]:
        """Encode ``src`` once and run ``tgt_in (B,T)``: ``(logits (B,T,V), cache)``.

        The cache keeps each decoder layer's cross-attention keys and values (of
        the encoded source) and its self-attention keys and values.
        """
        tgt, rows = self._target(tgt_in, tgt_valid)
        src, src_steps, memory_mask, src_rows = self._source(src, src_valid)
        checks.check_batch(len(rows), len(src_rows), what="target tokens for this source")
        cache = self.new_cache(len(rows))
        cache.memory_mask = memory_mask
        steps = self._plan(rows, cache=cache)
        memory = self._encode(src, src_steps)  # (B,S,D)
        return self._zeroed(self._decoder(tgt, steps, memory, memory_mask, cache), rows), cache

    def decode_step(self, tokens, cache: KVCache) -> Native:
        """Append one target position per row, ``tokens (B,)``, to ``cache`` -> logits ``(B,V)``."""
        ids, rows = self._one_position(tokens, "target tokens")
        cache.check(len(rows), 1, "target tokens")
        steps = self._plan(rows, cache=cache)
        return self.ops.last_position(self._decoder(ids, steps, None, cache.memory_mask, cache))

    def generate(self, src, **options):
        """Decoding from BOS -> ``(B, 1 + n)``; each row stops at its EOS, then pads.

        ``options``: ``src_valid``, ``bos_id``, ``eos_id``, ``max_new_tokens`` (default
        ``max_seq_len - 1``, the longest target that fits), ``use_cache``, ``temperature``,
        ``top_k``, ``top_p``, ``seed``, as ``levels.common.generation.generate_seq2seq``
        takes them.
        """
        return generate_seq2seq(self, src, **options)
