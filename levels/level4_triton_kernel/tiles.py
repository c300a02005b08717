"""Tile sizes: autotuned on a GPU, one fixed choice under Triton's interpreter.

A flash-attention kernel works on a ``BLOCK_M x BLOCK_N`` tile of the score
matrix at a time (``BLOCK_M`` queries against ``BLOCK_N`` keys). Which tile is
fastest depends on the GPU, the head width and the lengths, so on a GPU every
kernel is wrapped in ``triton.autotune``: the first call with a new autotune key
times each candidate ``triton.Config`` and remembers the winner.

Autotuning times real launches, so it needs a GPU. Under the interpreter
(``TRITON_INTERPRET=1``, kernels executed by numpy on the CPU) one fixed tile of
16 x 16 is used instead: small enough that the awkward test shapes (T=13,
S=29) span several key tiles, the last of them partial.

The candidates come per dtype class (16-bit, float32), and before timing
anything the autotuner keeps only those of the call's class that fit the GPU's
shared memory (``CandidatePrune``), as measured by compiling each one for
sm_80 and sm_90 without a GPU (ladder/check/: check.py, and the
table shared_memory.py, which this module imports: plain data, importing
neither triton nor level 4, so there is no cycle).

A caller may also pin the tiles explicitly (``Tiles``), which bypasses the
autotuner: decoding does that (a query tile of 16 for T = 1), and so do the tests
that check which tiles the causal kernels visit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import triton

from .shared_memory import SHARED_MEMORY


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter.

    Triton reads the variable when a kernel is *defined*; level 4's ``__init__``
    sets it before any kernel module is imported, so this agrees with the kernels.
    """
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@dataclass(frozen=True)
class Tiles:
    """One launch configuration: the tile shape and the GPU scheduling knobs.

    ``block_m`` queries x ``block_n`` keys per tile; both must be powers of two
    and at least 16 (``tl.dot`` needs every dimension >= 16). ``num_warps`` and
    ``num_stages`` (software-pipelining depth) matter on a GPU only.
    """

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")


# The one configuration used under the interpreter.
INTERPRETER_TILES = Tiles(block_m=16, block_n=16)

# Decoding (T = 1, or a few queries) against a KV cache uses a 16-row query
# tile. The work is reading the cached keys and values, S x (Dh + Dv) elements
# per head; the query tile is padded to 16 rows because tl.dot needs 16, and the
# 15 idle rows cost MMA slots that are free next to that memory traffic. A long
# key tile keeps many loads in flight. When B * H programs alone cannot fill the
# GPU (batch 1, a long cache), flash_decode.py also splits the cache across
# programs and merges their partial softmaxes by their log-sum-exps.
DECODE_TILES = Tiles(block_m=16, block_n=64, num_warps=4, num_stages=3)
# float32 keys and values take twice the bytes per pipeline stage: with 3 stages a
# 256-wide head needs 276 KiB of shared memory, over every GPU's limit; with 2, 148 KiB
# (ladder/check/check.py measured both), which fits an A100's 163 KiB and an
# H100's 227 KiB.
DECODE_TILES_FP32 = Tiles(block_m=16, block_n=64, num_warps=4, num_stages=2)
DECODE_MAX_T = 16  # at or below this many queries, the forward uses decode_tiles()


def decode_tiles(dtype) -> Tiles:
    """The fixed tiles of a decode step for inputs of ``dtype`` (a torch dtype or its name)."""
    return DECODE_TILES_FP32 if dtype_class(dtype) == "float32" else DECODE_TILES


def dtype_class(dtype) -> str:
    """ "float32" or "16-bit" (float16, bfloat16): the two families of candidates."""
    return "float32" if str(dtype).removeprefix("torch.") == "float32" else "16-bit"


def head_block(width: int) -> int:
    """Pad a head width to the tile width the kernels use: a power of two, at least 16.

    ``tl.arange`` needs a power of two and ``tl.dot`` an inner dimension of at
    least 16; the padded columns are loaded as zeros (masked loads), which adds
    nothing to a dot product.
    """
    return max(16, triton.next_power_of_2(width))


def length_key(n: int) -> int:
    """A length rounded up to a power of two: the autotuner's cache key.

    Keying on the exact length would re-run the tuning for every new length
    (every decoding step, every batch of a different size); a power-of-two
    bucket re-tunes only when the length changes scale.
    """
    return triton.next_power_of_2(n)


# Candidate (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel on a GPU, per
# dtype class. Only a few each: every candidate is compiled (seconds) the first
# time a head width, dtype or causal flag is seen, and timed again for every new
# length bucket.
#
# 16-bit inputs feed the tensor cores. These are the usual flash-attention
# shapes for Hopper/Ampere-class GPUs. The forward and the dQ kernel hold a
# query tile and stream keys: large BLOCK_M, 8 warps for the largest tiles, 3
# stages to overlap the next K/V load with the current matmuls. The dK/dV kernel
# holds a key tile (its K, V, dK, dV: four BLOCK_N x Dh tiles in registers) and
# streams queries: large BLOCK_N, small BLOCK_M. The last forward and dQ shapes
# (64 x 32) are there for 256-wide heads: the compile check found that every
# other one needs more shared memory than an A100 or an H100 gives a program
# there (the forward's 64 x 64: 168 KiB on sm_80, 240 KiB on sm_90); 64 x 32
# needs 100 / 136 KiB.
#
# float32 inputs with exact products ("ieee") cannot use the tensor cores: the
# dots run on the FMA units, holding their operands in shared memory at twice the
# bytes. The 16-bit shapes would need up to 704 KiB (128 x 128 at head 256), none
# fits a 256-wide head, and ptxas takes up to minutes on each. Small tiles with two
# stages fit every head on both GPUs except dQ's 64 x 32 at head 256 on an A100
# (200 KiB: pruned there).
FORWARD_SHAPES = {
    "16-bit": ((128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3)),
    "float32": ((64, 32, 4, 2), (32, 32, 4, 2)),
}
DKDV_SHAPES = {
    "16-bit": ((32, 128, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3)),
    "float32": ((16, 32, 4, 2), (32, 32, 4, 2)),
}
DQ_SHAPES = {
    "16-bit": ((128, 32, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3)),
    "float32": ((32, 32, 4, 2), (64, 32, 4, 2)),
}


def all_shapes(shapes: dict) -> list[tuple[int, int, int, int]]:
    """Every candidate of every dtype class, once each, in order: the autotuner's configs."""
    return list(dict.fromkeys(shape for group in shapes.values() for shape in group))


def attention_configs(shapes) -> list[triton.Config]:
    """``triton.Config`` objects for (BLOCK_M, BLOCK_N, num_warps, num_stages) tuples."""
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
        for m, n, w, s in shapes
    ]


def shared_memory_target(capability: tuple[int, int]) -> str | None:
    """The compiled target whose measured shared memory stands for a GPU of this capability.

    Triton generates the same code for every Ampere/Ada GPU (8.x: the same tiles
    need the same bytes on 8.0, 8.6 and 8.9; tests/test_level4_compile.py
    checks one) and its own for Hopper (9.0). Other GPUs have no measurements:
    ``None``, and nothing is pruned.
    """
    return {8: "sm_80", 9: "sm_90"}.get(capability[0])


def table_head(block_dh: int, block_dv: int) -> int:
    """The head block whose measurement bounds a kernel of these padded widths.

    Shared memory grows with the head width, so the wider of the two widths,
    raised to the narrowest measured head block (64), gives an upper bound.
    """
    return max(64, block_dh, block_dv)


def shared_memory_need(
    kernel: str, target: str, dtype: str, head: int, shape, table: dict = SHARED_MEMORY
) -> int | None:
    """Bytes of shared memory ``kernel`` needs with tiles ``shape`` (BLOCK_M, BLOCK_N,
    num_warps, num_stages), as measured by compiling it (levels/level4_triton_kernel/shared_memory.py);
    None if unmeasured."""
    return table.get((kernel, target, dtype, head, tuple(shape)))


def fitting_shapes(
    kernel: str,
    shapes,
    *,
    target: str | None,  # the measured target standing for the GPU (shared_memory_target)
    dtype: str,  # "float16", "bfloat16" or "float32"
    head: int,  # the head block of the measurements (table_head)
    limit: int,  # bytes of shared memory one program may use
    table: dict = SHARED_MEMORY,  # the measurements (tests pass their own)
) -> list:
    """The tile shapes of ``shapes`` whose measured shared memory is at most ``limit`` bytes.

    An unmeasured shape (or an unmeasured target) is kept: the autotuner then
    times it as it always did, infinite if it does not fit. This is the whole
    decision; the autotuner's prune (``CandidatePrune``) and the offline
    compile check (ladder/check/check.py) both call it.
    """
    if target is None:
        return list(shapes)
    kept = []
    for shape in shapes:
        need = shared_memory_need(kernel, target, dtype, head, shape, table)
        if need is None or need <= limit:
            kept.append(shape)
    return kept


def cuda_facts(device) -> tuple[str | None, int]:
    """(measured target standing for ``device``, its shared memory limit per program in bytes)."""
    import torch

    target = shared_memory_target(torch.cuda.get_device_capability(device))
    return target, torch.cuda.get_device_properties(device).shared_memory_per_block_optin


class CandidatePrune:
    """The autotuner's ``early_config_prune``: the candidates worth compiling for this call.

    The autotuner calls it once per new tuning key, before compiling anything,
    with every candidate ``triton.Config`` (all dtype classes), the launch's
    arguments by name and its constants. It keeps

    1. the candidates of the inputs' dtype class (``FORWARD_SHAPES`` etc.), and of
       those
    2. the ones whose measured shared memory fits this GPU's limit for one
       program (its opt-in maximum, ``shared_memory_per_block_optin``; Triton
       refuses a launch above it). A candidate over it would cost a compilation
       (minutes for the largest tiles) only to be timed as infinite; it is not
       even compiled.
    """

    def __init__(
        self, kernel: str, shapes: dict, device_facts=cuda_facts, table: dict = SHARED_MEMORY
    ):
        self.kernel = kernel  # the kernel's name, the measurements' key
        self.shapes = shapes  # dtype class -> its candidate shapes
        self.device_facts = device_facts  # device -> (measured target, limit in bytes)
        self.table = table  # the measurements

    def __call__(self, configs, named_args, **constants):
        q = named_args["Q"]  # every autotuned kernel's first argument: its dtype and device
        dtype = str(q.dtype).removeprefix("torch.")
        target, limit = self.device_facts(q.device)
        head = table_head(constants["BLOCK_DH"], constants["BLOCK_DV"])
        mine = set(self.shapes[dtype_class(dtype)])
        shapes = {config_shape(c): c for c in configs if config_shape(c) in mine}
        kept = fitting_shapes(
            self.kernel, shapes, target=target, dtype=dtype, head=head, limit=limit,
            table=self.table,
        )  # fmt: skip
        if not kept:
            raise ValueError(
                f"no tile configuration of {self.kernel} fits in this GPU's {limit} bytes of "
                f"shared memory for {dtype} heads of {head}; use a 16-bit dtype or narrower heads"
            )
        return [shapes[shape] for shape in kept]


def config_shape(config: triton.Config) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of an autotuner candidate."""
    return (config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages)


def autotuned(kernel, key: list[str], shapes: dict):
    """``kernel`` wrapped in ``triton.autotune`` on a GPU; ``None`` under the interpreter.

    ``shapes``: the candidates per dtype class. Before timing, the autotuner
    keeps those of the call's dtype class that fit the GPU's shared memory
    (``CandidatePrune``); one that fails for another reason (too many
    registers) is timed as infinite.
    """
    if interpreting():
        return None
    return triton.autotune(
        configs=attention_configs(all_shapes(shapes)),
        key=key,
        prune_configs_by={"early_config_prune": CandidatePrune(kernel.__name__, shapes)},
    )(kernel)


def launch(kernel, tuned, grid, args: tuple, constants: dict, tiles: Tiles | None) -> None:
    """Launch ``kernel`` on ``grid(block_m, block_n)`` programs.

    With ``tiles=None`` and an autotuned wrapper available (a GPU), the
    autotuner picks ``BLOCK_M``/``BLOCK_N``; otherwise ``tiles`` (default: the
    interpreter's fixed tiles) are passed in explicitly.
    """
    if tiles is None and tuned is not None:
        tuned[lambda meta: grid(meta["BLOCK_M"], meta["BLOCK_N"])](*args, **constants)
        return
    tiles = tiles or INTERPRETER_TILES
    kernel[grid(tiles.block_m, tiles.block_n)](
        *args,
        **constants,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
