"""The two models: decoder-only (tied logits) and encoder-decoder (seq2seq).

Both check their parameters up front, validate token ids before any embedding
gather, and share one step function between ``forward`` (no cache),
``prefill`` (empty cache) and ``decode_step`` (one new position).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from ..common.checks import (
    NO_VALID_TOKEN_MESSAGE,
    check_batch,
    check_length,
    check_position_offset,
    check_token_ids,
    check_valid_shape,
)
from ..common.config import TransformerConfig
from ..common.generation import generate_decoder_only, generate_seq2seq
from ..common.params import check_params, param_shapes
from .arrays import asarray, dtype_kind, to_numpy
from .kernels import LEVEL2_KERNELS, Kernels
from .layers import DecoderLayer, EncoderLayer
from .parameters import fetch


def _ids(tokens, vocab_size: int, device, what: str = "tokens", ndim: int = 2) -> torch.Tensor:
    """``tokens`` as checked int64 ids on ``device``: ``ndim`` axes, none empty, all in ``[0, V)``.

    Checked before the embedding gather reads memory; the range check waits for
    the device once (one ``aminmax``). Any integer dtype is taken as ids (as
    int64, so a uint8 tensor is never mistaken for a boolean index).
    """
    if not isinstance(tokens, torch.Tensor):
        tokens = asarray(tokens, device=device)

    def bounds() -> tuple[int, int]:
        lo, hi = torch.aminmax(tokens)
        return int(lo), int(hi)

    check_token_ids(
        tokens.shape,
        dtype_kind(tokens.dtype),
        tokens.dtype,
        bounds,
        vocab_size,
        what=what,
        ndim=ndim,
    )
    return tokens.to(device=device, dtype=torch.long)


def _resolve_valid(tokens: torch.Tensor, valid, pad_id: int, what: str = "valid") -> torch.Tensor:
    """``valid (B,T)`` bool, default ``tokens != pad_id``; every row needs a real token."""
    if valid is None:
        valid = tokens != pad_id
    elif not isinstance(valid, torch.Tensor):
        valid = asarray(valid)
    check_valid_shape(valid.shape, tokens.shape, valid.dtype == torch.bool, what=what)
    valid = valid.to(tokens.device)
    if not bool(valid.any(dim=1).all()):
        raise ValueError(f"{what}: {NO_VALID_TOKEN_MESSAGE}")
    return valid


class _Embedding(nn.Module):
    """A lookup table ``weight (V, D)`` with the canonical name ``{prefix}weight``."""

    def __init__(self, config: TransformerConfig, params, name: str, *, device=None, dtype=None):
        super().__init__()
        shape = (config.vocab_size, config.d_model)
        self.weight = fetch(params, name, shape, device=device, dtype=dtype)
        self.scale = config.embedding_scale  # sqrt(D), so the stream starts at unit variance; or 1

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # Token ids were checked against [0, V) by the caller; this gather trusts them.
        x = self.weight[tokens]  # (B,T) -> (B,T,D)
        return x if self.scale == 1.0 else x * self.scale


class _Stack(nn.Module):
    """``layers.{i}`` and a final ``norm``: the encoder or decoder of the seq2seq model."""

    def __init__(self, layers: list[nn.Module], norm: nn.Module):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm


class _Model(nn.Module):
    """What both models share: the parameter check, the kernels, the input checks, the causal step."""

    kernels: Kernels = LEVEL2_KERNELS

    def __init__(self, config: TransformerConfig, params, kind: str, *, dtype, kernels):
        super().__init__()
        check_params(params, param_shapes(config, kind))
        if kernels is not None:
            self.kernels = kernels
        self.config = config
        self.dtype = dtype or torch.float32

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def _converters(self) -> dict:
        """What the shared generation loop needs to move tokens between numpy and here."""
        return {"to_native": partial(asarray, device=self.device), "to_numpy": to_numpy}

    def new_cache(self, batch: int):
        """An empty KV cache of capacity ``max_seq_len`` for ``batch`` rows."""
        return self.kernels.kv_cache(self.config, batch, device=self.device, dtype=self.dtype)

    def _ids(self, tokens, what: str = "tokens", ndim: int = 2) -> torch.Tensor:
        return _ids(tokens, self.config.vocab_size, self.device, what, ndim)

    def _check_step(self, tokens: torch.Tensor, cache, what: str) -> None:
        """Room for ``tokens (B,T)``: at most ``max_seq_len``, or what the cache has left.

        Checked once per call, before anything is written (on a GPU each check
        waits for the device), so a refused call leaves the cache bit-identical.
        """
        if cache is None:
            check_length(tokens.shape[1], self.config.max_seq_len, what=f"{what} length")
        else:
            check_batch(tokens.shape[0], cache.batch, what=f"{what} for this cache")
            cache.check_room(tokens.shape[1])  # capacity max_seq_len; raises before any write

    def _causal_step(self, tokens, valid, cache, *, embedding, blocks, head) -> torch.Tensor:
        """Logits ``(B,T,V)`` for ``tokens (B,T)`` placed after the cache's filled positions.

        ``blocks(x (B,T,D), key_valid (B, length+T)) -> (B,T,D)`` runs the layers,
        ``head`` maps ``(B,T,D) -> (B,T,V)``. Callers have checked ``tokens``
        and run ``_check_step``; the cache's length grows only after the last layer.
        """
        key_valid = valid if cache is None else cache.key_valid(valid)  # (B, length + T)
        # A decode step (only those follow filled positions) of a cache with no padding:
        # every key and the new token are real, so there is no mask to build or apply.
        all_real = cache is not None and cache.length > 0 and not cache.ragged
        logits = head(blocks(embedding(tokens), None if all_real else key_valid))  # (B,T,V)
        if cache is not None:
            cache.advance(valid)
        if all_real:
            return logits
        # masked_fill gives exact zeros and a zero (finite) gradient at padding.
        return logits.masked_fill(~valid[..., None], 0.0)  # (B,T,V)


def _one_position(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoding input ``tokens (B,)`` -> ``tokens (B,1)`` and an all-True ``valid (B,1)``."""
    tokens = tokens.reshape(-1, 1)  # (B,) -> (B,1)
    return tokens, torch.ones_like(tokens, dtype=torch.bool)


class DecoderOnlyTransformer(_Model):
    """A GPT-style language model: embedding, causal pre-norm blocks, final norm, logits (tied by default).

    ``state_dict()`` keys are the canonical names (``token_embedding.weight``,
    ``layers.{i}.*``, ``norm.*``). ``kernels`` selects the attention core,
    LayerNorm and KV cache (default: the class attribute).
    """

    def __init__(
        self,
        config: TransformerConfig,
        params,
        *,
        device=None,
        dtype=None,
        kernels: Kernels | None = None,
    ):
        super().__init__(config, params, "decoder_only", dtype=dtype, kernels=kernels)
        kw = {"device": device, "dtype": self.dtype}
        self.token_embedding = _Embedding(config, params, "token_embedding.weight", **kw)
        self.layers = nn.ModuleList(
            EncoderLayer(config, params, prefix=f"layers.{i}.", kernels=self.kernels, **kw)
            for i in range(config.n_layers)
        )
        self.norm = self.kernels.norm(config)(config, params, prefix="norm.", **kw)
        if not config.tie_embeddings:  # a head of its own: output_projection.weight (V, D)
            self.output_projection = nn.Linear(
                config.d_model, config.vocab_size, bias=False, device="meta"
            )
            self.output_projection.weight = fetch(
                params, "output_projection.weight", (config.vocab_size, config.d_model), **kw
            )

    def _step(
        self, tokens: torch.Tensor, valid: torch.Tensor, cache, position_offset: int = 0
    ) -> torch.Tensor:
        """Logits ``(B,T,V)`` for checked ``tokens (B,T)`` following the cache's filled positions
        (or, without a cache, starting at ``position_offset``)."""

        def blocks(x: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
            for i, layer in enumerate(self.layers):
                x = layer(
                    x,
                    valid=key_valid,
                    causal=True,
                    cache=cache,
                    index=i,
                    position_offset=position_offset,
                )  # (B,T,D)
            return x

        def logits(x: torch.Tensor) -> torch.Tensor:
            # Tied: h @ E^T with the input embedding E; untied: the head's own (V, D).
            head = getattr(self, "output_projection", self.token_embedding)
            return self.norm(x) @ head.weight.T  # (B,T,D) @ (D,V) -> (B,T,V)

        self._check_step(tokens, cache, "tokens")
        return self._causal_step(
            tokens, valid, cache, embedding=self.token_embedding, blocks=blocks, head=logits
        )

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        valid: torch.Tensor | None = None,
        position_offset: int = 0,
    ) -> torch.Tensor:
        """``tokens (B,T)`` ints, ``valid (B,T)`` bool (default ``tokens != pad_id``) -> ``(B,T,V)``.

        ``position_offset``: the position of the first token, for a shard of a longer
        sequence (context parallelism, ``levels.parallel``); RoPE rotates from there.
        """
        tokens = self._ids(tokens)
        check_position_offset(position_offset, tokens.shape[1], self.config.max_seq_len)
        valid = _resolve_valid(tokens, valid, self.config.pad_id)
        return self._step(tokens, valid, None, position_offset)

    def prefill(self, tokens: torch.Tensor, *, valid: torch.Tensor | None = None):
        """Run the prompt ``tokens (B,T)`` and keep its keys and values: ``(logits (B,T,V), cache)``."""
        tokens = self._ids(tokens)
        valid = _resolve_valid(tokens, valid, self.config.pad_id)
        self._check_step(tokens, None, "tokens")
        cache = self.new_cache(tokens.shape[0])
        return self._step(tokens, valid, cache), cache

    def decode_step(self, tokens: torch.Tensor, cache) -> torch.Tensor:
        """Append one position per row, ``tokens (B,)``, to ``cache`` in place -> logits ``(B,V)``."""
        tokens = self._ids(tokens, ndim=1)
        return self._step(*_one_position(tokens), cache)[:, 0]  # (B,V)

    def generate(self, prefix, max_new_tokens: int, **options) -> torch.Tensor:
        """Continue ``prefix (B,P)`` -> ``(B, P + max_new_tokens)``; greedy by default.

        ``options``: ``valid``, ``use_cache``, ``temperature``, ``top_k``, ``top_p``,
        ``seed``, ``eos_id``, as ``levels.common.generation.generate_decoder_only`` takes them.
        """
        with torch.no_grad():
            return generate_decoder_only(
                self, prefix, max_new_tokens, **self._converters(), **options
            )


class Seq2SeqTransformer(_Model):
    """Encoder-decoder transformer (``nn.Transformer``'s layout, pre-norm).

    ``state_dict()`` keys: ``source_embedding.weight``, ``target_embedding.weight``,
    ``encoder.layers.{i}.*``, ``encoder.norm.*``, ``decoder.layers.{i}.*``,
    ``decoder.norm.*``, ``output_projection.weight``.
    """

    def __init__(
        self,
        config: TransformerConfig,
        params,
        *,
        device=None,
        dtype=None,
        kernels: Kernels | None = None,
    ):
        super().__init__(config, params, "seq2seq", dtype=dtype, kernels=kernels)
        kw = {"device": device, "dtype": self.dtype, "kernels": self.kernels}
        LN = self.kernels.norm(config)
        n = range(config.n_layers)
        emb = {"device": device, "dtype": self.dtype}
        self.source_embedding = _Embedding(config, params, "source_embedding.weight", **emb)
        self.target_embedding = _Embedding(config, params, "target_embedding.weight", **emb)
        self.encoder = _Stack(
            [EncoderLayer(config, params, prefix=f"encoder.layers.{i}.", **kw) for i in n],
            LN(config, params, prefix="encoder.norm.", **emb),
        )
        self.decoder = _Stack(
            [DecoderLayer(config, params, prefix=f"decoder.layers.{i}.", **kw) for i in n],
            LN(config, params, prefix="decoder.norm.", **emb),
        )
        self.output_projection = nn.Linear(
            config.d_model, config.vocab_size, bias=False, device="meta"
        )
        self.output_projection.weight = fetch(
            params, "output_projection.weight", (config.vocab_size, config.d_model), **emb
        )

    def _source(self, src, src_valid) -> tuple[torch.Tensor, torch.Tensor]:
        """Checked source ids ``(B,S)`` and their validity."""
        src = self._ids(src, "source tokens")
        check_length(src.shape[1], self.config.max_seq_len, what="source length")
        return src, _resolve_valid(src, src_valid, self.config.pad_id, "src_valid")

    def _encode(self, src: torch.Tensor, src_valid: torch.Tensor) -> torch.Tensor:
        """The encoder stack on checked inputs: ``src (B,S)`` -> ``memory (B,S,D)``."""
        x = self.source_embedding(src)  # (B,S,D)
        for layer in self.encoder.layers:
            x = layer(x, valid=src_valid)  # (B,S,D), bidirectional over real tokens
        return self.encoder.norm(x)  # (B,S,D)

    def encode(self, src, *, src_valid=None) -> torch.Tensor:
        """``src (B,S)`` ids, ``src_valid (B,S)`` (default ``src != pad_id``) -> ``memory (B,S,D)``."""
        return self._encode(*self._source(src, src_valid))

    def _decode(self, tgt, tgt_valid, memory, memory_valid, cache) -> torch.Tensor:
        """Logits ``(B,T,V)`` for checked ``tgt (B,T)`` following the cache's filled positions."""

        def blocks(x: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
            for i, layer in enumerate(self.decoder.layers):
                x = layer(
                    x, memory, valid=key_valid, memory_valid=memory_valid, cache=cache, index=i
                )  # (B,T,D)
            return x

        def logits(x: torch.Tensor) -> torch.Tensor:
            return self.output_projection(self.decoder.norm(x))  # (B,T,D) -> (B,T,V)

        return self._causal_step(
            tgt, tgt_valid, cache, embedding=self.target_embedding, blocks=blocks, head=logits
        )

    def _inputs(self, src, tgt_in, src_valid, tgt_valid):
        """Check both sequences, the target first, so that bad target input fails before
        the source is encoded (before any kernel launch) -> ``(src, src_valid, tgt, tgt_valid)``."""
        tgt = self._ids(tgt_in, "target tokens")
        tgt_valid = _resolve_valid(tgt, tgt_valid, self.config.pad_id, "tgt_valid")
        self._check_step(tgt, None, "target")
        src, src_valid = self._source(src, src_valid)
        check_batch(tgt.shape[0], src.shape[0], what="target tokens for this source")
        return src, src_valid, tgt, tgt_valid

    def forward(
        self,
        src: torch.Tensor,
        tgt_in: torch.Tensor,
        *,
        src_valid: torch.Tensor | None = None,
        tgt_valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``src (B,S)``, ``tgt_in (B,T)`` -> logits ``(B,T,V)`` (zero at padded targets)."""
        src, src_valid, tgt, tgt_valid = self._inputs(src, tgt_in, src_valid, tgt_valid)
        memory = self._encode(src, src_valid)  # (B,S,D)
        return self._decode(tgt, tgt_valid, memory, src_valid, None)

    def prefill(self, src, tgt_in, *, src_valid=None, tgt_valid=None):
        """Encode ``src`` once and run ``tgt_in (B,T)``: ``(logits (B,T,V), cache)``.

        The cache keeps each decoder layer's cross-attention keys and values
        (of the encoded source) and its self-attention keys and values.
        """
        src, src_valid, tgt, tgt_valid = self._inputs(src, tgt_in, src_valid, tgt_valid)
        memory = self._encode(src, src_valid)  # (B,S,D)
        cache = self.new_cache(src.shape[0])
        cache.memory_valid = src_valid
        return self._decode(tgt, tgt_valid, memory, src_valid, cache), cache

    def decode_step(self, tokens: torch.Tensor, cache) -> torch.Tensor:
        """Append one target position per row, ``tokens (B,)``, to ``cache`` -> logits ``(B,V)``."""
        tokens, valid = _one_position(self._ids(tokens, "target tokens", ndim=1))  # (B,1) each
        self._check_step(tokens, cache, "target tokens")
        return self._decode(tokens, valid, None, cache.memory_valid, cache)[:, 0]  # (B,V)

    def generate(self, src, **options) -> torch.Tensor:
        """Decoding from BOS -> ``(B, 1 + n)``; each row stops at its EOS, then ``pad_id``.

        ``options``: ``src_valid``, ``bos_id``, ``eos_id``, ``max_new_tokens`` (default
        ``max_seq_len - 1``, the longest target that fits), ``use_cache``, ``temperature``,
        ``top_k``, ``top_p``, ``seed``, as ``levels.common.generation.generate_seq2seq``
        takes them.
        """
        with torch.no_grad():
            return generate_seq2seq(self, src, **self._converters(), **options)
