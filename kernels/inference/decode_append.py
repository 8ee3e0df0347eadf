"""Launcher for kernels/inference/decode_append.cu: write a decoding step's new keys and values into the KV cache.

    append(k_cache, v_cache, k_new, v_new, seqlens_k)                      # contiguous cache
    append(k_pool, v_pool, k_new, v_new, seqlens_k, block_table=table)     # paged cache
    seqlens_k += k_new.shape[2]                                            # the caller moves the lengths on

    k_new, v_new  (B, Hkv, Tn, d): the new rows of each sequence, written at positions L_b .. L_b + Tn - 1.
    k_cache, v_cache  as in the decoding contract (kernels/inference/decode_split.py): (B, Hkv, Tmax, d), or a page pool
                  (num_pages, Hkv, page_size, d) with block_table (B, max_pages) int32; k_cache may also be in
                  FasterTransformer's key layout (B, Hkv, d / X, Tmax, X) (kernels/inference/decode_ft.py: to_ft_layout).
                  float32, float16 or bfloat16; all four arrays share it; d * itemsize must be a multiple of 16.
    seqlens_k     (B,) int32: the lengths BEFORE the append. They are not changed.
    check_indices True: first check (waiting for the GPU) that every L_b is in [0, capacity - Tn] and that every page
                  the new rows land in exists. Otherwise nothing is checked and the kernel drops what does not fit:
                  a row whose position is at or past the capacity, or whose page index lies outside [0, num_pages),
                  is not written, and a negative L_b counts as 0. reference.append_kv does the same in NumPy.
"""

from __future__ import annotations

import numpy as np

from ..core import (ceil_div, check_alignment, check_array, check_index_range, cp, current_device, defines_from,
                    get_kernel)
from .decode_common import ALIGN, PAGE_SIZES, check_block_table

KERNEL_FILE = "decode_append.cu"
WHAT = "decode_append"
DTYPES = ("float32", "float16", "bfloat16")
THREADS = 256
MAX_BLOCKS = 65536
DEFINES = defines_from(APPEND_THREADS=THREADS)
NVRTC_BUILDS = [((), DEFINES)]  # extern "C": no name expressions


def append(k_cache, v_cache, k_new, v_new, seqlens_k, *, block_table=None, check_indices=False) -> None:
    """Write k_new, v_new into the caches at each sequence's length (see the module docstring)."""
    dev = current_device()
    check_array(k_new, "k_new", dtypes=DTYPES, ndim=4, dev=dev)
    same = (k_new.dtype.name,)  # v_new and the caches must hold what k_new holds
    check_array(v_new, "v_new", dtypes=same, ndim=4, dev=dev)
    check_array(v_cache, "v_cache", dtypes=same, ndim=4, dev=dev)
    ft_layout = getattr(k_cache, "ndim", 0) == 5
    check_array(k_cache, "k_cache", dtypes=same, ndim=5 if ft_layout else 4, dev=dev)
    check_array(seqlens_k, "seqlens_k", dtypes=("int32",), ndim=1, dev=dev)
    if k_new.shape != v_new.shape:
        raise ValueError(f"k_new {k_new.shape} and v_new {v_new.shape} must have the same shape")
    B, Hkv, Tn, d = k_new.shape
    n0, cHkv, cache_rows, cd = v_cache.shape
    X = 16 // k_new.dtype.itemsize
    if ft_layout:
        if block_table is not None:
            raise ValueError("a key cache in the FT layout is contiguous; block_table is not supported with it")
        want = (n0, cHkv, cd // X, cache_rows, X)
        if k_cache.shape != want:
            raise ValueError(f"k_cache in the FT layout must have shape {want} to match v_cache {v_cache.shape}; "
                             f"got {k_cache.shape}")
    elif k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {k_cache.shape} and v_cache {v_cache.shape} must have the same shape")
    if (cHkv, cd) != (Hkv, d) or min(B, Hkv, Tn, d) < 1:
        raise ValueError(f"k_new {k_new.shape} must be (B, Hkv, Tn, d) with the caches' Hkv={cHkv} and d={cd}")
    if (d * k_new.dtype.itemsize) % 16:
        raise ValueError(f"rows of d={d} {k_new.dtype} are {d * k_new.dtype.itemsize} bytes; {WHAT} moves 16-byte "
                         f"chunks (d * itemsize must be a multiple of 16)")
    if seqlens_k.shape != (B,):
        raise ValueError(f"seqlens_k has shape {seqlens_k.shape}; k_new has B={B} sequences, so it must be ({B},)")
    if block_table is None:
        if n0 != B:
            raise ValueError(f"a contiguous cache must have B={B} rows (one per sequence); got v_cache {v_cache.shape}")
        max_pages, num_pages, page_shift, capacity = 0, 0, 0, cache_rows
    else:
        max_pages, capacity = check_block_table(block_table, B, cache_rows, PAGE_SIZES, WHAT, dev)
        num_pages, page_shift = n0, cache_rows.bit_length() - 1
    check_alignment(WHAT, ALIGN, k_cache=k_cache, v_cache=v_cache, k_new=k_new, v_new=v_new)
    if check_indices:
        check_index_range(seqlens_k, "seqlens_k", 0, capacity - Tn)
        if block_table is not None:
            pos = seqlens_k.astype(cp.int64)[:, None] + cp.arange(Tn)[None, :]  # (B, Tn): the positions written
            pages = cp.take_along_axis(block_table, pos // cache_rows, axis=1)
            check_index_range(pages, "block_table (the pages the new rows land in)", 0, num_pages - 1)
    cpr = d * k_new.dtype.itemsize // 16
    total = B * Hkv * Tn * cpr
    grid = min(ceil_div(total, THREADS), MAX_BLOCKS)
    get_kernel(KERNEL_FILE, "append_kv", defines=DEFINES)(
        (grid,), (THREADS,),
        (k_new, v_new, k_cache, v_cache, seqlens_k, np.uintp(0) if block_table is None else block_table,
         np.int32(Hkv), np.int32(Tn), np.int32(cpr), np.int32(cache_rows), np.int32(page_shift), np.int32(max_pages),
         np.int32(num_pages), np.int32(ft_layout), np.int64(total)))
