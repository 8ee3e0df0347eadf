"""Launcher for kernels/flash/flash2_wmma.cu: FlashAttention-2 forward on tensor cores through nvcuda::wmma.

    o = forward(q, k, v, causal=True)                          # (B, H, T, d) float16 or bfloat16 CuPy arrays
    o, lse = forward(q, k, v, causal=True, return_lse=True)    # lse: (B, H, Tq) float32, natural log

The same loop as kernels/flash/flash2.py (a Q tile per block, K/V tiles streamed past it, O on chip), with S = Q K^T
and O += P V on tensor cores (16x16x16 fragments, float32 accumulation). The output has the input's dtype.
Each head size d (a multiple of 8, at most 128) runs on the build for the smallest D in {32, 64, 128} with
D >= d; columns d..D-1 are zero-filled in shared memory.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ..core import (DTYPE_NAMES, I32, MAX_GRID_X, MAX_GRID_YZ, Launch, attention_launch, ceil_div, check_grid,
                    cuda_header_options, defines_from, dtype_set, get_kernel, launch_cache, validate_attention)
from ..core.registry import Variant, register

KERNEL_FILE = "flash2_wmma.cu"
KERNEL_NAME = "flash2_wmma_forward"
WHAT = "flash2_wmma attention"
MAX_D = 128
D_MULTIPLE = 8  # 16-byte vector loads of 8 elements, each wholly inside or outside a row
HEAD_DIMS = (32, 64, 128)  # the D of the builds; d runs on the smallest D >= d
BUILD_FOR = {d: next(D for D in HEAD_DIMS if D >= d) for d in range(1, MAX_D + 1)}
FRAG = 16  # the wmma fragment is 16 x 16
PAD16, PAD32 = 8, 4  # shared-memory row padding (16 bytes each); handed to the kernel as -DPAD16, -DPAD32
ALIGN = 16  # bytes: q, k, v are read, and o written, in 16-byte vectors
LOG2E = 1.0 / math.log(2.0)
CARVEOUT_MAX_SHARED = 100  # percent of the SM's L1/shared storage given to shared memory (a hint to the driver)
CTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16"}  # NumPy dtype name -> the kernel's T
DTYPE_SET = dtype_set(tuple(CTYPES))


def defines() -> tuple:
    """The -D sizes and the include directory of crt/mma.h, which <mma.h> needs (see cuda_header_options)."""
    return defines_from(PAD16=PAD16, PAD32=PAD32) + cuda_header_options()


class WmmaTile(NamedTuple):
    """The tiling of one flash2_wmma build: BR query rows (one warp per 16) x BC keys per tile."""
    BR: int
    BC: int

    @property
    def threads(self) -> int:
        return 32 * (self.BR // FRAG)

    def smem_bytes(self, D: int) -> int:
        """(BR + 2*BC)*(D+8)*2 + BR*(BC+4)*4 + BR*(BC+8)*2 + BR*4 -- WmmaTile::SMEM_BYTES: Q, K, V, S, P, alpha."""
        BR, BC = self
        return (BR + 2 * BC) * (D + PAD16) * 2 + BR * (BC + PAD32) * 4 + BR * (BC + PAD16) * 2 + BR * 4

    def check(self, D: int) -> None:
        """The static_asserts of WmmaTile in flash2_wmma.cu, as a ValueError before compiling."""
        BR, BC = self
        problems = []
        if D not in HEAD_DIMS:
            problems.append(f"D={D} is not one of {HEAD_DIMS}")
        if BR < FRAG or BC < FRAG or BR % FRAG or BC % FRAG:
            problems.append(f"BR and BC must be positive multiples of {FRAG}")
        elif self.threads > 1024:
            problems.append(f"BR={BR} gives {self.threads} threads; at most 1024 (BR <= 512)")
        if problems:
            raise ValueError(f"tile ({', '.join(self._fields)}) = {tuple(self)} for D={D}: " + "; ".join(problems))


# The default tile per D, chosen by a tile sweep next to torch SDPA flash (its figures: kernels/flash/README.md).
TILES = {
    32: WmmaTile(64, 64),  # 128 threads, 42,240 B shared memory
    64: WmmaTile(128, 64),  # 256 threads, 90,624 B shared memory
    128: WmmaTile(128, 32),  # 256 threads, 81,408 B shared memory
}


def name_expression(dtype: str, D: int, tile: WmmaTile) -> str:
    return f"{KERNEL_NAME}<{CTYPES[dtype]}, {D}, {tile.BR}, {tile.BC}>"


# What tests/test_compile.py compiles with NVRTC on a CPU-only machine: every build the launcher uses.
NVRTC_BUILDS = [((name_expression(dt, D, TILES[D]),), defines_from(PAD16=PAD16, PAD32=PAD32))
                for dt in CTYPES for D in HEAD_DIMS]


@functools.lru_cache(maxsize=None)
def build(dtype: str, D: int, tile: tuple | None):
    """(Kernel, WmmaTile, shared-memory bytes) of one build; checked once, compiled on its first launch."""
    tile = TILES[D] if tile is None else WmmaTile(*tile)
    tile.check(D)
    expr = name_expression(dtype, D, tile)
    smem = tile.smem_bytes(D)
    kernel = get_kernel(KERNEL_FILE, expr, name_expressions=(expr,), defines=defines(), shared_mem=smem,
                        carveout=CARVEOUT_MAX_SHARED)
    return kernel, tile, smem


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, tile=None):
    """softmax(scale q k^T) v on tensor cores (wmma), FlashAttention-2 loop order; optionally also the LSE.

    q: (B, H, Tq, d), k and v: (B, H, Tk, d), one dtype (float16 or bfloat16), C-contiguous, 16-byte aligned.
    tile: optional WmmaTile (or (BR, BC)) instead of TILES[D] (for experiments; checked like the static_asserts).
    """
    return attention_launch(_CALLS, _prepare, q, k, v, ALIGN, (causal, scale, tile), return_lse)


_CALLS = launch_cache()  # (qkv_key, options) -> what _prepare returned (see kernels.core.attention_launch)


def _prepare(q, k, v, dev, causal, scale, tile):
    """Validate q, k, v and return (Launch, o shape, o dtype, lse shape): one problem's launch, made once."""
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=MAX_D, what=WHAT,
                                                d_multiple=D_MULTIPLE, scale=scale, align=ALIGN)
    kernel, tile, smem = build(DTYPE_NAMES[q.dtype], BUILD_FOR[d], None if tile is None else tuple(tile))
    grid_y = ceil_div(Tq, tile.BR)
    check_grid(grid_y, WHAT, MAX_GRID_YZ, "y")
    check_grid(B * H, WHAT, MAX_GRID_X)
    tail = (np.int32(Tq), np.int32(Tk), np.int32(d), np.float32(scale * LOG2E), I32[bool(causal)])
    return Launch(kernel, (B * H, grid_y), (tile.threads,), smem, 5, tail, dev), (B, H, Tq, d), q.dtype, (B, H, Tq)


register(Variant("flash2_wmma", forward, tuple(CTYPES), "06_fp16_tensor_cores", MAX_D, has_lse=True,
                 description="FlashAttention-2 on tensor cores via nvcuda::wmma 16x16x16: S and P through shared memory, "
                             "O in accumulator fragments"))
