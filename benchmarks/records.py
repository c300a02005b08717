"""The record: one row of the results, the unit of the JSON output and of the tables."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

OK = "ok"
SKIPPED_BUDGET = "skipped (budget)"
WRONG = "wrong"  # over its error bound: checked, never timed
FIGURE = "figure"  # a computed figure (no timing), e.g. padding waste


@dataclass
class Record:
    """One (level, scenario, size) measurement, or why there is none.

    Times are seconds per call. ``status`` is ``"ok"``, ``"wrong"`` (over its
    error bound, so not timed; the note says by how much), ``"skipped (budget)"``,
    ``"skipped: <why>"``, ``"unavailable: <why>"``, ``"error: <what>"``, or
    ``"figure"`` for a computed figure that involves no timing; only ``"ok"``
    rows carry times.
    """

    level: str  # a level's name, "sdpa:<backend>", or "torch.matmul" for the peak
    scenario: str
    device: str
    dtype: str  # what the level really computed in (level 0: always float64)
    shape: dict[str, int] = field(default_factory=dict)  # B, H, T, S, Dh or the model's sizes
    status: str = OK
    median_s: float | None = None
    q1_s: float | None = None  # 25th percentile
    q3_s: float | None = None  # 75th percentile
    min_s: float | None = None
    max_s: float | None = None
    repeats: int = 0  # samples behind the statistics
    calls_per_sample: int = 1
    flops: float | None = None  # FLOPs of one call (benchmarks/flops.py)
    gflops: float | None = None  # flops / median_s / 1e9
    peak_fraction: float | None = None  # gflops / the matmul peak measured in this run
    tokens_per_s: float | None = None
    bytes_read: float | None = None  # bytes a call reads from memory (generation: flops.py)
    gbs: float | None = None  # bytes_read / median_s / 1e9
    bandwidth_fraction: float | None = None  # gbs / the copy bandwidth measured in this run
    peak_memory_bytes: int | None = None
    memory_method: str = "n/a"
    max_error: float | None = None  # against the float64 reference (scenarios.scaled_error)
    error_of: str = ""  # what was compared ("output", "logits", "tokens != ref", ...)
    error_bound: float | None = None  # the largest error that counts as right (bounds.py)
    padding_waste: float | None = None  # padded positions / real tokens (varlen only)
    cache_bytes_per_token: int | None = None  # KV-cache bytes one position costs (kv-cache)
    description: str = ""  # the level's describe()
    note: str = ""  # e.g. the SDPA backend that ran, or why a size was skipped
    machine: str = ""  # CPU model and threads, or the GPU's name
    date: str = ""  # when the run started, UTC, ISO 8601

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict:
        return asdict(self)


def write_json(records: list[Record], path: str | Path) -> None:
    """A JSON list of records (every field of ``Record``, None as null)."""
    Path(path).write_text(json.dumps([r.to_dict() for r in records], indent=1) + "\n")


def read_json(path: str | Path) -> list[Record]:
    """Records from a JSON list written by ``write_json`` (fields it lacks take their defaults)."""
    return [Record(**d) for d in json.loads(Path(path).read_text())]
