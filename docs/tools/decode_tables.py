"""The real model's tables (docs/decoding.md, docs/benchmarks.md), rendered from the run they quote.

    python docs/tools/decode_tables.py   # print them, from docs/data/real_model_cpu.json

The run is ``ladder bench --scenario real-model --json docs/data/real_model_cpu.json``;
``tests/test_docs_course.py`` checks that every table printed here stands, as printed,
in docs/decoding.md (the weight formats' in docs/benchmarks.md), so no page can quote
a number the committed run does not hold.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs/data/real_model_cpu.json"

RUNGS = ("level1_numpy", "level2_torch_manual", "level3_sdpa_flash", "transformers")
COMPILED = "level3:compiled"
FORMATS = ("float32", "bfloat16", "int8", "int4")


def _records(path: Path = DATA):
    sys.path.insert(0, str(ROOT))
    from benchmarks.records import read_json

    return read_json(path)


class _Run:
    """One saved run, looked up by (phase, format, level, threads)."""

    def __init__(self, records):
        self.by = {}
        for r in records:
            if r.scenario.startswith("real ") and r.ok:
                _, phase, fmt = r.scenario.split()
                self.by[phase, fmt, r.level, r.shape["threads"]] = r
        self.threads = sorted({threads for *_, threads in self.by})

    def get(self, phase, fmt, level, threads):
        return self.by.get((phase, fmt, level, threads))

    def rate(self, phase, fmt, level, threads) -> str:
        r = self.get(phase, fmt, level, threads)
        digits = 1 if phase == "decode" else 0  # a decode's tens of tokens/s, a prompt's hundreds
        return "–" if r is None else f"{r.tokens_per_s:.{digits}f}"

    def share(self, fmt, level, threads) -> str:
        """The decode's share of the read stream at its thread count (the runner's "% bw")."""
        r = self.get("decode", fmt, level, threads)
        return "–" if r is None else f"{r.bandwidth_fraction:.0%}"

    def ratio(self, a, b) -> str:
        return "–" if a is None or b is None else f"{a.tokens_per_s / b.tokens_per_s:.2f}x"


def _table(header: list[str], rows: list[list[str]]) -> str:
    aligns = ["---"] + ["---:"] * (len(header) - 1)
    lines = [header, aligns, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def rungs_table(run: _Run) -> str:
    """float32 decode per rung, level 3 compiled and the peer: tokens/s and the share of
    the read stream, at each thread count."""
    header = ["decode, float32"]
    for n in run.threads:
        header += [f"{n} thread{'s' * (n > 1)}: tokens/s", "GB/s", "% read"]
    rows = []
    for level in (*RUNGS[:3], COMPILED, RUNGS[3]):
        row = [f"`{level}`"]
        for n in run.threads:
            r = run.get("decode", "float32", level, n)
            row += [run.rate("decode", "float32", level, n)]
            row += ["–" if r is None else f"{r.gbs:.1f}", run.share("float32", level, n)]
        rows.append(row)
    return _table(header, rows)


def prompt_table(run: _Run) -> str:
    """The 37-token prefill, float32, tokens/s per rung and thread count."""
    header = ["prompt, float32"] + [f"{n} thread{'s' * (n > 1)}: tokens/s" for n in run.threads]
    rows = [
        [f"`{level}`"] + [run.rate("prompt", "float32", level, n) for n in run.threads]
        for level in RUNGS
    ]
    return _table(header, rows)


def formats_table(run: _Run) -> str:
    """Level 3's decode per weight format, eager and compiled, against float32 compiled,
    with each format's error (max |logits - float64| / max |float64|)."""
    header = ["level 3 decode", "bytes a token"]
    for n in run.threads:
        header += [f"{n}t eager", f"{n}t compiled", "vs float32", "% read"]
    header.append("error")
    rows = []
    for fmt in FORMATS:
        eager1 = run.get("decode", fmt, "level3_sdpa_flash", run.threads[0])
        if eager1 is None:
            continue
        row = [fmt, f"{eager1.gbs * 1e3 / eager1.tokens_per_s:.0f} MB"]
        for n in run.threads:
            compiled = run.get("decode", fmt, COMPILED, n)
            row += [
                run.rate("decode", fmt, "level3_sdpa_flash", n),
                run.rate("decode", fmt, COMPILED, n),
            ]
            row += [run.ratio(compiled, run.get("decode", "float32", COMPILED, n))]
            row += [run.share(fmt, COMPILED, n)]
        row.append(f"{eager1.max_error:.2g}")
        rows.append(row)
    return _table(header, rows)


def tables(path: Path = DATA) -> dict[str, str]:
    run = _Run(_records(path))
    return {
        "rungs": rungs_table(run),
        "prompt": prompt_table(run),
        "formats": formats_table(run),
    }


if __name__ == "__main__":
    for name, text in tables().items():
        print(f"{name}:\n\n{text}\n")
