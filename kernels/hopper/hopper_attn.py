"""Launcher for kernels/hopper/hopper_attn.cu: a FlashAttention-3-style forward on Hopper (TMA + wgmma, fp16/bf16).

    o = forward(q, k, v, causal=True)                          # (B, H, T, d) float16 or bfloat16 CuPy arrays
    o, lse = forward(q, k, v, causal=True, return_lse=True)    # lse: (B, H, Tq) float32, natural log
    o = forward(q, k, v, causal=True)                          # k, v (B, Hkv, T, d), H % Hkv == 0: grouped heads

The same contract as flash2_mma.forward: bottom-right causal mask (query i sees key j when j <= i + Tk - Tq), a
row that sees no key gives o = 0 and lse = -inf, any Tq, Tk >= 1. Head dimension d = 64, 128 or 256 only (the
kernel's tiles are built around 64-column swizzle rows; kernels.REGISTRY["hopper_fa3"].head_dims says so to the
tests).

Checked on an H100 by the attention tests (tests/test_attention_gpu.py runs its grid over every registered variant:
see the end of this file; tests/test_hopper_attn_gpu.py runs every schedule); its SASS is checked on
the CPU (tests/test_hopper_attn_compile.py).

Needs a Hopper GPU (compute capability 9.x): the file is compiled with NVRTC for sm_90a to a CUBIN
(kernels.core.load_module(..., arch="sm_90a")), as kernels/hopper/hopper_gemm.py explains. q, k and v are read by TMA
through tensor maps built with cuTensorMapEncodeTiled (kernels.hopper.hopper_gemm.tensor_map): each as a (B*H, T, d)
tensor (k and v (B*Hkv, T, d), query head h reading kv head h / (H / Hkv)) read in boxes of 64 columns x block_m (q) or
block_n (k, v) rows with the 128-byte swizzle, (B*H) being the third dimension so that a box hanging over the end of one
head reads zeros, not the next head's rows.

The tiling (query rows per CTA, keys per K/V tile, ring slots) is chosen per head dimension and mask (TILES,
default_tiles); the launch too (default_launch): persistent, one CTA per SM walking the work tiles in a fixed order
without the causal mask and taking them from a queue, longest first, with it (at d = 256 one CTA per tile there).

The variants of reference/variants.py (forward_variants; forward takes them too): window=(left, right), prefix,
doc_ids_q / doc_ids_k, alibi_slopes and softcap (with grouped heads or without), checked by
flash2_mma's variant_spec and check_variant_arrays (the same rules and messages), built as the kernel's variant entry
points (-D VARIANT_MODS); document ids are classified per (query tile, key tile) by flash2_mma's class kernel at this
kernel's tile sizes. Their launch is variant_launch's: the queue under a mask, except with documents or at d = 256.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from . import hopper_gemm
from ..core import (INT32_MAX, MAX_GRID_X, MAX_GRID_YZ, NULL, ceil_div, check_alignment, check_array, check_grid, cp,
                    current_device, defines_from, device_info, dtype_set, get_kernel, validate_attention)
from ..flash import flash2_mma as F  # the variants' option checks and the document-class kernel
from ..core.registry import Variant, register

KERNEL_FILE = "hopper_attn.cu"
WHAT = "hopper_fa3 attention (wgmma + TMA)"
ARCH = hopper_gemm.ARCH  # sm_90a
MIN_CC = hopper_gemm.MIN_CC  # (9, 0)
HEAD_DIMS = (64, 128, 256)
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
# choices: kernels/hopper/README.md. tests/test_hopper_attn_gpu.py checks the other tilings too. d = 256 (Gemma): 64-key
# tiles, as a 64-key K or V tile already takes 32 KB, and 128 query rows, as O alone takes 128 float registers per
# consumer thread.
TILES = {
    (64, False): Tiles(192, 128, 4), (64, True): Tiles(192, 128, 4),
    (128, False): Tiles(128, 176, 2), (128, True): Tiles(128, 128, 2),
    (256, False): Tiles(128, 64, 2), (256, True): Tiles(128, 64, 2),
}
# Short causal sequences at d = 64 keep 128-row tiles: with 192 rows the wasted area along the diagonal (rows of a
# tile that see fewer keys than its last row) is a larger share of the little work there is.
SHORT_CAUSAL_TQ = 1024
SHORT_CAUSAL_TILES = Tiles(128, 128, 4)


# The head sizes whose causal launch is the dynamic queue (persistent="dynamic"); d = 256 keeps one CTA per work
# tile. Chosen from `python3 -m kernels.bench.torch_ops --parts launch` (kernels/hopper/README.md, "The launch").
DYNAMIC_CAUSAL_DS = (64, 128)


def default_launch(d: int, causal: bool):
    """The launch forward() uses when given persistent=None: True (one CTA per SM, the round robin) without the mask;
    with it "dynamic" at the head sizes of DYNAMIC_CAUSAL_DS and False (one CTA per work tile) at d = 256."""
    if not causal:
        return True
    return "dynamic" if d in DYNAMIC_CAUSAL_DS else False


def variant_launch(d: int, masked: bool, docs: bool):
    """The launch forward_variants() uses when given persistent=None: True without a mask (causal, window or prefix)
    and documents; with a mask default_launch's choice for the causal mask where the build has the dynamic schedule
    (no documents, DYNAMIC_CAUSAL_DS), else False (one CTA per work tile)."""
    if not (masked or docs):
        return True
    return "dynamic" if not docs and d in DYNAMIC_CAUSAL_DS else False


def default_tiles(d: int, causal: bool, Tq: int) -> Tiles:
    """The tiling forward() uses when it is given none."""
    if d == 64 and causal and Tq <= SHORT_CAUSAL_TQ:
        return SHORT_CAUSAL_TILES
    return TILES[(d, bool(causal))]


BLOCK_NS = (64, 128, 176, 192)  # the key-tile widths the kernel has a wgmma for (m64nNk16)


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
DEFINES = sum((tiles_defines(d, TILES[(d, False)]) for d in HEAD_DIMS), ())
NVRTC_BUILDS = [((), DEFINES + SCHEDULES[(True, True)])]

# The variant entry points (-D VARIANT_MODS=mods, mods a sum of the MOD_ flags: flash2_mma's values, which the .cu's
# enum repeats) and their tilings: two consumer warpgroups and 128-key tiles at d = 64 and 128, as the mask, the
# modifiers and the row data need registers the 192-row (d = 64: 160 per consumer thread) and 176-key (d = 128)
# tilings do not have: those spill (kernels/hopper/README.md); at d = 256 the dense tiling.
VARIANT_KERNEL_NAMES = {(dt, d): f"hopper_attn_variants_{'bf16' if dt == 'bfloat16' else 'f16'}_d{d}" for dt in DTYPES
                        for d in HEAD_DIMS}
MOD_DOCS, MOD_SOFTCAP, MOD_ALIBI = F.MOD_DOCS, F.MOD_SOFTCAP, F.MOD_ALIBI
VARIANT_TILES = {64: Tiles(128, 128, 4), 128: Tiles(128, 128, 2), 256: Tiles(128, 64, 2)}
# The variant builds of the default schedule, one per MODS, which tests/test_hopper_variants_compile.py compiles for
# sm_90a (not in NVRTC_BUILDS: their tile defines are not the .cu's defaults, which tests/test_compile.py requires).
VARIANT_BUILDS = [(mods, sum((tiles_defines(d, VARIANT_TILES[d]) for d in HEAD_DIMS), ())
                   + SCHEDULES[(True, True)] + defines_from(VARIANT_MODS=mods)) for mods in range(8)]

_CHECKED: set = set()


def kernel(dtype: str, d: int, tiles: Tiles, dev: int | None = None, overlap: bool = True, pingpong: bool = True,
           lazy_rescale: bool = True, mods: int | None = None):
    """The Kernel of one (dtype, d, tiling, schedule, rescaling), or with mods (a sum of MOD_DOCS, MOD_SOFTCAP,
    MOD_ALIBI) of the variant entry point with those switches: compiled for sm_90a on first use; its register count
    checked once per device (the consumers' setmaxnreg.inc would wait forever in a build with fewer registers than
    tiles.launch_regs)."""
    name = (KERNEL_NAMES if mods is None else VARIANT_KERNEL_NAMES)[(dtype, d)]
    schedule = (bool(overlap), bool(pingpong))
    defines = tiles_defines(d, tiles) + SCHEDULES[schedule] + defines_from(LAZY_RESCALE=bool(lazy_rescale))
    if mods is not None:
        defines += defines_from(VARIANT_MODS=int(mods))
    kern = get_kernel(KERNEL_FILE, name, defines=defines, shared_mem=smem_bytes(d, tiles),
                      carveout=CARVEOUT_MAX_SHARED, arch=ARCH)
    if (name, tiles, defines, dev) not in _CHECKED and dev is not None:
        if kern.num_regs != tiles.launch_regs:
            raise RuntimeError(f"{KERNEL_FILE}:{name} was built with {kern.num_regs} registers per thread; its "
                               f"setmaxnreg budget needs exactly {tiles.launch_regs} (launching it could hang)")
        _CHECKED.add((name, tiles, defines, dev))
    return kern


def _check_problem(BH: int, H: int, Tq: int, Tk: int, d: int, tiles, default) -> tuple[Tiles, int]:
    """The head dimension, the tiling (the caller's, checked, or default(d) for None), the work-tile count and the row
    indices of one problem (BH = B * H query heads); returns (tiling, work tiles)."""
    if d not in HEAD_DIMS:
        raise ValueError(f"head dimension d={d} is not supported by {WHAT}: d must be one of {HEAD_DIMS} (its tiles "
                         f"are whole 64-column rows of the 128-byte swizzle)")
    if tiles is None:
        tiles = default(d)
    else:
        tiles = Tiles(*tiles)
        check_tiles(d, tiles)
    work = ceil_div(Tq, tiles.block_m) * BH  # work tiles: (query tile, head, batch)
    if work > MAX_WORK:
        raise ValueError(f"B={BH // H}, H={H}, Tq={Tq} make {work} work tiles of {tiles.block_m} query rows; {WHAT} "
                         f"counts them in 32-bit integers and takes at most {MAX_WORK}")
    limit = INT32_MAX - 2 * max(tiles.block_m, tiles.block_n)
    if max(Tq, Tk) > limit:
        raise ValueError(f"Tq={Tq} and Tk={Tk} must be <= {limit} for {WHAT} (32-bit row indices)")
    return tiles, work


PERSISTENT = (None, False, True, "dynamic")  # forward()'s launches; the variant kernels' with documents or at d = 256:
# the first three (their producer has no registers left for the dynamic schedule: VARIANT_DYNAMIC in the .cu)


def _check_persistent(persistent, allowed) -> None:
    if not any(persistent is a or (isinstance(a, str) and persistent == a) for a in allowed):
        raise ValueError(f"persistent={persistent!r}: must be one of {', '.join(map(repr, allowed))}")


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, overlap=True, pingpong=True, lazy_rescale=True,
            tiles=None, persistent=None, window=None, prefix=None, doc_ids_q=None, doc_ids_k=None, alibi_slopes=None,
            softcap=None):
    """softmax(scale q k^T) v with TMA and wgmma, scheduled as FlashAttention-3 does.

    q (B, H, Tq, d), k and v (B, Hkv, Tk, d) with H a multiple of Hkv (grouped-query attention: query head h reads kv
    head h // (H / Hkv)): C-contiguous float16 or bfloat16 CuPy arrays on the current device, one dtype, 16-byte
    aligned, d = 64, 128 or 256. scale defaults to 1/sqrt(d) (any finite value). Returns o
    (B, H, Tq, d) of the inputs' dtype, and with return_lse also lse (B, H, Tq) float32 (natural log; -inf for a row
    that sees no key).
    Raises TypeError / ValueError naming the argument and the limit for anything else, UnsupportedDeviceError on a
    GPU that is not a Hopper.

    overlap=False turns off the pipelining inside a consumer warpgroup (the softmax of one K/V tile under the
    O += P V of the one before), pingpong=False the turn-taking of the consumer warpgroups at the tensor cores,
    lazy_rescale=False the lazy rescaling of O (the running row maximum then moves with every tile that raises it);
    tiles=Tiles(block_m, block_n, stages) replaces the tiling of default_tiles(). Each is a separate build of the
    kernel, for measuring what it is worth; the results agree to rounding (with overlap, O is rescaled after P V is
    added rather than before; with lazy rescaling, p and O are relative to a maximum up to 8 log2 units below the true one).

    persistent: True launches one CTA per SM, each walking the work tiles (query tile, head, batch) c, c + #SMs, ...;
    False one CTA per work tile, which the GPU hands out to the SMs as they free up. "dynamic": one CTA per SM, each
    taking the next tile no CTA has taken from a counter in global memory, the tiles numbered longest first within
    sections of heads whose K and V fit in L2 together (every such head's last query tile first): a greedy schedule
    that balances the causal mask's unequal tiles and, as any persistent launch, loads a CTA's next tile while it
    finishes the one before (the kernel's TileQueue and Work). Same build, same results. The default (None) is
    default_launch(d, causal): True without the causal mask, where every work tile costs the same; with it
    "dynamic" at d = 64 and 128, where the fixed round robin would give some SMs only long tiles, and False at
    d = 256.

    window, prefix, doc_ids_q, doc_ids_k, alibi_slopes, softcap: the variant kernels (forward_variants;
    reference.attention_variant is their oracle). Without them, the kernels as before.
    """
    if (window is not None or prefix is not None or doc_ids_q is not None or doc_ids_k is not None
            or alibi_slopes is not None or softcap is not None):
        return forward_variants(q, k, v, causal=causal, scale=scale, return_lse=return_lse, overlap=overlap,
                                pingpong=pingpong, lazy_rescale=lazy_rescale, tiles=tiles, persistent=persistent,
                                window=window, prefix=prefix, doc_ids_q=doc_ids_q, doc_ids_k=doc_ids_k,
                                alibi_slopes=alibi_slopes, softcap=softcap)
    B, H, Tq, Tk, d, scale = _validate_qkv(q, k, v, scale)
    group = F.variant_spec(q.shape, k.shape, scale, causal=causal).group  # H % Hkv checked there, as for the variants
    _check_persistent(persistent, PERSISTENT)
    tiles, work = _check_problem(B * H, H, Tq, Tk, d, tiles, lambda d: default_tiles(d, causal, Tq))
    hopper_gemm.check_hopper()  # compute capability 9.x exactly: an sm_90a CUBIN runs nowhere else
    dev = cp.cuda.runtime.getDevice()
    dtype = q.dtype.name

    o = cp.empty((B, H, Tq, d), dtype=q.dtype)
    lse = cp.empty((B, H, Tq), dtype=cp.float32) if return_lse else None
    BH = B * H
    map_q = hopper_gemm.tensor_map(q, BH, Tq, d, tiles.block_m)  # boxes of 64 columns x block_m rows, 128-byte swizzle
    map_k = hopper_gemm.tensor_map(k, BH // group, Tk, d, tiles.block_n)  # query head h reads kv head h / group
    map_v = hopper_gemm.tensor_map(v, BH // group, Tk, d, tiles.block_n)
    if persistent is None:
        persistent = default_launch(d, causal)
    grid = min(work, device_info(dev).sm_count) if persistent else work
    counter = cp.zeros(1, dtype=cp.int32) if persistent == "dynamic" else None  # the tiles claimed so far
    kernel(dtype, d, tiles, dev, overlap, pingpong, lazy_rescale)(
        (grid,), (tiles.threads,),
        (map_q, map_k, map_v, o, NULL if lse is None else lse, np.int32(Tq), np.int32(Tk), np.int32(BH),
         np.float32(scale * LOG2E), np.int32(bool(causal)), NULL if counter is None else counter, np.int32(group)),
        shared_mem=smem_bytes(d, tiles))
    return (o, lse) if return_lse else o


# ---------------------------------------------------------------------------------------------------------------------
# The variants: grouped-query heads, window / causal / prefix, document ids, softcap, ALiBi (hopper_attn_variants_*)
# ---------------------------------------------------------------------------------------------------------------------

def _fewer_kv_heads(q, k) -> bool:
    qs, ks = getattr(q, "shape", None), getattr(k, "shape", None)
    return qs is not None and ks is not None and len(qs) == 4 and len(ks) == 4 and qs[1] != ks[1]


def _validate_qkv(q, k, v, scale):
    """validate_attention, with k and v allowed Hkv heads where q has Hq (checked against each other by
    variant_spec): returns (B, Hq, Tq, Tk, d, scale)."""
    if not _fewer_kv_heads(q, k):  # the same heads (or a shape validate_attention rejects with the precise error)
        return validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=MAX_D, min_cc=MIN_CC, what=WHAT, scale=scale,
                                  align=ALIGN)
    B, Hq, Tq, _, d, scale = validate_attention(q, q, q, dtypes=DTYPE_SET, max_d=MAX_D, min_cc=MIN_CC, what=WHAT,
                                                scale=scale, align=ALIGN)
    dev = current_device()
    for name, x in (("k", k), ("v", v)):
        check_array(x, name, dtypes=dtype_set((q.dtype.name,)), ndim=4, dev=dev)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {k.shape} and v {v.shape}")
    if k.shape[0] != B or k.shape[3] != d or min(k.shape) < 1:
        raise ValueError(f"q {q.shape} and k {k.shape} must agree on B and d, every dimension >= 1")
    if k.size > INT32_MAX:
        raise ValueError(f"k has {k.size} elements; {WHAT} indexes with 32-bit integers (<= {INT32_MAX})")
    if k.data.ptr % ALIGN or v.data.ptr % ALIGN:
        check_alignment(WHAT, ALIGN, k=k, v=v)
    return B, Hq, Tq, k.shape[2], d, scale


def forward_variants(q, k, v, *, causal=False, scale=None, return_lse=False, overlap=True, pingpong=True,
                     lazy_rescale=True, tiles=None, persistent=None, window=None, prefix=None, doc_ids_q=None,
                     doc_ids_k=None, alibi_slopes=None, softcap=None):
    """reference.variants.attention_variant on the Hopper kernel: q (B, Hq, Tq, d), k and v (B, Hkv, Tk, d) with
    Hq % Hkv == 0, float16 or bfloat16, d = 64, 128 or 256; causal, window=(left, right), prefix, doc_ids_q (B, Tq) and
    doc_ids_k (B, Tk) int32 (doc_ids_k defaults to doc_ids_q when Tq == Tk), alibi_slopes (Hq,) float32 and softcap as
    flash2_mma.forward takes them (its variant_spec and check_variant_arrays check them, with the same messages).
    Returns o (B, Hq, Tq, d) and with return_lse lse (B, Hq, Tq) float32 (-inf for a row that sees no key, whose o
    is 0). overlap, pingpong, lazy_rescale, tiles and persistent as forward() takes them (but "dynamic" only without
    documents and at d = 64 or 128); the tiling defaults to VARIANT_TILES, the launch to variant_launch(). With document
    ids flash2_mma's class kernel classifies the (query tile, key tile) pairs first (one more launch per call)."""
    B, Hq, Tq, Tk, d, scale = _validate_qkv(q, k, v, scale)
    docs, alibi = doc_ids_q is not None or doc_ids_k is not None, alibi_slopes is not None
    spec = F.variant_spec(q.shape, k.shape, scale, causal=causal, window=window, prefix=prefix, softcap=softcap,
                          docs=docs, alibi=alibi)
    dev = current_device()
    doc_ids_q, doc_ids_k = F.check_variant_arrays(doc_ids_q, doc_ids_k, alibi_slopes, B, Hq, Tq, Tk, dev)
    tiles, work = _check_problem(B * Hq, Hq, Tq, Tk, d, tiles, VARIANT_TILES.__getitem__)
    if 2 * (Tq + Tk) + 4 * max(tiles.block_m, tiles.block_n) > INT32_MAX:  # band bounds c + right, c - left
        raise ValueError(f"Tq + Tk = {Tq + Tk} is too large for the variants of {WHAT} (32-bit key positions)")
    if docs:
        check_grid(B, WHAT + " document classes", MAX_GRID_YZ, "y")
    hopper_gemm.check_hopper()
    dtype = q.dtype.name
    Hkv = k.shape[1]
    o = cp.empty((B, Hq, Tq, d), dtype=q.dtype)
    lse = cp.empty((B, Hq, Tq), dtype=cp.float32) if return_lse else None
    map_q = hopper_gemm.tensor_map(q, B * Hq, Tq, d, tiles.block_m)
    map_k = hopper_gemm.tensor_map(k, B * Hkv, Tk, d, tiles.block_n)  # query head h reads kv head h / group
    map_v = hopper_gemm.tensor_map(v, B * Hkv, Tk, d, tiles.block_n)
    # (B, m_count, n_count) int8 classes at this tiling (the kernel reads them in the same layout)
    classes = F.doc_classes(doc_ids_q, doc_ids_k, B, Tq, Tk, tiles.block_m, tiles.block_n) if docs else None
    dynamic = not docs and d in DYNAMIC_CAUSAL_DS
    _check_persistent(persistent, PERSISTENT if dynamic else PERSISTENT[:3])
    if persistent is None:
        persistent = variant_launch(d, causal or window is not None or prefix is not None, docs)
    grid = min(work, device_info(dev).sm_count) if persistent else work
    counter = cp.zeros(1, dtype=cp.int32) if persistent == "dynamic" else None
    kernel(dtype, d, tiles, dev, overlap, pingpong, lazy_rescale, spec.mods)(
        (grid,), (tiles.threads,),
        (map_q, map_k, map_v, o, NULL if lse is None else lse, np.int32(Tq), np.int32(Tk), np.int32(B * Hq),
         np.float32(scale * LOG2E), NULL if doc_ids_q is None else doc_ids_q,
         NULL if doc_ids_k is None else doc_ids_k, NULL if classes is None else classes,
         NULL if alibi_slopes is None else alibi_slopes, np.int32(Hq), np.int32(spec.group), np.int32(spec.left),
         np.int32(spec.right), np.int32(spec.prefix), np.float32(spec.cap_in), np.float32(spec.cap_out),
         NULL if counter is None else counter),
        shared_mem=smem_bytes(d, tiles))
    return (o, lse) if return_lse else o


assert hopper_gemm.BLOCK_K == TMA_BOX_COLS  # tensor_map's box is 64 columns wide: one 128-byte swizzle row

# In REGISTRY, so in notebook 07's benchmark: on a GPU below compute capability 9.0 its rows say "not run" with the
# reason (Variant.unsupported_reason), as the bfloat16 rows of the older kernels do on a T4; d other than 64, 128 and
# 256 is left out by head_dims.
register(Variant("hopper_fa3", forward, DTYPES, "13_hopper_wgmma_tma", MAX_D, head_dims=HEAD_DIMS, has_lse=True,
                 min_cc=MIN_CC, description="FlashAttention-3-style forward: TMA K/V rings, producer warp, two or three "
                 "consumer warpgroups, wgmma S = Q K^T from shared memory and O += P V with P in registers"))
