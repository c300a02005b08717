"""How long the course takes to read, page by page, in the order of the site's navigation.

    python docs/tools/course_length.py             # the table, in Markdown
    python docs/tools/course_length.py --budget 3  # and fail unless the path to the first
                                                   # Triton kernel takes at most 3 hours

The measure: prose at 180 words a minute, plus 9 seconds for every line of code or of
printed output (a fenced block's non-blank lines, and a formula's: ``$$`` or indented), which a
reader reads more slowly than prose and often runs. Prose is what a reader reads of the
Markdown: headings, paragraphs, list items and table cells, with link targets, HTML tags
and comments, and images' file names left out (an image's description is not counted:
the picture is looked at, not read).

The order is ``mkdocs.yml``'s ``nav``, the course as the site shows it. *The path to the
first Triton kernel* is everything a reader meets in that order up to and including the
first block that quotes the body of a ``@triton.jit`` kernel (an excerpt of a file of
level 4 that uses ``tl.``): the part of the course a reader must get through before
level 4 begins to pay off. A workshop in that order (``BESIDE_THE_PATH``: a page where
the reader writes the code, at any point after the chapter it follows) is read at the
reader's pace and left out of the path; its row still gives its reading time.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
WORDS_PER_MINUTE = 180
SECONDS_PER_LINE = 9

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
# Workshops: the reader writes the rung they walk through, stage by stage, in hours of
# their own, whenever they choose after level 0.
BESIDE_THE_PATH = {"your_rung.md"}
KERNEL_EXCERPT = re.compile(r'excerpt="levels/level4_triton_kernel/[^"]+"')


@dataclass(frozen=True)
class Length:
    """What a reader reads of a page (or part of one)."""

    words: int  # of prose
    lines: int  # of code and output

    @property
    def minutes(self) -> float:
        return self.words / WORDS_PER_MINUTE + self.lines * SECONDS_PER_LINE / 60

    def __add__(self, other: Length) -> Length:
        return Length(self.words + other.words, self.lines + other.lines)


def prose_words(line: str) -> int:
    """The words a reader reads in one line of Markdown prose."""
    line = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", line)  # an image: looked at
    line = re.sub(r"\]\([^)]*\)", "]", line)  # a link's target
    line = re.sub(r"<[^>]+>", " ", line)  # HTML tags (<details>, <summary>)
    line = re.sub(r"^\s*(#+|[-*]|\d+\.|>)\s", " ", line)  # heading and list markers
    return len(re.findall(r"[\w`'’.,;:()=+\-*/·×≤≥→\[\]]*\w[\w`'’.,;:()=+\-*/·×≤≥→\[\]]*", line))


def measure(text: str, *, stop_at_first_kernel: bool = False) -> tuple[Length, bool]:
    """The length of a page's text; with ``stop_at_first_kernel``, of its text up to and
    including the first block quoting a Triton kernel. The flag says whether one was found."""
    words = lines = 0
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    fence: str | None = None  # the fence of the block being read
    kernel = False  # that block quotes a Triton kernel
    blank_before = True  # the line before was blank
    in_list = in_indented = False  # inside a list item; inside an indented block (a formula)
    in_math = False  # inside a $$ ... $$ formula
    for line in text.splitlines():
        if line.strip() == "$$":
            in_math = not in_math
            continue
        if in_math:
            lines += 1  # a line of a formula reads as slowly as a line of code
            continue
        if fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) == {fence[0]}:
                fence = None
                if kernel and stop_at_first_kernel:
                    return Length(words, lines), True
            elif line.strip():
                lines += 1
            continue
        if not line.strip():
            blank_before = True
            continue
        opening = FENCE.match(line)
        if opening:
            fence, kernel = opening[1], bool(KERNEL_EXCERPT.search(opening[2]))
        elif line.startswith("    ") and (in_indented or (blank_before and not in_list)):
            in_indented = True  # Markdown's indented code block: here, always a formula
            lines += 1
        else:
            in_indented = False
            if re.match(r" {0,3}([-*]|\d+\.) ", line):
                in_list = True
            elif blank_before and not line.startswith(" "):
                in_list = False
            if not set(line.strip()) <= set("|-: "):  # a table's rule reads as nothing
                words += prose_words(line)
        blank_before = False
    return Length(words, lines), False


def nav_pages(config: Path = ROOT / "mkdocs.yml") -> list[Path]:
    """The pages of ``mkdocs.yml``'s ``nav``, in order."""
    import yaml  # PyYAML, which mkdocs reads its configuration with

    def walk(entries) -> list[str]:
        out = []
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            out += walk(value) if isinstance(value, list) else [value]
        return out

    return [DOCS / name for name in walk(yaml.safe_load(config.read_text())["nav"])]


@dataclass(frozen=True)
class Row:
    page: str
    length: Length
    to_kernel: Length | None  # the part of the page on the path to the first kernel


def rows(pages: list[Path]) -> list[Row]:
    out, on_path = [], True
    for page in pages:
        text = page.read_text()
        length, _ = measure(text)
        part = None
        if on_path and page.name not in BESIDE_THE_PATH:
            part, found = measure(text, stop_at_first_kernel=True)
            on_path = not found
        out.append(Row(page.name, length, part))
    return out


def hours(minutes: float) -> str:
    whole = round(minutes)  # to the minute first: 179.6 is 3 h 00, not 2 h 60
    return f"{whole // 60} h {whole % 60:02d}"


def table(pages: list[Path]) -> tuple[str, float, float]:
    """The Markdown table, the whole course's minutes, and the path's."""
    lines = [
        "| page | words of prose | lines of code and output | minutes | on the path to the first kernel |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    total = path = 0.0
    for row in rows(pages):
        total += row.length.minutes
        if row.to_kernel is not None:
            path += row.to_kernel.minutes
        upto = "" if row.to_kernel is None else f"{row.to_kernel.minutes:.0f}"
        lines.append(
            f"| {row.page} | {row.length.words:,} | {row.length.lines:,} "
            f"| {row.length.minutes:.0f} | {upto} |"
        )
    lines.append(f"| **the course** | | | {hours(total)} | {hours(path)} |")
    return "\n".join(lines), total, path


def main(argv: list[str]) -> int:
    text, _, path = table(nav_pages())
    print(text)
    if "--budget" in argv:
        budget = float(argv[argv.index("--budget") + 1])
        if path > budget * 60:
            print(f"the path to the first Triton kernel takes {hours(path)}, over {budget:g} h")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
