"""The two models at level 0 and their KV cache.

Like ``layers.py`` these compute through ``self.ops``; level 1 subclasses them with
numpy's. Each model is two layers, read in this order:

* **the transformer** (``Transformer``, ``EncoderDecoder``): token ids and each token's
  position in, logits out, its inputs trusted. Embed, the blocks, the final norm, the
  head. What a query may see is built here, from the positions, once per distinct
  window of the layers (``config.layer_windows``: Gemma 3's local and global layers
  need two);
* **the public methods** (``DecoderOnlyTransformer``, ``Seq2SeqTransformer``):
  ``forward(tokens, *, valid=None)``, ``prefill``, ``decode_step``, ``generate`` and
  the rest, the same functions at every level (``levels.common.public``): they check
  the inputs, make the positions and call the transformer.
"""

from __future__ import annotations

import copy

from ..common import public
from ..common.cache import Cache
from ..common.params import check_params, param_shapes
from .layers import DecoderLayer, EncoderLayer, Module, Native, norm_class


class KVCache(Cache):
    """What incremental decoding keeps between steps: for each layer the keys and values of
    the slots filled so far, ``(B,Hkv,length,Dh)``, and every slot's position ``(B,length)``
    (``-1``: padding), in the level's arrays; capacity ``max_seq_len`` slots.

    A pass calls ``extend(positions)`` once (the new slots' positions: the cache now holds
    them), then each layer ``update(index, k, v)``. ``rollback`` (setting the length back)
    and an encoder-decoder's memory keys are ``levels.common.cache.Cache``'s.
    """

    def __init__(self, config, batch: int, *, ops):
        super().__init__(config, batch)
        self.ops = ops
        self.positions: Native = None  # (B, length), once a pass has filled a slot
        self.keys: list[Native] = [None] * config.n_layers  # (B,Hkv,length,Dh) each
        self.values: list[Native] = [None] * config.n_layers

    def extend(self, positions: Native) -> Native:
        """Take ``T`` new slots at ``positions (B,T)`` -> every slot's position ``(B,length+T)``."""
        if self.length:  # after the slots kept (a rollback's are dropped)
            positions = self.ops.concat(self._kept(self.positions, 1), positions, axis=1)
        self.positions, self.length = positions, len(positions[0])
        return positions

    def update(self, index: int, k: Native, v: Native) -> tuple[Native, Native]:
        """Layer ``index``'s keys and values of the new slots, ``(B,Hkv,T,Dh)`` -> of every slot,
        ``(B,Hkv,length,Dh)``."""
        if self.length > len(k[0][0]):  # after the slots before this pass
            k = self.ops.concat(self._kept(self.keys[index], 2, len(k[0][0])), k, axis=2)
            v = self.ops.concat(self._kept(self.values[index], 2, len(v[0][0])), v, axis=2)
        self.keys[index], self.values[index] = k, v
        return k, v

    def _kept(self, x: Native, axis: int, new: int = 0) -> Native:
        """``x`` cut to the slots before a pass of ``new`` along ``axis``, where a rollback left
        it longer (as it is otherwise: no copy)."""
        kept = self.length - new
        held = len(x[0]) if axis == 1 else len(x[0][0])
        return x if held == kept else self.ops.prefix(x, kept, axis=axis)

    def next_positions(self):
        """Each row's next position, ``(B,)`` numpy: after its largest one (0 when empty)."""
        if not self.length:
            return self.ops.to_numpy([0] * self.batch)
        positions = self.ops.prefix(self.positions, self.length, axis=1)
        return self.ops.to_numpy(self.ops.next_positions(positions))


class _Plain(Module):
    """What both transformers share: the parameter check, a stack of layers, the cache.

    ``Cache`` is the class ``new_cache`` builds (a class attribute, as ``ops`` is, so a
    learner's rung names its own)."""

    kind: str
    Cache = KVCache

    def __init__(self, config, params, *, ops=None, device=None, dtype=None):
        check_params(params, param_shapes(config, self.kind))  # every problem, named, up front
        super().__init__(config, ops=ops, device=device, dtype=dtype)
        # option window_pattern: each layer's window (None: every key), one per layer
        self.windows = config.layer_windows

    @property
    def arrays(self):
        return self.ops  # the level's array functions, which the public methods convert with

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def _layers(self, config, params, prefix: str, Layer) -> list:
        """``Layer`` ``{prefix}{i}.`` for each layer ``i``, each with its RoPE base."""
        # option window_pattern, rope_local_base: each layer's window and RoPE base (Gemma 3)
        kw = self._children()
        return [
            Layer(config, params, prefix=f"{prefix}{i}.", rope_base=config.rope_base_of(w), **kw)
            for i, w in enumerate(config.layer_windows)
        ]

    def _masks(self, positions, keys, causal: bool = True) -> list:
        """What each layer's queries may see, ``(B,1,T,S)``, by the positions of the queries
        ``(B,T)`` and the keys ``(B,S)``: built once for each distinct window."""
        windows = self.windows  # each layer's (Gemma 3's local and global layers)
        built = {w: self.ops.visible(positions, keys, w, causal=causal) for w in set(windows)}
        return [built[w] for w in windows]

    def new_cache(self, batch: int) -> KVCache:
        """An empty KV cache of capacity ``max_seq_len`` for ``batch`` rows."""
        return self.Cache(self.config, batch, ops=self.ops)


class Transformer(_Plain):
    """The decoder-only transformer: embedding, causal pre-norm blocks, final norm, logits
    (tied to the embedding by default). Dropout is not applied (inference only)."""

    kind = "decoder_only"
    Block = EncoderLayer  # the block it stacks (a class attribute: a learner's rung names its own)

    def __init__(self, config, params, *, ops=None, device=None, dtype=None):
        super().__init__(config, params, ops=ops, device=device, dtype=dtype)
        kw = self._children()
        self.token_embedding = self._native(params["token_embedding.weight"])  # (V, D)
        # option scale_embeddings: times sqrt(D), so the stream starts at unit variance; or 1
        self.embedding_scale = config.embedding_scale
        self.layers = self._layers(config, params, "layers.", self.Block)
        self.norm = norm_class(config)(config, params, prefix="norm.", **kw)
        # option tie_embeddings: the head is the embedding itself, or a matrix of its own
        # Tied: logits = h @ E^T with the input embedding E itself (one copy: as Python
        # floats Gemma 3's 262k x 640 table alone is 5 GB); untied: a matrix of its own.
        self.output_projection = self.token_embedding  # (V, D)
        if not config.tie_embeddings:
            self.output_projection = self._native(params["output_projection.weight"])

    def first_layers(self, n: int) -> Transformer:
        """This model cut after its first ``n`` layers, with its own final norm and head: a
        model of its own over the same parameters (speculative decoding's layer-skip
        draft). A shallow copy: its layers are this model's own objects."""
        draft = copy.copy(self)
        draft.config, draft.layers = self.config.first_layers(n), self.layers[:n]
        draft.windows = self.windows[:n]
        return draft

    def forward(self, ids, positions, cache: KVCache | None = None, last: bool = False) -> Native:
        """``ids (B,T)`` in ``[0, V)``, ``positions (B,T)`` (``-1``: padding) -> logits ``(B,T,V)``.

        With a ``cache``, the tokens come after its slots, and their keys and values join
        it. ``last``: the head on each row's last real token only -> ``(B,1,V)``.
        """
        ops = self.ops
        x = ops.embed(self.token_embedding, ids, self.embedding_scale)  # (B,T,D)
        keys = positions if cache is None else cache.extend(positions)  # (B,S): keys' positions
        masks = self._masks(positions, keys)  # (B,1,T,S) a layer: what its queries may see
        for i, (layer, mask) in enumerate(zip(self.layers, masks, strict=True)):
            x = layer(x, positions, mask, cache, i)  # (B,T,D)
        if last:  # the head is the largest product (V x D a position): skip the rest
            x = ops.at_positions(x, ops.last_slots(positions))  # (B,T,D) -> (B,1,D)
        return ops.linear(self.norm(x), self.output_projection, None)  # (B,T,D) @ (D,V)


class EncoderDecoder(_Plain):
    """The encoder-decoder transformer (``nn.Transformer`` with ``norm_first=True``, plus RoPE):
    ``memory(src, positions)`` encodes, ``forward(ids, positions, memory, memory_positions,
    cache=None)`` decodes. Dropout is not applied."""

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

    def memory(self, src, positions) -> Native:
        """The encoder: ``src (B,S)`` ids at ``positions (B,S)`` -> memory ``(B,S,D)``, each token
        seeing every real token of its row (both ways)."""
        # option scale_embeddings: as in ``Transformer.forward``
        x = self.ops.embed(self.source_embedding, src, self.config.embedding_scale)  # (B,S,D)
        masks = self._masks(positions, positions, causal=False)
        for layer, mask in zip(self.encoder_layers, masks, strict=True):
            x = layer(x, positions, mask)  # (B,S,D)
        return self.encoder_norm(x)

    def forward(self, ids, positions, memory, memory_positions, cache=None) -> Native:
        """The decoder: ``ids (B,T)`` at ``positions (B,T)`` over ``memory (B,S,D)`` of the
        source at ``memory_positions (B,S)`` -> logits ``(B,T,V)``; ``cache`` as in
        ``Transformer.forward`` (it also keeps the memory's keys: later calls may pass None)."""
        ops = self.ops
        # option scale_embeddings: as in ``Transformer.forward``
        x = ops.embed(self.target_embedding, ids, self.config.embedding_scale)  # (B,T,D)
        keys = positions if cache is None else cache.extend(positions)  # (B,S)
        cross = ops.visible(positions, memory_positions, causal=False)  # (B,1,T,S): real sources
        masks = self._masks(positions, keys)
        for i, (layer, mask) in enumerate(zip(self.decoder_layers, masks, strict=True)):
            x = layer(x, positions, mask, memory, cross, cache, i)  # (B,T,D)
        return ops.linear(self.decoder_norm(x), self.output_projection, None)  # (B,T,V)


class DecoderOnlyTransformer(public.DecoderOnly, Transformer):
    """The decoder-only model a user calls: ``forward(tokens (B,T), *, valid=None) -> logits
    (B,T,V)``, ``logits``, ``prefill``, ``decode_step``, ``extend``, ``generate`` and
    ``stream``, taking nested lists (or numpy). They are the methods every rung's model
    has (``levels.common.public.DecoderOnly``): each checks its inputs, makes the
    positions, and calls ``Transformer.forward``, kept as ``transformer`` here since the
    public ``forward`` takes tokens and ``valid``."""

    transformer = Transformer.forward


class Seq2SeqTransformer(public.Seq2Seq, EncoderDecoder):
    """The encoder-decoder model a user calls, level 0's ``EncoderDecoder`` with the methods
    of every rung (``levels.common.public.Seq2Seq``): ``forward(src (B,S), tgt_in (B,T), *,
    src_valid=None, tgt_valid=None) -> (B,T,V)``, ``logits``, ``encode``, ``prefill``,
    ``decode_step`` and ``generate``."""

    transformer = EncoderDecoder.forward
