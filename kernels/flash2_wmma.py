"""Launcher for kernels/flash2_wmma.cu: FlashAttention-2 forward on tensor cores through nvcuda::wmma.

    o = forward(q, k, v, causal=True)                          # (B, H, T, d) float16 or bfloat16 CuPy arrays
    o, lse = forward(q, k, v, causal=True, return_lse=True)    # lse: (B, H, Tq) float32, natural log

The same loop as kernels/flash2.py (a Q tile per block, K/V tiles streamed past it, O on chip), with S = Q K^T
and O += P V on tensor cores (16x16x16 fragments, float32 accumulation). The output has the input's dtype.
Each head size d (a multiple of 8, at most 128) runs on the build for the smallest D in {32, 64, 128} with
D >= d; columns d..D-1 are zero-filled in shared memory.
"""

from __future__ import annotations

import math

import numpy as np

from ._core import ceil_div, cp, cuda_header_options, get_kernel, set_dynamic_shared_memory, validate_attention
from .registry import Variant, register

KERNEL_FILE = "flash2_wmma.cu"
KERNEL_NAME = "flash2_wmma_forward"
MAX_D = 128
D_MULTIPLE = 8  # 16-byte vector loads of 8 elements, each wholly inside or outside a row
HEAD_DIMS = (32, 64, 128)  # the D of the builds; d runs on the smallest D >= d
FRAG = 16  # the wmma fragment is 16 x 16
PAD16, PAD32 = 8, 4  # = PAD16 and PAD32 in flash2_wmma.cu (16 bytes per shared-memory row)
ALIGN = 16  # bytes: q, k, v are read, and o written, in 16-byte vectors
MAX_GRID_Y = 65535
LOG2E = 1.0 / math.log(2.0)
CARVEOUT_MAX_SHARED = 100  # percent of the SM's L1/shared storage given to shared memory (a hint to the driver)
CTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16"}  # NumPy dtype name -> the kernel's T

# (BR, BC) per D: BR query rows (one warp per 16) x BC keys per tile.
# Chosen by a sweep on an H100 (fp16, B=4, H=32, T in {1024, 4096}, causal and not, next to torch SDPA flash):
# D=64: (128, 64) 0.52x SDPA on average, (64, 64) 0.49x, (64, 32) 0.46x;
# D=128: (128, 32) 0.53x, (64, 32) 0.48x, (64, 64) 0.44x. D=32 was not swept.
TILES = {
    32: (64, 64),  # 128 threads, 42,240 B shared memory
    64: (128, 64),  # 256 threads, 90,624 B shared memory: 2 blocks per H100 SM
    128: (128, 32),  # 256 threads, 81,408 B shared memory: 2 blocks per SM
}


def tile_threads(BR: int, BC: int) -> int:
    return 32 * (BR // FRAG)


def smem_bytes(D: int, BR: int, BC: int) -> int:
    """(BR + 2*BC)*(D+8)*2 + BR*(BC+4)*4 + BR*(BC+8)*2 + BR*4 -- WmmaTile::SMEM_BYTES: Q, K, V, S, P, alpha."""
    return (BR + 2 * BC) * (D + PAD16) * 2 + BR * (BC + PAD32) * 4 + BR * (BC + PAD16) * 2 + BR * 4


def check_tile(D: int, BR: int, BC: int) -> None:
    """The static_asserts of WmmaTile, as a ValueError before compiling."""
    problems = []
    if D not in HEAD_DIMS:
        problems.append(f"D={D} is not one of {HEAD_DIMS}")
    if BR < FRAG or BC < FRAG or BR % FRAG or BC % FRAG:
        problems.append(f"BR and BC must be positive multiples of {FRAG}")
    elif tile_threads(BR, BC) > 1024:
        problems.append(f"BR={BR} gives {tile_threads(BR, BC)} threads; at most 1024 (BR <= 512)")
    if problems:
        raise ValueError(f"tile (BR, BC) = {(BR, BC)} for D={D}: " + "; ".join(problems))


def build_for(d: int) -> int:
    return next(D for D in HEAD_DIMS if D >= d)


def name_expression(dtype: str, D: int, tile) -> str:
    BR, BC = tile
    return f"{KERNEL_NAME}<{CTYPES[dtype]}, {D}, {BR}, {BC}>"


# What tests/test_compile.py compiles with NVRTC on a CPU-only machine: every build the launcher uses.
NVRTC_BUILDS = [((name_expression(dt, D, TILES[D]),), ()) for dt in CTYPES for D in HEAD_DIMS]


_CONFIGURED: set = set()  # (device id, dtype, D, tile) whose kernel attributes are set


def _kernel(dtype: str, D: int, tile):
    """The compiled build for (dtype, D, tile), with its shared-memory limit raised and the carveout set, once."""
    expr = name_expression(dtype, D, tile)
    kernel = get_kernel(KERNEL_FILE, expr, name_expressions=(expr,), defines=cuda_header_options())
    key = (cp.cuda.Device().id, dtype, D, tuple(tile))
    if key not in _CONFIGURED:
        set_dynamic_shared_memory(kernel, smem_bytes(D, *tile), f"flash2_wmma ({dtype}, D={D}, tile={tuple(tile)})")
        kernel.preferred_shared_memory_carveout = CARVEOUT_MAX_SHARED
        _CONFIGURED.add(key)
    return kernel


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, tile=None):
    """softmax(scale q k^T) v on tensor cores (wmma), FlashAttention-2 loop order; optionally also the LSE.

    q: (B, H, Tq, d), k and v: (B, H, Tk, d), one dtype (float16 or bfloat16), C-contiguous, 16-byte aligned.
    tile: optional (BR, BC) to override TILES[D] (for experiments; checked like the static_asserts).
    """
    what = "flash2_wmma attention"
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=tuple(CTYPES), max_d=MAX_D, what=what,
                                                d_multiple=D_MULTIPLE, scale=scale)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.data.ptr % ALIGN:
            raise ValueError(f"{name} starts at address {x.data.ptr:#x}, which is not {ALIGN}-byte aligned; "
                             f"{what} reads 16-byte vectors (copy it: cupy.array({name}))")
    dtype = q.dtype.name
    D = build_for(d)
    tile = tuple(int(x) for x in (tile or TILES[D]))
    check_tile(D, *tile)
    BR = tile[0]
    grid_y = ceil_div(Tq, BR)
    if grid_y > MAX_GRID_Y:
        raise ValueError(f"Tq={Tq} needs {grid_y} query tiles of {BR}; the grid allows at most {MAX_GRID_Y}")
    if B * H > 2**31 - 1:
        raise ValueError(f"B*H={B * H} exceeds the grid's x limit (2^31 - 1)")

    o = cp.empty((B, H, Tq, d), dtype=q.dtype)
    lse = cp.empty((B, H, Tq), dtype=cp.float32) if return_lse else None
    kernel = _kernel(dtype, D, tile)
    kernel((B * H, grid_y), (tile_threads(*tile),),
           (q, k, v, o, lse if lse is not None else np.uintp(0),
            np.int32(Tq), np.int32(Tk), np.int32(d), np.float32(scale * LOG2E), np.int32(bool(causal))),
           shared_mem=smem_bytes(D, *tile))
    return (o, lse) if return_lse else o


register(Variant(
    name="flash2_wmma",
    forward=forward,
    dtypes=tuple(CTYPES),
    notebook="06_fp16_tensor_cores",
    max_d=MAX_D,
    has_lse=True,
    description="FlashAttention-2 on tensor cores via nvcuda::wmma 16x16x16: S and P through shared memory, "
                "O in accumulator fragments",
))
