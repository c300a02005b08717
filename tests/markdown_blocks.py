"""Markdown code blocks as the docs tests run them: parsing, running, checking excerpts.

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

A page whose blocks need a level that may be missing on a machine (level 4
without triton) says so once, in a comment: ``<!-- needs: level4_triton_kernel -->``.
Where that level cannot load, the page's blocks are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from doc_tables import parse_info

ROOT = Path(__file__).resolve().parent.parent


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


NEEDS = re.compile(r"<!-- needs: (?P<levels>[\w, ]+) -->")


def needed_levels(path: Path) -> list[str]:
    """The levels a page's blocks need (its ``<!-- needs: ... -->`` comments)."""
    return [
        name.strip()
        for found in NEEDS.finditer(path.read_text())
        for name in found["levels"].split(",")
        if name.strip()
    ]
