"""The one configuration every level is built from.

A frozen dataclass, validated on construction, so a bad size fails at the
line that made it rather than deep inside a matmul.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

POSITIONAL_KINDS = ("rope", "none")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes and conventions shared by every level.

    Symbols used in shape comments across the project: ``D = d_model``,
    ``H = n_heads``, ``Dh = D // H``, ``F = d_ff``, ``V = vocab_size``.
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
