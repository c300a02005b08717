"""Ctrl-C at any moment of a ``ladder`` command: one line on stderr, exit status 130.

The promise is checked where it breaks: in a real process, signalled as a terminal
signals it (SIGINT to the whole process group, children included), at moments spread
over the command's life: its imports, loading, the first steps, the answer streaming.
The default run sends three signals to ``ladder train`` and ``ladder chat``; the
extended run sends dozens, and interrupts a compile and a server too. What makes each
moment safe (``ladder/interrupts.py``) is tested on its own first, in a child process
each, where the moment can be made to happen on purpose.

The interpreter's own start (before any code of the package runs) is no command's
moment: the signals start after it, at three times its length as measured here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _helpers import pythonpath

ROOT = Path(__file__).resolve().parent.parent


def _child(*argv: str, env: dict | None = None) -> subprocess.Popen:
    """``python *argv`` as a terminal starts it: in a process group of its own (signalled
    whole, as Ctrl-C signals the foreground group), with Ctrl-C's default action even when
    this suite runs as a background job (which inherits SIGINT ignored, as would the
    command, and a command rightly leaves an ignored SIGINT ignored)."""
    return subprocess.Popen(
        [sys.executable, *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath(ROOT), "NO_COLOR": "1", **(env or {})},
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _ctrl_c(process: subprocess.Popen, after_s: float, timeout_s: float = 120):
    """Ctrl-C ``after_s`` seconds into ``process``; -> (exit status, stdout, stderr)."""
    time.sleep(after_s)
    try:
        os.killpg(process.pid, signal.SIGINT)
    except ProcessLookupError:  # it has ended already
        pass
    try:
        out, err = process.communicate(timeout=timeout_s)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    return process.returncode, out, err


# ----------------------------------------------------------------------------- the handler


def _run_child(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``code`` run as ``python -m`` runs a module (as ``python -m ladder`` runs), in a
    child process of its own."""
    (tmp_path / "child.py").write_text(
        "import contextlib, os, signal, sys, time\nfrom ladder import interrupts\n" + code
    )
    process = _child("-m", "child", env={"PYTHONPATH": pythonpath(tmp_path, ROOT)})
    out, err = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.mark.parametrize("handler", ["Python's", "the ladder's"])
def test_an_interrupt_is_never_raised_inside_an_extensions_initialisation(handler, tmp_path):
    """numpy's compiled module imports Python modules while it initialises; a Ctrl-C there
    (sent on purpose, from an import hook) is raised there by Python's handler (triton's
    module, built on nanobind, then aborts the process), and held by the ladder's until the
    initialisation is over. Either way the import is interrupted, and so is the program."""
    result = _run_child(
        f"""
class Raising:  # Python's handler, saying where it raises
    def __call__(self, signum, frame):
        print("raised inside:", interrupts._importing(frame))
        raise KeyboardInterrupt
class Held(interrupts.CtrlC):  # the ladder's, saying the same
    def __call__(self, signum, frame):
        try:
            super().__call__(signum, frame)
        except KeyboardInterrupt:
            print("raised inside:", interrupts._importing(frame))
            raise
class CtrlCInside:  # Ctrl-C as numpy's extension imports numpy.exceptions
    def find_spec(self, name, path, target=None):
        if name == "numpy.exceptions":
            os.kill(os.getpid(), signal.SIGINT)
        return None
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.meta_path.insert(0, CtrlCInside())
with Held() if {handler == "the ladder's"} else contextlib.nullcontext():
    if {handler == "Python's"}:
        signal.signal(signal.SIGINT, Raising())
    try:
        import numpy
        time.sleep(10)
        print("never interrupted")
    except KeyboardInterrupt:
        print("interrupted")
""",
        tmp_path,
    )
    inside = handler == "Python's"
    assert result.stdout == f"raised inside: {inside}\ninterrupted\n", result.stderr
    assert result.returncode == 0


@pytest.mark.parametrize("handler", ["Python's", "the ladder's"])
def test_an_interrupt_inside_a_finalizer_is_not_lost(handler, tmp_path):
    """Python prints an exception raised in a finalizer as "ignored" and goes on: a Ctrl-C
    landing there was lost, and the command ran to its end. The ladder's handler sends it
    again, to land outside, and nothing is printed."""
    result = _run_child(
        f"""
class Finalized:
    def __del__(self):  # Ctrl-C while the object's finalizer runs
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
signal.signal(signal.SIGINT, signal.default_int_handler)
with interrupts.CtrlC() if {handler == "the ladder's"} else contextlib.nullcontext():
    try:
        Finalized()  # dropped at once: its finalizer runs here
        time.sleep(2)
        print("never interrupted")
    except KeyboardInterrupt:
        print("interrupted after the finalizer")
""",
        tmp_path,
    )
    if handler == "Python's":
        assert result.stdout == "never interrupted\n" and "KeyboardInterrupt" in result.stderr
    else:
        assert result.stdout == "interrupted after the finalizer\n" and result.stderr == ""


@pytest.mark.parametrize("forget", [False, True], ids=["as Python leaves it", "forgotten"])
def test_an_interrupt_caught_inside_exec_ends_the_process_by_its_status(forget, tmp_path):
    """CPython 3.11 marks an interrupt raised in code that ``exec`` runs (dataclasses build
    their methods so) as unhandled, caught or not, and at the exit of a module run by
    ``python -m`` kills the process by SIGINT whatever its status; ``forget_unhandled``
    clears the mark. (A CPython that marks only interrupts that end the program exits 3
    either way.)"""
    result = _run_child(
        f"""
try:
    exec("raise KeyboardInterrupt")
except KeyboardInterrupt:
    pass
if {forget}:
    interrupts.forget_unhandled()
sys.exit(3)
""",
        tmp_path,
    )
    marked = sys.version_info < (3, 14)  # where exec sets the mark (measured on 3.11)
    assert result.returncode == (3 if forget or not marked else -signal.SIGINT)


def test_a_ctrl_c_after_the_command_is_done_changes_nothing(tmp_path):
    """Once ``ladder.main`` returns, a Ctrl-C during the interpreter's exit is ignored: the
    command's status stands (Python would have put SIGINT's default action back)."""
    code = "interrupts.finished()\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.2)\n"
    result = _run_child(code + "sys.exit(3)\n", tmp_path)
    assert result.returncode == 3 and result.stderr == ""


def test_a_swallowed_ctrl_c_still_stops_training_at_the_next_step():
    """Python prints and ignores a KeyboardInterrupt raised inside a finalizer; the
    handler remembers the signal, so the training's next step stops the run all the same."""
    from ladder.interrupts import CtrlC

    # Python's own handler, as in a terminal (a suite run as a background job starts with
    # SIGINT ignored, which CtrlC leaves as it is).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with CtrlC() as stop:
            stop.check()  # no signal yet: nothing to raise
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1.0)  # the handler runs at the next bytecode
            except KeyboardInterrupt:
                pass  # swallowed, as a finalizer would
            with pytest.raises(KeyboardInterrupt):
                stop.check()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_ignored_ctrl_c_stays_ignored():
    """Started with SIGINT ignored (``nohup``, a background job), a command keeps it ignored
    rather than installing a handler of its own."""
    from ladder.interrupts import CtrlC

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with CtrlC():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


# ----------------------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def started_s() -> float:
    """Three times the longest of three starts of the interpreter up to the handler's
    module: the moment from which a Ctrl-C is the command's to answer."""
    runs = []
    for _ in range(3):
        start = time.monotonic()
        subprocess.run(
            [sys.executable, "-c", "import ladder.interrupts"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": pythonpath(ROOT)},
            check=True,
        )
        runs.append(time.monotonic() - start)
    return 3 * max(runs)


def _moments(started_s: float, until_s: float, n: int) -> list[float]:
    """``n`` delays spread evenly from ``started_s`` to ``until_s``."""
    step = (until_s - started_s) / max(n - 1, 1)
    return [started_s + i * step for i in range(n)]


def _interrupted(argv: list[str], delays: list[float], own: tuple[str, ...] = ()) -> list[str]:
    """Ctrl-C ``ladder argv`` once per delay, a process each; every one must end with exit
    status 130 and one line on stderr, after the command's own lines if it had printed any
    yet (those starting with ``own``) -> those lines."""
    lines, failures = [], []
    for delay in delays:
        status, _, err = _ctrl_c(_child("-m", "ladder", *argv), delay)
        err_lines = [line for line in err.strip().splitlines() if not line.startswith(own or "\0")]
        if status != 130 or len(err_lines) != 1 or "interrupted" not in err:
            failures.append(f"after {delay:.2f} s: exit {status}, stderr:\n{err[-3000:]}")
        lines.extend(err_lines[-1:])
    assert not failures, f"{len(failures)} of {len(delays)}:\n" + "\n".join(failures)
    return lines


# A run that lasts until it is stopped: imports, the level, the preflight, the steps.
TRAIN = ["train", "seq2seq", "--steps", "100000"]


@pytest.mark.slow
def test_ctrl_c_at_moments_of_training_is_one_line_and_130(started_s, tmp_path):
    path = tmp_path / "run.pt"
    lines = _interrupted([*TRAIN, "--checkpoint", str(path)], _moments(started_s, 4.0, 3))
    for line in lines:  # past the parser, the line names the command and what it kept
        assert line.startswith(("ladder: interrupted", "ladder train: interrupted")), line


# The loops: a dozen moments in CI's extended run, forty for a release (-m manual: the
# counts docs/testing.md quotes). Each moment is a process of its own, about 4 s.
@pytest.mark.parametrize(
    "moments",
    [pytest.param(12, marks=pytest.mark.extended), pytest.param(40, marks=pytest.mark.manual)],
)
def test_ctrl_c_at_many_moments_of_training(moments, started_s, tmp_path):
    delays = _moments(started_s, 6.0, moments)
    _interrupted([*TRAIN, "--checkpoint", str(tmp_path / "run.pt")], delays)


# An answer that streams for longer than any signal waits (up to its 1000 tokens: a minute
# here, greedy), eager, one thread (the suite's).
CHAT = ["chat", "-p", "Write the numbers from 1 to 1000, one per line, with nothing else.",
        "--no-compile", "--threads", "1", "--max-new-tokens", "1000"]  # fmt: skip


@pytest.mark.slow
def test_ctrl_c_at_moments_of_a_chat_is_one_line_and_130(started_s, smollm2_gguf):
    """Imports, loading, then the answer streaming: 130 each time. Cut while it answers,
    the text so far stays printed and the line says the answer is cut (never exit 0,
    which a script reads as a whole answer)."""
    _interrupted(CHAT, _moments(started_s, 3.0, 2))
    process = _child("-m", "ladder", *CHAT)
    first = process.stdout.read(1)  # the answer has begun
    status, out, err = _ctrl_c(process, 0.3)
    (line,) = err.strip().splitlines()
    assert status == 130 and (first + out).strip(), err
    assert line.startswith("ladder chat: interrupted after ") and "of the answer" in line


@pytest.mark.parametrize(
    "moments",
    [pytest.param(8, marks=pytest.mark.extended), pytest.param(24, marks=pytest.mark.manual)],
)
def test_ctrl_c_at_many_moments_of_a_chat(moments, started_s, smollm2_gguf):
    _interrupted(CHAT, _moments(started_s, 10.0, moments))


@pytest.mark.slow
@pytest.mark.slow
def test_ctrl_c_while_a_rung_is_graded_is_one_line_and_130(started_s, tmp_path):
    """``ladder rung test``: while the rung imports, while the suite collects, while it runs
    (the suite runs in the command's own process, and says nothing of a run cut short)."""
    import shutil

    import learner

    learner.new(tmp_path / "rung")
    for path in (ROOT / "docs" / "your_rung").glob("*.py"):  # the course's rung: seconds of tests
        shutil.copy(path, tmp_path / "rung")
    lines = _interrupted(["rung", "test", str(tmp_path / "rung")], _moments(started_s, 5.0, 3))
    assert all(line.startswith(("ladder: interrupted", "ladder rung test: interrupted")) for line in lines), lines  # fmt: skip


def test_an_interrupted_bench_keeps_the_records_of_its_steps_and_says_where(tmp_path):
    """The records are written as each step ends: Ctrl-C after a few keeps them, in a file
    the one line names, and the lines printed so far said what each step measured."""
    from benchmarks.records import read_json

    path = tmp_path / "run.json"
    argv = ["bench", "--quick", "--levels", "1,2", "--scenario", "attention", "--no-peers"]
    process = _child("-m", "ladder", *argv, "--json", str(path))
    steps = []
    while len(steps) < 3:  # the peak and two cases, done
        line = process.stdout.readline()
        assert line, process.communicate()[1]
        steps += [line] if line.startswith("[") else []
    status, _, err = _ctrl_c(process, 0.0)
    (line,) = err.strip().splitlines()
    said = re.fullmatch(
        r"ladder bench: interrupted in step (\d+) of (\d+) \(.+\) after \d+ s; (\d+) "
        r"records? of the steps done written to (.+)",
        line,
    )
    assert status == 130 and said and said[4] == str(path), err
    records = read_json(path)
    assert len(records) == int(said[3]) >= 2  # a record per case done (the peak's comes last)
    assert all(r.ok and r.scenario == "attention fwd" for r in records)
    assert int(said[1]) > len(steps) and int(said[2]) > int(said[1])


@pytest.mark.extended
def test_ctrl_c_while_serving_or_loading_the_server_is_one_line_and_130(started_s, smollm2_gguf):
    """While the model loads, then once it serves (uvicorn's own handler stops it first):
    130 and one line, the server's own lines (its address, a line per request) before it."""
    from serving.launch import free_port

    argv = ["serve", "--no-compile", "--threads", "1", "--quiet", "--port", str(free_port())]
    _interrupted(argv, _moments(started_s, 3.0, 2), own=("serving ",))
    port = free_port()
    process = _child("-m", "ladder", *argv[:-1], str(port))
    deadline = time.monotonic() + 120
    while not _answers(f"http://127.0.0.1:{port}/health"):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.2)
    status, _, err = _ctrl_c(process, 0.0)
    assert status == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"ladder serve: interrupted; stopped serving on http://127.0.0.1:{port}"
    )


def _answers(url: str) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(url, timeout=2).close()
        return True
    except OSError:
        return False


@pytest.mark.extended
@pytest.mark.real_model
def test_ctrl_c_while_compiling_the_decode_step_is_one_line_and_leaves_no_file(
    smollm2_gguf, tmp_path
):
    """A chat compiling its decode step (a cache of its own, whose models are the user's:
    nothing compiled there yet): Ctrl-C a few seconds into the compile (its compiler's
    processes get it too, as in a terminal) ends it with one line and 130, and leaves no
    half-written step, scratch file or note behind."""
    from levels.registry import cache_dir

    for kept in ("models", "unpacked"):  # the pulled file and its unpacked weights, shared
        (tmp_path / kept).symlink_to(cache_dir() / kept, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k != "LADDER_COMPILE"}  # chat's default
    env |= {"LADDER_CACHE": str(tmp_path), "PYTHONPATH": pythonpath(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "ladder", "chat", "-p", "Hi"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    announced = process.stderr.readline()  # the compile starts after it
    status, _, err = _ctrl_c(process, 5.0)
    assert announced.startswith("compiling the decode step of smollm2-135m for context 2048")
    assert status == 130 and err.strip() == "ladder chat: interrupted", err
    assert list((tmp_path / "compiled").glob("*")) == []


@pytest.mark.extended  # torchrun and two ranks started, then stopped: about 15 s
def test_ctrl_c_during_training_on_two_processes_is_one_line_and_leaves_no_process(tmp_path):
    """torchrun and its ranks say nothing of their own: rank 0's line (where the run
    stopped) comes out of the launcher, once, and every process is gone with it."""
    path = tmp_path / "run.pt"
    process = _child("-m", "ladder", *TRAIN, "--nproc", "2", "--checkpoint", str(path))
    assert process.stdout.readline().startswith("training level2_torch_manual seq2seq")
    status, _, err = _ctrl_c(process, 3.0)
    (line,) = err.strip().splitlines()
    assert status == 130 and line.startswith("ladder train: interrupted "), err
    assert str(path) in line  # rank 0's own words: the checkpoint (or none yet) at its step
    left = [p for p in Path("/proc").glob("[0-9]*") if str(path).encode() in _cmdline(p)]
    assert left == [], "processes left behind"


def _cmdline(process: Path) -> bytes:
    try:
        return (process / "cmdline").read_bytes()
    except OSError:  # ended meanwhile
        return b""
