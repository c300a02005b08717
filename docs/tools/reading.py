"""How much a reader opens to follow one rung: the files its package imports, transitively.

    python docs/tools/reading.py            # a table: level, files, lines
    python docs/tools/reading.py --files    # and the files themselves
    python docs/tools/reading.py --split    # the rung's own, the earlier rungs', the shared
    python docs/tools/reading.py --trace    # what one forward and one decode_step run, by kind
    python docs/tools/reading.py --hops     # one decode_step's functions, in order (levels 2, 3)

Starting from ``levels/<rung>/__init__.py``, every ``levels`` module reached by an
import statement (at any depth, lazily imported ones included) is one file a reader
opens; their lines (``wc -l``) are what they read. Modules outside ``levels`` (numpy,
torch, and the decoding engine, the ``engine`` package every rung's ``generate`` runs)
are not counted: a reader knows them, looks them up, or reads them once for every rung.
Two columns: all of it, and the transformer alone, which leaves out the choice of the
next token shared by every rung (``levels/common/sampling.py``: read once, not per rung).

``--split`` divides the transformer's count three ways: the rung's own package,
the earlier rungs it builds on (level 0's classes under level 1, level 2's under
levels 3 and 4: read already by a reader who climbs in order), and the shared
modules of ``levels/common`` (read once for the whole ladder).

``--hops`` lists what one ``decode_step`` of a 2-layer decoder (``TRACE_CONFIG``, its
prompt prefilled beforehand) enters, in order: each function of ``levels`` at its first
entry, with its file and line, then the count, the files, and how many were entered
before the plain ``Transformer.forward`` (the public method and its checks).

``--trace`` measures what a reader follows rather than what the imports reach:
one small decoder-only model (``TRACE_CONFIG``), built from its parameters,
runs one ``forward`` and one ``decode_step`` (the prefill between them is not
traced), under ``sys.settrace``; ``--build`` traces the build too (the
parameters checked and loaded into modules, the modules' constructors). Every function of ``levels`` that runs is
counted once, by its lines (``def`` to its last line, docstring and comments
included: a reader reads them; a function nested in a counted one is part of
it), and sorted by what it does (``RULES``, first match; ``--trace --functions``
lists every function with its kind, so the sorting can be checked):

* **loading**: the parameters into modules (``fetch``, ``linear``, the shapes of
  ``levels/common/params.py``), the config's derived values;
* **checks**: input validation (``check_*``, the ids and ``valid`` readers);
* **bookkeeping**: the public methods (``levels/common/public.py``: positions from
  ``valid``, zeroing the padded outputs) and the level's array functions they convert
  inputs and outputs with;
* **transformer**: everything else: embedding, attention and its rules
  (causal, window), RoPE, norms, the feed-forward, the KV cache's keys and
  values, the head.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEVELS = ROOT / "levels"
GENERATION = ("sampling.py",)


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


# ----------------------------------------------------------------------------- --trace

# The model traced: small, with none of the real families' options.
TRACE_CONFIG = dict(vocab_size=32, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_seq_len=16)
TRACE_LEVELS = ("level0_loops", "level1_numpy", "level2_torch_manual", "level3_sdpa_flash",
                "level4_triton_kernel")  # fmt: skip
KINDS = ("transformer", "checks", "bookkeeping", "loading")

# (file, function name): a regular expression each, matched against the file's path under
# levels/ and the function's name; the first rule that matches says the kind (default:
# transformer, which includes the modules' constructors: they declare the architecture).
RULES = (
    (r".", r"^_?check|^checked_ids$|^bounds$", "checks"),
    (r"common/semantics\.py$", r"^rows_without_keys$", "checks"),  # refusing empty rows
    (r"common/semantics\.py$", r".", "transformer"),  # the rules of attention: causal, window
    (r"common/checks\.py$", r".", "checks"),
    (r"common/boundary\.py$", r"^(rows|_numpy|_ids|_rows|_one_position)$", "checks"),
    (r"common/public\.py$", r"^(as_numpy|ids_of|valid_of|outside)$", "checks"),  # the input readers
    (r"common/(boundary|public|generation|sampling)\.py$", r".", "bookkeeping"),
    # The arrays the edge converts with (each level's converters, its zeroing of padded
    # logits and its last position) and what a model keeps for the edge and its cache.
    (r"/(convert|arrays|ops)\.py$", r"^(asarray|to_numpy|dtype_kind|zero_padded|last_position)$",
     "bookkeeping"),
    # (The seven hooks a model filled in for the edge until 2026-12-06 are named too, so
    # that the tool sorts older code as it sorted it then.)
    (r".", r"^(arrays|_converters|_inference|new_cache|device|commit|_forget|position_offset"
     r"|_ids|_rows|_mask|_offset|_column|_last|_zero_padded|token_facts|unsqueeze_time|bools)$",
     "bookkeeping"),
    # Where a cache's rows stand for the public decode_step (the positions it derives), and
    # the generation loops' switch of autograd.
    (r".", r"^(next_positions|inference)$", "bookkeeping"),
    # A model's __call__ hands over to its forward; a level-0 layer's __call__ is its forward
    # (the transformer, as the torch levels' forward methods are).
    (r"/models\.py$", r"^__call__$", "bookkeeping"),
    # Level 3's _decoder picks the compiled step or the edge's pass (a seq2seq model's
    # _decoder is the architecture of its decoder stack).
    (r"level3_\w+/models\.py$", r"^(_decoder|_compiled_step|_compiled_or_plain)$", "bookkeeping"),
    (r"common/(params|config)\.py$|/(convert|arrays)\.py$", r".", "loading"),
    (r"/ops\.py$", r"^linear$", "transformer"),  # levels 0 and 1's x @ W^T + b, not a loader
    (r".", r"^(_layers|feed_forward_linears|_linears?|_params?|_tensor|_array|fetch"
     r"|linear|norm|_norm)$", "loading"),
)  # fmt: skip


def _functions(path: Path) -> dict[int, tuple[int, int]]:
    """Every function of ``path``: its code's first line (the first decorator's, or the
    ``def``'s) -> ``(first line, last line)``."""
    spans = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            span = (first, node.end_lineno)
            spans[first] = spans[node.lineno] = span
    return spans


def kind_of(file: str, name: str) -> str:
    for file_rule, name_rule, kind in RULES:
        if re.search(file_rule, file) and re.search(name_rule, name):
            return kind
    return "transformer"


def trace(level_name: str, build: bool = False) -> dict[tuple[str, str, int, int], str]:
    """The functions of ``levels`` that one ``forward`` and one ``decode_step`` of ``TRACE_CONFIG``
    run at ``level_name`` (and its build, with ``build``): ``(file, name, first, last) -> kind``."""
    import numpy as np

    import levels
    from levels import TransformerConfig, init_params

    level = levels.load(level_name)
    config = TransformerConfig(**TRACE_CONFIG)
    params = init_params(config, "decoder_only", seed=0, scheme="random")
    tokens = level.asarray(np.array([[3, 1, 4, 1, 5]]))
    next_token = level.asarray(np.array([2]))  # made here: the reader's own code, not the model's
    runs: set = set()  # the code objects run

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(str(LEVELS)):
            runs.add(frame.f_code)
        return None  # calls only: no line events

    model = None if build else level.DecoderOnlyTransformer(config, params)
    sys.settrace(tracer)
    try:
        model = model or level.DecoderOnlyTransformer(config, params)
        model(tokens)
        sys.settrace(None)
        _, cache = model.prefill(tokens)
        sys.settrace(tracer)
        model.decode_step(next_token, cache)
    finally:
        sys.settrace(None)
    counted: dict[tuple[str, str, int, int], str] = {}
    spans_of: dict[str, dict] = {}
    for code in runs:
        if code.co_name.startswith("<"):
            continue  # a comprehension, lambda or module body: part of what contains it
        path = Path(code.co_filename)
        file = str(path.relative_to(LEVELS))
        spans = spans_of.setdefault(file, _functions(path))
        first, last = spans.get(code.co_firstlineno, (code.co_firstlineno, code.co_firstlineno))
        counted[(file, code.co_name, first, last)] = kind_of(file, code.co_name)
    # A function nested in another counted one is read as part of it.
    return {
        key: kind
        for key, kind in counted.items()
        if not any(
            other[0] == key[0] and other[2] <= key[2] and key[3] <= other[3] and other != key
            for other in counted
        )
    }


def hops(level_name: str) -> list[tuple[str, str, int]]:
    """The functions of ``levels`` that one ``decode_step`` of ``TRACE_CONFIG`` enters at
    ``level_name``, each at its first entry, in order: ``(file, qualified name, line)``
    (comprehensions and lambdas are part of what contains them)."""
    import numpy as np

    import levels
    from levels import TransformerConfig, init_params

    level = levels.load(level_name)
    config = TransformerConfig(**TRACE_CONFIG)
    model = level.DecoderOnlyTransformer(config, init_params(config, "decoder_only", seed=0))
    _, cache = model.prefill(level.asarray(np.array([[3, 1, 4, 1, 5]])))
    next_token = level.asarray(np.array([2]))
    entered: dict = {}

    def tracer(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(str(LEVELS)):
            if not code.co_name.startswith("<"):
                entered.setdefault(code, None)
        return None

    sys.settrace(tracer)
    try:
        model.decode_step(next_token, cache)
    finally:
        sys.settrace(None)
    return [
        (str(Path(code.co_filename).relative_to(LEVELS)), code.co_qualname, code.co_firstlineno)
        for code in entered
    ]


def hops_listing(names=("level2_torch_manual", "level3_sdpa_flash")) -> list[str]:
    """The ``--hops`` listing, one block per rung."""
    out = []
    for name in names:
        entered = hops(name)
        plain = next(
            (i for i, (_, qual, _) in enumerate(entered) if qual.endswith("Transformer.forward")),
            len(entered),
        )
        out.append(f"{name}: one decode_step of a 2-layer decoder")
        out += [
            f"  {i + 1:3d}  {file}:{line}  {qual}" for i, (file, qual, line) in enumerate(entered)
        ]
        files = sorted({file for file, _, _ in entered})
        out.append(
            f"  {len(entered)} functions in {len(files)} files ({', '.join(files)}); "
            f"{plain} entered before the plain Transformer.forward"
        )
        out.append("")
    return out


def trace_table(names=TRACE_LEVELS, functions: bool = False, build: bool = False) -> list[str]:
    """The ``--trace`` table, in Markdown (with the build, ``build``), and with ``functions``
    every function's line."""
    head = ["| rung | files entered | their lines | lines of the functions run | "
            + " | ".join(KINDS) + " |", "| --- |" + " ---: |" * (3 + len(KINDS))]  # fmt: skip
    rows, listing = [], []
    for name in names:
        counted = trace(name, build)
        files = sorted({file for file, *_ in counted})
        lines = sum(len((LEVELS / f).read_text().splitlines()) for f in files)
        by_kind = defaultdict(int)
        for (file, fn, first, last), kind in sorted(counted.items()):
            by_kind[kind] += last - first + 1
            listing.append(f"{name} {kind:11s} {last - first + 1:4d} {file}:{first} {fn}")
        total = sum(by_kind.values())
        shares = " | ".join(
            f"{by_kind[k]} ({100 * by_kind[k] / total:.0f}%)"
            if k == "transformer"
            else str(by_kind[k])
            for k in KINDS
        )
        rows.append(
            f"| {name.split('_')[0].removeprefix('level')} | {len(files)} | {lines} | {total} | {shares} |"
        )
    return head + rows + (["", *listing] if functions else [])


def main(argv: list[str]) -> None:
    if "--hops" in argv:
        rungs = [a for a in argv if a in TRACE_LEVELS]
        print("\n".join(hops_listing(rungs or ("level2_torch_manual", "level3_sdpa_flash"))))
        return
    if "--trace" in argv:
        print("\n".join(trace_table(functions="--functions" in argv, build="--build" in argv)))
        return
    for package in (LEVELS / name for name in TRACE_LEVELS):  # the rungs, not level4_compile
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
