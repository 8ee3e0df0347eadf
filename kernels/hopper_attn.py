"""Launcher for kernels/hopper_attn.cu: a FlashAttention-3-style forward on Hopper (TMA + wgmma, fp16/bf16).

    o = forward(q, k, v, causal=True)                          # (B, H, T, d) float16 or bfloat16 CuPy arrays
    o, lse = forward(q, k, v, causal=True, return_lse=True)    # lse: (B, H, Tq) float32, natural log

The same contract as flash2_mma.forward: bottom-right causal mask (query i sees key j when j <= i + Tk - Tq), a
row that sees no key gives o = 0 and lse = -inf, any Tq, Tk >= 1. Head dimension d = 64 or 128 only (the kernel's
tiles are built around 64-column swizzle rows; kernels.STAGING["hopper_fa3"].head_dims says so to the tests).

Checked on an H100 by the attention tests (tests/test_attention_gpu.py runs its grid over REGISTRY and STAGING, where
this variant is until it meets its speed target; tests/test_hopper_attn_gpu.py runs every schedule); its SASS is
checked on the CPU (tests/test_hopper_attn_compile.py).

Needs a Hopper GPU (compute capability 9.x): the file is compiled with NVRTC for sm_90a to a CUBIN
(kernels._core.load_module(..., arch="sm_90a")), as kernels/hopper_gemm.py explains. q, k and v are read by TMA
through tensor maps built with cuTensorMapEncodeTiled (kernels.hopper_gemm.tensor_map): each as a (B*H, T, d)
tensor read in boxes of 64 columns x 128 rows with the 128-byte swizzle, (B*H) being the third dimension so that a
box hanging over the end of one head reads zeros, not the next head's rows.
"""

from __future__ import annotations

import math

import numpy as np

from . import hopper_gemm
from ._core import (INT32_MAX, MAX_GRID_X, MAX_GRID_YZ, NULL, ceil_div, check_grid, cp, defines_from,
                    dtype_set, get_kernel, validate_attention)
from .registry import Variant, register

KERNEL_FILE = "hopper_attn.cu"
WHAT = "hopper_fa3 attention (wgmma + TMA)"
ARCH = hopper_gemm.ARCH  # sm_90a
MIN_CC = hopper_gemm.MIN_CC  # (9, 0)
HEAD_DIMS = (64, 128)
MAX_D = max(HEAD_DIMS)

# The tiling; handed to the kernel with -D (hopper_attn.cu gives the same defaults and static_asserts them).
BLOCK_M = 128  # query rows per CTA: two consumer warpgroups of 64
BLOCK_N = 128  # keys per K/V tile
STAGES = {64: 4, 128: 3}  # K/V ring slots per head dimension
DEFINES = defines_from(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGES_D64=STAGES[64], STAGES_D128=STAGES[128])
# The two scheduling features of FlashAttention-3 the kernel has, each a compile-time switch (-D OVERLAP=0/1,
# -D PINGPONG=0/1; both on by default). forward(..., overlap=False) builds and runs the kernel without one, which is
# how notebook 13 measures what each is worth; tests/test_hopper_attn_gpu.py checks every build.
SCHEDULES = {(o, p): defines_from(OVERLAP=int(o), PINGPONG=int(p)) for o in (False, True) for p in (False, True)}
THREADS = 128 * (1 + BLOCK_M // 64)  # producer warpgroup + consumer warpgroups
ELEM_BYTES = 2
SMEM_ALIGN = 1024  # the kernel aligns its tiles to a swizzle atom, so it asks for this much slack
TMA_BOX_COLS = 64  # one 128-byte swizzle row of 16-bit elements
ALIGN = 16  # bytes: TMA needs 16-byte aligned base addresses
CARVEOUT_MAX_SHARED = 100
LOG2E = 1.0 / math.log(2.0)


def smem_bytes(d: int) -> int:
    """Dynamic shared memory of the D = d build: Q tile + STAGES x (K tile + V tile) + alignment slack
    (Shape<D>::SMEM_BYTES in hopper_attn.cu)."""
    return BLOCK_M * d * ELEM_BYTES + STAGES[d] * 2 * BLOCK_N * d * ELEM_BYTES + SMEM_ALIGN


DTYPES = ("float16", "bfloat16")
DTYPE_SET = dtype_set(DTYPES)
KERNEL_NAMES = {(dt, d): f"hopper_attn_{'bf16' if dt == 'bfloat16' else 'f16'}_d{d}" for dt in DTYPES
                for d in HEAD_DIMS}

# What tests/test_compile.py compiles with NVRTC for sm_80..sm_90 (stubs there) and tests/test_hopper_attn_compile.py
# for sm_90a.
NVRTC_BUILDS = [((), DEFINES + SCHEDULES[(True, True)])]  # the default build (the others: test_hopper_attn_compile)

LAUNCH_REGS = 65536 // THREADS // 8 * 8  # 168: what __launch_bounds__(384, 1) leaves; setmaxnreg's budget
_CHECKED: set = set()


def kernel(dtype: str, d: int, dev: int | None = None, overlap: bool = True, pingpong: bool = True):
    """The Kernel of one (dtype, d, schedule): compiled for sm_90a on first use; its register count checked once per
    device (the consumers' setmaxnreg.inc would wait forever in a build with fewer than LAUNCH_REGS registers)."""
    name = KERNEL_NAMES[(dtype, d)]
    schedule = (bool(overlap), bool(pingpong))
    kern = get_kernel(KERNEL_FILE, name, defines=DEFINES + SCHEDULES[schedule], shared_mem=smem_bytes(d),
                      carveout=CARVEOUT_MAX_SHARED, arch=ARCH)
    if (name, schedule, dev) not in _CHECKED and dev is not None:
        if kern.num_regs != LAUNCH_REGS:
            raise RuntimeError(f"{KERNEL_FILE}:{name} was built with {kern.num_regs} registers per thread; its "
                               f"setmaxnreg budget needs exactly {LAUNCH_REGS} (launching it could hang)")
        _CHECKED.add((name, schedule, dev))
    return kern


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, overlap=True, pingpong=True):
    """softmax(scale q k^T) v with TMA and wgmma, scheduled as FlashAttention-3 does.

    q (B, H, Tq, d), k and v (B, H, Tk, d): C-contiguous float16 or bfloat16 CuPy arrays on the current device, one
    dtype, 16-byte aligned, d = 64 or 128. scale defaults to 1/sqrt(d) (any finite value). Returns o (B, H, Tq, d) of
    the inputs' dtype, and with return_lse also lse (B, H, Tq) float32 (natural log; -inf for a row that sees no key).
    Raises TypeError / ValueError naming the argument and the limit for anything else, UnsupportedDeviceError on a
    GPU that is not a Hopper.

    overlap=False turns off the pipelining inside a consumer warpgroup (the softmax of one K/V tile under the
    O += P V of the one before), pingpong=False the alternation of the two consumer warpgroups at the tensor cores;
    each is a separate build of the kernel, for measuring what the feature is worth. The results agree to rounding
    (with overlap, O is rescaled after P V is added rather than before).
    """
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=MAX_D, min_cc=MIN_CC, what=WHAT,
                                                scale=scale, align=ALIGN)
    if d not in HEAD_DIMS:
        raise ValueError(f"head dimension d={d} is not supported by {WHAT}: d must be one of {HEAD_DIMS} (its tiles "
                         f"are whole 64-column rows of the 128-byte swizzle)")
    m_tiles = ceil_div(Tq, BLOCK_M)
    check_grid(m_tiles, WHAT, MAX_GRID_X)
    for name, val in (("H", H), ("B", B)):
        if val > MAX_GRID_YZ:
            raise ValueError(f"{name}={val} is more than {WHAT} supports: the grid is (query tiles, H, B) and its y "
                             f"and z sizes are at most {MAX_GRID_YZ}")
    if max(Tq, Tk) > INT32_MAX - 2 * BLOCK_M:
        raise ValueError(f"Tq={Tq} and Tk={Tk} must be <= {INT32_MAX - 2 * BLOCK_M} for {WHAT} (32-bit row indices)")
    hopper_gemm.check_hopper()  # compute capability 9.x exactly: an sm_90a CUBIN runs nowhere else
    dev = cp.cuda.runtime.getDevice()
    dtype = q.dtype.name

    o = cp.empty((B, H, Tq, d), dtype=q.dtype)
    lse = cp.empty((B, H, Tq), dtype=cp.float32) if return_lse else None
    BH = B * H
    map_q = hopper_gemm.tensor_map(q, BH, Tq, d, BLOCK_M)  # boxes of 64 columns x 128 rows, 128-byte swizzle
    map_k = hopper_gemm.tensor_map(k, BH, Tk, d, BLOCK_N)
    map_v = hopper_gemm.tensor_map(v, BH, Tk, d, BLOCK_N)
    kernel(dtype, d, dev, overlap, pingpong)((m_tiles, H, B), (THREADS,),
                          (map_q, map_k, map_v, o, NULL if lse is None else lse, np.int32(Tq), np.int32(Tk),
                           np.float32(scale * LOG2E), np.int32(bool(causal))),
                          shared_mem=smem_bytes(d))
    return (o, lse) if return_lse else o


assert hopper_gemm.BLOCK_K == TMA_BOX_COLS  # tensor_map's box is 64 columns wide: one 128-byte swizzle row

# In STAGING, not yet REGISTRY: tested on the full grid, but not in notebook 07's benchmark tables until it is tuned.
register(Variant(
    name="hopper_fa3",
    forward=forward,
    dtypes=DTYPES,
    notebook="13_hopper_wgmma_tma",
    max_d=MAX_D,
    head_dims=HEAD_DIMS,
    has_lse=True,
    min_cc=MIN_CC,
    module=__name__,
    description="FlashAttention-3-style forward: TMA K/V ring, producer warp, two "
                "consumer warpgroups, wgmma S = Q K^T from shared memory and O += P V with P in registers",
), staging=True)
