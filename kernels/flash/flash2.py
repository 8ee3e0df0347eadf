"""Launcher for kernels/flash/flash2.cu: FlashAttention-2 forward on CUDA cores, float32, register-tiled.

    o = forward(q, k, v, causal=True)                          # (B, H, T, d) float32 CuPy arrays
    o, lse = forward(q, k, v, causal=True, return_lse=True)    # lse: (B, H, Tq) float32, natural log

Each head size d runs on the build for the smallest D in {32, 64, 128} with D >= d (columns d..D-1 are
zero-filled in shared memory), so every d in 1..128 works; d = 32, 64, 128 waste nothing.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ..core import (I32, MAX_GRID_X, MAX_GRID_YZ, T4_CC, Launch, attention_launch, ceil_div, check_grid, defines_from,
                    device_info, dtype_set, get_kernel, launch_cache, validate_attention)
from ..core.registry import Variant, register

KERNEL_FILE = "flash2.cu"
KERNEL_NAME = "flash2_forward"
WHAT = "flash2_fp32 attention"
MAX_D = 128
HEAD_DIMS = (32, 64, 128)  # the D of the builds; d runs on the smallest D >= d
BUILD_FOR = {d: next(D for D in HEAD_DIMS if D >= d) for d in range(1, MAX_D + 1)}
SMEM_PAD = 4  # floats of padding per shared-memory row; handed to the kernel as -DSMEM_PAD
DEFINES = defines_from(SMEM_PAD=SMEM_PAD)
LOG2E = 1.0 / math.log(2.0)
CARVEOUT_MAX_SHARED = 100  # percent of the SM's L1/shared storage given to shared memory (a hint to the driver)
DTYPE_SET = dtype_set(("float32",))


class Flash2Tile(NamedTuple):
    """The tiling of one flash2 build: BR query rows x BC keys per tile, TM x TN scores per thread."""
    BR: int
    BC: int
    TM: int
    TN: int

    @property
    def threads(self) -> int:
        """(BC / TN) * (BR / TM): TX threads along the keys times TY along the rows."""
        return (self.BC // self.TN) * (self.BR // self.TM)

    def smem_bytes(self, D: int) -> int:
        """4 * (BR*(D+PAD) + 2*BC*(D+PAD) + BR*(BC+TX)) -- the formula of Flash2Tile::SMEM_FLOATS in flash2.cu."""
        TX = self.BC // self.TN
        return 4 * (self.BR * (D + SMEM_PAD) + 2 * self.BC * (D + SMEM_PAD) + self.BR * (self.BC + TX))

    def check(self, D: int) -> None:
        """The static_asserts of Flash2Tile in flash2.cu, as a ValueError before compiling."""
        BR, BC, TM, TN = self
        TX, TY = (BC // TN if TN else 0), (BR // TM if TM else 0)
        problems = []
        if D not in HEAD_DIMS:
            problems.append(f"D={D} is not one of {HEAD_DIMS}")
        if min(BR, BC, TM, TN) < 1 or BR % TM or BC % TN:
            problems.append("BR must be a multiple of TM and BC a multiple of TN")
        elif not (TX <= 32 and TX & (TX - 1) == 0):
            problems.append(f"BC/TN = {TX} must be a power of two <= 32")
        elif (TX * TY) % 32 or TX * TY > 1024:
            problems.append(f"{TX * TY} threads is not a whole number of warps <= 1024")
        elif (D // 4) % TX:
            problems.append(f"D/4 = {D // 4} must be a multiple of BC/TN = {TX}")
        if BC % 32:
            problems.append(f"BC={BC} must be a multiple of 32")
        if problems:
            raise ValueError(f"tile ({', '.join(self._fields)}) = {tuple(self)} for D={D}: " + "; ".join(problems))


# The default tile per D, chosen by a tile sweep on an H100 (kernels/flash/README.md).
TILES = {
    32: Flash2Tile(64, 64, 4, 8),  # 128 threads, 45 KB shared memory
    64: Flash2Tile(64, 64, 4, 8),  # 128 threads, 69 KB shared memory
    128: Flash2Tile(64, 32, 4, 4),  # 128 threads, 76 KB shared memory
}
# Where a GPU allows less shared memory per block than TILES[D] needs (64 KB on a T4), the smaller tile: half the
# query rows per block, two rows per thread instead of four (still 128 threads).
SMALL_TILES = {
    64: Flash2Tile(32, 64, 2, 8),  # 128 threads, 51 KB shared memory
    128: Flash2Tile(32, 32, 2, 4),  # 128 threads, 55 KB shared memory
}


def name_expression(D: int, tile: Flash2Tile) -> str:
    return f"{KERNEL_NAME}<{D}, {tile.BR}, {tile.BC}, {tile.TM}, {tile.TN}>"


# What tests/test_compile.py compiles with NVRTC on a CPU-only machine: every build the launcher uses.
NVRTC_BUILDS = [((name_expression(D, TILES[D]),), DEFINES) for D in HEAD_DIMS] + \
               [((name_expression(D, SMALL_TILES[D]),), DEFINES) for D in SMALL_TILES]


def default_tile(D: int, smem_limit: int) -> Flash2Tile:
    """TILES[D], or SMALL_TILES[D] where TILES[D] needs more than `smem_limit` bytes of shared memory per block."""
    tile = TILES[D]
    if tile.smem_bytes(D) > smem_limit and D in SMALL_TILES:
        tile = SMALL_TILES[D]
    return tile


@functools.lru_cache(maxsize=None)
def build(D: int, tile: tuple | None, smem_limit: int | None = None):
    """(Kernel, Flash2Tile, shared-memory bytes) of one build; checked once, compiled on its first launch.
    tile None: the default for a GPU that allows `smem_limit` bytes of shared memory per block (None: no limit);
    ValueError naming D, the tile and the limit where the tile does not fit."""
    tile = (TILES[D] if smem_limit is None else default_tile(D, smem_limit)) if tile is None else Flash2Tile(*tile)
    tile.check(D)
    expr = name_expression(D, tile)
    smem = tile.smem_bytes(D)
    if smem_limit is not None and smem > smem_limit:
        raise ValueError(f"{WHAT}: tile (BR, BC, TM, TN) = {tuple(tile)} for D={D} needs {smem} bytes of shared "
                         f"memory per block; this GPU allows at most {smem_limit} (pass a smaller tile)")
    # The largest shared-memory carveout, so that as many blocks fit on an SM as the shared memory allows; left
    # to itself, the driver may configure less for a kernel that needs under 48 KB.
    kernel = get_kernel(KERNEL_FILE, expr, name_expressions=(expr,), defines=DEFINES, shared_mem=smem,
                        carveout=CARVEOUT_MAX_SHARED)
    return kernel, tile, smem


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, tile=None):
    """softmax(scale q k^T) v, FlashAttention-2 loop order, O in registers; optionally also the LSE.

    tile: optional Flash2Tile (or (BR, BC, TM, TN)) instead of TILES[D] (for experiments; checked like the
    static_asserts). By default TILES[D], or SMALL_TILES[D] on a GPU whose shared memory per block is too small for
    it (a T4's 64 KB); a tile that does not fit the GPU raises ValueError.
    """
    return attention_launch(_CALLS, _prepare, q, k, v, VEC_ALIGN, (causal, scale, tile), return_lse)


VEC_ALIGN = 16  # bytes: with q, k, v at 16-byte aligned bases and d % 4 == 0 the kernel loads float4 vectors
_CALLS = launch_cache()  # (qkv_key, options) -> what _prepare returned (see kernels.core.attention_launch)


def _prepare(q, k, v, dev, causal, scale, tile):
    """Validate q, k, v and return (Launch, o shape, o dtype, lse shape): one problem's launch, made once.
    Any base address is accepted; the kernel reads float4 vectors only where d % 4 == 0 and q, k, v start at 16-byte
    boundaries (o and lse come from CuPy's allocator, which aligns to at least 256 bytes)."""
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=MAX_D, min_cc=T4_CC, what=WHAT,
                                                scale=scale)
    kernel, tile, smem = build(BUILD_FOR[d], None if tile is None else tuple(tile), device_info(dev).smem_optin)
    grid_y = ceil_div(Tq, tile.BR)
    check_grid(grid_y, WHAT, MAX_GRID_YZ, "y")
    check_grid(B * H, WHAT, MAX_GRID_X)
    vec4 = d % 4 == 0 and not (q.data.ptr | k.data.ptr | v.data.ptr) % VEC_ALIGN
    tail = (np.int32(Tq), np.int32(Tk), np.int32(d), np.float32(scale * LOG2E), I32[bool(causal)], I32[vec4])
    return Launch(kernel, (B * H, grid_y), (tile.threads,), smem, 5, tail, dev), (B, H, Tq, d), q.dtype, (B, H, Tq)


register(Variant("flash2_fp32", forward, ("float32",), "04_flash_attention_2", MAX_D, has_lse=True, min_cc=T4_CC,
                 description="FlashAttention-2 on CUDA cores: a Q tile per block, O in registers, 4x8 register micro-tiles"))
