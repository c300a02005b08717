"""The record: one row of the results, the unit of the JSON output, of the tables and of
the ratios that summarise a run.

A ``Record`` is one (level, scenario, size) measurement, or why there is none;
``write_json`` and ``read_json`` keep a run. Its numbers are written as text
here (``fmt_time`` and the rest), the same in the tables and in the ratios.

A ``Ratio`` is a description, not a function: which scenario, which records form
the numerator and the denominator (by named fields: level, peer, size, variant),
and which field is compared (a time, tokens/s, bytes). ``read_ratios`` reads a
list of them off a run's records; the report's list is ``report.RATIOS``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import levels

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
    stream_gbs: float | None = None  # the read stream timed in turn with it (runner._in_turn)
    bandwidth_fraction: float | None = None  # of that stream, else of the run's (runner)
    peak_memory_bytes: int | None = None
    memory_method: str = "n/a"
    max_error: float | None = None  # against the float64 reference (scenarios.scaled_error)
    error_of: str = ""  # what was compared ("output", "logits", "tokens != ref", ...)
    error_bound: float | None = None  # the largest error that counts as right (bounds.py)
    padding_waste: float | None = None  # padded positions / real tokens (varlen only)
    cache_bytes_per_token: int | None = None  # KV-cache bytes one position costs (kv-cache)
    description: str = ""  # the level's describe()
    figures: dict[str, float] = field(default_factory=dict)  # a scenario's own (speculative: a, c)
    note: str = ""  # e.g. the SDPA backend that ran, or why a size was skipped
    machine: str = ""  # CPU model and threads, or the GPU's name
    date: str = ""  # when the run started, UTC, ISO 8601

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict:
        return asdict(self)


def write_json(records: list[Record], path: str | Path) -> None:
    """A JSON list of records (every field of ``Record``, None as null), written whole
    beside ``path`` and then renamed over it: a run that rewrites it after every case,
    and is interrupted while writing, leaves the previous list, never half of one."""
    path = Path(path)
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        scratch.write_text(json.dumps([r.to_dict() for r in records], indent=1) + "\n")
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)


def read_json(path: str | Path) -> list[Record]:
    """Records from a JSON list written by ``write_json`` (fields it lacks take their defaults)."""
    return [Record(**d) for d in json.loads(Path(path).read_text())]


# --------------------------------------------------------------------------- numbers as text


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def fmt_percent(fraction: float) -> str:
    """``0.0712 -> "7.1%"``, ``1.004 -> "100%"``: two figures, never an exponent."""
    percent = 100 * fraction
    return f"{percent:.2g}%" if percent < 99.5 else f"{percent:.0f}%"


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def fmt_error(r: Record) -> str:
    if r.max_error is None:
        return "n/a"
    if r.error_of == "tokens != ref":
        return f"{int(r.max_error)} tok"
    return f"{r.max_error:.2g}"


def size_label(shape: dict[str, int], keys: Iterable[str] | None = None) -> str:
    """``"T=1024"``: the entries of ``shape`` named in ``keys`` (default: all)."""
    keys = list(shape) if keys is None else list(keys)
    return " ".join(f"{k}={shape[k]}" for k in keys if k in shape)


# --------------------------------------------------------------------------- ratios


@dataclass(frozen=True)
class Relative:
    """A field's value given by its place among the values that occur, in the order
    they first appear: ``NEXT`` in a ratio's ``den`` (the value after the numerator's)
    or ``LAST`` in its ``num`` (the last one)."""

    which: str


NEXT, LAST = Relative("next"), Relative("last")


@dataclass(frozen=True)
class Ratio:
    """One ratio to read off a run: the field ``of`` of a numerator record over the same
    field of a denominator record, each picked by named fields.

    ``num`` and ``den`` map a field (a record's attribute, a shape entry, or one of
    ``DERIVED``) to the value it must have, or to a ``Relative`` one. Only records
    that have the field ``of`` take part (measured rows and computed figures); the
    two must agree on the fields in ``same``, and a record is never its own
    denominator. Each pair gives one reading, named by ``label``. Of the pairs that
    give one label, the one whose numerator has the largest ``keep`` stays ("at the
    longest T both ran": ``same=("T",), keep="T"``), or without ``keep`` the first.
    Readings come in the order their labels first occur.
    """

    label: str  # str.format over the pair, e.g. "{num.level} / {den.level}"
    num: Mapping[str, object]
    den: Mapping[str, object]
    of: str = "median_s"  # the field compared: "median_s", "tokens_per_s", ...
    same: tuple[str, ...] = ()
    keep: str = ""
    # Formatted like the label and joined by "; "; a part that names a missing value is left out.
    detail: tuple[str, ...] = ("{num.time} / {den.time}",)
    percent: bool = False  # shown as a percentage rather than as "3.2x"


def _note(r: Record) -> tuple[str, str, str]:
    """A computed figure's note, ``"<rule>, <variant>; <comment>"``, as (rule, ", ", variant)."""
    return r.note.split(";")[0].rpartition(", ")


DERIVED: dict[str, Callable[[Record], object]] = {
    # A subject beside the ladder (an SDPA backend, transformers), not one of its rungs.
    "peer": lambda r: r.level not in levels.LEVELS,
    # A window of T keys, which is full causal attention.
    "full": lambda r: r.shape.get("W") == r.shape.get("T"),
    "rule": lambda r: _note(r)[0],
    "variant": lambda r: _note(r)[2],
    # Values as the tables write them.
    "size": lambda r: size_label(r.shape),
    "time": lambda r: None if r.median_s is None else fmt_time(r.median_s),
    "memory": lambda r: None if r.peak_memory_bytes is None else fmt_bytes(r.peak_memory_bytes),
    "cache": lambda r: (
        None if r.cache_bytes_per_token is None else fmt_bytes(r.cache_bytes_per_token)
    ),
}


class _Missing(Exception):
    """A template names a value the record does not have."""


class _Fields:
    """A record's named fields: ``get`` for matching, attributes for ``str.format``."""

    def __init__(self, record: Record) -> None:
        self.record = record

    def get(self, name: str) -> object:
        if name in DERIVED:
            return DERIVED[name](self.record)
        return self.record.shape.get(name, getattr(self.record, name, None))

    def __getattr__(self, name: str) -> object:
        value = None if name.startswith("_") else self.get(name)
        if value is None:
            raise _Missing(name)
        return value


@dataclass(frozen=True)
class Reading:
    """A ratio as read off one run."""

    label: str
    value: float
    detail: str
    percent: bool = False

    @property
    def shown(self) -> str:
        return fmt_percent(self.value) if self.percent else f"{self.value:.3g}x"


def read_ratios(ratios: Iterable[Ratio], records: list[Record]) -> list[Reading]:
    """Every reading of ``ratios`` off ``records``, ratio by ratio."""
    return [reading for ratio in ratios for reading in _read(ratio, records)]


def _read(ratio: Ratio, records: list[Record]) -> list[Reading]:
    rows = [
        _Fields(r) for r in records if r.status in (OK, FIGURE) and getattr(r, ratio.of) is not None
    ]
    nums, dens = _picked(ratio.num, rows), _picked(ratio.den, rows)
    after = {k: _values(nums, k) for k, v in ratio.den.items() if v is NEXT}
    kept: dict[str, tuple[_Fields, _Fields, float]] = {}
    for n in nums:
        for d in dens:
            if n is d or not d.get(ratio.of) or any(n.get(k) != d.get(k) for k in ratio.same):
                continue
            if any(d.get(k) != _next(values, n.get(k)) for k, values in after.items()):
                continue
            try:
                label = ratio.label.format(num=n, den=d)
            except _Missing:
                continue
            before = kept.get(label)
            if before is None or (ratio.keep and n.get(ratio.keep) > before[0].get(ratio.keep)):
                kept[label] = (n, d, n.get(ratio.of) / d.get(ratio.of))
    return [
        Reading(label, value, _detail(ratio.detail, n, d), ratio.percent)
        for label, (n, d, value) in kept.items()
    ]


def _picked(pick: Mapping[str, object], rows: list[_Fields]) -> list[_Fields]:
    """The rows with the values ``pick`` names, narrowed to the ``LAST`` ones it asks for."""
    fixed = {k: v for k, v in pick.items() if not isinstance(v, Relative)}
    rows = [r for r in rows if all(r.get(k) == v for k, v in fixed.items())]
    for k in [k for k, v in pick.items() if v is LAST and rows]:
        last = _values(rows, k)[-1]
        rows = [r for r in rows if r.get(k) == last]
    return rows


def _values(rows: list[_Fields], name: str) -> list[object]:
    """The values of ``name`` among ``rows``, in the order they first appear."""
    return list(dict.fromkeys(r.get(name) for r in rows))


def _next(values: list[object], value: object) -> object:
    i = values.index(value) + 1
    return values[i] if i < len(values) else None


def _detail(parts: tuple[str, ...], n: _Fields, d: _Fields) -> str:
    shown = []
    for part in parts:
        try:
            shown.append(part.format(num=n, den=d))
        except _Missing:
            continue
    return "; ".join(shown)
