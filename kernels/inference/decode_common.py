"""What the decoding launchers share (kernels/inference/decode_ft.py, decode_split.py, decode_append.py): the checks of the
decoding contract, stated once. The contract itself is in kernels/inference/decode_split.py's docstring and, in float64,
in reference/decode.py. No kernel lives here.
"""

from __future__ import annotations

import math

import numpy as np

from ..core import HAS_C_CONTIGUOUS, MAX_GRID_YZ, check_alignment, check_array, check_index_range, cp, current_device

PAGE_SIZES = (16, 32, 64, 128, 256)  # page sizes of a paged cache (powers of two)
ALIGN = 16  # bytes: every decoding kernel reads 16-byte vectors
INT32_MAX = 2**31 - 1


_ndarray = cp.ndarray if cp is not None else None
_INT32 = np.dtype(np.int32)


def decode_key(q, k_cache, v_cache, seqlens_k, block_table, dev: int):
    """(shapes of q, k_cache, v_cache, seqlens_k and block_table (None), dtype, dev) when the arrays pass the checks
    that belong to the arrays rather than to their shapes: CuPy ndarrays, C-contiguous, on device `dev`, q, k_cache and
    v_cache of one dtype and 16-byte aligned, seqlens_k and block_table int32. Otherwise None.

    validate_decode's conclusions hold for every call with the same key, so a launcher can validate a problem once
    and keep its launches under this key (kernels/inference/decode_split.py). A call whose arrays fail this quick test takes
    the full validation, which raises the precise error."""
    nd = _ndarray
    if not (HAS_C_CONTIGUOUS and type(q) is nd and type(k_cache) is nd and type(v_cache) is nd
            and type(seqlens_k) is nd and (block_table is None or type(block_table) is nd)):
        return None
    qd, kd, vd = q.data, k_cache.data, v_cache.data
    dtype = q.dtype
    if not (q._c_contiguous and k_cache._c_contiguous and v_cache._c_contiguous and seqlens_k._c_contiguous
            and k_cache.dtype is dtype and v_cache.dtype is dtype and seqlens_k.dtype == _INT32
            and qd.device_id == dev and kd.device_id == dev and vd.device_id == dev
            and seqlens_k.data.device_id == dev and not (qd.ptr % ALIGN or kd.ptr % ALIGN or vd.ptr % ALIGN)):
        return None
    if block_table is None:
        return q.shape, k_cache.shape, v_cache.shape, seqlens_k.shape, None, dtype, dev
    if not (block_table._c_contiguous and block_table.dtype == _INT32 and block_table.data.device_id == dev):
        return None
    return q.shape, k_cache.shape, v_cache.shape, seqlens_k.shape, block_table.shape, dtype, dev


MAX_PREPARED = 1024  # prepared problems a launcher keeps before it forgets them all


def prepared_entry(cache: dict, key, options: tuple, usable: bool, prepare):
    """What a decode launcher prepared for this problem, preparing it on the first call.

    key: decode_key(...) (None: the arrays themselves need the full checks); options: the call's hashable options,
    part of the key; usable: False where an option could be mistaken for another as a key (True == 1), so the call is
    prepared without being kept; prepare(): validates the problem (raising the error that names what is wrong) and
    returns the entry. An unhashable option is prepared (and refused there) without being kept."""
    entry = None
    if key is not None and usable:
        key = (key,) + options
        try:
            entry = cache.get(key)
        except TypeError:
            key = None
    else:
        key = None
    if entry is None:
        entry = prepare()
        if key is not None:
            if len(cache) >= MAX_PREPARED:
                cache.clear()
            cache[key] = entry
    return entry


def decode_scale(scale, d) -> float:
    """1 / sqrt(d) for None, else a finite float (ValueError otherwise)."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number; got {scale}")
    return scale


def check_indices_on_gpu(seqlens_k, block_table, capacity: int, page_size: int, num_pages: int) -> None:
    """The opt-in value checks (each waits for the GPU: one device -> host copy): every length in [0, capacity];
    every page index a sequence uses (entries p < ceil(L_b / page_size) of its row) in [0, num_pages)."""
    check_index_range(seqlens_k, "seqlens_k", 0, capacity)
    if block_table is not None:
        used_pages = (seqlens_k.astype(cp.int64) + page_size - 1) // page_size
        used = cp.arange(block_table.shape[1])[None, :] < used_pages[:, None]
        check_index_range(cp.where(used, block_table, 0), "block_table (the entries in use)", 0, num_pages - 1)


def validate_decode(q, k_cache, v_cache, seqlens_k, block_table, *, dtypes, head_dims, max_tq, what,
                    page_sizes=PAGE_SIZES, paged_ok=True, k_chunk=None):
    """Shapes, dtypes and layouts of a decoding call, before launch and without waiting for the GPU.

    Returns (B, Hq, Tq, d, Hkv, cache_rows, max_pages, num_pages, capacity, dev): cache_rows is Tmax (contiguous)
    or page_size (paged); max_pages and num_pages are 0 for a contiguous cache; capacity is the most keys a
    sequence can have. k_chunk = X also accepts a key cache in FasterTransformer's layout (B, Hkv, d / X, Tmax, X).
    Raises TypeError / ValueError naming the argument, its value and the limit.
    """
    dev = current_device()
    check_array(q, "q", dtypes=dtypes, ndim=4, dev=dev)
    ft_layout = k_chunk is not None and getattr(k_cache, "ndim", 0) == 5
    check_array(k_cache, "k_cache", dtypes=dtypes, ndim=5 if ft_layout else 4, dev=dev)
    check_array(v_cache, "v_cache", dtypes=dtypes, ndim=4, dev=dev)
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(f"q, k_cache, v_cache must share one dtype; got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    check_array(seqlens_k, "seqlens_k", dtypes=("int32",), ndim=1, dev=dev)
    B, Hq, Tq, d = q.shape
    if min(B, Hq, Tq, d) < 1:
        raise ValueError(f"every dimension of q must be >= 1; got q {q.shape}")
    if d not in head_dims:
        raise ValueError(f"head dimension d={d} is not supported by {what} (d in {{{', '.join(map(str, head_dims))}}})")
    if Tq > max_tq:
        raise ValueError(f"q has Tq={Tq} query rows per sequence; {what} takes Tq <= {max_tq}")
    if seqlens_k.shape != (B,):
        raise ValueError(f"seqlens_k has shape {seqlens_k.shape}; q has B={B} sequences, so it must be ({B},)")
    n0, Hkv, cache_rows, kd = v_cache.shape
    if ft_layout:
        want = (n0, Hkv, kd // k_chunk, cache_rows, k_chunk)
        if k_cache.shape != want or kd % k_chunk:
            raise ValueError(f"k_cache in the FT layout must have shape (B, Hkv, d / {k_chunk}, Tmax, {k_chunk}) = "
                             f"{want} to match v_cache {v_cache.shape}; got {k_cache.shape}")
    elif k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {k_cache.shape} and v_cache {v_cache.shape} must have the same shape")
    if kd != d:
        raise ValueError(f"q has d={d}, but the caches have d={kd}")
    if min(n0, Hkv, cache_rows) < 1:
        raise ValueError(f"every dimension of the caches must be >= 1; got v_cache {v_cache.shape}")
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} query heads must be a multiple of Hkv={Hkv} KV heads")
    if block_table is None:
        if n0 != B:
            raise ValueError(f"a contiguous cache must have B={B} rows (one per sequence); got v_cache {v_cache.shape}")
        max_pages, num_pages, capacity = 0, 0, cache_rows
    else:
        if not paged_ok:
            raise ValueError(f"{what} reads contiguous caches only; block_table is not supported (decode_split "
                             f"reads paged caches)")
        max_pages, capacity = check_block_table(block_table, B, cache_rows, page_sizes, what, dev)
        num_pages = n0
    if B > MAX_GRID_YZ:
        raise ValueError(f"B={B} sequences; {what} takes B <= {MAX_GRID_YZ} (one grid row per sequence)")
    if Hkv > MAX_GRID_YZ:
        raise ValueError(f"Hkv={Hkv}; {what} takes Hkv <= {MAX_GRID_YZ} (one grid row per KV head)")
    check_alignment(what, ALIGN, q=q, k_cache=k_cache, v_cache=v_cache)
    return B, Hq, Tq, d, Hkv, cache_rows, max_pages, num_pages, capacity, dev


def check_block_table(block_table, B: int, page_size: int, page_sizes, what: str, dev: int) -> tuple[int, int]:
    """Check a (B, max_pages) int32 block table for pages of `page_size` rows; return (max_pages, capacity)."""
    check_array(block_table, "block_table", dtypes=("int32",), ndim=2, dev=dev)
    if block_table.shape[0] != B or block_table.shape[1] < 1:
        raise ValueError(f"block_table has shape {block_table.shape}; it must be ({B}, max_pages) with "
                         f"max_pages >= 1")
    if page_size not in page_sizes:
        raise ValueError(f"page_size={page_size} (k_cache.shape[2]) is not supported by {what}; "
                         f"page sizes: {', '.join(map(str, page_sizes))}")
    max_pages = block_table.shape[1]
    capacity = max_pages * page_size
    if capacity > INT32_MAX:
        raise ValueError(f"block_table allows {capacity} keys per sequence; the kernels count keys in 32 bits "
                         f"(<= {INT32_MAX})")
    return max_pages, capacity
