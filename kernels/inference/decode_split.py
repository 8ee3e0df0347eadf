"""Launcher for kernels/inference/decode_split.cu: split-KV ("flash-decoding") attention over a contiguous or paged KV cache.

    o = decode(q, k_cache, v_cache, seqlens_k)                               # contiguous cache
    o = decode(q, k_pool, v_pool, seqlens_k, block_table=table)              # paged cache
    o, lse = decode(q, k_cache, v_cache, seqlens_k, return_lse=True, num_splits=8)

The decoding contract (every kernel in DECODE_REGISTRY follows it; reference/decode.py is its float64 oracle):

    o = decode(q, k_cache, v_cache, seqlens_k, *, scale=None, block_table=None, num_splits=None,
               return_lse=False, check_indices=False)

(decode_split.decode also takes tensor_cores=True | False: which of the file's two split kernels runs.)

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
(G = Hq / Hkv). Two kernels do the block's work:
    decode_split_mma  (tensor_cores=True, the default) mma.sync: 16 rows per block as the M of the mma, K and V
                      staged through shared memory by cp.async, each warp with its own pipeline of MMA_STAGES tiles.
    decode_split_kv   (tensor_cores=False) CUDA cores: up to ROWS_MAX = 8 rows in registers, each key's dot
                      product as FMAs and a butterfly of shuffles; more rows take ceil(G * Tq / 8) blocks per KV head
                      and split, which read the same keys (the repeats hit L2). The readable one, which notebook 08
                      walks through; kernels.bench.decode times both.
With num_splits > 1 the blocks write float32 partials (one workspace, allocated per call) that are merged by
log-sum-exp: decode_split_mma merges them itself (the last block of each group to finish; it counts arrivals in a
small array of zeros kept per stream, which each launch leaves zero again), decode_split_kv by a second kernel,
decode_combine.

A call validates a problem (shapes, dtype, device, options) the first time it sees it and keeps what its launches
need (_Prepared); a later call with arrays of the same shapes checks only what can differ between such arrays (CuPy
arrays, C-contiguous, on this device, dtypes, 16-byte alignment), allocates and launches.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..core import (DEFAULT_MIN_CC, MAX_GRID_X, T4_CC, Launch, bf16_needs_80, ceil_div, check_compute_capability,
                    check_dtype_capability, check_grid, cp, current_device, defines_from, device_info, get_kernel,
                    launch_cache)
from ..core import blocks_per_sm as resident_blocks
from .decode_common import (PAGE_SIZES, check_indices_on_gpu, decode_key, decode_scale, prepared_entry,
                            validate_decode)
from ..core.registry import DecodeVariant, register_decode

KERNEL_FILE = "decode_split.cu"
WHAT = "decode_split"
DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128)
MAX_TQ = 8  # query rows per sequence (speculative / chunked appends)
MAX_SPLITS = 256
CHUNK_ELEMS = 8  # 16-bit elements per 16-byte load (= CHUNK_ELEMS in decode_split.cu)
DECODE_WARPS = 4  # warps per block of decode_split_kv
COMBINE_WARPS = 4  # warps (= query rows) per block of decode_combine
MMA_STAGES = 2  # tiles per warp in decode_split_mma's cp.async pipeline (3, 4 were slower: README.md)
DEFINES = defines_from(DECODE_WARPS=DECODE_WARPS, COMBINE_WARPS=COMBINE_WARPS, MMA_STAGES=MMA_STAGES)
LOG2E = 1.0 / math.log(2.0)
# Query rows held in registers (RB) -> keys per lane per step (UNROLL): fewer rows leave registers for more loads
# in flight. RB is the smallest of these >= G * Tq, at most 8.
ROW_BUILDS = {1: 8, 2: 8, 4: 4, 8: 2}
ROWS_MAX = max(ROW_BUILDS)
# The split heuristic's fixed cost of a split, in keys: starting a block, writing its float32 partial and reading it
# back in the combine cost about as much as streaming this many keys (see choose_num_splits).
SPLIT_OVERHEAD_KEYS = 64
SPLIT_TOLERANCE = 0.1  # take the fewest splits within 10% of the model's best (see choose_num_splits)
MMA_SPLIT_TOLERANCE = 0.02  # the same for the tensor-core kernel (why 2%, and forced split counts: README.md)
DEFAULT_BLOCKS_PER_SM = 4  # used by the heuristic when the kernel's occupancy cannot be read
# The tensor-core kernel (= MMA_ROWS, MMA_KEYS, MMA_STAGES in decode_split.cu)
MMA_ROWS = 16  # query rows per block (the M of m16n8k16)
MMA_KEYS = 16  # keys per warp tile
# decode_split_mma finds a tile's first row once and steps from there, which holds because a tile never crosses a page
if min(PAGE_SIZES) < MMA_KEYS:
    raise RuntimeError(f"decode_split_mma needs pages of at least MMA_KEYS = {MMA_KEYS} keys; PAGE_SIZES has "
                       f"{min(PAGE_SIZES)}")
# One tensor-core block streams K and V through NWARPS * MMA_STAGES tile buffers (64 KB at d = 128), enough alone to
# draw an SM's share of the memory bandwidth: a second block on the SM adds no bandwidth, only splits (and their
# merge). So the split heuristic counts one slot per SM for this kernel (how close its counts come to the fastest:
# kernels/inference/README.md).
MMA_HEURISTIC_BLOCKS_PER_SM = 1
CARVEOUT_MAX_SHARED = 100  # percent of the SM's L1/shared storage as shared memory (decode_split_mma)


def rows_build(rows: int) -> int:
    """RB: the register build for a KV head with `rows` = G * Tq query rows."""
    return next((rb for rb in ROW_BUILDS if rb >= rows), ROWS_MAX)


def keys_per_step(D: int, RB: int) -> int:
    """KT: the keys one block step covers = UNROLL * DECODE_WARPS * (32 / (D / 8)); splits are whole steps."""
    return ROW_BUILDS[RB] * DECODE_WARPS * (32 // (D // CHUNK_ELEMS))


def name_expression(D: int, RB: int, dtype: str) -> str:
    return f"decode_split_kv<{D}, {RB}, {ROW_BUILDS[RB]}, {'true' if dtype == 'bfloat16' else 'false'}>"


def mma_expression(D: int, dtype: str) -> str:
    return f"decode_split_mma<{D}, {'true' if dtype == 'bfloat16' else 'false'}>"


def mma_smem_bytes(D: int) -> int:
    """Dynamic shared memory of decode_split_mma: each warp's MMA_STAGES tiles of K and V (16-bit values)."""
    return DECODE_WARPS * MMA_STAGES * 2 * MMA_KEYS * D * 2


def combine_expression(D: int, dtype: str) -> str:
    return f"decode_combine<{D}, {'true' if dtype == 'bfloat16' else 'false'}>"


# What tests/test_compile.py compiles with NVRTC on a CPU-only machine: every build the launcher uses, in one program.
NVRTC_BUILDS = [(tuple([name_expression(D, RB, dt) for D in HEAD_DIMS for RB in ROW_BUILDS for dt in DTYPES]
                       + [mma_expression(D, dt) for D in HEAD_DIMS for dt in DTYPES]
                       + [combine_expression(D, dt) for D in HEAD_DIMS for dt in DTYPES]), DEFINES)]
# What a T4 builds (_kernels with mma_ok=False, float16 only; tests/test_sm75.py)
SM75_BUILDS = [(tuple([name_expression(D, RB, "float16") for D in HEAD_DIMS for RB in ROW_BUILDS]
                      + [combine_expression(D, "float16") for D in HEAD_DIMS]), DEFINES)]


@functools.lru_cache(maxsize=None)
def _kernels(D: int, RB: int, dtype: str, mma_ok: bool = True):
    """(split kernel, combine kernel) of one build; RB = MMA_ROWS is the tensor-core kernel. The first launch compiles
    every split kernel of (D, dtype) and its combine in one NVRTC program (one compile instead of six); without
    mma_ok (a GPU below 8.0: no mma.m16n8k16, no cp.async) the program leaves decode_split_mma out."""
    mma = (mma_expression(D, dtype),) if mma_ok else ()
    exprs = tuple(name_expression(D, rb, dtype) for rb in ROW_BUILDS) + mma + (combine_expression(D, dtype),)
    if RB == MMA_ROWS:
        split = get_kernel(KERNEL_FILE, mma_expression(D, dtype), name_expressions=exprs, defines=DEFINES,
                           shared_mem=mma_smem_bytes(D), carveout=CARVEOUT_MAX_SHARED)
    else:
        split = get_kernel(KERNEL_FILE, name_expression(D, RB, dtype), name_expressions=exprs, defines=DEFINES)
    combine = get_kernel(KERNEL_FILE, exprs[-1], name_expressions=exprs, defines=DEFINES)
    return split, combine


@functools.lru_cache(maxsize=None)
def blocks_per_sm(D: int, RB: int, dtype: str, dev: int) -> int:
    """How many split blocks of this build (RB = MMA_ROWS: the tensor-core kernel) fit on one SM (registers, static
    and dynamic shared memory), read from the compiled kernel once; DEFAULT_BLOCKS_PER_SM where the attributes
    cannot be read."""
    smem = mma_smem_bytes(D) if RB == MMA_ROWS else 0
    kernel = _kernels(D, RB, dtype, device_info(dev).cc >= DEFAULT_MIN_CC)[0]
    return resident_blocks(kernel, DECODE_WARPS * 32, smem, dev) or DEFAULT_BLOCKS_PER_SM


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
def _heuristic(blocks: int, n_keys: int, sm_count: int, per_sm: int, tile: int, tolerance: float) -> int:
    return choose_num_splits(blocks, n_keys, sm_count * per_sm, tile=tile, tolerance=tolerance)


def plan(B: int, Hq: int, Tq: int, d: int, Hkv: int, capacity: int, dtype: str, num_splits=None, dev: int = 0,
         tensor_cores=True):
    """(RB, RC, KT, S): rows per block, row chunks per KV head, keys per step and the number of splits that decode()
    launches for these sizes (S from the heuristic unless num_splits is given); RB = MMA_ROWS for the tensor-core
    kernel. The notebook and the tests use it."""
    rows = (Hq // Hkv) * Tq
    if tensor_cores:
        RB, KT = MMA_ROWS, MMA_KEYS * DECODE_WARPS
    else:
        RB = rows_build(rows)
        KT = keys_per_step(d, RB)
    RC = ceil_div(rows, RB)
    if num_splits is None:
        info = device_info(dev)
        if tensor_cores:
            per_sm, tolerance = MMA_HEURISTIC_BLOCKS_PER_SM, MMA_SPLIT_TOLERANCE
        else:
            per_sm, tolerance = blocks_per_sm(d, RB, dtype, dev), SPLIT_TOLERANCE
        num_splits = _heuristic(B * Hkv * RC, capacity, info.sm_count, per_sm, KT, tolerance)
    return RB, RC, KT, num_splits


class _Prepared:
    """What the launches of one problem need, worked out once (see decode)."""

    __slots__ = ("split", "combine", "o_shape", "o_dtype", "lse_shape", "part_elems", "work_elems", "index_check",
                 "n_groups", "arrivals", "no_partials")

    def __init__(self, split, combine, o_shape, o_dtype, lse_shape, part_elems, work_elems, index_check, n_groups):
        self.split, self.combine = split, combine  # Launch objects (combine None with one split or a merging split)
        self.o_shape, self.o_dtype, self.lse_shape = o_shape, o_dtype, lse_shape
        self.part_elems, self.work_elems = part_elems, work_elems  # floats of o_part, of o_part + lse_part
        self.index_check = index_check  # (capacity, page rows, num_pages) for check_indices
        self.n_groups = n_groups  # decode_split_mma with S > 1: B * Hkv * RC arrival counters; else 0
        self.arrivals = {}  # stream pointer -> its counters (zeros between launches; one stream's launches queue)
        self.no_partials = (0,) * (split.n_ptrs - 7)  # the null pointers after o, lse when S = 1


_CALLS = launch_cache()  # (decode_key, scale, num_splits, tensor_cores) -> _Prepared
_FLOAT32 = np.dtype(np.float32)


def _prepare(q, k_cache, v_cache, seqlens_k, block_table, scale, num_splits, tensor_cores) -> _Prepared:
    """Validate one problem (raising the error that names what is wrong) and prepare its launches."""
    B, Hq, Tq, d, Hkv, cache_rows, max_pages, num_pages, capacity, dev = validate_decode(
        q, k_cache, v_cache, seqlens_k, block_table, dtypes=DTYPES, head_dims=HEAD_DIMS, max_tq=MAX_TQ, what=WHAT,
        page_sizes=PAGE_SIZES)
    scale = decode_scale(scale, d)
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, (int, np.integer)) \
                or not 1 <= num_splits <= MAX_SPLITS:
            raise ValueError(f"num_splits must be None or an int in [1, {MAX_SPLITS}]; got {num_splits!r}")
        num_splits = int(num_splits)
    if tensor_cores is not True and tensor_cores is not False:
        raise ValueError(f"tensor_cores must be True or False; got {tensor_cores!r}")
    mma_ok = device_info(dev).cc >= DEFAULT_MIN_CC
    if not mma_ok:  # decode_split_kv runs from 7.5 (a T4) in float16; the tensor-core kernel and bfloat16 need 8.0
        check_compute_capability(DEFAULT_MIN_CC if tensor_cores else T4_CC,
                                 WHAT + (" with tensor_cores=True (decode_split_mma)" if tensor_cores else ""), dev)
        check_dtype_capability(q.dtype, WHAT, dev)
    dtype = q.dtype.name
    RB, RC, KT, S = plan(B, Hq, Tq, d, Hkv, capacity, dtype, num_splits, dev, tensor_cores)
    split_kernel, combine_kernel = _kernels(d, RB, dtype, mma_ok)
    check_grid(S * RC, WHAT, MAX_GRID_X)
    paged = block_table is not None
    page_shift = cache_rows.bit_length() - 1 if paged else 0
    sizes = (np.int32(Hq), np.int32(Hkv), np.int32(Tq), np.int32(cache_rows), np.int32(page_shift),
             np.int32(max_pages), np.int32(num_pages), np.int32(S), np.int32(RC), np.float32(scale * LOG2E))
    smem = mma_smem_bytes(d) if RB == MMA_ROWS else 0
    n_rows = B * Hq * Tq
    # split kernel: q, k, v, seqlens, block_table, o, lse, o_part, lse_part (decode_split_mma: arrivals), the sizes
    mma = RB == MMA_ROWS
    split = Launch(split_kernel, (S * RC, Hkv, B), (DECODE_WARPS * 32,), smem, 10 if mma else 9, sizes, dev)
    combine = None
    if S > 1 and not mma:
        blocks = check_grid(ceil_div(n_rows, COMBINE_WARPS), WHAT + " combine", MAX_GRID_X)
        combine = Launch(combine_kernel, (blocks,), (COMBINE_WARPS * 32,), 0, 4, (np.int64(n_rows), np.int32(S)), dev)
    part = n_rows * S * d
    return _Prepared(split, combine, (B, Hq, Tq, d), q.dtype, (B, Hq, Tq), part, part + n_rows * S,
                     (capacity, cache_rows, num_pages), B * Hkv * RC if mma and S > 1 else 0)


def decode(q, k_cache, v_cache, seqlens_k, *, scale=None, block_table=None, num_splits=None, return_lse=False,
           check_indices=False, tensor_cores=True):
    """Split-KV decoding attention; the contract is in this module's docstring.

    num_splits: None picks the split count with choose_num_splits for the cache's capacity (the lengths are on the
    GPU, so the heuristic assumes full sequences); an int in [1, MAX_SPLITS] forces it.
    tensor_cores: True (default) the tensor-core kernel decode_split_mma, False the CUDA-core kernel decode_split_kv.
    """
    key = decode_key(q, k_cache, v_cache, seqlens_k, block_table, current_device())
    entry = prepared_entry(_CALLS, key, (scale, num_splits, tensor_cores),
                           type(num_splits) is not bool and type(tensor_cores) is bool,  # True == 1 as a key
                           lambda: _prepare(q, k_cache, v_cache, seqlens_k, block_table, scale, num_splits,
                                            tensor_cores))
    if check_indices:
        capacity, page_rows, num_pages = entry.index_check
        check_indices_on_gpu(seqlens_k, block_table, capacity, page_rows, num_pages)
    o = cp.ndarray(entry.o_shape, entry.o_dtype)
    lse = cp.ndarray(entry.lse_shape, _FLOAT32) if return_lse else None
    o_ptr, lse_ptr = o.data.ptr, 0 if lse is None else lse.data.ptr
    table_ptr = 0 if block_table is None else block_table.data.ptr
    stream = cp.cuda.get_current_stream().ptr
    ptrs = (q.data.ptr, k_cache.data.ptr, v_cache.data.ptr, seqlens_k.data.ptr, table_ptr, o_ptr, lse_ptr)
    if entry.n_groups:  # tensor cores, S > 1: partials in a workspace, merged inside the kernel
        arrivals = entry.arrivals.get(stream)
        if arrivals is None:  # zeroed on this stream, so before the launch below
            arrivals = entry.arrivals[stream] = cp.zeros((entry.n_groups,), np.uint32)
        work = cp.ndarray((entry.work_elems,), _FLOAT32)
        entry.split(stream, *ptrs, work.data.ptr, work.data.ptr + 4 * entry.part_elems, arrivals.data.ptr)
    elif entry.combine is None:  # one split: the split kernel writes o and lse itself
        entry.split(stream, *ptrs, *entry.no_partials)
    else:  # one workspace for the float32 partials: o_part (B, Hq, Tq, S, d), then lse_part (B, Hq, Tq, S)
        work = cp.ndarray((entry.work_elems,), _FLOAT32)
        part_ptr = work.data.ptr
        lse_part_ptr = part_ptr + 4 * entry.part_elems
        entry.split(stream, *ptrs[:5], 0, 0, part_ptr, lse_part_ptr)
        entry.combine(stream, part_ptr, lse_part_ptr, o_ptr, lse_ptr)
    return (o, lse) if return_lse else o


def decode_cuda_cores(q, k_cache, v_cache, seqlens_k, **options):
    """decode with the CUDA-core kernel decode_split_kv (tensor_cores=False)."""
    return decode(q, k_cache, v_cache, seqlens_k, tensor_cores=False, **options)


def decode_tensor_cores(q, k_cache, v_cache, seqlens_k, **options):
    """decode with the tensor-core kernel decode_split_mma (tensor_cores=True)."""
    return decode(q, k_cache, v_cache, seqlens_k, tensor_cores=True, **options)


# Both split kernels are registered, so that the decoding test grid (tests/test_decode_gpu.py) covers each of them.
for _name, _decode, _description in (
        ("decode_split", decode_cuda_cores,
         "split-KV flash-decoding: a block per (split, KV head, sequence) serving all G*Tq query rows, 16-byte loads "
         "with 2*UNROLL in flight per lane, online softmax in float32, LSE combine; paged"),
        ("decode_split_mma", decode_tensor_cores,
         "split-KV flash-decoding on tensor cores: 16 query rows of a KV head as the M of mma.sync, each warp "
         "streaming its own 16-key tiles through a 2-stage cp.async pipeline, P in 16 bits, the LSE merge done by "
         "the last block of each group; paged")):
    register_decode(DecodeVariant(name=_name, decode=_decode, dtypes=DTYPES, notebook="08_decoding_kv_cache",
                                  head_dims=HEAD_DIMS, max_tq=MAX_TQ, paged=True, page_sizes=PAGE_SIZES, splits=True,
                                  min_cc=DEFAULT_MIN_CC if _decode is decode_tensor_cores else T4_CC,
                                  dtype_min_cc=bf16_needs_80(DTYPES), description=_description))
del _name, _decode, _description
