"""Launcher for kernels/inference/decode_ft.cu: decoding attention the FasterTransformer way (one block per query row).

    o = decode(q, k_cache, v_cache, seqlens_k)                       # plain key layout (B, Hkv, Tmax, d)
    o = decode(q, to_ft_layout(k_cache), v_cache, seqlens_k)         # FT key layout (B, Hkv, d / X, Tmax, X)
    o, lse = decode(q, k_cache, v_cache, seqlens_k, return_lse=True, threads_per_key=1)

The decoding contract (kernels/inference/decode_split.py's docstring has it in full; reference/decode.py in float64):

    o = decode(q, k_cache, v_cache, seqlens_k, *, scale=None, block_table=None, num_splits=None,
               return_lse=False, check_indices=False)

    q          (B, Hq, Tq, d), float32, float16 or bfloat16; Tq <= MAX_TQ = 8, bottom-right causal against each
               sequence's own length (query i of sequence b sees key j when j <= i + L_b - Tq; a row that sees no
               key gives o = 0, lse = -inf).
    k_cache    (B, Hkv, Tmax, d), or the same keys in FasterTransformer's layout (B, Hkv, d / X, Tmax, X) with
               X = 16 // itemsize (to_ft_layout makes it); v_cache (B, Hkv, Tmax, d). Same dtype as q, C-contiguous,
               16-byte aligned; d in {64, 128}; Hq a multiple of Hkv (query head h reads KV head h // (Hq // Hkv)).
               Tmax * 4 bytes of logits must fit in one block's shared memory (max_cache_len()).
    seqlens_k  (B,) int32 CuPy array, each in [0, Tmax]. L_b = 0 gives o = 0 and lse = -inf.
    block_table  not supported here (a ValueError says so): decode_split reads paged caches.
    num_splits None or 1 (this kernel does not split a sequence).
    return_lse also return lse (B, Hq, Tq) float32, natural log.
    check_indices  Checking the values of seqlens_k waits for the GPU (a device -> host copy), so it is opt-in: with
               True a length outside [0, Tmax] raises ValueError before launch. With it off the kernel clamps each
               length into [0, Tmax], so no value can make it read or write out of bounds.

    threads_per_key  (this kernel only) how many threads share one key in the key pass: a power of two dividing
               d / X, at most 32 (tpk_choices); default DEFAULT_TPK. notebooks/08 sweeps it against the two layouts.

    Returns o (B, Hq, Tq, d) in q's dtype (and lse). Bad input raises TypeError / ValueError before launch.

Launch: B * Hq * Tq blocks of THREADS threads; 4 * Tmax bytes of dynamic shared memory (the logits).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..core import (MAX_GRID_X, T4_CC, Launch, bf16_needs_80, check_compute_capability, check_dtype_capability,
                    check_grid, cp, current_device, defines_from, device_info, get_kernel, launch_cache)
from .decode_common import check_indices_on_gpu, decode_key, decode_scale, prepared_entry, validate_decode
from ..core.registry import DecodeVariant, register_decode

KERNEL_FILE = "decode_ft.cu"
WHAT = "decode_ft"
DTYPES = ("float32", "float16", "bfloat16")
DT_CODE = {"float32": "DT_F32", "float16": "DT_F16", "bfloat16": "DT_BF16"}  # the .cu's element-type names
HEAD_DIMS = (64, 128)
MAX_TQ = 8
THREADS = 128  # threads per block (= DECODE_FT_THREADS in decode_ft.cu)
DEFINES = defines_from(DECODE_FT_THREADS=THREADS)
CHUNK_BYTES = 16
DEFAULT_TPK = 4
STATIC_SMEM_RESERVE = 8192  # bytes kept for the kernel's static shared memory (at most 4 KB + 16 in every build)
LOG2E = 1.0 / math.log(2.0)


def chunk_elems(dtype) -> int:
    """X: elements of `dtype` in one 16-byte chunk (8 for 16-bit types, 4 for float32)."""
    return CHUNK_BYTES // np.dtype(dtype).itemsize


def tpk_choices(d: int, dtype) -> tuple:
    """The threads-per-key values a build accepts: powers of two dividing d / X, at most 32."""
    chunks = d // chunk_elems(dtype)
    return tuple(t for t in (1, 2, 4, 8, 16, 32) if chunks % t == 0)


def name_expression(d: int, dtype: str, tpk: int, ft_layout: bool) -> str:
    return f"decode_ft<{d}, {DT_CODE[dtype]}, {tpk}, {'true' if ft_layout else 'false'}>"


# The builds listed for tests/test_compile.py (any other valid build compiles on demand): the defaults and the layout
# sweep of notebooks/08, in one NVRTC program.
BUILDS = [(d, dt, DEFAULT_TPK, ft) for d in HEAD_DIMS for dt in DTYPES for ft in (False, True)] + \
         [(128, "float16", tpk, ft) for tpk in (1, 2, 8, 16) for ft in (False, True)]
NVRTC_BUILDS = [(tuple(name_expression(*b) for b in BUILDS), DEFINES)]
SM75_BUILDS = [(tuple(name_expression(*b) for b in BUILDS if b[1] != "bfloat16"), DEFINES)]  # tests/test_sm75.py


def max_cache_len(dev: int | None = None) -> int:
    """The largest Tmax whose logits (4 bytes per key) fit in one block's shared memory on this GPU."""
    return (device_info(dev).smem_optin - STATIC_SMEM_RESERVE) // 4


@functools.lru_cache(maxsize=None)
def _kernel(d: int, dtype: str, tpk: int, ft_layout: bool, smem_limit: int):
    """The Kernel of one build; the first launch compiles both key layouts of (d, dtype, tpk) in one NVRTC program."""
    exprs = (name_expression(d, dtype, tpk, False), name_expression(d, dtype, tpk, True))
    return get_kernel(KERNEL_FILE, exprs[int(ft_layout)], name_expressions=exprs, defines=DEFINES,
                      shared_mem=smem_limit)


def kernel_for(d: int, dtype: str, threads_per_key: int = DEFAULT_TPK, ft_layout: bool = False):
    """The Kernel of one build (for its registers: .num_regs, .local_size_bytes)."""
    return _kernel(d, np.dtype(dtype).name, threads_per_key, ft_layout, device_info().smem_optin - STATIC_SMEM_RESERVE)


def to_ft_layout(k_cache):
    """(B, Hkv, Tmax, d) -> FasterTransformer's key layout (B, Hkv, d / X, Tmax, X), X = 16 // itemsize: chunk c of
    every key stored together. A copy (CuPy)."""
    B, H, T, d = k_cache.shape
    X = chunk_elems(k_cache.dtype)
    if d % X:
        raise ValueError(f"d={d} must be a multiple of {X} for the FT layout of {k_cache.dtype}")
    return cp.ascontiguousarray(k_cache.reshape(B, H, T, d // X, X).transpose(0, 1, 3, 2, 4))


_CALLS = launch_cache()  # (decode_key, scale, num_splits, threads_per_key) -> (Launch, o shape, o dtype, lse shape, capacity)
_FLOAT32 = np.dtype(np.float32)


def _prepare(q, k_cache, v_cache, seqlens_k, block_table, scale, num_splits, threads_per_key):
    """Validate one problem (raising the error that names what is wrong) and prepare its launch."""
    dtype = getattr(q, "dtype", None)
    X = chunk_elems(dtype) if dtype is not None and dtype.name in DTYPES else None  # else check_array says why
    B, Hq, Tq, d, Hkv, Tmax, _, _, capacity, dev = validate_decode(
        q, k_cache, v_cache, seqlens_k, block_table, dtypes=DTYPES, head_dims=HEAD_DIMS, max_tq=MAX_TQ, what=WHAT,
        paged_ok=False, k_chunk=X)
    ft_layout = k_cache.ndim == 5
    if num_splits not in (None, 1) or isinstance(num_splits, bool):
        raise ValueError(f"{WHAT} does not split a sequence across blocks: num_splits must be None or 1; "
                         f"got {num_splits!r} (decode_split does)")
    scale = decode_scale(scale, d)
    tpk = DEFAULT_TPK if threads_per_key is None else threads_per_key
    if isinstance(tpk, bool) or tpk not in tpk_choices(d, q.dtype):
        raise ValueError(f"threads_per_key={tpk!r} must be one of {tpk_choices(d, q.dtype)} for d={d}, {q.dtype}")
    info = device_info(dev)
    if info.cc < T4_CC:  # float32 and float16 run from 7.5 (a T4); bfloat16 needs 8.0
        check_compute_capability(T4_CC, WHAT, dev)
    check_dtype_capability(q.dtype, WHAT, dev)
    smem_limit = info.smem_optin - STATIC_SMEM_RESERVE
    smem = -(-4 * Tmax // 16) * 16
    if smem > smem_limit:
        raise ValueError(f"{WHAT} keeps one float logit per key of the cache in shared memory: Tmax={Tmax} needs "
                         f"{smem} bytes; this GPU allows Tmax <= {smem_limit // 4} (decode_split has no such limit)")
    kernel = _kernel(d, q.dtype.name, int(tpk), ft_layout, smem_limit)
    blocks = check_grid(B * Hq * Tq, WHAT, MAX_GRID_X)
    # q, k, v, seqlens, o, lse, then the sizes
    launch = Launch(kernel, (blocks,), (THREADS,), smem, 6,
                    (np.int32(Hq), np.int32(Hkv), np.int32(Tq), np.int32(Tmax), np.float32(scale * LOG2E)), dev)
    return launch, (B, Hq, Tq, d), q.dtype, (B, Hq, Tq), capacity


def decode(q, k_cache, v_cache, seqlens_k, *, scale=None, block_table=None, num_splits=None, return_lse=False,
           check_indices=False, threads_per_key=None):
    """FasterTransformer-style decoding attention; the contract is in this module's docstring.

    The first call of a problem validates it and prepares its launch; later calls with arrays of the same shapes
    check only what can differ between such arrays (decode_common.decode_key), allocate and launch."""
    key = decode_key(q, k_cache, v_cache, seqlens_k, block_table, current_device())
    entry = prepared_entry(_CALLS, key, (scale, num_splits, threads_per_key),
                           type(num_splits) is not bool and type(threads_per_key) is not bool,
                           lambda: _prepare(q, k_cache, v_cache, seqlens_k, block_table, scale, num_splits,
                                            threads_per_key))
    launch, o_shape, o_dtype, lse_shape, capacity = entry
    if check_indices:
        check_indices_on_gpu(seqlens_k, None, capacity, 1, 0)
    o = cp.ndarray(o_shape, o_dtype)
    lse = cp.ndarray(lse_shape, _FLOAT32) if return_lse else None
    launch(cp.cuda.get_current_stream().ptr, q.data.ptr, k_cache.data.ptr, v_cache.data.ptr, seqlens_k.data.ptr,
           o.data.ptr, 0 if lse is None else lse.data.ptr)
    return (o, lse) if return_lse else o


register_decode(DecodeVariant("decode_ft", decode, DTYPES, "08_decoding_kv_cache", HEAD_DIMS, MAX_TQ, min_cc=T4_CC,
                              dtype_min_cc=bf16_needs_80(DTYPES),
                              description="FasterTransformer's decoder attention: a block per query row, q in registers, "
                              "16-byte loads, warp-shuffle dot products, logits in shared memory, block softmax, value "
                              "pass; plain or FT key layout"))
