"""Padding removal and varlen attention on the GPU (kernels/inference/varlen.cu, flash2_mma.cu's varlen kernel) against the
float64 / NumPy reference (reference/varlen.py): the block scan against cupy.cumsum, cu_seqlens and ranks from masks,
gather/scatter round trips for any row size, varlen attention for empty and one-token sequences, one long sequence
beside many short ones, Tq != Tk, causal and not, every head-size build, fp16 and bf16, fused-QKV views, clamping
of malformed GPU-resident indices, and every error path. Outputs are poisoned (NaN) before each launch."""

import itertools

import numpy as np
import pytest

import kernels
import reference as R
from kernels.flash import flash2_mma
from kernels.inference import varlen

INT32_MAX = 2**31 - 1


# ---------------------------------------------------------------------------------------------------------------
# scan, cu_seqlens, ranks
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("B", [1, 2, 31, 32, 33, 1023, 1024, 4095, 4096, 4097, 10000, 100003])
def test_scan_matches_cupy_cumsum(gpu, poison, B):
    rng = np.random.default_rng(B)
    x = gpu.asarray(rng.integers(0, 1000, B).astype(np.int32))
    cu = varlen.cu_seqlens_from_lengths(x)
    want = gpu.cumsum(x, dtype=gpu.int32)
    assert cu.dtype == np.int32 and cu.shape == (B + 1,)
    assert int(cu[0]) == 0 and bool((cu[1:] == want).all())


def test_scan_clamps_lengths(gpu, poison):
    x = np.array([5, -3, 100, 0, 7, 2**30], np.int32)
    cu = varlen.cu_seqlens_from_lengths(gpu.asarray(x), max_len=8)
    assert cu.get().tolist() == R.cu_seqlens_from_lengths(np.clip(x, 0, 8)).tolist()


@pytest.mark.parametrize("B,Tmax,holes", [(1, 1, False), (3, 7, True), (8, 256, False), (5, 257, True),
                                          (64, 1000, True), (2, 3000, False)])
def test_from_mask(gpu, poison, B, Tmax, holes):
    rng = np.random.default_rng(B * Tmax)
    lengths = rng.integers(0, Tmax + 1, B)
    lengths[0] = 0 if B > 1 else Tmax
    mask = np.zeros((B, Tmax), bool)
    for b, n in enumerate(lengths):
        mask[b, rng.choice(Tmax, n, replace=False) if holes else slice(0, n)] = True
    cu, rank, lens = varlen.from_mask(gpu.asarray(mask))
    assert lens.get().tolist() == R.lengths_from_mask(mask).tolist()
    assert cu.get().tolist() == R.cu_seqlens_from_lengths(lens.get()).tolist()
    assert np.array_equal(varlen.token_offsets(cu, rank).get(), R.token_offsets(mask))
    u8 = varlen.from_mask(gpu.asarray(mask.astype(np.uint8)))[1]
    assert bool((u8 == rank).all())


# ---------------------------------------------------------------------------------------------------------------
# gather / scatter
# ---------------------------------------------------------------------------------------------------------------

ROW_SHAPES = [(768,), (3, 64), (12,), (7,), (1,)]  # fp16: 16-byte units, 16, 4 (24 bytes), 2 (14 bytes), 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("row", ROW_SHAPES, ids=lambda r: "x".join(map(str, r)))
@pytest.mark.parametrize("holes", [False, True])
def test_remove_restore_round_trip(gpu, poison, dtype, row, holes):
    rng = np.random.default_rng(len(row) * 100 + row[-1])
    B, Tmax = 6, 37
    lengths = np.array([0, 1, 37, 5, 16, 30])
    mask = np.zeros((B, Tmax), bool)
    for b, n in enumerate(lengths):
        mask[b, rng.choice(Tmax, n, replace=False) if holes else slice(0, n)] = True
    x = rng.standard_normal((B, Tmax) + row).astype(np.float32)
    xd = gpu.asarray(x.astype(dtype))
    xh = xd.get()
    if holes:
        cu, rank, _ = varlen.from_mask(gpu.asarray(mask))
    else:
        cu, rank = varlen.cu_seqlens_from_lengths(gpu.asarray(lengths.astype(np.int32)), max_len=Tmax), None
    total = int(lengths.sum())
    packed = varlen.remove_padding(xd, cu, total, rank=rank, check_inputs=True)
    assert packed.shape == (total,) + row and packed.dtype == xd.dtype
    assert np.array_equal(packed.get(), R.remove_padding(xh, mask))
    back = varlen.restore_padding(packed, cu, Tmax, rank=rank, check_inputs=True)
    assert np.array_equal(back.get(), R.restore_padding(R.remove_padding(xh, mask), mask))
    assert int(varlen.remove_padding(xd, cu, rank=rank).shape[0]) == total  # total read back from the GPU


def test_misaligned_rows_take_narrow_units(gpu, poison):
    """A view starting 2 bytes into an allocation cannot use 16-byte copies; the result is the same."""
    base = gpu.asarray(np.arange(2 * 5 * 8 + 1, dtype=np.float16))
    x = base[1:].reshape(2, 5, 8)
    assert x.data.ptr % 16 and x.flags.c_contiguous
    cu = gpu.asarray(np.array([0, 3, 8], np.int32))
    packed = varlen.remove_padding(x, cu, 8)
    mask = np.array([[1, 1, 1, 0, 0], [1] * 5], bool)
    assert np.array_equal(packed.get(), x.get()[mask])


def test_malformed_indices_are_clamped(gpu, poison):
    """Decreasing, negative and too-large cu_seqlens and ranks never make a kernel leave its arrays (compute-sanitizer
    runs this), and check_inputs=True names the problem."""
    B, Tmax, hidden = 3, 8, 16
    x = gpu.ones((B, Tmax, hidden), dtype=gpu.float16)
    for bad in ([0, 9, 4, 12], [0, -5, 3, 2**30], [7, 2, 1, 0]):
        cu = gpu.asarray(np.array(bad, np.int32))
        packed = varlen.remove_padding(x, cu, 10)
        varlen.restore_padding(packed, cu, Tmax)
        with pytest.raises(ValueError, match="cu_seqlens"):
            varlen.remove_padding(x, cu, 10, check_inputs=True)
    rank = gpu.asarray(np.full((B, Tmax), 2**30, np.int32))
    cu = gpu.asarray(np.array([0, 4, 8, 10], np.int32))
    varlen.restore_padding(varlen.remove_padding(x, cu, 10, rank=rank), cu, Tmax, rank=rank)
    with pytest.raises(ValueError, match="rank"):
        varlen.remove_padding(x, cu, 10, rank=rank, check_inputs=True)
    gpu.cuda.runtime.deviceSynchronize()


def test_varlen_helper_errors(gpu):
    cp = gpu
    ok_cu = cp.asarray(np.array([0, 2, 4], np.int32))
    x = cp.ones((2, 3, 8), dtype=cp.float16)
    with pytest.raises(TypeError, match="lengths has dtype int64"):
        varlen.cu_seqlens_from_lengths(cp.ones(3, dtype=cp.int64))
    with pytest.raises(ValueError, match="1-D"):
        varlen.cu_seqlens_from_lengths(cp.ones((2, 2), dtype=cp.int32))
    with pytest.raises(ValueError, match="max_len"):
        varlen.cu_seqlens_from_lengths(cp.ones(4, dtype=cp.int32), max_len=INT32_MAX)
    with pytest.raises(ValueError, match="B\\+1"):
        varlen.cu_seqlens_from_lengths(cp.ones(4, dtype=cp.int32), out=cp.empty(4, dtype=cp.int32))
    with pytest.raises(TypeError, match="mask has dtype float32"):
        varlen.from_mask(cp.ones((2, 3), dtype=cp.float32))
    with pytest.raises(ValueError, match="2-D"):
        varlen.from_mask(cp.ones(3, dtype=cp.bool_))
    with pytest.raises(TypeError, match="x must be a cupy.ndarray"):
        varlen.remove_padding(np.ones((2, 3, 8)), ok_cu, 4)
    with pytest.raises(TypeError, match="x has dtype int32"):
        varlen.remove_padding(cp.ones((2, 3, 8), dtype=cp.int32), ok_cu, 4)
    with pytest.raises(ValueError, match="C-contiguous"):
        varlen.remove_padding(cp.ones((2, 3, 16), dtype=cp.float16)[:, :, ::2], ok_cu, 4)
    with pytest.raises(ValueError, match="B\\+1 = 3"):
        varlen.remove_padding(x, cp.asarray(np.array([0, 4], np.int32)), 4)
    with pytest.raises(TypeError, match="cu_seqlens has dtype int64"):
        varlen.remove_padding(x, ok_cu.astype(cp.int64), 4)
    with pytest.raises(ValueError, match="total=7"):
        varlen.remove_padding(x, ok_cu, 7)
    with pytest.raises(ValueError, match="rank"):
        varlen.remove_padding(x, ok_cu, 4, rank=cp.zeros((2, 4), dtype=cp.int32))
    with pytest.raises(ValueError, match="must equal"):
        varlen.remove_padding(x, ok_cu, 3, check_inputs=True)
    with pytest.raises(ValueError, match="Tmax=3"):
        varlen.restore_padding(cp.ones((6, 8), dtype=cp.float16), cp.asarray(np.array([0, 6], np.int32)), 3,
                               check_inputs=True)
    with pytest.raises(ValueError, match="Tmax=0"):
        varlen.restore_padding(cp.ones((4, 8), dtype=cp.float16), ok_cu, 0)


# ---------------------------------------------------------------------------------------------------------------
# varlen attention
# ---------------------------------------------------------------------------------------------------------------

def varlen_problem(cp, lq, lk, H, d, dtype, *, magnitude=1.0, seed=0, fused=False):
    """Packed q (total_q, H, d), k, v (total_k, H, d) on the GPU (views into one (total, 3, H, d) QKV tensor when
    fused), cu_seqlens, and the float64 copies of exactly what the GPU holds."""
    rng = np.random.default_rng(seed)
    cu_q, cu_k = R.cu_seqlens_from_lengths(lq), R.cu_seqlens_from_lengths(lk)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    if fused:
        assert lq == lk
        qkv = rng.standard_normal((tq, 3, H, d)) * np.array([magnitude, magnitude, 1.0])[:, None, None]
        qkv = cp.asarray(qkv.astype(dtype))
        q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    else:
        q = cp.asarray((rng.standard_normal((tq, H, d)) * magnitude).astype(dtype))
        k = cp.asarray((rng.standard_normal((tk, H, d)) * magnitude).astype(dtype))
        v = cp.asarray(rng.standard_normal((tk, H, d)).astype(dtype))
    host = [x.get().astype(np.float64) for x in (q, k, v)]
    return (q, k, v, cp.asarray(cu_q), cp.asarray(cu_k)), host, (cu_q, cu_k), (max(lq), max(lk))


def run_and_check(cp, lq, lk, H, d, dtype, causal, **kw):
    dev, host, cus, mx = varlen_problem(cp, lq, lk, H, d, dtype, **kw)
    o, lse = flash2_mma.forward_varlen(*dev, *mx, causal=causal, return_lse=True, check_inputs=True)
    o_ref, lse_ref = R.varlen_attention(*host, *cus, causal=causal, return_lse=True)
    assert o.shape == o_ref.shape and lse.shape == lse_ref.shape == (H, sum(lq))
    res = kernels.check(o, o_ref, dtype)
    assert res.ok, f"o: {res.detail()}"
    res = kernels.check(lse, lse_ref, dtype)
    assert res.ok, f"lse: {res.detail()}"
    o2 = flash2_mma.forward_varlen(*dev, *mx, causal=causal)  # without the LSE, same output
    assert bool(cp.array_equal(o2.view(cp.uint16), o.view(cp.uint16)))


CASES = [  # lq, lk
    ([1, 0, 17, 64, 65, 3], None),
    ([1000] + [1, 2, 3, 5, 8, 13, 20] * 4 + [0], None),  # one long sequence beside many short ones
    ([5, 0, 70, 1, 128, 9], [9, 4, 33, 0, 200, 9]),       # Tq != Tk, Tq > Tk (rows that see nothing), Tk = 0
]


def _varlen_cases():
    """By default the Tq != Tk case at every (causal, d, dtype), and the other two each at half of them (every (d, dtype)
    build once, with and without the mask), the halves complementary; --full-grid: every case at every combination."""
    for (i, dtype), (j, d), causal, case in itertools.product(enumerate(["float16", "bfloat16"]), enumerate([64, 128]),
                                                              [False, True], range(len(CASES))):
        default = CASES[case][1] is not None or (i + j + causal + case) % 2 == 0
        yield pytest.param(case, causal, d, dtype, id=f"{case}-{'causal' if causal else 'full'}-{d}-{dtype}",
                           marks=() if default else (pytest.mark.full_grid,))


@pytest.mark.parametrize("case,causal,d,dtype", list(_varlen_cases()))
def test_varlen_attention(gpu, poison, case, causal, d, dtype):
    lq, lk = CASES[case]
    run_and_check(gpu, lq, lq if lk is None else lk, 2, d, dtype, causal, seed=case)


@pytest.mark.parametrize("d,dtype", [(32, "float16"), (96, "bfloat16"), (40, "float16"), (8, "bfloat16"),
                                     (256, "float16"), (256, "bfloat16"), (200, "float16")])
def test_varlen_other_head_sizes(gpu, poison, d, dtype):
    run_and_check(gpu, [3, 0, 130, 1], [7, 2, 100, 1], 3, d, dtype, True, seed=d)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_large_logits_and_fused_qkv(gpu, poison, causal):
    """std-10 inputs (logits that overflow an unguarded softmax), and q, k, v as views into one fused QKV tensor
    (token stride 3 H d), as the BERT-style layer passes them."""
    run_and_check(gpu, [1, 77, 0, 256, 31], [1, 77, 0, 256, 31], 4, 64, "float16", causal, magnitude=10.0, fused=True)


def test_varlen_all_empty_and_single_token(gpu, poison):
    cp = gpu
    dev, host, cus, _ = varlen_problem(cp, [0, 0], [0, 3], 2, 64, "float16")
    o, lse = flash2_mma.forward_varlen(*dev, 0, 3, return_lse=True)
    assert o.shape == (0, 2, 64) and lse.shape == (2, 0)
    run_and_check(cp, [1], [1], 1, 64, "float16", True)


def test_varlen_equals_dense_on_equal_lengths(gpu, poison):
    """Equal lengths: the varlen kernel and the dense kernel compute the same thing (the same block of work)."""
    cp = gpu
    B, H, T, d = 3, 4, 100, 64
    q, k, v = (cp.asarray(x).astype(cp.float16) for x in R.make_qkv(B, H, T, d, seed=7))
    packed = [x.transpose(0, 2, 1, 3).reshape(B * T, H, d).copy() for x in (q, k, v)]
    cu = cp.asarray(R.cu_seqlens_from_lengths([T] * B))
    for causal in (False, True):
        o_dense = flash2_mma.forward(q, k, v, causal=causal)
        o_var = flash2_mma.forward_varlen(*packed, cu, cu, T, T, causal=causal)
        dense_packed = o_dense.transpose(0, 2, 1, 3).reshape(B * T, H, d)
        res = kernels.check(o_var, dense_packed.astype(cp.float32), "float16")
        assert res.ok, res.detail()


def test_varlen_malformed_cu_seqlens_are_clamped(gpu, poison):
    cp = gpu
    dev, host, cus, mx = varlen_problem(cp, [4, 6, 5], [4, 6, 5], 2, 64, "float16")
    q, k, v = dev[:3]
    for bad in ([0, 9, 3, 15], [0, -4, 8, 2**30], [3, 2, 1, 0]):
        cu = cp.asarray(np.array(bad, np.int32))
        flash2_mma.forward_varlen(q, k, v, cu, cu, 15, 15, causal=True, return_lse=True)
        with pytest.raises(ValueError, match="cu_seqlens_q"):
            flash2_mma.forward_varlen(q, k, v, cu, dev[4], 15, 15, check_inputs=True)
    with pytest.raises(ValueError, match="max_seqlen_q=5 is smaller"):
        flash2_mma.forward_varlen(*dev, 5, 6, check_inputs=True)
    with pytest.raises(ValueError, match="cu_seqlens_k\\[-1\\] = 15 must equal"):
        flash2_mma.forward_varlen(q, k[:14], v[:14], dev[3], dev[4], 6, 6, check_inputs=True)
    cp.cuda.runtime.deviceSynchronize()


def test_varlen_attention_errors(gpu):
    cp = gpu
    dev, _, _, mx = varlen_problem(cp, [4, 6], [4, 6], 2, 64, "float16")
    q, k, v, cq, ck = dev
    f = flash2_mma.forward_varlen
    with pytest.raises(TypeError, match="q has dtype float32"):
        f(q.astype(cp.float32), k, v, cq, ck, *mx)
    with pytest.raises(TypeError, match="k has dtype bfloat16"):
        f(q, cp.asarray(k.get().astype("bfloat16")), v, cq, ck, *mx)
    with pytest.raises(TypeError, match="q must be a cupy.ndarray"):
        f(q.get(), k, v, cq, ck, *mx)
    with pytest.raises(ValueError, match="3-D"):
        f(q[None], k, v, cq, ck, *mx)
    with pytest.raises(ValueError, match="agree with q on H"):
        f(q, k[:, :1], v[:, :1], cq, ck, *mx)
    with pytest.raises(ValueError, match="contiguous heads"):
        f(q[:, :, ::2], k[:, :, ::2], v[:, :, ::2], cq, ck, *mx)
    with pytest.raises(ValueError, match="same shape and token stride"):
        f(q, k, v[:9], cq, ck, *mx)
    odd = cp.ones((10, 2, 36), dtype=cp.float16)
    with pytest.raises(ValueError, match="multiple of 8"):
        f(odd, odd, odd, cq, ck, *mx)
    big = cp.ones((10, 1, 264), dtype=cp.float16)
    with pytest.raises(ValueError, match="d=264 must be a multiple of 8 and <= 256"):
        f(big, big, big, cq, ck, *mx)
    base = cp.ones(10 * 2 * 64 + 8, dtype=cp.float16)
    with pytest.raises(ValueError, match="token stride"):  # a view 2 bytes into an allocation: not 16-byte aligned
        f(base[1:1 + 10 * 128].reshape(10, 2, 64), k, v, cq, ck, *mx)
    with pytest.raises(TypeError, match="cu_seqlens_q has dtype int64"):
        f(q, k, v, cq.astype(cp.int64), ck, *mx)
    with pytest.raises(ValueError, match="cu_seqlens_k must be 1-D"):
        f(q, k, v, cq, ck[None], *mx)
    with pytest.raises(ValueError, match="B\\+1 >= 2"):
        f(q, k, v, cq[:1], ck[:1], *mx)
    with pytest.raises(ValueError, match="both must be B\\+1"):
        f(q, k, v, cq, ck[:2], *mx)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int"):
        f(q, k, v, cq, ck, 6.0, 6)
    with pytest.raises(ValueError, match="max_seqlen_q=0"):
        f(q, k, v, cq, ck, 0, 6)
    with pytest.raises(ValueError, match="max_seqlen_k=11"):
        f(q, k, v, cq, ck, 6, 11)
    with pytest.raises(ValueError, match="scale"):
        f(q, k, v, cq, ck, *mx, scale=-1.0)
    with pytest.raises(ValueError, match="scale"):
        f(q, k, v, cq, ck, *mx, scale=float("nan"))
