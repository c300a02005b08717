"""From task examples to padded batches: what the loss, the metrics and the preflight consume.

A :class:`Batch` is plain numpy, the same for every level; a trainer backend
converts it to the level's own arrays. For both model kinds it carries

* ``inputs (B, T)``: the tokens fed to the decoder (``tgt[:-1]`` for seq2seq,
  ``tokens[:-1]`` for decoder-only), right-padded, with ``valid (B, T)``;
* ``targets (B, T)``: the next token at every position (``pad_id`` where padded);
* ``scored (B, T)``: True where the target counts in the loss and the metrics.
  Padding is never scored; for the cycle task neither is the prompt.

Seq2seq batches add ``src (B, S)`` and ``src_valid (B, S)``.

Training batches come from :class:`BatchStream`, which buckets by length with
``levels.common.bucketing.make_batches`` and reshuffles every epoch from a
seed derived from ``(seed, epoch)``. The batch at step ``n`` is therefore a
pure function of ``(examples, batch_size, seed, n)``: a resumed run sees
exactly the batches an uninterrupted run would have seen, with no data-loader
state to checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from levels.common.bucketing import make_batches, pad_batch, padding_waste
from levels.common.tasks import DecoderOnlyExample, Seq2SeqExample

Example = Seq2SeqExample | DecoderOnlyExample


@dataclass(frozen=True)
class Batch:
    """One padded batch; see the module docstring for the meaning of each array."""

    inputs: np.ndarray  # (B, T) int64
    valid: np.ndarray  # (B, T) bool
    targets: np.ndarray  # (B, T) int64
    scored: np.ndarray  # (B, T) bool
    src: np.ndarray | None = None  # (B, S) int64, seq2seq only
    src_valid: np.ndarray | None = None  # (B, S) bool, seq2seq only

    @property
    def kind(self) -> str:
        return "decoder_only" if self.src is None else "seq2seq"

    @property
    def n_scored(self) -> int:
        return int(self.scored.sum())

    @property
    def n_real(self) -> int:
        """Real (non-pad) tokens the model reads: source and decoder inputs."""
        n = int(self.valid.sum())
        return n if self.src_valid is None else n + int(self.src_valid.sum())


def sequence_length(example: Example) -> int:
    """The length that decides a batch's padding: its longest side."""
    if isinstance(example, Seq2SeqExample):
        return max(len(example.src), len(example.tgt) - 1)
    return len(example.tokens) - 1


def collate(examples: Sequence[Example], pad_id: int) -> Batch:
    """Pad ``examples`` (all of one kind) into a :class:`Batch`."""
    if len(examples) == 0:
        raise ValueError("collate needs at least one example")
    if isinstance(examples[0], Seq2SeqExample):
        src, src_valid = pad_batch([e.src for e in examples], pad_id)  # (B, S)
        inputs, valid = pad_batch([e.tgt[:-1] for e in examples], pad_id)  # (B, T)
        targets, scored = pad_batch([e.tgt[1:] for e in examples], pad_id)  # (B, T)
        # Every real target of a seq2seq example is scored, so `scored` is `valid`.
        return Batch(inputs, valid, targets, scored, src, src_valid)
    inputs, valid = pad_batch([e.tokens[:-1] for e in examples], pad_id)  # (B, T)
    targets, _ = pad_batch([e.tokens[1:] for e in examples], pad_id)  # (B, T)
    # Position j predicts token j + 1, which is scored once it is past the prompt.
    position = np.arange(inputs.shape[1])[None, :]  # (1, T)
    prompt_len = np.array([e.prompt_len for e in examples])[:, None]  # (B, 1)
    scored = valid & (position + 1 >= prompt_len)  # (B, T)
    return Batch(inputs, valid, targets, scored)


class BatchStream:
    """Length-bucketed training batches, reshuffled every epoch, addressable by step."""

    def __init__(self, examples: Sequence[Example], batch_size: int, *, seed: int, pad_id: int):
        self.examples = list(examples)
        self.batch_size = batch_size
        self.seed = seed
        self.pad_id = pad_id
        self.lengths = [sequence_length(e) for e in self.examples]
        self._epoch = -1
        self._batches: list[list[int]] = []
        # Pools have fixed sizes, so every epoch has the same number of batches.
        self.batches_per_epoch = len(self.epoch_batches(0))

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """The index batches of ``epoch``; the shuffle seed is derived from ``(seed, epoch)``."""
        if epoch != self._epoch:
            epoch_seed = int(np.random.SeedSequence([self.seed, epoch]).generate_state(1)[0])
            self._batches = make_batches(self.lengths, batch_size=self.batch_size, seed=epoch_seed)
            self._epoch = epoch
        return self._batches

    def batch_at(self, step: int) -> Batch:
        """The training batch for optimisation step ``step`` (0-based)."""
        epoch, index = divmod(step, self.batches_per_epoch)
        batch = self.epoch_batches(epoch)[index]
        return collate([self.examples[i] for i in batch], self.pad_id)

    def padding_waste(self) -> dict[str, float]:
        """Padded / real positions for one epoch, bucketed and (for comparison) not."""
        plain = make_batches(self.lengths, batch_size=self.batch_size, bucketed=False, seed=0)
        return {
            "bucketed": padding_waste(self.epoch_batches(max(self._epoch, 0)), self.lengths),
            "unbucketed": padding_waste(plain, self.lengths),
        }


def fixed_batches(examples: Sequence[Example], batch_size: int, pad_id: int) -> list[Batch]:
    """Evaluation batches: bucketed by length (less padding), in a fixed order."""
    lengths = [sequence_length(e) for e in examples]
    index_batches = make_batches(lengths, batch_size=batch_size, shuffle=False)
    return [collate([examples[i] for i in b], pad_id) for b in index_batches]
