"""Every command the README and the docs show runs as shown, or says why not.

A page's ```` ```bash ```` blocks are read a line at a time: a line is one
command (a line ending in ``\\`` continues on the next), a trailing ``# ...``
is the reader's note and not part of it, and a line that is only a comment is
prose. ``COMMANDS`` says, page by page and in the page's order, how each one
is checked:

* ``run()``: run as shown, in the default suite; ``run(extended=True)``: in
  the extended run (``pytest -m extended``), for the ones that take minutes;
  ``run(manual=True)``: only in the run a release gets (``pytest -m manual
  tests/test_commands.py``, an hour on 2 cores), for the benchmark runs and
  the 600-step trainings, whose code CI runs in a shorter form named beside
  them. CI's 20 minutes cannot hold them.
  The commands of a page run in the page's order, in one temporary working
  directory (so a ``ladder train`` writes the checkpoint the next command
  reads there), with ``LADDER_CACHE`` at the user's cache, where the real
  models are pulled once. The default run runs a page's default commands, the
  extended run its default and extended ones, and the manual run goes through
  the page as a reader does, every command that runs here, in order.
* ``Same(page)``: the same command, run on that page; it reads nothing the
  page's earlier commands wrote, so once is enough.
* ``Collect(...)``: a ``python -m pytest`` line. Its selection is collected
  (``--collect-only``) and checked against what the page says it selects,
  rather than the suite running itself.
* ``Elsewhere(where, why)``: what CI runs already, the same work named by its
  test (or by ``.ci/run``'s own line), which must exist.
* ``Absent(why)``: what this machine lacks (a CUDA device), or what CI's own
  set-up runs (``pip install``).

A command on a page that ``COMMANDS`` does not list, or one it lists that the
page no longer shows, fails ``test_every_command_is_accounted_for``: a new
command gets its line here. Each subprocess is run with a timeout, the
environment's own ``ladder``, ``python`` and ``pytest`` first on ``PATH``, and
a failure shows the command, its exit status and its output.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_blocks import ROOT, blocks

PAGES = [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]
SHELL = "bash"  # the one language of commands to run; another one is refused (ANOTHER_SHELL)
ANOTHER_SHELL = ("sh", "shell", "console", "zsh", "shell-session")

# ----------------------------------------------------------------------------- how a command is checked

# Timeouts, in seconds: each about four times what the command took on a shared 2-core
# machine (load average 2), so a slow day passes and a hang still ends.
FAST = 60  # ladder show, pull of a cached model: about 1 s (imports)
MODEL = 240  # a real model at level 1 to 3: 20 to 30 s, most of it reading the GGUF file
TRAIN = 600  # a 600-step training run: 100 s; preflight at level 4 (Triton's interpreter): 270 s
BENCH = 1500  # the full ladder bench: 5 minutes on 2 idle cores


@dataclass(frozen=True)
class Run:
    """Run as shown: in the default suite, or in the extended run only."""

    timeout: float  # seconds
    extended: bool = False
    manual: bool = False  # the release run only (implies extended); the comment says what CI runs
    stdin: str | None = None  # what the user types (an interactive command)
    expect: str = ""  # text its output must hold
    expect_err: str = ""  # text its stderr must hold (a warning the page promises)
    model: str = ""  # the real model it runs, pulled first (or the test skipped, as conftest's)
    real_model_memory: bool = False  # gigabytes of a real model (level 0): CI's real-model run
    at_root: bool = False  # it names the repository's files (benchmarks/): run at the root


def run(timeout: float = FAST, **kwargs) -> Run:
    if kwargs.get("manual"):
        kwargs["extended"] = True
    return Run(timeout, **kwargs)


TIERS = ("default", "extended", "manual")


def _tier(check: Run) -> int:
    return 2 if check.manual else 1 if check.extended else 0


SMOL, GEMMA = {"model": "smollm2-135m"}, {"model": "gemma3-270m"}
FIXTURES = {"smollm2-135m": "smollm2_gguf", "gemma3-270m": "gemma3_gguf"}  # tests/conftest.py


@dataclass(frozen=True)
class Same:
    """The same command, checked on ``page``."""

    page: str


@dataclass(frozen=True)
class Collect:
    """A ``pytest`` line: what it collects must pass ``check`` (a test id per item)."""

    claim: str  # what the page says it selects
    check: Callable[[list[str]], bool]
    cuda: bool = False  # needs a CUDA device to collect at all (--device cuda)


@dataclass(frozen=True)
class Elsewhere:
    """The same work, run by CI: ``where`` is a test (``path::name``) or ``.ci/run``."""

    where: str
    why: str


@dataclass(frozen=True)
class Absent:
    """Not run here, for a reason that is a real absence."""

    why: str


Check = Run | Same | Collect | Elsewhere | Absent

SETUP = Absent("CI's own set-up runs it (.ci/run), in a fresh virtual environment")
CUDA = Absent("needs a CUDA device (benchmarks/gpu_check.sh runs the GPU steps on one)")
PARALLEL = "tests/test_parallel.py::test_two_processes_follow_the_single_process_loss_curve"
DDP = Elsewhere(
    PARALLEL,
    "the same command with --quick --steps 30, its loss curve held to one process's, in the "
    "default suite (the 600-step run takes minutes)",
)
FSDP = Elsewhere(PARALLEL, "as for DDP, with --fsdp (the fsdp2 case)")
LEVELS = (
    "level0_loops",
    "level1_numpy",
    "level2_torch_manual",
    "level3_sdpa_flash",
    "level4_triton_kernel",
)


def _in_file(name: str) -> Callable[[list[str]], bool]:
    return lambda ids: bool(ids) and all(i.startswith(f"{name}::") for i in ids)


def _has(*parts: str) -> Callable[[list[str]], bool]:
    return lambda ids: all(any(p in i for i in ids) for p in parts)


def _lacks(*parts: str) -> Callable[[list[str]], bool]:
    return lambda ids: bool(ids) and not any(p in i for p in parts for i in ids)


# A file of the default run only: none of its cases is extended, real_model or manual (level
# 4's interpreted cases of other files may be extended: tests/conftest.py).
DEFAULT_ONLY = "tests/test_attention.py::"


def _both(*checks: Callable[[list[str]], bool]) -> Callable[[list[str]], bool]:
    return lambda ids: all(check(ids) for check in checks)


# A server runs until stopped: the tests start it on a free port and talk to it.
SERVE = Elsewhere(
    "tests/test_serve.py::test_chat_answers_as_ladder_chat_does",
    "ladder serve on a free port, asked with the openai client",
)
SERVE_CURL = Elsewhere(
    "tests/test_serve.py::test_streaming_gives_the_same_text_and_the_usage_last",
    "the same stream, read by the openai client",
)

SERVE_GREEDY = Elsewhere(
    "tests/test_serve.py::test_chat_answers_as_ladder_chat_does",
    "the same question at temperature 0 through the openai client: ladder chat's greedy "
    "answer (and test_a_request_without_a_temperature_samples_at_openai_s_default_of_1)",
)
SERVE_SCHEMA = Elsewhere(
    "tests/test_serve_structured.py::test_a_chat_answer_follows_its_schema_whole_and_streamed",
    "the same schema asked of ladder serve on a free port, whole and streamed (extended)",
)

SERVE_OPENAI_1 = Elsewhere(
    "tests/test_serve_openai.py::test_echo_scores_the_prompt_the_first_token_null",
    "the same prompt echoed with logprobs, asked of ladder serve on a free port",
)
SERVE_OPENAI_2 = Elsewhere(
    "tests/test_serve_openai.py::test_a_prompt_as_text_as_ids_or_in_a_list_answers_alike",
    "prompts as ids and in a list, scored with max_tokens 0, asked of ladder serve on a free port",
)
SERVE_OPENAI_3 = Elsewhere(
    "tests/test_serve_openai.py::test_chat_logprobs_stream_as_they_answer_whole",
    "chat's logprobs and top_logprobs, whole and streamed, asked of ladder serve on a free port",
)
SERVE_OPENAI_4 = Elsewhere(
    "tests/test_serve_openai.py::test_logit_bias_forces_or_bans_and_a_penalty_breaks_a_repetition",
    "logit_bias and a frequency penalty (n: test_n_choices_share_the_prompt_and_a_seed_repeats_each), asked of ladder serve on a free port",
)

SERVE_TOOLS = Elsewhere(
    "tests/test_serve_openai.py::test_a_required_call_s_arguments_always_validate",
    "the same function required of ladder serve on a free port, 8 seeds (50 extended)",
)

# --speculate ngram where it pays: the answer copies the prompt (README.md, docs/speculative.md).
GROUNDED = 'ladder chat -p "$(cat examples/rewrite.txt)" --speculate ngram'

EXTENDED_TESTS = ("tests/test_real_gemma.py::", "test_the_whole_matrix_compiles_for")

COMMANDS: dict[str, list[tuple[str, Check]]] = {
    "README.md": [
        ("pip install torch==2.13.0", SETUP),
        ('pip install -e ".[dev,triton]"', SETUP),
        ('ladder chat -p "What is the capital of France?"', run(MODEL, expect="Paris", **SMOL)),
        ('ladder chat -p "What is the capital of France?" --level 1', run(MODEL, extended=True, expect="Paris", **SMOL)),
        # Level 0 holds the model as 6.6 GB of Python floats, and takes 90 s.
        ('ladder chat --level 0 --max-new-tokens 3 -p "Hi"', run(TRAIN, extended=True, real_model_memory=True, expect_err="level 0 computes in pure Python", **SMOL)),
        ("ladder chat", run(MODEL, extended=True, stdin="What is the capital of France?\n/quit\n", expect="Paris", **SMOL)),
        ("ladder bench", Same("docs/benchmarks.md")),
        ("python -m pytest", Same("docs/testing.md")),
        ("ladder show attention", run()),
        ("ladder bench --quick --scenario generate", run(TRAIN, manual=True)),  # CI: test_benchmarks_cli's tiny run
        ("ladder train seq2seq --task reverse --checkpoint runs/reverse.pt", run(TRAIN, extended=True)),
        ("ladder train seq2seq --task reverse --nproc 2", DDP),
        ("ladder preflight seq2seq", run()),
        ("ladder pull gemma3-270m", run(MODEL, extended=True, **GEMMA)),  # 253 MB, once
        ('ladder generate -p "The capital of France is" --level 2', run(MODEL, extended=True, expect="Paris", **SMOL)),
        ('ladder generate --model runs/reverse.pt --input "5 9 4 7"', run(MODEL, extended=True, expect="5 9 4 7 -> 7 4 9 5")),
        ("ladder serve", SERVE),
        ("ladder docs", Elsewhere(
            "tests/test_site.py::test_ladder_docs_serves_the_site_on_loopback",
            "ladder docs on a free port, its pages fetched, stopped by Ctrl-C",
        )),  # fmt: skip
        # The repository's schema (examples/), from the repository's root: a fresh clone's.
        ('ladder chat -p "A person, as JSON" --json-schema examples/person.json', run(MODEL, at_root=True, expect='"age":', **SMOL)),
        # 224 tokens speculated, eager (the suite's LADDER_COMPILE=0): a minute or two.
        (GROUNDED, run(TRAIN, extended=True, at_root=True, expect="def summarize", expect_err="speculated:", **SMOL)),
        ("ladder rung new myrung", Same("docs/your_rung.md")),
        ('curl http://127.0.0.1:8000/v1/chat/completions -H "Content-Type: application/json" -d \'{"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0}\'', SERVE_GREEDY),
    ],
    "docs/speculative.md": [
        (GROUNDED, Same("README.md")),
    ],
    "docs/serving.md": [
        ("ladder serve", SERVE),
        ('curl http://127.0.0.1:8000/v1/chat/completions -H "Content-Type: application/json" -d \'{\n  "messages": [{"role": "user", "content": "Give me a person as JSON"}], "temperature": 0,\n  "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": {\n    "type": "object",\n    "properties": {"name": {"type": "string", "maxLength": 20},\n                   "age": {"type": "integer", "minimum": 0, "maximum": 150}},\n    "required": ["name", "age"]}}}}\'', SERVE_SCHEMA),
    ],
    "docs/serving_reference.md": [
        ("ladder serve", SERVE),
        ('curl -N http://127.0.0.1:8000/v1/chat/completions -H "Content-Type: application/json" -d \'{\n  "model": "smollm2-135m",\n  "messages": [{"role": "user", "content": "What is the capital of France?"}],\n  "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}\'', SERVE_CURL),
        ('curl http://127.0.0.1:8000/v1/completions -H "Content-Type: application/json" -d \'{\n  "prompt": "The capital of France is", "max_tokens": 2, "temperature": 0,\n  "echo": true, "logprobs": 2}\'', SERVE_OPENAI_1),
        ('curl http://127.0.0.1:8000/v1/completions -H "Content-Type: application/json" -d \'{\n  "prompt": [[504, 3575, 282, 4649, 314], "Paris is"], "max_tokens": 0,\n  "echo": true, "logprobs": 0}\'', SERVE_OPENAI_2),
        ('curl http://127.0.0.1:8000/v1/chat/completions -H "Content-Type: application/json" -d \'{\n  "messages": [{"role": "user", "content": "What is the capital of France?"}],\n  "temperature": 0, "max_tokens": 2, "logprobs": true, "top_logprobs": 2}\'', SERVE_OPENAI_3),
        ('curl http://127.0.0.1:8000/v1/chat/completions -H "Content-Type: application/json" -d \'{\n  "messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 4,\n  "n": 2, "seed": 7, "frequency_penalty": 0.5, "logit_bias": {"2": -100}}\'', SERVE_OPENAI_4),
        ('curl http://127.0.0.1:8000/v1/chat/completions -H "Content-Type: application/json" -d \'{\n  "messages": [{"role": "user", "content": "What is the weather in Paris?"}],\n  "temperature": 0, "tool_choice": "required",\n  "tools": [{"type": "function", "function": {"name": "get_weather",\n    "description": "The weather in a city", "parameters": {"type": "object",\n    "properties": {"city": {"type": "string", "maxLength": 30},\n                   "unit": {"enum": ["celsius", "fahrenheit"]}},\n    "required": ["city", "unit"]}}}]}\'', SERVE_TOOLS),
    ],
    "docs/benchmarks.md": [
        ("ladder bench", run(BENCH, manual=True)),  # CI: the --quick run below, every scenario smaller
        ("ladder bench --quick", run(TRAIN, manual=True)),  # CI: the same run, two lines below, with its files
        ("ladder bench --levels 2,3 --scenario attention --seq-lens 256,1024,4096", run(TRAIN, extended=True)),
        ("ladder bench --quick --json run.json --plot run.png", run(TRAIN, manual=True)),  # CI: test_benchmarks_cli's tiny run
        ("ladder bench --device cuda", CUDA),
        ("python -m benchmarks.plot run.json run.png", run(manual=True)),  # reads the run above
        ("pytest benchmarks/ --benchmark-only", run(BENCH, manual=True, at_root=True)),  # CI: --benchmark-disable
        ("pytest benchmarks/ --benchmark-disable -q", Elsewhere(".ci/run", "python -m pytest -q benchmarks/ --benchmark-disable")),
    ],
    "docs/beyond_one_device.md": [
        ("ladder train seq2seq --task reverse --nproc 2", DDP),
        ("ladder train seq2seq --task reverse --nproc 2 --fsdp", FSDP),
        ("torchrun --standalone --nproc_per_node 2 -m ladder train seq2seq --task reverse", run(TRAIN, manual=True)),  # CI: DDP's 30 steps
    ],
    "docs/checkpoints.md": [
        ('ladder chat -p "What is the capital of France?"', Same("README.md")),
        ("ladder chat", Same("README.md")),
        ('ladder chat --level 1 --temperature 0 -p "Name three colours."', run(MODEL, extended=True, **SMOL)),
        ('ladder chat --system "Answer in French." -p "What is the capital of France?"', run(MODEL, extended=True, **SMOL)),
        ('ladder generate -p "The capital of France is" --max-new-tokens 8 --level 2', run(MODEL, extended=True, expect="Paris", **SMOL)),
        ('ladder generate --model gemma3-270m -p "The capital of France is" --level 3', run(MODEL, extended=True, **GEMMA)),
        ("ladder pull", run(**SMOL)),
        ("ladder pull gemma3-270m", run(MODEL, extended=True, **GEMMA)),
        ("ladder pull --list", run(expect="smollm2-135m")),
    ],
    "docs/index.md": [
        ("ladder show", run()),
        ("ladder show attention", run()),
        ("ladder show kv_cache --levels 2,3", run()),
    ],
    "docs/appendix.md": [
        ("ladder check", Elsewhere("tests/test_level4_compile.py::test_the_whole_matrix_compiles_for", "the whole matrix, a test per target, in CI's extended run (six core-minutes a target)")),
        ("ladder check --kernel forward --dtype float32 --target sm_80", run(TRAIN, extended=True)),
    ],
    "docs/testing.md": [
        ("python -m pytest", Collect("every level, all but the extended checks", _both(_has(*LEVELS), _lacks(*EXTENDED_TESTS)))),
        ("python -m pytest -m extended", Collect("the compile matrix, real models at every level", _both(_has(*EXTENDED_TESTS, "test_slow_levels_on_a_short_prompt[level0_loops"), _lacks(DEFAULT_ONLY)))),
        ("python -m pytest -m real_model", Collect("the real models, extended or not", _both(_has("tests/test_real_gemma.py::", "tests/test_real_models.py::"), _lacks(DEFAULT_ONLY)))),
        ("python -m pytest -m manual", Collect("every command the docs show, and Gemma at level 0", _both(_has("test_every_command_runs_in_the_release_run", "tests/test_real_gemma.py::test_slow_levels_on_a_short_prompt[level0_loops"), _lacks(DEFAULT_ONLY, "level4_triton_kernel")))),
        ("python -m pytest -k level3_sdpa_flash", Collect("one level", lambda ids: bool(ids) and all("level3_sdpa_flash" in i for i in ids))),
        ("python -m pytest tests/test_properties.py", Collect("one family of checks", _in_file("tests/test_properties.py"))),
        ("python -m pytest tests/test_docs.py", Collect("the docs", _in_file("tests/test_docs.py"))),
        ("python -m pytest tests/test_docs_course.py", Collect("the course", _in_file("tests/test_docs_course.py"))),
        ("python -m pytest --device cuda", Collect("float16 and bfloat16 on a GPU", _has("float16", "bfloat16"), cuda=True)),
        ('python -m pytest -m "not slow"', Collect("without the longer checks", _lacks("tests/test_parallel.py::"))),
    ],
    "docs/your_rung.md": [
        ("ladder rung new myrung", run(expect="a rung in myrung")),
        ("ladder rung test myrung", Elsewhere("tests/test_rung.py::test_an_untouched_scaffold_has_every_stage_not_written_and_fails", "the untouched package, which exits 1 (a stage not written)")),
        ("python -m pytest --rung myrung", Elsewhere("tests/test_rung.py::test_bad_answers_are_one_line_each_naming_the_stage_and_the_case", "as a learner runs it, in a process of its own")),
        ("ladder bench --rung myrung --quick", Elsewhere("tests/test_rung.py::test_the_bench_times_a_rung_beside_the_levels_once_it_is_right", "the same harness at one size, level 1 beside it")),
    ],
    "docs/text_model.md": [
        ("python docs/tools/figures.py --train-text", Elsewhere("tests/test_docs_course.py::test_the_text_model_data_is_what_training_gives", "the same training, compared with the committed run, in CI's extended run")),
    ],
    "docs/training.md": [
        ("ladder train seq2seq --task reverse --level level2_torch_manual --json reverse.json --plot reverse.png", run(TRAIN, manual=True)),
        ("ladder train seq2seq --task copy --level 2", run(TRAIN, manual=True)),
        ("ladder train decoder-only --level 3 --checkpoint runs/cycle.pt", run(TRAIN, manual=True)),
        ("ladder train decoder-only --level 3 --checkpoint runs/cycle.pt --resume", run(TRAIN, manual=True, expect="nothing to resume")),
        ("ladder preflight seq2seq --task copy --level 4", run(TRAIN, manual=True)),
        ("ladder train seq2seq --quick --level 1", run(TRAIN, extended=True)),
        ("ladder train seq2seq --task reverse --nproc 2", DDP),
        ("ladder train seq2seq --task reverse --nproc 2 --fsdp", FSDP),
        ("ladder train seq2seq --task reverse --checkpoint runs/reverse.pt", run(TRAIN, manual=True)),
        ('ladder generate --checkpoint runs/reverse.pt --input "5 9 4 7" --level 3', run(MODEL, manual=True, expect="5 9 4 7 -> 7 4 9 5")),
    ],
}  # fmt: skip


# ----------------------------------------------------------------------------- reading the pages


def _read(line: str, quote: str | None = None) -> tuple[str, str | None]:
    """``line`` up to its first ``#`` outside quotes that starts a word (as the shell reads
    it), and the quote still open at its end; ``quote``: the one open at its start."""
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), None
    return line.rstrip(), quote


def _shell_lines(text: str) -> list[str]:
    """``text``'s commands a line each, as the shell reads them: a line ending in ``\\``
    continues on the next, and so does a quote left open (a JSON body written over several
    lines keeps its newlines); notes after ``#`` are left out."""
    text = re.sub(r"\s*\\\n\s*", " ", text)  # continued lines are one command
    found, held, quote = [], [], None
    for line in text.splitlines():
        read, quote = _read(line, quote)
        held.append(read)
        if quote is None:
            found.append("\n".join(held))
            held = []
    return found + ["\n".join(held)] * bool(held)


def commands(page: Path) -> list[str]:
    """The commands of ``page``'s bash blocks, in order."""
    found = []
    for block in blocks(page):
        if block.lang in ANOTHER_SHELL:
            raise ValueError(f"{page}:{block.line}: write ```{SHELL} for commands (they run)")
        if block.lang != SHELL:
            continue
        found += [c for c in _shell_lines(block.text) if c.strip()]
    return found


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


# ----------------------------------------------------------------------------- running one


def _environment() -> dict[str, str]:
    """This environment's commands first on PATH, the user's model cache, no pytest state."""
    from levels import registry

    here = Path(sys.executable).parent
    missing = [s for s in ("ladder", "pytest", "torchrun") if not (here / s).exists()]
    assert not missing, (
        f"{', '.join(missing)} not installed beside {sys.executable}: pip install -e '.[dev]'"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PATH"] = f"{here}{os.pathsep}{env.get('PATH', '')}"
    env["LADDER_CACHE"] = str(registry.cache_dir().resolve())
    return env


def shell(command: str, cwd: Path, timeout: float, stdin: str | None = None):
    """``command`` in bash at ``cwd``: -> ``(status, stdout, stderr)``. Past ``timeout``, the
    command and every process it started (torchrun's workers) are killed."""
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env=_environment(),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, to end it whole
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"`{command}` ran past its {timeout:.0f} s\n{_tail(out, err)}")
    return proc.returncode, out, err


def _tail(out: str, err: str) -> str:
    return f"--- stderr (the end)\n{err[-3000:]}\n--- stdout (the end)\n{out[-1500:]}"


def _run_page(page: str, tmp_path: Path, request, *, tier: str) -> None:
    """The page's commands that run in ``tier`` or a shorter one, in order, in one folder."""
    ran = 0
    for command, check in COMMANDS[page]:
        if not isinstance(check, Run) or _tier(check) > TIERS.index(tier):
            continue
        if check.model:
            request.getfixturevalue(FIXTURES[check.model])
        status, out, err = shell(
            command, ROOT if check.at_root else tmp_path, check.timeout, check.stdin
        )
        assert status == 0, f"{page}: `{command}` exited {status}\n{_tail(out, err)}"
        assert check.expect in out, (
            f"{page}: `{command}` printed no {check.expect!r}\n{_tail(out, err)}"
        )
        assert check.expect_err in err, (
            f"{page}: `{command}` warned no {check.expect_err!r}\n{_tail(out, err)}"
        )
        ran += 1
    assert ran, f"{page}: nothing ran"


# ----------------------------------------------------------------------------- the tests


def test_every_command_is_accounted_for():
    """The table lists each page's commands exactly, in the page's order."""
    problems = []
    for page in PAGES:
        shown, listed = commands(page), [c for c, _ in COMMANDS.get(_name(page), [])]
        if shown != listed:
            new = [c for c in shown if c not in listed]
            gone = [c for c in listed if c not in shown]
            problems.append(
                f"{_name(page)}: not in COMMANDS: {new}; in COMMANDS, not on the page: {gone}"
                + ("" if new or gone else "; the order differs")
            )
    assert not set(COMMANDS) - {_name(p) for p in PAGES}, "COMMANDS names a page that is gone"
    assert not problems, "\n".join(problems)


def test_a_commands_note_and_continued_lines_are_read_as_the_shell_reads_them(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\n# a note on its own line\nladder show   # the levels\n"
        'ladder chat -p "a # in quotes" \\\n   --level 1\n```\n\n```python\nprint(1)\n```\n'
    )
    assert commands(page) == ["ladder show", 'ladder chat -p "a # in quotes" --level 1']
    # A quote left open at the end of a line holds the next lines (a JSON body), newlines kept.
    page.write_text('```bash\ncurl -d \'{\n  "a": 1,\n  "b": "#2"}\'  # a note\nladder show\n```\n')
    assert commands(page) == ['curl -d \'{\n  "a": 1,\n  "b": "#2"}\'', "ladder show"]
    page.write_text("```console\n$ ladder show\n```\n")
    with pytest.raises(ValueError, match="write ```bash"):
        commands(page)


# A command's argument that names a file or a folder: a path with a folder or a file's suffix.
PATH = re.compile(r"[\w.-]*(/[\w.-]*)+|[\w.-]+\.(json|pt|png|gguf|py|md|toml|yml|txt)")
# The flags whose file a command writes (``ladder generate --checkpoint X`` reads X).
WRITES = {
    "train": ("--checkpoint", "--json", "--plot"),
    "bench": ("--json", "--plot", "--roofline"),
}


def _tracked() -> set[str] | None:
    """The files of a fresh clone (git's index), or None outside a git checkout."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    return set(listed.stdout.splitlines()) if listed.returncode == 0 else None


def _in_clone(path: str, tracked: set[str] | None) -> bool:
    if tracked is None:
        return (ROOT / path).exists()
    folder = path.rstrip("/") + "/"
    return path in tracked or any(f.startswith(folder) for f in tracked)


def test_every_file_a_command_names_is_in_a_fresh_clone():
    """Whatever runs it (a test here, CI, or nothing), a command a reader copies finds the
    files it names: each is in the repository, or written by the command itself (``--json
    X``), or named by a command above it on the page (``ladder train --checkpoint X``, then
    ``ladder generate --model X``)."""
    import shlex

    tracked, missing = _tracked(), []
    for page in PAGES:
        earlier: set[str] = set()
        for command in commands(page):
            words = shlex.split(command)
            writes = WRITES.get(words[1], ()) if words[0] == "ladder" else ()
            written = {
                after for flag, after in zip(words, words[1:], strict=False) if flag in writes
            }
            named = [w for w in words if not w.startswith("-") and "://" not in w]
            named += re.findall(r"\$\(cat ([^)\s]+)\)", command)  # a file read into an argument
            for word in named:
                if PATH.fullmatch(word) and word not in earlier | written:
                    if not _in_clone(word, tracked):
                        missing.append(f"{_name(page)}: `{command}` names {word}")
            earlier |= set(words)
    assert not missing, "files not in the repository:\n" + "\n".join(missing)


def test_what_the_table_points_to_exists():
    """A ``Same`` page runs that command; an ``Elsewhere`` test or CI line exists."""
    ci = (ROOT / ".ci" / "run").read_text()
    for page, rows in COMMANDS.items():
        for command, check in rows:
            if isinstance(check, Same):
                there = dict(COMMANDS[check.page]).get(command)
                assert isinstance(there, Run | Collect), (
                    f"{page}: `{command}` is not run on {check.page}"
                )
            elif isinstance(check, Elsewhere) and check.where == ".ci/run":
                assert check.why in ci, f"{page}: .ci/run no longer runs `{check.why}`"
            elif isinstance(check, Elsewhere):
                path, _, name = check.where.partition("::")
                tree = ast.parse((ROOT / path).read_text())
                names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
                assert name in names, f"{page}: `{command}`: {check.where} does not exist"


def _pages(tier: str) -> list:
    """The pages with a command in ``tier``, marked for the run that holds it."""
    found = []
    for page, rows in COMMANDS.items():
        runs = [c for _, c in rows if isinstance(c, Run)]
        if not any(_tier(c) == TIERS.index(tier) for c in runs):
            continue
        marks = {"default": [], "extended": [pytest.mark.extended], "manual": [pytest.mark.manual]}
        marks = marks[tier]
        if tier != "default" and any(
            c.real_model_memory for c in runs if _tier(c) <= TIERS.index(tier)
        ):
            marks.append(pytest.mark.real_model)
        found.append(pytest.param(page, marks=marks))
    return found


@pytest.mark.parametrize("page", _pages("default"))
def test_the_commands_run(page, tmp_path, request):
    _run_page(page, tmp_path, request, tier="default")


@pytest.mark.parametrize("page", _pages("extended"))
def test_the_commands_run_in_the_extended_run(page, tmp_path, request):
    _run_page(page, tmp_path, request, tier="extended")


@pytest.mark.parametrize("page", _pages("manual"))
def test_every_command_runs_in_the_release_run(page, tmp_path, request):
    _run_page(page, tmp_path, request, tier="manual")


COLLECTS = [
    (p, c) for p, rows in COMMANDS.items() for c, check in rows if isinstance(check, Collect)
]


@pytest.mark.extended  # 25 s or more each: a collection of the whole suite imports every peer
@pytest.mark.parametrize(("page", "command"), COLLECTS, ids=[c for _, c in COLLECTS])
def test_a_pytest_line_selects_what_its_page_says(page, command):
    check = dict(COMMANDS[page])[command]
    if check.cuda:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
    status, out, err = shell(f"{command} --collect-only -q", ROOT, timeout=MODEL)
    assert status == 0, f"`{command} --collect-only -q` exited {status}\n{_tail(out, err)}"
    ids = [line for line in out.splitlines() if "::" in line]
    assert check.check(ids), f"{page}: `{command}` collects {len(ids)} tests, not {check.claim}"
