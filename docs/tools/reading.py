"""How much a reader opens to follow one rung: the files its package imports, transitively.

    python docs/tools/reading.py            # a table: level, files, lines
    python docs/tools/reading.py --files    # and the files themselves
    python docs/tools/reading.py --split    # the rung's own, the earlier rungs', the shared

Starting from ``levels/<rung>/__init__.py``, every ``levels`` module reached by an
import statement (at any depth, lazily imported ones included) is one file a reader
opens; their lines (``wc -l``) are what they read. Modules outside ``levels`` (numpy,
torch) are not counted: a reader knows them or looks them up. Two columns: all of
it, and the transformer alone, which leaves out the generation loop shared by every
rung (``levels/common/generation.py``, ``sampling.py``: read once, not per rung).

``--split`` divides the transformer's count three ways: the rung's own package,
the earlier rungs it builds on (level 0's classes under level 1, level 2's under
levels 3 and 4: read already by a reader who climbs in order), and the shared
modules of ``levels/common`` (read once for the whole ladder).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEVELS = ROOT / "levels"
GENERATION = ("generation.py", "sampling.py")


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    if parts[0] != "levels":
        return None
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _package(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts)
    return ".".join(parts[:-1])


def imports(path: Path) -> set[Path]:
    """The ``levels`` files that ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    here = _package(path)
    found: set[Path] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names]
        for name in names:
            # a package's __init__ is opened on the way to any module inside it
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                file = _module_file(".".join(parts[:i]))
                if file is not None and (i == len(parts) or file.name != "__init__.py" or i > 1):
                    found.add(file)
    found.discard(LEVELS / "__init__.py")  # the ladder's index, not the rung
    return found


def reach(start: Path) -> set[Path]:
    seen, todo = {start}, [start]
    while todo:
        for file in imports(todo.pop()) - seen:
            seen.add(file)
            todo.append(file)
    return seen


def main(argv: list[str]) -> None:
    for package in sorted(p for p in LEVELS.iterdir() if p.name.startswith("level") and p.is_dir()):
        files = reach(package / "__init__.py")
        model = {f for f in files if not (f.parent.name == "common" and f.name in GENERATION)}
        count = lambda fs: sum(len(f.read_text().splitlines()) for f in fs)  # noqa: E731
        print(
            f"{package.name:24s} all: {len(files):3d} files {count(files):6d} lines;"
            f"  the transformer: {len(model):3d} files {count(model):6d} lines"
        )
        if "--split" in argv:
            own = {f for f in model if package in f.parents}
            shared = {f for f in model if f.parent.name == "common"}
            earlier = model - own - shared
            print(
                " " * 25
                + "; ".join(
                    f"{name}: {len(fs)} files {count(fs)} lines"
                    for name, fs in (("own", own), ("earlier rungs", earlier), ("shared", shared))
                )
            )
        if "--files" in argv:
            for f in sorted(files):
                print(f"    {f.relative_to(ROOT)} ({len(f.read_text().splitlines())})")


if __name__ == "__main__":
    main(sys.argv[1:])
