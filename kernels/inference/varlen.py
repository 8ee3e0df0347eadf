"""Launcher for kernels/inference/varlen.cu: padding removal for variable-length batches (notebook 09).

    cu_seqlens = cu_seqlens_from_lengths(lengths, max_len=Tmax)     # int32 (B,) -> int32 (B+1,), one block
    cu_seqlens, rank, lengths = from_mask(mask)                     # mask (B, Tmax) bool/uint8, two kernels
    packed = remove_padding(x, cu_seqlens, total, rank=rank)        # (B, Tmax, ...) -> (total, ...)
    y = restore_padding(packed, cu_seqlens, Tmax, rank=rank)        # (total, ...) -> (B, Tmax, ...), zero padding

Without `rank` a sequence's real tokens are its first cu_seqlens[b+1] - cu_seqlens[b] positions (lengths); with it
(from_mask) they are wherever the mask is set, and token (b, t) goes to packed row cu_seqlens[b] + rank[b, t].

cu_seqlens, lengths and rank live on the GPU: the launchers do not read them (that would wait for the GPU). The
kernels clamp them, so no value can make a kernel read or write out of bounds; a malformed array gives wrong rows.
check_inputs=True reads them back (one synchronisation) and raises ValueError on a malformed one.
"""

from __future__ import annotations

import functools

import numpy as np

from ..core import INT32_MAX, NULL, ceil_div, check_array, check_grid, cp, current_device, defines_from, get_kernel

KERNEL_FILE = "varlen.cu"
SCAN_THREADS = 1024  # threads of the one block of scan_lengths
SCAN_ITEMS = 4  # lengths per thread per pass
ROW_THREADS = 256  # threads per row of mask_row_scan
COPY_THREADS = 256  # threads per block of gather_rows / scatter_rows: one warp per padded row
ROWS_PER_BLOCK = COPY_THREADS // 32
DEFINES = defines_from(SCAN_THREADS=SCAN_THREADS, SCAN_ITEMS=SCAN_ITEMS, ROW_THREADS=ROW_THREADS,
                       COPY_THREADS=COPY_THREADS)
UNITS = (16, 4, 2)  # bytes one copy moves: uint4 where row bytes and addresses allow, else 4, else 2
COPY_EXPRESSIONS = tuple(f"{k}<{u}>" for k in ("gather_rows", "scatter_rows") for u in UNITS)
NVRTC_BUILDS = [(COPY_EXPRESSIONS, DEFINES)]  # scan_lengths and mask_row_scan are extern "C"
DTYPES = ("float16", "bfloat16", "float32")
MASK_DTYPES = ("bool", "uint8", "int8")


@functools.lru_cache(maxsize=None)
def kernel(name: str):
    """A kernel of varlen.cu; all of them come from one NVRTC program (compiled once)."""
    return get_kernel(KERNEL_FILE, name, name_expressions=COPY_EXPRESSIONS, defines=DEFINES)


def cu_seqlens_from_lengths(lengths, *, max_len: int | None = None, out=None):
    """The exclusive prefix sum [0, l0, l0+l1, ...] of int32 lengths (B,) on the GPU: int32 (B+1,).

    Each length is clamped to [0, max_len] first (max_len: the padded width Tmax; by default the largest value for
    which B * max_len still fits int32, so the sums cannot overflow). One block of SCAN_THREADS threads walks the
    batch. out: an optional int32 (B+1,) array to write into.
    """
    dev = current_device()
    check_array(lengths, "lengths", dtypes=("int32",), ndim=1, dev=dev)
    B = lengths.size
    if max_len is None:
        max_len = INT32_MAX // max(B, 1)
    if not isinstance(max_len, (int, np.integer)) or not 0 <= max_len or B * int(max_len) > INT32_MAX:
        raise ValueError(f"max_len={max_len} must be an int >= 0 with B * max_len <= {INT32_MAX} (B={B}), so that "
                         f"the int32 sums cannot overflow")
    if out is None:
        out = cp.empty(B + 1, dtype=cp.int32)
    else:
        check_array(out, "out", dtypes=("int32",), ndim=1, dev=dev)
        if out.size != B + 1:
            raise ValueError(f"out must have B+1 = {B + 1} entries; got {out.size}")
    kernel("scan_lengths")((1,), (SCAN_THREADS,), (lengths, np.int32(B), np.int32(max_len), out))
    return out


def from_mask(mask):
    """cu_seqlens (B+1,), rank (B, Tmax) and lengths (B,), int32, from a padding mask (B, Tmax) (nonzero = real).

    rank[b, t] is the number of real tokens before t in row b (-1 on padding): token (b, t) goes to packed row
    cu_seqlens[b] + rank[b, t]. Two kernels: one block per row scans the row's flags (mask_row_scan), then one
    block scans the lengths (scan_lengths)."""
    dev = current_device()
    check_array(mask, "mask", dtypes=MASK_DTYPES, ndim=2, dev=dev)
    B, Tmax = mask.shape
    if B < 1 or Tmax < 1:
        raise ValueError(f"mask must have B >= 1 rows and Tmax >= 1 columns; got shape {mask.shape}")
    if B * Tmax > INT32_MAX:
        raise ValueError(f"mask has {B * Tmax} entries; token positions are int32 (<= {INT32_MAX})")
    check_grid(B, "mask_row_scan (one block per row)")
    lengths = cp.empty(B, dtype=cp.int32)
    rank = cp.empty((B, Tmax), dtype=cp.int32)
    kernel("mask_row_scan")((B,), (ROW_THREADS,), (mask.view(cp.uint8), np.int32(Tmax), lengths, rank))
    return cu_seqlens_from_lengths(lengths, max_len=Tmax), rank, lengths


def token_offsets(cu_seqlens, rank):
    """The packed row of every padded position, -1 on padding: cu_seqlens[b] + rank[b, t] (a CuPy expression, for
    showing; the copy kernels form it on the fly)."""
    return cp.where(rank >= 0, cu_seqlens[:-1, None] + rank, -1).astype(cp.int32)


def _unit(row_bytes: int, *arrays) -> int:
    """The widest copy unit that divides the row and both base addresses."""
    for u in UNITS:
        if row_bytes % u == 0 and all(a.data.ptr % u == 0 for a in arrays):
            return u
    raise ValueError(f"rows of {row_bytes} bytes cannot be copied in 2-byte units")  # unreachable for DTYPES


def _check_index(cu_seqlens, rank, B: int, Tmax: int, dev: int) -> None:
    check_array(cu_seqlens, "cu_seqlens", dtypes=("int32",), ndim=1, dev=dev)
    if cu_seqlens.size != B + 1:
        raise ValueError(f"cu_seqlens has {cu_seqlens.size} entries; the padded batch has B={B}, so B+1 = {B + 1}")
    if rank is not None:
        check_array(rank, "rank", dtypes=("int32",), ndim=2, dev=dev)
        if rank.shape != (B, Tmax):
            raise ValueError(f"rank {rank.shape} must be (B, Tmax) = {(B, Tmax)}")
    if B * Tmax > INT32_MAX:
        raise ValueError(f"the padded batch has B * Tmax = {B * Tmax} rows; token positions are int32")


def check_index(cu_seqlens, total: int, Tmax: int, rank=None) -> None:
    """The opt-in check (check_inputs=True; reads the arrays back, one synchronisation): cu_seqlens starts at 0,
    never decreases, ends at total, no sequence is longer than Tmax; rank (if given) numbers each row's real tokens
    0, 1, ..., length - 1 in order."""
    from reference.varlen import check_cu_seqlens

    cu = check_cu_seqlens(cp.asnumpy(cu_seqlens), total)
    lengths = np.diff(cu)
    if lengths.size and lengths.max() > Tmax:
        raise ValueError(f"cu_seqlens holds a sequence of {int(lengths.max())} tokens; the padded width is Tmax={Tmax}")
    if rank is not None:
        r = cp.asnumpy(rank)
        real = r >= 0
        expect = np.where(real, np.cumsum(real, axis=1) - 1, -1)
        if not np.array_equal(r, expect) or not np.array_equal(real.sum(1), lengths):
            raise ValueError("rank must number the real tokens of each row 0, 1, ... in order (-1 on padding) and "
                             "agree with cu_seqlens")


def _rows(x, name: str, lead: int, dev: int):
    check_array(x, name, dtypes=DTYPES, dev=dev)
    if x.ndim < lead:
        raise ValueError(f"{name} must have at least {lead} dimensions; got shape {x.shape}")
    row_bytes = int(np.prod(x.shape[lead:], dtype=np.int64)) * x.itemsize
    if row_bytes < 1:
        raise ValueError(f"{name} has empty rows (shape {x.shape})")
    return row_bytes


def remove_padding(x, cu_seqlens, total: int | None = None, *, rank=None, check_inputs=False):
    """The real rows of x (B, Tmax, ...) packed one sequence after the other: (total, ...).

    total: the number of real tokens (the size of the result). None reads cu_seqlens[-1] back from the GPU (one
    synchronisation); pass it when the host knows it. Rows are copied in 16-byte vectors when the row size and the
    addresses allow, else in 4- or 2-byte units (any hidden size works)."""
    dev = current_device()
    row_bytes = _rows(x, "x", 2, dev)
    B, Tmax = x.shape[:2]
    _check_index(cu_seqlens, rank, B, Tmax, dev)
    if total is None:
        total = int(cu_seqlens[-1].get())
    if not isinstance(total, (int, np.integer)) or not 0 <= total <= B * Tmax:
        raise ValueError(f"total={total} must be an int in [0, B * Tmax = {B * Tmax}]")
    if check_inputs:
        check_index(cu_seqlens, int(total), Tmax, rank)
    packed = cp.empty((int(total),) + x.shape[2:], dtype=x.dtype)
    if total and B * Tmax:
        unit = _unit(row_bytes, x, packed)
        kernel(f"gather_rows<{unit}>")((ceil_div(B * Tmax, ROWS_PER_BLOCK),), (COPY_THREADS,),
                                       (x, packed, cu_seqlens, NULL if rank is None else rank, np.int32(B), np.int32(Tmax), np.int32(total),
                                        np.int32(row_bytes // unit)))
    return packed


def restore_padding(packed, cu_seqlens, Tmax: int, *, rank=None, check_inputs=False):
    """The inverse of remove_padding: packed (total, ...) -> (B, Tmax, ...) with zeros on the padding (every padded
    row is written, so the result needs no memset). B = cu_seqlens.size - 1."""
    dev = current_device()
    row_bytes = _rows(packed, "packed", 1, dev)
    check_array(cu_seqlens, "cu_seqlens", dtypes=("int32",), ndim=1, dev=dev)
    B, total = cu_seqlens.size - 1, packed.shape[0]
    if not isinstance(Tmax, (int, np.integer)) or Tmax < 1:
        raise ValueError(f"Tmax={Tmax} must be an int >= 1")
    if B < 1:
        raise ValueError(f"cu_seqlens must have B+1 >= 2 entries; got {cu_seqlens.size}")
    _check_index(cu_seqlens, rank, B, int(Tmax), dev)
    if check_inputs:
        check_index(cu_seqlens, total, int(Tmax), rank)
    y = cp.empty((B, int(Tmax)) + packed.shape[1:], dtype=packed.dtype)
    unit = _unit(row_bytes, packed, y)
    kernel(f"scatter_rows<{unit}>")((ceil_div(B * Tmax, ROWS_PER_BLOCK),), (COPY_THREADS,),
                                    (packed, y, cu_seqlens, NULL if rank is None else rank, np.int32(B), np.int32(Tmax), np.int32(total),
                                     np.int32(row_bytes // unit)))
    return y
