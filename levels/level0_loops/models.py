"""The two models at level 0, their KV cache, and incremental decoding.

Like ``layers.py`` these compute through ``self.ops``; level 1 subclasses
them with numpy's. The architecture is the method ``compute`` (embed, blocks,
norm, head; seq2seq: ``_encode`` and ``_decoder``). The public methods
(``forward``, ``prefill``, ``decode_step``, ``generate``) are ``levels.common.boundary``'s,
written once for every level: they check the inputs and plan each pass (which
tokens are real, their positions, what each query sees: a step per distinct
window of the layers, ``config.layer_windows``) in numpy, and convert what the
architecture reads with the level's own ``ops`` (``arrays``).

``forward`` is a pass without a cache, ``prefill`` a pass into an empty one,
``decode_step`` one token into a filled one: the same ``compute``.
"""

from __future__ import annotations

from ..common import boundary
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
    """What both models share: the parameter check, and the arrays ``boundary``'s public
    methods convert the inputs with (``ops``: its converters, ``zero_padded``,
    ``last_position``)."""

    kind: str

    def __init__(self, config, params, *, ops=None, device=None, dtype=None):
        check_params(params, param_shapes(config, self.kind))  # every problem, named, up front
        super().__init__(config, ops=ops, device=device, dtype=dtype)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    @staticmethod
    def _inference(run):
        return run  # no autograd to switch off around the generation loops

    def _converters(self) -> dict:
        return {}  # the generation loops default to ``self.ops``' converters

    @property
    def arrays(self):
        return self.ops  # the level's array functions (a training tape records through them)

    def _layers(self, config, params, prefix: str, Layer) -> list:
        """``Layer`` ``{prefix}{i}.`` for each layer ``i``, each with its RoPE base."""
        # option window_pattern, rope_local_base: each layer's window and RoPE base (Gemma 3)
        kw = self._children()
        return [
            Layer(config, params, prefix=f"{prefix}{i}.", rope_base=config.rope_base_of(w), **kw)
            for i, w in enumerate(config.layer_windows)
        ]

    def new_cache(self, batch: int) -> KVCache:
        """An empty KV cache of capacity ``max_seq_len`` for ``batch`` rows."""
        return KVCache(self.config, batch, ops=self.ops)


class DecoderOnlyTransformer(boundary.DecoderOnlyEdge, _Model):
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
        # option tie_embeddings: the head is the embedding itself, or a matrix of its own
        # Tied: logits = h @ E^T with the input embedding E itself (one copy: as Python
        # floats Gemma 3's 262k x 640 table alone is 5 GB); untied: a matrix of its own.
        self.output_projection = self.token_embedding  # (V, D)
        if not config.tie_embeddings:
            self.output_projection = self._native(params["output_projection.weight"])

    def compute(
        self, ids, positions, sees: dict, cache: KVCache | None = None, last=None
    ) -> Native:
        """The architecture: embedding, the blocks, the final norm, the head.

        ``ids (B,T)`` checked ids; ``positions`` the first one's position (an int, or one
        per row); ``sees`` what each layer's queries may see, ``{window: (mask or None,
        window by slot)}`` (``_sees``); ``cache``, when given, takes each layer's new keys
        and values (the caller commits them); ``last`` (a slot per row) keeps only those
        positions for the head -> raw logits ``(B,T,V)`` (``(B,1,V)`` with ``last``).
        """
        ops = self.ops
        # option scale_embeddings: times sqrt(D), so the stream starts at unit variance; or 1
        x = ops.embed(self.token_embedding, ids, self.config.embedding_scale)  # (B,T,D)
        # option window_pattern: each layer sees what its window's step planned (sees[w])
        for i, (layer, w) in enumerate(zip(self.layers, self.config.layer_windows, strict=True)):
            mask, window = sees[w]
            x = layer(
                x,
                mask=mask,
                causal=True,
                window=window,
                position_offset=positions,
                cache=cache,
                index=i,
            )  # (B,T,D)
        if last is not None:  # the head is the largest product (V x D a position): skip the rest
            x = ops.at_positions(x, last)  # (B,T,D) -> (B,1,D)
        return ops.linear(self.norm(x), self.output_projection, None)  # (B,T,D) @ (D,V)


class Seq2SeqTransformer(boundary.Seq2SeqEdge, _Model):
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

    def _encode(self, src, sees: dict) -> Native:
        """The encoder stack and its final norm -> memory ``(B,S,D)``, bidirectional over the
        real tokens (``sees`` as ``compute``'s)."""
        # option scale_embeddings, window_pattern: as in ``compute``
        x = self.ops.embed(self.source_embedding, src, self.config.embedding_scale)  # (B,S,D)
        for layer, w in zip(self.encoder_layers, self.config.layer_windows, strict=True):
            mask, window = sees[w]
            x = layer(x, mask=mask, window=window)  # (B,S,D)
        return self.encoder_norm(x)

    def _decoder(self, tgt, positions, sees: dict, memory, memory_mask, cache) -> Native:
        """Raw logits ``(B,T,V)`` of checked ``tgt (B,T)`` over ``memory (B,S,D)``: ``positions``,
        ``sees`` and ``cache`` as ``DecoderOnlyTransformer.compute``'s."""
        # option scale_embeddings, window_pattern: as in ``compute``
        ops = self.ops
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
                position_offset=positions,
                cache=cache,
                index=i,
            )  # (B,T,D)
        return ops.linear(self.decoder_norm(x), self.output_projection, None)  # (B,T,V)
