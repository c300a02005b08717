"""The ``ladder`` command answers every misuse with one line and a non-zero exit.

Most cases call ``ladder.cli.main`` in this process (what the console
script runs) and read its exit status and stderr; a few run ``ladder`` as a
subprocess, where only a real process shows the behaviour: Ctrl-C, and a
machine without triton. Every refused command must leave the files it was
given as they were.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _helpers import pythonpath

from lab.checkpoint import save_checkpoint
from ladder.cli import main as ladder

ROOT = Path(__file__).resolve().parent.parent


def one_line(capsys, code: int, argv: list[str], match: str) -> str:
    """Run ``ladder argv``: exit status ``code``, one line on stderr containing ``match``."""
    assert ladder(argv) == code
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, f"expected one line, got:\n{err}"
    assert match in err, err
    assert "Traceback" not in err
    return err


USAGE = {
    "bench --device tpu": (["bench", "--device", "tpu"], "device must be cpu, cuda or cuda:N"),
    "bench --threads -3": (["bench", "--threads", "-3"], "--threads: must be at least 1, got -3"),
    "bench --threads 0": (["bench", "--threads", "0"], "--threads: must be at least 1, got 0"),
    "bench --levels 7": (["bench", "--levels", "7"], "unknown level '7'"),
    "bench flag typo": (["bench", "--quik"], "ladder bench: error: unrecognized arguments: --quik"),
    "train --seed -1": (["train", "seq2seq", "--seed", "-1"], "--seed: must be at least 0"),
    "train --steps 0": (["train", "seq2seq", "--steps", "0"], "--steps: must be at least 1, got 0"),
    "train --steps -5": (["train", "seq2seq", "--steps", "-5"], "--steps: must be at least 1"),
    "train flag typo": (["train", "seq2seq", "--setps", "3"], "ladder train: error: unrecognized"),
    "train unknown kind": (["train", "encoder-only"], "invalid choice: 'encoder-only'"),
    "train level 0": (["train", "seq2seq", "--level", "0"], "level0_loops computes no gradients"),
    "train wrong task": (["train", "decoder-only", "--task", "reverse"], "decoder-only"),
    "resume without path": (["train", "seq2seq", "--resume"], "--resume needs --checkpoint"),
    "bench plot nothing": (
        ["bench", "--scenario", "generate", "--plot", "x.png"],
        "--plot draws the scenarios swept over T",
    ),
    "generate no input": (["generate", "--checkpoint", "x.pt"], "--input"),
    "show unknown piece": (["show", "ffn"], "invalid choice: 'ffn'"),
    # A port outside 1-65535 is refused before the model loads, never by the socket after.
    "serve --port 70000": (
        ["serve", "--port", "70000"],
        "--port: must be at most 65535, got 70000",
    ),
    "serve --port 65536": (
        ["serve", "--port", "65536"],
        "--port: must be at most 65535, got 65536",
    ),
    "serve --port 0": (["serve", "--port", "0"], "--port: must be at least 1, got 0"),
    "serve --port -1": (["serve", "--port", "-1"], "--port: must be at least 1, got -1"),
}


@pytest.mark.parametrize("misuse", list(USAGE))
def test_usage_errors_are_one_line_and_exit_2(capsys, misuse):
    argv, match = USAGE[misuse]
    one_line(capsys, 2, argv, match)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a CPU-only machine")
def test_cuda_on_a_cpu_only_torch(capsys):
    one_line(capsys, 2, ["train", "seq2seq", "--device", "cuda"], "torch sees no CUDA device")
    one_line(capsys, 2, ["bench", "--device", "cuda:1"], "torch sees no CUDA device")


def test_output_paths_are_checked_before_any_work(capsys, tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("keep me")
    under_a_file = str(a_file / "x.json")
    for argv in (
        ["bench", "--quick", "--json", under_a_file],
        ["bench", "--quick", "--plot", str(tmp_path)],  # a directory
        ["train", "seq2seq", "--json", under_a_file],
        ["train", "seq2seq", "--plot", under_a_file],
        ["train", "seq2seq", "--checkpoint", under_a_file],
    ):
        start = time.perf_counter()
        one_line(capsys, 2, argv, "ladder")
        assert time.perf_counter() - start < 5, "refused only after the work"
    assert a_file.read_text() == "keep me"
    # A missing folder is created (as before any save), not refused.
    assert ladder(["bench", "--scenario", "varlen", "--levels", "1", "--quick", "--no-progress",
                   "--no-peers", "--json", str(tmp_path / "new" / "dir" / "x.json")]) == 0  # fmt: skip
    assert (tmp_path / "new" / "dir" / "x.json").is_file()


def _checkpoint(tmp_path: Path, name: str, content: bytes | None = None) -> Path:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    return path


def test_unusable_checkpoints_are_one_line_and_nothing_changes(capsys, tmp_path):
    folder = tmp_path / "adir"
    folder.mkdir()
    cases = {
        "does not exist": tmp_path / "missing.pt",
        "is a directory": folder,
        "is empty": _checkpoint(tmp_path, "empty.pt", b""),
        "not a checkpoint of this project": _checkpoint(tmp_path, "random.pt", os.urandom(999)),
    }
    good = tmp_path / "good.pt"
    save_checkpoint(good, {"step": 1, "w": np.ones((8, 8), np.float32)})
    data = bytearray(good.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)  # 64 bytes zeroed in the middle
    cases["SHA-256 does not match"] = _checkpoint(tmp_path, "flipped.pt", bytes(data))
    for match, path in cases.items():
        before = path.read_bytes() if path.is_file() else None
        # A file the command line names that cannot be used is a usage error, as a bad flag is.
        one_line(capsys, 2, ["train", "seq2seq", "--resume", "--checkpoint", str(path)], match)
        one_line(capsys, 2, ["generate", "--checkpoint", str(path), "--input", "3 4"], match)
        if before is not None:
            assert path.read_bytes() == before


@pytest.mark.parametrize("command", ["chat", "generate"])
def test_a_file_that_is_not_a_model_is_a_usage_error(capsys, tmp_path, command):
    """A text file named like a model: exit 2 and one line naming the file, as for any misuse
    (not 1, which is for what fails while running on good input)."""
    text = tmp_path / "x.gguf"
    text.write_text("a text file, not a model\n")
    err = one_line(capsys, 2, [command, "--model", str(text), "-p", "hi"], "not a GGUF file")
    assert err.startswith(f"ladder {command}: error: {text}: ") and "--debug" not in err
    err = one_line(capsys, 2, ["generate", "--checkpoint", str(text), "--input", "3 4"], str(text))
    assert "not a checkpoint of this project" in err
    assert text.read_text() == "a text file, not a model\n"


def test_only_the_readers_input_errors_are_usage_errors():
    """The rule behind exit status 2: a usage error, or a reader refusing the file it was given
    (or the loader, the source it was given); any other exception (a ValueError inside a
    level, say) is a failure while running."""
    from lab.checkpoint import CheckpointError
    from ladder.cli import INPUT_ERRORS, UsageError, is_usage_error
    from learner import RungError
    from levels.gguf import GGUFError
    from loading import LoadError

    readers = (
        GGUFError,
        CheckpointError,
        LoadError,
        RungError,
    )  # a model, a checkpoint, a source, a rung
    assert {f"{c.__module__}.{c.__qualname__}" for c in readers} == set(INPUT_ERRORS)
    assert is_usage_error(UsageError("x")) and is_usage_error(GGUFError("x"))
    assert is_usage_error(CheckpointError("x")) and is_usage_error(LoadError("x"))
    assert is_usage_error(RungError("x"))
    assert not is_usage_error(ValueError("x")) and not is_usage_error(RuntimeError("x"))


def _trained(tmp_path: Path, capsys) -> Path:
    path = tmp_path / "run.pt"
    assert ladder(["train", "seq2seq", "--task", "copy", "--quick", "--steps", "4",
                   "--checkpoint", str(path)]) == 0  # fmt: skip
    capsys.readouterr()
    return path


def test_a_training_run_ends_by_saying_where_it_saved(capsys, tmp_path):
    """Its last line names each file it wrote (the checkpoint with its step), or says that
    nothing was kept and how to keep it."""
    path, metrics, curve = tmp_path / "run.pt", tmp_path / "run.json", tmp_path / "run.png"
    quick = ["train", "seq2seq", "--task", "copy", "--quick", "--steps", "4"]
    assert ladder([*quick, "--checkpoint", str(path), "--json", str(metrics),
                   "--plot", str(curve)]) == 0  # fmt: skip
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (
        f"saved: {path} (the checkpoint, step 4), {metrics} (the metrics), {curve} (the loss curve)"
    )
    assert all(p.is_file() for p in (path, metrics, curve))
    assert ladder(quick) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "nothing saved (--checkpoint PATH keeps the trained model)"


def test_resume_refuses_another_run_and_says_when_it_is_finished(capsys, tmp_path):
    path = _trained(tmp_path, capsys)
    before = path.read_bytes()
    one_line(capsys, 2, ["train", "decoder-only", "--resume", "--checkpoint", str(path)],
             "holds a run with kind 'seq2seq', the command line asks for 'decoder-only'")  # fmt: skip
    one_line(capsys, 2, ["train", "seq2seq", "--task", "reverse", "--resume", "--checkpoint",
                         str(path)], "task 'copy'")  # fmt: skip
    one_line(capsys, 2, ["train", "seq2seq", "--resume", "--steps", "9", "--checkpoint",
                         str(path)], "drop --steps/--quick")  # fmt: skip
    assert ladder(["train", "seq2seq", "--resume", "--checkpoint", str(path)]) == 0
    assert "the run is finished (4 of 4 steps); nothing to resume" in capsys.readouterr().out
    assert path.read_bytes() == before


def test_generate_from_a_trained_checkpoint(capsys, tmp_path):
    path = _trained(tmp_path, capsys)
    assert ladder(["generate", "--checkpoint", str(path), "--input", "5 9 4", "--level", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("seq2seq copy: 5 9 4 -> ")
    one_line(capsys, 2, ["generate", "--checkpoint", str(path), "--input", "1 2"],
             "content symbols in [3,")  # fmt: skip
    one_line(capsys, 2, ["generate", "--checkpoint", str(path), "--input", "a b"], "integers")


def test_help_describes_each_command(capsys):
    assert ladder(["--help"]) == 0
    text = capsys.readouterr().out
    for command in ("bench", "show", "train", "preflight", "generate"):
        assert command in text
    assert ladder(["preflight", "--help"]) == 0
    assert "four properties" in " ".join(capsys.readouterr().out.split())
    assert ladder(["train", "--help"]) == 0
    assert "four properties" not in " ".join(capsys.readouterr().out.split())


def test_debug_shows_the_traceback(capsys):
    assert ladder(["--debug", "train", "seq2seq", "--level", "0"]) == 2
    assert "Traceback" in capsys.readouterr().err
    assert ladder(["train", "seq2seq", "--level", "0", "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_an_interrupted_run_names_its_step_and_last_checkpoint(tmp_path):
    """In process: a KeyboardInterrupt at step 5 of a run that saves every 2 steps."""
    import levels
    from lab.train import TrainingInterrupted, default_spec, train

    def stop_at_5(step, loss, tps):
        if step == 5:
            raise KeyboardInterrupt

    path = tmp_path / "run.pt"
    spec = default_spec("seq2seq", "copy", quick=True, steps=20)
    with pytest.raises(TrainingInterrupted) as info:
        train(spec, levels.load("2"), checkpoint=path, checkpoint_every=2, progress=stop_at_5)
    assert str(info.value) == f"interrupted at step 5; last checkpoint: {path} (step 4)"


@pytest.mark.parametrize("resume", [False, True])
def test_an_interruption_before_the_first_step_says_so(tmp_path, monkeypatch, resume):
    """Ctrl-C in the preflight (before any step): the message, and the checkpoint untouched."""
    import levels
    from lab import train as lab_train

    spec = lab_train.default_spec("seq2seq", "copy", quick=True, steps=4)
    path = tmp_path / "run.pt"
    if resume:
        lab_train.train(spec, levels.load("2"), checkpoint=path, stop_after=2)
    before = path.read_bytes() if resume else None

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lab_train, "run_preflight", interrupted)
    with pytest.raises(lab_train.TrainingInterrupted) as info:
        lab_train.train(spec, levels.load("2"), checkpoint=path, resume=resume)
    where = (
        f"the checkpoint {path} is as it was" if resume else f"no checkpoint written yet to {path}"
    )
    assert str(info.value) == f"interrupted before the first step; {where}"
    assert (path.read_bytes() if resume else path.exists()) == (before if resume else False)


def _ladder_process(*argv: str, env: dict | None = None) -> subprocess.Popen:
    """``python -m ladder *argv`` as a terminal starts it: with Ctrl-C's default action, even
    when this suite runs as a background job (which inherits SIGINT ignored, as would the
    command, and a command rightly leaves an ignored SIGINT ignored)."""
    return subprocess.Popen(
        [sys.executable, "-m", "ladder", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath(ROOT), **(env or {})},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.mark.slow
def test_level_4_without_triton_is_one_line(tmp_path):
    """A ``triton`` that cannot be imported (as on a machine without it): one line, exit 1."""
    fake = tmp_path / "triton"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('No module named triton (simulated)')\n")
    proc = _ladder_process(
        "train",
        "seq2seq",
        "--level",
        "4",
        "--quick",
        env={"PYTHONPATH": pythonpath(tmp_path, ROOT)},
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    (line,) = err.strip().splitlines()
    assert "level4_triton_kernel is unavailable here" in line and "Traceback" not in err
