"""Bad input gets a clear error naming the argument, the value and the limit (run on the GPU)."""

import numpy as np
import pytest

import kernels
from kernels import core
from kernels.basics import naive
from kernels.basics import softmax as S

VARIANTS_BY_NAME = kernels.tested_variants()  # REGISTRY and STAGING
VARIANTS = sorted(VARIANTS_BY_NAME)


def _qkv(cp, variant, B=1, H=2, T=16, d=32, dtype=None):
    dtype = dtype or variant.dtypes[0]
    rng = np.random.default_rng(0)
    return [cp.asarray(rng.standard_normal((B, H, T, d)).astype(dtype)) for _ in range(3)]


@pytest.mark.parametrize("name", VARIANTS)
def test_numpy_input_is_a_type_error(gpu, name):
    v = VARIANTS_BY_NAME[name]
    q, k, val = _qkv(gpu, v)
    with pytest.raises(TypeError, match=r"q must be a cupy\.ndarray.*numpy\.ndarray"):
        v.forward(q.get(), k, val)


@pytest.mark.parametrize("name", VARIANTS)
def test_wrong_dtype_is_a_type_error(gpu, name):
    v = VARIANTS_BY_NAME[name]
    q, k, val = _qkv(gpu, v, dtype=np.float64)
    with pytest.raises(TypeError, match=r"q has dtype float64; this kernel takes"):
        v.forward(q, k, val)


@pytest.mark.parametrize("name", VARIANTS)
def test_strided_view_is_rejected(gpu, name):
    v = VARIANTS_BY_NAME[name]
    q, k, val = _qkv(gpu, v, T=32)
    q16, v16 = q[:, :, :16].copy(), val[:, :, :16].copy()
    with pytest.raises(ValueError, match=r"k must be C-contiguous.*strides"):
        v.forward(q16, k[:, :, ::2], v16)


@pytest.mark.parametrize("name", VARIANTS)
def test_head_dim_over_the_limit(gpu, name):
    v = VARIANTS_BY_NAME[name]
    q, k, val = _qkv(gpu, v, d=v.max_d + 8)
    with pytest.raises(ValueError, match=rf"d={v.max_d + 8}.*d <= {v.max_d}"):
        v.forward(q, k, val)


@pytest.mark.parametrize("name", VARIANTS)
def test_shape_mismatch(gpu, name):
    v = VARIANTS_BY_NAME[name]
    q, k, val = _qkv(gpu, v)
    with pytest.raises(ValueError, match=r"k and v must have the same shape"):
        v.forward(q, k, val[:, :, :8].copy())
    with pytest.raises(ValueError, match=r"must be 4-D"):
        v.forward(q[0], k, val)


@pytest.mark.parametrize("name", VARIANTS)
def test_non_finite_scale(gpu, name):
    v = VARIANTS_BY_NAME[name]
    with pytest.raises(ValueError, match=r"scale must be a finite number; got nan"):
        v.forward(*_qkv(gpu, v), scale=float("nan"))


@pytest.mark.parametrize("name", VARIANTS)
def test_old_gpu_gets_a_clear_error(gpu, name, monkeypatch):
    import dataclasses

    v = VARIANTS_BY_NAME[name]
    dev = core.current_device()
    # 7.0: older than every variant's minimum (7.5 for those that run on a T4; tests/test_sm75_gpu.py checks 7.5)
    monkeypatch.setitem(core.device._DEVICE_INFO, dev, dataclasses.replace(core.device_info(dev), cc=(7, 0)))
    core.clear_launch_caches()  # a launch prepared by an earlier test was checked against the real GPU
    need = f"{v.min_cc[0]}.{v.min_cc[1]}"
    with pytest.raises(kernels.UnsupportedDeviceError, match=rf"compute capability >= {need}.* has 7\.0"):
        v.forward(*_qkv(gpu, v))


def test_shared_memory_over_the_device_limit(gpu, monkeypatch):
    import dataclasses

    dev = core.current_device()
    monkeypatch.setitem(core.device._DEVICE_INFO, dev, dataclasses.replace(core.device_info(dev), smem_optin=100 * 1024))
    with pytest.raises(ValueError, match=r"needs 200000 bytes of shared memory.*at most 102400"):
        core.check_shared_memory(200_000, "a test kernel")
    # a kernel configured on a GPU with less shared memory than its build needs says so at its first launch
    kern = core.Kernel("flash2_mma.cu", "flash2_mma_forward", shared_mem=200_000)
    with pytest.raises(ValueError, match=r"flash2_mma.cu:flash2_mma_forward needs 200000 bytes.*at most 102400"):
        kern((1,), (32,), ())


@pytest.mark.parametrize("kernel", ["dense", "variants", "varlen"])
def test_flash2_mma_tile_over_the_device_limit_names_d(gpu, monkeypatch, kernel):
    """A GPU that allows a block less shared memory than the D = 256 tile's 99 KB (96 KB here, faked): each flash2_mma
    launcher raises before it compiles or launches anything, naming d, its build, the tile and the limit."""
    import dataclasses

    from kernels.flash import flash2_mma

    cp = gpu
    dev = core.current_device()
    monkeypatch.setitem(core.device._DEVICE_INFO, dev, dataclasses.replace(core.device_info(dev), smem_optin=96 * 1024))
    core.clear_launch_caches()  # a launch prepared by an earlier test was checked against the real GPU
    x = cp.zeros((1, 2, 16, 200), dtype=cp.float16)
    packed = x[0].transpose(1, 0, 2).copy()  # (total, H, d)
    cu = cp.asarray(np.array([0, 16], np.int32))
    calls = {"dense": lambda: flash2_mma.forward(x, x, x, causal=True),
             "variants": lambda: flash2_mma.forward(x, x, x, window=(4, 0)),
             "varlen": lambda: flash2_mma.forward_varlen(packed, packed, packed, cu, cu, 16, 16)}
    with pytest.raises(ValueError, match=r"flash2_mma attention: head dimension d=200 runs on the D=256 build, "
                                         r"whose tile \(BC, NWARPS, MT, MIN_BLOCKS, ILP\) = \(32, 4, 1, 1, None\) "
                                         r"needs 101376 bytes of shared memory per block; this GPU allows at most "
                                         r"98304"):
        calls[kernel]()


def test_block_size_and_packed_layout_errors(gpu):
    cp = gpu
    q = cp.ones((1, 1, 4, 8), dtype=cp.float32)
    with pytest.raises(ValueError, match=r"block_size must be a multiple of 32 in \[32, 1024\]; got 100"):
        naive.forward(q, q, q, block_size=100)
    with pytest.raises(ValueError, match=r"last dimension \(24\) must be 3 \* NH \* head_size with NH=5"):
        naive.forward_packed(cp.ones((1, 4, 24), dtype=cp.float32), 5)


def test_softmax_errors(gpu):
    cp = gpu
    x = cp.ones((4, 8), dtype=cp.float32)
    with pytest.raises(ValueError, match=r"method must be one of"):
        S.softmax(x, method="fast")
    with pytest.raises(TypeError, match=r"x has dtype float16"):
        S.softmax(x.astype(cp.float16))
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 8\].*\[0, 9\]"):
        S.masked_softmax(x, cp.asarray(np.array([0, 1, 9, 2], np.int32)), check_lengths=True)
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 8\].*\[-1, 2\]"):
        S.masked_softmax(x, cp.asarray(np.array([0, 1, -1, 2], np.int32)), check_lengths=True)
    with pytest.raises(ValueError, match=r"lengths has 3 entries; x has 4 rows"):
        S.masked_softmax(x, cp.zeros(3, dtype=cp.int32))
    with pytest.raises(ValueError, match=r"out has shape"):
        S.softmax(x, out=cp.empty((4, 9), dtype=cp.float32))


def test_masked_softmax_clamps_bad_lengths_when_unchecked(gpu):
    """Without check_lengths the kernel clamps each length to [0, cols]: no fault, and the clamped answer."""
    cp = gpu
    import reference as R

    x = np.random.default_rng(3).standard_normal((4, 40)).astype(np.float32)
    lengths = np.array([-5, 7, 40, 10**6], np.int32)
    y = S.masked_softmax(cp.asarray(x), cp.asarray(lengths)).get()
    cp.cuda.Device().synchronize()
    for r, n in enumerate(np.clip(lengths, 0, 40)):
        want = np.zeros(40)
        if n:
            want[:n] = R.softmax_safe(x[r, :n].astype(np.float64))
        assert kernels.check(y[r], want).ok


def test_no_gpu_error_names_the_reason(monkeypatch):
    """A driver but no CuPy: the reason says to install CuPy."""
    monkeypatch.setattr(core.device, "_GPU_OK", False)
    monkeypatch.setattr(core.device, "cp", None)
    monkeypatch.setattr(core.device, "_driver_library_loads", lambda: True)
    with pytest.raises(kernels.GPUNotAvailableError, match="CuPy is not installed"):
        core.require_gpu()


def test_no_driver_is_named_before_cupy(monkeypatch):
    """Neither a driver nor CuPy: the reason is the driver, since installing CuPy would change nothing."""
    monkeypatch.setattr(core.device, "_GPU_OK", False)
    monkeypatch.setattr(core.device, "cp", None)
    monkeypatch.setattr(core.device, "_driver_library_loads", lambda: False)
    assert core.gpu_unavailable_reason().startswith("no NVIDIA driver / no GPU")


def test_no_driver_is_named_as_such(monkeypatch):
    """CuPy installed but no NVIDIA driver: the reason says so (not 'driver too old')."""
    monkeypatch.setattr(core.device, "_GPU_OK", False)
    monkeypatch.setattr(core.device, "cp", object())
    monkeypatch.setattr(core.device, "_driver_library_loads", lambda: False)
    assert core.gpu_unavailable_reason().startswith("no NVIDIA driver / no GPU")
