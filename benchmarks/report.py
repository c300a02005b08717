"""Rendering: rich tables of the records, and the ratios that summarise a run.

Absolute times on a shared, throttled machine drift from run to run; ratios
between levels measured minutes apart in one run are far steadier. So the
report ends with ratios, each computed from records of the same run: the
list ``RATIOS``, data read by ``records.read_ratios``.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .records import (
    FIGURE,
    LAST,
    NEXT,
    Ratio,
    Record,
    fmt_bytes,
    fmt_error,
    fmt_percent,
    fmt_rate,
    fmt_time,
    read_ratios,
    size_label,
)

# A table wider than the console drops columns in this order until it fits, and
# then shortens level names ("level2_torch_manual" -> "level2"): no number is ever
# broken across lines or cropped. --json keeps every field.
DROP_ORDER = ("note", "IQR", "peak mem", "% peak", "% bw", "waste", "dtype", "GB/s", "GFLOP/s")


def _text(cell: str) -> Text:
    """A cell as plain text: rich never reads markup in it (``[triton]`` stays as written)."""
    return Text(cell)


SHORT_DTYPES = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16"}


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
        at = f" at {r.shape['threads']} thread(s)" if "threads" in r.shape else ""
        if r.scenario == "matmul peak":
            table.add_row(
                _text(r.level),
                _text(
                    f"{r.description}, {r.dtype}: {r.gflops:.3g} GFLOP/s (median "
                    f"{fmt_time(r.median_s)}) = the 100% of '% peak'{at}"
                ),
            )
        elif r.scenario == "read stream":
            table.add_row(
                _text(r.level),
                _text(
                    f"{r.description}: {r.gbs:.3g} GB/s{at}, at the end of the run: the 100% "
                    "of '% bw', but for a case timed in turn with the streams (real decode)"
                ),
            )
        elif r.scenario == "copy bandwidth":
            table.add_row(_text(r.level), _text(f"{r.description}: {r.gbs:.3g} GB/s{at}"))
    seen: set[str] = set()
    for r in records:
        if r.scenario in CEILINGS or r.status == FIGURE or r.level in seen:
            continue
        seen.add(r.level)
        what = r.status if r.status.startswith("unavailable") else r.description
        table.add_row(_text(r.level), _text(what))
    return table


CEILINGS = ("matmul peak", "read stream", "copy bandwidth")  # measured limits, not levels

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


# --------------------------------------------------------------------------- ratios


def _ladder(scenario: str) -> tuple[Ratio, Ratio]:
    """Each level's time over the next one up, then the top rung's over each peer's, at
    the longest T both ran."""
    rung = {"scenario": scenario, "peer": False}
    label, at = "{num.scenario}: {num.level} / {den.level}", ("T={num.T}: {num.time} / {den.time}",)
    longest = {"same": ("T",), "keep": "T", "detail": at}
    return (
        Ratio(label, rung, rung | {"level": NEXT}, **longest),
        Ratio(label, rung | {"level": LAST}, rung | {"peer": True}, **longest),
    )


def _per_level(label: str, num: str, den: str, **how) -> Ratio:
    """Each level's ``num`` scenario over its ``den`` scenario."""
    return Ratio(label, {"scenario": num}, {"scenario": den}, same=("level",), **how)


TOKENS = "{num.tokens_per_s:.3g} / {den.tokens_per_s:.3g} tok/s"

RATIOS: tuple[Ratio, ...] = (
    *_ladder("attention fwd"),
    *_ladder("attention fwd+bwd"),
    *_ladder("generate cached"),
    *_ladder("train step"),
    _per_level("KV-cache speed-up: {num.level}", "generate uncached", "generate cached"),
    _per_level("batching speed-up: {num.level}", "generate one at a time", "generate batched"),
    # Above 1: the level generates faster than transformers, at the same size.
    Ratio(
        "generate llama B={num.B}: {num.level} / {den.level} tok/s",
        {"scenario": "generate llama"},
        {"scenario": "generate llama", "level": "transformers"},
        of="tokens_per_s",
        same=("size",),
        detail=(TOKENS,),
    ),
    # Above 1: the level's prefill of a long prompt is faster than transformers' (one thread).
    Ratio(
        "real prefill P={num.P}: {num.level} / {den.level} tok/s",
        {"scenario": "real prefill float32"},
        {"scenario": "real prefill float32", "level": "transformers"},
        of="tokens_per_s",
        same=("P", "threads"),
        detail=(TOKENS,),
    ),
    Ratio(
        "decode attention, flash-decoding: {num.level} / {den.level}",
        {"scenario": "decode attention", "level": "level4:no-split"},
        {"scenario": "decode attention", "level": "level4_triton_kernel"},
        same=("S",),
        keep="S",
        detail=("S={num.S}: {num.time} / {den.time}",),
    ),
    _per_level(
        "bucketing tokens/s gain: {num.level}",
        "varlen bucketed",
        "varlen padded",
        of="tokens_per_s",
        detail=(TOKENS, "waste {den.padding_waste:.2f} -> {num.padding_waste:.2f}"),
    ),
    Ratio(
        "full causal / window: {num.level}",
        {"scenario": "attention window", "full": True},
        {"scenario": "attention window", "full": False},
        same=("level", "T"),
        keep="T",
        detail=(
            "T={num.T}, W={den.W}: {num.time} / {den.time}",
            "peak memory {num.memory} / {den.memory}",
        ),
    ),
    Ratio(
        "padding waste, {num.rule}: arrival order / bucketed",
        {"scenario": "padding waste", "variant": "arrival order"},
        {"scenario": "padding waste", "variant": "bucketed"},
        of="padding_waste",
        same=("rule",),
        detail=(
            "{num.padding_waste:.3g} -> {den.padding_waste:.3g} padded per real token, {num.size}",
        ),
    ),
    Ratio(
        "KV-cache bytes per token: {num.variant} / {den.variant}",
        {"scenario": "kv cache", "variant": "MHA"},
        {"scenario": "kv cache"},
        of="cache_bytes_per_token",
        detail=("{num.cache} / {den.cache}, {den.size}",),
    ),
    # On a machine of two cores this mostly says what communication and a shared CPU cost.
    Ratio(
        "ring, 1 process / 2: {num.level}",
        {"scenario": "ring", "W": 1},
        {"scenario": "ring", "W": 2},
        same=("level", "T"),
        keep="T",
        detail=("T={num.T}: {num.time} / {den.time}",),
    ),
    # What decoding several requests together buys a server (1x when it decodes one at a time).
    Ratio(
        "{num.level}: 8 clients at once / one after another",
        {"scenario": "serve", "clients": 8},
        {"scenario": "serve", "clients": 1},
        of="tokens_per_s",
        same=("level",),
        detail=(TOKENS,),
    ),
    Ratio(
        "8 clients at once, batched / one after another, compiled",
        {"scenario": "serve", "clients": 8},
        {"scenario": "serve", "clients": 1, "level": "ladder serve --max-batch 1 --compile"},
        of="tokens_per_s",
        detail=(TOKENS,),
    ),
    # What the check of T - 1 guesses costs, in decode steps (benchmarks/check_cost.py): its
    # limits, the read's 1 step and the arithmetic's, in the note.
    Ratio(
        "the check of T={num.T} tokens / a decode step",
        {"scenario": "speculative check"},
        {"scenario": "speculative check step"},
        same=("T",),
        detail=("{num.time} / {den.time}", "{num.note}"),
    ),
    # What each draft buys decoding, k guesses a pass (docs/speculative.md): above 1, faster.
    Ratio(
        "speculative, {num.task}, k={num.k}: {num.level} / plain",
        {"scenario": "speculative"},
        {"scenario": "speculative plain"},
        of="tokens_per_s",
        same=("task",),
        detail=(TOKENS, "{num.note}"),
    ),
    # What constrained decoding costs: a token's mask against a compiled decode step (the
    # target: at most 5%), and eight clients under schemas against eight without (at least 90%).
    Ratio(
        "a token's mask / the compiled decode step, per token",
        {"scenario": "serve mask"},
        {"scenario": "serve step"},
        percent=True,
    ),
    Ratio(
        "8 clients at once: under 8 schemas / none",
        {"scenario": "serve constrained", "schemas": 8},
        {"scenario": "serve constrained", "schemas": 0},
        of="tokens_per_s",
        detail=(TOKENS,),
        percent=True,
    ),
    Ratio(
        "8 clients at once: under a long string's schema / none (answers as long)",
        {"scenario": "serve constrained", "schemas": 1},
        {"scenario": "serve constrained", "schemas": 0},
        of="tokens_per_s",
        detail=(TOKENS,),
        percent=True,
    ),
    # Over the matmul peak's own fraction, 1: each level's best "% peak", and where.
    Ratio(
        "best fraction of peak: {num.level}",
        {},
        {"scenario": "matmul peak"},
        of="peak_fraction",
        keep="peak_fraction",
        detail=("{num.gflops:.3g} GFLOP/s in {num.scenario} {num.size}",),
        percent=True,
    ),
)
"""The ratios the report ends with and the docs quote, all from the same run."""


def summary_table(records: list[Record]) -> Table:
    table = Table(title="Ratios within this run", title_justify="left")
    table.add_column("what")
    table.add_column("ratio", justify="right", no_wrap=True)
    table.add_column("from")
    for reading in read_ratios(RATIOS, records):
        table.add_row(_text(reading.label), _text(reading.shown), _text(reading.detail))
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
