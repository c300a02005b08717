"""What the compile check compiles: every level-4 kernel in every launch it can get.

Motivation
----------
A launch compiles one *specialisation* of a kernel: its compile-time constants
(tiles, head block, causal, window, mask), the dtypes of its pointers, and two
facts Triton reads off each integer argument (equal to 1, which becomes a
constant; a multiple of 16, which lets it vectorise). Which specialisations a
user can reach is decided by the host code, so this module asks the host code:
each ``Job`` is turned into the arguments the launcher would pass, by the
launchers' own argument builders (``forward_arguments``, ``gradient_arguments``,
...), called with ``device="meta"`` tensors (shapes, strides and dtypes, no
memory). ``compile_inputs`` then derives the signature from them with Triton's
rules (``argument_type``).

The matrix
----------
Per kernel, the launches it can get: the autotuner's candidates (level 4's
tiles.py) or its one fixed launch (decode tiles, the delta pre-pass, the merge,
the paged decode, the norms), each in float16, bfloat16 and float32 (``ieee`` dot precision), for
sm_80 and sm_90 (``TARGETS``). Every launch compiles at head widths 64, 128 and
256 with every flag on at once (causal + window + mask + grouped-query heads:
the most code and, the mask being a pipelined tile, the most shared memory). The
first launch of each kernel and dtype also compiles an odd head width, 111
(padded to 128, its strides no multiple of 16: unvectorised loads), and every
flag off (``plain``); in float16 it compiles the flags one by one as well, a
pairwise covering set (with the all-on case, every pair of flags in all four
on/off combinations: ``FLAG_VARIANTS``); the flags change the kernels' masks
and loop bounds, not their dtype rules. The paged decode kernel reads no mask and needs
no causal flag (a row's count bounds its keys): of the flags it takes the window and
grouped-query heads, both on in its "everything" launch. The norms take widths 64, 768,
4096 and the widest row they fuse with bias; at 768 also without bias, and RMSNorm.

The full product would be some 4000 compiles, hours on two cores; these
422 are the part of it in which every configuration meets every dtype, head
width and target, and every flag meets every other (check.py gives their
cost).

The kernel modules are this process's (``kernels()``, the package docstring):
level 4's own in the ``ladder check`` process, which only plans, and the ones
loaded on their own in a compile worker, which builds the compile inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import triton

from . import kernels

_kernels = kernels()  # level 4's kernel modules, as this process has them (the package docstring)
flash_backward, flash_decode = _kernels.flash_backward, _kernels.flash_decode
paged_decode = _kernels.paged_decode
flash_forward, fused_layer_norm = _kernels.flash_forward, _kernels.fused_layer_norm
DKDV_SHAPES, DQ_SHAPES, FORWARD_SHAPES = (
    _kernels.tiles.DKDV_SHAPES,
    _kernels.tiles.DQ_SHAPES,
    _kernels.tiles.FORWARD_SHAPES,
)
decode_tiles, dtype_class, head_block = (
    _kernels.tiles.decode_tiles,
    _kernels.tiles.dtype_class,
    _kernels.tiles.head_block,
)


@dataclass(frozen=True)
class Target:
    """A GPU architecture to compile for."""

    arch: int  # compute capability * 10, Triton's GPUTarget arch
    shared_limit: int  # bytes of shared memory one program may use (the opt-in maximum)
    gpus: str  # the GPUs it stands for, for the report


# The opt-in maximum of shared memory per thread block, which Triton's launcher checks
# a kernel against (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, triton's
# backends/nvidia/driver.c). CUDA C++ Programming Guide, table "Technical Specifications
# per Compute Capability", row "Maximum amount of shared memory per thread block": 163 KB
# for 8.0, 99 KB for 8.6 and 8.9, 227 KB for 9.0
# (https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#features-and-technical-specifications);
# the NVIDIA Ampere and Hopper tuning guides (section "Shared Memory") give the same 163
# and 227 KB for the A100 and the H100. 163 KiB = 166912 and 227 KiB = 232448 bytes, the
# values torch reports as ``shared_memory_per_block_optin`` on those GPUs.
# Offline only: on a GPU the prune reads the device's own limit (tiles.cuda_facts).
TARGETS = {
    "sm_80": Target(arch=80, shared_limit=166912, gpus="A100"),
    "sm_90": Target(arch=90, shared_limit=232448, gpus="H100, H200"),
}
# Other GPUs whose measurements are sm_80's (tiles.shared_memory_target): compiled only by
# the test that checks they need the same bytes (99 KB per thread block, as above).
FAMILY = {
    "sm_86": Target(arch=86, shared_limit=101376, gpus="A10, RTX 30xx"),
    "sm_89": Target(arch=89, shared_limit=101376, gpus="L4, L40, RTX 40xx"),
}

MATRIX_DTYPES = ("float16", "bfloat16", "float32")
HEADS = (64, 128, 256)
ODD_HEAD = 111  # padded to a block of 128; strides no multiple of 16
NORM_WIDTHS = (64, 768, 4096, None)  # None: the widest row the fused kernels take (per dtype)
NORM_KINDS_AT = 768  # the width at which every norm kind compiles (elsewhere: LayerNorm with bias)

# (causal, window, mask, grouped-query heads). EVERYTHING at every size; the rest at head 64:
# with EVERYTHING they cover each pair of flags in all four on/off combinations.
EVERYTHING = (True, True, True, True)
FLAG_VARIANTS = (
    (False, False, False, False),
    (False, True, True, True),
    (True, False, True, True),
    (True, True, False, True),
    (True, True, True, False),
)
FLAG_NAMES = ("causal", "window", "mask", "gqa")
NORM_KINDS = ("layernorm", "layernorm-nobias", "rmsnorm")

# A representative call: batch 2, 8 query heads (2 key/value heads when grouped), 1000
# queries and keys (a length no multiple of 16, as a real one is), a window of 256.
B, H, H_GROUPED, LENGTH, WINDOW = 2, 8, 2, 1000, 256
DECODE_T, DECODE_S, DECODE_SPLITS = 1, 4096, 8  # one decode step against a 4096-key cache
PAGED_BLOCKS, PAGED_BS = 4096, 16  # a server's pool: 4096 blocks of 16 positions (its default)
NORM_ROWS = 4096


@dataclass(frozen=True)
class Job:
    """One compile: a kernel in one launch configuration, dtype, size and variant, for a target."""

    kernel: str  # a key of KERNELS
    tiles: tuple[int, int, int, int] | None  # (BLOCK_M, BLOCK_N, num_warps, num_stages) or None
    tuned: bool  # one of the autotuner's candidates (the prune may drop it), else a fixed launch
    dtype: str  # one of MATRIX_DTYPES
    size: int  # head width (attention) or row width (norms)
    variant: str  # "causal+window+mask+gqa", "plain", ... or a norm kind
    target: str  # "sm_80" or "sm_90"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        tiles = data["tiles"]
        return cls(**{**data, "tiles": tuple(tiles) if tiles is not None else None})

    @property
    def block(self) -> int:
        """The padded width the kernel compiles for: the head block, or the norm's row block."""
        return (
            triton.next_power_of_2(self.size)
            if KERNELS[self.kernel].norm
            else head_block(self.size)
        )

    def describe(self) -> str:
        tiles = "fixed" if self.tiles is None else "{}x{} w{} s{}".format(*self.tiles)
        return f"{self.kernel} [{tiles}] {self.dtype} size {self.size} {self.variant} {self.target}"


def variant_name(flags: tuple[bool, bool, bool, bool]) -> str:
    return "+".join(name for name, on in zip(FLAG_NAMES, flags, strict=True) if on) or "plain"


def variant_flags(name: str) -> dict[str, bool]:
    parts = set(name.split("+"))
    return {flag: flag in parts for flag in FLAG_NAMES}


# ---------------------------------------------------------------------------
# Meta tensors: the shapes, strides and dtypes of a real call, without memory
# ---------------------------------------------------------------------------


def _meta(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _attention_inputs(dtype: torch.dtype, Dh: int, variant: str, T: int, S: int):
    """q (B,H,T,Dh), k, v (B,Hkv,S,Dh) and the mask as flash_attention hands it to the
    kernels: a (B,1,T,S) bool expanded to (B,H,T,S), stride 0 over heads (or None)."""
    flags = variant_flags(variant)
    Hkv = H_GROUPED if flags["gqa"] else H
    q = _meta(B, H, T, Dh, dtype=dtype)
    k, v = _meta(B, Hkv, S, Dh, dtype=dtype), _meta(B, Hkv, S, Dh, dtype=dtype)
    mask = _meta(B, 1, T, S, dtype=torch.bool).expand(B, H, T, S) if flags["mask"] else None
    window = WINDOW if flags["window"] else None
    return q, k, v, mask, flags["causal"], 1.0 / math.sqrt(Dh), window


def _forward(job: Job):
    T, S = (DECODE_T, DECODE_S) if not job.tuned else (LENGTH, LENGTH)
    q, k, v, mask, causal, scale, window = _attention_inputs(
        _torch_dtype(job.dtype), job.size, job.variant, T, S
    )
    out, lse = _meta(*q.shape, dtype=q.dtype), _meta(B * H, T, dtype=torch.float32)
    args, constants = flash_forward.forward_arguments(
        q, k, v, mask, out, lse, causal, scale, window
    )
    return flash_forward._attn_fwd_kernel, args, constants


def _gradients(job: Job, which: str):
    q, k, v, mask, causal, scale, window = _attention_inputs(
        _torch_dtype(job.dtype), job.size, job.variant, LENGTH, LENGTH
    )
    d_out = _meta(*q.shape, dtype=q.dtype)
    lse, delta = (
        _meta(B * H, LENGTH, dtype=torch.float32),
        _meta(B * H, LENGTH, dtype=torch.float32),
    )
    grads = (_meta(*k.shape, dtype=k.dtype), _meta(*v.shape, dtype=v.dtype))
    kernel = flash_backward._attn_bwd_dkdv_kernel
    if which == "dq":
        grads, kernel = (_meta(*q.shape, dtype=q.dtype),), flash_backward._attn_bwd_dq_kernel
    args, constants = flash_backward.gradient_arguments(
        q, k, v, mask, d_out, lse, delta, grads, causal, scale, window
    )
    return kernel, args, constants


def _delta(job: Job):
    out = _meta(B, H, LENGTH, job.size, dtype=_torch_dtype(job.dtype))
    delta = _meta(B * H, LENGTH, dtype=torch.float32)
    args, constants = flash_backward.delta_arguments(out, _meta(*out.shape, dtype=out.dtype), delta)
    return flash_backward._attn_bwd_delta_kernel, args, constants


def _decode_split(job: Job):
    q, k, v, mask, causal, scale, window = _attention_inputs(
        _torch_dtype(job.dtype), job.size, job.variant, DECODE_T, DECODE_S
    )
    split_keys = DECODE_S // DECODE_SPLITS
    out_part = _meta(B * H, DECODE_SPLITS, DECODE_T, job.size, dtype=torch.float32)
    lse_part = _meta(B * H, DECODE_SPLITS, DECODE_T, dtype=torch.float32)
    args, constants = flash_decode.split_arguments(
        q,
        k,
        v,
        mask,
        out_part,
        lse_part,
        causal,
        scale,
        window,
        split_keys,
        decode_tiles(job.dtype).block_n,
    )
    return flash_decode._decode_split_kernel, args, constants


def _decode_merge(job: Job):
    out_part = _meta(B * H, DECODE_SPLITS, DECODE_T, job.size, dtype=torch.float32)
    lse_part = _meta(B * H, DECODE_SPLITS, DECODE_T, dtype=torch.float32)
    out = _meta(B, H, DECODE_T, job.size, dtype=_torch_dtype(job.dtype))
    lse = _meta(B * H, DECODE_T, dtype=torch.float32)
    args, constants = flash_decode.merge_arguments(out_part, lse_part, out, lse)
    return flash_decode._decode_merge_kernel, args, constants


def _paged_decode(job: Job):
    """A decode step over a server's paged cache: ``PAGED_BLOCKS`` blocks of ``PAGED_BS``
    positions, a table of ``DECODE_S / PAGED_BS`` blocks a row (the flags it reads: window,
    grouped-query heads; its causality and padding come from the counts, no mask)."""
    dtype, flags = _torch_dtype(job.dtype), variant_flags(job.variant)
    Hkv = H_GROUPED if flags["gqa"] else H
    q, out = _meta(B, H, job.size, dtype=dtype), _meta(B, H, job.size, dtype=dtype)
    k_pool = _meta(PAGED_BLOCKS, Hkv, PAGED_BS, job.size, dtype=dtype)
    v_pool = _meta(PAGED_BLOCKS, Hkv, PAGED_BS, job.size, dtype=dtype)
    tables = _meta(B, DECODE_S // PAGED_BS, dtype=torch.int32)
    counts = _meta(B, dtype=torch.int32)
    window = WINDOW if flags["window"] else None
    args, constants = paged_decode.paged_arguments(
        q, k_pool, v_pool, tables, counts, out, 1.0 / math.sqrt(job.size), window
    )
    return paged_decode._paged_decode_kernel, args, constants


def _norm(job: Job, direction: str):
    dtype, D = _torch_dtype(job.dtype), job.size
    x2, weight = _meta(NORM_ROWS, D, dtype=dtype), _meta(D, dtype=dtype)
    bias = _meta(D, dtype=dtype) if job.variant == "layernorm" else None
    rms = job.variant == "rmsnorm"
    mean, rstd = _meta(NORM_ROWS, dtype=torch.float32), _meta(NORM_ROWS, dtype=torch.float32)
    if direction == "forward":
        args, constants = fused_layer_norm.norm_forward_arguments(
            x2, _meta(*x2.shape, dtype=dtype), weight, bias, mean, rstd, 1e-5, rms
        )
        return fused_layer_norm._layer_norm_fwd_kernel, args, constants
    G = fused_layer_norm.backward_programs(NORM_ROWS, D, x2.element_size())
    partial = _meta(G, D, dtype=torch.float32)
    args, constants = fused_layer_norm.norm_backward_arguments(
        x2, _meta(*x2.shape, dtype=dtype), weight, mean, rstd, _meta(*x2.shape, dtype=dtype),
        partial, partial, bias is not None, rms,
    )  # fmt: skip
    return fused_layer_norm._layer_norm_bwd_kernel, args, constants


@dataclass(frozen=True)
class KernelSpec:
    """How one kernel is launched: its candidates or fixed launch, and its arguments."""

    title: str  # what the report calls it
    function: str  # the @triton.jit function's name (the key of its measurements)
    build: Callable  # Job -> (JITFunction, runtime args, constexprs other than the tiles)
    tuned: dict | None = None  # dtype class -> the autotuner's candidates (level 4's tiles.py)
    fixed: Callable | None = None  # dtype -> the pinned (BLOCK_M, BLOCK_N, num_warps, num_stages)
    options: Callable | None = None  # dtype -> the num_warps / num_stages its launcher passes
    flags: str = (
        "none"  # attention flags: "none", "everything" (all on), "pairwise" (and one by one)
    )
    norm: bool = False  # sizes are row widths, variants norm kinds

    def launches(self, dtype: str) -> list[tuple[tuple | None, bool]]:
        """(tiles, tuned) of every launch a call in ``dtype`` can get."""
        if self.tuned:
            return [(shape, True) for shape in self.tuned[dtype_class(dtype)]]
        return [(self.fixed(dtype) if self.fixed else None, False)]


def _decode(dtype: str) -> tuple[int, int, int, int]:
    t = decode_tiles(dtype)
    return (t.block_m, t.block_n, t.num_warps, t.num_stages)


def _decode_options(dtype: str) -> dict:
    t = decode_tiles(dtype)
    return {"num_warps": t.num_warps, "num_stages": t.num_stages}


def _defaults(dtype: str) -> dict:  # launched without num_warps / num_stages: Triton's defaults
    return {}


KERNELS: dict[str, KernelSpec] = {
    "forward": KernelSpec(
        "attention forward", "_attn_fwd_kernel", _forward, tuned=FORWARD_SHAPES, flags="pairwise"
    ),
    "forward-decode": KernelSpec(
        "attention forward, decode tiles (T <= 16)",
        "_attn_fwd_kernel",
        _forward,
        fixed=_decode,
        flags="everything",
    ),  # fmt: skip
    "dkdv": KernelSpec(
        "backward dK, dV",
        "_attn_bwd_dkdv_kernel",
        lambda job: _gradients(job, "dkdv"),
        tuned=DKDV_SHAPES,
        flags="pairwise",
    ),  # fmt: skip
    "dq": KernelSpec(
        "backward dQ",
        "_attn_bwd_dq_kernel",
        lambda job: _gradients(job, "dq"),
        tuned=DQ_SHAPES,
        flags="pairwise",
    ),  # fmt: skip
    "delta": KernelSpec(
        "backward delta pre-pass", "_attn_bwd_delta_kernel", _delta, options=_defaults
    ),
    "decode-split": KernelSpec(
        "flash-decoding split",
        "_decode_split_kernel",
        _decode_split,
        options=_decode_options,
        flags="pairwise",
    ),  # fmt: skip
    "decode-merge": KernelSpec(
        "flash-decoding merge",
        "_decode_merge_kernel",
        _decode_merge,
        options=lambda dtype: {"num_warps": flash_decode.MERGE_WARPS},
    ),  # fmt: skip
    "paged-decode": KernelSpec(
        "paged decode (through the block table)",
        "_paged_decode_kernel",
        _paged_decode,
        options=lambda dtype: {"num_warps": paged_decode.PAGED_WARPS},
        flags="everything",
    ),  # fmt: skip
    "norm-forward": KernelSpec(
        "LayerNorm / RMSNorm forward",
        "_layer_norm_fwd_kernel",
        lambda job: _norm(job, "forward"),
        options=_defaults,
        norm=True,
    ),  # fmt: skip
    "norm-backward": KernelSpec(
        "LayerNorm / RMSNorm backward",
        "_layer_norm_bwd_kernel",
        lambda job: _norm(job, "backward"),
        options=_defaults,
        norm=True,
    ),  # fmt: skip
}


def _torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _widths(dtype: str) -> list[int]:
    widest = fused_layer_norm.MAX_FUSED_BYTES // _torch_dtype(dtype).itemsize
    return [widest if w is None else w for w in NORM_WIDTHS]


def plan(
    targets=tuple(TARGETS), dtypes=MATRIX_DTYPES, kernels: list[str] | None = None
) -> list[Job]:
    """Every job of the matrix (module docstring) for these targets, dtypes and kernels."""
    jobs = []
    for name, spec in KERNELS.items():
        if kernels and name not in kernels:
            continue
        for target in targets:
            for dtype in dtypes:
                for first, (tiles, tuned) in enumerate(spec.launches(dtype)):
                    for size, variant in _cases(spec, dtype, first == 0):
                        jobs.append(Job(name, tiles, tuned, dtype, size, variant, target))
    return jobs


def _cases(spec: KernelSpec, dtype: str, first_launch: bool) -> list[tuple[int, str]]:
    """(size, variant) pairs of one launch of a kernel in ``dtype`` (the module docstring)."""
    if spec.norm:
        return [
            (w, kind)
            for w in _widths(dtype)
            for kind in (NORM_KINDS if w == NORM_KINDS_AT else NORM_KINDS[:1])
        ]
    everything = "plain" if spec.flags == "none" else variant_name(EVERYTHING)
    cases = [(head, everything) for head in HEADS]
    if first_launch:
        cases.append((ODD_HEAD, everything))
        if spec.flags == "pairwise":
            one_by_one = FLAG_VARIANTS if dtype == "float16" else FLAG_VARIANTS[:1]  # [:1]: plain
            cases += [(HEADS[0], variant_name(flags)) for flags in one_by_one]
    return cases


# ---------------------------------------------------------------------------
# From arguments to a signature: Triton's specialisation rules
# ---------------------------------------------------------------------------

TRITON_TYPES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.bool: "u1",
    torch.int32: "i32",
    torch.int64: "i64",
}


def argument_type(value, specialise: bool = True) -> tuple[str, str | None]:
    """``(type, specialisation)`` of one runtime argument, by the rules a launch applies.

    * a tensor: ``("*fp16", "D")``: a pointer, ``D`` = its address divisible by 16
      (assumed: allocations are aligned; a view at an odd offset compiles another variant);
    * an integer equal to 1: ``("constexpr", None)``, compiled in as a constant;
    * another integer: ``("i32", "D")`` if divisible by 16, else ``("i32", "")``
      (``i64`` past 32 bits);
    * a float: ``("fp32", None)``, never specialised.

    ``specialise=False`` (the kernel's ``do_not_specialize``): an integer is neither a
    constant nor marked divisible, ``("i32", None)``; a pointer is not marked aligned.
    """
    if isinstance(value, torch.Tensor):
        return "*" + TRITON_TYPES[value.dtype], "D" if specialise else None
    if isinstance(value, bool):
        return "u1", None
    if isinstance(value, int):
        kind = "i32" if -(2**31) <= value < 2**31 else "i64"
        if not specialise:
            return kind, None
        if value == 1:
            return "constexpr", None
        return kind, "D" if value % 16 == 0 else ""
    if isinstance(value, float):
        return "fp32", None
    raise TypeError(f"no Triton type for a {type(value).__name__} argument")


def compile_inputs(job: Job):
    """``(kernel, signature, constexprs, attrs, options)`` for ``triton.compile``: the
    specialisation a launch of ``job`` compiles, with the job's tiles and scheduling."""
    spec = KERNELS[job.kernel]
    kernel, args, constants = spec.build(job)
    if job.tiles is not None:
        block_m, block_n, num_warps, num_stages = job.tiles
        constants = constants | {"BLOCK_M": block_m, "BLOCK_N": block_n}
        options = {"num_warps": num_warps, "num_stages": num_stages}
    else:
        options = spec.options(job.dtype)
    # The launch binds the runtime arguments by position, the constants by name.
    values = dict(zip(kernel.arg_names[: len(args)], args, strict=True)) | constants
    signature, constexprs, attrs = {}, {}, {}
    for index, param in enumerate(kernel.params):
        value = values[param.name]
        if param.is_constexpr:
            signature[param.name], constexprs[param.name] = "constexpr", value
            continue
        kind, divisible = argument_type(value, specialise=not param.do_not_specialize)
        signature[param.name] = kind
        if kind == "constexpr":  # an integer equal to 1 is compiled in
            constexprs[param.name] = value
        elif divisible is not None:
            attrs[(index,)] = [["tt.divisibility", 16]] if divisible == "D" else []
    return kernel, signature, constexprs, attrs, options
