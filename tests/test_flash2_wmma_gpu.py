"""kernels/flash/flash2_wmma.py: the errors of its own limits, the head sizes between builds, every sweep tile (GPU).

The generic grid (tests/test_attention_gpu.py) and the generic error tests (tests/test_errors_gpu.py) cover
flash2_wmma through the registry; this file covers what is particular to it.
"""

import numpy as np
import pytest

import kernels
import reference as R
from kernels.flash import flash2_wmma as W

DTYPES = list(W.CTYPES)


def _qkv(cp, B=1, H=2, Tq=16, Tk=None, d=32, dtype="float16", mag=1.0, seed=0):
    host = R.make_qkv(B, H, Tq, d, Tk or Tq, magnitude=mag, seed=seed)
    return [cp.asarray(x.astype(dtype)) for x in host]


def _reference(dev, **kw):
    return R.attention(*(x.get().astype(np.float64) for x in dev), **kw)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float32_and_float64_are_type_errors(gpu, dtype):
    q, k, v = _qkv(gpu, dtype=dtype)
    with pytest.raises(TypeError, match=rf"q has dtype {dtype}; this kernel takes float16, bfloat16"):
        W.forward(q, k, v)


def test_mixed_dtypes_are_a_type_error(gpu):
    q, _, v = _qkv(gpu)
    k = _qkv(gpu, dtype="bfloat16")[1]
    with pytest.raises(TypeError, match=r"q, k, v must share one dtype; got float16, bfloat16, float16"):
        W.forward(q, k, v)


@pytest.mark.parametrize("d", [4, 12, 20, 100])
def test_head_dim_not_a_multiple_of_8(gpu, d):
    with pytest.raises(ValueError, match=rf"head dimension d={d} must be a multiple of 8 for flash2_wmma"):
        W.forward(*_qkv(gpu, d=d))


@pytest.mark.parametrize("d", [136, 256])
def test_head_dim_over_128(gpu, d):
    with pytest.raises(ValueError, match=rf"head dimension d={d} is larger than flash2_wmma attention supports "
                                         r"\(d <= 128\)"):
        W.forward(*_qkv(gpu, d=d))


def test_non_contiguous_views_are_rejected(gpu):
    q, k, v = _qkv(gpu, Tq=32, d=32)
    with pytest.raises(ValueError, match=r"q must be C-contiguous.*strides"):
        W.forward(q.transpose(0, 1, 3, 2), k, v)  # (B, H, d, T): a transposed view
    with pytest.raises(ValueError, match=r"v must be C-contiguous.*strides"):
        W.forward(q, k, v[:, :, ::-1])  # keys in reverse order: a negative stride


def test_misaligned_input_is_rejected(gpu):
    cp = gpu
    q, k, v = _qkv(gpu, Tq=16, d=32)
    flat = cp.zeros(q.size + 1, dtype=q.dtype)
    shifted = flat[1:].reshape(q.shape)  # contiguous, but 2 bytes past a 16-byte boundary
    shifted[...] = q
    assert shifted.flags.c_contiguous
    with pytest.raises(ValueError, match=r"q starts at address 0x[0-9a-f]+, which is not 16-byte aligned"):
        W.forward(shifted, k, v)


def test_bad_tile_is_rejected(gpu):
    with pytest.raises(ValueError, match=r"tile \(BR, BC\) = \(40, 64\) for D=32: BR and BC must be positive "
                                         r"multiples of 16"):
        W.forward(*_qkv(gpu), tile=(40, 64))
    with pytest.raises(ValueError, match=r"BR=1024 gives 2048 threads; at most 1024"):
        W.forward(*_qkv(gpu), tile=(1024, 64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [8, 24, 40, 72, 120])
def test_head_dims_between_builds(gpu, poison, dtype, d):
    """d that is not a build's D runs on the next D with zero-filled columns; output columns >= d untouched."""
    dev = _qkv(gpu, B=2, H=3, Tq=70, Tk=90, d=d, dtype=dtype, seed=d)
    o, lse = W.forward(*dev, causal=True, return_lse=True)
    o_ref, lse_ref = _reference(dev, causal=True, return_lse=True)
    assert o.shape == (2, 3, 70, d) and o.dtype == dev[0].dtype and lse.dtype == np.float32
    res_o, res_l = kernels.check(o, o_ref, dtype), kernels.check(lse, lse_ref, dtype)
    assert res_o.ok, res_o.detail()
    assert res_l.ok, res_l.detail()


SWEEP_TILES = [(64, 64), (128, 64), (64, 32), (128, 32), (32, 16)]


# Each (tile, d) is a build of its own. By default each tile at one head size, every head size at least once, and none
# of them the default build of that head size (the attention grid runs those); --full-grid: every tile at every d.
TILES_DEFAULT = {((64, 64), 128), ((128, 64), 32), ((64, 32), 64), ((128, 32), 32), ((32, 16), 128)}


@pytest.mark.parametrize("tile,d", [pytest.param(t, d, id=f"{d}-BR{t[0]}-BC{t[1]}",
                                                 marks=() if (t, d) in TILES_DEFAULT else (pytest.mark.full_grid,))
                                    for t in SWEEP_TILES for d in [32, 64, 128]])
def test_other_tiles_match_the_reference(gpu, poison, tile, d):
    """Every tile the sweep may choose is correct on a ragged causal shape with large magnitudes."""
    dev = _qkv(gpu, B=1, H=2, Tq=157, Tk=300, d=d, mag=10.0, seed=7)
    o, lse = W.forward(*dev, causal=True, return_lse=True, tile=tile)
    o_ref, lse_ref = _reference(dev, causal=True, return_lse=True)
    assert kernels.check(o, o_ref, "float16").ok
    assert kernels.check(lse, lse_ref, "float16").ok


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_that_see_no_key(gpu, poison, dtype):
    """Tq > Tk, causal: the first Tq - Tk queries see nothing -> O = 0 and lse = -inf, never NaN."""
    dev = _qkv(gpu, Tq=40, Tk=5, d=64, dtype=dtype)
    o, lse = W.forward(*dev, causal=True, return_lse=True)
    o_h, lse_h = o.get().astype(np.float64), lse.get()
    assert np.all(o_h[:, :, :35] == 0.0) and np.all(np.isneginf(lse_h[:, :, :35]))
    assert np.isfinite(o_h).all() and np.isfinite(lse_h[:, :, 35:]).all()
