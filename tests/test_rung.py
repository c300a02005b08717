"""A learner's rung: its last stage (the real model on it), and the grading itself.

* ``test_the_real_model_runs_on_the_rung`` is the last stage of ``pytest --rung DIR``:
  SmolLM2, greedy, on the learner's rung and on level 1 in the same dtype, token for
  token; it runs only on a rung, once the decoder passes;
* the rest runs the grading on rungs written here (``ladder rung new``): an untouched
  scaffold (every stage not written yet, a failing run), one of level 1's pieces (every
  stage passes), one whose stages answer badly (each reported in one line, by stage
  and case), a rung that does not import (one line), and, extended, the twelve bugs of
  ``MUTANTS`` planted one at a time in the course's own solution (docs/your_rung/), each
  caught by the stage it belongs to, and the real model's line.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers import pythonpath

import learner

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "docs" / "your_rung"  # the course's rung, every stage written as a learner would

PROMPT, NEW_TOKENS = "The capital of France is", 2  # SmolLM2: " Paris", "."


@functools.cache
def _smollm2(path: Path):
    """SmolLM2's config and float32 parameters, its tokenizer, the prompt's ids ``(1, P)`` and
    level 1's greedy tokens after them: read once a process (the course's page grades its
    rung more than once, and the file takes seconds to dequantize)."""
    import levels
    from levels import gguf

    config, params = gguf.load(path, max_seq_len=16, dtype=np.float32)
    tokenizer = gguf.load_tokenizer(path)
    prompt = np.array([tokenizer.encode(PROMPT, add_special_tokens=False).ids])  # (1, P)
    level1 = levels.load("level1_numpy").DecoderOnlyTransformer(config, params, dtype=np.float32)
    return config, params, tokenizer, prompt, np.asarray(level1.generate(prompt, NEW_TOKENS))[0]


@pytest.mark.rung_only
@pytest.mark.real_model
@pytest.mark.stage("real-model")
def test_the_real_model_runs_on_the_rung(rung):
    """SmolLM2 from the ladder's cache, greedy for a few tokens, on the rung and on level 1,
    both in float32: the same tokens. It waits for the decoder stage to pass (where that
    stage ran); without the model in the cache it is skipped with the command that
    fetches it (the suite never downloads)."""
    from levels import registry

    if rung.ran("decoder") and not rung.passed("decoder"):
        pytest.skip("waits for the decoder (every stage above passing)")
    path = registry.cached(registry.DEFAULT_MODEL)
    if path is None:
        pytest.skip(f"{registry.DEFAULT_MODEL} is not in the ladder's cache: `ladder pull` fetches it")  # fmt: skip
    config, params, tokenizer, prompt, theirs = _smollm2(path)
    model = rung.module.DecoderOnlyTransformer(config, params, dtype=np.float32)
    yours = np.asarray(model.generate(prompt, NEW_TOKENS))[0]
    rung.said = tokenizer.decode(yours.tolist())
    assert yours.tolist() == theirs.tolist(), (
        f"the real model: your rung says {rung.said!r}, level 1 {tokenizer.decode(theirs.tolist())!r} "
        f"(tokens {yours.tolist()} against {theirs.tolist()})"
    )


# ----------------------------------------------------------------------------- the grading


def pytest_rung(folder: Path, *options: str) -> subprocess.CompletedProcess:
    """``python -m pytest --rung FOLDER`` as a learner runs it, from the repository's root."""
    env = dict(os.environ, PYTHONPATH=pythonpath(ROOT))
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--rung",
        str(folder),
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    return subprocess.run(
        [*command, *options], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def ladder_rung_test(capsys, folder: Path, *options: str) -> tuple[int, dict[str, str], str]:
    """``ladder rung test FOLDER`` (in this process) -> its exit status, each stage's title
    -> its line's status, and what it printed."""
    from ladder import cli

    status = cli.main(["rung", "test", str(folder), *options])
    out = capsys.readouterr().out
    return status, summary(out), out


def summary(out: str) -> dict[str, str]:
    """The grading's summary: each stage's title -> its line's status, in order."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("your rung ("))
    width = max(len(s.title) for s in learner.STAGES)
    stages = {}
    for line in lines[start + 1 :]:
        if not line.startswith("  ") or line[2:3] == " ":
            break
        stages[line[2 : 2 + width].strip()] = line[2 + width :].strip()
    return stages


def test_an_untouched_scaffold_has_every_stage_not_written_and_fails(tmp_path, capsys):
    learner.new(tmp_path / "rung")
    status, stages, out = ladder_rung_test(capsys, tmp_path / "rung")
    assert list(stages) == [s.title for s in learner.STAGES]
    for stage in learner.STAGES[:-1]:
        assert stages[stage.title] == f"not written yet: {stage.what} ({stage.chapter})"
    assert stages["the real model"].startswith("waits for the decoder")
    assert status == 1
    assert out.splitlines()[0] == "your rung (rung), stage by stage:"  # nothing else printed
    assert len(out.splitlines()) == 1 + len(learner.STAGES)


def test_a_rung_of_level_1_pieces_passes_every_stage(tmp_path, capsys):
    learner.new(tmp_path / "rung", take=learner.stage_names("all"))
    status, stages, out = ladder_rung_test(capsys, tmp_path / "rung", "--stage", "all")
    assert list(stages) == [s.title for s in learner.STAGES if s.file]  # no real model asked
    for stage in learner.STAGES[:-1]:
        assert stages[stage.title].startswith("passed "), out
        assert "(taken from levels." in stages[stage.title]
    assert status == 0, out


# Stages that answer badly: the wrong shape, NaN, a list where an array was expected, an
# exception inside. Each replaces the body of a stub (its `raise NotImplementedError`).
BAD_ANSWERS = {
    "attention.py": "return q[..., :1]",  # (B,H,T,1), not (B,H,T,Dv)
    "softmax.py": "return scores * np.nan",
    "rope.py": "return x.tolist()",
    "norms.py": "return x[..., 99]",  # an IndexError inside layer_norm and rms_norm
}


@pytest.mark.extended  # a pytest run of the suite for each bad answer: half a minute
def test_bad_answers_are_one_line_each_naming_the_stage_and_the_case(tmp_path):
    """As a learner runs it, ``python -m pytest --rung DIR``: the summary first, a line a
    stage, then pytest's report of each failure."""
    folder = tmp_path / "rung"
    learner.new(folder)
    for name, body in BAD_ANSWERS.items():
        path = folder / name
        text = path.read_text()
        stub = text[text.index("    raise NotImplementedError(") :].split("\n", 1)[0]
        path.write_text(text.replace(stub, f"    {body}"))
    result = pytest_rung(folder)
    stages = summary(result.stdout)
    assert stages["attention"].startswith("FAILED "), stages["attention"]
    assert "test_attention.py::" in stages["attention"] and "shape (" in stages["attention"]
    assert "not finite" in stages["softmax's numerics"], stages["softmax's numerics"]
    assert "a list, not a numpy array" in stages["RoPE"], stages["RoPE"]
    assert "your code raised IndexError" in stages["LayerNorm and RMSNorm"]
    assert "(norms.py:" in stages["LayerNorm and RMSNorm"]  # where, in the learner's file
    block = learner.stage("block")
    assert stages["the block"] == f"not written yet: {block.what} ({block.chapter})"
    assert result.returncode == 1
    assert result.stdout.index("your rung (") < result.stdout.index("FAILURES")


def test_a_rung_that_does_not_import_is_one_line(tmp_path, capsys):
    from ladder import cli

    folder = tmp_path / "rung"
    learner.new(folder)
    (folder / "rope.py").write_text((folder / "rope.py").read_text() + "\ndef broken(:\n")
    with pytest.raises(
        learner.RungError, match=r"does not import: SyntaxError: .* \(rope.py:\d+\)"
    ):
        learner.load(folder)
    assert cli.main(["rung", "test", str(folder)]) == 2  # a usage error, one line
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("ladder rung test: error: your rung at ")
    result = pytest_rung(folder)
    assert result.returncode == 4  # pytest's usage error, one line too
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "rope.py:" in errors[0], result.stderr
    with pytest.raises(learner.RungError, match="no such folder"):
        learner.load(tmp_path / "elsewhere")
    with pytest.raises(learner.RungError, match="not an empty folder"):
        learner.new(folder)


# ----------------------------------------------------------------------------- planted bugs

# Twelve bugs a learner writes, each planted alone in the course's solution: (file, [(the
# line as written, the line with the bug)], the stage that must report it first, and what
# the first failing case's line must name).
MUTANTS = {
    "missing scale": ("attention.py", [("    scores = (q @ k.swapaxes(-1, -2)) * scale  #", "    scores = (q @ k.swapaxes(-1, -2))  #")], "attention", "test_attention.py::"),
    "causal off by one": ("attention.py", [("np.arange(T)[:, None] + (S - T)", "np.arange(T)[:, None] + (S - T) + 1")], "attention", "test_attention.py::"),
    "a mask inverted": ("attention.py", [("allowed = allowed & mask", "allowed = allowed & ~mask")], "attention", "test_attention.py::"),
    "key heads repeated in the wrong order": ("attention.py", [("k = np.repeat(k, group, axis=1)", "k = np.tile(k, (1, group, 1, 1))"), ("v = np.repeat(v, group, axis=1)", "v = np.tile(v, (1, group, 1, 1))")], "attention", "test_key_heads_shared_in_groups"),
    "softmax without the max": ("softmax.py", [("e = np.exp(scores - top)", "e = np.exp(scores)")], "softmax's numerics", "not finite"),
    "an empty row gives NaN": ("attention.py", [("        raise ValueError(checks.EMPTY_ROW_MESSAGE)", "        pass")], "softmax's numerics", "test_empty_row"),
    "RoPE's pairs swapped": ("rope.py", [("a, b = x[..., 0::2], x[..., 1::2]", "b, a = x[..., 0::2], x[..., 1::2]")], "RoPE", "test_rope"),
    "a norm over the wrong axis": ("norms.py", [("mean = x.mean(axis=-1, keepdims=True)", "mean = x.mean(axis=-2, keepdims=True)"), ("var = ((x - mean) ** 2).mean(axis=-1,", "var = ((x - mean) ** 2).mean(axis=-2,")], "LayerNorm and RMSNorm", "layer_norm"),
    "LayerNorm's variance over N - 1": ("norms.py", [("var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)", "var = ((x - mean) ** 2).sum(axis=-1, keepdims=True) / (x.shape[-1] - 1)")], "LayerNorm and RMSNorm", "layer_norm"),
    "a post-norm block": ("block.py", [("x = x + self.self_attn(self.norm1(x), positions, mask, cache, index)", "x = self.norm1(x + self.self_attn(x, positions, mask, cache, index))")], "the block", "test_encoder_layer"),
    "the cache appended twice": ("cache.py", [("k = np.concatenate([self.keys[index], k], axis=2)", "k = np.concatenate([self.keys[index], k, k], axis=2)")], "the KV cache", "test_the_cache_appends"),
    "the decoder without its final norm": ("model.py", [("return self.norm(x) @ self.output_projection.T", "return x @ self.output_projection.T")], "the decoder", "test_decoder_only"),
}  # fmt: skip


def solved_rung(folder: Path) -> Path:
    """A rung with every stage the course's solution (docs/your_rung/)."""
    learner.new(folder)
    for path in SOLUTION.glob("*.py"):
        shutil.copyfile(path, folder / path.name)
    return folder


@pytest.mark.extended
@pytest.mark.parametrize("bug", list(MUTANTS))
def test_each_planted_bug_is_named_by_its_stage_and_case(tmp_path, capsys, bug):
    """The first stage the summary calls failed is the bug's, its line names the case that
    caught it, and every stage before it still passes."""
    file, edits, stage, case = MUTANTS[bug]
    folder = solved_rung(tmp_path / "rung")
    text = (folder / file).read_text()
    for line, planted in edits:
        assert text.count(line) == 1, f"{bug}: {line!r} is not one line of {file}"
        text = text.replace(line, planted)
    (folder / file).write_text(text)
    status, stages, _ = ladder_rung_test(capsys, folder, "--stage", "all")
    failed = [title for title, line in stages.items() if line.startswith("FAILED")]
    assert failed and failed[0] == stage, f"{bug}: {stages}"
    assert case in stages[stage], f"{bug}: {stages[stage]}"
    titles = list(stages)
    assert all(stages[t].startswith("passed") for t in titles[: titles.index(stage)]), stages
    assert status == 1


@pytest.mark.extended
@pytest.mark.real_model
def test_the_solution_passes_and_the_real_model_speaks_on_it(tmp_path, capsys, smollm2_gguf):
    status, stages, out = ladder_rung_test(capsys, solved_rung(tmp_path / "rung"))
    assert all(line.startswith("passed") for line in stages.values()), out
    assert out.splitlines()[-1] == "your rung says: The capital of France is Paris."
    assert status == 0


# ----------------------------------------------------------------------------- the bench


def test_the_bench_times_a_rung_beside_the_levels_once_it_is_right(tmp_path):
    """``ladder bench --rung DIR``: the course's rung is checked and timed in the attention and
    decoder tables beside level 1; a rung whose attention is wrong is reported and not
    timed; one not written is reported so."""
    import json

    from ladder import cli

    right = solved_rung(tmp_path / "right")
    wrong = solved_rung(tmp_path / "wrong")
    path = wrong / "attention.py"
    path.write_text(path.read_text().replace(") * scale  #", ")  #"))  # the scale forgotten
    stub = tmp_path / "stub"
    learner.new(stub)
    out = tmp_path / "bench.json"
    argv = ["bench", "--quick", "--levels", "1", "--scenario", "attention", "--scenario"]
    argv += ["decoder", "--seq-lens", "8", "--no-peers", "--no-progress", "--json", str(out)]
    assert cli.main([*argv, "--rung", str(right), "--rung", str(wrong), "--rung", str(stub)]) == 0
    records = {(r["level"], r["scenario"]): r for r in json.loads(out.read_text())}
    for scenario in ("attention fwd", "decoder fwd"):
        assert records["level1_numpy", scenario]["status"] == "ok"
        mine = records["rung:right", scenario]
        assert mine["status"] == "ok" and mine["median_s"] > 0
        assert mine["max_error"] <= mine["error_bound"]
        assert records["rung:wrong", scenario]["status"] == "wrong"
        assert records["rung:wrong", scenario]["median_s"] is None  # checked, never timed
        assert records["rung:stub", scenario]["status"].startswith("skipped: not written yet")
    assert not any(level.startswith("rung:") for level, s in records if s == "decoder fwd+bwd")
    assert cli.main([*argv, "--rung", str(tmp_path / "nowhere")]) == 2  # one line, no run
