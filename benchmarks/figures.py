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

from dataclasses import replace

import numpy as np

import levels
from levels.common.bucketing import make_batches, padding_waste
from levels.common.config import TransformerConfig
from levels.common.params import kv_bytes_per_token

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


# TinyLlama-1.1B's attention shape; its checkpoint uses 4 KV heads.
KV_MODEL = TransformerConfig(
    vocab_size=32000, d_model=2048, n_heads=32, d_ff=5632, n_layers=22, max_seq_len=16
)
KV_HEADS = (("MHA", 32), ("GQA", 4), ("MQA", 1))
CONTEXT = 2048  # tokens, for the note's per-sequence figure


def kv_cache_figures() -> list[Record]:
    """Bytes per cached position for MHA, GQA and MQA, measured on allocated buffers."""
    import torch

    static_cache = levels.load("level3_sdpa_flash").StaticKVCache
    records = []
    for kind, n_kv in KV_HEADS:
        config = replace(KV_MODEL, n_kv_heads=n_kv)
        cache = static_cache(config, 1, dtype=torch.bfloat16)
        per_token = (cache.k.nbytes + cache.v.nbytes) // (cache.batch * cache.capacity)
        formula = kv_bytes_per_token(config, torch.bfloat16.itemsize)
        if per_token != formula:  # the buffers are the truth; the formula must agree
            raise AssertionError(f"{kind}: allocated {per_token} B/token, formula {formula}")
        records.append(
            Record(
                level="level3_sdpa_flash.StaticKVCache",
                scenario="kv cache",
                device="-",
                dtype="bfloat16",
                shape={"L": config.n_layers, "H": config.n_heads, "Hkv": n_kv, "Dh": config.d_head},
                status=FIGURE,
                cache_bytes_per_token=per_token,
                description="StaticKVCache(k, v).nbytes / (B C)",
                note=f"{kind}; {per_token * CONTEXT / 2**20:.4g} MiB per {CONTEXT}-token sequence",
            )
        )
    return records
