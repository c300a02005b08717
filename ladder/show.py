"""``ladder show``: print the same piece of the transformer as each level writes it.

``ladder show attention`` prints the attention function of level 0, then
level 1, and so on up to level 4's kernel, so the rungs can be compared in a
terminal; ``ladder show`` alone lists the levels (what each adds, and its
chapter in docs/) and the pieces that can be shown.

The source is read from the files with ``ast``, not imported: showing level
4's kernels needs neither triton nor a GPU, and nothing is executed. On a
terminal the code is syntax-highlighted with rich; piped, it is plain text.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from levels import LEVELS

ROOT = Path(__file__).resolve().parents[1] / "levels"  # the levels/ package


@dataclass(frozen=True)
class Source:
    """One definition to show: ``qualname`` (``"attention"``, ``"LayerNorm.forward"``) in ``file``."""

    file: str  # relative to levels/, e.g. "level1_numpy/ops.py"
    qualname: str


@dataclass(frozen=True)
class Reuse:
    """A level that does not rewrite the piece: it runs ``level``'s code unchanged."""

    level: str
    why: str


# For each piece, what every level shows: its own definitions, or whose it reuses.
PIECES: dict[str, dict[str, tuple[Source, ...] | Reuse]] = {
    "attention": {  # the cores the layers run; each level's `attention` checks, then calls it
        "level0_loops": (Source("level0_loops/ops.py", "attend"),),
        "level1_numpy": (
            Source("level1_numpy/ops.py", "attend"),
            Source("level1_numpy/ops.py", "attention_weights"),
            Source("level1_numpy/ops.py", "softmax"),
        ),
        "level2_torch_manual": (Source("level2_torch_manual/attention.py", "attend"),),
        "level3_sdpa_flash": (
            Source("level3_sdpa_flash/attention.py", "sdpa_mask"),
            Source("level3_sdpa_flash/attention.py", "attend"),
            Source("level3_sdpa_flash/attention.py", "sdpa"),
        ),
        "level4_triton_kernel": (
            Source("level4_triton_kernel/flash_attention.py", "attend"),
            Source("level4_triton_kernel/flash_forward.py", "_attn_fwd_kernel"),
            Source("level4_triton_kernel/flash_forward.py", "attend_keys"),
        ),
    },
    "layer_norm": {
        "level0_loops": (Source("level0_loops/ops.py", "layer_norm"),),
        "level1_numpy": (Source("level1_numpy/ops.py", "layer_norm"),),
        "level2_torch_manual": (Source("level2_torch_manual/models.py", "LayerNorm.forward"),),
        "level3_sdpa_flash": Reuse("level2_torch_manual", "level 3 changes only attention"),
        "level4_triton_kernel": (
            Source("level4_triton_kernel/fused_layer_norm.py", "_layer_norm_fwd_kernel"),
        ),
    },
    "rope": {
        "level0_loops": (Source("level0_loops/ops.py", "rope"),),
        "level1_numpy": (Source("level1_numpy/ops.py", "rope"),),
        "level2_torch_manual": (
            Source("level2_torch_manual/models.py", "Rotary.forward"),
            Source("level2_torch_manual/models.py", "apply_rope"),
        ),
        "level3_sdpa_flash": Reuse("level2_torch_manual", "the modules are level 2's"),
        "level4_triton_kernel": Reuse("level2_torch_manual", "the modules are level 2's"),
    },
    "kv_cache": {
        "level0_loops": (Source("level0_loops/models.py", "KVCache"),),
        "level1_numpy": Reuse("level0_loops", "level 1's classes are level 0's with numpy ops"),
        "level2_torch_manual": (Source("level2_torch_manual/models.py", "KVCache"),),
        "level3_sdpa_flash": (Source("level3_sdpa_flash/models.py", "StaticKVCache"),),
        "level4_triton_kernel": Reuse("level3_sdpa_flash", "its KERNELS use level 3's cache"),
    },
}


def chapter(level: str) -> str:
    """The tutorial chapter of ``level``, as its package docstring names it (``docs/<level>.md``)."""
    doc = ast.get_docstring(ast.parse((ROOT / level / "__init__.py").read_text())) or ""
    own = f"docs/{level}.md"
    if own in doc:  # the docstring may name other pages too (docs/decoding.md)
        return own
    found = re.search(r"docs/[\w.-]+\.md", doc)
    return found.group(0) if found else "(no chapter named)"


def _find(tree: ast.Module, qualname: str) -> ast.AST | None:
    node: ast.AST = tree
    for part in qualname.split("."):
        body = getattr(node, "body", [])
        found = [
            n
            for n in body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and n.name == part
        ]
        if not found:
            return None
        node = found[-1]  # a later definition replaces an earlier one, as at import
    return node


def source_of(src: Source) -> tuple[str, int]:
    """The text of ``src`` (decorators included) and its first line number, read from the file.

    Raises ``LookupError`` when the file has no such definition.
    """
    path = ROOT / src.file
    text = path.read_text()
    node = _find(ast.parse(text), src.qualname)
    if node is None:
        raise LookupError(f"{src.qualname} is not defined in levels/{src.file}")
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    lines = text.splitlines()[first - 1 : node.end_lineno]
    indent = len(lines[0]) - len(lines[0].lstrip())  # methods are shown dedented
    return "\n".join(line[indent:] for line in lines), first


def summary(level: str) -> str:
    """The first sentence of ``level``'s package docstring, without its ``Level N:`` label."""
    doc = ast.get_docstring(ast.parse((ROOT / level / "__init__.py").read_text())) or ""
    first = doc.split("\n\n")[0].replace("\n", " ").strip()
    first = first.replace("``", "`")  # reST literals -> Markdown code
    return first.split(": ", 1)[1] if first.startswith("Level ") and ": " in first else first


class _Printer:
    """Headings and code, highlighted by rich on a terminal, plain text otherwise."""

    def __init__(self, plain: bool):
        from rich.console import Console

        self.console = Console(highlight=False)
        self.rich = self.console.is_terminal and not plain

    def heading(self, text: str) -> None:
        if self.rich:
            self.console.rule(f"[bold]{text}[/bold]", align="left")
        else:
            print(f"# {text}")

    def line(self, text: str) -> None:
        if self.rich:
            self.console.print(text, markup=False)
        else:
            print(text)

    def code(self, text: str, first_line: int) -> None:
        if self.rich:
            from rich.syntax import Syntax

            self.console.print(
                Syntax(text, "python", line_numbers=True, start_line=first_line, word_wrap=True)
            )
        else:
            print(text)
        print()


def show_piece(piece: str, levels: list[str], printer: _Printer) -> None:
    """Print ``piece`` as each of ``levels`` writes it, lowest level first."""
    for level in levels:
        entry = PIECES[piece][level]
        if isinstance(entry, Reuse):
            printer.heading(f"{level}: {piece}")
            printer.line(f"(reuses {entry.level}'s code unchanged: {entry.why})")
            print()
            continue
        for src in entry:
            text, first = source_of(src)
            printer.heading(f"{level}: {src.qualname}  (levels/{src.file}:{first})")
            printer.code(text, first)


def show_overview(printer: _Printer) -> None:
    """The levels, what each adds, and where its chapter is; then the pieces."""
    printer.heading("the ladder")
    for level in LEVELS:
        printer.line(f"{level:<22} {summary(level)}")
        printer.line(f"{'':<22} chapter: {chapter(level)}")
    print()
    printer.line("pieces: " + ", ".join(PIECES) + "   (e.g. `ladder show attention --levels 1,2`)")


def run(args: argparse.Namespace) -> int:
    """``ladder show``: the overview, or one piece at the chosen levels."""
    printer = _Printer(plain=args.plain)
    try:
        if args.piece is None:
            show_overview(printer)
        else:
            show_piece(args.piece, args.levels or list(LEVELS), printer)
    except BrokenPipeError:
        # The reader stopped reading (`ladder show attention | head`): not an error.
        # Point stdout at devnull so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
