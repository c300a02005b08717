"""The course as a site: built strictly by ``ladder docs``, served, and read in a real browser.

The default run builds the site (``mkdocs build --strict``, seconds) and checks that the
strict build refuses a broken link and a missing image, and that ``ladder docs`` serves
what it built on the loopback address. The extended run opens every page of the
navigation in headless Chromium (``tests/browser.py``): no console error, every image
decoded with a size, every formula rendered by KaTeX, and the search finding "online
softmax"; it saves screenshots of three pages in ``out/site/`` for a person to look at.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from course_length import nav_pages
from markdown_blocks import ROOT

from ladder.cli import main
from ladder.docs import SiteHandler

SCREENSHOTS = ROOT / "out" / "site"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built by ``ladder docs --no-serve`` (strict)."""
    where = tmp_path_factory.mktemp("site")
    assert main(["docs", "--no-serve", "--site-dir", str(where)]) == 0
    return where


def test_every_page_of_the_navigation_is_built(site):
    pages = nav_pages()
    assert len(pages) == len(list((ROOT / "docs").glob("*.md")))  # every page is in the nav
    for page in pages:
        assert (site / page.with_suffix(".html").name).is_file(), page.name
    assert (site / "search" / "search_index.json").is_file()
    assert (site / "assets" / "katex" / "katex.min.js").is_file()


def test_the_hooks_link_the_figures_wrap_the_transcripts_and_keep_flags_whole(site):
    """docs/tools/site_hooks.py, in the built pages: every figure is a link to its own file,
    each block marked wrap="why" is a wrapping block of lines, and `--weights` is unbroken."""
    import re

    from markdown_blocks import blocks

    figures = wrapped = 0
    for html in site.glob("*.html"):
        text = html.read_text()
        for img in re.finditer(r'<img\b[^>]*\bsrc="([^"]+)"', text):
            link = text[: img.start()].rsplit("<a ", 1)[-1]
            assert link.startswith(f'class="figure-link" href="{img[1]}">'), (html.name, img[1])
            figures += 1
        wrapped += text.count('class="language-text wrap highlight"')
    marked = [b for page in (ROOT / "docs").glob("*.md") for b in blocks(page) if "wrap" in b.attrs]
    assert figures >= 10 and wrapped == len(marked) > 0, (figures, wrapped, len(marked))
    serving = (site / "serving_reference.html").read_text()  # the server's log and flags
    assert '<span class="line">19:45:40 127.0.0.1 GET /v1/nothing 404' in serving
    assert '<code><span class="nobreak">--weights</span></code>' in serving


def test_the_built_pages_fetch_nothing_from_outside(site):
    """Every script, style sheet, font and image the pages name is a file of the site."""
    import re

    for html in site.glob("*.html"):
        text = html.read_text()
        remote = re.findall(r'(?:src|href)="(https?://[^"]+)"', text)
        # Links a reader follows are fine; what a page loads by itself must be local.
        loaded = [u for u in remote if re.search(r"\.(js|css|woff2?|ttf|png|svg)(\?|$)", u)]
        assert not loaded, f"{html.name} loads {loaded}"


def test_the_strict_build_refuses_a_broken_link_and_a_missing_image(tmp_path):
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    page = docs / "appendix.md"
    page.write_text(
        page.read_text() + "\n[gone](no_such_page.md) and ![lost](img/no_such_figure.png)\n"
    )
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"),
         "-d", str(tmp_path / "site")],
        capture_output=True, text=True, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )  # fmt: skip
    assert run.returncode != 0
    assert "no_such_page.md" in run.stderr and "no_such_figure.png" in run.stderr, run.stderr


def test_ladder_docs_serves_the_site_on_loopback(tmp_path):
    """``ladder docs --port 0`` builds, prints its address, serves the pages (a missing one
    with the site's own 404 page, status 404), and stops on Ctrl-C as every command stops:
    one line, exit status 130."""
    process = subprocess.Popen(
        [sys.executable, "-m", "ladder", "docs", "--port", "0", "--site-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal starts it
    )  # fmt: skip
    try:
        line = process.stdout.readline()  # after the build: "the course: http://127.0.0.1:N/ ..."
        assert line.startswith("the course: http://127.0.0.1:"), (line, process.stderr.read())
        url = line.split()[2]
        with urllib.request.urlopen(url + "prelude.html", timeout=10) as response:
            assert response.status == 200 and b"Prelude" in response.read()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(url + "no_such_page.html", timeout=10)
        assert missing.value.code == 404
        page = missing.value.read()
        assert page == (tmp_path / "404.html").read_bytes() and b"The attention ladder" in page
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=20)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        f"ladder docs: interrupted; stopped serving the course on {url}"
    )


def test_ladder_docs_and_ladder_serve_listen_on_different_ports_by_default():
    from ladder.cli import build_parser

    parser = build_parser()
    docs, serve = parser.parse_args(["docs"]).port, parser.parse_args(["serve"]).port
    assert (docs, serve) == (8001, 8000)


def test_a_port_in_use_is_one_line_that_says_how_to_choose_another(capsys, tmp_path):
    """Before the build (seconds of it): a second server on a port that one holds."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["docs", "--port", str(port), "--site-dir", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"ladder docs: error: cannot serve on 127.0.0.1:{port} (Address already in use); "
        "--port N, or --port 0 for a free one"
    )
    assert list(tmp_path.iterdir()) == []  # nothing built


def test_ladder_docs_misuse_is_one_line(capsys):
    assert main(["docs", "--port", "70000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ladder docs: error: --port 70000: a port is at most 65535"]


# ----------------------------------------------------------------------------- in a browser


@pytest.fixture(scope="module")
def served(site):
    """The built site on a free loopback port, for the length of the module."""
    handler = functools.partial(SiteHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


# Every image of the page decoded, with its natural size: [src, width, height] each.
IMAGES = """Promise.all([...document.images].map(img => img.decode().then(
    () => [img.currentSrc, img.naturalWidth, img.naturalHeight],
    () => [img.currentSrc, 0, 0])))"""
# The page's formulas: how many, how many KaTeX rendered, how many it refused, and how many
# rendered with an empty box.
MATH = """(() => {
    const all = [...document.querySelectorAll('.arithmatex')];
    const done = all.filter(e => e.querySelector('.katex'));
    const empty = done.filter(e => e.getBoundingClientRect().width === 0);
    return [all.length, done.length, document.querySelectorAll('.katex-error').length,
            empty.length];
})()"""


@pytest.mark.extended
def test_every_page_loads_in_a_browser_with_its_images_and_math(served):
    from browser import Browser

    pages = [p.with_suffix(".html").name for p in nav_pages()]
    images = formulas = 0
    with Browser() as browser:
        for page in pages:
            before = len(browser.errors)
            browser.open(served + page)
            decoded = browser.evaluate(IMAGES)
            assert all(w > 0 and h > 0 for _, w, h in decoded), (page, decoded)
            images += len(decoded)
            found = browser.wait_for(f"(m => m[0] === m[1] ? m : null)({MATH})")
            assert found is not None, (page, browser.evaluate(MATH))
            assert found[2] == 0 and found[3] == 0, (page, found)
            formulas += found[0]
            assert browser.errors[before:] == [], (page, browser.errors[before:])
        # The checks saw something: the course has figures and formulas.
        assert images >= 10 and formulas >= 10, (images, formulas)


@pytest.mark.extended
def test_the_search_finds_online_softmax_and_three_pages_look_right(served):
    from browser import Browser

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with Browser(height=1100) as browser:
        browser.open(served + "index.html?q=online+softmax")
        results = browser.wait_for(
            "[...document.querySelectorAll('.md-search-result__item')]"
            ".map(e => [new URL(e.querySelector('a').href).pathname, e.innerText])"
        )
        assert results, "the search showed no result for 'online softmax'"
        hits = [href for href, text in results if "online softmax" in text.lower()]
        assert "/level4_triton_kernel.html" in hits, results
        browser.screenshot(SCREENSHOTS / "search.png")
        for page, name in (
            ("prelude.html", "prelude.png"),
            ("level4_triton_kernel.html#the-online-softmax-derived", "online_softmax.png"),
        ):
            browser.open(served + page)
            browser.wait_for(f"(m => m[0] === m[1])({MATH})")
            browser.evaluate("new Promise(done => setTimeout(done, 600))")  # the header's fade
            browser.screenshot(SCREENSHOTS / name)
        assert browser.errors == []


# ----------------------------------------------------------------------------- at 1280 px

MOST_WIDE_BLOCKS = 10  # code blocks that may scroll sideways at 1280 px, in the whole course
SMALLEST_TEXT_PX = 9.0  # a figure's smallest text, as the page draws it
# The width of the page's first code box, the width a line of WIDTH characters of its font
# takes there (with the box's padding), how many code blocks, and the first line of each
# one that scrolls sideways.
CODE = """(() => {
    const code = document.querySelector('.md-typeset pre > code');
    let line = null;
    if (code) {
        const probe = document.createElement('span');
        probe.textContent = '0'.repeat(%d);
        code.appendChild(probe);
        const style = getComputedStyle(code);
        line = probe.getBoundingClientRect().width
            + parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
        probe.remove();
    }
    const blocks = [...document.querySelectorAll('.md-typeset pre > code')];
    return {
        box: code ? code.clientWidth : null,
        line: line,
        blocks: blocks.length,
        wide: blocks.filter(c => c.scrollWidth > c.clientWidth)
                    .map(c => c.innerText.split('\\n')[0]),
    };
})()"""
# Every figure of the page: its file, its natural width, the width drawn, the link around it.
FIGURES = """[...document.querySelectorAll('.md-typeset img')].map(img => [
    img.getAttribute('src'), img.naturalWidth, img.getBoundingClientRect().width,
    img.closest('a') ? img.closest('a').getAttribute('href') : null])"""


@pytest.mark.extended
@pytest.mark.browser
def test_at_1280_px_the_code_fits_the_column(served):
    """The column holds a line of tests/test_docs_width.py's WIDTH characters, and at most
    MOST_WIDE_BLOCKS code blocks of the whole course scroll sideways (each listed)."""
    from browser import Browser
    from test_docs_width import WIDTH

    wide, narrow, blocks = [], [], 0
    with Browser(width=1280) as browser:
        for page in [p.with_suffix(".html").name for p in nav_pages()]:
            browser.open(served + page)
            seen = browser.evaluate(CODE % WIDTH)
            if seen["box"] is not None and seen["line"] > seen["box"]:
                narrow.append(f"{page}: {seen['box']} px, a line {seen['line']:.0f} px")
            blocks += seen["blocks"]
            wide += [f"{page}: {first}" for first in seen["wide"]]
    assert blocks > 300, blocks  # the course's blocks were all found
    assert len(wide) <= MOST_WIDE_BLOCKS, (
        f"{len(wide)} code blocks scroll sideways at 1280 px:\n" + "\n".join(wide)
    )
    assert not narrow, f"a code block holds less than {WIDTH} characters:\n" + "\n".join(narrow)


@pytest.mark.extended
@pytest.mark.browser
def test_at_1280_px_every_figure_is_readable_and_links_to_its_full_size(served):
    """Each figure's smallest text (docs/tools/figures.py's ``smallest_text``: the figure
    drawn again, its font sizes read as drawn) times the scale the page draws it at is at
    least SMALLEST_TEXT_PX; each figure is a link to its own PNG."""
    from browser import Browser
    from figures import every_figure, smallest_text

    drawn: dict[str, tuple[int, float]] = {}  # name -> (natural width, narrowest drawn width)
    with Browser(width=1280) as browser:
        for page in [p.with_suffix(".html").name for p in nav_pages()]:
            browser.open(served + page)
            browser.evaluate("Promise.all([...document.images].map(img => img.decode()))")
            for src, natural, width, href in browser.evaluate(FIGURES):
                assert href == src, f"{page}: {src} links to {href}, not to itself"
                name = src.removeprefix("img/")
                drawn[name] = (natural, min(width, drawn.get(name, (0, width))[1]))
    drawers = every_figure()
    assert set(drawn) == set(drawers), "a figure of the pages is not one figures.py draws"
    small = []
    for name, (natural, width) in sorted(drawn.items()):
        px, png_width = smallest_text(drawers[name])
        assert png_width == natural, f"{name}: drawn again {png_width} px wide, not {natural}"
        if px * width / natural < SMALLEST_TEXT_PX:
            small.append(f"{name}: {px:.1f} px text, {natural} px drawn at {width:.0f}")
    assert not small, "figures whose text is too small to read at 1280 px:\n" + "\n".join(small)
