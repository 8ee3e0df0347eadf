"""Launcher for kernels/flash2.cu: FlashAttention-2 forward on CUDA cores, float32, register-tiled.

    o = forward(q, k, v, causal=True)                          # (B, H, T, d) float32 CuPy arrays
    o, lse = forward(q, k, v, causal=True, return_lse=True)    # lse: (B, H, Tq) float32, natural log

Each head size d runs on the build for the smallest D in {32, 64, 128} with D >= d (columns d..D-1 are
zero-filled in shared memory), so every d in 1..128 works; d = 32, 64, 128 waste nothing.
"""

from __future__ import annotations

import math

import numpy as np

from ._core import ceil_div, cp, get_kernel, set_dynamic_shared_memory, validate_attention
from .registry import Variant, register

KERNEL_FILE = "flash2.cu"
KERNEL_NAME = "flash2_forward"
MAX_D = 128
HEAD_DIMS = (32, 64, 128)  # the D of the builds; d runs on the smallest D >= d
SMEM_PAD = 4  # = SMEM_PAD in flash2.cu
MAX_GRID_Y = 65535
LOG2E = 1.0 / math.log(2.0)
CARVEOUT_MAX_SHARED = 100  # percent of the SM's L1/shared storage given to shared memory (a hint to the driver)

# (BR, BC, TM, TN) per D: BR query rows x BC keys per tile, TM x TN scores per thread.
# Chosen by a sweep on an H100 (tests/devcheck_flash.py) at B=8, H=12, T=1024, causal.
TILES = {
    32: (64, 64, 4, 8),  # 128 threads, 45 KB shared memory
    64: (64, 64, 4, 8),  # 128 threads, 69 KB shared memory, 168 registers: 3 blocks per H100 SM
    128: (64, 32, 4, 4),  # 128 threads, 76 KB shared memory: 2 blocks per SM
}


def tile_threads(BR: int, BC: int, TM: int, TN: int) -> int:
    return (BC // TN) * (BR // TM)


def smem_bytes(D: int, BR: int, BC: int, TM: int, TN: int) -> int:
    """4 * (BR*(D+PAD) + 2*BC*(D+PAD) + BR*(BC+TX)) -- the formula of Flash2Tile::SMEM_FLOATS."""
    TX = BC // TN
    return 4 * (BR * (D + SMEM_PAD) + 2 * BC * (D + SMEM_PAD) + BR * (BC + TX))


def check_tile(D: int, BR: int, BC: int, TM: int, TN: int) -> None:
    """The static_asserts of Flash2Tile, as a ValueError before compiling."""
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
        raise ValueError(f"tile (BR, BC, TM, TN) = {(BR, BC, TM, TN)} for D={D}: " + "; ".join(problems))


def build_for(d: int) -> int:
    return next(D for D in HEAD_DIMS if D >= d)


def name_expression(D: int, tile) -> str:
    BR, BC, TM, TN = tile
    return f"{KERNEL_NAME}<{D}, {BR}, {BC}, {TM}, {TN}>"


# What tests/test_compile.py compiles with NVRTC on a CPU-only machine: every build the launcher uses.
NVRTC_BUILDS = [((name_expression(D, TILES[D]),), ()) for D in HEAD_DIMS]


_CONFIGURED: set = set()  # (device id, D, tile) whose kernel attributes are set


def _kernel(D: int, tile):
    """The compiled build for (D, tile), with its shared-memory limit raised and the carveout set, once."""
    expr = name_expression(D, tile)
    kernel = get_kernel(KERNEL_FILE, expr, name_expressions=(expr,))
    key = (cp.cuda.Device().id, D, tuple(tile))
    if key not in _CONFIGURED:
        set_dynamic_shared_memory(kernel, smem_bytes(D, *tile), f"flash2_fp32 (D={D}, tile={tuple(tile)})")
        # Ask for the largest shared-memory carveout, so that as many blocks fit on an SM as the shared memory
        # allows; left to itself, the driver may configure less for a kernel that needs under 48 KB.
        kernel.preferred_shared_memory_carveout = CARVEOUT_MAX_SHARED
        _CONFIGURED.add(key)
    return kernel


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, tile=None):
    """softmax(scale q k^T) v, FlashAttention-2 loop order, O in registers; optionally also the LSE.

    tile: optional (BR, BC, TM, TN) to override TILES[D] (for experiments; checked like the static_asserts).
    """
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=("float32",), max_d=MAX_D,
                                                what="flash2_fp32 attention", scale=scale)
    D = build_for(d)
    tile = tuple(int(x) for x in (tile or TILES[D]))
    check_tile(D, *tile)
    BR = tile[0]
    grid_y = ceil_div(Tq, BR)
    if grid_y > MAX_GRID_Y:
        raise ValueError(f"Tq={Tq} needs {grid_y} query tiles of {BR}; the grid allows at most {MAX_GRID_Y}")
    if B * H > 2**31 - 1:
        raise ValueError(f"B*H={B * H} exceeds the grid's x limit (2^31 - 1)")

    o = cp.empty((B, H, Tq, d), dtype=cp.float32)
    lse = cp.empty((B, H, Tq), dtype=cp.float32) if return_lse else None
    vec4 = d % 4 == 0 and all(x.data.ptr % 16 == 0 for x in (q, k, v, o))

    kernel = _kernel(D, tile)
    nbytes = smem_bytes(D, *tile)
    kernel((B * H, grid_y), (tile_threads(*tile),),
           (q, k, v, o, lse if lse is not None else np.uintp(0),
            np.int32(Tq), np.int32(Tk), np.int32(d), np.float32(scale * LOG2E), np.int32(bool(causal)),
            np.int32(vec4)),
           shared_mem=nbytes)
    return (o, lse) if return_lse else o


register(Variant(
    name="flash2_fp32",
    forward=forward,
    dtypes=("float32",),
    notebook="04_flash_attention_2",
    max_d=MAX_D,
    has_lse=True,
    description="FlashAttention-2 on CUDA cores: a Q tile per block, O in registers, 4x8 register micro-tiles",
))
