"""The one configuration every level is built from.

A frozen dataclass, validated on construction, so a bad size fails at the
line that made it rather than deep inside a matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from . import checks

POSITIONAL_KINDS = ("rope", "none")
NORMS = ("layernorm", "rmsnorm")
FEED_FORWARDS = ("gelu", "swiglu", "geglu")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes and conventions shared by every level.

    Symbols used in shape comments across the project: ``D = d_model``,
    ``H = n_heads``, ``Hkv = kv_heads``, ``Dh = d_head`` (``D // H`` unless ``head_dim``
    says otherwise), ``F = d_ff``, ``V = vocab_size``, ``W = window``.
    """

    vocab_size: int  # V: token ids live in [0, V)
    d_model: int  # D: width of the residual stream
    n_heads: int  # H: D must split evenly into H heads of Dh = D // H
    d_ff: int  # F: feed-forward width (4 * D is the classic choice)
    n_layers: int  # blocks per stack (encoder and decoder each, for seq2seq)
    # Off by default: every level must agree exactly, and dropout is random.
    dropout: float = 0.0
    # PyTorch's modules default to biases; keeping them makes weights portable.
    bias: bool = True
    # "rope" rotates q and k of self-attention; "none" adds no position signal
    # (what PyTorch's nn.Transformer does, so the two can be compared).
    positional: str = "rope"
    rope_base: float = 10000.0  # the RoFormer paper's base
    norm_eps: float = 1e-5  # nn.LayerNorm's default
    pad_id: int = 0  # the generated tasks use pad 0, BOS 1, EOS 2
    bos_id: int = 1
    eos_id: int = 2
    # Longest sequence a model accepts, and the capacity of its KV cache.
    max_seq_len: int = 1024
    # The architectures people run (Llama, Mistral, Qwen2, GPT-NeoX). The defaults
    # are the model above, unchanged; docs/conventions.md lists the parameter names.
    # Hkv: key/value heads shared by groups of H // Hkv query heads (GQA; 1 is MQA).
    n_kv_heads: int | None = None  # None: one per query head (multi-head attention)
    # Sliding window of self-attention: a query sees its W most recent keys (itself
    # included) when causal, the band |j - i| < W otherwise. None: no window.
    window: int | None = None
    norm: str = "layernorm"  # or "rmsnorm": x / sqrt(mean(x^2) + eps) * weight, no bias
    # or "swiglu": linear2(silu(linear_gate(x)) * linear1(x)); or "geglu", the same gate with
    # GELU's tanh approximation for silu (Gemma's gelu_pytorch_tanh)
    ffn: str = "gelu"
    scale_embeddings: bool = True  # token embeddings times sqrt(D) (False in Llama & co.)
    tie_embeddings: bool = True  # decoder-only logits h @ E^T; False: output_projection
    # Biases beyond `bias` (which covers every linear and LayerNorm): None follows `bias`.
    qkv_bias: bool | None = None  # the q, k, v projections (True in Qwen2 with bias=False)
    out_bias: bool | None = None  # attention's output projection
    # Gemma 3's options (docs/conventions.md, "Architecture options"); the defaults are the
    # model above, unchanged.
    # Dh, when the heads are not D / H wide (Gemma 3 270M: 4 heads of 256 in a stream of 640):
    # q is then H Dh wide and out_proj maps H Dh back to D. None: d_model // n_heads.
    head_dim: int | None = None
    attn_scale: float | None = None  # what q.k is multiplied by; None: 1 / sqrt(Dh)
    # The norm (config.norm, Dh wide, one weight shared by the heads) on every head of q and
    # k, before RoPE: QK-norm, which keeps the scores bounded whatever the projections grow to.
    qk_norm: bool = False
    # A norm after each sublayer as well as before it (Gemma 2 and 3):
    # x = x + post_norm1(SelfAttn(norm1(x))), x = x + post_norm2(FFN(norm2(x))).
    post_norms: bool = False
    # The norms multiply by (norm_weight_offset + weight): Gemma stores its gains as offsets
    # from 1 (1.0; a zero weight is then the identity gain). 0.0: weight is the gain itself.
    norm_weight_offset: float = 0.0
    # With a window, layer i attends globally (no window) when (i + 1) % window_pattern == 0:
    # 6 is Gemma 3's five local layers to each global one. None: every layer has the window.
    window_pattern: int | None = None
    # RoPE's base in the windowed (local) layers; None: rope_base. (Gemma 3: 1e4 local, 1e6 global.)
    rope_local_base: float | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_seq_len"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.head_dim is not None and (not _is_int(self.head_dim) or self.head_dim <= 0):
            raise ValueError(
                f"head_dim must be a positive integer (or None), got {self.head_dim!r}"
            )
        if self.head_dim is None and self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads} "
                f"(set head_dim for heads of another width)"
            )
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(
                f"positional must be one of {POSITIONAL_KINDS}, got {self.positional!r}"
            )
        if self.positional == "rope" and self.d_head % 2 != 0:
            width = "head_dim" if self.head_dim else f"Dh = {self.d_model} // {self.n_heads}"
            raise ValueError(
                f"RoPE rotates pairs of features, so the head width must be even; "
                f"got {width} = {self.d_head}"
            )
        if not isinstance(self.bias, bool):
            raise ValueError(f"bias must be True or False, got {self.bias!r}")
        if not _is_real(self.dropout) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be a number in [0, 1), got {self.dropout!r}")
        for name in ("rope_base", "norm_eps"):
            value = getattr(self, name)
            if not _is_real(value) or not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if self.n_kv_heads is not None and (
            not _is_int(self.n_kv_heads)
            or self.n_kv_heads <= 0
            or self.n_heads % self.n_kv_heads != 0
        ):
            raise ValueError(
                f"n_kv_heads must be a positive integer dividing n_heads={self.n_heads} "
                f"(each group of n_heads // n_kv_heads query heads shares one), got {self.n_kv_heads!r}"
            )
        checks.check_window(self.window)
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.ffn not in FEED_FORWARDS:
            raise ValueError(f"ffn must be one of {FEED_FORWARDS}, got {self.ffn!r}")
        for name in ("scale_embeddings", "tie_embeddings", "qk_norm", "post_norms"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        self._check_gemma_options()
        for name in ("qkv_bias", "out_bias"):
            if getattr(self, name) not in (None, True, False):
                raise ValueError(f"{name} must be True, False or None, got {getattr(self, name)!r}")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not _is_int(value) or not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"{name} must be a token id in [0, vocab_size={self.vocab_size}), got {value!r}"
                )

    def _check_gemma_options(self) -> None:
        """``attn_scale``, ``norm_weight_offset``, ``window_pattern`` and ``rope_local_base``."""
        for name in ("attn_scale", "rope_local_base"):
            value = getattr(self, name)
            if value is not None and (
                not _is_real(value) or not (math.isfinite(value) and value > 0)
            ):
                raise ValueError(
                    f"{name} must be a positive finite number (or None), got {value!r}"
                )
        offset = self.norm_weight_offset
        if not _is_real(offset) or not math.isfinite(offset):
            raise ValueError(f"norm_weight_offset must be a finite number, got {offset!r}")
        pattern = self.window_pattern
        if pattern is not None:
            if not _is_int(pattern) or pattern < 2:
                raise ValueError(
                    f"window_pattern must be an integer >= 2 (every window_pattern-th layer is "
                    f"global; 1 would make them all global: use window=None), got {pattern!r}"
                )
            if self.window is None:
                raise ValueError(
                    f"window_pattern={pattern} picks the global layers among windowed ones, "
                    "but window is None (no layer has a window)"
                )
        if self.rope_local_base is not None and self.window is None:
            raise ValueError(
                f"rope_local_base={self.rope_local_base} is the RoPE base of the windowed "
                "layers, but window is None (no layer has a window)"
            )

    @property
    def d_head(self) -> int:
        """Dh, the width of one attention head: ``head_dim``, else ``D // H``."""
        return self.d_model // self.n_heads if self.head_dim is None else self.head_dim

    @property
    def q_width(self) -> int:
        """``H Dh``: the queries' width, and the attention output's before ``out_proj``
        (``D`` unless ``head_dim`` makes the heads wider or narrower)."""
        return self.n_heads * self.d_head

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window: ``window``, or None for the global layers that
        ``window_pattern`` picks (layer ``i`` when ``(i + 1) % window_pattern == 0``)."""
        pattern = self.window_pattern
        return tuple(
            None if pattern is not None and (i + 1) % pattern == 0 else self.window
            for i in range(self.n_layers)
        )

    def rope_base_of(self, window: int | None) -> float:
        """RoPE's base in a layer with ``window``: ``rope_local_base`` in a windowed (local)
        layer when it is set, ``rope_base`` otherwise."""
        if window is not None and self.rope_local_base is not None:
            return self.rope_local_base
        return self.rope_base

    @property
    def kv_heads(self) -> int:
        """Hkv, the key/value heads (``n_kv_heads``, or ``n_heads`` when that is None)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def has_qkv_bias(self) -> bool:
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def has_out_bias(self) -> bool:
        return self.bias if self.out_bias is None else self.out_bias

    @property
    def has_norm_bias(self) -> bool:
        """LayerNorm has a bias when ``bias``; RMSNorm never has one."""
        return self.bias and self.norm == "layernorm"

    @property
    def embedding_scale(self) -> float:
        """What token embeddings are multiplied by: ``sqrt(D)``, or 1."""
        return math.sqrt(self.d_model) if self.scale_embeddings else 1.0

    def first_layers(self, n: int) -> TransformerConfig:
        """The config of this model's first ``n`` layers (with its final norm and head): a
        draft for speculative decoding (``first_layers`` of a model). ``1 <= n < n_layers``."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < self.n_layers:
            raise ValueError(f"the first N layers of a model of {self.n_layers} need 1 <= N < {self.n_layers}, got {n!r}")  # fmt: skip
        return replace(self, n_layers=n)
