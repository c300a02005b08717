"""The course's code fits its page: every line of a fenced block is at most ``WIDTH`` characters.

The site's content column holds ``WIDTH`` characters of its monospace font at 1280 px
(``docs/assets/site.css``; ``tests/test_site.py`` counts, in Chromium, the blocks that
scroll sideways all the same), and ``WIDTH`` is the source's line length too (ruff's, in
``pyproject.toml``), so an excerpt of the source fits as the source writes it. A block may
be wider in two ways, each saying why where it is:

* marked ```` ```text wrap="why" ```` (a server's stream or log, whose lines are as long as
  the server made them): the site wraps its long lines (``docs/tools/site_hooks.py``);
  never a ``python`` block, whose lines must read as code;
* listed in ``MUST_SCROLL`` below, by its page and first line, with the reason.
"""

from __future__ import annotations

import re

import pytest
from markdown_blocks import ROOT, blocks

WIDTH = 100  # characters: the column's, at 1280 px, and ruff's line length
PAGES = sorted((ROOT / "docs").glob("*.md"))

# (page, the block's first line): why the block keeps lines over WIDTH and scrolls. None
# must now: the course's code and outputs are written to fit, and a server's transcript wraps.
MUST_SCROLL: dict[tuple[str, str], str] = {}


def _wide(block) -> list[str]:
    return [line for line in block.text.splitlines() if len(line) > WIDTH]


def test_the_docs_width_is_the_sources_line_length():
    ruff = re.search(
        r"^\[tool\.ruff\]\nline-length = (\d+)$", (ROOT / "pyproject.toml").read_text(), re.M
    )
    assert ruff is not None and int(ruff[1]) == WIDTH


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_line_of_code_fits_the_column(page):
    too_wide, scrolling = [], {}
    for block in blocks(page):
        first = block.text.splitlines()[0] if block.text.strip() else ""
        if (page.name, first) in MUST_SCROLL:
            scrolling[page.name, first] = bool(_wide(block))
        elif not block.attrs.get("wrap", "").strip():
            too_wide += [f"{block.where}: {len(line)} > {WIDTH}: {line}" for line in _wide(block)]
    assert not too_wide, (
        "lines wider than the site's column (rewrap them, or mark a server's output "
        '```text wrap="why"):\n' + "\n".join(too_wide)
    )
    for key, why in MUST_SCROLL.items():
        if key[0] == page.name:
            assert why.strip(), f"{key}: say why it must scroll"
            assert scrolling.get(key), f"{key}: gone, or it fits now; take it off MUST_SCROLL"


def test_a_wrapped_block_says_why_and_is_no_code():
    marked = [b for page in PAGES for b in blocks(page) if "wrap" in b.attrs or "wrap" in b.flags]
    assert marked, "no block is marked wrap: drop the rule or this test"
    for block in marked:
        assert block.attrs.get("wrap", "").strip(), f'{block.where}: write wrap="why"'
        assert block.lang != "python", f"{block.where}: python code fits the column, never wraps"
        assert _wide(block), f"{block.where}: every line fits; the wrap marker can go"
