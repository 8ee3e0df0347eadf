"""Launchers for kernels/basics/softmax.cu: row softmax three ways, fused scale + causal mask, per-row lengths.

    y = softmax(x, method="block")                  # x: (rows, cols) float32 CuPy array
    p = scaled_causal_softmax(s, scale=0.125, causal=True)   # s: (..., Tq, Tk) raw scores q.k
    y = masked_softmax(x, lengths)                  # lengths: (rows,) int32, entries past them never used
"""

from __future__ import annotations

import numpy as np

from ..core import MAX_GRID_X, ceil_div, check_array, check_grid, check_index_range, cp, get_kernel, require_gpu

KERNEL_FILE = "softmax.cu"
METHODS = ("thread", "warp", "block")
DEFAULT_BLOCK = {"thread": 256, "warp": 256}  # "block": auto_block(cols)
CACHE_VEC4 = 8  # must match softmax.cu: float4 per thread held in registers


def _check_block(block_size: int) -> int:
    block_size = int(block_size)
    if block_size < 32 or block_size > 1024 or block_size % 32:
        raise ValueError(f"block_size must be a multiple of 32 in [32, 1024]; got {block_size}")
    return block_size


def auto_block(cols: int) -> int:
    """Block size for the block-per-row kernels: enough threads that each holds at most CACHE_VEC4 float4."""
    want = ceil_div(cols, 4 * CACHE_VEC4)
    block = 32
    while block < want and block < 1024:
        block *= 2
    return block


def _vec_ok(x, out, cols: int) -> int:
    """float4 loads need rows of a multiple of 4 floats and 16-byte aligned base pointers."""
    return int(cols % 4 == 0 and x.data.ptr % 16 == 0 and out.data.ptr % 16 == 0)


def rows_cols(x, name="x"):
    check_array(x, name, dtypes=("float32",))
    if x.ndim < 1 or x.size == 0:
        raise ValueError(f"{name} must be a non-empty array of at least 1 dimension; got shape {x.shape}")
    cols = x.shape[-1]
    rows = x.size // cols
    if cols > MAX_COLS:
        raise ValueError(f"rows of {cols} elements exceed the kernels' 32-bit column index (cols <= {MAX_COLS}: a "
                         f"thread's index j + blockDim must not overflow)")
    return rows, cols


def _grid(rows: int, per_block: int):
    return (check_grid(ceil_div(rows, per_block), f"a softmax of {rows} rows", MAX_GRID_X),)


def _out(out, like):
    if out is None:
        return cp.empty_like(like)
    check_array(out, "out", dtypes=("float32",))
    if out.shape != like.shape:
        raise ValueError(f"out has shape {out.shape}; it must match the input's {like.shape}")
    return out


def softmax(x, *, method: str = "block", block_size: int | None = None, out=None):
    """Softmax over the last axis of a float32 CuPy array, with one of METHODS."""
    require_gpu()
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    rows, cols = rows_cols(x)
    block = _check_block(block_size or (auto_block(cols) if method == "block" else DEFAULT_BLOCK[method]))
    out = _out(out, x)
    if method == "thread":
        get_kernel(KERNEL_FILE, "softmax_thread_per_row")(
            _grid(rows, block), (block,), (out, x, np.int64(rows), np.int32(cols)))
    elif method == "warp":
        get_kernel(KERNEL_FILE, "softmax_warp_per_row")(
            _grid(rows, block // 32), (block,), (out, x, np.int64(rows), np.int32(cols)))
    else:
        get_kernel(KERNEL_FILE, "softmax_block_per_row")(
            _grid(rows, 1), (block,), (out, x, np.int64(rows), np.int32(cols), np.int32(_vec_ok(x, out, cols))))
    return out


def scaled_causal_softmax(scores, *, scale: float, causal: bool = True, method: str = "auto",
                          block_size: int | None = None, out=None):
    """softmax(scale * scores) over the last axis, with the bottom-right causal mask fused in.

    scores has shape (..., Tq, Tk) and holds raw dot products; masked entries are never read and come
    out as 0. method: "warp" (a warp per row), "block" (a block per row) or "auto" (block for rows
    longer than 1024).
    """
    require_gpu()
    if scores.ndim < 2:
        raise ValueError(f"scores must be (..., Tq, Tk); got shape {getattr(scores, 'shape', None)}")
    rows, Tk = rows_cols(scores, "scores")
    Tq = scores.shape[-2]
    if method == "auto":
        method = "block" if Tk > 1024 else "warp"
    if method not in ("warp", "block"):
        raise ValueError(f"method must be 'warp', 'block' or 'auto'; got {method!r}")
    block = _check_block(block_size or (auto_block(Tk) if method == "block" else DEFAULT_BLOCK[method]))
    out = _out(out, scores)
    args = (out, scores, np.int64(rows), np.int32(Tq), np.int32(Tk), np.float32(scale), np.int32(bool(causal)),
            np.int32(_vec_ok(scores, out, Tk)))
    if method == "warp":
        get_kernel(KERNEL_FILE, "softmax_scaled_causal_warp")(_grid(rows, block // 32), (block,), args)
    else:
        get_kernel(KERNEL_FILE, "softmax_scaled_causal_block")(_grid(rows, 1), (block,), args)
    return out


MAX_COLS = 2**31 - 1 - 1024  # the kernels step a 32-bit column index by up to 1024 threads
MASKED_WARP_MAX_COLS = 32 * 4 * 4  # rows a warp holds in registers (softmax.cu: 32 lanes x WARP_CACHE_VEC4 float4)


def masked_softmax(x, lengths, *, block_size: int | None = None, out=None, check_lengths: bool = False,
                   method: str = "auto"):
    """Softmax of x[r, :lengths[r]] for each row r; zeros beyond. Padded entries never reach the result (a float4
    load may fetch up to 3 of them, inside the row, and they are replaced by -inf), so padding may hold anything.

    lengths is an int32 CuPy array with one entry per row. The kernel clamps each length to [0, cols], so no
    value can make it read or write outside its row. check_lengths=True also raises ValueError for a length
    outside [0, cols]; it is off by default because it reads the lengths back from the GPU, which waits for
    the GPU to finish everything queued before it (a synchronisation on every call).
    method: "warp" (a warp per row, several rows per block: short rows), "block" (a block per row: long rows)
    or "auto" (warp for rows of up to MASKED_WARP_MAX_COLS floats).
    """
    require_gpu()
    rows, cols = rows_cols(x)
    check_array(lengths, "lengths", dtypes=("int32",), ndim=1)
    if lengths.shape[0] != rows:
        raise ValueError(f"lengths has {lengths.shape[0]} entries; x has {rows} rows")
    if check_lengths:
        check_index_range(lengths, "lengths", 0, cols)
    kernel, grid, block = masked_launch(rows, cols, method, block_size)
    out = _out(out, x)
    kernel(grid, block, (out, x, lengths, np.int64(rows), np.int32(cols), np.int32(_vec_ok(x, out, cols))))
    return out


def masked_launch(rows: int, cols: int, method: str = "auto", block_size: int | None = None):
    """(kernel, grid, block) of masked_softmax's launch; its arguments are (out, x, lengths, int64 rows, int32 cols,
    int32 vec), vec = 1 when cols % 4 == 0 and both x and out start on 16 bytes. kernels/pytorch/torch_ops.py launches it
    on torch tensors' pointers."""
    if method == "auto":
        method = "warp" if cols <= MASKED_WARP_MAX_COLS else "block"
    if method == "warp":
        block = _check_block(block_size or DEFAULT_BLOCK["warp"])
        return get_kernel(KERNEL_FILE, "softmax_masked_lengths_warp"), _grid(rows, block // 32), (block,)
    if method == "block":
        block = _check_block(block_size or auto_block(cols))
        return get_kernel(KERNEL_FILE, "softmax_masked_lengths"), _grid(rows, 1), (block,)
    raise ValueError(f"method must be 'warp', 'block' or 'auto'; got {method!r}")
