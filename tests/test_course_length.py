"""docs/tools/course_length.py: the reading time of the course, and its budget.

The measure is prose at 180 words a minute plus 9 seconds a line of code, output or
formula; the course's path to its first Triton kernel must stay within three hours.
"""

from __future__ import annotations

import course_length
import pytest
from course_length import Length, measure, nav_pages
from markdown_blocks import ROOT

PAGE = """# A heading of four words

Two sentences of prose, with a [link](somewhere.md#far) and `code`.
<!-- a comment the reader never sees -->
![a picture, looked at, not read](img/x.png)

```python
x = 1

y = 2
```

```output
3
```

$$
a = b
$$

    s_ij = q_i k_j

1. An item
    continued, indented, still prose.

| a | b |
| --- | ---: |
| c | d |
"""


def test_prose_code_output_and_formulas_are_counted_apart():
    length, found = measure(PAGE)
    # Words: "A heading of four words" 5; "Two sentences ... `code`." 9 (the link's target
    # dropped, its text kept); "An item" 2; "continued, indented, still prose." 4;
    # the table's cells 4. Lines: 2 of code (the blank one not), 1 of output, 1 of
    # formula between $$, 1 indented formula.
    assert (length.words, length.lines) == (5 + 9 + 2 + 4 + 4, 2 + 1 + 1 + 1)
    assert not found
    assert length.minutes == pytest.approx(24 / 180 + 5 * 9 / 60)


def test_the_path_stops_after_the_first_kernel():
    page = (
        "Before the kernel.\n\n"
        '```python excerpt="levels/level4_triton_kernel/tutorial.py"\n'
        "    x = tl.load(X + offs)\n"
        "```\n\nAfter it, never counted.\n"
    )
    whole, _ = measure(page)
    part, found = measure(page, stop_at_first_kernel=True)
    assert found and part == Length(3, 1) and whole == Length(3 + 4, 1)
    # A block quoting another file is not a kernel.
    _, found = measure(
        page.replace("level4_triton_kernel", "level3_sdpa_flash"), stop_at_first_kernel=True
    )
    assert not found


def test_a_workshop_beside_the_path_keeps_its_row_and_leaves_the_path(tmp_path):
    pages = []
    for name, text in (("a.md", "Four words of prose."), ("your_rung.md", "Two words."),
                       ("b.md", "Three more words.")):  # fmt: skip
        pages.append(tmp_path / name)
        pages[-1].write_text(text)
    assert "your_rung.md" in course_length.BESIDE_THE_PATH
    a, workshop, b = course_length.rows(pages)
    assert workshop.length == Length(2, 0) and workshop.to_kernel is None
    assert a.to_kernel == Length(4, 0) and b.to_kernel == Length(3, 0)  # the path goes on


def test_the_navigation_holds_every_page_once():
    pages = nav_pages()
    assert len(pages) == len(set(pages))
    assert set(pages) == set((ROOT / "docs").glob("*.md"))


def test_the_path_to_the_first_triton_kernel_is_within_three_hours():
    rows = course_length.rows(nav_pages())
    on_path = [r for r in rows if r.to_kernel is not None]
    assert on_path[-1].page == "level4_triton_kernel.md"  # the first kernel was found there
    minutes = sum(r.to_kernel.minutes for r in on_path)
    assert 60 < minutes <= 180, (
        f"the course's path to the first Triton kernel takes {course_length.hours(minutes)}: "
        "over its budget of 3 h (python docs/tools/course_length.py shows each page)"
    )


def test_speculative_decoding_and_serving_read_within_seventy_minutes():
    """The two chapters after decoding keep their ideas on the path and their reference off
    it (docs/serving_reference.md, benchmarks.md's table, the appendix's published bugs):
    together they read in at most 70 minutes."""
    rows = {r.page: r.length.minutes for r in course_length.rows(nav_pages())}
    minutes = rows["speculative.md"] + rows["serving.md"]
    assert minutes <= 70, (
        f"speculative.md and serving.md take {minutes:.0f} minutes, over their 70: move "
        "reference material to docs/serving_reference.md or the appendix"
    )


def test_the_command_fails_over_its_budget(capsys):
    assert course_length.main([]) == 0
    assert "| **the course** |" in capsys.readouterr().out
    assert course_length.main(["--budget", "0.5"]) == 1
    assert "over 0.5 h" in capsys.readouterr().out


def test_hours_round_to_the_minute_before_splitting():
    """179.6 minutes is 3 h 00, never 2 h 60; the half minute rounds to even (Python's)."""
    assert [course_length.hours(m) for m in (179.6, 179.4, 120.0, 59.5, 0.4)] == [
        "3 h 00", "2 h 59", "2 h 00", "1 h 00", "0 h 00",
    ]  # fmt: skip
