"""The course as a newcomer reads it: the drift a page accumulates while the code moves on.

``tests/test_docs.py`` runs every block and checks every quotation; this file checks
what sits around them and is easy to leave stale:

* each level chapter's file table names the files the chapter teaches, and the
  appendix's table the rest of the level's package: every file is in one of the two,
  none in both (and every file any table names exists);
* every count of ``Kernels`` fields, hooks or pieces written in words is one of
  ``CLAIMS``, and equals what the code says;
* every relative link of ``docs/*.md`` and ``README.md`` reaches a file, and a
  heading of it when the link names one (``PENDING`` lists pages announced but not yet
  written);
* the reading path of ``docs/index.md`` reaches every chapter;
* each chapter of ``EXERCISES`` has three or four exercises, each naming a command
  or a block to run, every test file it names exists, and its answers' anchor in
  ``docs/solutions.md`` exists;
* the rendered figures (``docs/tools/figures.py``) were drawn from the committed data
  and drawing code, the induction-head data came from the lab's current defaults, and
  the explanatory figures' data is what the library computes now;
* the real-model tables of docs/decoding.md and docs/benchmarks.md are the committed
  benchmark run, cell for cell.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
from figures import FIGURES, INDUCTION_LEVEL, TEXT_COMMAND, TEXT_LEVEL, TRAIN_COMMAND
from markdown_blocks import ROOT

import levels

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
NUMBERS = {
    w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())
}
# Pages the course links to that another change is writing (the link must not break the
# docs tests meanwhile). None now.
PENDING: set[Path] = set()
# Pages of the docs folder that are not chapters of the path.
NOT_IN_PATH = {"index.md"}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _text(path: Path) -> str:
    """A page's prose with its fenced blocks removed and its lines joined per paragraph."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return re.sub(r"\s*\n\s*(?=\S)", " ", "\n".join(lines))


# ----------------------------------------------------------------------------- file tables


def _table_files(path: Path) -> list[tuple[str, str]]:
    """``(row, file)`` for every backticked ``*.py`` in the first column of a ``| file |``
    table; a bare name is in the folder of the row's previous full path."""
    found, in_table = [], False
    for line in path.read_text().splitlines():
        cells = (
            [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        )
        if cells and cells[0] == "file":
            in_table = True
            continue
        if not cells:
            in_table = False
        if in_table and not set(cells[0]) <= {"-", " ", ":"}:
            folder = None
            for name in re.findall(r"`([^`]+\.py)`", cells[0]):
                if "/" in name:
                    folder = str(Path(name).parent)
                    found.append((line, name))
                elif folder is not None:
                    found.append((line, f"{folder}/{name}"))
    return found


@pytest.mark.parametrize("path", [p for p in PAGES if _table_files(p)], ids=_rel)
def test_every_file_a_table_names_exists(path):
    missing = [name for _, name in _table_files(path) if not (ROOT / name).is_file()]
    assert not missing, f"{_rel(path)}'s file table names files that do not exist: {missing}"


@pytest.mark.parametrize("name", levels.LEVELS)
def test_each_level_file_is_in_its_chapter_or_the_appendix(name):
    """A file added to a rung's package is a row of its chapter's table, if the chapter
    teaches it, or of the appendix's table of the files the chapters leave out; never of
    both (``__init__.py`` aside)."""
    taught = {f for _, f in _table_files(DOCS / f"{name}.md")}
    left_out = {f for _, f in _table_files(DOCS / "appendix.md")}
    package = {_rel(p) for p in (ROOT / "levels" / name).glob("*.py") if p.name != "__init__.py"}
    assert package <= taught | left_out, (
        f"docs/{name}.md's file table, or the appendix's, leaves out "
        f"{sorted(package - taught - left_out)}: add a row per file"
    )
    assert not taught & left_out, f"listed as taught and as left out: {sorted(taught & left_out)}"


# ----------------------------------------------------------------------------- counts in words


def _kernels():
    L2 = levels.load("level2_torch_manual")
    return L2, [f.name for f in dataclasses.fields(L2.Kernels)]


def _replaced(level_name: str) -> int:
    """How many of level 2's ``Kernels`` fields a level sets to code of its own (a subclass
    that only renames level 2's class, with no method of its own, does not count)."""
    L2, names = _kernels()
    mine = levels.load(level_name).KERNELS

    def own(value, base) -> bool:
        if value is base:
            return False
        if isinstance(value, type) and issubclass(value, base):
            return any(callable(v) for k, v in vars(value).items() if not k.startswith("__"))
        return True

    return sum(own(getattr(mine, n), getattr(L2.LEVEL2_KERNELS, n)) for n in names)


def _fields() -> int:
    return len(_kernels()[1])


# (file, a pattern whose groups are number words, what each group must equal)
CLAIMS = [
    (
        "docs/level2_torch_manual.md",
        r"read from the (\w+) fields of one record",
        lambda: [_fields()],
    ),
    (
        "docs/level3_sdpa_flash.md",
        r"Of the (\w+) fields of level 2's `Kernels`, level 3 replaces (\w+)",
        lambda: [_fields(), _replaced("level3_sdpa_flash")],
    ),
    (
        "docs/appendix.md",
        r"with (\w+) of the (\w+) fields of its `Kernels`\s+replaced",
        lambda: [_replaced("level4_triton_kernel"), _fields()],
    ),
    (
        "levels/level2_torch_manual/__init__.py",
        r"``Kernels`` \(``kernels.py``\), with (\w+) fields",
        lambda: [_fields()],
    ),
]
COUNTED = re.compile(
    r"\b(" + "|".join(NUMBERS) + r")\b(?: [\w`']+){0,3} (?:hooks?|fields|pieces)\b", re.I
)


@pytest.mark.parametrize("file,pattern,truth", CLAIMS, ids=[c[0] for c in CLAIMS])
def test_counts_written_in_words_match_the_code(file, pattern, truth):
    path = ROOT / file
    if file.endswith("appendix.md"):  # its count is level 4's, which needs triton
        try:
            levels.load("level4_triton_kernel")
        except levels.LevelUnavailable as exc:
            pytest.skip(str(exc))
    text = _text(path) if path.suffix == ".md" else re.sub(r"\s+", " ", path.read_text())
    found = re.search(pattern, text)
    assert found, f"{file} no longer says {pattern!r}: update the sentence and this claim together"
    said = [NUMBERS[g.lower()] for g in found.groups()]
    assert said == truth(), f"{file}: {found.group(0)!r} says {said}, the code says {truth()}"


@pytest.mark.parametrize("path", PAGES, ids=_rel)
def test_every_count_of_fields_hooks_or_pieces_is_a_checked_claim(path):
    """A new sentence that counts them ("the three hooks") must be registered in CLAIMS."""
    text = _text(path)
    claimed = [re.search(p, text) for f, p, _ in CLAIMS if ROOT / f == path]
    spans = [m.span() for m in claimed if m]
    spans += [m.span() for m in re.finditer(r"`[^`]*`", text)]  # a quotation in code counts nothing
    loose = [
        m.group(0)
        for m in COUNTED.finditer(text)
        if not any(a <= m.start() < b or a < m.end() <= b for a, b in spans)
    ]
    assert not loose, f"{_rel(path)} counts in words what no test checks: {loose}; add a CLAIM"


# ----------------------------------------------------------------------------- links and the path

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    fenced, found = False, set()
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(_slug(line.lstrip("#")))
    return found


@pytest.mark.parametrize("path", PAGES, ids=_rel)
def test_relative_links_reach_a_file_and_a_heading(path):
    broken = []
    for target in LINK.findall(re.sub(r"`[^`]*`", "", _text(path))):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if dest in PENDING:
            continue
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{_rel(path)} links to what does not exist: {broken}"


def test_the_reading_path_reaches_every_chapter():
    linked = {
        (DOCS / t.partition("#")[0]).resolve() for t in LINK.findall(_text(DOCS / "index.md"))
    }
    chapters = {p.resolve() for p in DOCS.glob("*.md") if p.name not in NOT_IN_PATH}
    assert chapters <= linked, (
        f"docs/index.md does not lead to {sorted(p.name for p in chapters - linked)}"
    )
    assert PENDING <= linked | {p for p in PENDING if not p.exists()}


# ----------------------------------------------------------------------------- exercises

EXERCISES = [
    "prelude.md", "level0_loops.md", "level1_numpy.md", "level2_torch_manual.md",
    "level3_sdpa_flash.md", "text_model.md", "level4_triton_kernel.md", "level4_part2.md",
    "speculative.md", "serving.md", "training.md", "beyond_one_device.md",
]  # fmt: skip


def _exercises(path: Path) -> tuple[str, list[str]]:
    text = path.read_text()
    assert "\n## Exercises\n" in text, f"{_rel(path)} has no '## Exercises' section"
    section = text.split("\n## Exercises\n", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"\n(?=\d+\. )", "\n" + section)
    return section, [i for i in items if re.match(r"\d+\. ", i)]


@pytest.mark.parametrize("name", EXERCISES)
def test_each_chapter_has_three_or_four_exercises_that_say_what_to_run(name):
    section, items = _exercises(DOCS / name)
    assert 3 <= len(items) <= 4, f"docs/{name}: {len(items)} exercises"
    for item in items:
        assert "<details>" in item and "</details>" in item, f"docs/{name}: an answer is not folded"
        runs = re.search(r"`(python -m pytest|ladder|python)[^`]*`|block", item)
        assert runs, f"docs/{name}: an exercise names nothing to run:\n{item[:200]}"
        for test_file in re.findall(r"tests/[\w/]+\.py", item):
            assert (ROOT / test_file).is_file(), (
                f"docs/{name} names {test_file}, which does not exist"
            )
    links = re.findall(r"(solutions\w*\.md)#([\w-]+)", section)
    assert links, f"docs/{name}'s exercises do not point to their solutions"
    for page, anchor in links:
        assert anchor in _anchors(DOCS / page), (
            f"docs/{name} links to {page}#{anchor}: no such heading"
        )


@pytest.mark.parametrize("name", EXERCISES)
def test_the_keywords_of_an_exercise_select_tests(name):
    """``-k "a and b"`` in an exercise must select something in the files it names."""
    for item in _exercises(DOCS / name)[1]:
        for files, expr in re.findall(r"pytest\s+((?:tests/\S+\.py\s*)+)-k\s+\"?([\w ]+)", item):
            sources = " ".join((ROOT / f).read_text() for f in files.split())
            tests = re.findall(r"def (test_\w+)", sources)
            words = [w for w in expr.split() if w not in ("and", "or", "not")]
            positive = [w for w in words if not re.search(rf"not {w}\b", expr)]
            level_words = [w for w in positive if w.startswith("level")]
            names = [w for w in positive if w not in level_words]
            assert all(any(w in t for t in tests) for w in names), (
                f"docs/{name}: -k {expr!r} selects no test of {files}"
            )


# ----------------------------------------------------------------------------- figures


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: f.png.name)
def test_rendered_figures_were_drawn_from_the_committed_data(figure):
    assert figure.png.is_file(), (
        f"{_rel(figure.png)} is missing: run `python docs/tools/figures.py`"
    )
    assert figure.current(), (
        f"{_rel(figure.png)} was drawn from other data or by other code than "
        f"{_rel(figure.data)} and docs/tools/figures.py hold now: run `python docs/tools/figures.py`"
    )


def _agree(a, b, where="") -> list[str]:
    """Where two parsed JSON values differ: structure and ints exactly, floats to 1e-4
    (the recorded numbers are rounded to six digits; level 4's come from float32 kernels)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a)} != {sorted(b)}"]
        return [d for key in a for d in _agree(a[key], b[key], f"{where}.{key}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)}"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _agree(x, y, f"{where}[{i}]")
        ]
    if isinstance(a, float) or isinstance(b, float):
        same = a == b or abs(a - b) <= 1e-4 * max(1.0, abs(a), abs(b))
        return [] if same else [f"{where}: {a} != {b}"]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


@pytest.mark.parametrize("figure", [f for f in FIGURES if f.record], ids=lambda f: f.png.name)
def test_the_explanatory_figures_show_what_the_code_computes_now(figure, tmp_path):
    """Record the figure's data again (seconds: tiny cases, level 4 in the interpreter) and
    compare it with the committed file the PNG was drawn from."""
    again = tmp_path / figure.data.name
    try:
        figure.record(again)
    except levels.LevelUnavailable as exc:
        pytest.skip(str(exc))
    differ = _agree(json.loads(again.read_text()), json.loads(figure.data.read_text()))
    assert not differ, (
        f"{_rel(figure.data)} is not what the code computes now ({differ[:3]}): run "
        "`python docs/tools/figures.py --record`"
    )


def test_the_decoding_pages_quote_the_committed_real_model_run():
    """Every tokens/s, GB/s, share and error docs/decoding.md (and, for the weight formats,
    docs/benchmarks.md) tabulates for the real model is docs/tools/decode_tables.py's
    rendering of docs/data/real_model_cpu.json, the run the roofline figure is drawn from."""
    from decode_tables import DATA, tables

    pages = {"rungs": "decoding.md", "prompt": "decoding.md", "formats": "benchmarks.md"}
    rendered = tables(DATA)
    assert set(rendered) == set(pages)
    for name, table in rendered.items():
        assert table in (DOCS / pages[name]).read_text(), (
            f"docs/{pages[name]} does not hold the {name} table of {_rel(DATA)} as rendered: "
            f"paste it from `python docs/tools/decode_tables.py`\n{table}"
        )


def test_the_serving_page_quotes_a_whole_checked_run_of_the_serve_bench():
    """docs/data/serve_cpu.json, which docs/serving.md reads, is one run of ``ladder bench
    --scenario serve``: every scenario of benchmarks/serve.py is in it, on one machine and
    date, and every timed answer matched the same request asked alone (a record whose
    answers differed is ``wrong``, not ``ok``), every arrival answered."""
    from benchmarks.records import OK, read_json

    run = read_json(DOCS / "data" / "serve_cpu.json")
    scenarios = {r.scenario for r in run}
    assert {"serve", "serve step", "serve index", "serve mask", "serve constrained",
            "serve arrivals", "serve prefix"} <= scenarios  # fmt: skip
    assert len({(r.machine, r.date) for r in run}) == 1, "records of more than one run"
    checked = [r for r in run if r.scenario in ("serve", "serve constrained", "serve arrivals")]
    assert checked and all(r.status == OK and r.max_error == 0 for r in checked), [
        (r.scenario, r.level, r.status) for r in checked if r.status != OK
    ]
    servers = {(r.level, r.shape["clients"]) for r in run if r.scenario == "serve"}
    assert servers == {("ladder serve --max-batch 1 --compile", 1),
                       ("ladder serve --max-batch 8", 1), ("ladder serve --max-batch 8", 8)}  # fmt: skip


def test_the_induction_head_data_comes_from_the_lab_defaults():
    from lab.train import default_spec, spec_to_dict

    record = json.loads((ROOT / "docs/data/induction_head.json").read_text())
    assert record["made_by"] == TRAIN_COMMAND and record["level"] == INDUCTION_LEVEL
    assert record["spec"] == json.loads(json.dumps(spec_to_dict(default_spec("decoder_only")))), (
        f"the lab's defaults changed since the induction-head model was trained: run `{TRAIN_COMMAND}`"
    )
    for example in record["examples"]:
        T = len(example["tokens"])
        for layer in example["attention"]:
            for head in layer:
                assert len(head) == T and all(abs(sum(row) - 1) < 1e-3 for row in head)


def test_the_text_model_data_comes_from_the_lab_defaults():
    """docs/text_model.md quotes a recorded run: it must be a run of lab.text's defaults."""
    from lab.text import TextSpec, spec_dict

    record = json.loads((ROOT / "docs/data/text_model.json").read_text())
    assert record["made_by"] == TEXT_COMMAND and record["level"] == TEXT_LEVEL
    assert record["spec"] == spec_dict(TextSpec()), (
        f"lab.text's defaults changed since the model of real text was trained: run `{TEXT_COMMAND}`"
    )
    assert len(record["losses"]) == record["spec"]["steps"]


@pytest.mark.extended
def test_the_text_model_data_is_what_training_gives(tmp_path):
    """Retrain (a few minutes) and compare with the recorded run: the same tokenizer, the
    same first loss, and the held-out losses within 0.05 nats (one thread here sums in one
    order; another machine's order drifts a long run by rounding, not by more)."""
    from figures import train_text_model

    from lab.text import corpus, corpus_sha256

    committed = json.loads((ROOT / "docs/data/text_model.json").read_text())
    if corpus_sha256(corpus()) != committed["corpus"]["sha256"]:
        pytest.skip(
            f"this Python's help text is not the recorded run's (Python {committed['python']})"
        )
    train_text_model(tmp_path / "again.json")
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["tokenizer_sha256"] == committed["tokenizer_sha256"]
    assert abs(again["losses"][0] - committed["losses"][0]) < 1e-3
    for (step_a, a), (step_b, b) in zip(again["heldout"], committed["heldout"], strict=True):
        assert step_a == step_b and abs(a - b) < 0.05, (step_a, a, b)


@pytest.mark.extended
def test_the_induction_head_data_is_what_training_gives(tmp_path):
    """Retrain (about a minute) and compare with the committed attention."""
    from figures import train_induction

    train_induction(tmp_path / "again.json")
    again = json.loads((tmp_path / "again.json").read_text())
    committed = json.loads((ROOT / "docs/data/induction_head.json").read_text())
    for ea, eb in zip(again["examples"], committed["examples"], strict=True):
        assert ea["tokens"] == eb["tokens"]
        for a, b in zip(ea["attention"], eb["attention"], strict=True):
            for ha, hb in zip(a, b, strict=True):
                assert (
                    max(
                        abs(x - y)
                        for ra, rb in zip(ha, hb, strict=True)
                        for x, y in zip(ra, rb, strict=True)
                    )
                    < 1e-2
                )


# ----------------------------------------------------------------------------- reading.py --trace


def test_a_decode_step_reads_through_the_plain_model():
    """What a reader follows, held where the model is plain (docs/tools/reading.py): one
    decode step of a 2-layer decoder at levels 2 and 3 enters at most 45 functions in at most
    6 files, at most 6 of them before ``Transformer.forward`` at level 2, and one more at
    level 3: its ``transformer``, the method that chooses the compiled step where one runs
    the pass; one forward and one decode step at levels 0, 2 and 3 are at least 70% the
    transformer's own lines."""
    import reading

    for level, before in (("level2_torch_manual", 6), ("level3_sdpa_flash", 7)):
        entered = reading.hops(level)
        names = [name for _, name, _ in entered]
        assert len(entered) <= 45 and len({f for f, _, _ in entered}) <= 6, entered
        assert names.index("Transformer.forward") <= before, names
    for level in ("level0_loops", "level2_torch_manual", "level3_sdpa_flash"):
        lines = defaultdict(int)
        for (_, _, first, last), kind in reading.trace(level).items():
            lines[kind] += last - first + 1
        assert lines["transformer"] >= 0.7 * sum(lines.values()), (level, dict(lines))


def test_the_reading_trace_sorts_functions_by_what_they_do():
    """docs/tools/reading.py --trace: the rules on functions whose kind is not in doubt, and
    a traced rung whose parts add up, with every kind present and the core counted once."""
    import reading

    assert reading.kind_of("common/checks.py", "checked_ids") == "checks"
    assert reading.kind_of("common/semantics.py", "key_range") == "transformer"  # the rule
    assert reading.kind_of("common/checks.py", "attention_dims") == "checks"
    assert reading.kind_of("common/boundary.py", "plan") == "bookkeeping"
    assert reading.kind_of("common/boundary.py", "rows") == "checks"
    assert reading.kind_of("level2_torch_manual/arrays.py", "fetch") == "loading"
    assert reading.kind_of("level2_torch_manual/attention.py", "attention") == "transformer"
    assert reading.kind_of("level2_torch_manual/arrays.py", "last_position") == "bookkeeping"
    assert reading.kind_of("level1_numpy/ops.py", "zero_padded") == "bookkeeping"
    assert reading.kind_of("common/boundary.py", "_ids") == "checks"
    assert reading.kind_of("common/public.py", "ids_of") == "checks"
    assert reading.kind_of("common/public.py", "check_room") == "checks"
    assert reading.kind_of("common/public.py", "positions_of") == "bookkeeping"
    assert reading.kind_of("common/public.py", "decode_step") == "bookkeeping"
    assert reading.kind_of("level2_torch_manual/models.py", "next_positions") == "bookkeeping"
    assert reading.kind_of("common/semantics.py", "visible") == "transformer"  # the rule
    assert (
        reading.kind_of("level2_torch_manual/models.py", "extend") == "transformer"
    )  # keys' positions
    # A level-0 layer's __call__ is its forward; a model's hands over to its forward.
    assert reading.kind_of("level0_loops/layers.py", "__call__") == "transformer"
    assert reading.kind_of("level0_loops/models.py", "__call__") == "bookkeeping"
    assert reading.kind_of("level1_numpy/ops.py", "linear") == "transformer"  # x @ W^T + b
    assert reading.kind_of("level2_torch_manual/arrays.py", "linear") == "loading"  # nn.Linear
    # Until 2026-12-06 the edge ran a planned pass and committed the cache; level 3's picks
    # the compiled step (``_compiled_or_plain`` now).
    assert reading.kind_of("common/boundary.py", "_decoder") == "bookkeeping"
    assert reading.kind_of("level3_sdpa_flash/models.py", "_decoder") == "bookkeeping"
    assert reading.kind_of("level3_sdpa_flash/models.py", "_compiled_or_plain") == "bookkeeping"
    assert reading.kind_of("level2_torch_manual/models.py", "compute") == "transformer"
    assert reading.kind_of("level0_loops/models.py", "compute") == "transformer"
    assert reading.kind_of("level0_loops/models.py", "_decoder") == "transformer"  # seq2seq's
    counted = reading.trace("level1_numpy")
    # A forward and a decode step load nothing; building the model does.
    assert set(counted.values()) == set(reading.KINDS) - {"loading"}
    assert "loading" in set(reading.trace("level1_numpy", build=True).values())
    names = {(file, name) for file, name, *_ in counted}
    # The layers attend on checked inputs: the checked entry point is not on the model's path.
    assert ("level1_numpy/ops.py", "attend") in names
    assert ("level1_numpy/ops.py", "attention") not in names
    assert ("level1_numpy/ops.py", "check_attention") not in names
    at_level_2 = {name for file, name, *_ in reading.trace("level2_torch_manual")}
    assert "attend" in at_level_2 and not {"attention", "check_attention"} & at_level_2
    assert ("common/public.py", "decode_step") in names  # the decode step was traced
    assert all(first <= last for _, _, first, last in counted)
    spans = sorted((f, a, b) for f, _, a, b in counted)
    assert all(not (f == g and c <= b) for (f, a, b), (g, c, d) in itertools.pairwise(spans))
    table = reading.trace_table(["level1_numpy"])
    _, files, _, total, *kinds = re.findall(r"\| (\d+)", table[2])
    assert int(files) == len({f for f, *_ in spans})
    assert int(total) == sum(int(k) for k in kinds) == sum(b - a + 1 for _, a, b in spans)
    # The build adds the parameters' loading and checks, and the constructors.
    built = reading.trace("level1_numpy", build=True)
    assert set(counted) < set(built)
    assert ("common/params.py", "check_params") in {(f, n) for f, n, *_ in built - counted.keys()}


# The architecture options of the families (docs/conventions.md, "Architecture options"),
# by the config attribute a piece reads to apply each.
FAMILY_OPTIONS = {
    "n_kv_heads": "kv_heads",
    "norm": "norm",
    "ffn": "ffn",
    "scale_embeddings": "embedding_scale",
    "tie_embeddings": "tie_embeddings",
    "qkv_bias": "has_qkv_bias",
    "out_bias": "has_out_bias",
    "attn_scale": "attn_scale",
    "qk_norm": "qk_norm",
    "post_norms": "post_norms",
    "norm_weight_offset": "norm_weight_offset",
    "window_pattern": "layer_windows",
    "rope_local_base": "rope_base_of",
}
RUNGS = {  # the files a reader reads for a rung's model (levels 1, 3 and 4 reuse these)
    "level0_loops": ("layers.py", "models.py"),
    "level2_torch_manual": ("models.py", "kernels.py"),
}


def _option_reads(path: Path):
    """``(function name, option, the function's code without its docstring)`` for every
    function of ``path`` that reads a family option off the config."""
    import ast

    text = path.read_text()
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.FunctionDef):
            continue
        first = node.body[0]
        doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        code = "\n".join(lines[(first.end_lineno if doc else node.lineno) : node.end_lineno])
        for option, attribute in FAMILY_OPTIONS.items():
            if re.search(rf"\b(config|c)\.{attribute}\b", code):
                yield node.name, option, code


@pytest.mark.parametrize("rung", sorted(RUNGS))
def test_every_family_option_is_marked_where_it_plugs_in(rung):
    """A reader who skips the lines marked ``# option <name>`` reads the plain pre-norm block;
    so every function that reads a family option off the config says so, by name."""
    marked: set[str] = set()
    unmarked = []
    for file in RUNGS[rung]:
        path = ROOT / "levels" / rung / file
        marked |= set(_named(path.read_text()))
        for name, option, code in _option_reads(path):
            if option not in _named(code):
                unmarked.append(f"{file}:{name} reads {option} unmarked")
    assert not unmarked
    assert marked == set(FAMILY_OPTIONS), set(FAMILY_OPTIONS) ^ marked


def _named(code: str) -> list[str]:
    """The options the ``# option a, b: ...`` markers of ``code`` name."""
    return [o.strip() for m in re.findall(r"# option ([\w, ]+)", code) for o in m.split(",")]


def test_option_markers_name_config_fields():
    fields = {f.name for f in dataclasses.fields(levels.TransformerConfig)}
    for rung, files in RUNGS.items():
        for file in files:
            text = (ROOT / "levels" / rung / file).read_text()
            assert set(_named(text)) <= fields, (rung, file, set(_named(text)) - fields)
