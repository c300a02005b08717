"""Generated toy tasks: small enough to train on a laptop CPU in a minute, hard
enough that a broken model cannot pass them.

Nothing is downloaded; every dataset is a pure function of ``(task, n, seed,
split)``. Training and held-out data come from *different* seed streams of the
same seed (``numpy``'s ``SeedSequence`` keyed by ``[seed, split]``), so the
held-out set is drawn independently of the training set rather than carved
out of it.

Token ids follow the config's defaults: pad 0, BOS 1, EOS 2; the content
symbols are ``3 .. vocab_size - 1``.

Two encoder-decoder tasks (``src`` -> ``tgt``):

* ``copy``:    ``src = [BOS] + x + [EOS]``, ``tgt = [BOS] + x + [EOS]``
* ``reverse``: ``src = [BOS] + x + [EOS]``, ``tgt = [BOS] + reversed(x) + [EOS]``

with ``x`` a uniformly random string of ``min_len .. max_len`` symbols. The
source is framed by BOS and EOS so the encoder has a landmark at each end:
copying means "the i-th output is the i-th symbol counted from the start",
reversing "counted from the end", and rotary positions are relative, so the
model needs something to count from.

One decoder-only task:

* ``cycle``: ``tokens = [BOS] + p, p, p, ...`` where ``p`` is a pattern of
  ``period`` *distinct* symbols, repeated and cut at a random length. The
  prompt is BOS, one full period and the first repeated symbol; from there the
  rest is determined (the next token is the one that followed the previous
  occurrence of the current token) and the model must continue it free-running.
  Distinct symbols make the rule unambiguous: a pattern like ``a b a c`` would
  leave "what follows a" undecided.

A task also says which tokens are *scored*: the targets of the teacher-forced
loss and of every accuracy. For seq2seq that is ``tgt[1:]`` (every output
symbol and the final EOS); for ``cycle`` it is the continuation after the
prompt (the prompt itself is unpredictable: a fresh random pattern).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_SYMBOL = 3  # ids below this are special

SPLITS = ("train", "heldout", "preflight")


def split_rng(seed: int, split: str) -> np.random.Generator:
    """An independent random stream for ``split`` of ``seed``.

    ``SeedSequence([seed, k])`` for different ``k`` gives statistically
    independent streams, so "held-out" is a fresh draw, not a slice of the
    training set.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return np.random.default_rng(np.random.SeedSequence([seed, SPLITS.index(split)]))


@dataclass(frozen=True)
class Seq2SeqExample:
    """One source/target pair. ``tgt`` starts with BOS and ends with EOS."""

    src: tuple[int, ...]  # (S,) BOS, symbols, EOS
    tgt: tuple[int, ...]  # (1 + T,) BOS, output symbols, EOS

    @property
    def scored(self) -> tuple[int, ...]:
        """The tokens a model must predict: everything after BOS."""
        return self.tgt[1:]


@dataclass(frozen=True)
class DecoderOnlyExample:
    """One sequence; the first ``prompt_len`` tokens are given, the rest is to be predicted."""

    tokens: tuple[int, ...]  # (L,) BOS then the periodic sequence
    prompt_len: int

    @property
    def scored(self) -> tuple[int, ...]:
        return self.tokens[self.prompt_len :]


@dataclass(frozen=True)
class Seq2SeqTask:
    """``copy`` or ``reverse`` over strings of ``min_len .. max_len`` symbols."""

    name: str = "reverse"
    vocab_size: int = 16  # 13 content symbols
    min_len: int = 1
    max_len: int = 12

    kind = "seq2seq"

    def __post_init__(self) -> None:
        if self.name not in SEQ2SEQ_TASKS:
            raise ValueError(f"seq2seq task must be one of {SEQ2SEQ_TASKS}, got {self.name!r}")
        if self.vocab_size <= FIRST_SYMBOL:
            raise ValueError(f"vocab_size must exceed {FIRST_SYMBOL} (the special ids)")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")

    @property
    def max_seq_len(self) -> int:
        """Longest sequence either side: BOS + max_len symbols + EOS."""
        return self.max_len + 2

    def sample(self, n: int, seed: int, split: str) -> list[Seq2SeqExample]:
        rng = split_rng(seed, split)
        lengths = rng.integers(self.min_len, self.max_len + 1, size=n)
        examples = []
        for length in lengths:
            x = rng.integers(FIRST_SYMBOL, self.vocab_size, size=int(length)).tolist()
            y = x if self.name == "copy" else x[::-1]
            examples.append(
                Seq2SeqExample(
                    src=tuple([BOS_ID] + x + [EOS_ID]), tgt=tuple([BOS_ID] + y + [EOS_ID])
                )
            )
        return examples


@dataclass(frozen=True)
class CycleTask:
    """Continue a periodic sequence of ``min_period .. max_period`` distinct symbols."""

    name: str = "cycle"
    vocab_size: int = 16
    min_period: int = 2
    max_period: int = 6
    min_continuation: int = 2  # scored tokens per sequence
    max_continuation: int = 16

    kind = "decoder_only"

    def __post_init__(self) -> None:
        n_symbols = self.vocab_size - FIRST_SYMBOL
        if not 2 <= self.min_period <= self.max_period <= n_symbols:
            raise ValueError(
                f"need 2 <= min_period <= max_period <= {n_symbols} symbols, got "
                f"{self.min_period}, {self.max_period}"
            )
        if not 1 <= self.min_continuation <= self.max_continuation:
            raise ValueError("need 1 <= min_continuation <= max_continuation")

    @property
    def max_seq_len(self) -> int:
        """BOS + one period + the first repeat + the continuation."""
        return 1 + self.max_period + 1 + self.max_continuation

    def sample(self, n: int, seed: int, split: str) -> list[DecoderOnlyExample]:
        rng = split_rng(seed, split)
        symbols = np.arange(FIRST_SYMBOL, self.vocab_size)
        examples = []
        for _ in range(n):
            period = int(rng.integers(self.min_period, self.max_period + 1))
            pattern = rng.choice(symbols, size=period, replace=False).tolist()
            n_cont = int(rng.integers(self.min_continuation, self.max_continuation + 1))
            length = period + 1 + n_cont  # the periodic part
            body = [pattern[i % period] for i in range(length)]
            examples.append(
                DecoderOnlyExample(tokens=tuple([BOS_ID] + body), prompt_len=period + 2)
            )
        return examples


SEQ2SEQ_TASKS = ("copy", "reverse")
DECODER_ONLY_TASKS = ("cycle",)


def make_task(kind: str, name: str | None = None, **sizes: int) -> Seq2SeqTask | CycleTask:
    """The task called ``name`` for a model ``kind`` (``"seq2seq"`` or ``"decoder_only"``)."""
    if kind == "seq2seq":
        return Seq2SeqTask(name=name or "reverse", **sizes)
    if kind == "decoder_only":
        if name not in (None, *DECODER_ONLY_TASKS):
            raise ValueError(f"decoder-only task must be one of {DECODER_ONLY_TASKS}, got {name!r}")
        return CycleTask(**sizes)
    raise ValueError(f"kind must be 'seq2seq' or 'decoder_only', got {kind!r}")


def majority_baseline(
    train: Sequence[Seq2SeqExample | DecoderOnlyExample],
    heldout: Sequence[Seq2SeqExample | DecoderOnlyExample],
) -> tuple[int, float]:
    """The most common scored token in ``train`` and its accuracy on ``heldout``'s scored tokens.

    The floor any trained model must clear: a model that ignores its input and
    always predicts the most frequent token scores exactly this.
    """
    counts = Counter(token for example in train for token in example.scored)
    if not counts:
        raise ValueError("the training set has no scored tokens")
    # Ties go to the smallest id, so the baseline does not depend on dict order.
    token = min(counts, key=lambda t: (-counts[t], t))
    scored = [t for example in heldout for t in example.scored]
    if not scored:
        raise ValueError("the held-out set has no scored tokens")
    return token, sum(t == token for t in scored) / len(scored)
