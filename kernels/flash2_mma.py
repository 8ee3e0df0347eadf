"""Launcher for kernels/flash2_mma.cu: FlashAttention-2 forward on tensor cores through mma.sync (fp16/bf16).

    o = forward(q, k, v, causal=True)                          # (B, H, T, d) float16 or bfloat16 CuPy arrays
    o, lse = forward(q, k, v, causal=True, return_lse=True)    # lse: (B, H, Tq) float32, natural log

Any d with d % 8 == 0 and d <= 128 runs on the build for the smallest D in {32, 64, 96, 128} with D >= d
(cp.async zero-fills columns d..D-1). Any Tq, Tk >= 1.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ._core import (DTYPE_NAMES, I32, MAX_GRID_X, NULL, ceil_div, check_grid, cp, defines_from, dtype_set, get_kernel,
                    validate_attention)
from .registry import Variant, register

KERNEL_FILE = "flash2_mma.cu"
KERNEL_NAME = "flash2_mma_forward"
WHAT = "flash2_mma attention"
MAX_D = 128
D_MULTIPLE = 8  # cp.async moves 16-byte chunks: 8 elements
HEAD_DIMS = (32, 64, 96, 128)
BUILD_FOR = {d: next(D for D in HEAD_DIMS if D >= d) for d in range(1, MAX_D + 1)}
MMA_M = 16  # rows of one mma.m16n8k16 tile (= MMA_M in flash2_mma.cu)
SMEM_PAD = 8  # elements of padding per shared-memory row; handed to the kernel as -DSMEM_PAD
DEFINES = defines_from(SMEM_PAD=SMEM_PAD)
ALIGN = 16  # bytes: cp.async and the 4-byte output stores need 16-byte aligned bases
LOG2E = 1.0 / math.log(2.0)
DTYPES = ("float16", "bfloat16")
DTYPE_SET = dtype_set(DTYPES)
CARVEOUT_MAX_SHARED = 100  # percent of the SM's L1/shared storage given to shared memory (a hint to the driver)


class MmaTile(NamedTuple):
    """The tiling of one flash2_mma build: BC keys per K/V tile, NWARPS warps of MT 16-row m-tiles each, and
    MIN_BLOCKS, the blocks per SM that __launch_bounds__ asks the compiler to leave registers for."""
    BC: int
    NWARPS: int
    MT: int
    MIN_BLOCKS: int = 1

    @property
    def rows(self) -> int:
        """BR: query rows per block."""
        return MMA_M * self.MT * self.NWARPS

    @property
    def threads(self) -> int:
        return 32 * self.NWARPS

    def smem_bytes(self, D: int) -> int:
        """2 * (BR + 4 * BC) * (D + SMEM_PAD): the Q tile and two stages of K and V tiles, 16-bit elements."""
        return 2 * (self.rows + 4 * self.BC) * (D + SMEM_PAD)

    def check(self, D: int) -> None:
        """The static_asserts of flash2_mma_forward, as a ValueError before compiling."""
        problems = []
        if D not in HEAD_DIMS:
            problems.append(f"D={D} is not one of {HEAD_DIMS}")
        if self.BC < 16 or self.BC % 16:
            problems.append(f"BC={self.BC} must be a positive multiple of 16")
        if self.MT < 1 or self.NWARPS < 1 or self.NWARPS > 32:
            problems.append(f"NWARPS={self.NWARPS} and MT={self.MT} must be >= 1, with at most 32 warps")
        if self.MIN_BLOCKS < 1:
            problems.append(f"MIN_BLOCKS={self.MIN_BLOCKS} must be >= 1")
        if problems:
            raise ValueError(f"tile ({', '.join(self._fields)}) = {tuple(self)} for D={D}: " + "; ".join(problems))


# The default tile per D. Swept on an H100 at B=4, H=32, T=4096 (fp16): at D=64, MmaTile(64, 4, 2, 3) caps the
# registers at 168 so that three blocks (12 warps) share an SM; in that sweep it took 1.04 / 1.85 ms (causal /
# not) against 1.12 / 1.97 ms for MmaTile(128, 4, 2) at 255 registers and 8 warps, a margin that other runs
# put inside the run-to-run spread. At D=128 every tile that fits three blocks spills, and MmaTile(64, 4, 2)
# at 255 registers is the fastest (it spills 44 bytes too; see the kernel's header).
TILES = {
    32: MmaTile(64, 4, 2, 1),
    64: MmaTile(64, 4, 2, 3),
    96: MmaTile(64, 4, 2, 1),
    128: MmaTile(64, 4, 2, 1),
}


def name_expression(D: int, tile: MmaTile, dtype: str) -> str:
    return f"{KERNEL_NAME}<{D}, {tile.BC}, {tile.NWARPS}, {tile.MT}, {tile.MIN_BLOCKS}, " \
           f"{'true' if dtype == 'bfloat16' else 'false'}>"


# What tests/test_compile.py compiles with NVRTC on a CPU-only machine: every build the launcher uses.
NVRTC_BUILDS = [((name_expression(D, TILES[D], dt),), DEFINES) for D in HEAD_DIMS for dt in DTYPES]


class Build(NamedTuple):
    """One compiled configuration, with the numbers its launch needs worked out once."""
    kernel: object  # kernels._core.Kernel
    tile: MmaTile
    smem: int  # dynamic shared memory per block, bytes
    rows: int  # BR
    threads: int


@functools.lru_cache(maxsize=None)
def build(D: int, tile: tuple | None, dtype: str) -> Build:
    """The Build of (D, tile, dtype): the tile checked once, the kernel compiled on its first launch."""
    tile = TILES[D] if tile is None else MmaTile(*tile)
    tile.check(D)
    expr = name_expression(D, tile, dtype)
    smem = tile.smem_bytes(D)
    kernel = get_kernel(KERNEL_FILE, expr, name_expressions=(expr,), defines=DEFINES, shared_mem=smem,
                        carveout=CARVEOUT_MAX_SHARED)
    return Build(kernel, tile, smem, tile.rows, tile.threads)


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, tile=None, head_major=True):
    """softmax(scale q k^T) v on tensor cores (mma.sync.m16n8k16), FlashAttention-2 loop; optionally the LSE.

    tile: optional MmaTile (or a (BC, NWARPS, MT[, MIN_BLOCKS]) tuple) instead of TILES[D] (notebook 06's sweep).
    head_major: False orders the grid with heads fastest instead (to measure what the order is worth).
    """
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=MAX_D, d_multiple=D_MULTIPLE,
                                                what=WHAT, scale=scale, align=ALIGN)
    if not scale > 0:
        raise ValueError(f"scale must be > 0 for flash2_mma (the kernel folds it into exp2 after the row max); "
                         f"got {scale}")
    key = (Tq, Tk, d, q.dtype, scale, bool(causal), None if tile is None else tuple(tile), bool(head_major), B * H)
    launch = _LAUNCHES.get(key) or _launch_config(*key)
    kernel, grid, block, smem, tail = launch
    o = cp.empty((B, H, Tq, d), dtype=q.dtype)
    if return_lse:
        lse = cp.empty((B, H, Tq), dtype=cp.float32)
        kernel(grid, block, (q, k, v, o, lse) + tail, smem)
        return o, lse
    kernel(grid, block, (q, k, v, o, NULL) + tail, smem)
    return o


_LAUNCHES: dict = {}  # (Tq, Tk, d, dtype, scale, causal, tile, head_major, B*H) -> what a launch of that problem needs


def _launch_config(Tq, Tk, d, dtype, scale, causal, tile, head_major, BH):
    """Grid, block, shared memory and the constant arguments of one problem, worked out once (the launch then
    costs a dictionary look-up instead of a dozen small computations)."""
    kernel, _, smem, rows, threads = build(BUILD_FOR[d], tile, DTYPE_NAMES[dtype])
    blocks = check_grid(BH * ceil_div(Tq, rows), WHAT, MAX_GRID_X)
    tail = (np.int32(Tq), np.int32(Tk), np.int32(d), np.float32(scale * LOG2E), I32[causal], I32[head_major])
    if len(_LAUNCHES) > 4096:
        _LAUNCHES.clear()
    config = _LAUNCHES[(Tq, Tk, d, dtype, scale, causal, tile, head_major, BH)] = (kernel, (blocks,), (threads,), smem,
                                                                                   tail)
    return config


register(Variant(
    name="flash2_mma",
    forward=forward,
    dtypes=DTYPES,
    notebook="06_fp16_tensor_cores",
    max_d=MAX_D,
    has_lse=True,
    module=__name__,
    description="FlashAttention-2 on tensor cores: mma.sync m16n8k16, ldmatrix(.trans), P in registers, "
                "cp.async double buffering, exp2 softmax",
))
