"""The softmax kernels of notebook 02 against the float64 reference, on the GPU."""

import numpy as np
import pytest

import kernels
import reference as R
from kernels.basics import softmax as S

COLS = [1, 3, 4, 31, 32, 100, 1024, 4099, 8192, 40000]  # 40000 > 512 threads * 32 cached floats


def _x(rows, cols, seed, mag=5.0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * mag).astype(np.float32)
    if cols > 2:
        x[0, 1] = -np.inf  # a masked entry
    if rows > 2:
        x[2, :] = -np.inf  # a row that sees nothing: zeros, not NaN
    return x


@pytest.mark.parametrize("method", S.METHODS)
@pytest.mark.parametrize("cols", COLS)
def test_softmax_methods(gpu, poison, method, cols):
    cp = gpu
    rows = 67 if cols <= 8192 else 5
    x = _x(rows, cols, seed=cols)
    y = S.softmax(cp.asarray(x), method=method)
    assert kernels.check(y, R.softmax_safe(x), "float32").ok


@pytest.mark.parametrize("block", [32, 128, 1024])
def test_softmax_block_sizes(gpu, poison, block):
    cp = gpu
    x = _x(9, 5000, seed=block)
    for method in S.METHODS:
        assert kernels.check(S.softmax(cp.asarray(x), method=method, block_size=block), R.softmax_safe(x)).ok


def test_softmax_large_logits(gpu, poison):
    cp = gpu
    x = _x(16, 777, seed=2, mag=1000.0)  # exp would overflow without the max-subtraction
    for method in S.METHODS:
        assert kernels.check(S.softmax(cp.asarray(x), method=method), R.softmax_safe(x)).ok


@pytest.mark.parametrize("method", ["warp", "block"])
@pytest.mark.parametrize("Tq,Tk", [(1, 1), (7, 7), (33, 33), (1, 100), (100, 7), (64, 1024), (5, 3001)])
@pytest.mark.parametrize("causal", [False, True])
def test_scaled_causal_softmax(gpu, poison, method, Tq, Tk, causal):
    cp = gpu
    rng = np.random.default_rng(Tq + Tk)
    raw = (rng.standard_normal((2, 3, Tq, Tk)) * 8).astype(np.float32)
    if causal:  # masked entries are never read: poison them in the input too
        raw[..., ~R.causal_mask(Tq, Tk)] = np.nan
    scale = 0.125
    ref = R.softmax_safe(np.where(R.causal_mask(Tq, Tk) if causal else True, raw.astype(np.float64) * scale, -np.inf))
    y = S.scaled_causal_softmax(cp.asarray(raw), scale=scale, causal=causal, method=method)
    assert kernels.check(y, ref).ok


@pytest.mark.parametrize("method", ["auto", "warp", "block"])
@pytest.mark.parametrize("cols", [1, 4, 37, 128, 512, 513, 1024, 20000])
def test_masked_lengths_never_read_padding(gpu, poison, cols, method):
    cp = gpu
    rows = 12
    rng = np.random.default_rng(cols)
    x = rng.standard_normal((rows, cols)).astype(np.float32) * 4
    lengths = rng.integers(0, cols + 1, rows).astype(np.int32)
    lengths[0], lengths[-1] = 0, cols
    padded = np.arange(cols)[None, :] >= lengths[:, None]
    x_dev = x.copy()
    x_dev[padded] = np.nan  # if a padded entry were read, NaN would spread through its row
    ref = R.softmax_safe(np.where(padded, -np.inf, x.astype(np.float64)))
    y = S.masked_softmax(cp.asarray(x_dev), cp.asarray(lengths), method=method)
    assert kernels.check(y, ref).ok


@pytest.mark.parametrize("method", ["warp", "block"])
def test_masked_lengths_many_rows_and_unaligned_rows(gpu, poison, method):
    # more rows than one block's warps, a partial last block, and rows of 4-byte but not 16-byte alignment
    cp = gpu
    for rows, cols, offset in ((1000, 128, 0), (37, 100, 1), (9, 64, 1)):
        rng = np.random.default_rng(rows + cols)
        x = (rng.standard_normal((rows, cols)) * 6).astype(np.float32)
        lengths = rng.integers(0, cols + 1, rows).astype(np.int32)
        lengths[0] = cols
        ref = R.softmax_safe(np.where(np.arange(cols)[None, :] >= lengths[:, None], -np.inf, x.astype(np.float64)))
        buf = cp.asarray(np.concatenate([np.zeros(offset, np.float32), x.reshape(-1)]))
        xv = buf[offset:].reshape(rows, cols)
        assert bool(xv.data.ptr % 16) == bool(offset)
        y = S.masked_softmax(xv, cp.asarray(lengths), method=method)
        assert kernels.check(y, ref).ok, (rows, cols, offset)


def test_masked_lengths_out_of_range_are_clamped_by_both_kernels(gpu, poison):
    cp = gpu
    x = _x(6, 128, seed=9)
    lengths = cp.asarray(np.array([-5, 0, 1, 128, 129, 2**30], np.int32))
    clamped = np.clip(cp.asnumpy(lengths), 0, 128)
    ref = R.softmax_safe(np.where(np.arange(128)[None, :] >= clamped[:, None], -np.inf, x.astype(np.float64)))
    for method in ("warp", "block"):
        assert kernels.check(S.masked_softmax(cp.asarray(x), lengths, method=method), ref).ok
    with pytest.raises(ValueError, match="method must be"):
        S.masked_softmax(cp.asarray(x), lengths, method="thread")


def test_unaligned_view_takes_scalar_path(gpu, poison):
    cp = gpu
    x = _x(10, 65, seed=4)
    buf = cp.asarray(x.reshape(-1))
    view = buf[1:].reshape(-1)[: 10 * 64].reshape(10, 64)  # contiguous, 4-byte but not 16-byte aligned
    assert view.data.ptr % 16
    y = S.softmax(view, method="block")
    assert kernels.check(y, R.softmax_safe(view.get())).ok
