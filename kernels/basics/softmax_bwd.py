"""Launcher for kernels/basics/softmax_bwd.cu: the backward of the masked softmax by lengths (kernels.softmax.masked_softmax).

    y = softmax.masked_softmax(x, lengths)
    dx = backward(y, dy, lengths)        # dx[r, j] = y (dy - sum_{i < n_r} dy y) for j < n_r, 0 beyond

float32 (rows, cols) arrays (or (..., cols): the rows are all leading axes), lengths int32 with one entry per row;
the kernel clamps each length to [0, cols].
"""

from __future__ import annotations

import numpy as np

from ..core import MAX_GRID_X, check_array, check_grid, check_index_range, cp, defines_from, get_kernel, require_gpu
from .softmax import rows_cols, auto_block

KERNEL_FILE = "softmax_bwd.cu"
KERNEL_NAME = "masked_softmax_backward"
CACHE_VEC4 = 8  # float4 of y and of dy per thread in registers (-DCACHE_VEC4); the forward's auto_block uses 8 too
MAX_BLOCK = 512  # threads per block at most (-DMAX_BLOCK): the register cache of 1024 threads would not fit an SM
DEFINES = defines_from(CACHE_VEC4=CACHE_VEC4, MAX_BLOCK=MAX_BLOCK)
NVRTC_BUILDS = [((), DEFINES)]
F32 = ("float32",)


def backward(y, dy, lengths, *, out=None, block_size: int | None = None, check_lengths: bool = False):
    """dx of the masked softmax y = masked_softmax(x, lengths) for the upstream gradient dy.

    y, dy: C-contiguous float32 CuPy arrays of one shape (..., cols); lengths: int32 CuPy array with one entry per
    row. out: optional float32 array of y's shape (fully overwritten). check_lengths=True raises ValueError for a
    length outside [0, cols]; it reads the lengths back (a synchronisation), so it is off by default, and the kernel
    clamps them either way.
    """
    require_gpu()
    rows, cols = rows_cols(y, "y")  # the forward launcher's checks: float32, non-empty, the column limit
    check_array(dy, "dy", dtypes=F32)
    if dy.shape != y.shape:
        raise ValueError(f"dy has shape {dy.shape}; it must match y's {y.shape}")
    check_array(lengths, "lengths", dtypes=("int32",), ndim=1)
    if lengths.shape[0] != rows:
        raise ValueError(f"lengths has {lengths.shape[0]} entries; y has {rows} rows")
    if check_lengths:
        check_index_range(lengths, "lengths", 0, cols)
    if out is None:
        out = cp.empty_like(y)
    else:
        check_array(out, "out", dtypes=F32)
        if out.shape != y.shape:
            raise ValueError(f"out has shape {out.shape}; it must match y's {y.shape}")
    block = int(block_size or min(auto_block(cols), MAX_BLOCK))
    if block < 32 or block > MAX_BLOCK or block % 32:
        raise ValueError(f"block_size must be a multiple of 32 in [32, {MAX_BLOCK}]; got {block}")
    vec = int(cols % 4 == 0 and y.data.ptr % 16 == 0 and dy.data.ptr % 16 == 0 and out.data.ptr % 16 == 0)
    get_kernel(KERNEL_FILE, KERNEL_NAME, defines=DEFINES)(
        (check_grid(rows, f"a softmax backward of {rows} rows", MAX_GRID_X),), (block,),
        (out, y, dy, lengths, np.int64(rows), np.int32(cols), np.int32(vec)))
    return out
