"""The two models: decoder-only (tied logits) and encoder-decoder (seq2seq).

Both check their parameters up front, validate token ids before any embedding
gather, and share one step function between ``forward`` (no cache),
``prefill`` (empty cache) and ``decode_step`` (one new position).
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn

from ..common.checks import NO_VALID_TOKEN_MESSAGE, check_length, check_tokens, check_valid_shape
from ..common.config import TransformerConfig
from ..common.generation import greedy_decoder_only, greedy_seq2seq
from ..common.params import check_params, param_shapes
from .arrays import asarray, to_numpy
from .kernels import LEVEL2_KERNELS, Kernels
from .layers import DecoderLayer, EncoderLayer
from .parameters import fetch


def _check_tokens(tokens: torch.Tensor, vocab_size: int, what: str = "token id") -> None:
    """Ids must be integers in ``[0, V)``; checked before the embedding gather reads memory."""
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise TypeError(f"{what}s must be integers, got {tokens.dtype}")
    check_tokens(int(tokens.min()), int(tokens.max()), vocab_size, what=what)


def _resolve_valid(
    tokens: torch.Tensor, valid: torch.Tensor | None, pad_id: int, what: str = "valid"
) -> torch.Tensor:
    """``valid (B,T)`` bool, default ``tokens != pad_id``; every row needs a real token."""
    if valid is None:
        valid = tokens != pad_id
    check_valid_shape(valid.shape, tokens.shape, valid.dtype == torch.bool, what=what)
    if not bool(valid.any(dim=1).all()):
        raise ValueError(NO_VALID_TOKEN_MESSAGE)
    return valid.to(tokens.device)


class _Embedding(nn.Module):
    """A lookup table ``weight (V, D)`` with the canonical name ``{prefix}weight``."""

    def __init__(self, config: TransformerConfig, params, name: str, *, device=None, dtype=None):
        super().__init__()
        shape = (config.vocab_size, config.d_model)
        self.weight = fetch(params, name, shape, device=device, dtype=dtype)
        self.scale = math.sqrt(config.d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # Token ids were checked against [0, V) by the caller; this gather trusts them.
        return self.weight[tokens] * self.scale  # (B,T) -> (B,T,D), scaled by sqrt(D)


class _Stack(nn.Module):
    """``layers.{i}`` and a final ``norm``: the encoder or decoder of the seq2seq model."""

    def __init__(self, layers: list[nn.Module], norm: nn.Module):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm


class _Model(nn.Module):
    """What both models share: the parameter check, the kernels, the cache and the causal step."""

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

    def new_cache(self, batch: int):
        """An empty KV cache of capacity ``max_seq_len`` for ``batch`` rows."""
        return self.kernels.kv_cache(self.config, batch, device=self.device, dtype=self.dtype)

    def _check_step(self, tokens: torch.Tensor, cache, what: str) -> None:
        """Token ids in range and room for them (``max_seq_len``, or the cache's capacity)."""
        _check_tokens(tokens, self.config.vocab_size, f"{what} token id".lstrip())
        if cache is None:
            length = f"{what or 'sequence'} length"
            check_length(tokens.shape[1], self.config.max_seq_len, what=length)
        else:
            cache.check_room(tokens.shape[1])  # capacity max_seq_len; raises before any write

    def _causal_step(self, tokens, valid, cache, *, embedding, blocks, head) -> torch.Tensor:
        """Logits ``(B,T,V)`` for ``tokens (B,T)`` placed after the cache's filled positions.

        ``blocks(x (B,T,D), key_valid (B, length+T)) -> (B,T,D)`` runs the layers,
        ``head`` maps ``(B,T,D) -> (B,T,V)``. Callers have run ``_check_step`` on
        ``tokens`` already (once per call: on a GPU each check waits for the
        device), so nothing is written to the cache for bad input; the cache's
        length grows only after the last layer.
        """
        key_valid = valid if cache is None else cache.key_valid(valid)  # (B, length + T)
        logits = head(blocks(embedding(tokens), key_valid))  # (B,T) -> (B,T,D) -> (B,T,V)
        if cache is not None:
            cache.advance(valid)
        # masked_fill gives exact zeros and a zero (finite) gradient at padding.
        return logits.masked_fill(~valid[..., None], 0.0)  # (B,T,V)


def _one_position(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoding input ``tokens (B,)`` -> ``tokens (B,1)`` and an all-True ``valid (B,1)``."""
    tokens = tokens.reshape(-1, 1)  # (B,) -> (B,1)
    return tokens, torch.ones_like(tokens, dtype=torch.bool)


class DecoderOnlyTransformer(_Model):
    """A GPT-style language model: embedding, causal pre-norm blocks, final norm, tied logits.

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
        self.norm = self.kernels.layer_norm(config, params, prefix="norm.", **kw)

    def _step(self, tokens: torch.Tensor, valid: torch.Tensor, cache) -> torch.Tensor:
        """Logits ``(B,T,V)`` for ``tokens (B,T)`` following the cache's filled positions."""

        def blocks(x: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
            for i, layer in enumerate(self.layers):
                x = layer(x, valid=key_valid, causal=True, cache=cache, index=i)  # (B,T,D)
            return x

        def tied_logits(x: torch.Tensor) -> torch.Tensor:
            return self.norm(x) @ self.token_embedding.weight.T  # (B,T,D) @ (D,V) -> (B,T,V)

        self._check_step(tokens, cache, "")
        return self._causal_step(
            tokens, valid, cache, embedding=self.token_embedding, blocks=blocks, head=tied_logits
        )

    def forward(self, tokens: torch.Tensor, *, valid: torch.Tensor | None = None) -> torch.Tensor:
        """``tokens (B,T)`` ints, ``valid (B,T)`` bool (default ``tokens != pad_id``) -> ``(B,T,V)``."""
        return self._step(tokens, _resolve_valid(tokens, valid, self.config.pad_id), None)

    def prefill(self, tokens: torch.Tensor, *, valid: torch.Tensor | None = None):
        """Run the prompt ``tokens (B,T)`` and keep its keys and values: ``(logits (B,T,V), cache)``."""
        valid = _resolve_valid(tokens, valid, self.config.pad_id)
        cache = self.new_cache(tokens.shape[0])
        return self._step(tokens, valid, cache), cache

    def decode_step(self, tokens: torch.Tensor, cache) -> torch.Tensor:
        """Append one position per row, ``tokens (B,)``, to ``cache`` in place -> logits ``(B,V)``."""
        return self._step(*_one_position(tokens), cache)[:, 0]  # (B,V)

    def generate(self, prefix, max_new_tokens: int, *, use_cache: bool = True) -> torch.Tensor:
        """Greedy continuation of ``prefix (B,P)`` -> ``(B, P + max_new_tokens)``."""
        with torch.no_grad():
            return greedy_decoder_only(
                self,
                prefix,
                max_new_tokens,
                use_cache=use_cache,
                to_native=partial(asarray, device=self.device),
                to_numpy=to_numpy,
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
        LN = self.kernels.layer_norm
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

    def encode(self, src: torch.Tensor, src_valid: torch.Tensor) -> torch.Tensor:
        """``src (B,S)`` -> ``memory (B,S,D)``; bidirectional self-attention over real tokens."""
        _check_tokens(src, self.config.vocab_size, "source token id")
        check_length(src.shape[1], self.config.max_seq_len, what="source length")
        x = self.source_embedding(src)  # (B,S,D)
        for layer in self.encoder.layers:
            x = layer(x, valid=src_valid)  # (B,S,D)
        return self.encoder.norm(x)  # (B,S,D)

    def _decode(self, tgt, tgt_valid, memory, memory_valid, cache) -> torch.Tensor:
        """Logits ``(B,T,V)`` for ``tgt (B,T)`` following the cache's filled positions
        (``tgt`` already checked by the caller)."""

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

    def _valid_pair(self, src, tgt_in, src_valid, tgt_valid):
        """Resolve both masks, and check the target before the source is encoded, so that
        bad target input fails before any work (or any kernel launch) is done."""
        self._check_step(tgt_in, None, "target")
        pad = self.config.pad_id
        return (
            _resolve_valid(src, src_valid, pad, "src_valid"),
            _resolve_valid(tgt_in, tgt_valid, pad, "tgt_valid"),
        )

    def forward(
        self,
        src: torch.Tensor,
        tgt_in: torch.Tensor,
        *,
        src_valid: torch.Tensor | None = None,
        tgt_valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``src (B,S)``, ``tgt_in (B,T)`` -> logits ``(B,T,V)`` (zero at padded targets)."""
        src_valid, tgt_valid = self._valid_pair(src, tgt_in, src_valid, tgt_valid)
        memory = self.encode(src, src_valid)  # (B,S,D)
        return self._decode(tgt_in, tgt_valid, memory, src_valid, None)

    def prefill(self, src, tgt_in, *, src_valid=None, tgt_valid=None):
        """Encode ``src`` once and run ``tgt_in (B,T)``: ``(logits (B,T,V), cache)``.

        The cache keeps each decoder layer's cross-attention keys and values
        (of the encoded source) and its self-attention keys and values.
        """
        src_valid, tgt_valid = self._valid_pair(src, tgt_in, src_valid, tgt_valid)
        memory = self.encode(src, src_valid)  # (B,S,D)
        cache = self.new_cache(src.shape[0])
        cache.memory_valid = src_valid
        return self._decode(tgt_in, tgt_valid, memory, src_valid, cache), cache

    def decode_step(self, tokens: torch.Tensor, cache) -> torch.Tensor:
        """Append one target position per row, ``tokens (B,)``, to ``cache`` -> logits ``(B,V)``."""
        tokens, valid = _one_position(tokens)  # (B,1) each
        self._check_step(tokens, cache, "target")
        return self._decode(tokens, valid, None, cache.memory_valid, cache)[:, 0]  # (B,V)

    def generate(
        self,
        src,
        *,
        src_valid=None,
        bos_id: int | None = None,
        eos_id: int | None = None,
        max_new_tokens: int = 32,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Greedy decoding from BOS -> ``(B, 1 + n)``; each row stops at EOS, then ``pad_id``."""
        native = partial(asarray, device=self.device)
        src = src if isinstance(src, torch.Tensor) else native(src)
        if src_valid is not None and not isinstance(src_valid, torch.Tensor):
            src_valid = native(src_valid)
        with torch.no_grad():
            return greedy_seq2seq(
                self,
                src,
                src_valid=src_valid,
                bos_id=self.config.bos_id if bos_id is None else bos_id,
                eos_id=self.config.eos_id if eos_id is None else eos_id,
                max_new_tokens=max_new_tokens,
                use_cache=use_cache,
                to_native=native,
                to_numpy=to_numpy,
            )
