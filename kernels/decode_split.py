"""Launcher for kernels/decode_split.cu: split-KV ("flash-decoding") attention over a contiguous or paged KV cache.

    o = decode(q, k_cache, v_cache, seqlens_k)                               # contiguous cache
    o = decode(q, k_pool, v_pool, seqlens_k, block_table=table)              # paged cache
    o, lse = decode(q, k_cache, v_cache, seqlens_k, return_lse=True, num_splits=8)

The decoding contract (every kernel in DECODE_REGISTRY follows it; reference/decode.py is its float64 oracle):

    o = decode(q, k_cache, v_cache, seqlens_k, *, scale=None, block_table=None, num_splits=None,
               return_lse=False, check_indices=False)

    q          (B, Hq, Tq, d) CuPy array, float16 or bfloat16. Tq = 1 is plain decoding; Tq up to MAX_TQ = 8 is a
               speculative or chunked append of Tq tokens, masked bottom-right causal against each sequence's own
               length: query i of sequence b sees key j when j <= i + L_b - Tq. Where L_b < Tq the first rows see
               fewer keys; a row that sees none gives o = 0 and lse = -inf.
    k_cache,   (B, Hkv, Tmax, d): a contiguous cache, sequence b's keys in rows 0 .. L_b - 1; or, with block_table,
    v_cache    (num_pages, Hkv, page_size, d): a pool of pages, page_size a power of two in 16 .. 256. Same dtype as
               q, C-contiguous, 16-byte aligned. d in {64, 128}. Hq a multiple of Hkv (GQA; Hkv = 1 is MQA): query
               head h reads KV head h // (Hq // Hkv).
    seqlens_k  (B,) int32 CuPy array: L_b, each in [0, Tmax] (paged: [0, max_pages * page_size]). L_b = 0 gives
               o = 0 and lse = -inf.
    block_table  (B, max_pages) int32 CuPy array: key j of sequence b lives in page block_table[b, j // page_size],
               row j % page_size. Only the entries of pages a sequence uses are read.
    scale      default 1 / sqrt(d).
    num_splits None: the heuristic choose_num_splits (fill the GPU); or an int in [1, MAX_SPLITS].
    return_lse also return lse (B, Hq, Tq) float32, natural log.
    check_indices  The values of seqlens_k and block_table live on the GPU; checking them means waiting for the GPU
               (a device -> host copy), so it is off by default. With check_indices=True a length outside its
               range, or a used page index outside [0, num_pages), raises ValueError before launch. With it off,
               the kernel clamps: a length below 0 counts as 0 and one above the capacity as the capacity; a page
               index outside [0, num_pages) is never dereferenced, its keys are skipped (masked out). No input can
               make the kernel read or write out of bounds. reference.decode_attention(..., out_of_range="clamp")
               computes the same thing.

    Returns o (B, Hq, Tq, d) in q's dtype (and lse). Bad shapes, dtypes, layouts or sizes raise TypeError or
    ValueError naming the argument, its value and the limit, before anything is launched.

How the work is cut: one block per (split, KV head, sequence) serves all G * Tq query rows of the KV head
(G = Hq / Hkv), up to ROWS_MAX = 8 rows in registers; more rows take ceil(G * Tq / 8) blocks per KV head and split,
which read the same keys (the repeats hit L2). With num_splits > 1, decode_combine merges the float32 partials.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ._core import MAX_GRID_X, ceil_div, check_compute_capability, check_grid, cp, defines_from, device_info, get_kernel
from .decode_common import PAGE_SIZES, check_indices_on_gpu, decode_scale, validate_decode
from .registry import DecodeVariant, register_decode

KERNEL_FILE = "decode_split.cu"
WHAT = "decode_split"
DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128)
MAX_TQ = 8  # query rows per sequence (speculative / chunked appends)
MAX_SPLITS = 256
CHUNK_ELEMS = 8  # 16-bit elements per 16-byte load (= CHUNK_ELEMS in decode_split.cu)
DECODE_WARPS = 4  # warps per block of decode_split_kv
COMBINE_WARPS = 4  # warps (= query rows) per block of decode_combine
DEFINES = defines_from(DECODE_WARPS=DECODE_WARPS, COMBINE_WARPS=COMBINE_WARPS)
LOG2E = 1.0 / math.log(2.0)
# Query rows held in registers (RB) -> keys per lane per step (UNROLL): fewer rows leave registers for more loads
# in flight. RB is the smallest of these >= G * Tq, at most 8.
ROW_BUILDS = {1: 8, 2: 8, 4: 4, 8: 2}
ROWS_MAX = max(ROW_BUILDS)
# The split heuristic's fixed cost of a split, in keys: starting a block, writing its float32 partial and reading it
# back in the combine cost about as much as streaming this many keys (see choose_num_splits).
SPLIT_OVERHEAD_KEYS = 64
SPLIT_TOLERANCE = 0.1  # take the fewest splits within 10% of the model's best (see choose_num_splits)
DEFAULT_BLOCKS_PER_SM = 4  # used by the heuristic when the kernel's occupancy cannot be read


def rows_build(rows: int) -> int:
    """RB: the register build for a KV head with `rows` = G * Tq query rows."""
    return next((rb for rb in ROW_BUILDS if rb >= rows), ROWS_MAX)


def keys_per_step(D: int, RB: int) -> int:
    """KT: the keys one block step covers = UNROLL * DECODE_WARPS * (32 / (D / 8)); splits are whole steps."""
    return ROW_BUILDS[RB] * DECODE_WARPS * (32 // (D // CHUNK_ELEMS))


def name_expression(D: int, RB: int, dtype: str) -> str:
    return f"decode_split_kv<{D}, {RB}, {ROW_BUILDS[RB]}, {'true' if dtype == 'bfloat16' else 'false'}>"


def combine_expression(D: int, dtype: str) -> str:
    return f"decode_combine<{D}, {'true' if dtype == 'bfloat16' else 'false'}>"


# What tests/test_compile.py compiles with NVRTC on a CPU-only machine: every build the launcher uses, in one program.
NVRTC_BUILDS = [(tuple([name_expression(D, RB, dt) for D in HEAD_DIMS for RB in ROW_BUILDS for dt in DTYPES]
                       + [combine_expression(D, dt) for D in HEAD_DIMS for dt in DTYPES]), DEFINES)]


@functools.lru_cache(maxsize=None)
def _kernels(D: int, RB: int, dtype: str):
    """(split kernel, combine kernel) of one build. The first launch compiles every row build of (D, dtype) and its
    combine in one NVRTC program (one compile instead of five)."""
    exprs = tuple(name_expression(D, rb, dtype) for rb in ROW_BUILDS) + (combine_expression(D, dtype),)
    split = get_kernel(KERNEL_FILE, name_expression(D, RB, dtype), name_expressions=exprs, defines=DEFINES)
    combine = get_kernel(KERNEL_FILE, exprs[-1], name_expressions=exprs, defines=DEFINES)
    return split, combine


@functools.lru_cache(maxsize=None)
def blocks_per_sm(D: int, RB: int, dtype: str, dev: int) -> int:
    """How many decode_split_kv blocks of this build fit on one SM (registers and static shared memory), read from
    the compiled kernel once; DEFAULT_BLOCKS_PER_SM where the attributes cannot be read."""
    try:
        attrs = _kernels(D, RB, dtype)[0].raw.attributes
        regs, smem = int(attrs["num_regs"]), int(attrs["shared_size_bytes"])
    except (AttributeError, KeyError, TypeError):  # pragma: no cover - a CuPy without these attributes
        return DEFAULT_BLOCKS_PER_SM
    regs_per_warp = ceil_div(max(regs, 1) * 32, 256) * 256  # registers are allocated per warp, 256 at a time
    by_regs = 65536 // (regs_per_warp * DECODE_WARPS)
    by_smem = (device_info(dev).smem_optin + 1024) // (smem + 1024)  # the driver keeps 1 KB per block
    by_threads = 2048 // (DECODE_WARPS * 32)
    return max(1, min(by_regs, by_smem, by_threads, 32))


def choose_num_splits(blocks: int, n_keys: int, slots: int, *, tile: int, max_splits: int = MAX_SPLITS,
                      overhead_keys: int = SPLIT_OVERHEAD_KEYS, tolerance: float = SPLIT_TOLERANCE) -> int:
    """The number of splits S, from a model of the time  cost(S) = waves(S) * (keys(S) + overhead_keys):

    blocks   blocks of one split (B * Hkv * row chunks);  slots  blocks the GPU runs at once (SMs * blocks per SM)
    waves(S) = ceil(blocks * S / slots): how many rounds of blocks the launch takes
    keys(S)  = ceil(ceil(n_keys / S) / tile) * tile: the keys one block streams (whole steps of `tile` keys)

    A block's time grows with the keys it reads plus a fixed cost per split (overhead_keys: starting the block,
    its float32 partial written and read back by the combine). More splits shorten every block but add waves
    once blocks * S passes the slots. The answer is the smallest S whose cost is within `tolerance` of the
    cheapest: the model's wave arithmetic can favour many splits by a percent or two (a last wave a little
    fuller), a gain smaller than what the model leaves out (the combine's launch). S is at most max_splits and
    at most ceil(n_keys / tile), so a full-length sequence has no empty split. notebooks/08 derives and plots this.
    """
    if blocks < 1 or slots < 1 or tile < 1:
        raise ValueError(f"blocks, slots and tile must be >= 1; got {blocks}, {slots}, {tile}")
    if n_keys <= tile:
        return 1
    s_max = max(1, min(max_splits, ceil_div(n_keys, tile)))
    costs = [ceil_div(blocks * s, slots) * (ceil_div(ceil_div(n_keys, s), tile) * tile + overhead_keys)
             for s in range(1, s_max + 1)]
    bound = min(costs) * (1.0 + tolerance)
    return next(s for s, cost in enumerate(costs, start=1) if cost <= bound)


@functools.lru_cache(maxsize=4096)
def _heuristic(blocks: int, n_keys: int, sm_count: int, per_sm: int, tile: int) -> int:
    return choose_num_splits(blocks, n_keys, sm_count * per_sm, tile=tile)


def plan(B: int, Hq: int, Tq: int, d: int, Hkv: int, capacity: int, dtype: str, num_splits=None, dev: int = 0):
    """(RB, RC, KT, S): rows per block, row chunks per KV head, keys per step and the number of splits that decode()
    launches for these sizes (S from the heuristic unless num_splits is given). The notebook and the tests use it."""
    rows = (Hq // Hkv) * Tq
    RB = rows_build(rows)
    RC = ceil_div(rows, RB)
    KT = keys_per_step(d, RB)
    if num_splits is None:
        info = device_info(dev)
        num_splits = _heuristic(B * Hkv * RC, capacity, info.sm_count, blocks_per_sm(d, RB, dtype, dev), KT)
    return RB, RC, KT, num_splits


def decode(q, k_cache, v_cache, seqlens_k, *, scale=None, block_table=None, num_splits=None, return_lse=False,
           check_indices=False):
    """Split-KV decoding attention; the contract is in this module's docstring.

    num_splits: None picks the split count with choose_num_splits for the cache's capacity (the lengths are on the
    GPU, so the heuristic assumes full sequences); an int in [1, MAX_SPLITS] forces it.
    """
    B, Hq, Tq, d, Hkv, cache_rows, max_pages, num_pages, capacity, dev = validate_decode(
        q, k_cache, v_cache, seqlens_k, block_table, dtypes=DTYPES, head_dims=HEAD_DIMS, max_tq=MAX_TQ, what=WHAT,
        page_sizes=PAGE_SIZES)
    scale = decode_scale(scale, d)
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, (int, np.integer)) \
                or not 1 <= num_splits <= MAX_SPLITS:
            raise ValueError(f"num_splits must be None or an int in [1, {MAX_SPLITS}]; got {num_splits!r}")
        num_splits = int(num_splits)
    info = device_info(dev)
    if info.cc < (8, 0):
        check_compute_capability((8, 0), WHAT, dev)
    if check_indices:
        check_indices_on_gpu(seqlens_k, block_table, capacity, cache_rows, num_pages)
    dtype = q.dtype.name
    RB, RC, KT, S = plan(B, Hq, Tq, d, Hkv, capacity, dtype, num_splits, dev)
    split_kernel, combine_kernel = _kernels(d, RB, dtype)
    check_grid(S * RC, WHAT, MAX_GRID_X)
    o = cp.empty((B, Hq, Tq, d), dtype=q.dtype)
    lse = cp.empty((B, Hq, Tq), dtype=cp.float32) if return_lse else None
    null = np.uintp(0)
    paged = block_table is not None
    page_shift = cache_rows.bit_length() - 1 if paged else 0
    sizes = (np.int32(Hq), np.int32(Hkv), np.int32(Tq), np.int32(cache_rows), np.int32(page_shift),
             np.int32(max_pages), np.int32(num_pages), np.int32(S), np.int32(RC), np.float32(scale * LOG2E))
    tables = (seqlens_k, block_table if paged else null)
    if S == 1:  # one split: the split kernel writes o and lse itself
        split_kernel((RC, Hkv, B), (DECODE_WARPS * 32,),
                     (q, k_cache, v_cache, *tables, o, null if lse is None else lse, null, null, *sizes))
    else:
        o_part = cp.empty((B, Hq, Tq, S, d), dtype=cp.float32)
        lse_part = cp.empty((B, Hq, Tq, S), dtype=cp.float32)
        split_kernel((S * RC, Hkv, B), (DECODE_WARPS * 32,),
                     (q, k_cache, v_cache, *tables, null, null, o_part, lse_part, *sizes))
        n_rows = B * Hq * Tq
        combine_kernel((check_grid(ceil_div(n_rows, COMBINE_WARPS), WHAT + " combine", MAX_GRID_X),),
                       (COMBINE_WARPS * 32,),
                       (o_part, lse_part, o, null if lse is None else lse, np.int64(n_rows), np.int32(S)))
    return (o, lse) if return_lse else o


register_decode(DecodeVariant(
    name="decode_split",
    decode=decode,
    dtypes=DTYPES,
    notebook="08_decoding_kv_cache",
    head_dims=HEAD_DIMS,
    max_tq=MAX_TQ,
    paged=True,
    page_sizes=PAGE_SIZES,
    splits=True,
    module=__name__,
    description="split-KV flash-decoding: a block per (split, KV head, sequence) serving all G*Tq query rows, "
                "16-byte loads with 2*UNROLL in flight per lane, online softmax in float32, LSE combine; paged",
))
