"""Launcher for kernels/hopper/hopper_gemm.cu: C = A B^T on Hopper with TMA and wgmma (float16/bfloat16 in, float32 sums).

    c = gemm_abt(a, b)                       # a (..., M, K), b (..., N, K) -> c (..., M, N) float32
    c = gemm_abt(a, b, out_dtype=a.dtype)    # the same product rounded to the inputs' 16-bit type
    s = gemm_abt(q, k)                       # attention's scores: q (B, H, Tq, d), k (B, H, Tk, d) -> (B, H, Tq, Tk)

a and b are C-contiguous CuPy arrays of one dtype (float16 or bfloat16) whose leading dimensions agree; every
leading index is one independent product. Any M, N >= 1 and any K >= 8 with K % 8 == 0 (TMA reads rows whose
stride is a multiple of 16 bytes); the kernel's tiles (BLOCK_M x BLOCK_N, BLOCK_K deep) need not divide them.

Needs a Hopper GPU (compute capability 9.x). wgmma, setmaxnreg and TMA exist only in the architecture-specific
target sm_90a, and CuPy's RawModule compiles for the current GPU's generic target (it adds its own -arch after the
caller's options), so the file is compiled with NVRTC for sm_90a to a CUBIN and loaded from it
(kernels.core.load_module(..., arch="sm_90a")); a CUBIN for sm_90a runs on compute capability 9.0 only.

The tensor maps. TMA copies a box of a tensor described by a CUtensorMap: 128 opaque bytes holding the base address,
sizes, strides, box size and swizzle mode, written on the host by the driver's cuTensorMapEncodeTiled (called here
through ctypes on libcuda, which every machine with an NVIDIA driver has). The kernel takes each map by value as a
`const __grid_constant__` parameter. CuPy passes a NumPy array of exactly one element by value (a pointer to its
bytes, which the driver copies into the kernel's parameter space), so each map is a one-element array of a 128-byte
void dtype, 64-byte aligned as the driver requires of a CUtensorMap.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

from ..core import (INT32_MAX, UnsupportedDeviceError, ceil_div, check_alignment, check_array,
                    check_compute_capability, cp, current_device, defines_from, device_info, dtype_set, get_kernel)

KERNEL_FILE = "hopper_gemm.cu"
WHAT = "hopper_gemm (wgmma + TMA)"
ARCH = "sm_90a"  # the architecture-specific target that has wgmma and setmaxnreg
MIN_CC = (9, 0)  # Hopper; an sm_90a CUBIN loads on compute capability 9.0 only (not on 10.x or 12.x)

# The tiling; handed to the kernel with -D (hopper_gemm.cu gives the same defaults and static_asserts them).
BLOCK_M = 128  # rows of C per tile: two consumer warpgroups of 64 rows
BLOCK_N = 256  # columns of C per tile: one wgmma m64n256k16 per warpgroup and k-step
BLOCK_K = 64  # 64 16-bit elements = 128 bytes = one row of the 128-byte swizzle
STAGES = 4  # slots of the shared-memory ring
DEFINES = defines_from(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, STAGES=STAGES)
THREADS = 128 * (1 + BLOCK_M // 64)  # producer warpgroup + consumer warpgroups
ELEM_BYTES = 2
SMEM_ALIGN = 1024  # the kernel aligns its ring to a swizzle atom, so it asks for this much slack
SMEM_BYTES = STAGES * (BLOCK_M + BLOCK_N) * BLOCK_K * ELEM_BYTES + SMEM_ALIGN  # 197632: SMEM_BYTES in the .cu
K_MULTIPLE = 8  # TMA: the row stride K * 2 bytes must be a multiple of 16
ALIGN = 16  # bytes: TMA needs 16-byte aligned base addresses
CARVEOUT_MAX_SHARED = 100

DTYPES = ("float16", "bfloat16")
DTYPE_SET = dtype_set(DTYPES)
KERNEL_NAMES = {  # (input dtype, output dtype) -> extern "C" entry point
    ("float16", "float32"): "hopper_gemm_f16_f32",
    ("bfloat16", "float32"): "hopper_gemm_bf16_f32",
    ("float16", "float16"): "hopper_gemm_f16_f16",
    ("bfloat16", "bfloat16"): "hopper_gemm_bf16_bf16",
}

# What tests/test_compile.py compiles with NVRTC for sm_80..sm_90 (where the kernels are stubs: the Hopper code is
# under #if __CUDA_ARCH_FEAT_SM90_ALL) and tests/test_hopper_compile.py for sm_90a.
NVRTC_BUILDS = [((), DEFINES)]

# cuda.h's enums (CUtensorMapDataType, ...), the values cuTensorMapEncodeTiled takes.
TENSOR_MAP_BYTES = 128  # sizeof(CUtensorMap)
TENSOR_MAP_ALIGN = 64  # the driver requires a CUtensorMap to be 64-byte aligned
CU_TENSOR_MAP_DATA_TYPE = {"float16": 6, "bfloat16": 9}  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16, _BFLOAT16
CU_TENSOR_MAP_INTERLEAVE_NONE = 0
CU_TENSOR_MAP_SWIZZLE_128B = 3  # 16-byte chunk c of row r lands at chunk c ^ (r % 8): what wgmma's mode 1 reads
CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3
CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0  # elements outside the tensor arrive as zeros
TMA_MAX_STRIDE = 2**40  # globalStrides[i] < 2^40 bytes
_TENSOR_MAP_DTYPE = np.dtype((np.void, TENSOR_MAP_BYTES))


def flops(batch: int, M: int, N: int, K: int) -> float:
    """2 * batch * M * N * K: a multiply and an add per term."""
    return 2.0 * batch * M * N * K


_ENCODE = None


def _encode_tiled():
    """The driver's cuTensorMapEncodeTiled, through ctypes (loaded once)."""
    global _ENCODE
    if _ENCODE is None:
        lib = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
        u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
        _ENCODE = fn
    return _ENCODE


_MAPS: dict = {}  # (address, batch, rows, K, dtype, box rows) -> the encoded map (the map names the address)


def tensor_map(x, batch: int, rows: int, K: int, box_rows: int) -> np.ndarray:
    """The CUtensorMap of x seen as a (batch, rows, K) row-major tensor, read in boxes of box_rows x BLOCK_K with the
    128-byte swizzle, as a one-element NumPy array of 128 bytes (what the kernel takes by value).

    TMA dimensions go innermost first: (K, rows, batch) with byte strides (2 K, 2 rows K). Batch is a dimension of its
    own so that a box that hangs over the last row of one batch entry reads zeros, not the next entry's rows.
    """
    key = (x.data.ptr, batch, rows, K, x.dtype.name, box_rows)
    m = _MAPS.get(key)
    if m is not None:
        return m
    raw = np.zeros(TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN, dtype=np.uint8)
    off = -raw.ctypes.data % TENSOR_MAP_ALIGN
    m = raw[off:off + TENSOR_MAP_BYTES].view(_TENSOR_MAP_DTYPE)  # one element, 64-byte aligned
    dims = (ctypes.c_uint64 * 3)(K, rows, batch)
    strides = (ctypes.c_uint64 * 2)(K * ELEM_BYTES, rows * K * ELEM_BYTES)
    box = (ctypes.c_uint32 * 3)(BLOCK_K, box_rows, 1)
    steps = (ctypes.c_uint32 * 3)(1, 1, 1)
    err = _encode_tiled()(m.ctypes.data, CU_TENSOR_MAP_DATA_TYPE[x.dtype.name], 3, x.data.ptr, dims, strides, box,
                          steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed with CUresult {err} for a ({batch}, {rows}, {K}) "
                           f"{x.dtype.name} tensor at {x.data.ptr:#x}, box ({box_rows}, {BLOCK_K})")
    if len(_MAPS) >= 256:
        _MAPS.clear()
    _MAPS[key] = m
    return m


LAUNCH_REGS = 65536 // THREADS // 8 * 8  # 168: the registers per thread __launch_bounds__(384, 1) leaves
_CHECKED: set = set()  # (kernel name, device) whose register count was checked


def kernel(in_dtype: str, out_dtype: str, dev: int | None = None):
    """The Kernel of one (input, output) dtype pair: compiled for sm_90a on its first use.

    The first time on each device its register count is checked: setmaxnreg moves registers between warpgroups inside
    the block's launch allocation (THREADS x LAUNCH_REGS), and the consumers' increase would wait forever if the build
    had been given fewer registers than that budget assumes."""
    name = KERNEL_NAMES[(in_dtype, out_dtype)]
    kern = get_kernel(KERNEL_FILE, name, defines=DEFINES, shared_mem=SMEM_BYTES, carveout=CARVEOUT_MAX_SHARED,
                      arch=ARCH)
    if (name, dev) not in _CHECKED and dev is not None:
        if kern.num_regs != LAUNCH_REGS:
            raise RuntimeError(f"{KERNEL_FILE}:{name} was built with {kern.num_regs} registers per thread; its "
                               f"setmaxnreg budget needs exactly {LAUNCH_REGS} (launching it could hang)")
        _CHECKED.add((name, dev))
    return kern


def check_hopper(dev: int | None = None) -> None:
    """UnsupportedDeviceError unless the GPU is a Hopper (compute capability 9.x), the only one that runs sm_90a."""
    check_compute_capability(MIN_CC, WHAT, dev)
    info = device_info(dev)
    if info.cc[0] != MIN_CC[0]:
        raise UnsupportedDeviceError(
            f"{WHAT} is built for sm_90a (wgmma, setmaxnreg), which runs on compute capability 9.x only; "
            f"this GPU ({info.name}) has {info.cc[0]}.{info.cc[1]}")


def gemm_abt(a, b, *, out_dtype="float32"):
    """c[..., i, j] = sum_k a[..., i, k] b[..., j, k] (C = A B^T for each leading index), float32 accumulation.

    a (..., M, K) and b (..., N, K): C-contiguous CuPy arrays, float16 or bfloat16, one dtype, equal leading
    dimensions. out_dtype: "float32" (default) or the inputs' dtype. Returns a new (..., M, N) array.
    """
    dev = current_device()
    check_array(a, "a", dtypes=DTYPE_SET, dev=dev)
    check_array(b, "b", dtypes=DTYPE_SET, dev=dev)
    if b.dtype != a.dtype:
        raise TypeError(f"a and b must share one dtype; got a {a.dtype} and b {b.dtype}")
    try:
        out = np.dtype(out_dtype)
    except TypeError:
        raise TypeError(f"out_dtype must be float32 or the inputs' dtype ({a.dtype}); got {out_dtype!r}") from None
    if (a.dtype.name, out.name) not in KERNEL_NAMES:
        raise TypeError(f"out_dtype must be float32 or the inputs' dtype ({a.dtype}); got {out.name}")
    for name, x, dims in (("a", a, "(..., M, K)"), ("b", b, "(..., N, K)")):
        if x.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions {dims}; got shape {x.shape}")
    if a.shape[:-2] != b.shape[:-2]:
        raise ValueError(f"a {a.shape} and b {b.shape} must agree on their leading (batch) dimensions")
    M, K = a.shape[-2:]
    N, Kb = b.shape[-2:]
    if Kb != K:
        raise ValueError(f"a {a.shape} and b {b.shape} must agree on K, their last dimension (C = A B^T)")
    batch = int(np.prod(a.shape[:-2], dtype=np.int64)) if a.ndim > 2 else 1
    if min(M, N, K, batch) < 1:
        raise ValueError(f"every dimension must be >= 1; got a {a.shape} and b {b.shape}")
    if K % K_MULTIPLE:
        raise ValueError(f"K={K} must be a multiple of {K_MULTIPLE} for {WHAT}: TMA reads rows whose stride "
                         f"(K * 2 bytes) is a multiple of 16 bytes")
    for name, val in (("M", M), ("N", N), ("K", K), ("batch", batch)):
        if val > INT32_MAX:
            raise ValueError(f"{name}={val} is more than {WHAT} supports ({name} <= {INT32_MAX}: 32-bit TMA "
                             f"coordinates)")
    if max(M, N) * K * ELEM_BYTES >= TMA_MAX_STRIDE:
        raise ValueError(f"one batch entry of a {a.shape} or b {b.shape} spans 2^40 bytes or more; a TMA tensor map "
                         f"takes strides below 2^40 bytes")
    tiles = batch * ceil_div(M, BLOCK_M) * ceil_div(N, BLOCK_N)
    if tiles > INT32_MAX:
        raise ValueError(f"{WHAT} would need {tiles} tiles of {BLOCK_M} x {BLOCK_N}; it counts them in 32 bits "
                         f"(<= {INT32_MAX})")
    check_alignment(WHAT, ALIGN, a=a, b=b)
    check_hopper(dev)

    c = cp.empty(a.shape[:-2] + (M, N), dtype=out)
    map_a = tensor_map(a, batch, M, K, BLOCK_M)
    map_b = tensor_map(b, batch, N, K, BLOCK_N)
    grid = min(tiles, device_info(dev).sm_count)  # persistent: one block per SM walks the tiles
    kernel(a.dtype.name, out.name, dev)((grid,), (THREADS,), (map_a, map_b, c, np.int32(M), np.int32(N), np.int32(K),
                                                              np.int32(batch)), shared_mem=SMEM_BYTES)
    return c
