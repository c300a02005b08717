"""A decode step compiled whole: level 3's own modules, one token per row, fixed shapes.

Decoding one token reads every weight once, so a step is as fast as the weights
stream from memory (docs/decoding.md). Eager PyTorch falls short of that twice:
its one-row ``F.linear`` streams the weights at about half the rate a plain
read does, and each of a step's two thousand tensor calls costs microseconds of
Python and dispatch. A compiler fixes both at once, but only over the *whole*
step at shapes it can fix: compiling the layers one by one leaves the head, the
cache's growing views and the boundary's Python outside (1.2x, measured in
docs/decoding.md).

``DecodeStep`` is that whole step, written with the model's own code
(``compute``: embedding, blocks, norm, head), not a copy of it. What makes its
shapes fixed:

* the new token of each row goes into cache slot ``slot`` (a tensor, not an
  int the compiler would specialise on), at RoPE position ``positions`` (one
  per row);
* the keys are read as views of the cache's first ``S`` slots, ``S`` taken from
  the width of the masks, the one size left symbolic (``S`` grows by one a step;
  one compiled program serves every length);
* each distinct window of the layers comes with its mask ``(B,1,1,S)``, True =
  may attend, built by the caller from what the model's boundary planned (the
  checks happen there, once, before the step: inside it the attention core is
  the bare SDPA call);
* the cache's layers are separate inputs, each written in place at ``slot``.

The compiler and its cache, on a CPU: ``torch.export`` traces the step, one
decomposition writes each one-row product ``x @ W.T`` as a dot product per
output row, ``(x * W).sum(-1)`` over a row-major ``W`` (what inductor turns into
one vectorised loop that streams ``W`` once; the same product lowered to a
library GEMM streams it at eager's rate), and AOTInductor compiles the program
into a shared library, kept in the user's cache (``levels.registry.cache_dir()``
``/compiled``) under a key of everything it depends on but the weights' values:
the weights stay the model's own tensors, handed to the library at load
(user-managed constants), so one compiled file serves every model of the same
shapes and a later start loads it in a fraction of a second.
(``torch.compile``'s just-in-time path with inductor's weight freezing, tried
first, re-compiles the step in every new process: its frozen, prepacked
constants keep its graph out of inductor's cache.)

On a GPU the same step goes through ``torch.compile(mode="reduce-overhead")``
(CUDA graphs replay the step's hundreds of kernel launches as one), with masks
as wide as the whole cache, so that every step has the same shapes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..common.boundary import Step

# ----------------------------------------------------------------------------- the step


def masked_sdpa(q, k, v, *, causal=False, mask=None, window=None, scale=None, dropout_p=0.0):
    """The attention core inside the compiled step: SDPA under the step's mask, unchecked.

    ``q (B,H,1,Dh)``, ``k``/``v (B,Hkv,S,Dh)``, ``mask (B,1,1,S)`` -> ``(B,H,1,Dh)``. The
    caller (``CompiledDecode.inputs``) built the mask from the boundary's plan: every row
    sees at least its own new key, and the window is in the mask. With one query at the
    last key, causality hides nothing (bottom-right: ``j <= 0 + S - 1``).
    """
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
    )  # (B,H,1,Dh)


class SlotCache:
    """The cache as the compiled step sees it: per layer ``k, v (B,Hkv,C,Dh)``, the new
    position written at ``slot``, the first ``length`` slots read back."""

    def __init__(self, keys: Sequence, values: Sequence, slot: torch.Tensor, length):
        self.keys, self.values, self.slot, self.length = keys, values, slot, length

    def append(self, index: int, k_new: torch.Tensor, v_new: torch.Tensor):
        """``k_new, v_new (B,Hkv,1,Dh)`` into slot ``slot`` of layer ``index`` -> the views
        ``(B,Hkv,S,Dh)`` of its first ``S = length`` slots."""
        k, v = self.keys[index], self.values[index]  # (B,Hkv,C,Dh)
        k[:, :, self.slot] = k_new  # in place: one position of one layer
        v[:, :, self.slot] = v_new
        return k.narrow(2, 0, self.length), v.narrow(2, 0, self.length)  # (B,Hkv,S,Dh)


class DecodeStep(nn.Module):
    """One decode step of a level-3 decoder-only ``model`` (its parameters, not copies).

    ``forward(ids (B,1), positions (B,), slot (1,), masks, keys, values) -> logits (B,V)``:
    ``masks`` one ``(B,1,1,S)`` bool per distinct window of the layers (in the order of
    ``model.config.layer_windows``' first appearances), ``keys``/``values`` the cache's
    layers ``(B,Hkv,C,Dh)``, written in place at ``slot``.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.windows = tuple(dict.fromkeys(model.config.layer_windows))

    def forward(self, ids, positions, slot, masks, keys, values) -> torch.Tensor:
        if isinstance(keys, torch.Tensor):  # the whole buffers (L,B,Hkv,C,Dh): its layers
            keys, values = keys.unbind(0), values.unbind(0)
        sees = {w: (mask, None) for w, mask in zip(self.windows, masks, strict=True)}
        cache = SlotCache(keys, values, slot, masks[0].shape[-1])
        return self.model.compute(ids, positions, sees, cache)[:, 0]  # (B,1,V) -> (B,V)


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s parameters and buffers by name, in sorted order: the weights the compiled
    step takes as inputs, in the order it takes them."""
    named = dict(model.named_parameters()) | dict(model.named_buffers())
    return {name: named[name] for name in sorted(named)}


class StatelessStep(nn.Module):
    """``DecodeStep`` with the model's weights as inputs: ``forward(state, *step inputs)``,
    ``state`` as ``state_of`` orders it. Compiled this way, the step holds no weight: one
    compiled step serves every model of the same shapes, and loads without copying one."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.step = DecodeStep(model)

    def forward(self, state: dict, ids, positions, slot, masks, keys, values) -> torch.Tensor:
        named = {f"model.{name}": value for name, value in state.items()}
        inputs = (ids, positions, slot, masks, keys, values)
        return torch.func.functional_call(self.step, named, inputs)


class _bare_attention:
    """While tracing: every attention module of ``model`` calls ``masked_sdpa``."""

    def __init__(self, model: nn.Module):
        self.modules = [
            m for m in model.modules() if hasattr(m, "kernels") and hasattr(m, "attend")
        ]

    def __enter__(self):
        self.saved = [m.__dict__.get("kernels") for m in self.modules]
        for m in self.modules:
            m.kernels = replace(m.kernels, attention=masked_sdpa)

    def __exit__(self, *exc):
        for m, kernels in zip(self.modules, self.saved, strict=True):
            if kernels is None:
                del m.kernels  # back to the class attribute
            else:
                m.kernels = kernels


# ----------------------------------------------------------------------------- one-row products


def one_row_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None):
    """``F.linear`` as the compiled step computes it: for one row, ``(x * W).sum(-1)``.

    ``x (..., in)`` with one row in all, ``w (out, in)`` row-major: a dot product per
    output, each reading its row of ``w`` front to back, which inductor fuses into one
    vectorised loop over ``w`` (the elementwise product is never materialised). Any
    other ``x`` keeps the library GEMM.
    """
    if x.numel() != x.shape[-1]:
        y = x @ w.t()  # (..., in) @ (in, out)
    else:
        y = (x.unsqueeze(-2) * w).sum(-1)  # (..., 1, in) * (out, in) -> (..., out)
    return y if bias is None else y + bias


def int8_rows(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``aten._weight_int8pack_mm`` as the compiled step computes it, on a CPU: ``x (B, in)``,
    ``q (out, in)`` int8, ``scale (out,)`` -> ``(B, out)`` in ``x``'s dtype.

    Written as ``one_row_linear``'s dot per output row, so inductor widens each int8 where
    it reads it, inside the loop that streams ``q``: a step reads one byte a weight, at
    about twice the library kernel's rate (docs/decoding.md). One difference from the
    eager kernel: ``x`` arrives rounded to bfloat16 (the kernel takes 16-bit activations),
    and inductor folds that rounding and the widening here into nothing, so compiled the
    products see the float32 activations (the two differ by bfloat16's rounding,
    tests/test_compiled_decode.py; against the float64 truth on SmolLM2, 0.064 compiled
    and 0.056 eager: neither is the closer by design). Keeping the rounding
    (``emulate_precision_casts``) redoes it for every weight read: measured 2x slower.
    """
    products = (x.float().unsqueeze(-2) * q.float()).sum(-1)  # (B,1,in) * (out,in) -> (B,out)
    return (products * scale.float()).to(x.dtype)


def decompositions() -> dict:
    """``torch.export``'s default decompositions, with ``one_row_linear`` for ``aten.linear``
    and ``int8_rows`` for the int8 kernel, and SDPA kept whole: its default decomposition is
    the unfused math (scores, softmax, two batched products), where the call runs PyTorch's
    fused CPU kernel."""
    aten = torch.ops.aten
    table = torch.export.default_decompositions()
    for fused in (
        aten.scaled_dot_product_attention.default,
        aten._scaled_dot_product_flash_attention_for_cpu.default,
    ):
        table.pop(fused, None)
    table[aten.linear.default] = one_row_linear
    table[aten._weight_int8pack_mm.default] = int8_rows
    return table


def row_major_(model: nn.Module) -> nn.Module:
    """Every matrix of ``model`` laid out row-major ``(out, in)``, in place: the layout
    ``one_row_linear`` streams (level 2 keeps a tall matrix column-major, the layout eager
    ``F.linear`` streams fastest; the numbers are the same)."""
    for param in model.parameters():
        if param.ndim == 2 and not param.is_contiguous():
            param.data = param.data.contiguous()
    return model


# ----------------------------------------------------------------------------- the compiler


def compiler_missing() -> str | None:
    """Why the step cannot be compiled here (no C++ compiler on PATH), or None when it can.
    The compiler is inductor's default: ``$CXX``, else ``g++`` (``clang++`` on macOS)."""
    name = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
    if shutil.which(name) is None:
        return f"no C++ compiler ({name}) on PATH, which torch.compile's CPU backend needs"
    return None


@dataclass
class CompileReport:
    """How the step was obtained: ``how`` is ``"compiled"`` (seconds of compiling, once),
    ``"loaded"`` (from the cache) or ``"eager"`` (with ``reason``)."""

    how: str
    seconds: float
    path: Path | None = None
    reason: str | None = None

    def line(self) -> str:
        if self.how == "eager":
            return f"decode eager: {self.reason}"
        if self.how == "loaded":
            return f"decode compiled: loaded in {self.seconds:.1f} s from the cache"
        where = f" (cached in {self.path.parent})" if self.path is not None else ""
        return f"decode compiled in {self.seconds:.1f} s, once{where}"


@lru_cache(maxsize=1)
def _source_digest() -> str:
    """The code the step is made of: the packages of levels 2 and 3 and the shared modules
    (read once, as this process imported them)."""
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for folder in (here, here.parent / "level2_torch_manual", here.parent / "common"):
        for path in sorted(folder.glob("*.py")):
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def cache_key(model: nn.Module, batch: int) -> str:
    """What a compiled step depends on, but the weights' values: the config, the dtype, the
    batch, the weights' format, the code, torch, the CPU's vector instructions, and the
    threads torch runs with (the step is compiled for them)."""
    facts = {
        "config": asdict(model.config),
        "dtype": str(model.dtype),
        "batch": batch,
        "weights": getattr(model, "weights", "float"),
        "code": _source_digest(),
        "torch": torch.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),  # the loops' split over threads (compile_step)
    }
    text = json.dumps(facts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def package_path(model: nn.Module, batch: int, cache_dir: Path | None = None) -> Path:
    """Where the compiled step of ``model`` for ``batch`` rows is kept: ``compiled/`` in the
    user's cache (``levels.registry.cache_dir``), named by ``cache_key``."""
    from ..registry import cache_dir as user_cache

    return (cache_dir or user_cache()) / "compiled" / f"decode-{cache_key(model, batch)}.pt2"


def _example(model: nn.Module, batch: int, length: int):
    """Inputs of the step's shapes: ``length`` slots read, a cache of ``model``'s capacity."""
    cfg, device, dtype = model.config, model.device, model.dtype
    C, Hkv, Dh = cfg.max_seq_len, cfg.kv_heads, cfg.d_head
    ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
    positions = torch.full((batch,), length - 1, dtype=torch.long, device=device)
    slot = torch.full((1,), length - 1, dtype=torch.long, device=device)
    n = len(dict.fromkeys(cfg.layer_windows))
    masks = tuple(
        torch.ones(batch, 1, 1, length, dtype=torch.bool, device=device) for _ in range(n)
    )
    layer = (batch, Hkv, C, Dh)
    keys = tuple(torch.zeros(layer, dtype=dtype, device=device) for _ in range(cfg.n_layers))
    values = tuple(torch.zeros(layer, dtype=dtype, device=device) for _ in range(cfg.n_layers))
    return ids, positions, slot, masks, keys, values


def export_step(model: nn.Module, batch: int):
    """``torch.export`` of the step at ``batch`` rows (``StatelessStep``), ``S`` symbolic in
    ``[2, C - 1]`` (the cache's last slot is decoded eagerly: a view of all ``C`` slots is
    the whole buffer, a case the compiler would have to special-case), with the one-row
    products decomposed."""
    C = model.config.max_seq_len
    S = torch.export.Dim("S", min=2, max=C - 1)
    state = state_of(model)
    args = (state, *_example(model, batch, min(8, C - 1)))
    n_masks, L = len(args[4]), model.config.n_layers
    shapes = (
        {name: None for name in state},
        *(None, None, None),
        ({3: S},) * n_masks,
        (None,) * L,
        (None,) * L,
    )
    with torch.no_grad(), _bare_attention(model):
        program = torch.export.export(StatelessStep(model), args, dynamic_shapes=shapes)
    return program.run_decompositions(decompositions())


def compile_step(model: nn.Module, batch: int, path: Path) -> None:
    """Export the step and compile it ahead of time into ``path`` (a ``.pt2`` package)."""
    import torch._inductor  # the compiler itself, only where it compiles

    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.stem}.{os.getpid()}.tmp.pt2")  # the packager wants .pt2
    try:
        with warnings.catch_warnings():
            # torch's own deprecations between its modules (its pytree's LeafSpec, TorchScript),
            # raised while it exports and compiles: nothing the caller can act on.
            warnings.filterwarnings("ignore", category=FutureWarning, module="copyreg")
            warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch")
            program = export_step(model, batch)
            # Inductor decides which loops to split over threads from the thread count it
            # compiles with: a step compiled for one thread runs on one whatever is set
            # later, and one compiled for two runs its split loops badly on one (measured:
            # no faster than eager). So a step is compiled for the threads torch has now,
            # and kept under that count (cache_key).
            configs = {"cpp.threads": torch.get_num_threads()}
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(scratch), inductor_configs=configs
            )
        os.replace(scratch, path)  # atomic: a half-written package is never seen
    finally:
        scratch.unlink(missing_ok=True)


class CompiledDecode:
    """A compiled decode step bound to a model and a batch size; called as the edge's
    ``_decoder`` is for one new token per row: ``(ids (B,1), steps, cache) -> (B,1,V)``
    (the caller commits the cache's new position).

    ``whole_cache``: every step reads all ``C`` slots, the ones past the new position
    masked (on a GPU: CUDA graphs replay fixed shapes only); otherwise the step reads the
    first ``S = length + 1`` slots, ``S`` the one symbolic size of the compiled program.
    """

    def __init__(self, model, batch: int, run: Callable, report, *, whole_cache=False):
        self.model, self.batch, self.run, self.report = model, batch, run, report
        self.whole_cache = whole_cache
        self.windows = tuple(dict.fromkeys(model.config.layer_windows))

    def fits(self, ids: torch.Tensor, cache) -> bool:
        """Whether this step can take the next position: the batch it was compiled for, the
        cache's own layout, and (reading a prefix) a slot before the cache's last."""
        last = self.model.config.max_seq_len - (0 if self.whole_cache else 1)
        return ids.shape[0] == self.batch and cache.length + 1 <= last and hasattr(cache, "k")

    def inputs(self, ids: torch.Tensor, steps: dict[int | None, Step], cache):
        """The step's inputs from the boundary's plan: positions, the slot, a mask per window,
        the cache (its layers, or the whole buffers, marked as fixed addresses, on a GPU)."""
        device, B, S = ids.device, ids.shape[0], cache.length + 1
        step = next(iter(steps.values()))
        offset = step.offset
        if isinstance(offset, int):
            positions = torch.full((B,), offset, dtype=torch.long, device=device)
        else:
            positions = torch.tensor(offset, dtype=torch.long, device=device)
        slot = torch.full((1,), cache.length, dtype=torch.long, device=device)
        width = cache.capacity if self.whole_cache else S
        masks = tuple(self._mask(steps[w], B, S, width, device) for w in self.windows)
        if self.whole_cache:
            return ids, positions, slot, masks, cache.k, cache.v
        return ids, positions, slot, masks, tuple(cache.k.unbind(0)), tuple(cache.v.unbind(0))

    @staticmethod
    def _mask(step: Step, B: int, S: int, width: int, device) -> torch.Tensor:
        """``(B,1,1,width)``: the step's mask, or its window by slot, or every key, over the
        first ``S`` slots; the slots past them hidden."""
        keys = torch.arange(width, device=device)
        if step.mask is not None:
            mask = torch.tensor(step.mask, dtype=torch.bool, device=device).reshape(B, 1, 1, S)
            return torch.nn.functional.pad(mask, (0, width - S))  # False past the new slot
        visible = keys < S if step.window is None else (keys < S) & (keys > (S - 1) - step.window)
        return visible.expand(B, 1, 1, width)

    def __call__(self, ids: torch.Tensor, steps: dict, cache) -> torch.Tensor:
        return self.run(*self.inputs(ids, steps, cache)).unsqueeze(1)  # (B,V) -> (B,1,V)


def build(model: nn.Module, batch: int, *, cache_dir: Path | None = None) -> CompiledDecode:
    """The compiled step of ``model`` for ``batch`` rows: on a CPU loaded from the cache, or
    compiled and cached; on a GPU, ``torch.compile``'s (compiled at its first call)."""
    start = time.perf_counter()
    if model.device.type == "cuda":
        step = torch.compile(DecodeStep(model), mode="reduce-overhead", fullgraph=True)
        report = CompileReport("compiled", 0.0, reason="torch.compile, reduce-overhead")
        run = _with_bare_attention(model, _static_cache(step))
        return CompiledDecode(model, batch, run, report, whole_cache=True)
    row_major_(model)
    path = package_path(model, batch, cache_dir)
    how = "loaded"
    if not path.is_file():
        compile_step(model, batch, path)
        how = "compiled"
    step = _Runner(_load(path), list(state_of(model).values()))
    return CompiledDecode(model, batch, step, CompileReport(how, time.perf_counter() - start, path))


def _load(path: Path):
    """The package's library, by the loader ``torch._inductor.aoti_load_package`` wraps
    (importing ``torch._inductor`` itself costs two seconds of every start)."""
    return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)


class _Runner:
    """Calls the loaded library with the model's weights and the step's inputs, flattened
    in the order it was exported with (``state_of``'s, then the step's)."""

    def __init__(self, loader, weights: list[torch.Tensor]):
        self.loader, self.weights = loader, weights

    def __call__(self, ids, positions, slot, masks, keys, values) -> torch.Tensor:
        inputs = [*self.weights, ids, positions, slot, *masks, *keys, *values]
        return self.loader.boxed_run(inputs)[0]


def _static_cache(step: Callable) -> Callable:
    """``step`` with the cache's buffers marked as fixed addresses: CUDA graphs then write
    into them in place (the buffers of a new cache are marked, and the graph re-recorded,
    once)."""

    def run(ids, positions, slot, masks, keys, values):
        for buffer in (keys, values):
            torch._dynamo.mark_static_address(buffer)
        return step(ids, positions, slot, masks, keys, values)

    return run


def _with_bare_attention(model: nn.Module, step: Callable) -> Callable:
    """``step`` called with ``model``'s attention hooks on ``masked_sdpa`` (what
    ``torch.compile`` traces at its first call, and checks on every call)."""

    def run(*args):
        with _bare_attention(model):
            return step(*args)

    return run
