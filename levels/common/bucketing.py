"""Length bucketing: batch sequences of similar length so little compute goes to padding.

A batch is padded to its longest sequence, so a batch that mixes a 5-token and
a 500-token sequence spends 495 positions of work on padding. Sorting by length
before batching removes most of that waste, but a fully sorted order would feed
training the same batches in the same order every epoch. The usual compromise,
used here: shuffle, cut the shuffled order into *pools* of a few batches, sort
each pool by length, cut it into batches, and shuffle the batch order.

``padding_waste`` is the figure the benchmarks and the training lab report:
padded positions divided by real tokens (0.0 means no waste; 1.0 means as many
padded positions as real ones).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def padding_waste(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """Padded positions / real tokens when each batch of indices is padded to its longest."""
    lengths = np.asarray(lengths)
    real = padded = 0
    for batch in batches:
        lens = lengths[np.asarray(batch, dtype=np.int64)]
        real += int(lens.sum())
        padded += int(lens.max()) * len(lens) - int(lens.sum())
    if real == 0:
        raise ValueError("padding_waste needs at least one real token")
    return padded / real


def _chunk(
    order: Sequence[int], lengths: np.ndarray, batch_size: int | None, max_tokens: int | None
) -> list[list[int]]:
    """Cut ``order`` into consecutive batches of ``batch_size`` sequences, or of at most
    ``max_tokens`` padded positions (batch size times its longest length)."""
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in order:
        n = int(lengths[index])
        if current:
            full = (
                len(current) >= batch_size
                if batch_size is not None
                else max(longest, n) * (len(current) + 1) > max_tokens
            )
            if full:
                batches.append(current)
                current, longest = [], 0
        current.append(int(index))
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def make_batches(
    lengths: Sequence[int],
    *,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    bucketed: bool = True,
    pool_batches: int = 50,
    shuffle: bool = True,
    seed: int = 0,
) -> list[list[int]]:
    """Group sequence indices into batches; returns a list of index lists.

    Give exactly one of ``batch_size`` (sequences per batch) or ``max_tokens``
    (a budget of padded positions per batch, so short sequences travel in
    larger batches). With ``bucketed=False`` the (shuffled) order is cut as it
    comes: the baseline that ``padding_waste`` is compared against. With
    ``bucketed=True`` each pool of ``pool_batches`` batches is sorted by length
    first. A sequence longer than ``max_tokens`` gets a batch of its own.
    """
    if (batch_size is None) == (max_tokens is None):
        raise ValueError("give exactly one of batch_size or max_tokens")
    if batch_size is not None and batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if max_tokens is not None and max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1 or lengths.size == 0 or lengths.min() <= 0:
        raise ValueError("lengths must be a non-empty list of positive integers")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lengths)) if shuffle else np.arange(len(lengths))
    if not bucketed:
        return _chunk(order, lengths, batch_size, max_tokens)

    # A pool holds about `pool_batches` batches' worth of sequences.
    per_batch = batch_size if batch_size is not None else max(1, max_tokens // int(lengths.mean()))
    pool = max(1, per_batch * pool_batches)
    batches: list[list[int]] = []
    for start in range(0, len(order), pool):
        members = order[start : start + pool]
        # A stable sort keeps the shuffled order among equal lengths.
        members = members[np.argsort(lengths[members], kind="stable")]
        batches.extend(_chunk(members, lengths, batch_size, max_tokens))
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token lists into ``tokens (B, T)`` int64 and ``valid (B, T)`` bool."""
    if len(sequences) == 0:
        raise ValueError("pad_batch needs at least one sequence")
    T = max(len(s) for s in sequences)
    tokens = np.full((len(sequences), T), pad_id, dtype=np.int64)  # (B, T)
    valid = np.zeros((len(sequences), T), dtype=bool)  # (B, T)
    for b, seq in enumerate(sequences):
        tokens[b, : len(seq)] = seq
        valid[b, : len(seq)] = True
    return tokens, valid
