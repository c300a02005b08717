"""Benchmark figures in the docs: rendered from a committed run, never typed into the prose.

They sit between ``<!-- generated: KIND key="value" ... -->`` and
``<!-- end generated -->`` in ``docs/*.md`` and ``README.md``, and are rendered
by ``RENDERERS`` from the committed run ``docs/data/cpu_quick.json``
(``BENCH_COMMAND`` with ``--json docs/data/cpu_quick.json``); the docs tests
fail when a block differs from what its renderer makes. After a new run::

    python docs/tools/doc_tables.py            # rewrite every generated block, redraw the plot
    python docs/tools/doc_tables.py docs/x.md  # only these files

Why here, in ``docs/tools/``: this is tooling for the docs, not part of the
harness. It times nothing and runs no level; it reads a committed JSON run and
writes Markdown, so it sits beside the pages it writes, outside the installed
packages (``pyproject.toml`` ships ``levels``, ``benchmarks``, ``lab`` and
``ladder``), and nothing in ``benchmarks/`` imports it. The docs tests import it
(``tests/test_docs.py``, and ``tests/markdown_blocks.py`` for ``parse_info``):
pytest puts this folder on the path (``pythonpath`` in ``pyproject.toml``). It
uses the harness only as a user would: ``benchmarks.plot`` redraws the plot.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"]
BENCH_JSON = ROOT / "docs" / "data" / "cpu_quick.json"
# The plot of that run (benchmarks/plot.py), and the hash of the JSON it was drawn from.
BENCH_PLOT = ROOT / "docs" / "img" / "cpu_quick.png"
BENCH_PLOT_SOURCE = BENCH_PLOT.with_suffix(".source")
# The run BENCH_JSON holds. One thread (torch and BLAS): on a shared 2-core
# machine, threads spinning while they wait for a busy core distort the timings.
BENCH_COMMAND = "ladder bench --quick --threads 1"


def parse_info(info: str) -> tuple[str, dict[str, str], tuple[str, ...]]:
    """```` bench scenario="x" ```` -> ``("bench", {"scenario": "x"}, ())``."""
    words = shlex.split(info.strip())
    if not words:
        return "", {}, ()
    attrs, flags = {}, []
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if eq:
            attrs[key] = value
        else:
            flags.append(word)
    return words[0], attrs, tuple(flags)


GENERATED = re.compile(
    r"(?P<open><!-- generated: (?P<spec>[^\n]*?) -->\n)(?P<body>.*?)(?P<close><!-- end generated -->)",
    re.S,
)


def load_records(path: Path = BENCH_JSON) -> list[dict]:
    return json.loads(path.read_text())


def _ms(seconds: float) -> str:
    """A duration in milliseconds, three significant figures."""
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 1000 else f"{ms:,.0f}"


def _cell(record: dict | None, value: str) -> str:
    if record is None:
        return ""
    if record["status"] != "ok":
        return "budget" if record["status"].startswith("skipped (budget") else "n/a"
    if value == "median_ms":
        return _ms(record["median_s"])
    if value == "tokens_per_s":
        return f"{record['tokens_per_s']:,.0f}"
    if value == "gflops":
        return f"{record['gflops']:.3g}"
    if value == "gbs":
        return "" if record.get("gbs") is None else f"{record['gbs']:.3g}"
    if value == "peak_mib":
        peak = record["peak_memory_bytes"]
        return "n/a" if peak is None else f"{peak / 2**20:.3g}"
    raise ValueError(f"unknown value {value!r}")


UNITS = {
    "median_ms": "median ms per call",
    "tokens_per_s": "tokens/s",
    "gflops": "GFLOP/s",
    "peak_mib": "peak MiB allocated per call",
    "gbs": "GB/s read: weights and KV cache",
}


def _source_line(records: list[dict]) -> str:
    """Where the figures come from: the command, the machine and the day of the run."""
    runs = sorted({(r.get("machine") or r["device"], (r.get("date") or "")[:10]) for r in records})
    where = "; ".join(f"{machine}, {day}" if day else machine for machine, day in runs)
    return f"Measured by `{BENCH_COMMAND}` on {where}; data: `docs/data/{BENCH_JSON.name}`."


def _fixed_sizes(rows: list[dict], by: str) -> str:
    """The sizes every row shares, e.g. ``B=1 H=8 Dh=64 causal=1``."""
    first = rows[0]["shape"]
    same = {k: v for k, v in first.items() if k != by and all(r["shape"].get(k) == v for r in rows)}
    return " ".join(f"{k}={v}" for k, v in same.items())


def _dtypes(rows: list[dict]) -> str:
    """``float32`` or ``float32 (level0_loops: float64)``: what each level computed in."""
    by_level = {r["level"]: r["dtype"] for r in rows}
    # The most frequent dtype; on a tie, the first level's (Counter keeps insertion order).
    common = Counter(by_level.values()).most_common(1)[0][0]
    others = [f"{level}: {dtype}" for level, dtype in by_level.items() if dtype != common]
    return common + (f" ({', '.join(others)})" if others else "")


def _table(
    title: str,
    columns: list,
    cell: Callable[[str, object], str],
    rows: list[dict],
    by: str,
    label: Callable[[object], str] = str,
) -> str:
    """A Markdown table with a row per level of ``rows``, a column per entry of ``columns``
    (headed ``label(column)``) holding ``cell(level, column)``, then where the figures come from."""
    lines = [
        f"| {title} | " + " | ".join(label(c) for c in columns) + " |",
        "| --- |" + " ---: |" * len(columns),
    ]
    for level in dict.fromkeys(r["level"] for r in rows):
        lines.append(f"| {level} | " + " | ".join(cell(level, c) for c in columns) + " |")
    lines += ["", f"{_source_line(rows)} {_fixed_sizes(rows, by)}; {_dtypes(rows)}."]
    if any(r["status"].startswith("skipped (budget") for r in rows):
        lines[-1] += ' "budget": skipped, too slow at this size.'
    return "\n".join(lines)


def _only(records: list[dict], scenarios: list[str], levels: str) -> list[dict]:
    """The records of ``scenarios``, restricted to the comma-separated ``levels`` if given."""
    rows = [r for r in records if r["scenario"] in scenarios]
    if levels:
        rows = [r for r in rows if r["level"] in levels.split(",")]
    if not rows:
        raise ValueError(f"no records for {scenarios} in {BENCH_JSON.name}")
    return rows


def _one(rows: list[dict], **where) -> dict | None:
    """The record of ``rows`` matching ``where`` (``shape`` keys allowed); None if there is none."""
    hits = [r for r in rows if all(r["shape"].get(k, r.get(k)) == v for k, v in where.items())]
    if len(hits) > 1:
        raise ValueError(f"several records match {where}; narrow the table")
    return hits[0] if hits else None


def render_bench(
    records: list[dict], *, scenario: str, value: str = "median_ms", by: str = "T", levels=""
) -> str:
    """A table of one scenario: a row per level, a column per size (``shape[by]``)."""
    rows = _only(records, [scenario], levels)
    sizes = sorted({r["shape"][by] for r in rows if by in r["shape"]})
    return _table(
        f"{scenario} ({UNITS[value]})",
        sizes,
        lambda level, size: _cell(_one(rows, level=level, **{by: size}), value),
        rows,
        by,
        label=lambda size: f"{by}={size}",
    )


def render_scenarios(records: list[dict], *, scenarios: str, value: str, levels: str = "") -> str:
    """A row per level, a column per scenario (each measured at one size), e.g. cached vs uncached."""
    rows = _only(records, scenarios.split(","), levels)
    return _table(
        UNITS[value],
        scenarios.split(","),
        lambda level, col: _cell(_one(rows, level=level, scenario=col), value),
        rows,
        "",
    )


def render_window(records: list[dict], *, value: str = "median_ms", levels: str = "") -> str:
    """The window scenario: a row per level, a column per ``(T, W)``, the window of
    each length beside full causal attention (a window of ``T``)."""
    rows = _only(records, ["attention window"], levels)
    pairs = sorted({(r["shape"]["T"], r["shape"]["W"]) for r in rows})
    return _table(
        f"attention window ({UNITS[value]})",
        pairs,
        lambda level, tw: _cell(_one(rows, level=level, T=tw[0], W=tw[1]), value),
        rows,
        "T",
        label=lambda tw: f"T={tw[0]} " + ("full" if tw[1] == tw[0] else f"W={tw[1]}"),
    )


def _times(ratio: float) -> str:
    """``2210.4`` -> ``"2,210x"``, ``0.183`` -> ``"0.18x"``."""
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def render_ladder(records: list[dict], *, scenario: str, T: str) -> str:
    """The README's table: each level, what it is (its package docstring), its time at each
    of the comma-separated sizes ``T``, and its speed-up over level 0 at the first size."""
    from ladder.show import summary
    from levels import LEVELS

    sizes = [int(t) for t in T.split(",")]
    rows = [r for r in records if r["scenario"] == scenario and r["shape"].get("T") in sizes]
    base = _one(rows, level=LEVELS[0], T=sizes[0])
    times = " | ".join(f"T={t} (ms)" for t in sizes)
    lines = [
        f"| level | what it is | {times} | speed-up over level 0, T={sizes[0]} |",
        "| --- | --- |" + " ---: |" * (len(sizes) + 1),
    ]
    for i, name in enumerate(LEVELS):
        cells = [_cell(_one(rows, level=name, T=t), "median_ms") for t in sizes]
        first = _one(rows, level=name, T=sizes[0])
        ratio = ""
        if i == 0:
            ratio = "baseline"
        elif first and base and first["status"] == base["status"] == "ok":
            ratio = _times(base["median_s"] / first["median_s"])
        lines.append(
            f"| {i} [`{name}`](docs/{name}.md) | {summary(name)} | "
            + " | ".join(cells)
            + f" | {ratio} |"
        )
    lines += [
        "",
        f"Scenario `{scenario}`. {_source_line(rows)} {_fixed_sizes(rows, 'T')}; {_dtypes(rows)}.",
    ]
    if any(r["status"].startswith("skipped (budget") for r in rows):
        lines[-1] += ' "budget": skipped, too slow at this size.'
    return "\n".join(lines)


RENDERERS: dict[str, Callable[..., str]] = {
    "bench": render_bench,
    "ladder": render_ladder,
    "scenarios": render_scenarios,
    "window": render_window,
}


def render(spec: str, records: list[dict]) -> str:
    kind, attrs, flags = parse_info(spec)
    if flags or kind not in RENDERERS:
        raise ValueError(f"cannot render generated block {spec!r}")
    return RENDERERS[kind](records, **attrs).rstrip("\n") + "\n"


def regenerate(text: str, records: list[dict]) -> str:
    """``text`` with every generated block re-rendered from ``records``."""
    return GENERATED.sub(
        lambda m: m["open"] + render(m["spec"], records) + m["close"],
        text,
    )


def json_digest(path: Path = BENCH_JSON) -> str:
    """What ``BENCH_PLOT_SOURCE`` records: the hash of the JSON the plot was drawn from."""
    return "sha256 " + hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str]) -> int:
    """Rewrite the generated blocks of the given doc files (default: all of them) and
    redraw the plot, from the committed benchmark JSON."""
    from benchmarks import plot

    if BENCH_PLOT_SOURCE.is_file() and BENCH_PLOT_SOURCE.read_text().strip() == json_digest():
        print(f"{BENCH_PLOT.relative_to(ROOT)} is current")
    else:
        plot.main([str(BENCH_JSON), str(BENCH_PLOT)])
        BENCH_PLOT_SOURCE.write_text(json_digest() + "\n")
        print(f"redrew {BENCH_PLOT.relative_to(ROOT)}")
    records = load_records()
    for path in [Path(a).resolve() for a in argv] or DOC_FILES:
        if not path.is_file():
            continue
        text = path.read_text()
        new = regenerate(text, records)
        if new != text:
            path.write_text(new)
            print(f"rewrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
