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

A caller may also pin the tiles explicitly (``Tiles``), which bypasses the
autotuner: decoding does that (a query tile of 16 for T = 1), and so do the tests
that check which tiles the causal kernels visit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import triton


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
DECODE_MAX_T = 16  # at or below this many queries, the forward uses DECODE_TILES


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


# Candidate (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel on a GPU. Only
# a few each: every candidate is compiled (seconds) the first time a head width,
# dtype or causal flag is seen, and timed again for every new length bucket.
# They are the usual flash-attention shapes for Hopper/Ampere-class GPUs. The
# forward and the dQ kernel hold a query tile and stream keys: large BLOCK_M,
# 8 warps for the largest tiles, 3 stages to overlap the next K/V load with the
# current matmuls. The dK/dV kernel holds a key tile (its K, V, dK, dV: four
# BLOCK_N x Dh tiles in registers) and streams queries: large BLOCK_N, small BLOCK_M.
FORWARD_SHAPES = ((128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3))
DKDV_SHAPES = ((32, 128, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3))
DQ_SHAPES = ((128, 32, 4, 3), (128, 64, 8, 3))


def attention_configs(shapes) -> list[triton.Config]:
    """``triton.Config`` objects for (BLOCK_M, BLOCK_N, num_warps, num_stages) tuples."""
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
        for m, n, w, s in shapes
    ]


def autotuned(kernel, key: list[str], shapes):
    """``kernel`` wrapped in ``triton.autotune`` on a GPU; ``None`` under the interpreter.

    A configuration that does not fit (too many registers or too much shared
    memory for a wide head) is dropped by the autotuner, which times it as infinite.
    """
    if interpreting():
        return None
    return triton.autotune(configs=attention_configs(shapes), key=key)(kernel)


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
