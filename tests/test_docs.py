"""The documentation is executable: its code runs, its quotations and its figures are current.

The rules for code blocks are in ``tests/markdown_blocks.py`` (run, ``skip="why"``,
``excerpt="path"``, ``output`` blocks); the generated figures and their
renderers in ``docs/tools/doc_tables.py``. After a new benchmark run, rewrite the
figures with ``python docs/tools/doc_tables.py``.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from doc_tables import (
    BENCH_JSON,
    BENCH_PLOT,
    BENCH_PLOT_SOURCE,
    DOC_FILES,
    GENERATED,
    json_digest,
    load_records,
    regenerate,
)
from markdown_blocks import ROOT, excerpt_problems, needed_levels, plan, run_steps

# ----------------------------------------------------------------------------- the tests


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _files_with(predicate: Callable[[Path], bool]) -> list[Path]:
    """The doc files for which ``predicate`` holds (so no test is a vacuous pass)."""
    return [p for p in DOC_FILES if p.is_file() and predicate(p)]


@pytest.mark.parametrize("path", _files_with(lambda p: bool(plan(p)[0])), ids=_id)
def test_code_blocks_run(path):
    import levels

    for name in needed_levels(path):
        try:
            levels.load(name)
        except levels.LevelUnavailable as exc:
            pytest.skip(f"{_id(path)} runs {name}: {exc}")
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
        "run `python docs/tools/doc_tables.py` to rewrite it"
    )


def test_the_plot_is_drawn_from_the_committed_run():
    assert BENCH_PLOT.is_file(), (
        f"{_id(BENCH_PLOT)} is missing; run `python docs/tools/doc_tables.py`"
    )
    assert BENCH_PLOT_SOURCE.read_text().strip() == json_digest(), (
        f"{_id(BENCH_PLOT)} was drawn from another run; run `python docs/tools/doc_tables.py`"
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


def _promised() -> tuple[set[str], set[str]]:
    """The names ``levels/__init__.py``'s docstring promises on every level: the interface's
    (its first indented block) and the ``FACTS`` fields (its second)."""
    import levels

    blocks = re.findall(r"\n\n((?:    \S.*\n)+)", levels.__doc__ + "\n")
    interface = set(re.findall(r"\w+", blocks[0]))
    facts = {line.split()[0].removeprefix("FACTS.") for line in blocks[1].splitlines()}
    return interface, facts


def test_the_promised_names_are_on_every_level():
    """Every name the package docstring (and docs/conventions.md, "Levels") tells a reader to
    use is there, at every level: the interface, and each field of ``FACTS``."""
    import dataclasses

    import levels
    from levels.common.facts import Facts

    interface, facts = _promised()
    assert len(interface) >= 13 and "DecoderOnlyTransformer" in interface  # the parse worked
    assert facts == {f.name for f in dataclasses.fields(Facts)}
    conventions = (ROOT / "docs" / "conventions.md").read_text()
    assert all(f"`{name}`" in conventions for name in facts), "a FACTS field docs omit"
    for name, level in levels.available().items():
        if isinstance(level, str):
            continue  # unavailable here (triton missing): levels.available says why
        missing = sorted(n for n in interface | {"FACTS"} if not hasattr(level, n))
        assert not missing, f"{name} lacks {missing}"
        assert all(hasattr(level.FACTS, f) for f in facts)


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
    good = '```python excerpt="levels/common/semantics.py"\ndef causal_offset(T: int, S: int) -> int:\n```\n'
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
    """The live object a ``ladder.show.Source`` names, or None when its level cannot load here."""
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

    from ladder.show import PIECES, Reuse, source_of

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
    from ladder.cli import main

    assert main(["show", "attention", "--plain"]) == 0
    out = capsys.readouterr().out
    headings = [line for line in out.splitlines() if line.startswith("# ")]
    from ladder.show import PIECES

    # One heading per definition shown, level by level, lowest first.
    assert [h.split(":")[0][2:] for h in headings] == [
        name for name in levels.LEVELS for _ in PIECES["attention"][name]
    ]
    assert "def attend(" in out and "scaled_dot_product_attention" in out
    assert "tl.math.exp2" in out  # level 4's kernel, shown without importing triton


def test_ladder_show_overview_and_level_choice(capsys):
    import levels
    from ladder.cli import main

    assert main(["show", "--plain"]) == 0
    out = capsys.readouterr().out
    for name in levels.LEVELS:
        assert f"chapter: docs/{name}.md" in out
    assert main(["show", "kv_cache", "--levels", "1,3", "--plain"]) == 0
    out = capsys.readouterr().out
    assert "reuses level0_loops's code" in out and "class StaticKVCache" in out
    # Level 2 is not shown (its file may be named: level 3's static cache lives there).
    assert "# level2_torch_manual" not in out and "# level1_numpy" in out
    assert main(["show", "attention", "--levels", "7"]) == 2  # a usage error
