"""Level 4 compiled for sm_80 and sm_90 without a GPU (ladder/check/), and the prune.

The interpreter that runs level 4 on a CPU ignores what decides whether a
kernel runs on a GPU (warps, stages, shared memory, tensor-core dtype rules);
these tests compile the kernels for real targets with Triton's own compiler, in
worker processes that chose the compiler (ladder/check/__init__.py).

Default run: a few compiles (one per kind of kernel, a real compile error, a
candidate the table prunes, confirmed over its limit by the compiler), every
job's compile inputs built, the specialisation rules against Triton's, and the
prune's decision on synthetic candidates. ``pytest -m extended``: the whole
matrix (ladder/check/matrix.py), which must compile with nothing over a
limit that the prune keeps and every measurement equal to shared_memory.py, the
Ampere family against sm_80, and ``ladder check`` run as a command.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import levels

try:
    levels.load("level4_triton_kernel")
except levels.LevelUnavailable as exc:  # no triton here: say so, do not pretend
    pytest.skip(str(exc), allow_module_level=True)

import triton  # noqa: E402

from ladder.check import check as C  # noqa: E402
from ladder.check import matrix as M  # noqa: E402
from levels.level4_triton_kernel import tiles  # noqa: E402
from levels.level4_triton_kernel.shared_memory import SHARED_MEMORY  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def job(kernel="forward", tiles_=None, dtype="float16", size=64, variant=None, target="sm_90"):
    """A job of the matrix: ``kernel``'s first launch unless ``tiles_`` is given."""
    spec = M.KERNELS[kernel]
    first, tuned = spec.launches(dtype)[0]
    if variant is None:
        variant = (
            "layernorm"
            if spec.norm
            else ("plain" if spec.flags == "none" else "causal+window+mask+gqa")
        )
    return M.Job(kernel, tiles_ or first, tuned, dtype, size, variant, target)


def failures_text(check: C.Check) -> str:
    return "\n".join(check.failures())


# ---------------------------------------------------------------------------
# The matrix and the specialisation
# ---------------------------------------------------------------------------


def test_every_job_builds_its_compile_inputs():
    """Every job's arguments come from the launchers' own builders and give a signature
    (in a compile-only worker, nothing compiled): the dry run of the whole matrix."""
    jobs = M.plan()
    assert {j.kernel for j in jobs} == set(M.KERNELS)
    assert {j.target for j in jobs} == {"sm_80", "sm_90"}
    assert {j.dtype for j in jobs} == {"float16", "bfloat16", "float32"}
    results = C.compile_jobs(jobs, plan_only=True)
    assert [r for r in results if r["status"] != "planned"] == []


def test_every_candidate_meets_every_dtype_head_and_target():
    jobs = M.plan()
    for name, spec in M.KERNELS.items():
        for dtype in M.MATRIX_DTYPES:
            for n, (tiles_, _) in enumerate(spec.launches(dtype)):
                mine = [j for j in jobs if (j.kernel, j.tiles, j.dtype) == (name, tiles_, dtype)]
                assert {j.target for j in mine} == {"sm_80", "sm_90"}, (name, tiles_)
                if not spec.norm:  # the odd head with the first launch
                    heads = set(M.HEADS) | ({M.ODD_HEAD} if n == 0 else set())
                    assert {j.size for j in mine} == heads, (name, tiles_)
    first = M.KERNELS["forward"].launches("float16")[0][0]
    variants = {
        j.variant
        for j in jobs
        if (j.kernel, j.tiles, j.dtype, j.target) == ("forward", first, "float16", "sm_80")
    }
    # Every pair of flags appears in all four on/off combinations.
    for a in range(4):
        for b in range(a + 1, 4):
            seen = set()
            for v in variants:
                flags = [M.variant_flags(v)[name] for name in M.FLAG_NAMES]
                seen.add((flags[a], flags[b]))
            assert seen == {(False, False), (False, True), (True, False), (True, True)}


def test_argument_types_follow_tritons_own_rules():
    """``argument_type`` against the function Triton's launcher calls, on the kinds of
    arguments the kernels take (meta tensors included: their address reads as 0)."""
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
    except ImportError as exc:  # another triton: nothing to compare with
        pytest.skip(f"this triton has no native_specialize_impl to compare with ({exc})")
    backend = make_backend(GPUTarget("cuda", 90, 32))
    values = [0, 1, 2, 15, 16, 64, 111, 1000, 64000, 2**31 - 1, 2**31, -16, 0.5, 1.0]
    values += [torch.empty(3, dtype=d, device="meta") for d in M.TRITON_TYPES]
    for value in values:
        for specialise in (True, False):
            kind, spec = native_specialize_impl(backend, value, False, specialise, True)
            ours = M.argument_type(value, specialise)
            if kind == "constexpr":
                assert ours == ("constexpr", None), value
            else:
                assert ours == (kind, spec), (value, specialise)


def test_a_decode_step_compiles_the_decode_tiles():
    decode = M.plan(kernels=["forward-decode"])
    for dtype in M.MATRIX_DTYPES:
        t = tiles.decode_tiles(dtype)
        expected = {(t.block_m, t.block_n, t.num_warps, t.num_stages)}
        assert {j.tiles for j in decode if j.dtype == dtype} == expected
    assert tiles.decode_tiles(torch.float32).num_stages == 2  # 3 stages: over every limit
    assert not any(j.tuned for j in decode)


# ---------------------------------------------------------------------------
# A few real compiles (seconds each, cached by Triton afterwards)
# ---------------------------------------------------------------------------


def test_one_compile_per_kind_of_kernel():
    jobs = [
        job("forward", target="sm_80"),
        job("forward", dtype="bfloat16", size=128, target="sm_90"),
        job("dq", dtype="bfloat16"),
        job("decode-split", target="sm_80"),
        job("decode-merge", dtype="float32"),
        job("paged-decode", dtype="bfloat16", target="sm_90"),
        job("norm-backward", dtype="float32", size=768, variant="rmsnorm", target="sm_80"),
    ]
    results = C.compile_jobs(jobs)
    for r in results:
        assert r["status"] == "compiled", r
        # (The merge needs none in float32: nothing goes through shared memory.)
        assert 0 <= r["shared"] <= M.TARGETS[r["target"]].shared_limit, r
    for j, r in zip(jobs, results, strict=True):
        if j.tuned:  # the table is what the compiler measures
            assert tiles.shared_memory_need(*C.table_key(j)) >= r["shared"], r


def test_a_configuration_that_does_not_compile_fails_by_name():
    """tl.dot needs every dimension >= 16: 8 x 8 tiles are a real compile error, which the
    check reports as a failure naming kernel, tiles, dtype and target."""
    bad = job("forward", tiles_=(8, 8, 4, 3), dtype="bfloat16", target="sm_80")
    result = C.check([bad])
    assert result.results[0]["status"] == "error"
    (message,) = [m for m in result.failures() if "does not compile" in m]
    assert message.startswith("forward [8x8 w4 s3] bfloat16 size 64")
    assert "sm_80" in message.splitlines()[0]
    assert len(message.splitlines()) > 1  # the compiler's own words follow


def test_a_pruned_candidate_really_is_over_its_limit():
    """The cheapest candidate the table prunes, compiled: the compiler stops it after the
    LLVM-IR stage (no ptxas), over the target's limit, with the bytes the table says."""
    over = [
        (need, key) for key, need in SHARED_MEMORY.items() if need > M.TARGETS[key[1]].shared_limit
    ]
    assert over, "shared_memory.py prunes nothing: the table or the limits changed"
    need, (function, target, dtype, head, shape) = min(over)
    kernel = next(k for k, s in M.KERNELS.items() if s.function == function and s.tuned)
    candidate = job(kernel, tiles_=shape, dtype=dtype, size=head, target=target)
    assert C.pruned(candidate)
    (result,) = C.compile_jobs([candidate])
    assert result["status"] == "over"
    assert result["shared"] == need


@pytest.mark.extended  # six compiles, 4 s: the default run keeps one compile of each kind
def test_the_ampere_family_compiles_like_sm_80():
    """The prune uses sm_80's measurements for every 8.x GPU (tiles.shared_memory_target):
    the same tiles need the same shared memory on 8.6 (A10, RTX 30xx) and 8.9 (L4, RTX 40xx)."""
    jobs = [job("forward", size=128, target=t) for t in ("sm_80", "sm_86", "sm_89")]
    jobs += [job("dkdv", dtype="bfloat16", target=t) for t in ("sm_80", "sm_86", "sm_89")]
    results = C.compile_jobs(jobs)
    for group in (results[:3], results[3:]):
        assert len({r["shared"] for r in group}) == 1, group
    assert tiles.shared_memory_target((8, 6)) == tiles.shared_memory_target((8, 0)) == "sm_80"
    assert tiles.shared_memory_target((9, 0)) == "sm_90"
    assert tiles.shared_memory_target((10, 0)) is None


# ---------------------------------------------------------------------------
# The prune, on synthetic candidates and measurements
# ---------------------------------------------------------------------------

TABLE = {
    ("k", "sm_80", "float32", 128, (128, 64, 4, 3)): 229888,
    ("k", "sm_80", "float32", 128, (64, 64, 4, 3)): 166912,  # exactly the limit: fits
    ("k", "sm_80", "float32", 128, (32, 32, 4, 2)): 40000,
}
SHAPES = [(128, 64, 4, 3), (64, 64, 4, 3), (32, 32, 4, 2), (16, 16, 4, 1)]
BY_CLASS = {"16-bit": ((128, 128, 8, 3), (128, 64, 4, 3)), "float32": tuple(SHAPES)}


def test_fitting_shapes_drops_only_what_is_measured_over_the_limit():
    kept = tiles.fitting_shapes(
        "k", SHAPES, target="sm_80", dtype="float32", head=128, limit=166912, table=TABLE
    )
    assert kept == [(64, 64, 4, 3), (32, 32, 4, 2), (16, 16, 4, 1)]  # unmeasured: kept
    smaller = tiles.fitting_shapes(
        "k", SHAPES, target="sm_80", dtype="float32", head=128, limit=101376, table=TABLE
    )
    assert smaller == [(32, 32, 4, 2), (16, 16, 4, 1)]
    # Another dtype, head or target has no measurements here: nothing is dropped.
    for other in (dict(dtype="float16", head=128), dict(dtype="float32", head=64)):
        assert (
            tiles.fitting_shapes("k", SHAPES, target="sm_80", limit=101376, table=TABLE, **other)
            == SHAPES
        )
    assert (
        tiles.fitting_shapes(
            "k", SHAPES, target=None, dtype="float32", head=128, limit=0, table=TABLE
        )
        == SHAPES
    )


def test_the_autotuners_prune_keeps_the_dtypes_candidates_that_fit():
    devices = []

    def facts(device):
        devices.append(device)
        return "sm_80", 101376

    prune = tiles.CandidatePrune("k", BY_CLASS, device_facts=facts, table=TABLE)
    configs = tiles.attention_configs(tiles.all_shapes(BY_CLASS))
    assert len(configs) == 5  # (128, 64, 4, 3) is a candidate of both classes: once
    q = torch.empty(1, 1, 1, 1, dtype=torch.float32, device="meta")
    # A 64-wide Dh with a 128-wide Dv is bounded by the 128 measurements.
    kept = prune(configs, {"Q": q}, BLOCK_DH=64, BLOCK_DV=128, CAUSAL=True)
    assert [tiles.config_shape(c) for c in kept] == [(32, 32, 4, 2), (16, 16, 4, 1)]
    assert all(c in configs for c in kept)  # the autotuner's own objects, not copies
    assert devices == [q.device]
    half = torch.empty(1, dtype=torch.bfloat16, device="meta")
    kept = prune(configs, {"Q": half}, BLOCK_DH=128, BLOCK_DV=128)  # nothing measured
    assert [tiles.config_shape(c) for c in kept] == list(BY_CLASS["16-bit"])
    assert tiles.table_head(16, 32) == 64 and tiles.table_head(128, 64) == 128


def test_the_prune_refuses_when_nothing_fits():
    prune = tiles.CandidatePrune(
        "k", {"float32": tuple(SHAPES[:3])}, device_facts=lambda d: ("sm_80", 1000), table=TABLE
    )
    q = torch.empty(1, dtype=torch.float32, device="meta")
    configs = tiles.attention_configs(SHAPES[:3])
    with pytest.raises(ValueError, match="no tile configuration of k fits in this GPU's 1000"):
        prune(configs, {"Q": q}, BLOCK_DH=128, BLOCK_DV=128)


def test_every_autotuned_kernel_calls_the_prune():
    """In a compile-only process (the GPU's case), each autotuned kernel is wrapped with the
    prune for its own name and candidates, and the autotuner's own ``prune_configs`` keeps
    the call's dtype class minus a candidate measured over the limit, before anything is
    compiled or timed."""
    script = """
import torch
from ladder.check import kernel_package
k = kernel_package()
T = k.tiles
tuned = {
    "_attn_fwd_kernel": (k.flash_forward._attn_fwd_tuned, T.FORWARD_SHAPES),
    "_attn_bwd_dkdv_kernel": (k.flash_backward._dkdv_tuned, T.DKDV_SHAPES),
    "_attn_bwd_dq_kernel": (k.flash_backward._dq_tuned, T.DQ_SHAPES),
}
for name, (autotuner, shapes) in tuned.items():
    prune = autotuner.early_config_prune
    assert isinstance(prune, T.CandidatePrune) and prune.kernel == name, name
    assert [T.config_shape(c) for c in autotuner.configs] == T.all_shapes(shapes), name
    for dtype, group in ((torch.float16, "16-bit"), (torch.float32, "float32")):
        first = shapes[group][0]
        prune.table = {(name, "sm_80", str(dtype)[6:], 128, first): 10**6}
        prune.device_facts = lambda device: ("sm_80", 166912)
        autotuner.nargs = {"Q": torch.empty(1, dtype=dtype, device="meta")}
        kept = autotuner.prune_configs({"BLOCK_DH": 128, "BLOCK_DV": 128})
        assert [T.config_shape(c) for c in kept] == list(shapes[group][1:]), (name, kept)
print("ok")
"""
    env = C.worker_environment()
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_check_judges_synthetic_results():
    """Stale measurements and uncovered heads are failures too (no compiling here)."""
    j = job("forward", dtype="float32", size=256, target="sm_80")
    need = tiles.shared_memory_need(*C.table_key(j))
    stale = j.to_dict() | {
        "status": "compiled",
        "shared": (need or 0) + 16,
        "seconds": 0,
        "error": None,
    }
    check = C.Check([stale], seconds=0.0, measured=False)
    assert any("regenerate the table" in m for m in check.failures())
    pruned = j.to_dict() | {"status": "pruned", "shared": need, "seconds": 0, "error": None}
    uncovered = C.Check([pruned], seconds=0.0, measured=False).failures()
    assert any("every autotuning candidate is pruned" in m for m in uncovered)
    fixed = job("decode-split").to_dict() | {
        "status": "over",
        "shared": 10**6,
        "seconds": 0,
        "error": None,
    }
    (message,) = C.Check([fixed], seconds=0.0, measured=False).failures()
    assert "a fixed launch" in message and "decode-split" in message


def test_the_table_was_measured_with_this_triton():
    from levels.level4_triton_kernel import shared_memory

    assert shared_memory.TRITON_VERSION == triton.__version__, (
        "shared_memory.py was measured with another triton: regenerate it with "
        "ladder check --write-table"
    )


def test_the_table_is_plain_data_and_the_tooling_uses_level_4s_own_modules():
    """tiles.py imports the table (level 4's shared_memory.py) beside it, in a compile
    worker's kernel package as in level 4: the table imports nothing, so any process can
    load it; and the tooling in this process uses level 4's own modules, one copy of each."""
    tree = ast.parse((ROOT / "levels/level4_triton_kernel/shared_memory.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert C.TABLE == ROOT / "levels/level4_triton_kernel/shared_memory.py"
    assert C.tiles is tiles  # kernels(): level 4 itself here, one copy of each module
    assert "level4_kernels" not in sys.modules


@pytest.mark.extended  # a process compiling a kernel's candidates, 4 s
def test_the_command_prints_the_kept_configurations(tmp_path):
    """``run`` (``ladder check``) on one kernel, dtype and target: a table per kernel with
    each candidate's shared memory, and the results as JSON."""
    out = tmp_path / "check.json"
    done = subprocess.run(
        [sys.executable, "-m", "ladder", "check",
         "--kernel", "forward-decode", "--dtype", "float16", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "attention forward, decode tiles (T <= 16) (_attn_fwd_kernel)" in done.stdout
    assert "sm_80 (163 KiB)" in done.stdout and "sm_90 (227 KiB)" in done.stdout
    assert "jobs:" in done.stdout and "0 failed" in done.stdout
    import json

    document = json.loads(out.read_text())
    assert document["failures"] == []
    assert {r["status"] for r in document["results"]} <= {"compiled", "pruned"}


# ---------------------------------------------------------------------------
# The GPU script's dry run
# ---------------------------------------------------------------------------


@pytest.mark.extended  # 18 s: every step of the script but the launches
def test_gpu_check_dry_run(tmp_path):
    """benchmarks/gpu_check.sh --dry-run on this CPU: every step's arguments, imports and
    output paths, the compile check's plan, nothing launched."""
    results = tmp_path / "gpu_results"
    env = os.environ | {"PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", str(results)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "dry run" in output
    assert "compile check" in output and "jobs planned" in output
    parsed = "dry run: ladder bench --device cuda"  # DRY_LADDER's line for a command it parsed
    for step in ("--scenario real-model --levels 3,4", "--scenario decode --levels 4"):
        assert f"{parsed} {step}" in output, step
    assert "not written yet" not in output
    assert results.is_dir()


# ---------------------------------------------------------------------------
# The whole matrix (CI: pytest -m extended)
# ---------------------------------------------------------------------------


@pytest.mark.extended
@pytest.mark.parametrize("target", list(M.TARGETS))  # one test a target: CI runs them apart
def test_the_whole_matrix_compiles_for(target):
    jobs = M.plan(targets=(target,))
    result = C.check(jobs)
    counts = {s: sum(r["status"] == s for r in result.results) for s in ("compiled", "pruned")}
    print(f"\n{len(jobs)} jobs, {counts}, {result.seconds:.0f} s")
    assert result.failures() == [], failures_text(result)


def test_the_commands_choices_are_the_checks():
    """``ladder check`` declares its flags without importing triton (``ladder --help`` stays
    fast and works without it); its choices must be the check's own."""
    from ladder.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._subparsers._group_actions).choices["check"]
    choices = {a.dest: set(a.choices) for a in sub._actions if a.choices}
    assert choices["targets"] == set(M.TARGETS)
    assert choices["dtypes"] == set(M.MATRIX_DTYPES)
    assert choices["kernels"] == set(M.KERNELS)
