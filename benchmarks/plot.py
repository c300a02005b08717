"""The PNGs: time and GFLOP/s against T, one line per level, log scales; and the decode
roofline of the real model (``roofline``).

Drawn with matplotlib's object API on an Agg canvas: no pyplot, no global
backend switch, so it works on a machine without a display.
"""

from __future__ import annotations

import sys
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from .records import Record

SWEPT = ("attention fwd", "attention fwd+bwd", "decoder fwd")  # the scenarios swept over T


def plot(records: list[Record], path: str | Path, *, title: str = "") -> Path:
    """One row per swept scenario: median time (left) and GFLOP/s (right) against T."""
    scenarios = [s for s in SWEPT if any(r.ok and r.scenario == s for r in records)]
    if not scenarios:
        raise ValueError("nothing to plot: no measured attention or decoder records")
    fig = Figure(figsize=(11, 3.6 * len(scenarios)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(scenarios), 2, squeeze=False)
    # One colour per level in every panel, in ladder order.
    names = dict.fromkeys(r.level for r in records if r.ok and r.scenario in scenarios)
    colour = {name: f"C{i % 10}" for i, name in enumerate(names)}
    for row, scenario in zip(axes, scenarios, strict=True):
        ok = [r for r in records if r.ok and r.scenario == scenario]
        for level in dict.fromkeys(r.level for r in ok):
            mine = sorted((r for r in ok if r.level == level), key=lambda r: r.shape["T"])
            T = [r.shape["T"] for r in mine]
            label = f"{level} ({mine[0].dtype})"
            style = {"marker": "o", "label": label, "color": colour[level]}
            row[0].plot(T, [r.median_s for r in mine], **style)
            row[1].plot(T, [r.gflops for r in mine], **style)
        row[0].set_title(f"{scenario}: median time per call")
        row[0].set_ylabel("seconds")
        row[1].set_title(f"{scenario}: GFLOP/s")
        row[1].set_ylabel("GFLOP/s")
        for ax in row:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length T")
            ax.grid(True, which="both", alpha=0.3)
        row[1].legend(fontsize="small")
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def roofline(records: list[Record], path: str | Path, *, title: str = "") -> Path:
    """Decode tokens/s of the real model against the bytes a token reads, per thread count.

    A decode step reads every weight once, so a machine that streams ``BW`` bytes
    a second cannot decode faster than ``BW / bytes per token``: the line on the
    plot, drawn at the read-only stream measured in the same run at that thread
    count. Each point is a level (or level 3 compiled) at one weight format;
    halving the bytes (float32 -> bfloat16 -> int8 -> int4) moves the ceiling up
    by two, and a point's distance under the line is what the level leaves on the
    table.
    """
    decode = [r for r in records if r.ok and r.scenario.startswith("real decode") and r.gbs]
    streams = {r.shape.get("threads"): r for r in records if r.scenario == "read stream" and r.gbs}
    if not decode or not streams:
        raise ValueError("nothing to plot: no measured real-model decode records")
    threads = sorted({r.shape["threads"] for r in decode})
    fig = Figure(figsize=(5 * len(threads) + 2.6, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(threads), squeeze=False, sharey=True)[0]
    names = dict.fromkeys(r.level for r in decode)
    colour = {name: f"C{i % 10}" for i, name in enumerate(names)}
    markers = {"float32": "o", "bfloat16": "s", "float16": "D", "int8": "^", "int4": "v"}
    for ax, n in zip(axes, threads, strict=True):
        mine = [r for r in decode if r.shape["threads"] == n]
        stream = streams.get(n) or next(iter(streams.values()))
        per_token = [r.bytes_read / r.shape["new"] for r in mine]  # bytes read per new token
        lo, hi = min(per_token) / 1.5, max(per_token) * 1.5
        xs = [lo * (hi / lo) ** (i / 50) for i in range(51)]
        ax.plot(xs, [stream.gbs * 1e9 / x for x in xs], color="black", lw=1)
        ax.annotate(
            f"the read stream: {stream.gbs:.0f} GB/s ({stream.level})",
            (xs[5], stream.gbs * 1e9 / xs[5]),
            fontsize="small",
        )
        for r, b in zip(mine, per_token, strict=True):
            fmt = r.scenario.rsplit(" ", 1)[-1]
            ax.scatter(b, r.tokens_per_s, color=colour[r.level], marker=markers.get(fmt, "o"),
                       label=f"{r.level} {fmt}")  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # the decades alone: minor labels overlap
        ax.set_xlabel("bytes read per decoded token (weights and cache)")
        ax.set_title(f"SmolLM2-135M decode, {n} thread{'s' if n > 1 else ''}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("decode tokens/s")
    # One legend for every panel, beside them: inside, it hid points.
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper", fontsize="small")
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.plot [--roofline] RUN.json OUT.png``: redraw a saved run's plot."""
    from .records import read_json

    argv = sys.argv[1:] if argv is None else argv
    draw = plot
    if argv[:1] == ["--roofline"]:
        draw, argv = roofline, argv[1:]
    if len(argv) != 2:
        print("usage: python -m benchmarks.plot [--roofline] RUN.json OUT.png", file=sys.stderr)
        return 2
    records = read_json(argv[0])
    stamp = next((r for r in records if r.machine), None)
    title = f"{stamp.machine}; {stamp.date}" if stamp else ""
    draw(records, argv[1], title=title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
