"""Launcher for kernels/flash/flash2_mma.cu: FlashAttention-2 forward on tensor cores through mma.sync (fp16/bf16).

    o = forward(q, k, v, causal=True)                          # (B, H, T, d) float16 or bfloat16 CuPy arrays
    o, lse = forward(q, k, v, causal=True, return_lse=True)    # lse: (B, H, Tq) float32, natural log

Any d with d % 8 == 0 and d <= 256 runs on the build for the smallest D in {32, 64, 96, 128, 256} with D >= d
(cp.async zero-fills columns d..D-1). Any Tq, Tk >= 1.

Packed variable-length batches (FlashAttention's varlen interface; notebook 09):

    o = forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=True)

q (total_q, H, d), k and v (total_k, H, d): the real tokens of B sequences one after the other, sequence b in rows
cu_seqlens[b] .. cu_seqlens[b+1]-1 (int32, B+1 entries); o (total_q, H, d), lse (H, total_q). q, k, v may be views
with a token stride other than H*d (for example the q, k, v thirds of one fused QKV projection, (total, 3, H, d)).

The variants of reference/variants.py (attention_variant), through the kernel flash2_mma_variants:

    o = forward(q, k, v, causal=True, window=(1024, 0))        # k, v may have Hkv heads, Hq % Hkv == 0 (GQA, MQA)
    o = forward(q, k, v, prefix=64, causal=True, softcap=30.0, alibi_slopes=slopes, doc_ids_q=ids, doc_ids_k=ids)

window (left, right): ints >= 0 or None (unbounded), combined with causal; prefix: keys < prefix seen by every query;
doc_ids_q (B, Tq) and doc_ids_k (B, Tk): int32 CuPy arrays (doc_ids_k defaults to doc_ids_q when Tq == Tk);
alibi_slopes (Hq,) float32 CuPy array; softcap > 0. Key tiles no row of a query tile sees are skipped, tiles every row
sees in full run without mask code (see the kernel's key_tiles; document ids through flash2_mma_doc_classes).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ..core import (DTYPE_NAMES, I32, INT32_MAX, MAX_GRID_X, MAX_GRID_YZ, NULL, Launch, attention_launch, blocks_per_sm,
                    ceil_div, check_alignment, check_array, check_grid, cp, current_device, defines_from, device_info,
                    dtype_set, get_kernel, launch_cache, qkv_key, validate_attention)
from ..core.registry import Variant, register

KERNEL_FILE = "flash2_mma.cu"
KERNEL_NAME = "flash2_mma_forward"
VARLEN_KERNEL_NAME = "flash2_mma_varlen"
WHAT = "flash2_mma attention"
MAX_D = 256
D_MULTIPLE = 8  # cp.async moves 16-byte chunks: 8 elements
HEAD_DIMS = (32, 64, 96, 128, 256)
BUILD_FOR = {d: next(D for D in HEAD_DIMS if D >= d) for d in range(1, MAX_D + 1)}
MMA_M = 16  # rows of one mma.m16n8k16 tile (= MMA_M in flash2_mma.cu)
SMEM_PAD = 8  # elements of padding per shared-memory row; handed to the kernel as -DSMEM_PAD
# A build takes the kernel's ILP loop when its register cap (65536 / (threads * MIN_BLOCKS) per thread) is at least
# this; handed to the kernel as -DILP_MIN_REGS (see the kernel's header, "Three loops").
ILP_MIN_REGS = 200
# An ILP build with D at most this runs the fused ILP loop (the exponentials made inside O += P V); handed to the kernel
# as -DFUSED_MAX_D. At D = 128 the fused loop spills, so those builds keep the unfused one.
FUSED_MAX_D = 64
DEFINES = defines_from(SMEM_PAD=SMEM_PAD, ILP_MIN_REGS=ILP_MIN_REGS, FUSED_MAX_D=FUSED_MAX_D)
ALIGN = 16  # bytes: cp.async and the 4-byte output stores need 16-byte aligned bases
LOG2E = 1.0 / math.log(2.0)
DTYPES = ("float16", "bfloat16")
DTYPE_SET = dtype_set(DTYPES)
CARVEOUT_MAX_SHARED = 100  # percent of the SM's L1/shared storage given to shared memory (a hint to the driver)


class MmaTile(NamedTuple):
    """The tiling of one flash2_mma build: BC keys per K/V tile, NWARPS warps of MT 16-row m-tiles each, and
    MIN_BLOCKS, the blocks per SM that __launch_bounds__ asks the compiler to leave registers for.

    ILP picks the kernel's K/V loop: None lets the kernel choose by the register cap (the ILP loop where a thread may
    have ILP_MIN_REGS registers or more), True / False force the ILP / the row-by-row loop (the kernel's header,
    "Three loops"; notebook 06 times both). An ILP build of D <= FUSED_MAX_D runs the fused ILP loop (loop_for)."""
    BC: int
    NWARPS: int
    MT: int
    MIN_BLOCKS: int = 1
    ILP: bool | None = None

    @property
    def loop(self) -> str:
        """"ILP" or "row by row": the K/V loop this tile's build runs (the kernel's IlpBuild, worked out here)."""
        ilp = 65536 // (self.threads * self.MIN_BLOCKS) >= ILP_MIN_REGS if self.ILP is None else self.ILP
        return "ILP" if ilp else "row by row"

    def loop_for(self, D: int) -> str:
        """The loop the build of this tile for head dim D runs: "row by row", "ILP" or "fused ILP" (FusedBuild)."""
        return "fused ILP" if self.loop == "ILP" and D <= FUSED_MAX_D else self.loop

    @property
    def defines(self) -> tuple[str, ...]:
        """The compile options of this tile's build: the launcher's DEFINES, plus ILP_MODE when ILP is forced."""
        return DEFINES if self.ILP is None else DEFINES + defines_from(ILP_MODE=self.ILP)

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
        if self.BC < 16 or self.BC % 16:
            problems.append(f"BC={self.BC} must be a positive multiple of 16")
        if self.MT < 1 or self.NWARPS < 1 or self.NWARPS > 32:
            problems.append(f"NWARPS={self.NWARPS} and MT={self.MT} must be >= 1, with at most 32 warps")
        if self.MIN_BLOCKS < 1:
            problems.append(f"MIN_BLOCKS={self.MIN_BLOCKS} must be >= 1")
        if self.ILP not in (None, True, False):
            problems.append(f"ILP={self.ILP!r} must be None, True or False")
        raise_tile_problems(self, D, HEAD_DIMS, problems)


def raise_tile_problems(tile: tuple, D: int, head_dims: tuple, problems: list[str]) -> None:
    """The end of a tile's check (MmaTile here, BwdTile in flash2_mma_bwd.py): one ValueError naming the tile, D and
    every problem found, a D outside head_dims first; nothing if there is none."""
    if D not in head_dims:
        problems.insert(0, f"D={D} is not one of {head_dims}")
    if problems:
        raise ValueError(f"tile ({', '.join(tile._fields)}) = {tuple(tile)} for D={D}: " + "; ".join(problems))


# The default tile per D: four warps of two m-tiles (BR = 128 query rows) and 64 keys per K/V tile; at D=64 registers
# for two blocks per SM, enough for the kernel's ILP loop. The tiles timed against these: kernels/flash/README.md.
# D=256 (Gemma): one m-tile per warp, since O alone takes MT * 128 float registers per thread there, and 32 keys per
# tile, so that 2 (64 + 4 * 32) (256 + 8) = 101376 bytes (99 KB) fit the smallest opt-in limit of the GPUs this kernel
# runs on (sm_86 and sm_89; an A100 allows 163 KB, an H100 227 KB). An H100 holds two such blocks per SM, an A100 one.
# Its speed against SDPA and FlexAttention on an H100: kernels/flash/README.md.
TILES = {
    32: MmaTile(64, 4, 2, 1),
    64: MmaTile(64, 4, 2, 2),
    96: MmaTile(64, 4, 2, 1),
    128: MmaTile(64, 4, 2, 1),
    256: MmaTile(32, 4, 1, 1),
}


# The varlen kernel (notebook 09) uses the same builds.
VARLEN_TILES = dict(TILES)


def name_expression(D: int, tile: MmaTile, dtype: str, kernel: str = KERNEL_NAME) -> str:
    return f"{kernel}<{D}, {tile.BC}, {tile.NWARPS}, {tile.MT}, {tile.MIN_BLOCKS}, " \
           f"{'true' if dtype == 'bfloat16' else 'false'}>"


# What tests/test_compile.py compiles with NVRTC on a CPU-only machine: every build the launcher uses, and the
# row-by-row loop (which no default build takes) on the tile that was D=64's default before the ILP loop (notebook 06,
# section 7 times it).
ROW_LOOP_TILE = MmaTile(64, 4, 2, 3)
NVRTC_BUILDS = [((name_expression(D, TILES[D], dt),), DEFINES) for D in HEAD_DIMS for dt in DTYPES] + \
               [((name_expression(D, VARLEN_TILES[D], dt, VARLEN_KERNEL_NAME),), DEFINES)
                for D in HEAD_DIMS for dt in DTYPES] + \
               [((name_expression(64, ROW_LOOP_TILE, dt),), ROW_LOOP_TILE.defines) for dt in DTYPES]


# The variant kernel: one build per (D, tile, dtype, MODS), MODS a sum of the switches below (the kernel's MOD_ flags).
VARIANTS_KERNEL_NAME = "flash2_mma_variants"
CLASS_KERNEL_NAME = "flash2_mma_doc_classes"
MOD_DOCS, MOD_SOFTCAP, MOD_ALIBI = 1, 2, 4
CLASS_SLACK = 3  # bytes allocated past the classes: a row read by aligned 4-byte words stays inside the array
CLASS_THREADS = 128  # threads of a flash2_mma_doc_classes block; handed to the kernel as -DCLASS_THREADS
CLASS_DEFINES = DEFINES + defines_from(CLASS_THREADS=CLASS_THREADS)


def variant_name_expression(D: int, tile: MmaTile, dtype: str, mods: int) -> str:
    return name_expression(D, tile, dtype, VARIANTS_KERNEL_NAME)[:-1] + f", {mods}>"


# every variant build of the default tiles (the eight MODS of one D and dtype in one NVRTC program), and the classes
NVRTC_BUILDS += [(tuple(variant_name_expression(D, TILES[D], dt, mods) for mods in range(8)), DEFINES)
                 for D in HEAD_DIMS for dt in DTYPES] + [((), CLASS_DEFINES)]


class Build(NamedTuple):
    """One compiled configuration, with the numbers its launch needs worked out once."""
    kernel: object  # kernels.core.Kernel
    tile: MmaTile
    smem: int  # dynamic shared memory per block, bytes
    rows: int  # BR
    threads: int


def check_shared_memory_fits(tile: MmaTile, D: int, d: int, smem_limit: int) -> None:
    """ValueError naming the head dimension d, its build D, the tile and smem_limit (the GPU's opt-in limit per block,
    DeviceInfo.smem_optin) where the tile needs more shared memory than that; the launchers call it before the first
    launch of a problem, so the error says which head size asked for the tile."""
    smem = tile.smem_bytes(D)
    if smem > smem_limit:
        raise ValueError(f"{WHAT}: head dimension d={d} runs on the D={D} build, whose tile ({', '.join(tile._fields)})"
                         f" = {tuple(tile)} needs {smem} bytes of shared memory per block; this GPU allows at most "
                         f"{smem_limit} (pass a smaller tile)")


@functools.lru_cache(maxsize=None)
def build(D: int, tile: tuple | None, dtype: str, kernel_name: str = KERNEL_NAME) -> Build:
    """The Build of (D, tile, dtype) of the dense kernel or (kernel_name=VARLEN_KERNEL_NAME) of the varlen kernel:
    the tile checked once, the kernel compiled on its first launch."""
    tiles = VARLEN_TILES if kernel_name == VARLEN_KERNEL_NAME else TILES
    tile = tiles[D] if tile is None else MmaTile(*tile)
    tile.check(D)
    expr = name_expression(D, tile, dtype, kernel_name)
    smem = tile.smem_bytes(D)
    kernel = get_kernel(KERNEL_FILE, expr, name_expressions=(expr,), defines=tile.defines, shared_mem=smem,
                        carveout=CARVEOUT_MAX_SHARED)
    return Build(kernel, tile, smem, tile.rows, tile.threads)


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, tile=None, head_major=None, window=None,
            prefix=None, doc_ids_q=None, doc_ids_k=None, alibi_slopes=None, softcap=None):
    """softmax(scale q k^T) v on tensor cores (mma.sync.m16n8k16), FlashAttention-2 loop; optionally the LSE.

    window, prefix, doc_ids_q, doc_ids_k, alibi_slopes, softcap, or k and v with fewer heads than q: the variant kernel
    (forward_variants; reference.attention_variant is its oracle). Without them, the dense kernel as before.

    tile: optional MmaTile (or a (BC, NWARPS, MT[, MIN_BLOCKS[, ILP]]) tuple) instead of TILES[D] (notebook 06's
    sweep).
    head_major: the order of the grid (see grid_order); None lets grid_order choose, True / False force head-major /
    heads fastest (notebook 06 times both).
    The first call of a problem runs _prepare; later calls with the same shapes, dtype and options reuse its launch
    (kernels.core.attention_launch).
    """
    if (window is None and prefix is None and doc_ids_q is None and doc_ids_k is None and alibi_slopes is None
            and softcap is None and not _grouped(q, k)):
        return attention_launch(_CALLS, _prepare, q, k, v, ALIGN, (causal, scale, tile, head_major), return_lse)
    return forward_variants(q, k, v, causal=causal, scale=scale, return_lse=return_lse, tile=tile,
                            head_major=head_major, window=window, prefix=prefix, doc_ids_q=doc_ids_q,
                            doc_ids_k=doc_ids_k, alibi_slopes=alibi_slopes, softcap=softcap)


_CALLS = launch_cache()  # (qkv_key, options) -> what _prepare returned


def _prepare(q, k, v, dev, causal, scale, tile, head_major):
    """Validate q, k, v and return (Launch, o shape, o dtype, lse shape): one problem's launch, made once."""
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=MAX_D, d_multiple=D_MULTIPLE,
                                                what=WHAT, scale=scale, align=ALIGN)
    if not scale > 0:
        raise ValueError(f"scale must be > 0 for flash2_mma (the kernel folds it into exp2 after the row max); "
                         f"got {scale}")
    kernel, grid, block, smem, tail = _launch_config(
        Tq, Tk, d, q.dtype, scale, bool(causal), None if tile is None else tuple(tile),
        None if head_major is None else bool(head_major), B * H)
    return Launch(kernel, grid, block, smem, 5, tail, dev), (B, H, Tq, d), q.dtype, (B, H, Tq)


_LAUNCHES: dict = {}  # (Tq, Tk, d, dtype, scale, causal, tile, head_major, B*H) -> what a launch of that problem needs

# Under a causal mask, order the grid heads fastest while K and V of all heads take at most HEADS_FASTEST_MAX_KV_L2
# times the L2 and the grid is at most HEADS_FASTEST_MAX_WAVES waves (see grid_order; the measurements that set both:
# kernels/flash/README.md).
HEADS_FASTEST_MAX_KV_L2 = 3
HEADS_FASTEST_MAX_WAVES = 12


def grid_order(causal: bool, BH: int, Tk: int, d: int, itemsize: int, l2_bytes: int, waves: float) -> bool:
    """True for head-major (block x takes head x // n_qtiles), False for heads fastest (head x % BH).

    Head-major keeps the blocks that run side by side on a few heads, so each head's K and V are read from DRAM
    about once and then from L2: the right order without a mask, and for long sequences. Under a causal mask a
    query tile's work grows with its index, and the kernel starts each head's last (longest) tile first; head-major
    still leaves the short tiles of one head running beside the long tiles of the next, and the last wave uneven.
    Heads fastest starts the longest tile of every head first, then the next longest, and so on: the wave tail
    is short, but the blocks that run together read the K and V of all heads. What it saves is part of one wave,
    worth less the more waves the grid has (waves: blocks / the blocks the GPU holds at once); what it costs is L2
    hits. So it is chosen only under a causal mask, while K and V of all heads (2 BH Tk d itemsize bytes) stay within
    HEADS_FASTEST_MAX_KV_L2 times the L2 size, and while the grid is at most HEADS_FASTEST_MAX_WAVES waves."""
    kv_bytes = 2 * BH * Tk * d * itemsize
    return not (causal and kv_bytes <= HEADS_FASTEST_MAX_KV_L2 * l2_bytes and waves <= HEADS_FASTEST_MAX_WAVES)


def grid_waves(b: Build, blocks: int) -> float:
    """How many rounds of blocks a grid of `blocks` blocks of this build takes on the current GPU: blocks / (SMs times
    the blocks of the build an SM holds at once)."""
    return blocks / (device_info().sm_count * (blocks_per_sm(b.kernel, b.threads, b.smem) or 1))


def _launch_config(Tq, Tk, d, dtype, scale, causal, tile, head_major, BH):
    """Grid, block, shared memory and the constant arguments of one problem, worked out once (the launch then
    costs a dictionary look-up instead of a dozen small computations)."""
    b = build(BUILD_FOR[d], tile, DTYPE_NAMES[dtype])
    check_shared_memory_fits(b.tile, BUILD_FOR[d], d, device_info().smem_optin)
    kernel, _, smem, rows, threads = b
    blocks = check_grid(BH * ceil_div(Tq, rows), WHAT, MAX_GRID_X)
    order = grid_order(causal, BH, Tk, d, np.dtype(dtype).itemsize, device_info().l2_bytes, grid_waves(b, blocks)) \
        if head_major is None else head_major
    tail = (np.int32(Tq), np.int32(Tk), np.int32(d), np.float32(scale * LOG2E), I32[causal], I32[order])
    if len(_LAUNCHES) > 4096:
        _LAUNCHES.clear()
    config = _LAUNCHES[(Tq, Tk, d, dtype, scale, causal, tile, head_major, BH)] = (kernel, (blocks,), (threads,), smem,
                                                                                   tail)
    return config


def launch_config(Tq: int, Tk: int, d: int, dtype, scale: float, causal: bool, BH: int):
    """(kernel, grid, block, shared memory, constant arguments) of the dense launch that forward() makes for this
    problem with the default tile, for callers that bring their own buffers: kernels/pytorch/torch_ops.py launches it on
    torch tensors' pointers, (q, k, v, o, lse) + constants, after checking them as forward's validation does."""
    if not (scale > 0 and math.isfinite(scale)):  # forward() checks this itself; here it is the only check
        raise ValueError(f"scale must be a finite number > 0 for flash2_mma (the kernel folds it into exp2 after the "
                         f"row max); got {scale}")
    key = (Tq, Tk, d, dtype, scale, bool(causal), None, None, BH)
    return _LAUNCHES.get(key) or _launch_config(*key)


def _check_packed(x, name: str, dev: int, dtypes, H: int | None = None, d: int | None = None):
    """x must be a CuPy (total, H, d) array of `dtypes` on device `dev` whose (H, d) part is contiguous; its token
    stride may be larger than H*d (a view into a fused QKV tensor) but must be a multiple of 16 bytes, and its base
    16-byte aligned (cp.async). Returns (total, H, d, token stride in elements)."""
    if not isinstance(x, cp.ndarray) or x.dtype not in dtypes or x.ndim != 3 or x.data.device_id != dev:
        if isinstance(x, cp.ndarray) and x.ndim == 3 and x.dtype in dtypes:
            raise ValueError(f"{name} is on device {x.data.device_id}, but the current device is {dev}")
        check_array(x, name, dtypes=dtypes, ndim=3, dev=dev)  # raises the precise TypeError / ValueError
    total, h, dd = x.shape
    item = x.itemsize
    if (H is not None and h != H) or (d is not None and dd != d):
        raise ValueError(f"{name} {x.shape} must agree with q on H={H} and d={d}")
    if x.size and ((dd > 1 and x.strides[2] != item) or (h > 1 and x.strides[1] != dd * item) or
                   (total > 1 and x.strides[0] < h * dd * item)):  # (an empty array's strides are all 0)
        raise ValueError(f"{name} must be (total, H, d) with contiguous heads and head dims (strides (s, {dd * item}, "
                         f"{item}) bytes with s >= {h * dd * item}); got strides {x.strides}")
    ld = x.strides[0] // item if total > 1 and x.size else h * dd
    if (ld * item) % ALIGN or x.data.ptr % ALIGN:
        raise ValueError(f"{name}: token stride {ld * item} bytes and base address {x.data.ptr:#x} must be multiples "
                         f"of {ALIGN} bytes (cp.async moves 16-byte chunks)")
    return total, h, dd, ld


def _check_cu(cu, name: str, dev: int) -> None:
    check_array(cu, name, dtypes=("int32",), ndim=1, dev=dev)
    if cu.size < 2:
        raise ValueError(f"{name} must have B+1 >= 2 entries; got shape {cu.shape}")


def check_varlen_lengths(cu_seqlens_q, cu_seqlens_k, total_q: int, total_k: int, max_seqlen_q: int,
                         max_seqlen_k: int) -> None:
    """forward_varlen's opt-in check (check_inputs=True): reads both cu_seqlens back (one synchronisation) and
    raises ValueError unless each starts at 0, never decreases, ends at its total, and its longest sequence fits
    its max_seqlen."""
    from reference.varlen import check_cu_seqlens

    B1 = cu_seqlens_q.size
    both = cp.asnumpy(cp.concatenate((cu_seqlens_q, cu_seqlens_k))).reshape(2, B1)
    for name, cu, total, m, m_name in (("cu_seqlens_q", both[0], total_q, max_seqlen_q, "max_seqlen_q"),
                                       ("cu_seqlens_k", both[1], total_k, max_seqlen_k, "max_seqlen_k")):
        check_cu_seqlens(cu, total, name)
        longest = int(np.diff(cu).max())
        if longest > m:
            raise ValueError(f"{name} holds a sequence of {longest} tokens; {m_name}={m} is smaller")


def forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None,
                   return_lse=False, check_inputs=False):
    """Attention of each packed sequence on its own tokens (FlashAttention's varlen interface), on tensor cores.

    q (total_q, H, d), k and v (total_k, H, d): float16 or bfloat16 CuPy arrays; heads and head dims contiguous, the
    token stride free (a multiple of 16 bytes), so q, k, v may be the thirds of a fused QKV projection viewed as
    (total, 3, H, d). k and v must share their strides. cu_seqlens_q, cu_seqlens_k: int32 (B+1,) CuPy arrays;
    sequence b owns query rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 and key rows likewise; a sequence may be
    empty. max_seqlen_q, max_seqlen_k: Python ints, at least the longest sequence (the grid has
    ceil(max_seqlen_q / BR) query tiles per sequence and head; blocks past a sequence's end exit at once).
    causal: bottom-right per sequence (query i of a sequence sees key j when j <= i + Tk - Tq); a row that sees no
    key gives 0 and lse = -inf. Returns o (total_q, H, d), contiguous, and with return_lse lse (H, total_q) float32.

    cu_seqlens live on the GPU, so they are not read here: the kernel clamps each entry to [0, total] and to not
    below the one before, so a malformed array gives wrong rows but no out-of-bounds access. Query rows no sequence
    covers are not written, nor, in a sequence longer than max_seqlen_q, its leading rows: the grid's query tiles
    are counted from each sequence's end, so only its last ceil(max_seqlen_q / BR) tiles are computed.
    check_inputs=True runs check_varlen_lengths (one synchronisation) first, which rejects both.
    """
    dev = current_device()
    total_q, H, d, ld_q = _check_packed(q, "q", dev, DTYPE_SET)
    same = dtype_set((q.dtype.name,))
    total_k, _, _, ld_k = _check_packed(k, "k", dev, same, H, d)
    _, _, _, ld_v = _check_packed(v, "v", dev, same, H, d)
    if k.shape != v.shape or ld_k != ld_v:
        raise ValueError(f"k and v must have the same shape and token stride; got k {k.shape} (stride {ld_k}) and "
                         f"v {v.shape} (stride {ld_v})")
    if H < 1 or d < 1:
        raise ValueError(f"H and d must be >= 1; got q {q.shape}")
    if d > MAX_D or d % D_MULTIPLE:
        raise ValueError(f"head dimension d={d} must be a multiple of {D_MULTIPLE} and <= {MAX_D} for {WHAT}")
    _check_cu(cu_seqlens_q, "cu_seqlens_q", dev)
    _check_cu(cu_seqlens_k, "cu_seqlens_k", dev)
    if cu_seqlens_q.size != cu_seqlens_k.size:
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.size} entries and cu_seqlens_k {cu_seqlens_k.size}; "
                         f"both must be B+1")
    B = cu_seqlens_q.size - 1
    for name, m, total in (("max_seqlen_q", max_seqlen_q, total_q), ("max_seqlen_k", max_seqlen_k, total_k)):
        if not isinstance(m, (int, np.integer)) or isinstance(m, bool):
            raise TypeError(f"{name} must be an int; got {type(m).__name__}")
        low = 1 if (total > 0 and name == "max_seqlen_q") else 0
        if not low <= m <= total:
            raise ValueError(f"{name}={m} must lie in [{low}, {total}] (the packed tokens of {name[-1]})")
    if max(total_q * ld_q, total_k * ld_k) > INT32_MAX * 8 or max(total_q, total_k) > INT32_MAX:
        raise ValueError(f"q has {total_q} and k {total_k} tokens; {WHAT} varlen keeps token indices in 32 bits")
    if B > MAX_GRID_YZ or H > MAX_GRID_YZ:
        raise ValueError(f"{WHAT} varlen launches a grid of (tiles, H={H}, B={B}); H and B must be <= {MAX_GRID_YZ}")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0 for flash2_mma (folded into exp2 after the row max); "
                         f"got {scale}")
    if check_inputs:
        check_varlen_lengths(cu_seqlens_q, cu_seqlens_k, total_q, total_k, int(max_seqlen_q), int(max_seqlen_k))
    kernel, tile, smem, rows, threads = build(BUILD_FOR[d], None, DTYPE_NAMES[q.dtype], VARLEN_KERNEL_NAME)
    check_shared_memory_fits(tile, BUILD_FOR[d], d, device_info(dev).smem_optin)
    o = cp.empty((total_q, H, d), dtype=q.dtype)
    lse = cp.empty((H, total_q), dtype=cp.float32) if return_lse else None
    tiles = ceil_div(int(max_seqlen_q), rows)
    if tiles > 0:
        kernel((tiles, H, B), (threads,),
               (q, k, v, o, NULL if lse is None else lse, cu_seqlens_q, cu_seqlens_k, np.int32(total_q),
                np.int32(total_k), np.int32(H), np.int32(d), np.int32(ld_q), np.int32(ld_k),
                np.float32(scale * LOG2E), I32[bool(causal)]),
               smem)
    return (o, lse) if return_lse else o


# ---------------------------------------------------------------------------------------------------------------------
# The variants: grouped-query heads, window / causal / prefix, document ids, softcap, ALiBi (flash2_mma_variants)
# ---------------------------------------------------------------------------------------------------------------------

def _grouped(q, k) -> bool:
    """True when q and k are 4-D with different head counts (grouped-query attention)."""
    qs, ks = getattr(q, "shape", None), getattr(k, "shape", None)
    return qs is not None and ks is not None and len(qs) == 4 and len(ks) == 4 and qs[1] != ks[1]


class VariantSpec(NamedTuple):
    """What the variant kernel takes besides the arrays: the group size Hq // Hkv, the band (left, right) with causal
    folded in and an unbounded side as Tq + Tk, the prefix, the MODS of the build and the softcap's two factors."""
    group: int
    left: int
    right: int
    prefix: int
    mods: int
    cap_in: float
    cap_out: float


def _side(name: str, value, T: int) -> int:
    """One side of a window: an int >= 0 (TypeError / ValueError otherwise), or T for None (unbounded)."""
    if value is None:
        return T
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"window {name} must be an int >= 0 or None (unbounded); got {value!r}")
    if value < 0:
        raise ValueError(f"window {name} must be >= 0 (None for unbounded); got {value}")
    return min(int(value), T)


def variant_spec(q_shape: tuple, k_shape: tuple, scale: float, *, causal=False, window=None, prefix=None, softcap=None,
                 docs: bool = False, alibi: bool = False) -> VariantSpec:
    """Check the variant options against q (B, Hq, Tq, d) and k (B, Hkv, Tk, d) shapes and return their VariantSpec.
    Needs no GPU: the checks of the arrays themselves (document ids, slopes) are check_variant_arrays'."""
    _, Hq, Tq, _ = q_shape
    Hkv, Tk = k_shape[1], k_shape[2]
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"q has Hq={Hq} heads and k, v Hkv={Hkv}: Hq must be a multiple of Hkv (Hq % Hkv == 0)")
    unbounded = Tq + Tk  # no query position is that far from a key
    if window is None:
        left, right = unbounded, unbounded
    else:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise ValueError(f"window must be a pair (left, right) of ints >= 0 or None; got {window!r}")
        left, right = _side("left", window[0], unbounded), _side("right", window[1], unbounded)
    if causal:
        right = 0  # min(right, 0): causal keeps the keys up to the diagonal
    if prefix is None:
        prefix = 0
    elif isinstance(prefix, bool) or not isinstance(prefix, (int, np.integer)):
        raise TypeError(f"prefix must be an int in [0, Tk={Tk}] or None; got {prefix!r}")
    elif not 0 <= prefix <= Tk:
        raise ValueError(f"prefix must be in [0, Tk={Tk}]; got {prefix}")
    mods = (MOD_DOCS if docs else 0) | (MOD_ALIBI if alibi else 0)
    cap_in = cap_out = 0.0
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float, np.integer, np.floating)):
            raise TypeError(f"softcap must be a number > 0 or None; got {softcap!r}")
        softcap = float(softcap)
        if not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"softcap must be a finite number > 0 (None for no soft-capping); got {softcap}")
        mods |= MOD_SOFTCAP
        cap_in, cap_out = scale / softcap, softcap * LOG2E
    return VariantSpec(Hq // Hkv, left, right, int(prefix), mods, cap_in, cap_out)


def _check_side_array(x, name: str, dtype: str, shape: tuple, what: str, dev) -> None:
    """x must be a C-contiguous array of `dtype` and `shape` (on device dev: a CuPy array there, when dev is given)."""
    if dev is not None:
        check_array(x, name, dtypes=(dtype,), ndim=len(shape), dev=dev)
    elif not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{name} must be an array; got {type(x).__name__}")
    if np.dtype(x.dtype) != np.dtype(dtype):
        raise TypeError(f"{name} has dtype {np.dtype(x.dtype).name}; it must be {dtype}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {what} = {shape}; got {tuple(x.shape)}")


def check_variant_arrays(doc_ids_q, doc_ids_k, alibi_slopes, B: int, Hq: int, Tq: int, Tk: int, dev=None):
    """The document ids ((B, Tq) and (B, Tk) int32; doc_ids_k defaults to doc_ids_q when Tq == Tk) and the ALiBi slopes
    ((Hq,) float32), checked; returns (doc_ids_q, doc_ids_k). dev=None checks dtypes and shapes only (no GPU needed).
    The ids and slopes are GPU values and are not read here: any int32 ids and any float32 slopes are accepted."""
    if doc_ids_q is None and doc_ids_k is not None:
        raise ValueError("doc_ids_k was given without doc_ids_q; document masking needs both (or doc_ids_q alone "
                         "when Tq == Tk)")
    if doc_ids_q is not None:
        if doc_ids_k is None:
            if Tq != Tk:
                raise ValueError(f"doc_ids_k is needed when Tq != Tk (Tq={Tq}, Tk={Tk}); only doc_ids_q was given")
            doc_ids_k = doc_ids_q
        _check_side_array(doc_ids_q, "doc_ids_q", "int32", (B, Tq), "(B, Tq)", dev)
        _check_side_array(doc_ids_k, "doc_ids_k", "int32", (B, Tk), "(B, Tk)", dev)
    if alibi_slopes is not None:
        _check_side_array(alibi_slopes, "alibi_slopes", "float32", (Hq,), "(Hq,), one slope per query head", dev)
    return doc_ids_q, doc_ids_k


def _validate_grouped(q, k, v, dev, what=WHAT, max_d=MAX_D):
    """validate_attention for k, v of Hkv heads: q's checks through validate_attention itself, k's and v's here;
    returns (B, Hq, Hkv, Tq, Tk, d). what and max_d: the calling launcher's name and head-size limit."""
    B, Hq, Tq, _, d, _ = validate_attention(q, q, q, dtypes=DTYPE_SET, max_d=max_d, d_multiple=D_MULTIPLE, what=what,
                                            align=ALIGN)
    same = dtype_set((q.dtype.name,))
    check_array(k, "k", dtypes=same, ndim=4, dev=dev)
    check_array(v, "v", dtypes=same, ndim=4, dev=dev)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {k.shape} and v {v.shape}")
    kB, Hkv, Tk, kd = k.shape
    if kB != B or kd != d:
        raise ValueError(f"q {q.shape} and k {k.shape} must agree on B and d")
    if min(Hkv, Tk) < 1:
        raise ValueError(f"every dimension must be >= 1; got k {k.shape}")
    if k.size > INT32_MAX:
        raise ValueError(f"k has {k.size} elements; {what} indexes with 32-bit integers (<= {INT32_MAX})")
    if k.data.ptr % ALIGN or v.data.ptr % ALIGN:
        check_alignment(what, ALIGN, k=k, v=v)
    return B, Hq, Hkv, Tq, Tk, d


def validate_variant_problem(q, k, v, dev, scale, what=WHAT, max_d=MAX_D):
    """q, k, v of a variant call (k and v with Hq or fewer heads) and its scale, checked for the launcher `what`
    with head-size limit max_d: (B, Hq, Tq, Tk, d, scale), scale defaulting to 1/sqrt(d). The forward's and the
    backward's variant launchers both call it."""
    if _grouped(q, k):
        B, Hq, _, Tq, Tk, d = _validate_grouped(q, k, v, dev, what, max_d)
    else:  # the same heads (or a shape validate_attention rejects with the precise error)
        B, Hq, Tq, Tk, d, _ = validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=max_d, d_multiple=D_MULTIPLE,
                                                 what=what, align=ALIGN)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0 for {what} (folded into exp2 after the row max); "
                         f"got {scale}")
    return B, Hq, Tq, Tk, d, scale


@functools.lru_cache(maxsize=None)
def variant_build(D: int, tile: tuple | None, dtype: str, mods: int) -> Build:
    """The Build of the variant kernel for (D, tile, dtype, MODS); every build runs the ILP loop."""
    tile = TILES[D] if tile is None else MmaTile(*tile)
    tile.check(D)
    if tile.ILP is False:
        raise ValueError(f"tile {tuple(tile)}: the variant kernel runs the ILP loop only (ILP must be None or True)")
    expr = variant_name_expression(D, tile, dtype, mods)
    smem = tile.smem_bytes(D)
    kernel = get_kernel(KERNEL_FILE, expr, name_expressions=(expr,), defines=tile.defines, shared_mem=smem,
                        carveout=CARVEOUT_MAX_SHARED)
    return Build(kernel, tile, smem, tile.rows, tile.threads)


def _class_kernel():
    return get_kernel(KERNEL_FILE, CLASS_KERNEL_NAME, defines=CLASS_DEFINES)


def doc_classes(doc_ids_q, doc_ids_k, B: int, Tq: int, Tk: int, br: int, bc: int):
    """The class of every (query tile of br rows, key tile of bc keys) of each batch entry under document masking, by
    flash2_mma_doc_classes: a (B, ceil(Tq / br), ceil(Tk / bc)) int8 CuPy array of EMPTY (0), FULL (1) and PARTIAL (2),
    with CLASS_SLACK bytes allocated past its end (hopper_attn.cu reads a row by aligned 4-byte words). The ids must
    have passed check_variant_arrays; the backwards (flash2_mma_bwd.py, hopper_attn_bwd.py) and the Hopper forward
    call it with their own tiles."""
    n_qt, n_kt = ceil_div(Tq, br), ceil_div(Tk, bc)
    size = B * n_qt * n_kt
    classes = cp.empty(size + CLASS_SLACK, dtype=cp.int8)[:size].reshape(B, n_qt, n_kt)
    _class_kernel()((n_qt, B), (CLASS_THREADS,), (doc_ids_q, doc_ids_k, classes, np.int32(Tq), np.int32(Tk),
                                                  np.int32(br), np.int32(bc)))
    return classes


_VCALLS = launch_cache()  # (qkv_key, options) -> what _prepare_variants returned


def _prepare_variants(q, k, v, dev, causal, scale, tile, head_major, window, prefix, softcap, docs, alibi):
    """Validate q, k, v and the options (not the arrays of ids and slopes: check_variant_arrays, on every call) and
    return what a call of this problem needs: (Launch, o shape, lse shape, classes shape or None)."""
    B, Hq, Tq, Tk, d, scale = validate_variant_problem(q, k, v, dev, scale)
    spec = variant_spec(q.shape, k.shape, scale, causal=causal, window=window, prefix=prefix, softcap=softcap,
                        docs=docs, alibi=alibi)
    b = variant_build(BUILD_FOR[d], tile, DTYPE_NAMES[q.dtype], spec.mods)
    check_shared_memory_fits(b.tile, BUILD_FOR[d], d, device_info(dev).smem_optin)
    n_qt = ceil_div(Tq, b.rows)
    blocks = check_grid(B * Hq * n_qt, WHAT, MAX_GRID_X)
    if docs:
        check_grid(B, WHAT + " document classes", MAX_GRID_YZ, "y")
    order = grid_order(bool(causal) or window is not None, B * Hq, Tk, d, q.itemsize, device_info().l2_bytes,
                       grid_waves(b, blocks)) if head_major is None else bool(head_major)
    tail = (np.int32(Tq), np.int32(Tk), np.int32(d), np.float32(scale * LOG2E), I32[order], np.int32(Hq),
            np.int32(spec.group), np.int32(spec.left), np.int32(spec.right), np.int32(spec.prefix),
            np.float32(spec.cap_in), np.float32(spec.cap_out))
    launch = Launch(b.kernel, (blocks,), (b.threads,), b.smem, 9, tail, dev)
    classes = (B, n_qt, ceil_div(Tk, b.tile.BC), b.rows, b.tile.BC) if docs else None
    return launch, (B, Hq, Tq, d), (B, Hq, Tq), classes


def forward_variants(q, k, v, *, causal=False, scale=None, return_lse=False, tile=None, head_major=None, window=None,
                     prefix=None, doc_ids_q=None, doc_ids_k=None, alibi_slopes=None, softcap=None):
    """attention_variant of reference/variants.py on tensor cores: q (B, Hq, Tq, d), k and v (B, Hkv, Tk, d) with
    Hq % Hkv == 0, float16 or bfloat16; the options as forward() takes them (see the module's docstring). Returns o
    (B, Hq, Tq, d) and with return_lse lse (B, Hq, Tq) float32 (-inf for a row that sees no key, whose o is 0).
    With document ids a small kernel classifies the tiles first (one more launch per call)."""
    dev = current_device()
    docs, alibi = doc_ids_q is not None or doc_ids_k is not None, alibi_slopes is not None
    options = (bool(causal), scale, None if tile is None else tuple(tile), head_major,
               None if window is None else tuple(window) if isinstance(window, (tuple, list)) else window, prefix,
               softcap, docs, alibi)
    key = qkv_key(q, k, v, dev, ALIGN)
    entry = _VCALLS.get((key, options)) if key is not None else None
    if entry is None:
        entry = _prepare_variants(q, k, v, dev, *options)
        if key is not None:
            if len(_VCALLS) >= 1024:
                _VCALLS.clear()
            _VCALLS[(key, options)] = entry
    launch, o_shape, lse_shape, classes_shape = entry
    B, Hq, Tq, _ = o_shape
    doc_ids_q, doc_ids_k = check_variant_arrays(doc_ids_q, doc_ids_k, alibi_slopes, B, Hq, Tq, k.shape[2], dev)
    o = cp.empty(o_shape, dtype=q.dtype)
    lse = cp.empty(lse_shape, dtype=cp.float32) if return_lse else None
    classes = None
    if classes_shape is not None:
        _, _, _, br, bc = classes_shape
        classes = doc_classes(doc_ids_q, doc_ids_k, B, Tq, k.shape[2], br, bc)
    ptr = (lambda x: 0 if x is None else x.data.ptr)
    launch(cp.cuda.get_current_stream().ptr, q.data.ptr, k.data.ptr, v.data.ptr, o.data.ptr, ptr(lse),
           ptr(doc_ids_q), ptr(doc_ids_k), ptr(classes), ptr(alibi_slopes))
    return (o, lse) if return_lse else o


register(Variant("flash2_mma", forward, DTYPES, "06_fp16_tensor_cores", MAX_D, has_lse=True,
                 description="FlashAttention-2 on tensor cores: mma.sync m16n8k16, ldmatrix(.trans), P in registers, "
                             "cp.async double buffering, exp2 softmax"))
