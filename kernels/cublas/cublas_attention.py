"""Attention through cuBLAS: S = Q K^T and O = P V as strided batched GEMMs (llm.c v3 and v4).

    o = forward(q, k, v, causal=True)                 # v4: GEMM, fused scale + causal softmax, GEMM
    o = forward(q, k, v, causal=True, tf32=True)      # both GEMMs on TF32 tensor cores (llm.c's setting)
    o = forward(q, k, v, tf32=True, tf32_scores=False)  # TF32 for O = P V only (the registered "cublas_tf32")
    o = forward_v3(q, k, v, causal=True)              # v3: GEMM, scale + mask pass, plain softmax, GEMM
    q, k, v = fused_qkv_projection(x, wq, wk, wv)     # three projections in one batched GEMM (FasterTransformer)

q is (B, H, Tq, d), k and v are (B, H, Tk, d), float32, C-contiguous CuPy arrays. The (B, H, Tq, Tk)
score matrix S and the probabilities P go through global memory (2 * 4 * B*H*Tq*Tk bytes of scratch):
that traffic, not the GEMMs, is what FlashAttention removes.

Row-major tensors on a column-major library
    cuBLAS reads a matrix column by column. A row-major (R, C) matrix with leading dimension C is, to
    cuBLAS, the column-major (C, R) matrix: its transpose. So instead of C = A B we ask for C^T = B^T A^T:
      S (Tq, Tk) = Q K^T    ->  S^T (Tk, Tq) = K Q^T : transa = T (K is stored as K^T), transb = N,
                                m = Tk, n = Tq, k = d, lda = d, ldb = d, ldc = Tk
      O (Tq, d)  = P V      ->  O^T (d, Tq)  = V^T P^T: transa = N, transb = N,
                                m = d,  n = Tq, k = Tk, lda = d, ldb = Tk, ldc = d
    and each (b, h) matrix lies a fixed stride after the previous one (T*d or Tq*Tk floats), so one
    cublasGemmStridedBatchedEx call does all B*H of them.

TF32
    The GEMMs use cublasGemmStridedBatchedEx with compute type CUBLAS_COMPUTE_32F (float32 FMA on CUDA
    cores, held to 1e-5) or CUBLAS_COMPUTE_32F_FAST_TF32 (inputs rounded to a 10-bit mantissa on tensor
    cores, float32 accumulation: held to 2e-3). The handle's math mode is set to CUBLAS_DEFAULT_MATH around
    each call (and restored), so CUPY_TF32=1 in the environment cannot turn the float32 path into TF32.

    TF32 in S = Q K^T costs far more accuracy than TF32 in O = P V: rounding q and k to 10 mantissa bits
    gives each logit an absolute error proportional to |q| |k|, and the softmax turns an absolute logit
    error into a relative error of the weights. With inputs of standard deviation 10 (logits ~100) that
    breaks the 2e-3 bar (the measured errors: kernels/cublas/README.md). P lies in [0, 1], so
    TF32 in P V only costs its ~2^-11 relative rounding. Hence `tf32_scores`: the registered "cublas_tf32"
    variant runs P V on TF32 and keeps Q K^T in float32; tf32=True alone puts both on TF32, as llm.c does.
"""

from __future__ import annotations

import functools

import numpy as np

from ..core import (DEFAULT_MIN_CC, INT32_MAX, T4_CC, ceil_div, check_array, cp, current_device, get_kernel, require_gpu,
                    validate_attention)
from ..core.registry import Variant, register
from ..basics.softmax import scaled_causal_softmax, softmax

KERNEL_FILE = "cublas_attention.cu"
MAX_D = 1024  # cuBLAS takes any d; the bound only keeps the registry's test grid finite
SCALE_BLOCK = 256  # threads per block of scale_causal_mask
SCALE_MAX_GRID = 65536  # the kernel loops grid-stride beyond this many blocks
V3_SOFTMAX_BLOCK = 64  # threads per row of v3's softmax (the sweep that chose it: kernels/cublas/README.md)

# Numeric values from cublas_api.h and library_types.h (CUDA 11-13). Used only where this CuPy build
# does not export the name: CuPy 14 exports all of them except CUBLAS_TF32_TENSOR_OP_MATH (see
# constants_source(), printed by notebook 05).
_FALLBACK_CONSTANTS = {
    "CUBLAS_OP_N": 0,
    "CUBLAS_OP_T": 1,
    "CUBLAS_COMPUTE_32F": 68,
    "CUBLAS_COMPUTE_32F_FAST_TF32": 77,
    "CUBLAS_GEMM_DEFAULT": -1,
    "CUBLAS_DEFAULT_MATH": 0,
    "CUBLAS_TF32_TENSOR_OP_MATH": 3,
    "CUBLAS_POINTER_MODE_HOST": 0,
}
CUDA_R_32F = 0  # cudaDataType_t of float32 (library_types.h)
# cudaDataType_t of each array dtype a GEMM here accepts (library_types.h): float16 and bfloat16 run on tensor
# cores with float32 accumulation (kernels/cublas/cublas_half.py).
CUDA_DATA_TYPES = {"float32": CUDA_R_32F, "float16": 2, "bfloat16": 14}


def _cublas():
    """CuPy's cuBLAS bindings, imported on first use (they load libcublas, which a CPU machine lacks)."""
    require_gpu()
    from cupy_backends.cuda.libs import cublas

    return cublas


@functools.lru_cache(maxsize=None)
def cublas_constant(name: str) -> int:
    """The value of a cuBLAS enum constant: CuPy's if it exports the name, else cublas_api.h's (looked up once)."""
    return int(getattr(_cublas(), name, _FALLBACK_CONSTANTS[name]))


def constants_source() -> dict:
    """{name: "cupy" or "cublas_api.h fallback"}, to show which constants this CuPy build exports."""
    lib = _cublas()
    return {n: ("cupy" if hasattr(lib, n) else "cublas_api.h fallback") for n in _FALLBACK_CONSTANTS}


_HANDLES: dict = {}  # (device id, math mode name) -> a cuBLAS handle of this module's own


def _cublas_handle(math_mode_name: str = "CUBLAS_DEFAULT_MATH"):
    """(CuPy's cuBLAS bindings, a cuBLAS handle) for the current device and math mode, bound to the current stream.

    The handles are this module's own, one per device and math mode, made on first use with host pointer mode (alpha
    and beta are host scalars) and the math mode already set. So a GEMM sets no mode on its way (only the stream a
    handle works on), and CuPy's own handle stays as CuPy configured it.
    """
    dev = current_device()
    lib = _cublas()
    handle = _HANDLES.get((dev, math_mode_name))
    if handle is None:
        handle = lib.create()  # on the current device
        lib.setPointerMode(handle, cublas_constant("CUBLAS_POINTER_MODE_HOST"))
        lib.setMathMode(handle, cublas_constant(math_mode_name))
        _HANDLES[(dev, math_mode_name)] = handle
    lib.setStream(handle, cp.cuda.get_current_stream().ptr)
    return lib, handle


_HOST_SCALARS: dict = {}  # value -> (float32 NumPy array, its address): GEMM scalars, made once per value


def _host_scalar(value: float) -> int:
    """The address of a float32 holding `value`, for cuBLAS's host pointer mode (kept alive in _HOST_SCALARS)."""
    entry = _HOST_SCALARS.get(value)
    if entry is None:
        if len(_HOST_SCALARS) > 1024:
            _HOST_SCALARS.clear()
        a = np.array(value, dtype=np.float32)
        entry = _HOST_SCALARS[value] = (a, a.ctypes.data)
    return entry[1]


def gemm_strided_batched(transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB,
                         beta, C, ldc, strideC, batch, tf32):
    """Column-major C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch, with float32 accumulation.

    The cudaDataType_t of A, B and C comes from the arrays' dtypes (CUDA_DATA_TYPES): float32 in and out
    here; 16-bit A and B with a float32 or 16-bit C in kernels/cublas/cublas_half.py. alpha and beta are float32.
    """
    if A.dtype != B.dtype:
        raise TypeError(f"GEMM operands A ({A.dtype}) and B ({B.dtype}) must share one dtype")
    ab_type, c_type = CUDA_DATA_TYPES[A.dtype.name], CUDA_DATA_TYPES[C.dtype.name]
    if tf32 and ab_type != CUDA_R_32F:
        raise ValueError(f"TF32 applies to float32 operands only; got {A.dtype}")
    for name, val in (("m", m), ("n", n), ("k", k), ("batch", batch)):
        if val > INT32_MAX:
            raise ValueError(f"GEMM dimension {name}={val} exceeds cuBLAS's 32-bit limit ({INT32_MAX})")
    compute = cublas_constant("CUBLAS_COMPUTE_32F_FAST_TF32" if tf32 else "CUBLAS_COMPUTE_32F")
    lib, handle = _cublas_handle()
    lib.gemmStridedBatchedEx(
        handle, cublas_constant(transa), cublas_constant(transb), m, n, k,
        _host_scalar(alpha), A.data.ptr, ab_type, lda, strideA,  # alpha, beta: host scalars
        B.data.ptr, ab_type, ldb, strideB,
        _host_scalar(beta), C.data.ptr, c_type, ldc, strideC,
        batch, compute, cublas_constant("CUBLAS_GEMM_DEFAULT"))


def qk_gemm(q, k, s, alpha, tf32):
    """S[b,h] = alpha * Q[b,h] K[b,h]^T for every (b, h): row-major S = Q K^T is column-major S^T = K Q^T."""
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    gemm_strided_batched("CUBLAS_OP_T", "CUBLAS_OP_N", Tk, Tq, d, alpha,
                         k, d, Tk * d,      # A = K, stored (Tk, d) row-major = K^T column-major, op T
                         q, d, Tq * d,      # B = Q, stored (Tq, d) row-major = Q^T column-major
                         0.0, s, Tk, Tq * Tk,  # C = S^T column-major = S row-major
                         B * H, tf32)


def pv_gemm(p, v, o, tf32):
    """O[b,h] = P[b,h] V[b,h]: row-major O = P V is column-major O^T = V^T P^T."""
    B, H, Tq, Tk = p.shape
    d = v.shape[3]
    gemm_strided_batched("CUBLAS_OP_N", "CUBLAS_OP_N", d, Tq, Tk, 1.0,
                         v, d, Tk * d,      # A = V^T column-major (V row-major)
                         p, Tk, Tq * Tk,    # B = P^T column-major (P row-major)
                         0.0, o, d, Tq * d,  # C = O^T column-major = O row-major
                         B * H, tf32)


def check_scratch(nbytes: int, what: str) -> None:
    """Raise ValueError naming the bytes when `nbytes` more device memory cannot be found."""
    pool_free = cp.get_default_memory_pool().free_bytes()
    if nbytes <= pool_free:  # CuPy's pool already holds enough (the steady state of a benchmark loop)
        return
    free, total = cp.cuda.runtime.memGetInfo()
    available = free + pool_free
    if nbytes > available:
        raise ValueError(
            f"{what} needs {nbytes} bytes ({nbytes / 2**30:.2f} GiB) of scratch for the score matrix S, "
            f"the probabilities P and the output, but only {available} bytes ({available / 2**30:.2f} GiB) "
            f"of the GPU's {total} are free; use smaller B*H*Tq*Tk, or a FlashAttention kernel"
        )


def scratch_bytes(B: int, H: int, Tq: int, Tk: int, d: int) -> int:
    """Bytes this launcher allocates per call: S and P (B, H, Tq, Tk) and O (B, H, Tq, d), float32."""
    return 4 * (2 * B * H * Tq * Tk + B * H * Tq * d)


def scale_causal_mask(s, *, scale: float, causal: bool) -> None:
    """llm.c v3's separate pass, in place on S (B, H, Tq, Tk): s *= scale, hidden entries -> -inf."""
    check_array(s, "s", dtypes=("float32",), ndim=4)
    Tq, Tk = s.shape[2], s.shape[3]
    grid = min(ceil_div(s.size, SCALE_BLOCK), SCALE_MAX_GRID)
    get_kernel(KERNEL_FILE, "scale_causal_mask")(
        (grid,), (SCALE_BLOCK,), (s, np.int64(s.size), np.int32(Tq), np.int32(Tk), np.float32(scale),
                                   np.int32(bool(causal))))


def _attention(q, k, v, *, causal, scale, tf32_scores, tf32_values, fused, softmax_block, what):
    # TF32 tensor cores came with Ampere (8.0); the float32 path runs from 7.5 (a T4)
    min_cc = DEFAULT_MIN_CC if (tf32_scores or tf32_values) else T4_CC
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=("float32",), max_d=MAX_D, min_cc=min_cc,
                                                what=what, scale=scale)
    check_scratch(scratch_bytes(B, H, Tq, Tk, d), what)
    s = cp.empty((B, H, Tq, Tk), dtype=cp.float32)
    qk_gemm(q, k, s, 1.0, tf32_scores)                             # S = Q K^T (unscaled, as in llm.c)
    if fused:                                                      # v4: one pass, reads only visible keys
        p = scaled_causal_softmax(s, scale=scale, causal=causal)
    else:                                                          # v3: a scale + mask pass, then softmax
        scale_causal_mask(s, scale=scale, causal=causal)
        p = softmax(s, method="block", block_size=softmax_block)
    del s
    o = cp.empty((B, H, Tq, d), dtype=cp.float32)
    pv_gemm(p, v, o, tf32_values)                                  # O = P V
    return o


def _what(name, tf32, tf32_scores):
    parts = [gemm for gemm, on in (("Q K^T", tf32_scores), ("P V", tf32)) if on]
    return f"{name} (TF32 for {' and '.join(parts)})" if parts else name


def forward(q, k, v, *, causal=False, scale=None, tf32=False, tf32_scores=None):
    """llm.c v4: S = Q K^T (cuBLAS), P = softmax(scale * S) with the causal mask fused in, O = P V (cuBLAS).

    tf32 runs O = P V on TF32 tensor cores; tf32_scores runs S = Q K^T on them (None: the same as tf32).
    """
    tf32_scores = tf32 if tf32_scores is None else bool(tf32_scores)
    return _attention(q, k, v, causal=causal, scale=scale, tf32_scores=tf32_scores, tf32_values=bool(tf32),
                      fused=True, softmax_block=None, what=_what("cuBLAS attention", tf32, tf32_scores))


def forward_tf32(q, k, v, *, causal=False, scale=None):
    """The registered "cublas_tf32": O = P V on TF32 tensor cores, S = Q K^T in float32 (see the module doc)."""
    return forward(q, k, v, causal=causal, scale=scale, tf32=True, tf32_scores=False)


def forward_v3(q, k, v, *, causal=False, scale=None, tf32=False, tf32_scores=None, softmax_block=V3_SOFTMAX_BLOCK):
    """llm.c v3: S = Q K^T (cuBLAS), a separate scale + mask pass, a plain row softmax, O = P V (cuBLAS)."""
    tf32_scores = tf32 if tf32_scores is None else bool(tf32_scores)
    return _attention(q, k, v, causal=causal, scale=scale, tf32_scores=tf32_scores, tf32_values=bool(tf32),
                      fused=False, softmax_block=softmax_block, what=_what("cuBLAS attention v3", tf32, tf32_scores))


# ---------------------------------------------------------------------------------------------
# The QKV projection: three GEMMs that share their input, as one batched GEMM (FasterTransformer).
# ---------------------------------------------------------------------------------------------

_POINTER_ARRAYS: dict = {}  # (device, 9 pointers) -> device array of those pointers
_POINTER_CACHE_MAX = 256


def _device_pointer_array(ptrs):
    """A device array holding the given pointers (uint64), cached: it is 72 bytes, but each upload
    is a host-to-device copy, which would cost more than a small GEMM."""
    key = (cp.cuda.Device().id, *ptrs)
    arr = _POINTER_ARRAYS.get(key)
    if arr is None:
        if len(_POINTER_ARRAYS) >= _POINTER_CACHE_MAX:
            _POINTER_ARRAYS.clear()
        arr = cp.asarray(np.array(ptrs, dtype=np.uint64))
        _POINTER_ARRAYS[key] = arr
    return arr


def _validate_projection(x, weights, names):
    check_array(x, "x", dtypes=("float32",), ndim=2)
    N, C = x.shape
    for name, w in zip(names, weights):
        check_array(w, name, dtypes=("float32",), ndim=2)
        if w.shape[0] != C:
            raise ValueError(f"{name} has shape {w.shape}; its first dimension must equal x's C = {C} "
                             f"(x is {x.shape}, the projection computes x @ {name})")
    shapes = {w.shape for w in weights}
    if len(shapes) != 1:
        raise ValueError(f"{', '.join(names)} must share one shape for a batched GEMM; got "
                         f"{', '.join(str(w.shape) for w in weights)}")
    Co = weights[0].shape[1]
    if min(N, C, Co) < 1:
        raise ValueError(f"x {x.shape} and the weights {weights[0].shape} must have every dimension >= 1")
    for name, val in (("N", N), ("C", C), ("C_out", Co)):
        if val > INT32_MAX:
            raise ValueError(f"{name}={val} exceeds cuBLAS's 32-bit limit ({INT32_MAX})")
    return N, C, Co


def linear(x, w, *, tf32=False):
    """y = x @ w with one cuBLAS sgemm: x (N, C), w (C, C_out) float32 -> y (N, C_out).

    Row-major y = x w is column-major y^T = w^T x^T: transa = transb = N, m = C_out, n = N, k = C.
    """
    N, C, Co = _validate_projection(x, (w,), ("w",))
    y = cp.empty((N, Co), dtype=cp.float32)
    lib, handle = _cublas_handle("CUBLAS_TF32_TENSOR_OP_MATH" if tf32 else "CUBLAS_DEFAULT_MATH")
    n_op = cublas_constant("CUBLAS_OP_N")
    lib.sgemm(handle, n_op, n_op, Co, N, C, _host_scalar(1.0), w.data.ptr, Co, x.data.ptr, C,
              _host_scalar(0.0), y.data.ptr, Co)
    return y


def separate_qkv_projection(x, wq, wk, wv, *, tf32=False):
    """q, k, v = x @ wq, x @ wk, x @ wv as three GEMM launches (the baseline for the fused one)."""
    _validate_projection(x, (wq, wk, wv), ("wq", "wk", "wv"))
    return linear(x, wq, tf32=tf32), linear(x, wk, tf32=tf32), linear(x, wv, tf32=tf32)


def fused_qkv_projection(x, wq, wk, wv, *, tf32=False):
    """q, k, v = x @ wq, x @ wk, x @ wv in ONE cublasSgemmBatched call over device pointer arrays.

    x is (N, C) and wq, wk, wv are (C, C_out), float32; q, k, v come back as (N, C_out) views of one
    (3, N, C_out) buffer. The batch is three GEMMs whose A pointers are the three weights, whose B pointers
    all point at x, and whose C pointers are the three outputs: the pointer arrays must live in device
    memory. (FasterTransformer calls cublasGemmBatchedEx; CuPy's bindings have no gemmBatchedEx, and for
    float32 cublasSgemmBatched is the same call. TF32 is chosen through the handle's math mode.)
    """
    N, C, Co = _validate_projection(x, (wq, wk, wv), ("wq", "wk", "wv"))
    qkv = cp.empty((3, N, Co), dtype=cp.float32)
    outs = (qkv[0], qkv[1], qkv[2])
    ptrs = _device_pointer_array([w.data.ptr for w in (wq, wk, wv)]      # A_i = w_i^T column-major
                                 + [x.data.ptr] * 3                      # B_i = x^T column-major, shared
                                 + [o.data.ptr for o in outs])           # C_i = out_i^T column-major
    base, step = ptrs.data.ptr, 3 * ptrs.itemsize
    lib, handle = _cublas_handle("CUBLAS_TF32_TENSOR_OP_MATH" if tf32 else "CUBLAS_DEFAULT_MATH")
    n_op = cublas_constant("CUBLAS_OP_N")
    lib.sgemmBatched(handle, n_op, n_op, Co, N, C, _host_scalar(1.0),
                     base, Co,             # Aarray: wq, wk, wv
                     base + step, C,       # Barray: x, x, x
                     _host_scalar(0.0),
                     base + 2 * step, Co,  # Carray: q, k, v
                     3)
    return outs


def register_cublas(name: str, forward, dtypes: tuple, notebook: str, description: str, precision=None,
                    min_cc=DEFAULT_MIN_CC) -> None:
    """Register a cuBLAS attention variant (any head size up to MAX_D) for the module that defines `forward`."""
    register(Variant(name, forward, dtypes, notebook, MAX_D, precision=precision, min_cc=min_cc,
                     description=description))


register_cublas("cublas_fp32", forward, ("float32",), "05_cublas_attention", precision="float32", min_cc=T4_CC,
                description="cuBLAS strided batched GEMMs + fused scale/causal softmax (llm.c v4), float32 compute")
register_cublas("cublas_tf32", forward_tf32, ("float32",), "05_cublas_attention", precision="tf32",
                description="llm.c v4 with O = P V on TF32 tensor cores (S = Q K^T stays float32: TF32 logits fail 2e-3)")
