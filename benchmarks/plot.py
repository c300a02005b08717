"""The PNG: time and GFLOP/s against T, one line per level, log scales.

Drawn with matplotlib's object API on an Agg canvas: no pyplot, no global
backend switch, so it works on a machine without a display.
"""

from __future__ import annotations

import sys
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

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


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.plot RUN.json OUT.png``: redraw the plot of a saved run."""
    from .records import read_json

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m benchmarks.plot RUN.json OUT.png", file=sys.stderr)
        return 2
    records = read_json(argv[0])
    stamp = next((r for r in records if r.machine), None)
    title = f"{stamp.machine}; {stamp.date}" if stamp else ""
    plot(records, argv[1], title=title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
