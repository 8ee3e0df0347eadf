"""Attention through cuBLAS in 16 bits: float16/bfloat16 GEMMs on tensor cores (llm.c v5 and v6).

    o = forward(q, k, v, causal=True)              # q, k, v: (B, H, T, d) float16 or bfloat16 CuPy arrays
    out = attention_forward_v5(inp, NH)            # llm.c's packed (B, T, 3C): permute, attention, unpermute
    o = attention_forward_v6(q, k, v)              # llm.c v6: v5 without the permutes (q, k, v already split)
    p = softmax_half(s, scale=0.125, causal=True, dtype="float16")   # float32 scores -> 16-bit probabilities
    c = batched_matmul(a, b)                       # (batch, M, K) @ (batch, K, N) through cublasGemmStridedBatchedEx

The same three steps as kernels/cublas/cublas_attention.py (llm.c v4), with 16-bit storage:

    S = Q K^T    cublasGemmStridedBatchedEx, A/B float16 or bfloat16, C float32, CUBLAS_COMPUTE_32F
    P = softmax(scale * S, causal)    kernels/cublas/cublas_half.cu: softmax_to_half, float32 in, 16 bits out
    O = P V      cublasGemmStridedBatchedEx, A/B/C 16-bit, CUBLAS_COMPUTE_32F (float32 accumulation)

The row-major -> column-major mapping of both GEMMs is the one explained in kernels/cublas/cublas_attention.py;
its `qk_gemm` and `pv_gemm` are reused as they are (the data types come from the arrays' dtypes).

Why 16 bits is faster. Tensor cores multiply 16-bit inputs; with float32 inputs cuBLAS either runs FMA on
CUDA cores (67 TFLOP/s peak on an H100) or rounds to TF32. Halving the bytes of P also halves the traffic of
the softmax write and of the second GEMM's read, which dominate at long sequences.

Why S stays float32. llm.c's v5 writes S in 16 bits. A logit of 10 held in float16 is off by up to 0.005
(bfloat16: 0.04), and the softmax turns that absolute error into a relative error of each weight: with inputs
of std 10, 16-bit S fails the float16 and bfloat16 bars, while float32 S with only P and O rounded passes
both with room (the simulated errors: kernels/cublas/README.md). P lies in [0, 1], so storing it in 16 bits
costs only its relative rounding. The price: S costs 4 bytes per score instead of 2.

The cupy.matmul trap. For batched float16 operands cupy.matmul does not reach tensor-core speed, and CuPy 14.2
refuses bfloat16 matmul altogether ("data type 'E' not understood"), so the GEMMs here call cuBLAS directly.
kernels.bench.matmul_vs_gemmex measures the difference; where the time of each step goes is in notebook 06,
section 2, and kernels/cublas/README.md.

llm.c v6. llm.c's dev/cuda/attention_forward.cu runs v6 as v5 with the permute and unpermute kernels skipped
on the timed runs (they run only on the first, validated call): it measures attention as if the layers around
it already produced q, k, v in (B, NH, T, hs) 16-bit layout. attention_forward_v6 here takes exactly that.
"""

from __future__ import annotations

import numpy as np

from ..core import (BF16_MIN_CC, INT32_MAX, T4_CC, ceil_div, check_array, check_dtype_capability, cp, get_kernel,
                    require_gpu, validate_attention)
from .cublas_attention import MAX_D, check_scratch, gemm_strided_batched, pv_gemm, qk_gemm, register_cublas

KERNEL_FILE = "cublas_half.cu"
HALF_DTYPES = ("float16", "bfloat16")
SOFTMAX_BLOCK = 256  # threads per block of softmax_to_half: 8 rows (one warp each) per block
PERMUTE_BLOCK = 256  # threads per block of permute_qkv / unpermute
PERMUTE_MAX_GRID = 65536  # the permutes loop grid-stride beyond this many blocks
PERMUTE_VEC = 8  # elements per thread access when hs % 8 == 0 (16 bytes of 16-bit data)
MAX_GRID_X = 2**31 - 1

# The C++ type of each dtype in cublas_half.cu.
_CTYPE = {"float32": "float", "float16": "Float16", "bfloat16": "BFloat16"}
# (input, output) dtype pairs the permutes are built for: llm.c's v5 converts float32 activations on the way in
# and back on the way out; a network that is 16-bit throughout moves 16-bit values only.
_PERMUTE_PAIRS = (("float32", "float16"), ("float32", "bfloat16"), ("float16", "float16"), ("bfloat16", "bfloat16"))
_UNPERMUTE_PAIRS = (("float16", "float16"), ("bfloat16", "bfloat16"), ("float16", "float32"), ("bfloat16", "float32"))


def _softmax_expr(dtype: str) -> str:
    return f"softmax_to_half<{_CTYPE[dtype]}>"


def _permute_expr(kernel: str, src: str, dst: str, vec: int) -> str:
    return f"{kernel}<{_CTYPE[src]}, {_CTYPE[dst]}, {vec}>"


# The template instantiations of each 16-bit type, compiled together as one module (one NVRTC compile per type and
# process): the float16 module builds for 7.5 (a T4), the bfloat16 one needs 8.0 (cvt.rn.bf16.f32).
NAME_EXPRESSIONS = {
    half: tuple([_softmax_expr(half)]
                + [_permute_expr("permute_qkv", a, b, vec) for a, b in _PERMUTE_PAIRS if half in (a, b)
                   for vec in (1, PERMUTE_VEC)]
                + [_permute_expr("unpermute", a, b, vec) for a, b in _UNPERMUTE_PAIRS if half in (a, b)
                   for vec in (1, PERMUTE_VEC)])
    for half in HALF_DTYPES}
NVRTC_BUILDS = [(NAME_EXPRESSIONS[half], ()) for half in HALF_DTYPES]  # for tests/test_compile.py
SM75_BUILDS = [(NAME_EXPRESSIONS["float16"], ())]  # what a T4 builds (tests/test_sm75.py)


def _kernel(expr: str, half: str):
    """The Kernel `expr` of the module of the 16-bit type `half`; UnsupportedDeviceError for bfloat16 below 8.0."""
    if half == "bfloat16":
        check_dtype_capability(half, "cuBLAS 16-bit attention")
    return get_kernel(KERNEL_FILE, expr, name_expressions=NAME_EXPRESSIONS[half])


def half_dtype(dtype, name: str = "dtype") -> str:
    key = np.dtype(dtype).name
    if key not in HALF_DTYPES:
        raise TypeError(f"{name} must be float16 or bfloat16; got {key}")
    return key


def scratch_bytes(B: int, H: int, Tq: int, Tk: int, d: int) -> int:
    """Bytes forward() allocates: S (B, H, Tq, Tk) float32, P the same in 16 bits, O (B, H, Tq, d) 16-bit."""
    return (4 + 2) * B * H * Tq * Tk + 2 * B * H * Tq * d


# ---------------------------------------------------------------------------------------------
# The softmax between the GEMMs
# ---------------------------------------------------------------------------------------------

def softmax_half(s, *, scale: float, causal: bool = True, dtype="float16", out=None):
    """softmax(scale * s) over the last axis, causal mask fused in, as float16 or bfloat16.

    s is a float32 (..., Tq, Tk) CuPy array of raw scores q.k; query i sees key j when j <= i + Tk - Tq
    (with causal), entries it may not see are never read and come out 0, and a row that sees no key is 0.
    """
    require_gpu()
    check_array(s, "s", dtypes=("float32",))
    dtype = half_dtype(dtype)
    if s.ndim < 2 or s.size == 0:
        raise ValueError(f"s must be a non-empty (..., Tq, Tk) array; got shape {s.shape}")
    Tq, Tk = s.shape[-2], s.shape[-1]
    if Tk > INT32_MAX:
        raise ValueError(f"rows of Tk={Tk} scores exceed the 32-bit column index (<= {INT32_MAX})")
    rows = s.size // Tk
    if out is None:
        out = cp.empty(s.shape, dtype=dtype)
    else:
        check_array(out, "out", dtypes=(dtype,))
        if out.shape != s.shape:
            raise ValueError(f"out has shape {out.shape}; it must match s's {s.shape}")
    rows_per_block = SOFTMAX_BLOCK // 32
    grid = ceil_div(rows, rows_per_block)
    if grid > MAX_GRID_X:
        raise ValueError(f"{rows} rows need {grid} blocks; the grid allows at most {MAX_GRID_X}")
    vec = int(Tk % 4 == 0 and s.data.ptr % 16 == 0 and out.data.ptr % 16 == 0)
    _kernel(_softmax_expr(dtype), dtype)(
        (grid,), (SOFTMAX_BLOCK,),
        (out, s, np.int64(rows), np.int32(Tq), np.int32(Tk), np.float32(scale), np.int32(bool(causal)),
         np.int32(vec)))
    return out


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------

def forward(q, k, v, *, causal=False, scale=None):
    """softmax(scale q k^T) v with both GEMMs on 16-bit tensor cores (float32 accumulation).

    q (B, H, Tq, d), k and v (B, H, Tk, d): float16 or bfloat16, C-contiguous CuPy arrays. Returns o
    (B, H, Tq, d) in the same dtype. S is float32, P is the input dtype (see the module docstring).
    """
    what = "cuBLAS 16-bit attention"
    min_cc = BF16_MIN_CC if str(getattr(q, "dtype", "")) == "bfloat16" else T4_CC  # float16 runs on a T4
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=HALF_DTYPES, max_d=MAX_D, min_cc=min_cc, what=what,
                                                scale=scale)
    check_dtype_capability(q.dtype, what)
    check_scratch(scratch_bytes(B, H, Tq, Tk, d), what)
    s = cp.empty((B, H, Tq, Tk), dtype=cp.float32)
    qk_gemm(q, k, s, 1.0, False)                                     # S = Q K^T: 16-bit in, float32 out
    p = softmax_half(s, scale=scale, causal=causal, dtype=q.dtype)   # P: float32 math, 16-bit out
    del s
    o = cp.empty((B, H, Tq, d), dtype=q.dtype)
    pv_gemm(p, v, o, False)                                          # O = P V: 16-bit in and out
    return o


# ---------------------------------------------------------------------------------------------
# llm.c's layout: packed (B, T, 3C) activations
# ---------------------------------------------------------------------------------------------

def _permute_launch(expr, half, total_chunks, args):
    grid = max(1, min(ceil_div(total_chunks, PERMUTE_BLOCK), PERMUTE_MAX_GRID))
    _kernel(expr, half)((grid,), (PERMUTE_BLOCK,), args)


def _vec(hs, arrays):
    """PERMUTE_VEC when every head row splits into aligned groups of PERMUTE_VEC elements, else 1."""
    if hs % PERMUTE_VEC == 0 and all(a.data.ptr % (a.itemsize * PERMUTE_VEC) == 0 for a in arrays):
        return PERMUTE_VEC
    return 1


def permute_qkv(inp, NH, *, dtype=None):
    """llm.c's packed inp (B, T, 3C) -> q, k, v each (B, NH, T, C/NH) in 16 bits, on the GPU.

    inp is float32, float16 or bfloat16. dtype is the 16-bit output type: by default inp's own dtype; a
    float32 inp needs it (llm.c's v5 converts float32 activations here). q, k, v are views of one
    (3, B, NH, T, hs) buffer, like llm.c's qkvr.
    """
    check_array(inp, "inp", dtypes=("float32",) + HALF_DTYPES, ndim=3)
    src = inp.dtype.name
    if dtype is None:
        if src == "float32":
            raise ValueError("inp is float32: pass dtype='float16' or dtype='bfloat16' for q, k, v")
        dtype = src
    dtype = half_dtype(dtype)
    if src != "float32" and src != dtype:
        raise TypeError(f"inp has dtype {src} but dtype={dtype}; a 16-bit inp keeps its own dtype")
    B, T, C3 = inp.shape
    NH = int(NH)
    if NH < 1 or C3 % (3 * NH):
        raise ValueError(f"inp's last dimension ({C3}) must be 3 * NH * head_size with NH={NH}")
    if min(B, T, C3) < 1:
        raise ValueError(f"inp must have every dimension >= 1; got shape {inp.shape}")
    if max(B, T, C3) > INT32_MAX:
        raise ValueError(f"inp's dimensions {inp.shape} must each fit in 32 bits (<= {INT32_MAX})")
    hs = C3 // (3 * NH)
    qkv = cp.empty((3, B, NH, T, hs), dtype=dtype)
    q, k, v = qkv[0], qkv[1], qkv[2]
    vec = _vec(hs, (inp, q, k, v))
    _permute_launch(_permute_expr("permute_qkv", src, dtype, vec), dtype, B * NH * T * (hs // vec),
                    (q, k, v, inp, np.int32(B), np.int32(T), np.int32(NH), np.int32(hs)))
    return q, k, v


def unpermute(o, *, dtype=None):
    """(B, NH, T, hs) 16-bit -> (B, T, NH * hs), in o's dtype or in dtype="float32", on the GPU."""
    check_array(o, "o", dtypes=HALF_DTYPES, ndim=4)
    dst = o.dtype.name if dtype is None else np.dtype(dtype).name
    if dst not in (o.dtype.name, "float32"):
        raise TypeError(f"unpermute writes {o.dtype.name} or float32; got dtype={dst}")
    B, NH, T, hs = o.shape
    if o.size == 0:
        raise ValueError(f"o must have every dimension >= 1; got shape {o.shape}")
    out = cp.empty((B, T, NH * hs), dtype=dst)
    vec = _vec(hs, (o, out))
    _permute_launch(_permute_expr("unpermute", o.dtype.name, dst, vec), o.dtype.name, B * NH * T * (hs // vec),
                    (out, o, np.int32(B), np.int32(T), np.int32(NH), np.int32(hs)))
    return out


def attention_forward_v5(inp, NH, *, dtype=None):
    """llm.c v5: causal attention on packed inp (B, T, 3C) with 16-bit GEMMs; returns (B, T, C) in inp's dtype.

    permute (B, T, 3, NH, hs) -> q, k, v (B, NH, T, hs) in `dtype` -> forward(causal=True) -> unpermute.
    inp may be float32 (converted in the permutes, as llm.c does: then dtype names the 16-bit type) or
    float16/bfloat16.
    """
    q, k, v = permute_qkv(inp, NH, dtype=dtype)
    o = forward(q, k, v, causal=True)
    return unpermute(o, dtype=inp.dtype)


def attention_forward_v6(q, k, v):
    """llm.c v6: v5 without the permutes; q, k, v (B, NH, T, hs) 16-bit in, o (B, NH, T, hs) out, causal.

    llm.c times v6 as v5 with the permute and unpermute kernels skipped, i.e. the cost of attention when the
    surrounding layers already work in this layout. The difference v5 - v6 is what the permutes cost.
    """
    return forward(q, k, v, causal=True)


# ---------------------------------------------------------------------------------------------
# A batched 16-bit GEMM (kernels.bench.matmul_vs_gemmex compares it with cupy.matmul)
# ---------------------------------------------------------------------------------------------

def batched_matmul(a, b):
    """c[i] = a[i] @ b[i] for 16-bit a (batch, M, K) and b (batch, K, N), as one cublasGemmStridedBatchedEx
    with float32 accumulation; c is (batch, M, N) in a's dtype. Row-major c = a b is column-major c^T = b^T a^T.
    """
    check_array(a, "a", dtypes=HALF_DTYPES, ndim=3)
    check_array(b, "b", dtypes=(a.dtype.name,), ndim=3)
    batch, M, K = a.shape
    if b.shape[0] != batch or b.shape[1] != K:
        raise ValueError(f"a {a.shape} and b {b.shape} must be (batch, M, K) and (batch, K, N)")
    N = b.shape[2]
    c = cp.empty((batch, M, N), dtype=a.dtype)
    gemm_strided_batched("CUBLAS_OP_N", "CUBLAS_OP_N", N, M, K, 1.0,
                         b, N, K * N,       # A = b^T column-major (b row-major)
                         a, K, M * K,       # B = a^T column-major
                         0.0, c, N, M * N,  # C = c^T column-major = c row-major
                         batch, False)
    return c


register_cublas("cublas_fp16", forward, ("float16",), "06_fp16_tensor_cores", min_cc=T4_CC,
                description="llm.c v5/v6: float16 cuBLAS GEMMs on tensor cores (float32 S, float32 accumulation) + "
                            "fused softmax")
register_cublas("cublas_bf16", forward, ("bfloat16",), "06_fp16_tensor_cores", min_cc=BF16_MIN_CC,
                description="llm.c v5/v6 in bfloat16: cuBLAS GEMMs on tensor cores (float32 S, float32 accumulation) + "
                            "fused softmax")
