"""A small language model of real text, trained in a few minutes on a CPU (docs/text_model.md).

The corpus ships with Python: ``pydoc_data.topics``, the pages ``help()`` shows for
the language's keywords and topics, some 465,000 characters of English prose and
code (the exact text changes a little with each Python release). Nothing is
downloaded.

The tokenizer is a byte-level BPE of ``TextSpec.vocab_size`` pieces, trained on the
corpus by the ``tokenizers`` library: the algorithm behind SmolLM2's 49,152 pieces,
at a hundredth of the size. The token stream's last ``heldout_fraction`` is held out.

``train_text`` trains a decoder-only model at any level with gradients, with the
lab's own pieces: the canonical initial parameters (``init_params``), the trainer
backend (AdamW, weight decay on matrices, clipping; ``lab.backend``) and the
schedule of ``lab.train`` (linear warm-up, cosine decay). A batch is
``batch_size`` windows of ``context + 1`` tokens at random offsets, every position
scored: next-token prediction on the whole window.

Everything random is seeded (the parameters, the offsets, sampling), so a run is
repeatable on one machine with one thread; another machine sums in another order
and its run drifts by rounding. The docs quote a recorded run
(``docs/data/text_model.json``, ``python docs/tools/figures.py --train-text``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from levels.common.config import TransformerConfig
from levels.common.params import init_params

from .backend import OptimizerSettings, make_backend
from .data import Batch
from .train import TrainSettings, learning_rate


def corpus() -> str:
    """Python's ``help()`` topics, in the order of their names, a blank line apart."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def corpus_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def train_tokenizer(text: str, vocab_size: int):
    """A byte-level BPE of ``vocab_size`` pieces learned from ``text``: the 256 bytes, then
    the most frequent adjacent pair merged into a new piece, again and again."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: no unknown text
        show_progress=False,
    )
    tokenizer.train_from_iterator([text], trainer)
    return tokenizer


@dataclass(frozen=True)
class TextSpec:
    """The model, the data and the training of one run; the defaults train in a few
    minutes on one core of this project's CPU (329 s in the recorded run)."""

    vocab_size: int = 512  # BPE pieces: about two characters a token on this corpus
    d_model: int = 128
    n_heads: int = 4  # Dh = 32
    d_ff: int = 512
    n_layers: int = 3
    context: int = 128  # tokens a window trains on, and the longest a sample may be
    batch_size: int = 16  # windows a step: 2,048 tokens
    steps: int = 600
    lr: float = 3e-3  # peak of the schedule
    warmup_steps: int = 50
    final_lr_fraction: float = 0.1
    heldout_fraction: float = 0.05  # the last twentieth of the token stream
    eval_every: int = 50  # steps between held-out losses
    seed: int = 0

    def config(self) -> TransformerConfig:
        return TransformerConfig(
            vocab_size=self.vocab_size,
            d_model=self.d_model,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            n_layers=self.n_layers,
            max_seq_len=self.context,
        )

    def schedule(self) -> TrainSettings:
        """The settings ``lab.train.learning_rate`` reads (steps, peak, warm-up, floor)."""
        return TrainSettings(
            steps=self.steps,
            lr=self.lr,
            warmup_steps=self.warmup_steps,
            final_lr_fraction=self.final_lr_fraction,
            seed=self.seed,
        )


def windows(ids: np.ndarray, starts: np.ndarray, context: int) -> Batch:
    """The windows ``ids[s : s + context + 1]``: inputs their first ``context`` tokens,
    targets their last ``context`` (the next token at every position), all scored."""
    rows = np.stack([ids[s : s + context + 1] for s in starts])  # (B, context + 1)
    inputs, targets = rows[:, :-1], rows[:, 1:]  # (B, T), (B, T)
    every = np.ones(inputs.shape, dtype=bool)
    return Batch(inputs=inputs, valid=every, targets=targets, scored=every)


def heldout_loss(backend, ids: np.ndarray, context: int, batch_size: int = 64) -> float:
    """Mean next-token loss over every whole window of the held-out tokens, side by side
    (the same windows at every evaluation)."""
    starts = np.arange(0, len(ids) - context, context)  # non-overlapping windows
    total, count = 0.0, 0
    for a in range(0, len(starts), batch_size):
        batch = windows(ids, starts[a : a + batch_size], context)
        total += backend.loss(batch) * batch.n_scored
        count += batch.n_scored
    return total / count


Progress = Callable[[int, float], None]  # (step, training loss)


def train_text(spec: TextSpec, level: ModuleType, *, progress: Progress | None = None) -> dict:
    """Train ``spec``'s model at ``level`` on the corpus. Returns the tokenizer, the
    backend (its ``model`` samples), every step's training loss, the held-out losses
    every ``eval_every`` steps (step 0 included), and the seconds the steps took."""
    text = corpus()
    tokenizer = train_tokenizer(text, spec.vocab_size)
    ids = np.array(tokenizer.encode(text).ids, dtype=np.int64)  # (N,)
    cut = len(ids) - int(len(ids) * spec.heldout_fraction)
    train_ids, held_ids = ids[:cut], ids[cut:]

    config = spec.config()
    backend = make_backend(
        level, config, "decoder_only", init_params(config, "decoder_only", spec.seed),
        OptimizerSettings(),
    )  # fmt: skip
    backend.seed(spec.seed)
    rng = np.random.default_rng(spec.seed)
    schedule = spec.schedule()
    losses, heldout = [], [(0, heldout_loss(backend, held_ids, spec.context))]
    seconds = 0.0
    for step in range(spec.steps):
        start = time.perf_counter()
        # Random offsets, so every step sees new windows and no token is always a window's first.
        starts = rng.integers(0, len(train_ids) - spec.context - 1, spec.batch_size)
        loss = backend.loss_and_grads(windows(train_ids, starts, spec.context))
        backend.step(learning_rate(step, schedule))
        seconds += time.perf_counter() - start
        losses.append(loss)
        if progress is not None:
            progress(step, loss)
        if (step + 1) % spec.eval_every == 0 or step + 1 == spec.steps:
            heldout.append((step + 1, heldout_loss(backend, held_ids, spec.context)))
    return {
        "tokenizer": tokenizer,
        "backend": backend,
        "corpus_chars": len(text),
        "corpus_sha256": corpus_sha256(text),
        "tokens": {"train": len(train_ids), "heldout": len(held_ids)},
        "heldout_chars": len(tokenizer.decode(held_ids.tolist())),
        "losses": losses,
        "heldout": heldout,
        "train_seconds": seconds,
    }


def sample(
    model: Any,
    tokenizer,
    prompt: str,
    max_new_tokens: int,
    *,
    temperature: float = 0.8,
    top_k: int | None = None,
    seed: int = 0,
) -> str:
    """The prompt and its continuation, as text: ``model.generate`` from the prompt's ids
    (``temperature=0`` is greedy), decoded by the tokenizer."""
    import torch

    ids = tokenizer.encode(prompt).ids
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens, temperature=temperature, top_k=top_k, seed=seed
        )  # (1, P + max_new_tokens)
    return tokenizer.decode(out[0].tolist())


def spec_dict(spec: TextSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


def bits_per_character(loss_per_token: float, tokens: int, chars: int) -> float:
    """A loss in nats per token as bits per character: ``loss · tokens / chars / ln 2``."""
    return loss_per_token * tokens / chars / math.log(2)
