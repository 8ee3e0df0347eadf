"""kernels/hopper/hopper_gemm.py on a Hopper GPU: C = A B^T (wgmma + TMA) against a float64 NumPy product.

Shapes include tiles cut by every edge (M, N, K not multiples of 128, 256, 64), K over many ring passes, more tiles
than SMs (the persistent loop), N whose C rows are not 16-byte aligned (the epilogue's element-by-element stores) and
2-D and 4-D inputs. Outputs are poisoned with NaN first, so an element the kernel does not write fails the check.
Error paths run on any GPU; the products need compute capability 9.x and are skipped elsewhere with the reason.
"""

import dataclasses

import numpy as np
import pytest

import kernels
from kernels import core
from kernels.hopper import hopper_gemm as H

DTYPES = ["float16", "bfloat16"]

# (leading dims, M, N, K): what each case exercises
SHAPES = [
    ((1,), 128, 256, 64),      # one whole tile, one k-block
    ((2,), 130, 250, 72),      # ragged M, N and K: boxes hang over every edge
    ((), 1, 1, 8),             # 2-D, the smallest problem (boxes far larger than the tensor)
    ((3,), 300, 520, 200),     # 3 x 3 tiles per entry, K ragged over 4 k-blocks
    ((1,), 64, 96, 1024),      # 16 k-blocks: the 4-slot ring wraps four times (mbarrier phases flip)
    ((2, 3), 257, 129, 128),   # 4-D (B, H, T, d) input, as attention's q and k
    ((1,), 33, 77, 40),        # odd N: C rows not 16-byte aligned, element-by-element stores
    ((2,), 72, 260, 64),       # N % 8 == 4: 16-byte stores for float32 C (ragged second tile), not for 16-bit C
    ((1,), 100, 4, 16),        # N = 4: one 16-byte piece per float32 row; 16-bit rows 8 bytes apart
    ((8,), 1024, 1024, 64),    # 256 tiles: more than one per SM, the persistent loop
]


def _inputs(cp, lead, M, N, K, dtype, std=1.0, seed=0):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(lead + (M, K)) * std).astype(dtype)
    b = (rng.standard_normal(lead + (N, K)) * std).astype(dtype)
    ref = a.astype(np.float64) @ np.swapaxes(b.astype(np.float64), -1, -2)
    return cp.asarray(a), cp.asarray(b), ref


def test_register_budget_on_this_gpu(hopper):
    """The build that CuPy's NVRTC made here has the 168 registers that the setmaxnreg budget assumes."""
    for pair in H.KERNEL_NAMES:
        assert H.kernel(*pair).num_regs == H.LAUNCH_REGS, pair


@pytest.mark.parametrize("out", ["float32", "same"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[0] + s[1:])))
def test_matches_float64_product(hopper, poison, shape, dtype, out):
    lead, M, N, K = shape
    a, b, ref = _inputs(hopper, lead, M, N, K, dtype)
    out_dtype = dtype if out == "same" else out
    c = H.gemm_abt(a, b, out_dtype=out_dtype)
    assert c.shape == lead + (M, N) and c.dtype == np.dtype(out_dtype)
    result = kernels.check(c, ref, dtype)
    assert result.ok, f"{shape} {dtype} -> {out_dtype}: {result.detail()}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_larger_magnitude(hopper, poison, dtype):
    a, b, ref = _inputs(hopper, (2,), 200, 300, 256, dtype, std=8.0, seed=1)
    result = kernels.check(H.gemm_abt(a, b), ref, dtype)
    assert result.ok, result.detail()


def test_attention_scores_shape(hopper, poison):
    """gemm_abt(q, k) is S = Q K^T for every (b, h)."""
    cp = hopper
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 4, 200, 64)).astype(np.float16)
    k = rng.standard_normal((2, 4, 300, 64)).astype(np.float16)
    s = H.gemm_abt(cp.asarray(q), cp.asarray(k))
    ref = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64))
    assert kernels.check(s, ref, "float16").ok


def test_new_arrays_of_the_same_shape(hopper, poison):
    """The tensor maps name the arrays' addresses: a second pair of arrays gives its own product, not a stale one."""
    a1, b1, ref1 = _inputs(hopper, (2,), 100, 100, 64, "float16", seed=3)
    a2, b2, ref2 = _inputs(hopper, (2,), 100, 100, 64, "float16", seed=4)
    c1, c2, c3 = H.gemm_abt(a1, b1), H.gemm_abt(a2, b2), H.gemm_abt(a1, b2)
    ref3 = a1.get().astype(np.float64) @ np.swapaxes(b2.get().astype(np.float64), -1, -2)
    for c, ref in ((c1, ref1), (c2, ref2), (c3, ref3)):
        assert kernels.check(c, ref, "float16").ok


def test_matches_cublas(hopper):
    """Against cuBLAS's gemmStridedBatchedEx on the same 16-bit inputs (both sum in float32)."""
    cp = hopper
    from kernels.cublas.cublas_attention import qk_gemm

    a, b, _ = _inputs(cp, (4,), 256, 512, 128, "float16", seed=5)
    c = H.gemm_abt(a, b)
    ref = cp.empty_like(c)
    qk_gemm(a[None], b[None], ref[None], 1.0, False)
    assert float(cp.abs(c - ref).max()) <= 1e-3 * float(cp.abs(ref).max())


# ---------------------------------------------------------------------------------------------
# Errors: a clear TypeError / ValueError naming the argument and the limit, on any GPU
# ---------------------------------------------------------------------------------------------

def _pair(cp, M=16, N=16, K=64, dtype="float16", lead=(2,)):
    return cp.ones(lead + (M, K), dtype=dtype), cp.ones(lead + (N, K), dtype=dtype)


def test_numpy_input(gpu):
    a, b = _pair(gpu)
    with pytest.raises(TypeError, match=r"a must be a cupy\.ndarray.*numpy\.ndarray"):
        H.gemm_abt(a.get(), b)


def test_wrong_dtypes(gpu):
    a, b = _pair(gpu)
    with pytest.raises(TypeError, match=r"b has dtype float32; this kernel takes float16, bfloat16"):
        H.gemm_abt(a, b.astype(gpu.float32))
    with pytest.raises(TypeError, match=r"a and b must share one dtype; got a float16 and b bfloat16"):
        H.gemm_abt(a, b.astype("bfloat16"))
    with pytest.raises(TypeError, match=r"out_dtype must be float32 or the inputs' dtype \(float16\); got float64"):
        H.gemm_abt(a, b, out_dtype="float64")
    with pytest.raises(TypeError, match=r"out_dtype must be float32 or the inputs' dtype \(float16\); got bfloat16"):
        H.gemm_abt(a, b, out_dtype="bfloat16")


def test_shape_errors(gpu):
    cp = gpu
    a, b = _pair(cp)
    with pytest.raises(ValueError, match=r"K=12 must be a multiple of 8"):
        H.gemm_abt(*_pair(cp, K=12))
    with pytest.raises(ValueError, match=r"must agree on K"):
        H.gemm_abt(a, cp.ones((2, 16, 72), dtype="float16"))
    with pytest.raises(ValueError, match=r"must agree on their leading \(batch\) dimensions"):
        H.gemm_abt(a, cp.ones((3, 16, 64), dtype="float16"))
    with pytest.raises(ValueError, match=r"a must have at least 2 dimensions"):
        H.gemm_abt(cp.ones(64, dtype="float16"), b)
    with pytest.raises(ValueError, match=r"every dimension must be >= 1"):
        H.gemm_abt(*_pair(cp, M=0))
    with pytest.raises(ValueError, match=r"every dimension must be >= 1"):
        H.gemm_abt(*_pair(cp, lead=(0,)))


def test_layout_errors(gpu):
    cp = gpu
    a, b = _pair(cp, K=128)
    with pytest.raises(ValueError, match=r"b must be C-contiguous.*strides"):
        H.gemm_abt(a[..., :64].copy(), b[..., ::2])
    flat = cp.ones(2 * 16 * 64 + 8, dtype="float16")
    shifted = flat[1:1 + 2 * 16 * 64].reshape(2, 16, 64)  # contiguous, but 2 bytes past a 16-byte boundary
    with pytest.raises(ValueError, match=r"a starts at address .* not 16-byte aligned"):
        H.gemm_abt(shifted, b[..., :64].copy())


@pytest.mark.parametrize("cc", [(8, 0), (8, 9)])
def test_pre_hopper_gpu_gets_a_clear_error(gpu, monkeypatch, cc):
    dev = core.current_device()
    monkeypatch.setitem(core.device._DEVICE_INFO, dev, dataclasses.replace(core.device_info(dev), cc=cc))
    with pytest.raises(kernels.UnsupportedDeviceError, match=rf"compute capability >= 9\.0.* has {cc[0]}\.{cc[1]}"):
        H.gemm_abt(*_pair(gpu))


def test_post_hopper_gpu_gets_a_clear_error(gpu, monkeypatch):
    """An sm_90a CUBIN does not load on Blackwell (10.x, 12.x): say so rather than fail inside the driver."""
    dev = core.current_device()
    monkeypatch.setitem(core.device._DEVICE_INFO, dev, dataclasses.replace(core.device_info(dev), cc=(10, 0)))
    with pytest.raises(kernels.UnsupportedDeviceError, match=r"sm_90a .* compute capability 9\.x only.* has 10\.0"):
        H.gemm_abt(*_pair(gpu))


def test_this_gpu_if_not_hopper(gpu):
    cc = kernels.device_compute_capability()
    if cc[0] == 9:
        pytest.skip("this GPU is a Hopper: the products above run")
    with pytest.raises(kernels.UnsupportedDeviceError, match=rf"has {cc[0]}\.{cc[1]}"):
        H.gemm_abt(*_pair(gpu))
