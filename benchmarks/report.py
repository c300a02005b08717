"""Rendering: rich tables of the records, and the ratios that summarise a run.

Absolute times on a shared, throttled machine drift from run to run; ratios
between levels measured minutes apart in one run are far steadier. So the
report ends with ratios, each computed from records of the same run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .records import FIGURE, Record

# A table wider than the console drops columns in this order until it fits, and
# then shortens level names ("level2_torch_manual" -> "level2"): no number is ever
# broken across lines or cropped. --json keeps every field.
DROP_ORDER = ("note", "IQR", "peak mem", "% peak", "% bw", "waste", "dtype", "GB/s", "GFLOP/s")


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


def _text(cell: str) -> Text:
    """A cell as plain text: rich never reads markup in it (``[triton]`` stays as written)."""
    return Text(cell)


SHORT_DTYPES = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def size_label(shape: dict[str, int], keys: Iterable[str] | None = None) -> str:
    """``"T=1024"``: the entries of ``shape`` named in ``keys`` (default: all)."""
    keys = list(shape) if keys is None else list(keys)
    return " ".join(f"{k}={shape[k]}" for k in keys if k in shape)


def _split_shape(records: list[Record]) -> tuple[list[str], list[str]]:
    """Shape keys that vary across ``records`` (the size column) and those that do not
    (the title). With nothing varying, ``T`` still goes in the size column."""
    keys = list(dict.fromkeys(k for r in records for k in r.shape))
    varying = [k for k in keys if len({r.shape.get(k) for r in records}) > 1] or ["T"]
    return varying, [k for k in keys if k not in varying]


def make_console(stderr: bool = False) -> Console:
    """A console at least 150 columns wide when writing to a file or pipe (rich's default
    there is 80, which folds every table), the terminal's width otherwise."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(width=150, stderr=stderr)


def machine_table(records: list[Record], machine: str) -> Table:
    """The machine, the peak, and what every level is (its describe() or why it is missing)."""
    date = records[0].date if records else ""
    table = Table(title=f"Machine: {machine}   run started {date}", title_justify="left")
    table.add_column("backend", no_wrap=True)
    table.add_column("what computes")
    for r in records:
        if r.scenario == "matmul peak":
            table.add_row(
                _text(r.level),
                _text(
                    f"{r.description}, {r.dtype}: {r.gflops:.3g} GFLOP/s (median "
                    f"{fmt_time(r.median_s)}) = the 100% of '% peak'"
                ),
            )
        elif r.scenario == "copy bandwidth":
            table.add_row(
                _text(r.level),
                _text(f"{r.description}: {r.gbs:.3g} GB/s = the 100% of '% bw'"),
            )
    seen: set[str] = set()
    for r in records:
        if r.scenario in CEILINGS or r.status == FIGURE or r.level in seen:
            continue
        seen.add(r.level)
        what = r.status if r.status.startswith("unavailable") else r.description
        table.add_row(_text(r.level), _text(what))
    return table


CEILINGS = ("matmul peak", "copy bandwidth")  # measured limits, not levels

COLUMNS = (
    # (header, right-justified); a column empty in every row of a table is left out
    ("size", False),
    ("level", False),
    ("dtype", False),
    ("median", True),
    ("IQR", True),
    ("GFLOP/s", True),
    ("% peak", True),
    ("tok/s", True),
    ("GB/s", True),
    ("% bw", True),
    ("waste", True),
    ("KV/token", True),
    ("peak mem", True),
    ("max err", True),
    ("note", False),
)


def _cells(r: Record, varying: list[str]) -> list[str]:
    size, dtype = size_label(r.shape, varying), SHORT_DTYPES.get(r.dtype, r.dtype)
    waste = "" if r.padding_waste is None else f"{r.padding_waste:.2f}"
    if r.status == FIGURE:
        per_token = "" if r.cache_bytes_per_token is None else fmt_bytes(r.cache_bytes_per_token)
        return [size, r.level, "", "", "", "", "", "", "", "", waste, per_token, "", "", r.note]
    if not r.ok:
        # "skipped: no gradients at this level" -> "skipped" here, the reason in the note;
        # a wrong case shows its error, which is why it was not timed.
        short, _, why = r.status.partition(": ")
        short = "budget" if short == "skipped (budget)" else short
        error = fmt_error(r) if r.max_error is not None else ""
        cells = [size, r.level, dtype, short, *[""] * 9, error]
        return [*cells, "; ".join(filter(None, (why, r.note)))]
    return [
        size,
        r.level,
        dtype,
        fmt_time(r.median_s),
        fmt_time(r.q3_s - r.q1_s),
        fmt_rate(r.gflops),
        "" if r.peak_fraction is None else fmt_percent(r.peak_fraction),
        "" if r.tokens_per_s is None else fmt_rate(r.tokens_per_s),
        "" if r.gbs is None else fmt_rate(r.gbs),
        "" if r.bandwidth_fraction is None else fmt_percent(r.bandwidth_fraction),
        waste,
        "",
        fmt_bytes(r.peak_memory_bytes),
        fmt_error(r),
        r.note,
    ]


def _table(title: str, headers: list[str], rows: list[list[str]]) -> Table:
    table = Table(title=title, title_justify="left")
    for header in headers:
        right = dict(COLUMNS)[header]
        # Every column but the note is no_wrap: a number is never broken across lines.
        table.add_column(header, justify="right" if right else "left", no_wrap=header != "note")
    for row in rows:
        table.add_row(*(_text(cell) for cell in row))
    return table


def _needed_width(headers: list[str], rows: list[list[str]]) -> int:
    """Columns a table of these cells needs with every number whole: each column is its
    widest cell (the note only its longest word, since it may wrap), plus rich's padding
    of one space each side and one border character per column, plus the last border."""
    width = 1
    for i, header in enumerate(headers):
        cells = [header, *(row[i] for row in rows)]
        if header == "note":
            cells = [word for cell in cells for word in cell.split()] or [""]
        width += max(len(cell) for cell in cells) + 3
    return width


def scenario_table(scenario: str, records: list[Record], *, width: int | None = None) -> Table:
    """One scenario: every level at every size, with the harness's columns.

    Columns empty in every row are left out. With a ``width``, columns go in
    ``DROP_ORDER`` (then level names shorten) until the table fits.
    """
    varying, fixed = _split_shape(records)
    self_attention = "S" in varying and all(r.shape["S"] == r.shape["T"] for r in records)
    if self_attention:
        varying.remove("S")  # S = T: said once, in the title
    title = f"{scenario}  [{size_label(records[0].shape, fixed)}{' S=T' if self_attention else ''}]"
    title = f"{title}  on {records[0].device}"
    rows = [_cells(r, varying) for r in records]
    headers = [h for h, _ in COLUMNS]
    keep = [
        h
        for i, h in enumerate(headers)
        if (i < 4 and records[0].status != FIGURE) or any(row[i] for row in rows)
    ]
    short = False
    while True:
        shown = [
            [
                (
                    row[headers.index(h)].split("_")[0]
                    if short and h == "level"
                    else row[headers.index(h)]
                )
                for h in keep
            ]
            for row in rows
        ]
        droppable = [h for h in DROP_ORDER if h in keep]
        if width is None or _needed_width(keep, shown) <= width or (short and not droppable):
            return _table(title, keep, shown)
        if droppable:
            keep.remove(droppable[0])
        else:
            short = True


@dataclass(frozen=True)
class Ratio:
    """A number read off one run: ``value`` = ``numerator`` / ``denominator`` of ``what``."""

    label: str
    value: float
    detail: str


def _ok(records: Iterable[Record], scenario: str) -> list[Record]:
    return [r for r in records if r.ok and r.scenario == scenario]


def level_ratios(records: list[Record], scenario: str = "attention fwd") -> list[Ratio]:
    """Time of each level over the next one up, at the longest T both measured; then
    level 4's time over each SDPA peer's (``sdpa:<backend>``)."""
    ok = _ok(records, scenario)
    names = list(dict.fromkeys(r.level for r in ok))
    rungs = [n for n in names if not n.startswith("sdpa:")]
    pairs = list(zip(rungs, rungs[1:], strict=False))
    pairs += [(rungs[-1], n) for n in names if n.startswith("sdpa:") and rungs]
    return _time_ratios(ok, pairs, scenario)


def _time_ratios(
    ok: list[Record], pairs: list[tuple[str, str]], scenario: str, length: str = "T"
) -> list[Ratio]:
    """Time of ``slow`` over ``fast`` at the longest ``length`` (a shape key) both ran."""
    by = {(r.level, r.shape.get(length)): r for r in ok}
    out = []
    for slow, fast in pairs:
        common = [n for (name, n) in by if name == slow and (fast, n) in by]
        if not common:
            continue
        n = max(common)
        a, b = by[(slow, n)], by[(fast, n)]
        out.append(
            Ratio(
                f"{scenario}: {slow} / {fast}",
                a.median_s / b.median_s,
                f"{length}={n}: {fmt_time(a.median_s)} / {fmt_time(b.median_s)}",
            )
        )
    return out


def figure_ratios(records: list[Record]) -> list[Ratio]:
    """Padding waste, arrival order over bucketed, for each batching rule of the figures."""
    figures = [r for r in records if r.status == FIGURE and r.scenario == "padding waste"]
    out = []
    for plain in (r for r in figures if r.note.endswith("arrival order")):
        rule = plain.note.rsplit(",", 1)[0]
        bucketed = next((r for r in figures if r.note == f"{rule}, bucketed"), None)
        if bucketed is not None and bucketed.padding_waste:
            out.append(
                Ratio(
                    f"padding waste, {rule}: arrival order / bucketed",
                    plain.padding_waste / bucketed.padding_waste,
                    f"{plain.padding_waste:.3g} -> {bucketed.padding_waste:.3g} padded per real "
                    f"token, {size_label(plain.shape)}",
                )
            )
    return out


def window_ratios(records: list[Record]) -> list[Ratio]:
    """Per level, full causal (a window of T keys) over the narrowest window, in time and
    in peak memory, at the longest T where both ran."""
    ok = _ok(records, "attention window")
    out = []
    for level in dict.fromkeys(r.level for r in ok):
        by = {(r.shape["T"], r.shape["W"]): r for r in ok if r.level == level}
        both = [(T, w) for (T, w) in by if w < T and (T, T) in by]
        if not both:
            continue
        T, W = max(both)
        full, window = by[(T, T)], by[(T, W)]
        detail = f"T={T}, W={W}: {fmt_time(full.median_s)} / {fmt_time(window.median_s)}"
        if full.peak_memory_bytes and window.peak_memory_bytes:
            detail += (
                f"; peak memory {fmt_bytes(full.peak_memory_bytes)} / "
                f"{fmt_bytes(window.peak_memory_bytes)}"
            )
        out.append(Ratio(f"full causal / window: {level}", full.median_s / window.median_s, detail))
    return out


def peer_ratios(records: list[Record], scenario: str, peer: str) -> list[Ratio]:
    """Each level's tokens/s over ``peer``'s at every size both ran (above 1: the level
    is faster)."""
    ok = _ok(records, scenario)
    theirs = {_size(r): r for r in ok if r.level == peer}
    out = []
    for r in ok:
        other = theirs.get(_size(r))
        if r.level != peer and other is not None:
            out.append(
                Ratio(
                    f"{scenario} {size_label(r.shape, ['B'])}: {r.level} / {peer} tok/s",
                    r.tokens_per_s / other.tokens_per_s,
                    f"{r.tokens_per_s:.3g} / {other.tokens_per_s:.3g} tok/s",
                )
            )
    return out


def _size(r: Record) -> tuple:
    return tuple(sorted(r.shape.items()))


def ring_ratios(records: list[Record]) -> list[Ratio]:
    """Per method, one process's time over two's at the longest T both ran (on a machine
    of two cores that mostly says what communication and a shared CPU cost)."""
    ok = _ok(records, "ring")
    by = {(r.level, r.shape["W"], r.shape["T"]): r for r in ok}
    out = []
    for level in dict.fromkeys(r.level for r in ok):
        common = [T for (n, w, T) in by if n == level and w == 1 and (level, 2, T) in by]
        if common:
            T = max(common)
            one, two = by[(level, 1, T)], by[(level, 2, T)]
            out.append(
                Ratio(
                    f"ring, 1 process / 2: {level}",
                    one.median_s / two.median_s,
                    f"T={T}: {fmt_time(one.median_s)} / {fmt_time(two.median_s)}",
                )
            )
    return out


def kv_cache_ratios(records: list[Record]) -> list[Ratio]:
    """KV-cache bytes per token of multi-head attention over the grouped and multi-query."""
    figures = {r.note.split(";")[0]: r for r in records if r.scenario == "kv cache"}
    mha = figures.get("MHA")
    out = []
    for kind in ("GQA", "MQA"):
        if mha is not None and kind in figures:
            other = figures[kind]
            out.append(
                Ratio(
                    f"KV-cache bytes per token: MHA / {kind}",
                    mha.cache_bytes_per_token / other.cache_bytes_per_token,
                    f"{fmt_bytes(mha.cache_bytes_per_token)} / "
                    f"{fmt_bytes(other.cache_bytes_per_token)}, {size_label(other.shape)}",
                )
            )
    return out


def pair_ratios(
    records: list[Record], slow: str, fast: str, label: str, *, throughput: bool = False
) -> list[Ratio]:
    """Per level, ``slow`` scenario time over ``fast`` scenario time (or ``fast``/``slow`` tok/s)."""
    a = {r.level: r for r in _ok(records, slow)}
    b = {r.level: r for r in _ok(records, fast)}
    out = []
    for level in a.keys() & b.keys():
        ra, rb = a[level], b[level]
        if throughput:
            value = rb.tokens_per_s / ra.tokens_per_s
            detail = f"{rb.tokens_per_s:.3g} / {ra.tokens_per_s:.3g} tok/s"
            if ra.padding_waste is not None:
                detail += f"; waste {ra.padding_waste:.2f} -> {rb.padding_waste:.2f}"
        else:
            value = ra.median_s / rb.median_s
            detail = f"{fmt_time(ra.median_s)} / {fmt_time(rb.median_s)}"
        out.append(Ratio(f"{label}: {level}", value, detail))
    return sorted(out, key=lambda r: r.label)


def best_peak_fractions(records: list[Record]) -> list[Ratio]:
    """Each level's best fraction of the measured matmul peak, and where it reached it."""
    best: dict[str, Record] = {}
    for r in records:
        if r.ok and r.scenario not in CEILINGS and r.peak_fraction is not None:
            if r.level not in best or r.peak_fraction > best[r.level].peak_fraction:
                best[r.level] = r
    return [
        Ratio(
            f"best fraction of peak: {level}",
            r.peak_fraction,
            f"{r.gflops:.3g} GFLOP/s in {r.scenario} {size_label(r.shape)}",
        )
        for level, r in best.items()
    ]


def summary(records: list[Record]) -> list[Ratio]:
    """The ratios the docs quote, all from the same run."""
    return [
        *level_ratios(records, "attention fwd"),
        *level_ratios(records, "attention fwd+bwd"),
        *level_ratios(records, "generate cached"),
        *level_ratios(records, "train step"),
        *pair_ratios(records, "generate uncached", "generate cached", "KV-cache speed-up"),
        *pair_ratios(records, "generate one at a time", "generate batched", "batching speed-up"),
        *peer_ratios(records, "generate llama", "transformers"),
        *_time_ratios(
            _ok(records, "decode attention"),
            [("level4:no-split", "level4_triton_kernel")],
            "decode attention, flash-decoding",
            length="S",
        ),
        *pair_ratios(
            records, "varlen padded", "varlen bucketed", "bucketing tokens/s gain", throughput=True
        ),
        *window_ratios(records),
        *figure_ratios(records),
        *kv_cache_ratios(records),
        *ring_ratios(records),
        *best_peak_fractions(records),
    ]


def summary_table(records: list[Record]) -> Table:
    table = Table(title="Ratios within this run", title_justify="left")
    table.add_column("what")
    table.add_column("ratio", justify="right", no_wrap=True)
    table.add_column("from")
    for ratio in summary(records):
        shown = (
            fmt_percent(ratio.value)
            if ratio.label.startswith("best fraction")
            else f"{ratio.value:.3g}x"
        )
        table.add_row(_text(ratio.label), _text(shown), _text(ratio.detail))
    return table


def print_report(records: list[Record], machine: str, console: Console | None = None) -> None:
    console = console or make_console()
    console.print(machine_table(records, machine))
    scenarios = list(
        dict.fromkeys(r.scenario for r in records if r.scenario not in (*CEILINGS, "-"))
    )
    narrowed = False
    for scenario in scenarios:
        rows = [r for r in records if r.scenario == scenario]
        table = scenario_table(scenario, rows, width=console.width)
        narrowed |= len(table.columns) < len(scenario_table(scenario, rows).columns)
        console.print(table)
    console.print(summary_table(records))
    if narrowed:
        console.print(
            f"(a console of {console.width} columns: some columns are left out to keep every "
            "number whole; widen it, or read every field with --json)",
            markup=False,
        )
    console.print(
        "Timings on a shared machine are noisy: compare ratios within one run, not numbers "
        "across runs. Interpreter rows are a CPU emulation of a GPU kernel, not GPU timings.",
        markup=False,
    )
