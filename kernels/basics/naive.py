"""Launcher for kernels/basics/naive.cu: attention as three plain kernels (llm.c's version 1 design).

    o = forward(q, k, v, causal=True)                    # (B, H, T, d) float32 CuPy arrays
    out, preatt, att = forward_packed(inp, NH)           # llm.c's (B, T, 3C) layout, causal
"""

from __future__ import annotations

import numpy as np

from ..core import MAX_GRID_X, T4_CC, ceil_div, check_array, check_grid, cp, get_kernel, validate_attention
from ..core.registry import Variant, register

KERNEL_FILE = "naive.cu"
MAX_D = 1024  # no shared memory and no per-d tiling: any reasonable head size works
DEFAULT_BLOCK = 256


def _check_block(block_size: int) -> int:
    block_size = int(block_size)
    if block_size < 32 or block_size > 1024 or block_size % 32:
        raise ValueError(f"block_size must be a multiple of 32 in [32, 1024]; got {block_size}")
    return block_size


def _launch_grid(total: int, block: int):
    return (check_grid(ceil_div(total, block), f"naive attention ({total} threads of {block} per block)",
                       MAX_GRID_X),), (block,)


def forward(q, k, v, *, causal=False, scale=None, block_size=DEFAULT_BLOCK, return_scores=False):
    """softmax(scale q k^T) v with three launches; returns o (and (preatt, att) if return_scores)."""
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=("float32",), max_d=MAX_D, min_cc=T4_CC,
                                                what="naive attention", scale=scale)
    block = _check_block(block_size)
    BH = B * H
    preatt = cp.empty((B, H, Tq, Tk), dtype=cp.float32)
    att = cp.empty_like(preatt)
    o = cp.empty((B, H, Tq, d), dtype=cp.float32)

    qk = get_kernel(KERNEL_FILE, "attention_query_key")
    qk(*_launch_grid(BH * Tq * Tk, block),
       (preatt, q, k, np.int32(BH), np.int32(Tq), np.int32(Tk), np.int32(d), np.float32(scale), np.int32(causal)))
    sm = get_kernel(KERNEL_FILE, "attention_softmax")
    sm(*_launch_grid(BH * Tq, block), (att, preatt, np.int64(BH * Tq), np.int32(Tk)))
    av = get_kernel(KERNEL_FILE, "attention_value")
    av(*_launch_grid(BH * Tq * d, block), (o, att, v, np.int32(BH), np.int32(Tq), np.int32(Tk), np.int32(d)))
    return (o, (preatt, att)) if return_scores else o


def permute_qkv(inp, NH, *, block_size=DEFAULT_BLOCK):
    """llm.c's packed (B, T, 3C) float32 -> q, k, v each (B, NH, T, C/NH), on the GPU."""
    check_array(inp, "inp", dtypes=("float32",), ndim=3)
    B, T, C3 = inp.shape
    NH = int(NH)
    if NH < 1 or C3 % (3 * NH):
        raise ValueError(f"inp's last dimension ({C3}) must be 3 * NH * head_size with NH={NH}")
    d = C3 // (3 * NH)
    q, k, v = (cp.empty((B, NH, T, d), dtype=cp.float32) for _ in range(3))
    kern = get_kernel(KERNEL_FILE, "permute_qkv")
    kern(*_launch_grid(B * NH * T * d, _check_block(block_size)),
         (q, k, v, inp, np.int32(B), np.int32(T), np.int32(NH), np.int32(d)))
    return q, k, v


def unpermute(o, *, block_size=DEFAULT_BLOCK):
    """(B, NH, T, d) -> (B, T, NH * d), on the GPU."""
    check_array(o, "o", dtypes=("float32",), ndim=4)
    B, NH, T, d = o.shape
    out = cp.empty((B, T, NH * d), dtype=cp.float32)
    kern = get_kernel(KERNEL_FILE, "unpermute")
    kern(*_launch_grid(o.size, _check_block(block_size)), (out, o, np.int32(B), np.int32(T), np.int32(NH), np.int32(d)))
    return out


def forward_packed(inp, NH, *, block_size=DEFAULT_BLOCK):
    """llm.c's attention_forward: causal attention on inp (B, T, 3C); returns (out, preatt, att)."""
    q, k, v = permute_qkv(inp, NH, block_size=block_size)
    o, (preatt, att) = forward(q, k, v, causal=True, block_size=block_size, return_scores=True)
    return unpermute(o, block_size=block_size), preatt, att


register(Variant("naive", forward, ("float32",), "01_naive_cuda", MAX_D, min_cc=T4_CC,
                 description="three kernels, one thread per score / row / output (llm.c v1)"))
