"""The course's rendered figures: each drawn from committed data by one command, and checked.

    python docs/tools/figures.py            # redraw every figure whose data or drawing changed
    python docs/tools/figures.py --train    # first retrain the induction-head model (a minute)
    python docs/tools/figures.py --record   # first record the explanatory figures' data again
    python docs/tools/figures.py --train-text   # first retrain the model of real text (minutes)

Each figure is a PNG under ``docs/img/`` with a sidecar ``.source`` beside it
holding the sha256 of the data it was drawn from and of the function that
drew it (as ``docs/img/cpu_quick.source`` holds the hash of the benchmark run
behind ``cpu_quick.png``). The docs tests (``tests/test_docs_course.py``)
fail when a sidecar disagrees with the committed data and code, so a figure
cannot silently show an older run; this command makes them agree again.

* ``peak_memory.png``: peak memory of one attention call against ``T``, per
  level, from the committed default benchmark run (``docs/data/cpu_default.json``,
  scenario ``attention fwd``);
* ``induction_head.png``: the attention of the model ``ladder train
  decoder-only`` trains (the lab's defaults, level 2, seed 0) on held-out
  sequences, from ``docs/data/induction_head.json``, which ``--train`` writes:
  the training takes about half a minute on two cores, so its result is
  committed and the test reads it, as the benchmark tables read their run;
* ``text_model.png``: the loss curves of ``lab.text``'s model of Python's help text
  (docs/text_model.md), from ``docs/data/text_model.json``, which ``--train-text``
  writes with the run's samples (a few minutes on one thread);
* ``roofline.png``: the real model's decode tokens/s against the bytes a token
  reads, under the copy bandwidth's ceiling, from the committed run of
  ``ladder bench --scenario real-model --json docs/data/real_model_cpu.json``
  (``benchmarks.plot.roofline``, which ``--roofline`` on that command also draws);
* ``cpu_bench.png``: the harness's plot of the committed default run
  (``docs/data/cpu_default.json``), as ``python -m benchmarks.plot`` draws it;
* ``speculative_speedup.png``: what each draft buys SmolLM2's compiled decode against
  ``k``, measured and as the formula predicts, from the committed run of ``ladder bench
  --scenario speculative`` (``docs/data/speculative_cpu.json``; docs/speculative.md);
* the explanatory figures of ``course_figures.py`` (attention's shapes, a RoPE
  pair, the KV cache, the flash kernel's tiles, the backward's loops), each
  drawn from a small file that a ``record_*`` function writes by running the
  library: this command records a file that is missing, ``--record`` records
  them all again, and the docs tests check that recording again gives the
  committed file.

A figure is drawn for the site's content column, about 1000 pixels at 1280 (so at
most 9 inches at 110 dots an inch, shown at its own size), and its smallest text must
be at least 9 pixels tall as the page shows it: ``smallest_text`` draws a figure again
and reads the size of every text it draws, and ``tests/test_site.py`` checks each
figure at the width Chromium gives it.

Why here: like ``doc_tables.py`` this is tooling for the docs, outside the
installed packages; it uses the lab and the levels as a user would.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import course_figures

ROOT = Path(__file__).resolve().parents[2]
DATA, IMG = ROOT / "docs" / "data", ROOT / "docs" / "img"
TRAIN_COMMAND = "python docs/tools/figures.py --train"
INDUCTION_LEVEL = "level2_torch_manual"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- peak memory


def draw_peak_memory(data: Path, png: Path) -> None:
    """Peak MiB allocated by one causal attention call against T, one line per level, log-log,
    beside the size of one float32 (B, H, T, T) score matrix."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = [r for r in json.loads(data.read_text()) if r["scenario"] == "attention fwd"]
    levels = [r["level"] for r in records if r["level"].startswith("level")]
    fig = Figure(figsize=(7.5, 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    unmeasured = []
    for i, level in enumerate(dict.fromkeys(levels)):
        mine = sorted(
            (r for r in records if r["level"] == level and r["status"] == "ok"),
            key=lambda r: r["shape"]["T"],
        )
        points = [(r["shape"]["T"], r["peak_memory_bytes"] / 2**20) for r in mine
                  if r["peak_memory_bytes"] is not None]  # fmt: skip
        if not points:
            unmeasured.append(level)
            continue
        T, mib = zip(*points, strict=True)
        ax.plot(T, mib, marker="o", color=f"C{i}", label=f"{level} ({mine[0]['dtype']})")
    shape = records[0]["shape"]
    T_all = sorted({r["shape"]["T"] for r in records})
    score = [shape["B"] * shape["H"] * t * t * 4 / 2**20 for t in T_all]
    ax.plot(T_all, score, ls="--", color="0.5", label="one float32 score matrix, B·H·T²·4 bytes")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T (= S), causal")
    ax.set_ylabel("peak MiB allocated above the inputs")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    run = next((r for r in records if r.get("machine")), records[0])
    note = f"; not measured: {', '.join(unmeasured)}" if unmeasured else ""
    ax.set_title(
        f"attention fwd, B={shape['B']} H={shape['H']} Dh={shape['Dh']}{note}\n"
        f"{run.get('machine', '')}, {(run.get('date') or '')[:10]} ({data.name})",
        fontsize="small",
    )
    fig.savefig(png, dpi=110)


# ----------------------------------------------------------------------------- speculation's speed-up


def draw_speculative_speedup(data: Path, png: Path) -> None:
    """What each draft buys SmolLM2's compiled decode against ``k``, the guesses a pass: the
    measured speed-up over plain decoding (a line per draft) and the formula's prediction
    from the same run's acceptance and costs (dashed), one panel per task, from the
    committed ``ladder bench --scenario speculative`` run."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = [r for r in json.loads(data.read_text()) if r["scenario"] == "speculative"]
    tasks = list(dict.fromkeys(r["shape"]["task"] for r in records))
    fig = Figure(figsize=(9.0, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(tasks), sharey=True)
    for ax, task in zip(axes, tasks, strict=True):
        mine = [r for r in records if r["shape"]["task"] == task]
        for i, draft in enumerate(dict.fromkeys(r["level"].split(" + ")[1] for r in mine)):
            runs = sorted((r for r in mine if r["level"].endswith(f" + {draft}")),
                          key=lambda r: r["shape"]["k"])  # fmt: skip
            k = [r["shape"]["k"] for r in runs]
            ax.plot(k, [r["figures"]["measured"] for r in runs], marker="o", color=f"C{i}",
                    label=f"{draft}, measured")  # fmt: skip
            ax.plot(k, [r["figures"]["predicted"] for r in runs], ls="--", color=f"C{i}",
                    alpha=0.6, label=f"{draft}, the formula")  # fmt: skip
        ax.axhline(1.0, color="0.4", lw=0.8)
        ax.text(8, 1.02, "plain decoding", ha="right", va="bottom", fontsize=8, color="0.3")
        ax.set_xscale("log", base=2)
        ax.set_xticks([2, 4, 8], ["2", "4", "8"])
        ax.set_xlabel("k, guesses a pass", fontsize=9)
        ax.set_title(f"the {task} task", fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("speed-up over plain decoding", fontsize=9)
    axes[-1].legend(fontsize=7, loc="upper right", ncol=2)
    run = records[0]
    fig.suptitle(
        f"SmolLM2 at level 3, compiled, greedy: {run.get('machine', '')}, "
        f"{(run.get('date') or '')[:10]} ({data.name})",
        fontsize=9,
    )
    fig.savefig(png, dpi=110)


# ----------------------------------------------------------------------------- the induction head


def train_induction(out: Path) -> None:
    """Train the lab's default decoder-only model on the cycle task and record its attention
    on a held-out sequence of each period (each layer, each head: ``(T, T)`` weights) in ``out``."""
    import torch

    import levels
    from lab.train import default_spec, spec_to_dict, train

    torch.set_num_threads(1)  # the lab's default: bit-identical runs on a shared machine
    level = levels.load(INDUCTION_LEVEL)
    spec = default_spec("decoder_only")
    result = train(spec, level)
    params = result["backend"].state()["params"]
    heldout = spec.task.sample(spec.settings.n_heldout, spec.settings.seed, "heldout")
    # One held-out sequence of each period, the longest there is of it: the heads' pattern
    # in one (drawn), and whether it holds at every period (docs/training.md counts it).
    examples = []
    for period in range(spec.task.min_period, spec.task.max_period + 1):
        mine = [e for e in heldout if e.prompt_len - 2 == period]
        examples.append(max(mine, key=lambda e: len(e.tokens)))

    def recording(q, k, v, **kw):  # the Kernels.attention hook: record, then attend as level 2
        T, S = q.shape[-2], k.shape[-2]
        scale = kw.get("scale") or 1.0 / math.sqrt(q.shape[-1])
        s = (q @ k.transpose(-2, -1)) * scale  # (1, H, T, S)
        s = s.masked_fill(~level.causal_mask(T, S), float("-inf"))
        weights.append(s.softmax(-1)[0])  # (H, T, S)
        return level.attention(q, k, v, **kw)

    kernels = replace(level.DecoderOnlyTransformer.kernels, attention=recording)  # the rest as is
    model = level.DecoderOnlyTransformer(spec.config, params, kernels=kernels)
    recorded = []
    for example in examples:
        weights: list[torch.Tensor] = []
        with torch.no_grad():
            model(torch.tensor([example.tokens]))  # (1, T)
        recorded.append(
            {
                "tokens": list(example.tokens),
                "prompt_len": example.prompt_len,
                "attention": [
                    [[[round(float(w), 4) for w in row] for row in head] for head in layer]
                    for layer in weights
                ],  # (layer, head, T, T)  # fmt: skip
            }
        )
    record = {
        "made_by": TRAIN_COMMAND,
        "level": INDUCTION_LEVEL,
        "spec": spec_to_dict(spec),
        "metrics": {k: result[k] for k in ("greedy_exact", "token_accuracy", "heldout_loss")},
        "train_seconds": round(result["train_seconds"], 1),
        "drawn": 2,  # the example of period 4
        "examples": recorded,
    }
    out.write_text(json.dumps(record) + "\n")


def draw_induction(data: Path, png: Path) -> None:
    """A heatmap per layer and head: rows are queries, columns keys, labelled by token."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    record = json.loads(data.read_text())
    example = record["examples"][record["drawn"]]
    att, tokens = example["attention"], example["tokens"]
    labels = ["BOS" if t == 1 else str(t) for t in tokens]
    n_layers, n_heads = len(att), len(att[0])
    fig = Figure(figsize=(4.2 * n_heads, 4.0 * n_layers), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_layers, n_heads, squeeze=False)
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer][head]
            image = ax.imshow(att[layer][head], cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer}, head {head}", fontsize="small")
            ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=90)
            ax.set_yticks(range(len(labels)), labels, fontsize=6)
            ax.axvline(example["prompt_len"] - 0.5, color="w", lw=0.6, ls=":")
            ax.set_xlabel("key", fontsize="small")
            ax.set_ylabel("query", fontsize="small")
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(
        f"cycle task, {record['level']}: greedy exact {record['metrics']['greedy_exact']:.3f} "
        f"on held-out sequences (dotted: end of the prompt)",
        fontsize="small",
    )
    fig.savefig(png, dpi=110)


# ----------------------------------------------------------------------------- a model of real text

TEXT_COMMAND = "python docs/tools/figures.py --train-text"
TEXT_LEVEL = "level3_sdpa_flash"
# What the recorded run samples: prompts from the corpus's kind of text, at two temperatures.
TEXT_SAMPLES = (
    ("The for statement", 0.8),
    ("A class definition", 0.8),
    ("Exceptions", 0.8),
    ("The for statement", 0.0),
)
TEXT_NEW_TOKENS = 80


def train_text_model(out: Path) -> None:
    """Train ``lab.text``'s default model at level 3 on Python's help text (a few minutes on
    one thread) and record its losses and samples in ``out``."""
    import platform

    import torch

    import levels
    from lab.text import TextSpec, sample, spec_dict, train_text

    torch.set_num_threads(1)  # the lab's default: one run is bit-identical to the next here
    spec = TextSpec()
    result = train_text(spec, levels.load(TEXT_LEVEL))
    model, tokenizer = result["backend"].model, result["tokenizer"]
    model.eval()
    samples = [
        {"prompt": prompt, "temperature": temperature, "seed": 0,
         "text": sample(model, tokenizer, prompt, TEXT_NEW_TOKENS, temperature=temperature, seed=0)}
        for prompt, temperature in TEXT_SAMPLES
    ]  # fmt: skip
    record = {
        "made_by": TEXT_COMMAND,
        "level": TEXT_LEVEL,
        "spec": spec_dict(spec),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "corpus": {
            "name": "pydoc_data.topics",
            "chars": result["corpus_chars"],
            "sha256": result["corpus_sha256"],
        },  # fmt: skip
        "tokenizer_sha256": sha256(tokenizer.to_str().encode()),
        "tokens": result["tokens"],
        "heldout_chars": result["heldout_chars"],
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(result["train_seconds"], 1),
        "losses": [round(x, 4) for x in result["losses"]],
        "heldout": [[step, round(loss, 4)] for step, loss in result["heldout"]],
        "samples": samples,
    }
    out.write_text(json.dumps(record, indent=1) + "\n")


def draw_text_model(data: Path, png: Path) -> None:
    """The training loss of every step (and its 25-step mean) and the held-out loss, per
    token, against the step."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    record = json.loads(data.read_text())
    losses = np.array(record["losses"])
    mean = np.convolve(losses, np.ones(25) / 25, mode="valid")  # the mean of steps s-24..s
    fig = Figure(figsize=(7.5, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot(np.arange(len(losses)), losses, color="C0", alpha=0.3, lw=0.8, label="training batch")
    ax.plot(np.arange(24, len(losses)), mean, color="C0", lw=1.8, label="training, 25-step mean")
    steps, held = zip(*record["heldout"], strict=True)
    ax.plot(steps, held, color="C3", marker="o", lw=1.8, label="held-out text (the last 5%)")
    V = record["spec"]["vocab_size"]
    ax.axhline(math.log(V), color="0.5", ls="--", lw=1, label=f"a uniform guess, ln {V}")
    ax.set_xlabel("step (16 windows of 128 tokens each)")
    ax.set_ylabel("cross-entropy, nats per token")
    ax.set_ylim(0, max(held[0], losses[0]) * 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    ax.set_title(
        f"{record['parameters']:,}-parameter model of Python's help text, {record['level']}, "
        f"{record['train_seconds']:.0f} s on one thread\n"
        f"(Python {record['python']}, torch {record['torch']})",
        fontsize="small",
    )
    fig.savefig(png, dpi=110)


# ----------------------------------------------------------------------------- the registry


# ----------------------------------------------------------------------------- the roofline


def draw_roofline(data: Path, png: Path) -> None:
    """The harness's own roofline plot of a saved real-model run (docs/decoding.md)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.plot import roofline
    from benchmarks.records import read_json

    records = read_json(data)
    stamp = next(r for r in records if r.machine)
    roofline(records, png, title=f"{stamp.machine}; {stamp.date}")


def draw_bench_plot(data: Path, png: Path) -> None:
    """The harness's plot of a saved run, as ``python -m benchmarks.plot RUN.json OUT.png``
    draws it (docs/benchmarks.md)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks import plot

    plot.main([str(data), str(png)])


@dataclass(frozen=True)
class RenderedFigure:
    """A PNG, the committed data it is drawn from, and the function that draws it; for
    data the library computes on the spot, the function that records it."""

    png: Path
    data: Path
    draw: Callable[[Path, Path], None]
    record: Callable[[Path], None] | None = None

    @property
    def sidecar(self) -> Path:
        return self.png.with_suffix(".source")

    def digest(self) -> str:
        """What the sidecar must hold: the data's hash and the drawing function's."""
        code = inspect.getsource(self.draw).encode()
        where = Path(inspect.getsourcefile(self.draw)).name
        return (
            f"data {self.data.relative_to(ROOT)} sha256 {sha256(self.data.read_bytes())}\n"
            f"code {where}:{self.draw.__name__} sha256 {sha256(code)}\n"
        )

    def current(self) -> bool:
        return (
            self.png.is_file()
            and self.sidecar.is_file()
            and self.sidecar.read_text() == self.digest()
        )


def _recorded(name: str) -> RenderedFigure:
    """A figure of ``course_figures``: ``draw_<name>`` from ``docs/data/<name>.json``, which
    ``record_<name>`` writes."""
    return RenderedFigure(
        IMG / f"{name}.png",
        DATA / f"{name}.json",
        getattr(course_figures, f"draw_{name}"),
        getattr(course_figures, f"record_{name}"),
    )


FIGURES = (
    RenderedFigure(IMG / "peak_memory.png", DATA / "cpu_default.json", draw_peak_memory),
    RenderedFigure(IMG / "induction_head.png", DATA / "induction_head.json", draw_induction),
    RenderedFigure(IMG / "roofline.png", DATA / "real_model_cpu.json", draw_roofline),
    RenderedFigure(IMG / "cpu_bench.png", DATA / "cpu_default.json", draw_bench_plot),
    _recorded("attention_shapes"),
    _recorded("rope_pair"),
    _recorded("kv_cache"),
    _recorded("flash_tiles"),
    # The same run's state, row by row: recorded with flash_tiles, drawn apart to be read.
    RenderedFigure(
        IMG / "flash_state.png", DATA / "flash_tiles.json", course_figures.draw_flash_state
    ),
    _recorded("backward_loops"),
    _recorded("model_diagram"),
    _recorded("split_heads"),
    RenderedFigure(IMG / "text_model.png", DATA / "text_model.json", draw_text_model),
    _recorded("speculation"),
    RenderedFigure(
        IMG / "speculative_speedup.png", DATA / "speculative_cpu.json", draw_speculative_speedup
    ),
    _recorded("paged_turns"),
)


def every_figure() -> dict[str, Callable[[Path], None]]:
    """Each figure of the docs (``docs/img/*.png``) by its file name, and how to draw it again,
    to any path: the figures above, and the benchmark plot of the docs' tables (drawn by
    ``doc_tables.py``, with its own sidecar)."""
    from doc_tables import BENCH_JSON, BENCH_PLOT

    found = {figure.png.name: functools.partial(figure.draw, figure.data) for figure in FIGURES}
    found[BENCH_PLOT.name] = functools.partial(draw_bench_plot, BENCH_JSON)
    return found


def smallest_text(draw: Callable[[Path], None]) -> tuple[float, int]:
    """The smallest text a figure draws, in the pixels of its PNG (its font size in points
    at the PNG's dots an inch), and the PNG's width in pixels: the figure drawn again into a
    scratch file, every text noted as matplotlib draws it (tick labels, legends, titles)."""
    import tempfile
    from unittest import mock

    from matplotlib.text import Text
    from PIL import Image

    sizes: list[float] = []
    text_draw = Text.draw

    def noting(text: Text, renderer) -> None:
        if text.get_visible() and text.get_text().strip():
            sizes.append(renderer.points_to_pixels(text.get_fontsize()))
        text_draw(text, renderer)

    with tempfile.TemporaryDirectory() as scratch, mock.patch.object(Text, "draw", noting):
        png = Path(scratch) / "figure.png"
        draw(png)
        with Image.open(png) as image:
            width = image.width
    return min(sizes), width


def main(argv: list[str]) -> int:
    if "--train" in argv:
        train_induction(DATA / "induction_head.json")
        print("retrained: docs/data/induction_head.json")
    if "--train-text" in argv:
        train_text_model(DATA / "text_model.json")
        print("retrained: docs/data/text_model.json")
    for figure in FIGURES:
        if figure.record is not None and ("--record" in argv or not figure.data.is_file()):
            figure.record(figure.data)
            print(f"recorded {figure.data.relative_to(ROOT)}")
    for figure in FIGURES:
        name = figure.png.relative_to(ROOT)
        if figure.current():
            print(f"{name} is current")
            continue
        figure.draw(figure.data, figure.png)
        figure.sidecar.write_text(figure.digest())
        print(f"drew {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
