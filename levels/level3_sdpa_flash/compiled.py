"""A decode step compiled whole: level 3's own modules, one token per row, fixed shapes.

Decoding one token reads every weight once, so a step is as fast as the weights
stream from memory (docs/decoding.md). Eager PyTorch falls short of that twice:
its one-row ``F.linear`` streams the weights at about half the rate a plain
read does, and each of a step's two thousand tensor calls costs microseconds of
Python and dispatch. A compiler fixes both at once, but only over the *whole*
step at shapes it can fix: compiling the layers one by one leaves the head, the
cache's growing views and the public methods' Python outside (1.2x, measured in
docs/decoding.md).

``DecodeStep`` is that whole step: the model's own ``Transformer.forward`` (embedding,
blocks, norm, head) on one token per row, wrapped, not a copy of it. What makes its
shapes fixed:

* the new token of each row goes into cache slot ``slot`` (a tensor, not an
  int the compiler would specialise on), at its position ``positions (B,1)``; a pass of
  ``T`` tokens a row (speculative decoding's verification of ``T - 1`` guesses) into the
  ``T`` slots of ``slot (T,)``, compiled for that ``T``;
* ``key_positions (B,S)``, every filled slot's position (the new one's included),
  written into the cache by the caller before the step: ``S`` is the one size left
  symbolic (it grows by one a step; one compiled program serves every length), and
  the keys are read as views of the cache's first ``S`` slots;
* what each query may see is built inside the step from the positions, as the
  model always builds it (``semantics.visible``); the inputs were checked before
  the step by whoever made them, so inside it the attention core is the bare SDPA call;
* the cache's layers are separate inputs, each written in place at ``slot``.

The compiler and its cache, on a CPU: ``torch.export`` traces the step, one
decomposition writes each product of a few rows ``x @ W.T`` as a dot product per
output and row, ``(W * x).sum(-1)`` over a row-major ``W`` (what inductor turns into
a vectorised loop a row that streams ``W`` once; the same product of one row lowered
to a library GEMM streams it at eager's rate), and AOTInductor compiles the program
into a shared library, kept in the user's cache (``levels.registry.cache_dir()``
``/compiled``) under a key of everything it depends on but the weights' values:
the weights stay the model's own tensors, handed to the library at load
(user-managed constants), so one compiled file serves every model of the same
shapes and a later start loads it in a fraction of a second.
(``torch.compile``'s just-in-time path with inductor's weight freezing, tried
first, re-compiles the step in every new process: its frozen, prepacked
constants keep its graph out of inductor's cache.)

On a GPU the same step goes through ``torch.compile(mode="reduce-overhead")``
(CUDA graphs replay the step's hundreds of kernel launches as one), reading the whole
cache, its unfilled slots at position ``-1`` (seen by no query), so that every step has
the same shapes.
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

from ..level2_torch_manual.arrays import copied
from ..level2_torch_manual.models import Transformer
from . import rows as kernel

# ----------------------------------------------------------------------------- the step


def masked_sdpa(q, k, v, *, mask=None, scale=None, dropout_p=0.0):
    """The attention core inside the compiled step: SDPA under the step's mask, unchecked.

    ``q (B,H,1,Dh)``, ``k``/``v (B,Hkv,S,Dh)``, ``mask (B,1,1,S)`` -> ``(B,H,1,Dh)``. The mask
    came from the positions (every row sees at least its own new key).
    """
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
    )  # (B,H,1,Dh)


class SlotCache:
    """The cache as the compiled step sees it: per layer ``k, v (B,Hkv,C,Dh)``, the new slots
    written at ``slot (T,)``, the first ``S`` read back, ``S`` the width of ``key_positions``."""

    def __init__(self, keys: Sequence, values: Sequence, slot: torch.Tensor, key_positions):
        self.keys, self.values, self.slot, self.key_positions = keys, values, slot, key_positions

    def extend(self, positions: torch.Tensor) -> torch.Tensor:
        """The keys' positions ``(B,S)``: the caller wrote the new one already."""
        return self.key_positions

    def update(self, index: int, k_new: torch.Tensor, v_new: torch.Tensor):
        """``k_new, v_new (B,Hkv,T,Dh)`` into slots ``slot`` of layer ``index`` -> the views
        ``(B,Hkv,S,Dh)`` of its first ``S`` slots."""
        k, v = self.keys[index], self.values[index]  # (B,Hkv,C,Dh)
        k[:, :, self.slot] = k_new  # in place: T positions of one layer
        v[:, :, self.slot] = v_new
        S = self.key_positions.shape[1]
        return k.narrow(2, 0, S), v.narrow(2, 0, S)  # (B,Hkv,S,Dh)


class DecodeStep(nn.Module):
    """One pass of ``T`` tokens a row of a level-3 decoder-only ``model`` (its parameters, not
    copies): ``forward(ids (B,T), positions (B,T), slot (T,), key_positions (B,S), keys,
    values) -> logits (B,T,V)``, ``keys``/``values`` the cache's layers ``(B,Hkv,C,Dh)``,
    written in place at ``slot``: ``Transformer.forward`` over a ``SlotCache``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids, positions, slot, key_positions, keys, values) -> torch.Tensor:
        if isinstance(keys, torch.Tensor):  # the whole buffers (L,B,Hkv,C,Dh): its layers
            keys, values = keys.unbind(0), values.unbind(0)
        cache = SlotCache(keys, values, slot, key_positions)
        return Transformer.forward(self.model, ids, positions, cache)  # (B,T,V)


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

    def forward(self, state: dict, ids, positions, slot, key_positions, keys, values):
        named = {f"model.{name}": value for name, value in state.items()}
        inputs = (ids, positions, slot, key_positions, keys, values)
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


# ----------------------------------------------------------------------------- products of few rows


FEW_ROWS = 6  # up to this many rows, a dot product per row and output; beyond, the GEMM


def _by_kernel(rows: int, w: torch.Tensor) -> bool:
    """Whether the product of ``rows`` rows by ``w`` is ``rows.cpp``'s (where it is built):
    float32 weights at 2 to ``MAX_ROWS`` rows (one row: inductor's loop already streams ``w``
    at the read's rate) and bfloat16 ones at 1 to ``MAX_ROWS`` (at one row no faster than
    inductor's loop: a SmolLM2 step 1.55x float32's with it, 1.59x without, in turn;
    docs/decoding.md)."""
    if rows > kernel.MAX_ROWS or not kernel.available():
        return False
    return (w.dtype == torch.float32 and rows >= 2) or w.dtype == torch.bfloat16


def few_rows_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None):
    """``F.linear`` as the compiled step computes it: for a few rows, ``rows.cpp``'s product
    (``_by_kernel``), else a dot product per row and output, ``(W * x_m).sum(-1)`` for each
    row ``m``.

    ``x (..., in)`` with ``M`` rows in all, ``w (out, in)`` row-major. Inductor turns each
    row's products into one vectorised loop that reads ``w`` front to back (the elementwise
    product is never materialised): for one row, the decode step, it streams ``w`` at about
    twice the rate of the library GEMM (docs/decoding.md). For ``M`` rows, speculative
    decoding's ``k + 1``, the loops read ``w`` ``M`` times, and still beat the GEMM, which
    streams a matrix of so few rows slowly. Measured on SmolLM2 at level 3, one thread
    (2026-12-06, against a one-token step): a pass of 3 tokens costs 1.6 steps and one of 5
    tokens 2.8, where the library GEMM's cost 4.1 and 3.2. Beyond ``FEW_ROWS`` rows the
    product stays the GEMM (3.5 steps at 9 tokens), whose cost grows slower than a read
    of ``w`` a row. The kernel reads ``w`` once for all ``M`` rows (``rows.py``).
    """
    rows = x.numel() // x.shape[-1]
    if _by_kernel(rows, w):
        y = kernel.rows_linear(x.reshape(rows, -1), w)  # (M, out), float32 sums
        y = y.reshape(*x.shape[:-1], w.shape[0])  # (..., out)
    elif rows > FEW_ROWS:
        y = x @ w.t()  # (..., in) @ (in, out)
    else:
        flat = x.reshape(rows, -1)  # (M, in)
        y = torch.stack([(w * flat[m]).sum(-1) for m in range(rows)])  # (M, out)
        y = y.reshape(*x.shape[:-1], w.shape[0])  # (..., out)
    return y if bias is None else y + bias


def int8_rows(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``aten._weight_int8pack_mm`` as the compiled step computes it, on a CPU: ``x (B, in)``,
    ``q (out, in)`` int8, ``scale (out,)`` -> ``(B, out)`` in ``x``'s dtype.

    ``rows.cpp``'s product where it is built (one byte a weight read, widened in registers,
    float32 sums, the scale applied to each sum), else ``few_rows_linear``'s dot per output
    row, so inductor widens each int8 where it reads it, inside the loop that streams ``q``:
    a step reads one byte a weight, at about twice the library kernel's rate
    (docs/decoding.md). One difference from the eager kernel, either way: ``x`` arrives
    rounded to bfloat16 (the kernel takes 16-bit activations), and inductor folds that
    rounding and the widening here into nothing, so compiled the products see the float32
    activations (the two differ by bfloat16's rounding, tests/test_compiled_decode.py;
    against the float64 truth on SmolLM2, 0.064 compiled and 0.056 eager: neither is the
    closer by design). Keeping the rounding (``emulate_precision_casts``) redoes it for
    every weight read: measured 2x slower.
    """
    if x.shape[0] <= kernel.MAX_ROWS and kernel.available():
        return kernel.rows_linear(x.float(), q, scale).to(x.dtype)  # (B, out)
    products = (x.float().unsqueeze(-2) * q.float()).sum(-1)  # (B,1,in) * (out,in) -> (B,out)
    return (products * scale.float()).to(x.dtype)


def decompositions() -> dict:
    """``torch.export``'s default decompositions, with ``few_rows_linear`` for ``aten.linear``
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
    table[aten.linear.default] = few_rows_linear
    table[aten._weight_int8pack_mm.default] = int8_rows
    return table


def row_major_(model: nn.Module) -> nn.Module:
    """Every matrix of ``model`` laid out row-major ``(out, in)``, in place: the layout
    ``few_rows_linear`` streams (level 2 keeps a tall matrix column-major, the layout eager
    ``F.linear`` streams fastest; the numbers are the same)."""
    for param in model.parameters():
        if param.ndim == 2 and not param.is_contiguous():
            param.data = copied(param.data)  # in memory of huge pages (arrays.copied)
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


def cache_key(model: nn.Module, batch: int, tokens: int = 1) -> str:
    """What a compiled step depends on, but the weights' values: the config, the dtype, the
    batch and the tokens a row, the weights' format, the code, torch, the CPU's vector
    instructions, and the threads torch runs with (the step is compiled for them)."""
    facts = {
        "config": asdict(model.config),
        "dtype": str(model.dtype),
        "batch": batch,
        "tokens": tokens,
        "weights": getattr(model, "weights", "float"),
        "code": _source_digest(),
        "torch": torch.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),  # the loops' split over threads (compile_step)
        "rows_kernel": kernel.digest() if kernel.available() else None,  # the step calls it
    }
    text = json.dumps(facts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def package_path(
    model: nn.Module, batch: int, cache_dir: Path | None = None, tokens: int = 1
) -> Path:
    """Where the compiled step of ``model`` for ``batch`` rows of ``tokens`` is kept:
    ``compiled/`` in the user's cache (``levels.registry.cache_dir``), named by ``cache_key``."""
    from ..registry import cache_dir as user_cache

    name = f"decode-{cache_key(model, batch, tokens)}.pt2"
    return (cache_dir or user_cache()) / "compiled" / name


def _example(model: nn.Module, batch: int, length: int, tokens: int = 1):
    """Inputs of the step's shapes: ``tokens`` new a row after the cache's first slots, the
    keys ``length`` slots in all, a cache of ``model``'s capacity."""
    cfg, device, dtype = model.config, model.device, model.dtype
    C, Hkv, Dh = cfg.max_seq_len, cfg.kv_heads, cfg.d_head
    start = length - tokens  # the slot of the first new token
    ids = torch.zeros(batch, tokens, dtype=torch.long, device=device)
    positions = torch.arange(start, length, device=device).expand(batch, tokens).contiguous()
    slot = torch.arange(start, length, device=device)
    key_positions = torch.arange(length, device=device).expand(batch, length).contiguous()
    layer = (batch, Hkv, C, Dh)
    keys = tuple(torch.zeros(layer, dtype=dtype, device=device) for _ in range(cfg.n_layers))
    values = tuple(torch.zeros(layer, dtype=dtype, device=device) for _ in range(cfg.n_layers))
    return ids, positions, slot, key_positions, keys, values


def export_step(model: nn.Module, batch: int, tokens: int = 1):
    """``torch.export`` of the step at ``batch`` rows of ``tokens`` (``StatelessStep``), ``S``
    symbolic in ``[tokens + 1, C - 1]`` (the cache's last slot is decoded eagerly: a view of
    all ``C`` slots is the whole buffer, a case the compiler would have to special-case),
    with the one-row products decomposed."""
    C = model.config.max_seq_len
    S = torch.export.Dim("S", min=tokens + 1, max=C - 1)
    state = state_of(model)
    args = (state, *_example(model, batch, min(tokens + 8, C - 1), tokens))
    L = model.config.n_layers
    shapes = ({name: None for name in state}, None, None, None, {1: S}, (None,) * L, (None,) * L)
    with torch.no_grad(), _bare_attention(model):
        program = torch.export.export(StatelessStep(model), args, dynamic_shapes=shapes)
    return program.run_decompositions(decompositions())


def compile_step(model: nn.Module, batch: int, path: Path, tokens: int = 1) -> None:
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
            program = export_step(model, batch, tokens)
            # Inductor decides which loops to split over threads from the thread count it
            # compiles with: a step compiled for one thread runs on one whatever is set
            # later, and one compiled for two runs its split loops badly on one (measured:
            # no faster than eager). So a step is compiled for the threads torch has now,
            # and kept under that count (cache_key).
            configs = {"cpp.threads": torch.get_num_threads()}
            if tokens > 1:
                # A pass of several tokens: a pointwise producer of more than four operations
                # (a norm) is computed once into a buffer, not inlined into the product of
                # few rows, which would redo it for every row of W (measured on SmolLM2,
                # passes of 3 and 5 tokens: 1.25x and 1.14x faster).
                configs["realize_opcount_threshold"] = 4
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(scratch), inductor_configs=configs
            )
        os.replace(scratch, path)  # atomic: a half-written package is never seen
    finally:
        scratch.unlink(missing_ok=True)


class CompiledDecode:
    """A compiled step bound to a model, a batch size and the tokens a row, called as the
    plain pass is: ``(ids (B,T), positions (B,T), cache) -> logits (B,T,V)``.

    ``whole_cache``: every step reads all ``C`` slots, the unfilled ones at position ``-1``
    (on a GPU: CUDA graphs replay fixed shapes only); otherwise the step reads the first
    ``S = length + T`` slots, ``S`` the one symbolic size of the compiled program.
    """

    def __init__(self, model, batch: int, run: Callable, report, *, tokens=1, whole_cache=False):
        self.model, self.batch, self.tokens, self.run = model, batch, tokens, run
        self.report, self.whole_cache = report, whole_cache

    def fits(self, ids: torch.Tensor, cache) -> bool:
        """Whether this step can take the pass: the batch and tokens it was compiled for, the
        static cache's layout, and (reading a prefix) room before the cache's last slot."""
        last = self.model.config.max_seq_len - (0 if self.whole_cache else 1)
        shape = tuple(ids.shape) == (self.batch, self.tokens)
        return shape and cache.length + self.tokens <= last and hasattr(cache, "k")

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        slot = torch.arange(cache.length, cache.length + self.tokens, device=ids.device)
        key_positions = cache.extend(positions)  # (B,S): the new slots' positions written
        if self.whole_cache:
            inputs = (ids, positions, slot, cache.positions, cache.k, cache.v)
        else:
            # The compiled library trusts the strides it was exported with: a contiguous
            # (B,S), while the cache's is a narrow of its (B,C) buffer (rows C apart).
            key_positions = key_positions.contiguous()  # (B,S): B x S integers, copied
            inputs = (ids, positions, slot, key_positions, cache.k.unbind(0), cache.v.unbind(0))
        return self.run(*inputs)  # (B,T,V)


def build(
    model: nn.Module, batch: int, tokens: int = 1, *, cache_dir: Path | None = None
) -> CompiledDecode:
    """The compiled step of ``model`` for ``batch`` rows of ``tokens``: on a CPU loaded from the
    cache, or compiled and cached; on a GPU, ``torch.compile``'s (compiled at its first call)."""
    start = time.perf_counter()
    if model.device.type == "cuda":
        step = torch.compile(DecodeStep(model), mode="reduce-overhead", fullgraph=True)
        report = CompileReport("compiled", 0.0, reason="torch.compile, reduce-overhead")
        run = _with_bare_attention(model, _static_cache(step))
        return CompiledDecode(model, batch, run, report, tokens=tokens, whole_cache=True)
    row_major_(model)
    path = package_path(model, batch, cache_dir, tokens)
    how = "loaded"
    if not path.is_file():
        compile_step(model, batch, path, tokens)
        how = "compiled"
    step = _Runner(_load(path), list(state_of(model).values()))
    report = CompileReport(how, time.perf_counter() - start, path)
    return CompiledDecode(model, batch, step, report, tokens=tokens)


def _load(path: Path):
    """The package's library, by the loader ``torch._inductor.aoti_load_package`` wraps
    (importing ``torch._inductor`` itself costs two seconds of every start)."""
    return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)


class _Runner:
    """Calls the loaded library with the model's weights and the step's inputs, flattened
    in the order it was exported with (``state_of``'s, then the step's)."""

    def __init__(self, loader, weights: list[torch.Tensor]):
        self.loader, self.weights = loader, weights

    def __call__(self, ids, positions, slot, key_positions, keys, values) -> torch.Tensor:
        inputs = [*self.weights, ids, positions, slot, key_positions, *keys, *values]
        return self.loader.boxed_run(inputs)[0]


def _static_cache(step: Callable) -> Callable:
    """``step`` with the cache's buffers marked as fixed addresses: CUDA graphs then write
    into them in place (the buffers of a new cache are marked, and the graph re-recorded,
    once)."""

    def run(ids, positions, slot, key_positions, keys, values):
        for buffer in (keys, values, key_positions):
            torch._dynamo.mark_static_address(buffer)
        return step(ids, positions, slot, key_positions, keys, values)

    return run


def _with_bare_attention(model: nn.Module, step: Callable) -> Callable:
    """``step`` called with ``model``'s attention hooks on ``masked_sdpa`` (what
    ``torch.compile`` traces at its first call, and checks on every call)."""

    def run(*args):
        with _bare_attention(model):
            return step(*args)

    return run
