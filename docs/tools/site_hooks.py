"""mkdocs hooks for the course site (``mkdocs.yml``'s ``hooks``).

The pages are written for two readers at once, GitHub and the site, and for the docs
tests, which read the info strings of their fenced blocks (``tests/markdown_blocks.py``).
The site shows those markers rather than dropping them: a block that quotes the source
(```` ```python excerpt="levels/x.py" ````) is titled with the file it quotes, a block
that is not run (```` ```python skip="why" ````) says why, and an ``output`` block is
plain text. Nothing else of a page changes.
"""

from __future__ import annotations

import re
import shlex

FENCE = re.compile(r"^(?P<indent> {0,3}|\s*)(?P<fence>`{3,})(?P<info>[^`\n]*)$", re.M)


def _info(info: str) -> tuple[str, dict[str, str]]:
    """```` python excerpt="x" ```` -> ``("python", {"excerpt": "x"})`` (as the docs tests
    read it: docs/tools/doc_tables.py's ``parse_info``, which this hook cannot import)."""
    words = shlex.split(info.strip()) or [""]
    return words[0], dict(w.split("=", 1) for w in words[1:] if "=" in w)


def _retitle(match: re.Match) -> str:
    lang, attrs = _info(match["info"])
    if lang == "output":
        return f'{match["indent"]}{match["fence"]}text title="output"'
    if "excerpt" in attrs:
        return f'{match["indent"]}{match["fence"]}{lang} title="{attrs["excerpt"]}"'
    if "skip" in attrs:
        why = attrs["skip"].replace('"', "'")
        return f'{match["indent"]}{match["fence"]}{lang} title="not run here: {why}"'
    return match.group(0)


def on_page_markdown(markdown: str, **_) -> str:
    return FENCE.sub(_retitle, markdown)
