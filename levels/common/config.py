"""The one configuration every level is built from.

A frozen dataclass, validated on construction, so a bad size fails at the
line that made it rather than deep inside a matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import checks

POSITIONAL_KINDS = ("rope", "none")
NORMS = ("layernorm", "rmsnorm")
FEED_FORWARDS = ("gelu", "swiglu")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes and conventions shared by every level.

    Symbols used in shape comments across the project: ``D = d_model``,
    ``H = n_heads``, ``Hkv = kv_heads``, ``Dh = D // H``, ``F = d_ff``,
    ``V = vocab_size``, ``W = window``.
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
    ffn: str = "gelu"  # or "swiglu": linear2(silu(linear_gate(x)) * linear1(x))
    scale_embeddings: bool = True  # token embeddings times sqrt(D) (False in Llama & co.)
    tie_embeddings: bool = True  # decoder-only logits h @ E^T; False: output_projection
    # Biases beyond `bias` (which covers every linear and LayerNorm): None follows `bias`.
    qkv_bias: bool | None = None  # the q, k, v projections (True in Qwen2 with bias=False)
    out_bias: bool | None = None  # attention's output projection

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_seq_len"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(
                f"positional must be one of {POSITIONAL_KINDS}, got {self.positional!r}"
            )
        if self.positional == "rope" and self.d_head % 2 != 0:
            raise ValueError(
                f"RoPE rotates pairs of features, so the head width must be even; "
                f"got Dh = {self.d_model} // {self.n_heads} = {self.d_head}"
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
        for name in ("scale_embeddings", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("qkv_bias", "out_bias"):
            if getattr(self, name) not in (None, True, False):
                raise ValueError(f"{name} must be True, False or None, got {getattr(self, name)!r}")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not _is_int(value) or not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"{name} must be a token id in [0, vocab_size={self.vocab_size}), got {value!r}"
                )

    @property
    def d_head(self) -> int:
        """Dh, the width of one attention head."""
        return self.d_model // self.n_heads

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
