"""The two models: decoder-only (tied logits) and encoder-decoder (seq2seq).

The architecture is ``compute`` (embed, blocks, norm, head; seq2seq: ``_encode``
and ``_decoder``). The public methods (``forward``, ``prefill``, ``decode_step``,
``generate``) are ``levels.common.boundary``'s, the same code as every other
level's: they check the inputs and plan each pass (which tokens are real, their
positions, what each query sees: a step per distinct window of the layers,
``config.layer_windows``) in numpy, and convert what the architecture reads with
this level's ``arrays.py`` (ids, masks and positions as tensors on the model's
device). ``forward`` is a pass without a cache, ``prefill`` a pass into an empty
one, ``decode_step`` one token into a filled one.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from ..common import boundary
from ..common.config import TransformerConfig
from ..common.params import check_params, param_shapes
from . import arrays as level_arrays
from .arrays import asarray, fetch, linear, to_numpy
from .kernels import LEVEL2_KERNELS, Kernels
from .layers import DecoderLayer, EncoderLayer


class _Embedding(nn.Module):
    """A lookup table ``weight (V, D)`` with the canonical name ``{prefix}weight``."""

    def __init__(self, config: TransformerConfig, params, name: str, *, device=None, dtype=None):
        super().__init__()
        shape = (config.vocab_size, config.d_model)
        self.weight = fetch(params, name, shape, device=device, dtype=dtype)
        # option scale_embeddings: times sqrt(D), so the stream starts at unit variance; or 1
        self.scale = config.embedding_scale

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
    """What both models share: the parameter check, the kernels, and the arrays ``boundary``'s
    public methods convert the inputs with."""

    kernels: Kernels = LEVEL2_KERNELS
    arrays = level_arrays  # what boundary's public methods convert the inputs with (arrays.py)

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

    # The generation loops run without autograd (on ``stream``'s generator: during each
    # step, not between them), and move tokens between numpy and the model's device.
    _inference = staticmethod(torch.no_grad())

    def _converters(self) -> dict:
        return {"to_native": partial(asarray, device=self.device), "to_numpy": to_numpy}

    def new_cache(self, batch: int):
        """An empty KV cache of capacity ``max_seq_len`` for ``batch`` rows."""
        return self.kernels.kv_cache(self.config, batch, device=self.device, dtype=self.dtype)

    def _layers(self, config: TransformerConfig, params, prefix: str, Layer, **kw) -> nn.ModuleList:
        """``Layer`` ``{prefix}{i}.`` for each layer ``i``, each with its RoPE base."""
        # option window_pattern, rope_local_base: each layer's window and RoPE base (Gemma 3)
        return nn.ModuleList(
            Layer(
                config,
                params,
                prefix=f"{prefix}{i}.",
                rope_base=config.rope_base_of(w),
                kernels=self.kernels,
                **kw,
            )
            for i, w in enumerate(config.layer_windows)
        )


class DecoderOnlyTransformer(boundary.DecoderOnlyEdge, _Model):
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
        self.layers = self._layers(config, params, "layers.", EncoderLayer, **kw)
        self.norm = self.kernels.norm(config)(config, params, prefix="norm.", **kw)
        # option tie_embeddings: the head is the embedding itself, or a matrix of its own
        if not config.tie_embeddings:  # output_projection.weight (V, D)
            V, D = config.vocab_size, config.d_model
            self.output_projection = linear(params, "output_projection.", V, D, bias=False, **kw)

    def compute(self, tokens: torch.Tensor, positions, sees: dict, cache=None, last=None):
        """The architecture on checked inputs: embedding, the blocks, the final norm, the head.

        ``tokens (B,T)`` ids in ``[0, V)``; ``positions`` the first token's position (an int,
        or ``(B,)`` on the device, one per row); ``sees`` what each layer's queries may see,
        ``{window: (mask or None, window by slot)}`` (``_sees``); ``cache``, when given,
        takes each layer's new keys and values (the caller commits them); ``last`` (a slot
        per row) keeps only those positions for the head -> logits ``(B,T,V)`` (``(B,1,V)``).
        """
        x = self.token_embedding(tokens)  # (B,T,D)
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
            at = torch.tensor(last, device=x.device)
            x = x[torch.arange(len(last), device=x.device), at].unsqueeze(1)  # (B,T,D) -> (B,1,D)
        # Tied: h @ E^T with the input embedding E; untied: the head's own (V, D).
        head = getattr(self, "output_projection", self.token_embedding)
        return self.kernels.linear(self.norm(x), head.weight)  # (B,T,D) @ (D,V) -> (B,T,V)


class Seq2SeqTransformer(boundary.Seq2SeqEdge, _Model):
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
        LN = self.kernels.norm(config)
        emb = {"device": device, "dtype": self.dtype}
        self.source_embedding = _Embedding(config, params, "source_embedding.weight", **emb)
        self.target_embedding = _Embedding(config, params, "target_embedding.weight", **emb)
        self.encoder = _Stack(
            self._layers(config, params, "encoder.layers.", EncoderLayer, **emb),
            LN(config, params, prefix="encoder.norm.", **emb),
        )
        self.decoder = _Stack(
            self._layers(config, params, "decoder.layers.", DecoderLayer, **emb),
            LN(config, params, prefix="decoder.norm.", **emb),
        )
        V, D = config.vocab_size, config.d_model
        self.output_projection = linear(params, "output_projection.", V, D, bias=False, **emb)

    # -- the architecture ---------------------------------------------------------

    def _encode(self, src: torch.Tensor, sees: dict) -> torch.Tensor:
        """The encoder stack on checked inputs: ``src (B,S)`` -> ``memory (B,S,D)``; ``sees`` as
        ``compute``'s (without a window, the source's real keys)."""
        # option window_pattern: as in ``compute``
        x = self.source_embedding(src)  # (B,S,D)
        for layer, w in zip(self.encoder.layers, self.config.layer_windows, strict=True):
            mask, window = sees[w]
            x = layer(x, mask=mask, window=window)  # (B,S,D), bidirectional over real tokens
        return self.encoder.norm(x)  # (B,S,D)

    def _decoder(self, tgt, positions, sees: dict, memory, memory_mask, cache) -> torch.Tensor:
        """Logits ``(B,T,V)`` of checked ``tgt (B,T)`` over ``memory (B,S,D)``: ``positions``,
        ``sees`` and ``cache`` as ``DecoderOnlyTransformer.compute``'s; ``memory_mask`` the
        source's real keys."""
        # option window_pattern: as in ``compute``
        x = self.target_embedding(tgt)  # (B,T,D)
        windows = self.config.layer_windows
        for i, (layer, w) in enumerate(zip(self.decoder.layers, windows, strict=True)):
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
        return self.output_projection(self.decoder.norm(x))  # (B,T,D) -> (B,T,V)
