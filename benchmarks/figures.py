"""Figures the benchmark computes rather than times (recorded with status ``"figure"``).

* Padding waste of length bucketing on a long-tailed mix of lengths: 10,000
  lengths drawn from a Pareto(1.5) distribution (most sequences short, a few
  very long, as in real corpora; capped at 2048), batched in arrival order or
  by length (``levels.common.bucketing``), with a fixed number of sequences
  per batch or a budget of padded tokens per batch. The timed ``varlen``
  scenario measures what such waste costs; this says how much of it there is
  at the scale of a real data set.
"""

from __future__ import annotations

import numpy as np

from levels.common.bucketing import make_batches, padding_waste

from .records import FIGURE, Record

PARETO_N, PARETO_SHAPE, PARETO_SCALE, PARETO_MAX = 10_000, 1.5, 32, 2048


def pareto_lengths(seed: int = 0) -> np.ndarray:
    """``PARETO_N`` sequence lengths, at least 1 and at most ``PARETO_MAX``."""
    rng = np.random.default_rng(seed)
    lengths = 1 + (rng.pareto(PARETO_SHAPE, PARETO_N) * PARETO_SCALE).astype(int)
    return np.minimum(lengths, PARETO_MAX)


def padding_figures() -> list[Record]:
    """Padded / real positions, arrival order vs bucketed, per batching rule."""
    lengths = pareto_lengths()
    shape = {"N": len(lengths), "median": int(np.median(lengths)), "max": int(lengths.max())}
    records = []
    for rule, kw in (
        ("batch_size=32", {"batch_size": 32}),
        ("max_tokens=16384", {"max_tokens": 16384}),
    ):
        for bucketed in (False, True):
            waste = padding_waste(make_batches(lengths, bucketed=bucketed, **kw), lengths)
            records.append(
                Record(
                    level="levels.common.bucketing",
                    scenario="padding waste",
                    device="-",
                    dtype="-",
                    shape=shape,
                    status=FIGURE,
                    padding_waste=waste,
                    description="make_batches + padding_waste",
                    note=f"{rule}, {'bucketed' if bucketed else 'arrival order'}",
                )
            )
    return records
