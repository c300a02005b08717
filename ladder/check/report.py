"""The compile check's report: per kernel and target, each configuration's shared memory.

One table per kernel; a row per target and launch configuration (the
autotuner's candidates, or the one fixed launch); a column per dtype, listing
per head width (row width for the norms) the shared memory one program needs, in
KiB, the largest over the compile-time variants. A candidate the prune drops on
that target is marked, as is anything that failed.

It needs nothing of check.py: the results and the failures come as arguments,
the targets' limits (``TARGETS``) from matrix.py, so check.py imports this module
and this module never imports check.py (no cycle).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .matrix import KERNELS, MATRIX_DTYPES, TARGETS

# Worse statuses win when the variants of one cell disagree.
RANK = {"compiled": 0, "pruned": 1, "over": 2, "error": 3}
MARK = {"compiled": "", "pruned": "x", "over": "!", "error": " error"}
STYLE = {"compiled": "", "pruned": "red", "over": "bold red", "error": "bold red"}


@contextlib.contextmanager
def progress(console: Console, total: int, enabled: bool = True):
    """A progress bar over ``total`` compiles; yields the callback that advances it."""
    if not enabled or not console.is_terminal:
        yield lambda result: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress(
        "compiling", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as bar:
        task = bar.add_task("compile", total=total)
        yield lambda result: bar.advance(task)


def kib(shared: int | None) -> str:
    if shared is None:
        return "?"
    value = shared / 1024
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def cells(results: list[dict]) -> dict[tuple, dict[int, tuple[str, int | None]]]:
    """(kernel, target, tiles, dtype) -> {size: (status, shared)}, variants folded."""
    folded: dict[tuple, dict[int, tuple[str, int | None]]] = defaultdict(dict)
    for r in results:
        key = (r["kernel"], r["target"], tuple(r["tiles"] or ()), r["dtype"])
        status, shared = folded[key].get(r["size"], ("compiled", None))
        if RANK[r["status"]] > RANK[status]:
            status = r["status"]
        if r["shared"] is not None:
            shared = max(shared or 0, r["shared"])
        folded[key][r["size"]] = (status, shared)
    return folded


def kernel_table(kernel: str, results: list[dict], limits: dict[str, int]) -> Table:
    spec = KERNELS[kernel]
    table = Table(title=f"{spec.title} ({spec.function})", title_justify="left")
    table.add_column("target", no_wrap=True)
    table.add_column("tiles  (BLOCK_M x BLOCK_N, warps, stages)" if not spec.norm else "launch")
    dtypes = [d for d in MATRIX_DTYPES if any(r["dtype"] == d for r in results)]
    for dtype in dtypes:
        table.add_column(f"{dtype}: KiB by {'row' if spec.norm else 'head'} width")
    folded = cells(results)
    for target in sorted({r["target"] for r in results}):
        launches = sorted({tuple(r["tiles"] or ()) for r in results if r["target"] == target})
        for launch in launches:
            if launch:
                tiles = "{}x{}, {} warps, {} stages".format(*launch)
                tiles += "" if spec.tuned else " (fixed)"
            else:
                tiles = "fixed" + (": rows x row block per program" if spec.norm else "")
            row = [f"{target} ({limits[target] // 1024} KiB)", tiles]
            for dtype in dtypes:
                parts = []
                for size, (status, shared) in folded[(kernel, target, launch, dtype)].items():
                    text = escape(f"{size}:{kib(shared)}{MARK[status]}")
                    parts.append(f"[{STYLE[status]}]{text}[/]" if STYLE[status] else text)
                row.append(" ".join(parts))
            table.add_row(*row)
    return table


def print_check(console: Console, check, failures: list[str]) -> None:
    """Every kernel's table, a legend, the totals and the failures (``check``: a
    ``check.Check``, its ``results`` and ``seconds``)."""
    limits = {name: target.shared_limit for name, target in TARGETS.items()}
    by_kernel: dict[str, list[dict]] = defaultdict(list)
    for r in check.results:
        by_kernel[r["kernel"]].append(r)
    for kernel in KERNELS:
        if by_kernel[kernel]:
            console.print(kernel_table(kernel, by_kernel[kernel], limits))
    console.print(
        "KiB of shared memory per program, the largest over the variants (causal, window, mask, "
        "grouped heads; norm kinds); x: pruned for that target (over its limit, not compiled), "
        "!: over the limit and kept, error: does not compile.",
        markup=False,
    )
    counts: dict[str, int] = defaultdict(int)
    for r in check.results:
        counts[r["status"]] += 1
    compiled_s = sum(r["seconds"] for r in check.results)
    console.print(
        f"{len(check.results)} jobs: {counts['compiled']} compiled and kept, "
        f"{counts['pruned']} pruned, {counts['over']} over the limit, {counts['error']} failed; "
        f"{check.seconds:.0f} s wall, {compiled_s:.0f} s of compiling.",
        markup=False,
    )
    for message in failures:
        console.print(f"FAIL {message}", style="bold red", markup=False, highlight=False)
