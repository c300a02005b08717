"""mkdocs hooks for the course site (``mkdocs.yml``'s ``hooks``).

The pages are written for two readers at once, GitHub and the site, and for the docs
tests, which read the info strings of their fenced blocks (``tests/markdown_blocks.py``).
The site shows those markers rather than dropping them: a block that quotes the source
(```` ```python excerpt="levels/x.py" ````) is titled with the file it quotes, a block
that is not run (```` ```python skip="why" ````) says why, an ``output`` block is plain
text, and a block marked ```` ```text wrap="why" ```` (a server's stream or log, whose
lines are as long as the server made them) wraps its long lines instead of scrolling,
each continued line indented under its start.

Two changes to the built HTML, for the site's reader only: every figure is a link to
its full-size image (a figure is drawn at the column's width, which may shrink it), and
a word of inline code that holds a hyphen (``--weights``) is never broken across lines.
"""

from __future__ import annotations

import re
import shlex

FENCE = re.compile(r"^(?P<indent> {0,3}|\s*)(?P<fence>`{3,})(?P<info>[^`\n]*)$", re.M)
# An image, and the link around it if it has one already.
IMAGE = re.compile(r'(?P<link><a\b[^>]*>\s*)?(?P<img><img\b[^>]*\bsrc="(?P<src>[^"]+)"[^>]*>)')
# Inline code: a <code> of plain text that is not the body of a <pre> (whose <code> follows
# the highlighter's empty <span></span>, or <pre> itself).
INLINE_CODE = re.compile(r"(?<!<span></span>)(?<!<pre>)<code>(?P<text>[^<\n]*)</code>")
HYPHENATED = re.compile(r"\S*-\S*")
# The body of a block marked wrap (its highlighter's div has the class "wrap").
WRAPPED = re.compile(
    r'(?P<open><div class="language-\w+ wrap highlight">.*?<code>)(?P<body>.*?)</code>', re.S
)


def _info(info: str) -> tuple[str, dict[str, str]]:
    """```` python excerpt="x" ```` -> ``("python", {"excerpt": "x"})`` (as the docs tests
    read it: docs/tools/doc_tables.py's ``parse_info``, which this hook cannot import)."""
    words = shlex.split(info.strip()) or [""]
    return words[0], dict(w.split("=", 1) for w in words[1:] if "=" in w)


def _retitle(match: re.Match) -> str:
    lang, attrs = _info(match["info"])
    title = None
    if lang == "output":
        lang, title = "text", "output"
    elif "excerpt" in attrs:
        title = attrs["excerpt"]
    elif "skip" in attrs:
        title = "not run here: " + attrs["skip"].replace('"', "'")
    start = f"{match['indent']}{match['fence']}"
    titled = f' title="{title}"' if title is not None else ""
    if "wrap" in attrs:
        return f"{start}{{.{lang} .wrap{titled}}}"
    if title is None:
        return match.group(0)
    return f"{start}{lang}{titled}"


def _linked(match: re.Match) -> str:
    if match["link"]:
        return match.group(0)
    return f'<a class="figure-link" href="{match["src"]}">{match["img"]}</a>'


def _unbroken(match: re.Match) -> str:
    text = HYPHENATED.sub(lambda m: f'<span class="nobreak">{m.group(0)}</span>', match["text"])
    return f"<code>{text}</code>"


def _lines(match: re.Match) -> str:
    """A wrapped block's lines, each its own box, so that a long one wraps with a hanging
    indent (site.css) and reads as one line continued. Plain text only: a highlighter's
    span could cross a line's end."""
    body = match["body"]
    if "<" in body:
        return match.group(0)
    lines = "".join(f'<span class="line">{line}\n</span>' for line in body.splitlines())
    return f"{match['open']}{lines}</code>"


def on_page_markdown(markdown: str, **_) -> str:
    return FENCE.sub(_retitle, markdown)


def on_page_content(html: str, **_) -> str:
    return WRAPPED.sub(_lines, INLINE_CODE.sub(_unbroken, IMAGE.sub(_linked, html)))
