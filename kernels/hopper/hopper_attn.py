"""Launcher for kernels/hopper/hopper_attn.cu: a FlashAttention-3-style forward on Hopper (TMA + wgmma, fp16/bf16).

    o = forward(q, k, v, causal=True)                          # (B, H, T, d) float16 or bfloat16 CuPy arrays
    o, lse = forward(q, k, v, causal=True, return_lse=True)    # lse: (B, H, Tq) float32, natural log

The same contract as flash2_mma.forward: bottom-right causal mask (query i sees key j when j <= i + Tk - Tq), a
row that sees no key gives o = 0 and lse = -inf, any Tq, Tk >= 1. Head dimension d = 64 or 128 only (the kernel's
tiles are built around 64-column swizzle rows; kernels.STAGING["hopper_fa3"].head_dims says so to the tests).

Checked on an H100 by the attention tests (tests/test_attention_gpu.py runs its grid over REGISTRY and STAGING, where
this variant is: see the end of this file; tests/test_hopper_attn_gpu.py runs every schedule); its SASS is checked on
the CPU (tests/test_hopper_attn_compile.py).

Needs a Hopper GPU (compute capability 9.x): the file is compiled with NVRTC for sm_90a to a CUBIN
(kernels.core.load_module(..., arch="sm_90a")), as kernels/hopper/hopper_gemm.py explains. q, k and v are read by TMA
through tensor maps built with cuTensorMapEncodeTiled (kernels.hopper.hopper_gemm.tensor_map): each as a (B*H, T, d)
tensor read in boxes of 64 columns x block_m (q) or block_n (k, v) rows with the 128-byte swizzle, (B*H) being the
third dimension so that a box hanging over the end of one head reads zeros, not the next head's rows.

The tiling (query rows per CTA, keys per K/V tile, ring slots) is chosen per head dimension and mask (TILES,
default_tiles); without the causal mask the launch is persistent (one CTA per SM walks the work tiles).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import hopper_gemm
from ..core import (INT32_MAX, MAX_GRID_X, NULL, ceil_div, cp, defines_from, device_info, dtype_set,
                    get_kernel, validate_attention)
from ..core.registry import Variant, register

KERNEL_FILE = "hopper_attn.cu"
WHAT = "hopper_fa3 attention (wgmma + TMA)"
ARCH = hopper_gemm.ARCH  # sm_90a
MIN_CC = hopper_gemm.MIN_CC  # (9, 0)
HEAD_DIMS = (64, 128)
MAX_D = max(HEAD_DIMS)


class Tiles(NamedTuple):
    """One tiling of the kernel: block_m query rows per CTA (64 per consumer warpgroup), block_n keys per K/V tile,
    `stages` slots in each of the K and V rings."""
    block_m: int
    block_n: int
    stages: int

    @property
    def consumers(self) -> int:
        return self.block_m // 64

    @property
    def threads(self) -> int:  # + 1 producer warpgroup
        return 128 * (1 + self.consumers)

    @property
    def launch_regs(self) -> int:  # what __launch_bounds__(threads, 1) leaves: setmaxnreg's budget (168 or 128)
        return 65536 // self.threads // 8 * 8


# The tiling per (head dimension, causal); handed to the kernel with -D (hopper_attn.cu gives the non-causal ones as
# its defaults, and static_asserts what it can build). d = 64: 192 query rows (three consumer warpgroups: with only
# 32 O registers per thread a warpgroup has room, and the K/V traffic per query row drops by a third). d = 128: tiles
# of 176 keys (fewer and longer tiles for the same work), 128 under the causal mask (fewer keys past the diagonal);
# two K/V slots suffice, as a slot is freed as soon as its tile's product is done. The measurements behind these
# choices: kernels/hopper/README.md. tests/test_hopper_attn_gpu.py checks the other tilings too.
TILES = {
    (64, False): Tiles(192, 128, 4), (64, True): Tiles(192, 128, 4),
    (128, False): Tiles(128, 176, 2), (128, True): Tiles(128, 128, 2),
}
# Short causal sequences at d = 64 keep 128-row tiles: with 192 rows the wasted area along the diagonal (rows of a
# tile that see fewer keys than its last row) is a larger share of the little work there is.
SHORT_CAUSAL_TQ = 1024
SHORT_CAUSAL_TILES = Tiles(128, 128, 4)


def default_tiles(d: int, causal: bool, Tq: int) -> Tiles:
    """The tiling forward() uses when it is given none."""
    if d == 64 and causal and Tq <= SHORT_CAUSAL_TQ:
        return SHORT_CAUSAL_TILES
    return TILES[(d, bool(causal))]


BLOCK_NS = (128, 176, 192)  # the key-tile widths the kernel has a wgmma for (m64nNk16)


def tiles_defines(d: int, tiles: Tiles) -> tuple[str, ...]:
    return defines_from(**{f"BLOCK_M_D{d}": tiles.block_m, f"BLOCK_N_D{d}": tiles.block_n,
                           f"STAGES_D{d}": tiles.stages})


# The two scheduling features of FlashAttention-3 the kernel has, each a compile-time switch (-D OVERLAP=0/1,
# -D PINGPONG=0/1; both on by default). forward(..., overlap=False) builds and runs the kernel without one, which is
# how notebook 13 measures what each is worth; tests/test_hopper_attn_gpu.py checks every build. Lazy rescaling of O
# is a third switch of the same kind (-D LAZY_RESCALE=0/1, forward(..., lazy_rescale=False)).
SCHEDULES = {(o, p): defines_from(OVERLAP=int(o), PINGPONG=int(p)) for o in (False, True) for p in (False, True)}
ELEM_BYTES = 2
SMEM_ALIGN = 1024  # the kernel aligns its tiles to a swizzle atom, so it asks for this much slack
SMEM_LIMIT = 227 * 1024
TMA_BOX_COLS = 64  # one 128-byte swizzle row of 16-bit elements
ALIGN = 16  # bytes: TMA needs 16-byte aligned base addresses
CARVEOUT_MAX_SHARED = 100
LOG2E = 1.0 / math.log(2.0)
MAX_WORK = MAX_GRID_X // 2  # work-tile indices (w + gridDim.x in the kernel) stay below 2^31


def smem_bytes(d: int, tiles: Tiles) -> int:
    """Dynamic shared memory of one build: Q tile + stages x (K tile + V tile) + alignment slack
    (Shape<D>::SMEM_BYTES in hopper_attn.cu)."""
    return (tiles.block_m + tiles.stages * 2 * tiles.block_n) * d * ELEM_BYTES + SMEM_ALIGN


def check_tiles(d: int, tiles: Tiles) -> None:
    """The tilings the kernel can build (its static_asserts, said in Python before NVRTC would)."""
    if tiles.block_m not in (128, 192):
        raise ValueError(f"tiles.block_m={tiles.block_m}: must be 128 or 192 (two or three consumer warpgroups)")
    if tiles.block_n not in BLOCK_NS:
        raise ValueError(f"tiles.block_n={tiles.block_n}: must be one of {BLOCK_NS}")
    if not 2 <= tiles.stages <= 8:
        raise ValueError(f"tiles.stages={tiles.stages}: must be in [2, 8]")
    need = smem_bytes(d, tiles) + 8 * (2 + 4 * tiles.stages)  # + the static mbarriers (q_full, q_empty, 4 per slot)
    if need > SMEM_LIMIT:
        raise ValueError(f"tiles={tuple(tiles)} at d={d} needs {need} bytes of shared memory, more than the "
                         f"{SMEM_LIMIT} a block may have")


DTYPES = ("float16", "bfloat16")
DTYPE_SET = dtype_set(DTYPES)
KERNEL_NAMES = {(dt, d): f"hopper_attn_{'bf16' if dt == 'bfloat16' else 'f16'}_d{d}" for dt in DTYPES
                for d in HEAD_DIMS}

# What tests/test_compile.py compiles with NVRTC for sm_80..sm_90 (stubs there) and tests/test_hopper_attn_compile.py
# for sm_90a: the .cu defaults (the non-causal tilings) with both schedules on.
DEFINES = tiles_defines(64, TILES[(64, False)]) + tiles_defines(128, TILES[(128, False)])
NVRTC_BUILDS = [((), DEFINES + SCHEDULES[(True, True)])]

_CHECKED: set = set()


def kernel(dtype: str, d: int, tiles: Tiles, dev: int | None = None, overlap: bool = True, pingpong: bool = True,
           lazy_rescale: bool = True):
    """The Kernel of one (dtype, d, tiling, schedule, rescaling): compiled for sm_90a on first use; its register count
    checked once per device (the consumers' setmaxnreg.inc would wait forever in a build with fewer registers than
    tiles.launch_regs)."""
    name = KERNEL_NAMES[(dtype, d)]
    schedule = (bool(overlap), bool(pingpong))
    defines = tiles_defines(d, tiles) + SCHEDULES[schedule] + defines_from(LAZY_RESCALE=bool(lazy_rescale))
    kern = get_kernel(KERNEL_FILE, name, defines=defines, shared_mem=smem_bytes(d, tiles),
                      carveout=CARVEOUT_MAX_SHARED, arch=ARCH)
    if (name, tiles, defines, dev) not in _CHECKED and dev is not None:
        if kern.num_regs != tiles.launch_regs:
            raise RuntimeError(f"{KERNEL_FILE}:{name} was built with {kern.num_regs} registers per thread; its "
                               f"setmaxnreg budget needs exactly {tiles.launch_regs} (launching it could hang)")
        _CHECKED.add((name, tiles, defines, dev))
    return kern


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, overlap=True, pingpong=True, lazy_rescale=True,
            tiles=None, persistent=None):
    """softmax(scale q k^T) v with TMA and wgmma, scheduled as FlashAttention-3 does.

    q (B, H, Tq, d), k and v (B, H, Tk, d): C-contiguous float16 or bfloat16 CuPy arrays on the current device, one
    dtype, 16-byte aligned, d = 64 or 128. scale defaults to 1/sqrt(d) (any finite value). Returns o (B, H, Tq, d) of
    the inputs' dtype, and with return_lse also lse (B, H, Tq) float32 (natural log; -inf for a row that sees no key).
    Raises TypeError / ValueError naming the argument and the limit for anything else, UnsupportedDeviceError on a
    GPU that is not a Hopper.

    overlap=False turns off the pipelining inside a consumer warpgroup (the softmax of one K/V tile under the
    O += P V of the one before), pingpong=False the turn-taking of the consumer warpgroups at the tensor cores,
    lazy_rescale=False the lazy rescaling of O (the running row maximum then moves with every tile that raises it);
    tiles=Tiles(block_m, block_n, stages) replaces the tiling of default_tiles(). Each is a separate build of the
    kernel, for measuring what it is worth; the results agree to rounding (with overlap, O is rescaled after P V is
    added rather than before; with lazy rescaling, p and O are relative to a maximum up to 8 log2 units below the true one).

    persistent: True launches one CTA per SM, each walking the work tiles (query tile, head, batch) c, c + #SMs, ...;
    False one CTA per work tile, which the GPU hands out to the SMs as they free up. The default (None) is True without
    the causal mask, where every work tile costs the same, and False with it, where the fixed round robin would give
    some SMs only long tiles. Same build, same results.
    """
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=MAX_D, min_cc=MIN_CC, what=WHAT,
                                                scale=scale, align=ALIGN)
    if d not in HEAD_DIMS:
        raise ValueError(f"head dimension d={d} is not supported by {WHAT}: d must be one of {HEAD_DIMS} (its tiles "
                         f"are whole 64-column rows of the 128-byte swizzle)")
    if tiles is None:
        tiles = default_tiles(d, causal, Tq)
    else:
        tiles = Tiles(*tiles)
        check_tiles(d, tiles)
    work = ceil_div(Tq, tiles.block_m) * B * H  # work tiles: (query tile, head, batch)
    if work > MAX_WORK:
        raise ValueError(f"B={B}, H={H}, Tq={Tq} make {work} work tiles of {tiles.block_m} query rows; {WHAT} "
                         f"counts them in 32-bit integers and takes at most {MAX_WORK}")
    limit = INT32_MAX - 2 * max(tiles.block_m, tiles.block_n)
    if max(Tq, Tk) > limit:
        raise ValueError(f"Tq={Tq} and Tk={Tk} must be <= {limit} for {WHAT} (32-bit row indices)")
    hopper_gemm.check_hopper()  # compute capability 9.x exactly: an sm_90a CUBIN runs nowhere else
    dev = cp.cuda.runtime.getDevice()
    dtype = q.dtype.name

    o = cp.empty((B, H, Tq, d), dtype=q.dtype)
    lse = cp.empty((B, H, Tq), dtype=cp.float32) if return_lse else None
    BH = B * H
    map_q = hopper_gemm.tensor_map(q, BH, Tq, d, tiles.block_m)  # boxes of 64 columns x block_m rows, 128-byte swizzle
    map_k = hopper_gemm.tensor_map(k, BH, Tk, d, tiles.block_n)
    map_v = hopper_gemm.tensor_map(v, BH, Tk, d, tiles.block_n)
    if persistent is None:
        persistent = not causal
    grid = min(work, device_info(dev).sm_count) if persistent else work
    kernel(dtype, d, tiles, dev, overlap, pingpong, lazy_rescale)(
        (grid,), (tiles.threads,),
        (map_q, map_k, map_v, o, NULL if lse is None else lse, np.int32(Tq), np.int32(Tk), np.int32(BH),
         np.float32(scale * LOG2E), np.int32(bool(causal))),
        shared_mem=smem_bytes(d, tiles))
    return (o, lse) if return_lse else o


assert hopper_gemm.BLOCK_K == TMA_BOX_COLS  # tensor_map's box is 64 columns wide: one 128-byte swizzle row

# In STAGING, not REGISTRY: tested on the full grid, and at its speed target (notebook 13), but kept out of notebook
# 07's benchmark, which runs every REGISTRY variant on whatever GPU it finds and has no way yet to skip one that needs
# a Hopper.
register(Variant("hopper_fa3", forward, DTYPES, "13_hopper_wgmma_tma", MAX_D, head_dims=HEAD_DIMS, has_lse=True,
                 min_cc=MIN_CC, description="FlashAttention-3-style forward: TMA K/V rings, producer warp, two or three "
                 "consumer warpgroups, wgmma S = Q K^T from shared memory and O += P V with P in registers"),
         staging=True)
