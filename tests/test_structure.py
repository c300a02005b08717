"""The project's rooms and floors, held: every import goes down (or across a floor), none
comes back up, and no import circle joins two modules.

The floors, lowest first (docs/conventions.md, "Where things are"):

0. ``levels.common``: the contract every rung shares (config, parameters, checks, the
   one visibility rule, sampling's distribution, speculative decoding's rule);
1. ``engine``: the one decoding engine, which imports no rung (a model is what offers
   its plain pass);
2. ``levels``: the rungs, their public methods (which run the engine), the readers of
   real models;
3. ``constrained``, ``lab`` and ``learner``: output held to a language; training; a
   learner's rung;
4. ``loading``: a source to a model ready to run;
5. ``serving`` and ``benchmarks``: the server, the harness;
6. ``ladder``: the command line, over all of it.

Imports inside functions count as any other: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "levels",
    "engine",
    "constrained",
    "lab",
    "learner",
    "loading",
    "serving",
    "benchmarks",
    "ladder",
)
# (module prefix, floor), the longest prefix first.
FLOORS = (
    ("levels.common.public", 2),  # the public methods, which run the engine
    ("levels.common", 0),
    ("engine", 1),
    ("levels", 2),
    ("constrained", 3),
    ("lab", 3),
    ("learner", 3),
    ("loading", 4),
    ("serving", 5),
    ("benchmarks", 5),
    ("ladder", 6),
)
# The one way from the command line to the harness: the bench command (its module, and its
# arguments, which the parser declares with every other command's).
BENCH_COMMAND = ("ladder.bench", "ladder.cli")


def modules() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules ``name`` imports, at any depth of its code."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from package import module`` imports the module; ``from module import name``
            # the module.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]  # fmt: skip
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def floor(name: str) -> int:
    return next(f for prefix, f in FLOORS if name == prefix or name.startswith(prefix + "."))


def test_no_import_comes_back_up_a_floor():
    upward = [
        f"{a} ({floor(a)}) -> {b} ({floor(b)})"
        for a, targets in graph().items()
        for b in targets
        if floor(b) > floor(a)
    ]
    assert not upward, "imports that run back up a floor:\n" + "\n".join(sorted(upward))


def test_the_command_line_reaches_the_harness_only_for_the_bench():
    reached = {
        f"{a} -> {b}"
        for a, targets in graph().items()
        if a.startswith("ladder") and a not in BENCH_COMMAND
        for b in targets
        if b.startswith("benchmarks")
    }
    assert not reached, reached


def test_no_import_circle():
    """Tarjan's strongly connected components of the import graph: each a single module."""
    edges, index, low, stack, on, circles = graph(), {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not circles, circles


def test_every_module_has_a_floor_and_the_rooms_hold_one_concern():
    """Each module is on a floor; the library's rooms hold no allocator, tool or printer of
    another's: levels/ no block manager, compile check or printer; ladder/ no model loading."""
    for name in modules():
        floor(name)
    levels = {p.relative_to(ROOT).as_posix() for p in (ROOT / "levels").rglob("*.py")}
    assert not [p for p in levels if "level4_compile" in p or p.endswith("show.py")]
    assert "class BlockPool" not in (ROOT / "levels/level2_torch_manual/paged.py").read_text()
    calls = defaultdict(list)
    for path in ROOT.glob("ladder/**/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in (
                "load_tokenizer",
                "load_chat_template",
                "DecoderOnlyTransformer",
            ):
                calls[path.name].append(node.func.attr)
    assert not calls, f"ladder/ loads models itself: {dict(calls)}"


ENGINE_LINES = 900  # the engine with its docstrings; nano-vllm's is 642 without either
# speculation or constraints: a budget that keeps each part small enough to read at once


def test_the_engine_fits_its_budget():
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "engine").glob("*.py"))
    assert lines <= ENGINE_LINES, f"engine/ is {lines} lines, over {ENGINE_LINES}"
