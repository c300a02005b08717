"""The documentation is executable: its code runs, its quotations and its figures are current.

Every fenced block in ``docs/*.md`` and ``README.md`` whose info string starts
with ``python`` is one of:

* ```` ```python ````: runs. The blocks of one file run in order, in one
  namespace, from the repository root, like a notebook; one test per file.
* ```` ```python skip="why" ````: shown, not run; the reason is required
  (a bare ``skip`` is an error), so every block that does not run says why.
* ```` ```python excerpt="levels/....py" ````: a quotation of that file. It
  must appear there verbatim (up to a uniform indentation); a line holding
  only ``...`` separates quoted chunks, each of which must appear, in order.

A ```` ```output ```` block right after a running block is what that block
must print (compared exactly, trailing whitespace aside).

Figures measured by the benchmark harness are never typed into the prose.
They sit between ``<!-- generated: KIND key="value" ... -->`` and
``<!-- end generated -->`` and are rendered by ``RENDERERS`` from the
committed run ``docs/data/cpu_quick.json`` (``BENCH_COMMAND`` below, with
``--json docs/data/cpu_quick.json``); a test fails when a block differs from
what the renderer makes. After a new run, rewrite them with ``python tests/test_docs.py``.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import json
import os
import re
import shlex
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"]
BENCH_JSON = ROOT / "docs" / "data" / "cpu_quick.json"
# The plot of that run (benchmarks/plot.py), and the hash of the JSON it was drawn from.
BENCH_PLOT = ROOT / "docs" / "img" / "cpu_quick.png"
BENCH_PLOT_SOURCE = BENCH_PLOT.with_suffix(".source")
# The run BENCH_JSON holds. One thread (torch and BLAS): on a shared 2-core
# machine, threads spinning while they wait for a busy core distort the timings.
BENCH_COMMAND = "ladder bench --quick --threads 1"

# ----------------------------------------------------------------------------- parsing

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts, its info string, its text."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str  # first word of the info string ("python", "output", "bash", ...)
    attrs: dict[str, str]  # key="value" pairs after the language
    flags: tuple[str, ...]  # bare words after the language (e.g. a reasonless "skip")
    text: str
    end: int  # 1-based line of the closing fence

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def parse_info(info: str) -> tuple[str, dict[str, str], tuple[str, ...]]:
    """```` python skip="needs CUDA" ```` -> ``("python", {"skip": "needs CUDA"}, ())``."""
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


def blocks(path: Path, text: str | None = None) -> list[Block]:
    """Every fenced block of a Markdown file, in order."""
    lines = (path.read_text() if text is None else text).splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening["fence"]
        lang, attrs, flags = parse_info(opening["info"])
        body, j = [], i + 1
        while j < len(lines) and not (
            lines[j].strip().startswith(fence) and set(lines[j].strip()) == {fence[0]}
        ):
            body.append(lines[j])
            j += 1
        if j == len(lines):
            raise ValueError(f"{path.name}:{i + 1}: fenced block is never closed")
        indent = len(opening["indent"])
        text_ = "\n".join(line[indent:] if line[:indent].isspace() else line for line in body)
        found.append(Block(path, i + 1, lang, attrs, flags, text_ + "\n", j + 1))
        i = j + 1
    return found


@dataclass(frozen=True)
class Step:
    """A block to run, and what it must print (None: anything)."""

    block: Block
    expected_output: str | None


def plan(path: Path, text: str | None = None) -> tuple[list[Step], list[Block]]:
    """The runnable python blocks of a file (with their expected output) and its excerpts.

    Raises ``ValueError`` for a python block marked ``skip`` without a reason,
    or with an attribute this collector does not know.
    """
    all_blocks = blocks(path, text)
    steps, excerpts = [], []
    for n, block in enumerate(all_blocks):
        if block.lang in ("py", "python3", "py3", "pycon", "ipython"):
            # Another name for Python would be shown highlighted but never run.
            raise ValueError(f"{block.where}: write ```python (it runs) or mark it skip=")
        if block.lang != "python":
            continue
        unknown = set(block.attrs) - {"skip", "excerpt"} or set(block.flags)
        if "skip" in block.flags or ("skip" in block.attrs and not block.attrs["skip"].strip()):
            raise ValueError(f'{block.where}: skip needs a reason: ```python skip="why"')
        if unknown:
            raise ValueError(f"{block.where}: unknown block marker(s) {sorted(unknown)}")
        if "excerpt" in block.attrs:
            excerpts.append(block)
            continue
        if "skip" in block.attrs:
            continue
        following = all_blocks[n + 1] if n + 1 < len(all_blocks) else None
        expected = None
        if following is not None and following.lang == "output":
            between = (path.read_text() if text is None else text).splitlines()[
                block.end : following.line - 1
            ]
            if all(not line.strip() for line in between):
                expected = following.text
        steps.append(Step(block, expected))
    return steps, excerpts


# ----------------------------------------------------------------------------- running


def run_steps(steps: list[Step]) -> None:
    """Run blocks in order in one namespace; compare printed output where it is given."""
    namespace: dict[str, object] = {"__name__": "__docs__"}
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for step in steps:
            code = compile(step.block.text, step.block.where, "exec")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(code, namespace)  # noqa: S102 (running the docs is the point)
            if step.expected_output is not None:
                got = [line.rstrip() for line in out.getvalue().rstrip().splitlines()]
                want = [line.rstrip() for line in step.expected_output.rstrip().splitlines()]
                assert got == want, (
                    f"{step.block.where} printed\n{out.getvalue()}\nbut its output block says\n"
                    f"{step.expected_output}"
                )
    finally:
        os.chdir(cwd)


def excerpt_problems(block: Block) -> list[str]:
    """Why an excerpt block is not a verbatim quotation of its file (empty when it is)."""
    path = ROOT / block.attrs["excerpt"]
    if not path.is_file():
        return [f"{block.where}: excerpt names {block.attrs['excerpt']}, which does not exist"]
    source = path.read_text().splitlines()
    chunks, current = [], []
    for line in block.text.rstrip("\n").splitlines():
        if line.strip() == "...":
            chunks.append(current)
            current = []
        else:
            current.append(line)
    chunks.append(current)
    problems, start = [], 0
    for chunk in filter(None, chunks):
        at = find_chunk(textwrap.dedent("\n".join(chunk)).splitlines(), source, start)
        if at is None:
            problems.append(
                f"{block.where}: this part of the excerpt is not in {block.attrs['excerpt']} "
                f"(after line {start}):\n" + "\n".join(chunk)
            )
        else:
            start = at + len(chunk)
    return problems


def find_chunk(chunk: list[str], source: list[str], start: int = 0) -> int | None:
    """Index of the first run of ``source`` lines from ``start`` equal to ``chunk`` re-indented."""
    for i in range(start, len(source) - len(chunk) + 1):
        first = source[i]
        pad = first[: len(first) - len(first.lstrip())]
        if all(
            (src.strip() == "" and line.strip() == "") or src.rstrip() == (pad + line).rstrip()
            for src, line in zip(source[i : i + len(chunk)], chunk, strict=True)
        ):
            return i
    return None


# ----------------------------------------------------------------------------- generated blocks

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
    if value == "peak_mib":
        peak = record["peak_memory_bytes"]
        return "n/a" if peak is None else f"{peak / 2**20:.3g}"
    raise ValueError(f"unknown value {value!r}")


UNITS = {
    "median_ms": "median ms per call",
    "tokens_per_s": "tokens/s",
    "gflops": "GFLOP/s",
    "peak_mib": "peak MiB allocated per call",
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


def _times(ratio: float) -> str:
    """``2210.4`` -> ``"2,210x"``, ``0.183`` -> ``"0.18x"``."""
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def render_ladder(records: list[dict], *, scenario: str, T: str) -> str:
    """The README's table: each level, what it is (its package docstring), its time at each
    of the comma-separated sizes ``T``, and its speed-up over level 0 at the first size."""
    from levels import LEVELS
    from levels.show import summary

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


# ----------------------------------------------------------------------------- the tests


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _files_with(predicate: Callable[[Path], bool]) -> list[Path]:
    """The doc files for which ``predicate`` holds (so no test is a vacuous pass)."""
    return [p for p in DOC_FILES if p.is_file() and predicate(p)]


@pytest.mark.parametrize("path", _files_with(lambda p: bool(plan(p)[0])), ids=_id)
def test_code_blocks_run(path):
    run_steps(plan(path)[0])


@pytest.mark.parametrize("path", _files_with(lambda p: bool(plan(p)[1])), ids=_id)
def test_excerpts_are_verbatim(path):
    _, excerpts = plan(path)
    problems = [p for block in excerpts for p in excerpt_problems(block)]
    assert not problems, "\n\n".join(problems)


@pytest.mark.parametrize(
    "path", _files_with(lambda p: bool(GENERATED.search(p.read_text()))), ids=_id
)
def test_generated_figures_are_current(path):
    text = path.read_text()
    assert text == regenerate(text, load_records()), (
        f"{_id(path)}: a generated block differs from {BENCH_JSON.name}; "
        "run `python tests/test_docs.py` to rewrite it"
    )


def _json_digest() -> str:
    return "sha256 " + hashlib.sha256(BENCH_JSON.read_bytes()).hexdigest()


def test_the_plot_is_drawn_from_the_committed_run():
    assert BENCH_PLOT.is_file(), f"{_id(BENCH_PLOT)} is missing; run `python tests/test_docs.py`"
    assert BENCH_PLOT_SOURCE.read_text().strip() == _json_digest(), (
        f"{_id(BENCH_PLOT)} was drawn from another run; run `python tests/test_docs.py`"
    )


def test_the_doc_files_parse_and_the_front_door_exists():
    """Every marker in every doc file is well-formed (a bad one fails here, not silently)."""
    assert (ROOT / "README.md").is_file()
    for path in DOC_FILES:
        plan(path)


LEVEL_NAMES = (
    "level0_loops",
    "level1_numpy",
    "level2_torch_manual",
    "level3_sdpa_flash",
    "level4_triton_kernel",
)


def test_the_levels_are_the_chapters():
    import levels

    assert levels.LEVELS == LEVEL_NAMES  # a new rung needs its chapter and a row here


@pytest.mark.parametrize("name", LEVEL_NAMES)
def test_each_level_has_a_chapter_and_its_package_names_it(name):
    """docs/<level>.md exists, and the level's package docstring points readers to it."""
    assert (ROOT / "docs" / f"{name}.md").is_file(), f"docs/{name}.md is missing"
    doc = ast.get_docstring(ast.parse((ROOT / "levels" / name / "__init__.py").read_text()))
    assert f"docs/{name}.md" in doc, f"levels/{name}/__init__.py does not name docs/{name}.md"


# The collector itself: each rule must be able to fail.

SAMPLE = Path(ROOT / "docs" / "sample.md")


def test_a_skip_without_reason_is_rejected():
    for marker in ("python skip", 'python skip=""', 'python skip="  "'):
        with pytest.raises(ValueError, match="skip needs a reason"):
            plan(SAMPLE, f"```{marker}\nx = 1\n```\n")


def test_an_unknown_marker_or_another_name_for_python_is_rejected():
    with pytest.raises(ValueError, match="unknown block marker"):
        plan(SAMPLE, '```python skpi="typo"\nx = 1\n```\n')
    with pytest.raises(ValueError, match="write ```python"):
        plan(SAMPLE, "```py\nx = 1\n```\n")


def test_blocks_share_a_namespace_and_outputs_are_checked():
    text = "```python\nx = 6\n```\n\n```python\nprint(x * 7)\n```\n```output\n42\n```\n"
    steps, _ = plan(SAMPLE, text)
    assert [s.expected_output for s in steps] == [None, "42\n"]
    run_steps(steps)
    wrong, _ = plan(SAMPLE, text.replace("42", "41"))
    with pytest.raises(AssertionError, match="printed"):
        run_steps(wrong)


def test_a_failing_block_fails_and_a_skipped_one_does_not_run():
    steps, _ = plan(SAMPLE, '```python skip="demo"\nraise SystemExit\n```\n```python\n1 / 0\n```\n')
    assert len(steps) == 1
    with pytest.raises(ZeroDivisionError):
        run_steps(steps)


def test_excerpts_must_match_their_file():
    good = '```python excerpt="levels/common/checks.py"\ndef causal_offset(T: int, S: int) -> int:\n```\n'
    bad = good.replace("S: int", "S: float")
    _, [block] = plan(SAMPLE, good)
    assert excerpt_problems(block) == []
    _, [block] = plan(SAMPLE, bad)
    assert excerpt_problems(block)


def test_stale_generated_blocks_are_detected():
    records = [
        {"level": "a", "scenario": "s", "device": "cpu", "dtype": "float32", "status": "ok",
         "shape": {"T": 8, "B": 1}, "median_s": 0.002},
    ]  # fmt: skip
    fresh = regenerate('<!-- generated: bench scenario="s" -->\n<!-- end generated -->', records)
    assert "| a | 2 |" in fresh
    records[0]["median_s"] = 0.003
    assert regenerate(fresh, records) != fresh


# ----------------------------------------------------------------------------- ladder show


def _imported(level: str, src):
    """The live object a ``levels.show.Source`` names, or None when its level cannot load here."""
    import importlib

    import levels

    try:
        levels.load(level)
    except levels.LevelUnavailable:
        return None
    obj = importlib.import_module("levels." + src.file.removesuffix(".py").replace("/", "."))
    for part in src.qualname.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "fn", obj)  # a @triton.jit kernel keeps its Python function in .fn


def test_show_reads_the_same_source_as_inspect():
    """``ladder show`` reads files with ast; what it prints is what Python would import."""
    import inspect

    from levels.show import PIECES, Reuse, source_of

    for piece, entries in PIECES.items():
        for level, entry in entries.items():
            if isinstance(entry, Reuse):
                assert not isinstance(PIECES[piece][entry.level], Reuse), (piece, level)
                continue
            for src in entry:
                text, _ = source_of(src)
                live = _imported(level, src)
                if live is not None:
                    assert text == textwrap.dedent(inspect.getsource(live)).rstrip("\n"), src


def test_ladder_show_prints_every_rung_in_order(capsys):
    import levels
    from benchmarks.cli import main

    assert main(["show", "attention", "--plain"]) == 0
    out = capsys.readouterr().out
    headings = [line for line in out.splitlines() if line.startswith("# ")]
    assert [h.split(":")[0][2:] for h in headings[::1]] == [
        name
        for name in levels.LEVELS
        for _ in range(2 if name.startswith(("level3", "level4")) else 1)
    ]
    assert "def attention(" in out and "scaled_dot_product_attention" in out
    assert "tl.math.exp2" in out  # level 4's kernel, shown without importing triton


def test_ladder_show_overview_and_level_choice(capsys):
    import levels
    from benchmarks.cli import main

    assert main(["show", "--plain"]) == 0
    out = capsys.readouterr().out
    for name in levels.LEVELS:
        assert f"chapter: docs/{name}.md" in out
    assert main(["show", "kv_cache", "--levels", "1,3", "--plain"]) == 0
    out = capsys.readouterr().out
    assert "reuses level0_loops's code" in out and "class StaticKVCache" in out
    assert "level2_torch_manual" not in out
    with pytest.raises(SystemExit):
        main(["show", "attention", "--levels", "7"])


# ----------------------------------------------------------------------------- rewriting


def main(argv: list[str]) -> int:
    """``python tests/test_docs.py [FILE.md ...]``: rewrite the generated blocks of the given
    doc files (default: all of them) and redraw the plot, from the committed benchmark JSON."""
    from benchmarks import plot

    if BENCH_PLOT_SOURCE.is_file() and BENCH_PLOT_SOURCE.read_text().strip() == _json_digest():
        print(f"{_id(BENCH_PLOT)} is current")
    else:
        plot.main([str(BENCH_JSON), str(BENCH_PLOT)])
        BENCH_PLOT_SOURCE.write_text(_json_digest() + "\n")
        print(f"redrew {_id(BENCH_PLOT)}")
    records = load_records()
    for path in [Path(a).resolve() for a in argv] or DOC_FILES:
        if not path.is_file():
            continue
        text = path.read_text()
        new = regenerate(text, records)
        if new != text:
            path.write_text(new)
            print(f"rewrote {_id(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
