"""Launcher for kernels/flash/flash2_mma_bwd.cu: the FlashAttention-2 backward on tensor cores (mma.sync, fp16/bf16).

    o, lse = flash2_mma.forward(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = backward(q, k, v, o, lse, do, causal=True)          # same layouts and dtype as q, k, v

Three launches on CuPy's current stream: preprocess (delta = rowsum(dO * O), lse in log2 units, the float32 dQ
accumulator zeroed), the main kernel (one block per K/V tile looping over query tiles; dK, dV in registers, dQ by
float32 atomics) and a convert kernel (dQ = scale * accumulator in 16 bits). See the .cu header for the algorithm
and why dQ goes through atomics.

Outputs and the float32 workspace (workspace_elements(B, H, Tq, d) floats) may be passed in (dq=, dk=, dv=,
workspace=), which is how kernels/pytorch/torch_ops.py has them come from PyTorch's caching allocator; otherwise they are
allocated with CuPy.

The variants of flash2_mma.forward (reference.variants.attention_variant_backward is their oracle), through the kernel
flash2_bwd_variants, with the forward's options, checks and errors (flash2_mma.variant_spec, check_variant_arrays):

    o, lse = flash2_mma.forward(q, k, v, causal=True, window=(1024, 0), softcap=30.0, return_lse=True)
    dq, dk, dv = backward(q, k, v, o, lse, do, causal=True, window=(1024, 0), softcap=30.0)

k, v may have Hkv heads (Hq % Hkv == 0): dk, dv then have k's shape, each query head's part summed in float32 by
flash2_bwd_reduce_heads (a float32 scratch of 2 B Hq Tk d elements). Query tiles no row of which sees a key of a block
are skipped, tiles every row sees in full run without mask code (the .cu's query_tiles).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .flash2_mma import (_grouped, check_variant_arrays, doc_classes, raise_tile_problems, validate_variant_problem,
                         variant_spec)
from ..core import (DTYPE_NAMES, I32, MAX_GRID_X, MAX_GRID_YZ, NULL, ceil_div, check_array, check_grid, cp,
                    current_device, defines_from, dtype_set, get_kernel, validate_attention)

KERNEL_FILE = "flash2_mma_bwd.cu"
MAIN_NAME = "flash2_bwd_main"
PRE_NAME = "flash2_bwd_preprocess"
CONVERT_NAME = "flash2_bwd_convert"
WHAT = "flash2_mma_bwd attention backward"
MAX_D = 128
D_MULTIPLE = 8  # cp.async moves 16-byte chunks
HEAD_DIMS = (32, 64, 96, 128)
BUILD_FOR = {d: next(D for D in HEAD_DIMS if D >= d) for d in range(1, MAX_D + 1)}
MMA_M = 16  # rows of an mma.m16n8k16 tile: keys per warp
SMEM_PAD = 8  # elements of padding per shared row (-DSMEM_PAD)
PRE_WARPS = 4  # query rows (one warp each) per preprocess block (-DPRE_WARPS)
DEFINES = defines_from(SMEM_PAD=SMEM_PAD, PRE_WARPS=PRE_WARPS)
ALIGN = 16
DTYPES = ("float16", "bfloat16")
DTYPE_SET = dtype_set(DTYPES)
CONVERT_BLOCK = 256
CONVERT_MAX_BLOCKS = 8192  # grid-stride loop beyond this
CARVEOUT_MAX_SHARED = 100


class BwdTile(NamedTuple):
    """One build of the main kernel: BR queries per tile, NWARPS warps (BC = 16 NWARPS keys per block) and
    MIN_BLOCKS, the blocks per SM that __launch_bounds__ leaves registers for."""
    BR: int
    NWARPS: int
    MIN_BLOCKS: int = 1

    @property
    def keys(self) -> int:
        """BC: keys per block."""
        return MMA_M * self.NWARPS

    @property
    def threads(self) -> int:
        return 32 * self.NWARPS

    def smem_bytes(self, D: int) -> int:
        """2 (D + 8)(2 BC + 4 BR) + 2 BC (BR + 8) + 16 BR: K, V, two stages of Q and dO, dS, lse2 and delta."""
        BC, BR, LD = self.keys, self.BR, D + SMEM_PAD
        return 2 * LD * (2 * BC + 4 * BR) + 2 * BC * (BR + SMEM_PAD) + 16 * BR

    def check(self, D: int) -> None:
        """The static_asserts of flash2_bwd_main, as a ValueError before compiling."""
        problems = []
        if self.BR < 16 or self.BR % 16:
            problems.append(f"BR={self.BR} must be a positive multiple of 16")
        elif self.NWARPS < 1 or self.NWARPS * 32 > 1024 or self.NWARPS % (self.BR // 16):
            problems.append(f"NWARPS={self.NWARPS} must be a multiple of BR/16 = {self.BR // 16} (at most 32)")
        elif (D // (self.NWARPS // (self.BR // 16))) % 16 or D % (self.NWARPS // (self.BR // 16)):
            problems.append(f"the {self.BR} x {D} dQ tile does not split into 16-column slices for "
                            f"{self.NWARPS} warps")
        if self.NWARPS * 32 < self.BR:
            problems.append(f"NWARPS={self.NWARPS} gives fewer threads than BR={self.BR} query rows")
        if self.MIN_BLOCKS < 1:
            problems.append(f"MIN_BLOCKS={self.MIN_BLOCKS} must be >= 1")
        raise_tile_problems(self, D, HEAD_DIMS, problems)


# Default builds: 8 warps, so BC = 128 keys per block: half as many K/V blocks as with 4 warps, so half the Q/dO
# reloads and half the dQ reductions per FLOP; BR = 128 queries per tile where it fits (d <= 64). The measurements
# behind them: kernels/flash/README.md.
TILES = {
    32: BwdTile(128, 8, 1),
    64: BwdTile(128, 8, 1),
    96: BwdTile(64, 8, 1),
    128: BwdTile(64, 8, 1),
}


def _bf(dtype: str) -> str:
    return "true" if dtype == "bfloat16" else "false"


def name_expressions(D: int, tile: BwdTile, dtype: str) -> tuple[str, str, str]:
    """(preprocess, main, convert) of one build: compiled together, in one NVRTC program."""
    return (f"{PRE_NAME}<{_bf(dtype)}>",
            f"{MAIN_NAME}<{D}, {tile.BR}, {tile.NWARPS}, {tile.MIN_BLOCKS}, {_bf(dtype)}>",
            f"{CONVERT_NAME}<{_bf(dtype)}>")


NVRTC_BUILDS = [(name_expressions(D, TILES[D], dt), DEFINES) for D in HEAD_DIMS for dt in DTYPES]

# The variant kernel: one build per (D, tile, dtype, MODS), MODS a sum of flash2_mma's MOD_DOCS, MOD_SOFTCAP, MOD_ALIBI.
VARIANTS_NAME = "flash2_bwd_variants"
REDUCE_NAME = "flash2_bwd_reduce_heads"


def variant_name_expressions(D: int, tile: BwdTile, dtype: str, mods) -> tuple[str, ...]:
    """(preprocess, the main kernel of each of `mods` (an int or several), convert, reduce): one NVRTC program."""
    pre, main, convert = name_expressions(D, tile, dtype)
    mains = tuple(main.replace(MAIN_NAME, VARIANTS_NAME)[:-1] + f", {m}>" for m in
                  ((mods,) if isinstance(mods, int) else mods))
    return (pre, *mains, convert, f"{REDUCE_NAME}<{_bf(dtype)}>")


# every variant build of the default tiles: the eight MODS of one D and dtype in one NVRTC program
NVRTC_BUILDS += [(variant_name_expressions(D, TILES[D], dt, range(8)), DEFINES) for D in HEAD_DIMS for dt in DTYPES]


class Build(NamedTuple):
    pre: object
    main: object
    convert: object
    tile: BwdTile
    smem: int


@functools.lru_cache(maxsize=None)
def build(D: int, tile: tuple | None, dtype: str) -> Build:
    """The three kernels of (D, tile, dtype), compiled on first launch."""
    tile = TILES[D] if tile is None else BwdTile(*tile)
    tile.check(D)
    exprs = name_expressions(D, tile, dtype)
    smem = tile.smem_bytes(D)
    pre, main, convert = (get_kernel(KERNEL_FILE, e, name_expressions=exprs, defines=DEFINES,
                                     shared_mem=smem if e == exprs[1] else 0,
                                     carveout=CARVEOUT_MAX_SHARED if e == exprs[1] else None) for e in exprs)
    return Build(pre, main, convert, tile, smem)


@functools.lru_cache(maxsize=None)
def variant_build(D: int, tile: tuple | None, dtype: str, mods: int) -> tuple:
    """(Build of the variant kernel for MODS, the reduce kernel), compiled on first launch."""
    tile = TILES[D] if tile is None else BwdTile(*tile)
    tile.check(D)
    exprs = variant_name_expressions(D, tile, dtype, mods)
    smem = tile.smem_bytes(D)
    pre, main, convert, reduce = (get_kernel(KERNEL_FILE, e, name_expressions=exprs, defines=DEFINES,
                                             shared_mem=smem if e == exprs[1] else 0,
                                             carveout=CARVEOUT_MAX_SHARED if e == exprs[1] else None) for e in exprs)
    return Build(pre, main, convert, tile, smem), reduce


def workspace_elements(B: int, H: int, Tq: int, d: int) -> int:
    """float32 elements of the workspace: the dQ accumulator (B H Tq d), then delta and lse2 (B H Tq each)."""
    return B * H * Tq * (d + 2)


def _check_like(x, name: str, like, dtypes, dev: int) -> None:
    check_array(x, name, dtypes=dtypes, ndim=like.ndim if hasattr(like, "ndim") else len(like), dev=dev)
    shape = like.shape if hasattr(like, "shape") else tuple(like)
    if x.shape != shape:
        raise ValueError(f"{name} has shape {x.shape}; it must be {shape}")
    if x.data.ptr % ALIGN:
        raise ValueError(f"{name} starts at {x.data.ptr:#x}, not {ALIGN}-byte aligned (cp.async and 4-byte stores)")


def _outputs(q, k, v, o, lse, do, dlse, dq, dk, dv, workspace, B, H, Tq, d, dev):
    """The checks of o, lse, do, dlse and of the outputs and workspace passed in (allocated when not); returns
    (dq, dk, dv, dq_acc, delta, lse2), the last three views of the workspace."""
    same = dtype_set((q.dtype.name,))
    _check_like(o, "o", q, same, dev)
    _check_like(do, "do", q, same, dev)
    f32 = dtype_set(("float32",))
    _check_like(lse, "lse", (B, H, Tq), f32, dev)
    if dlse is not None:
        _check_like(dlse, "dlse", (B, H, Tq), f32, dev)
    dq = cp.empty_like(q) if dq is None else dq
    dk = cp.empty_like(k) if dk is None else dk
    dv = cp.empty_like(v) if dv is None else dv
    for name, x, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        _check_like(x, name, like, same, dev)
    need = workspace_elements(B, H, Tq, d)
    if workspace is None:
        workspace = cp.empty(need, dtype=cp.float32)
    else:
        check_array(workspace, "workspace", dtypes=f32, ndim=1, dev=dev)
        if workspace.size < need:
            raise ValueError(f"workspace has {workspace.size} float32 elements; B H Tq (d + 2) = {need} are needed")
        if workspace.data.ptr % ALIGN:
            raise ValueError(f"workspace starts at {workspace.data.ptr:#x}, not {ALIGN}-byte aligned (the dQ "
                             "accumulator at its start takes 16-byte reductions)")
    rows = B * H * Tq
    # the dQ accumulator first: at the workspace's 16-byte aligned start, its rows (d % 8 == 0 floats) stay
    # 16-byte aligned for the main kernel's float4 reductions
    return dq, dk, dv, workspace[:rows * d], workspace[rows * d:rows * (d + 1)], workspace[rows * (d + 1):need]


def backward(q, k, v, o, lse, do, *, causal=False, scale=None, dlse=None, dq=None, dk=None, dv=None,
             workspace=None, tile=None, window=None, prefix=None, doc_ids_q=None, doc_ids_k=None, alibi_slopes=None,
             softcap=None):
    """(dq, dk, dv) of o = attention(q, k, v) for the upstream gradient do, on tensor cores.

    q, o, do (B, H, Tq, d) and k, v (B, H, Tk, d): C-contiguous float16 or bfloat16 CuPy arrays of one dtype, d % 8
    == 0 and d <= 128; lse (B, H, Tq) float32, natural log, as kernels.flash2_mma.forward(..., return_lse=True) gives
    it (-inf for a row that sees no key). causal, scale: as in the forward (scale > 0; default 1/sqrt(d)).
    dlse: optional float32 (B, H, Tq) gradient of the lse output (it adds -dlse to delta).
    dq, dk, dv, workspace: optional preallocated outputs (q's / k's shape and dtype) and float32 workspace of
    workspace_elements(B, H, Tq, d) elements; fully overwritten. tile: a BwdTile (or tuple) instead of TILES[D].
    window, prefix, doc_ids_q, doc_ids_k, alibi_slopes, softcap, or k and v with fewer heads than q: the variant
    kernel (backward_variants), given the same options as the forward that made o and lse.
    """
    if (window is not None or prefix is not None or doc_ids_q is not None or doc_ids_k is not None
            or alibi_slopes is not None or softcap is not None or _grouped(q, k)):
        return backward_variants(q, k, v, o, lse, do, causal=causal, scale=scale, dlse=dlse, dq=dq, dk=dk, dv=dv,
                                 workspace=workspace, tile=tile, window=window, prefix=prefix, doc_ids_q=doc_ids_q,
                                 doc_ids_k=doc_ids_k, alibi_slopes=alibi_slopes, softcap=softcap)
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=MAX_D, d_multiple=D_MULTIPLE,
                                                what=WHAT, scale=scale, align=ALIGN)
    if not scale > 0:
        raise ValueError(f"scale must be > 0 for {WHAT} (as in the forward); got {scale}")
    dev = current_device()
    dq, dk, dv, dq_acc, delta, lse2 = _outputs(q, k, v, o, lse, do, dlse, dq, dk, dv, workspace, B, H, Tq, d, dev)
    rows = B * H * Tq
    dtype = DTYPE_NAMES[q.dtype]
    D = BUILD_FOR[d]
    b = build(D, None if tile is None else tuple(tile), dtype)
    n_kv = ceil_div(Tk, b.tile.keys)
    check_grid(n_kv, WHAT, MAX_GRID_X)
    check_grid(B * H, WHAT, MAX_GRID_YZ, axis="y")
    b.pre((check_grid(ceil_div(rows, PRE_WARPS), WHAT, MAX_GRID_X),), (32 * PRE_WARPS,),
          (o, do, lse, NULL if dlse is None else dlse, delta, lse2, dq_acc, np.int64(rows), np.int32(d)))
    b.main((n_kv, B * H), (b.tile.threads,),
           (q, k, v, do, lse2, delta, dq_acc, dk, dv, np.int32(Tq), np.int32(Tk), np.int32(d), np.float32(scale),
            I32[bool(causal)]), b.smem)
    pairs = rows * d // 2
    b.convert((min(ceil_div(pairs, CONVERT_BLOCK), CONVERT_MAX_BLOCKS),), (CONVERT_BLOCK,),
              (dq_acc, dq, np.int64(pairs), np.float32(scale)))
    return dq, dk, dv


def backward_variants(q, k, v, o, lse, do, *, causal=False, scale=None, dlse=None, dq=None, dk=None, dv=None,
                      workspace=None, tile=None, window=None, prefix=None, doc_ids_q=None, doc_ids_k=None,
                      alibi_slopes=None, softcap=None):
    """reference.variants.attention_variant_backward on tensor cores: q, o, do (B, Hq, Tq, d), k and v (B, Hkv, Tk, d)
    with Hq % Hkv == 0; lse (B, Hq, Tq) from flash2_mma.forward with the same options (see the module's docstring).
    Returns dq (q's shape) and dk, dv (k's shape, summed over each kv head's query heads). The other arguments as
    backward() takes them; the workspace is workspace_elements(B, Hq, Tq, d) floats. With document ids a small kernel
    classifies the tiles first; with Hq > Hkv a float32 scratch holds each query head's dK and dV until the reduce."""
    dev = current_device()
    B, H, Tq, Tk, d, scale = validate_variant_problem(q, k, v, dev, scale, WHAT, MAX_D)
    docs = doc_ids_q is not None or doc_ids_k is not None
    spec = variant_spec(q.shape, k.shape, scale, causal=causal, window=window, prefix=prefix, softcap=softcap,
                        docs=docs, alibi=alibi_slopes is not None)
    doc_ids_q, doc_ids_k = check_variant_arrays(doc_ids_q, doc_ids_k, alibi_slopes, B, H, Tq, Tk, dev)
    dq, dk, dv, dq_acc, delta, lse2 = _outputs(q, k, v, o, lse, do, dlse, dq, dk, dv, workspace, B, H, Tq, d, dev)
    rows = B * H * Tq
    b, reduce = variant_build(BUILD_FOR[d], None if tile is None else tuple(tile), DTYPE_NAMES[q.dtype], spec.mods)
    n_kv = ceil_div(Tk, b.tile.keys)
    check_grid(n_kv, WHAT, MAX_GRID_X)
    check_grid(B * H, WHAT, MAX_GRID_YZ, axis="y")
    if docs:
        check_grid(B, WHAT + " document classes", MAX_GRID_YZ, "y")
    classes = doc_classes(doc_ids_q, doc_ids_k, B, Tq, Tk, b.tile.BR, b.tile.keys) if docs else None
    part = cp.empty(2 * B * H * Tk * d, dtype=cp.float32) if spec.group > 1 else None
    b.pre((check_grid(ceil_div(rows, PRE_WARPS), WHAT, MAX_GRID_X),), (32 * PRE_WARPS,),
          (o, do, lse, NULL if dlse is None else dlse, delta, lse2, dq_acc, np.int64(rows), np.int32(d)))
    opt = (lambda x: NULL if x is None else x)
    b.main((n_kv, B * H), (b.tile.threads,),
           (q, k, v, do, lse2, delta, dq_acc, dk, dv, opt(part), opt(doc_ids_q), opt(doc_ids_k), opt(classes),
            opt(alibi_slopes), np.int32(Tq), np.int32(Tk), np.int32(d), np.float32(scale), np.int32(H),
            np.int32(spec.group), np.int32(spec.left), np.int32(spec.right), np.int32(spec.prefix),
            np.float32(spec.cap_in), np.float32(spec.cap_out)), b.smem)
    pairs = rows * d // 2
    b.convert((min(ceil_div(pairs, CONVERT_BLOCK), CONVERT_MAX_BLOCKS),), (CONVERT_BLOCK,),
              (dq_acc, dq, np.int64(pairs), np.float32(scale)))
    if part is not None:  # dK = scale sum of the parts, dV = the sum
        kv_pairs = dk.size // 2
        for out, half, factor in ((dk, part[:part.size // 2], scale), (dv, part[part.size // 2:], 1.0)):
            reduce((min(ceil_div(kv_pairs, CONVERT_BLOCK), CONVERT_MAX_BLOCKS),), (CONVERT_BLOCK,),
                   (half, out, np.int64(kv_pairs), np.int64(Tk * d // 2), np.int32(spec.group), np.float32(factor)))
    return dq, dk, dv


def backward_flops(B: int, H: int, Tq: int, Tk: int, d: int, causal: bool = False) -> float:
    """2.5 x the forward's FLOPs (five matrix products of 2 Tq Tk d each against the forward's two), the
    convention FlashAttention's benchmarks use; halved for causal."""
    from ..core.timing import BACKWARD_FLOP_FACTOR, attention_flops

    return BACKWARD_FLOP_FACTOR * attention_flops(B, H, Tq, Tk, d, causal)
