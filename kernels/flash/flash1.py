"""Launcher for kernels/flash/flash1.cu: FlashAttention-1 forward in the paper's loop order (K/V tiles outer).

    o = forward(q, k, v, causal=True)                          # (B, H, T, d) float32 CuPy arrays
    o, lse = forward(q, k, v, causal=True, return_lse=True)    # lse: (B, H, Tq) float32, natural log

Slow on purpose: one block (one warp) per (b, h), and O, l, m make a round trip through global memory
once per K/V tile. `hbm_traffic_bytes` counts that round trip.
"""

from __future__ import annotations

import numpy as np

from ..core import MAX_GRID_X, T4_CC, ceil_div, check_grid, cp, get_kernel, validate_attention
from ..core.registry import Variant, register

KERNEL_FILE = "flash1.cu"
KERNEL_NAME = "flash1_forward"
BR = 32  # = BR in flash1.cu: query rows per Q tile = threads per block
BC = 32  # = BC in flash1.cu: keys per K/V tile
MAX_D = 128  # = MAX_D in flash1.cu
WHAT = "flash1 attention"

NVRTC_BUILDS = [((), ())]  # one build: extern "C", no defines


def smem_bytes(d: int) -> int:
    """4 * (BR*(d+1) + 2*BC*d + BR*(BC+1)): Qs, Ks, Vs and Ss of flash1.cu."""
    return 4 * (BR * (d + 1) + 2 * BC * d + BR * (BC + 1))


def visited_tiles(Tq: int, Tk: int, causal: bool) -> tuple[int, int]:
    """(K/V tile, Q tile) pairs the kernel processes for one (b, h), and the query rows they hold.

    Causal skips a pair when every row of the Q tile is above the diagonal for every key of the K/V tile.
    """
    nq, nk = ceil_div(Tq, BR), ceil_div(Tk, BC)
    diag = Tk - Tq
    pairs = rows = 0
    for j in range(nk):
        for i in range(nq):
            last_row = min((i + 1) * BR, Tq) - 1
            if causal and j * BC > last_row + diag:
                continue
            pairs += 1
            rows += last_row + 1 - i * BR
    return pairs, rows


def hbm_traffic_bytes(B: int, H: int, Tq: int, Tk: int, d: int, causal: bool = False) -> dict:
    """Global-memory bytes of the O/l/m round trips (and of re-reading Q) over the whole launch.

    Each visited (K/V tile, Q tile) pair reads and writes the tile's rows of O (d floats), l and m (1 float
    each) and reads its rows of Q again.
    """
    pairs, rows = visited_tiles(Tq, Tk, causal)
    pairs, rows = pairs * B * H, rows * B * H
    return {
        "tile_pairs": pairs,
        "olm_bytes": 4 * rows * 2 * (d + 2),  # read + write of O, l, m
        "q_bytes": 4 * rows * d,  # Q_i read again for every K/V tile
        "per_kv_tile_per_head_bytes": 4 * 2 * Tq * (d + 2),  # no causal skipping
    }


def kernel():
    """The kernel, allowed the shared memory of the largest d (so one opt-in serves every d)."""
    return get_kernel(KERNEL_FILE, KERNEL_NAME, shared_mem=smem_bytes(MAX_D))


def forward(q, k, v, *, causal=False, scale=None, return_lse=False):
    """softmax(scale q k^T) v in the FlashAttention-1 loop order; optionally also the LSE."""
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=("float32",), max_d=MAX_D, min_cc=T4_CC, what=WHAT,
                                                scale=scale)
    check_grid(B * H, WHAT, MAX_GRID_X)
    o = cp.empty((B, H, Tq, d), dtype=cp.float32)
    l_hbm = cp.empty((B, H, Tq), dtype=cp.float32)  # initialised by the kernel
    m_hbm = cp.empty((B, H, Tq), dtype=cp.float32)
    lse = cp.empty((B, H, Tq), dtype=cp.float32)
    kernel()((B * H,), (BR,),
             (q, k, v, o, l_hbm, m_hbm, lse, np.int32(Tq), np.int32(Tk), np.int32(d), np.float32(scale),
              np.int32(bool(causal))),
             smem_bytes(d))
    return (o, lse) if return_lse else o


register(Variant("flash1", forward, ("float32",), "03_flash_attention_1", MAX_D, has_lse=True, min_cc=T4_CC,
                 description="FlashAttention-1 loop order: K/V tiles outer, O/l/m round trip through HBM per tile (llm.c v2 made right)"))
