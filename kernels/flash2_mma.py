"""Launcher for kernels/flash2_mma.cu: FlashAttention-2 forward on tensor cores through mma.sync (fp16/bf16).

    o = forward(q, k, v, causal=True)                          # (B, H, T, d) float16 or bfloat16 CuPy arrays
    o, lse = forward(q, k, v, causal=True, return_lse=True)    # lse: (B, H, Tq) float32, natural log

Any d with d % 8 == 0 and d <= 128 runs on the build for the smallest D in {32, 64, 96, 128} with D >= d
(cp.async zero-fills columns d..D-1). Any Tq, Tk >= 1.
"""

from __future__ import annotations

import math

import numpy as np

from ._core import ceil_div, cp, get_kernel, set_dynamic_shared_memory, validate_attention
from .registry import Variant, register

KERNEL_FILE = "flash2_mma.cu"
KERNEL_NAME = "flash2_mma_forward"
MAX_D = 128
D_MULTIPLE = 8  # cp.async moves 16-byte chunks: 8 elements
HEAD_DIMS = (32, 64, 96, 128)
SMEM_PAD = 8  # = SMEM_PAD in flash2_mma.cu (elements)
ALIGN = 16  # bytes: cp.async and the 4-byte output stores need 16-byte aligned bases
MAX_GRID_X = 2**31 - 1
LOG2E = 1.0 / math.log(2.0)
DTYPES = ("float16", "bfloat16")
CARVEOUT_MAX_SHARED = 100  # percent of the SM's L1/shared storage given to shared memory (a hint to the driver)

# (BC, NWARPS, MT, MIN_BLOCKS) per D: BC keys per tile, NWARPS warps of MT 16-row m-tiles each
# (BR = 16 * MT * NWARPS), and the blocks per SM the compiler must leave registers for (__launch_bounds__).
# Swept on an H100 at B=4, H=32, T=4096 (fp16): at D=64, (64, 4, 2, 3) caps the registers at 168 so that three
# blocks (12 warps) share an SM; in that sweep it took 1.04 / 1.85 ms (causal / not) against 1.12 / 1.97 ms for
# (128, 4, 2) at 255 registers and 8 warps, a margin that other runs put inside the run-to-run spread. At D=128
# every tile that fits three blocks spills, and (64, 4, 2) at 255 registers is the fastest.
TILES = {
    32: (64, 4, 2, 1),
    64: (64, 4, 2, 3),
    96: (64, 4, 2, 1),
    128: (64, 4, 2, 1),
}


def normalize_tile(tile) -> tuple:
    """(BC, NWARPS, MT) or (BC, NWARPS, MT, MIN_BLOCKS) -> the 4-tuple (MIN_BLOCKS defaults to 1)."""
    tile = tuple(int(x) for x in tile)
    if len(tile) == 3:
        tile += (1,)
    if len(tile) != 4:
        raise ValueError(f"tile must be (BC, NWARPS, MT) or (BC, NWARPS, MT, MIN_BLOCKS); got {tile}")
    return tile


def block_rows(tile) -> int:
    BC, NWARPS, MT = tile[:3]
    return 16 * MT * NWARPS


def smem_bytes(D: int, tile) -> int:
    """2 * (BR + 4 * BC) * (D + SMEM_PAD): Q tile, and two stages of K and V tiles, 16-bit elements."""
    BC = tile[0]
    return 2 * (block_rows(tile) + 4 * BC) * (D + SMEM_PAD)


def check_tile(D: int, tile) -> None:
    """The static_asserts of flash2_mma_forward, as a ValueError before compiling."""
    BC, NWARPS, MT, MIN_BLOCKS = normalize_tile(tile)
    problems = []
    if D not in HEAD_DIMS:
        problems.append(f"D={D} is not one of {HEAD_DIMS}")
    if BC < 16 or BC % 16:
        problems.append(f"BC={BC} must be a positive multiple of 16")
    if MT < 1 or NWARPS < 1 or 32 * NWARPS > 1024:
        problems.append(f"NWARPS={NWARPS} and MT={MT} must be >= 1, with at most 32 warps")
    if MIN_BLOCKS < 1:
        problems.append(f"MIN_BLOCKS={MIN_BLOCKS} must be >= 1")
    if problems:
        raise ValueError(f"tile (BC, NWARPS, MT, MIN_BLOCKS) = {tuple(tile)} for D={D}: " + "; ".join(problems))


def build_for(d: int) -> int:
    return next(D for D in HEAD_DIMS if D >= d)


def name_expression(D: int, tile, dtype: str) -> str:
    BC, NWARPS, MT, MIN_BLOCKS = normalize_tile(tile)
    return f"{KERNEL_NAME}<{D}, {BC}, {NWARPS}, {MT}, {MIN_BLOCKS}, {'true' if dtype == 'bfloat16' else 'false'}>"


# What tests/test_compile.py compiles with NVRTC on a CPU-only machine: every build the launcher uses.
NVRTC_BUILDS = [((name_expression(D, TILES[D], dt),), ()) for D in HEAD_DIMS for dt in DTYPES]

_CONFIGURED: set = set()


def _kernel(D: int, tile, dtype: str):
    expr = name_expression(D, tile, dtype)
    kernel = get_kernel(KERNEL_FILE, expr, name_expressions=(expr,))
    key = (cp.cuda.Device().id, expr)
    if key not in _CONFIGURED:
        set_dynamic_shared_memory(kernel, smem_bytes(D, tile), f"flash2_mma (D={D}, tile={tuple(tile)})")
        # Ask for the largest shared-memory carveout, so that as many blocks fit on an SM as registers allow.
        kernel.preferred_shared_memory_carveout = CARVEOUT_MAX_SHARED
        _CONFIGURED.add(key)
    return kernel


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, tile=None, head_major=True):
    """softmax(scale q k^T) v on tensor cores (mma.sync.m16n8k16), FlashAttention-2 loop; optionally the LSE.

    tile: optional (BC, NWARPS, MT[, MIN_BLOCKS]) to override TILES[D] (for the sweep in notebook 06).
    head_major: False orders the grid with heads fastest instead (to measure what the order is worth).
    """
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=DTYPES, max_d=MAX_D, d_multiple=D_MULTIPLE,
                                                what="flash2_mma attention", scale=scale)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.data.ptr % ALIGN:
            raise ValueError(f"{name} starts at address {x.data.ptr:#x}, which is not {ALIGN}-byte aligned "
                             f"(cp.async copies 16-byte chunks); pass a fresh array (cupy.ascontiguousarray "
                             f"of a copy)")
    if not scale > 0:
        raise ValueError(f"scale must be > 0 for flash2_mma (the kernel folds it into exp2 after the row max); "
                         f"got {scale}")
    D = build_for(d)
    tile = normalize_tile(tile or TILES[D])
    check_tile(D, tile)
    blocks = B * H * ceil_div(Tq, block_rows(tile))
    if blocks > MAX_GRID_X:
        raise ValueError(f"B*H*ceil(Tq/{block_rows(tile)}) = {blocks} blocks exceeds the grid's limit ({MAX_GRID_X})")

    dtype = q.dtype.name
    o = cp.empty((B, H, Tq, d), dtype=q.dtype)
    lse = cp.empty((B, H, Tq), dtype=cp.float32) if return_lse else None
    kernel = _kernel(D, tile, dtype)
    kernel((blocks,), (32 * tile[1],),
           (q, k, v, o, lse if lse is not None else np.uintp(0),
            np.int32(Tq), np.int32(Tk), np.int32(d), np.float32(scale * LOG2E), np.int32(bool(causal)), np.int32(bool(head_major))),
           shared_mem=smem_bytes(D, tile))
    return (o, lse) if return_lse else o


register(Variant(
    name="flash2_mma",
    forward=forward,
    dtypes=DTYPES,
    notebook="06_fp16_tensor_cores",
    max_d=MAX_D,
    has_lse=True,
    description="FlashAttention-2 on tensor cores: mma.sync m16n8k16, ldmatrix(.trans), P in registers, "
                "cp.async double buffering, exp2 softmax",
))
