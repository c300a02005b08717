"""The subjects of a run: a level, or a peer beside it, seen through one small adapter.

A ``Subject`` is whatever fills one column of the ladder: a level, or a peer
measured on the same workloads (PyTorch's SDPA pinned to one of its backends,
level 4 with flash-decoding off, Hugging Face ``transformers``). The word is
"subject", not "backend": in this project a backend is a training backend
(``lab.backend``) or one of SDPA's kernels (level 3's ``backend=``).

The harness never guesses what a level is: every level states it in plain
attributes (``ARRAY``, ``GRADIENTS``, ``INTERPRETED``, ``DTYPES``,
``DEVICES``, ``DESCRIPTION``; see ``levels/__init__.py``), and a ``Subject``
is those facts plus the callables the workloads use. Everything else (warm-up,
timing, statistics, FLOPs, the error check) is the same code for every level.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import levels

SDPA_LEVEL = "level3_sdpa_flash"  # whose attention, pinned to one SDPA backend, is the peer


@dataclass
class Subject:
    """One column of the ladder: a level's declared facts and its callables.

    ``kind`` is the level's ``ARRAY``: ``"python"`` (nested lists), ``"numpy"``
    or ``"torch"``. ``interpreted`` marks the Triton interpreter, whose timings
    are an emulation on the CPU, never a GPU figure.
    """

    name: str
    description: str
    kind: str
    device: str
    dtypes: tuple[str, ...]
    gradients: str | None
    interpreted: bool
    module: ModuleType
    attention: Callable[..., Any]  # (q, k, v, *, causal, ...) -> out
    models: bool = True  # False for an SDPA peer: attention only
    only: tuple[str, ...] = ()  # a peer's scenarios (none: every scenario it can run)
    context: Callable[[], contextlib.AbstractContextManager] = field(
        default=contextlib.nullcontext
    )  # entered around every call
    options: dict[str, Any] = field(default_factory=dict)  # for its models' constructors

    @property
    def has_grad(self) -> bool:
        return self.gradients is not None

    @property
    def memory_method(self) -> str:
        if self.interpreted:
            return "n/a"
        if self.kind in ("python", "numpy"):
            return "tracemalloc"
        return "cuda" if self.device.startswith("cuda") else "torch.profiler"

    def effective_dtype(self, dtype: str) -> str:
        """The dtype the level really computes in: a level with a single dtype (level 0's
        float64) always computes in it, whatever the run asks for."""
        return self.dtypes[0] if len(self.dtypes) == 1 else dtype

    def unsupported(self, dtype: str) -> str | None:
        """Why this subject cannot run ``dtype``, or None if it can."""
        if self.effective_dtype(dtype) not in self.dtypes:
            return f"{self.name} computes in {', '.join(self.dtypes)}, not {dtype}"
        return None

    def native_dtype(self, dtype: str) -> Any:
        """``dtype`` as the level's ``asarray`` and constructors expect it."""
        if self.kind == "python":
            return None  # level 0 accepts only dtype=None
        if self.kind == "numpy":
            return np.dtype(dtype)
        import torch

        return getattr(torch, dtype)

    def asarray(self, a: np.ndarray, dtype: str | None = None) -> Any:
        """numpy -> native. Floating arrays take ``dtype``; ints and bools keep their kind."""
        native = self.native_dtype(dtype) if dtype and a.dtype.kind == "f" else None
        return self.module.asarray(a, device=self.device, dtype=native)

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(self.module.to_numpy(x))

    def sync(self) -> None:
        """Wait for queued device work (CUDA launches are asynchronous)."""
        if self.kind == "torch" and self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)

    def calls(self, fn: Callable[[], object], *, grad: bool) -> Callable[[], object]:
        """``fn`` as the harness calls it: in this subject's context, and under
        ``torch.no_grad`` unless it computes gradients (inference builds no graph)."""

        def call() -> object:
            with self.context(), self._no_grad(grad):
                return fn()

        return call

    def _no_grad(self, grad: bool) -> contextlib.AbstractContextManager:
        if self.kind != "torch" or grad:
            return contextlib.nullcontext()
        import torch

        return torch.no_grad()


def level_subject(name: str, module: ModuleType, device: str, dtype: str = "float32") -> Subject:
    """A loaded level as a ``Subject``, from the facts it declares.

    Python and numpy levels run on the CPU whatever ``device`` the run asks for.
    A torch level that does not run on ``device`` (level 4 compiled for CUDA, on
    a CPU run) is ``ValueError``, reported as unavailable with the reason.
    """
    kind = module.FACTS.array
    if kind != "torch":
        device = "cpu"
    elif device.split(":")[0] not in module.FACTS.devices:
        raise ValueError(f"{name} runs on {', '.join(module.FACTS.devices)} here, not {device}")
    native = None
    if kind == "torch" and dtype in module.FACTS.dtypes:
        import torch

        native = getattr(torch, dtype)
    return Subject(
        name=name,
        description=module.describe(device=device, dtype=native),
        kind=kind,
        device=device,
        dtypes=tuple(module.FACTS.dtypes),
        gradients=module.FACTS.gradients,
        interpreted=module.FACTS.interpreted,
        module=module,
        attention=module.attention,
    )


RUNG_SCENARIOS = ("attention fwd", "decoder fwd")  # where a learner's rung stands beside the five


def rung_subject(folder, device: str, dtype: str = "float32") -> Subject:
    """A learner's rung (``learner.load``) as a subject, from the facts it declares, in the
    attention and decoder tables beside the levels: checked against the reference like
    them, and reported, not timed, where it is wrong or a stage is not written yet."""
    import learner

    module = learner.load(folder)
    subject = level_subject(f"rung:{Path(folder).resolve().name}", module, device, dtype)
    subject.only = RUNG_SCENARIOS
    return subject


def load_subjects(
    names: list[str] | None, device: str, dtype: str = "float32"
) -> tuple[list[Subject], dict[str, str]]:
    """Load the requested levels (default: all); returns (subjects, {name: why unavailable})."""
    wanted = list(levels.LEVELS) if names is None else names
    subjects: list[Subject] = []
    unavailable: dict[str, str] = {}
    for name in wanted:
        try:
            subjects.append(level_subject(name, levels.load(name), device, dtype))
        except (ImportError, ValueError) as exc:
            unavailable[name] = str(exc)
    return subjects, unavailable


def sdpa_subject(which: str, device: str) -> Subject:
    """PyTorch's ``scaled_dot_product_attention`` pinned to one backend, as a peer.

    This is level 3's ``attention(..., backend=which)``, so the backend names and
    their map to PyTorch's ``SDPBackend`` are level 3's (``BACKENDS``), and the
    ladder's semantics hold (bottom-right causal, empty rows refused). Attention only.
    """
    level3 = levels.load(SDPA_LEVEL)
    if which not in level3.BACKENDS:
        raise ValueError(f"unknown SDPA backend {which!r}; choose one of {tuple(level3.BACKENDS)}")

    def attention(q, k, v, **kwargs):
        return level3.attention(q, k, v, backend=which, **kwargs)  # (B,H,T,Dv)

    return Subject(
        name=f"sdpa:{which}",
        description=f"torch SDPA, {which} backend only",
        kind="torch",
        device=device,
        dtypes=tuple(level3.FACTS.dtypes),
        gradients="autograd",
        interpreted=False,
        module=level3,
        attention=attention,
        models=False,
    )


def sdpa_peers(device: str, dtype: str = "float32") -> list[Subject]:
    """The SDPA backends of level 3's map that this PyTorch build can run on ``device`` in
    ``dtype``, as peers (on CUDA: flash, efficient, cudnn and math; on a CPU: flash and math).

    Which ones can run is asked of PyTorch with one tiny call each (``which_backend``
    with the backend forced), not assumed. None when level 3 itself cannot load.
    """
    import torch

    try:
        level3 = levels.load(SDPA_LEVEL)
    except levels.LevelUnavailable:
        return []  # the peers are level 3's attention; without it there are none
    probe = torch.zeros(1, 1, 16, 16, device=device, dtype=getattr(torch, dtype))
    peers = []
    for which in level3.BACKENDS:
        try:
            level3.which_backend(probe, probe, probe, causal=True, backend=which)
        except RuntimeError:  # this backend does not run here (a CUDA kernel on a CPU, say)
            continue
        peers.append(sdpa_subject(which, device))
    return peers


def unsplit_decode_peer(device: str, dtype: str = "bfloat16") -> Subject | None:
    """Level 4's attention with flash-decoding off (``splits=1``: one program per batch
    and head streams the whole cache), beside level 4 in ``decode attention``; None when
    level 4 cannot load or would not split anyway (the interpreter)."""
    try:
        level4 = levels.load("level4_triton_kernel")
    except levels.LevelUnavailable:
        return None
    if level4.FACTS.interpreted:
        return None
    peer = level_subject("level4_triton_kernel", level4, device, dtype)

    def attention(q, k, v, **kwargs):
        return level4.attention(q, k, v, splits=1, **kwargs)

    peer.name = "level4:no-split"
    peer.description = "level 4's forward kernel for decoding, the keys not split"
    peer.attention, peer.models, peer.only = attention, False, ("decode attention",)
    return peer


COMPILED_SCENARIOS = tuple(f"real decode {fmt}" for fmt in ("float32", "bfloat16", "int8", "int4"))


def compiled_peer(device: str, dtype: str = "float32", *, quick: bool = False) -> Subject | None:
    """Level 3 with its decode step compiled (``compile=True``), beside level 3 in the real
    model's decode; None when level 3 cannot load. Its prompt is level 3's own (eager),
    so it joins the decode scenarios only (float32 alone in a quick run: each format
    compiles once, a minute or two, then loads from the cache)."""
    try:
        level3 = levels.load(SDPA_LEVEL)
    except levels.LevelUnavailable:
        return None
    peer = level_subject(SDPA_LEVEL, level3, device, dtype)
    peer.name = "level3:compiled"
    peer.description = (
        "level 3 with its decode step compiled whole (compile=True: torch.export + "
        "AOTInductor on a CPU, torch.compile reduce-overhead on CUDA)"
    )
    peer.models, peer.options = True, {"compile": True}
    peer.only = COMPILED_SCENARIOS[:1] if quick else COMPILED_SCENARIOS
    return peer


class _HuggingFaceDecoder:
    """``transformers``' own model on the canonical parameters, with the ladder's
    ``generate(prefix, n, use_cache=...)``: greedy, exactly ``n`` new tokens.

    The parameters go through ``levels.hf.save`` into a temporary directory and
    back through ``from_pretrained``, the way a user loads a checkpoint.
    """

    def __init__(self, config, params, *, device="cpu", dtype=None):
        import shutil
        import tempfile

        import transformers

        from levels import hf

        folder = tempfile.mkdtemp(prefix="ladder-peer-")
        try:
            hf.save(folder, config, params)
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, dtype=dtype, attn_implementation="sdpa"
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self.model = self.model.to(device).eval()

    def generate(self, prefix, max_new_tokens, *, use_cache=True):
        import torch

        with torch.no_grad():
            return self.model.generate(
                prefix,
                attention_mask=torch.ones_like(prefix),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                eos_token_id=None,
                pad_token_id=0,
                use_cache=use_cache,
            )  # (B, P + max_new_tokens)


TRANSFORMERS_SCENARIOS = (
    "generate llama",
    "real prompt float32",
    "real prefill float32",
    "real decode float32",
)


def transformers_peer(device: str) -> Subject | None:
    """Hugging Face ``transformers``' ``generate``, a peer in ``TRANSFORMERS_SCENARIOS``;
    None when transformers (an optional extra) is not installed."""
    try:
        import transformers
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()  # no advice about generation settings
    transformers.utils.logging.disable_progress_bar()  # nor a bar for loading the weights
    level2 = levels.load("level2_torch_manual")  # torch arrays in and out, as level 2's
    module = type(
        "transformers_peer",
        (),
        {
            "DecoderOnlyTransformer": _HuggingFaceDecoder,
            "asarray": staticmethod(level2.asarray),
            "to_numpy": staticmethod(level2.to_numpy),
        },
    )
    return Subject(
        name="transformers",
        description=f"Hugging Face transformers {transformers.__version__} generate (SDPA, its own cache)",
        kind="torch",
        device=device,
        dtypes=("float64", "float32", "float16", "bfloat16"),
        gradients=None,
        interpreted=False,
        module=module,
        attention=None,
        only=TRANSFORMERS_SCENARIOS,
    )
