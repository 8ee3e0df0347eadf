// cublas_half.cu -- the three small kernels around two 16-bit cuBLAS GEMMs (llm.c's "v5" and "v6").
//
// What it computes (every tensor row-major and C-contiguous)
//   softmax_to_half<Out>       P[r, j] = exp(s*S[r, j] - m_r) / l_r for j < n_r and 0 for n_r <= j < Tk, where S is the
//                              float32 (B, H, Tq, Tk) matrix of raw dot products q.k that the first GEMM wrote, row
//                              r = (b*H + h)*Tq + i, s = scale, m_r and l_r the max and the sum over j < n_r. Causal:
//                              n_r = clamp(i + Tk - Tq + 1, 0, Tk) (bottom-right aligned: query i sees key j <= i + Tk
//                              - Tq); else n_r = Tk. A row with n_r = 0 is 0; entries j >= n_r of S are never read.
//   permute_qkv<In, Out, VEC>  inp (B, T, 3, NH, hs) -> q, k, v (B, NH, T, hs): q[b, h, t, e] = inp[b, t, 0, h, e],
//                              k and v from slots 1 and 2; In = float, Float16 or BFloat16, Out = Float16 or BFloat16.
//   unpermute<In, Out, VEC>    o (B, NH, T, hs) -> out (B, T, NH*hs): out[b, t, h*hs + e] = o[b, h, t, e]; In = Float16
//                              or BFloat16, Out = the same type or float.
//
// Algorithm
//   v5 (kernels/cublas/cublas_half.py): 1. permute_qkv; 2. cuBLAS S = Q K^T (16-bit in, float32 out);
//   3. softmax_to_half; 4. cuBLAS O = P V (16-bit in and out, float32 accumulation); 5. unpermute. v6 skips 1 and 5.
//   softmax_to_half, a warp per row (sketched above the kernel): 1. each lane loads its first CACHE_VEC4 groups of four
//   visible scores into registers, takes its own max m_L and exponentiates them once (groups past the cache are
//   folded in online); 2. the 32 (m_L, l_L) pairs are merged with shuffles into the row's (m, l); 3. cached weights
//   are written times 2^(m_L - m) / l, groups past the cache read again, hidden entries written as 0.
//
// Launch (1-D grids; no shared memory)
//   softmax_to_half:        block = BLOCK, a multiple of 32 (256 in the launcher); grid = ceil(B*H*Tq / (BLOCK / 32))
//   permute_qkv, unpermute: grid-stride loops, a thread per VEC consecutive elements of a head row; block = BLOCK
//                           (256 in the launcher), grid = min(ceil(B*NH*T*hs / VEC / BLOCK), 65536)
//
// Kernels (Out, In and VEC as above; VEC in {1, 2, 4, 8}; every size a length)
//   softmax_to_half<Out>(Out* p, const float* s, long long rows, int Tq, int Tk, float scale, int causal, int vec)
//       rows = B*H*Tq; scale in natural-log units (1/sqrt(d); the kernel folds log2(e) in); causal: 1 masks, 0 not;
//       vec = 1 reads S as float4 and writes P 8 bytes at a time: it needs Tk % 4 == 0 and 16-byte aligned s and p
//   permute_qkv<In, Out, VEC>(Out* q, Out* k, Out* v, const In* inp, int B, int T, int NH, int hs)
//   unpermute<In, Out, VEC>(Out* out, const In* o, int B, int T, int NH, int hs)
//       VEC elements per access: hs % VEC == 0 and every pointer aligned to VEC elements (the launcher takes VEC = 8,
//       16 bytes of 16-bit data, where it can, else 1)
//
// Minimum compute capability 7.5 for the float16 builds (below sm_80 pack2<false> is two cvt.rn.f16.f32), 8.0 for the
// bfloat16 ones (cvt.rn.bf16.f32, cvt.rn.bf16x2.f32): the launcher compiles one module per 16-bit type. Includes
// ptx/mma_sync.cuh (pack2<BF16>), which includes ptx/common.cuh. 16-bit values
// are carried as their bit patterns (Float16, BFloat16 below), so no CUDA header is needed.
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/cublas/cublas_half.cu -o cublas_half.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80, name expressions:
//     "softmax_to_half<Float16>" "softmax_to_half<BFloat16>"
//     "permute_qkv<float, Float16, 1>" "permute_qkv<float, Float16, 8>" "permute_qkv<float, BFloat16, 1>"
//     "permute_qkv<float, BFloat16, 8>" "permute_qkv<Float16, Float16, 1>" "permute_qkv<Float16, Float16, 8>"
//     "permute_qkv<BFloat16, BFloat16, 1>" "permute_qkv<BFloat16, BFloat16, 8>"
//     "unpermute<Float16, Float16, 1>" "unpermute<Float16, Float16, 8>" "unpermute<BFloat16, BFloat16, 1>"
//     "unpermute<BFloat16, BFloat16, 8>" "unpermute<Float16, float, 1>" "unpermute<Float16, float, 8>"
//     "unpermute<BFloat16, float, 1>" "unpermute<BFloat16, float, 8>"
//   For a T4: --gpu-architecture=sm_75 with the Float16 and float-to-Float16 name expressions only.
//
// Limits: element indices are 64-bit, so a tensor may exceed 2^31 elements; B, T, NH, hs, Tq and Tk each fit an int.
// Numerics: float32 arithmetic; exp2f with log2(e) folded into the scale; the max is subtracted before the exponential,
//   so large logits cannot overflow; conversions to 16 bits round to nearest even. S stays float32: a logit of 10
//   held in float16 is off by up to 2^-11 * 10 = 0.005 (bfloat16: 0.04), which the softmax turns into a relative
//   error of the weight; P lies in [0, 1], so 16 bits cost it only its own rounding (2^-11 or 2^-8).
// Notes (what was tried and measured, where the time goes): kernels/cublas/README.md

#include "ptx/mma_sync.cuh"

#define NEG_INF (-__int_as_float(0x7f800000))

constexpr int WARP_SIZE = 32;
constexpr unsigned FULL_MASK = 0xffffffffu;
constexpr float LOG2E = 1.4426950408889634f;

// 16-bit floating-point values, held as their bit patterns.
struct Float16 {
    u16 bits;
};
struct BFloat16 {
    u16 bits;
};

// One float32 -> 16 bits, rounded to nearest even: the one-value partner of ptx/mma_sync.cuh's pack2<BF16>.
template <bool BF16>
__device__ __forceinline__ u16 cvt_rn16(float f) {
    u16 r;
    if constexpr (BF16) {
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    } else {
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
    }
    return r;
}

// Num<T>: conversion of T to and from float32; for the 16-bit types, BF16 picks pack2<BF16> and cvt_rn16<BF16>.
template <typename T>
struct Num;

template <>
struct Num<float> {
    static __device__ __forceinline__ float to_float(float x) { return x; }
    static __device__ __forceinline__ float from_float(float x) { return x; }
};

template <>
struct Num<Float16> {
    static constexpr bool BF16 = false;
    static __device__ __forceinline__ float to_float(Float16 x) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
        return f;
    }
    static __device__ __forceinline__ Float16 from_float(float f) { return {cvt_rn16<false>(f)}; }
};

template <>
struct Num<BFloat16> {
    static constexpr bool BF16 = true;
    static __device__ __forceinline__ float to_float(BFloat16 x) {
        return __uint_as_float(static_cast<u32>(x.bits) << 16);  // bfloat16 is float32's upper half
    }
    static __device__ __forceinline__ BFloat16 from_float(float f) { return {cvt_rn16<true>(f)}; }
};

// Convert<Out, In>: a value of type In as type Out (through float32; a plain copy when the types agree).
template <typename Out, typename In>
struct Convert {
    static __device__ __forceinline__ Out run(In x) { return Num<Out>::from_float(Num<In>::to_float(x)); }
};
template <typename T>
struct Convert<T, T> {
    static __device__ __forceinline__ T run(T x) { return x; }
};

// N consecutive values of T, aligned so that one load or store moves them all (16 bytes for 8 x 16 bits).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
    T v[N];
};

// ---- 1. scaled, causal row softmax: float32 scores in, 16-bit probabilities out -------------------------

// A running softmax state over log2-scaled values: the largest value seen and the sum of 2^(value - m).
struct MaxSum {
    float m;
    float l;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
    const float m = fmaxf(a.m, b.m);
    if (m == NEG_INF) return {NEG_INF, 0.0f};
    return {m, a.l * exp2f(a.m - m) + b.l * exp2f(b.m - m)};  // exp2f(-inf) == 0 for an empty side
}

// Fold four values into the state with one rescale: five exp2f per four values instead of eight.
__device__ __forceinline__ MaxSum push4(MaxSum s, float4 t) {
    const float m = fmaxf(s.m, fmaxf(fmaxf(t.x, t.y), fmaxf(t.z, t.w)));
    if (m == NEG_INF) return s;  // all four masked and nothing seen yet
    return {m, s.l * exp2f(s.m - m) + ((exp2f(t.x - m) + exp2f(t.y - m)) + (exp2f(t.z - m) + exp2f(t.w - m)))};
}

__device__ __forceinline__ MaxSum warp_reduce(MaxSum s) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) {
        const MaxSum o = {__shfl_xor_sync(FULL_MASK, s.m, offset), __shfl_xor_sync(FULL_MASK, s.l, offset)};
        s = merge(s, o);
    }
    return s;
}

// Four scores j4*4 .. j4*4+3 times the log2-scale, -inf where j >= n_valid (those are never read).
__device__ __forceinline__ float4 load4(const float* x, int j4, int n_valid, float scale2, int vec) {
    const int j = 4 * j4;
    float4 t;
    if (vec && j + 4 <= n_valid) {
        t = reinterpret_cast<const float4*>(x)[j4];
        t.x *= scale2, t.y *= scale2, t.z *= scale2, t.w *= scale2;
    } else {
        t.x = j + 0 < n_valid ? x[j + 0] * scale2 : NEG_INF;
        t.y = j + 1 < n_valid ? x[j + 1] * scale2 : NEG_INF;
        t.z = j + 2 < n_valid ? x[j + 2] * scale2 : NEG_INF;
        t.w = j + 3 < n_valid ? x[j + 3] * scale2 : NEG_INF;
    }
    return t;
}

// 2^(x - m) * inv, with an empty row (m == -inf) giving 0 rather than NaN.
__device__ __forceinline__ float weight(float x, float m, float inv) {
    return m == NEG_INF ? 0.0f : exp2f(x - m) * inv;
}

// Store four weights at P[4*j4 ...]: one 8-byte streaming store on the vec path (Tk % 4 == 0, so the whole
// group lies in the row), else up to four 2-byte stores that stop at the end of the row.
template <typename Out>
__device__ __forceinline__ void store4(Out* y, int j4, float4 w, int Tk, int vec) {
    if (vec) {
        const uint2 packed = make_uint2(pack2<Num<Out>::BF16>(w.x, w.y), pack2<Num<Out>::BF16>(w.z, w.w));
        __stcs(reinterpret_cast<uint2*>(y) + j4, packed);  // P is not read again by this kernel
    } else {
        const int j = 4 * j4;
        const float ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int c = 0; c < 4; ++c)
            if (j + c < Tk) y[j + c] = Num<Out>::from_float(ws[c]);
    }
}

// Warp per row. Lane L handles the groups of four scores number L, L+32, L+64, ...; the first CACHE_VEC4
// of them stay in registers, so a row of up to 32 * 4 * CACHE_VEC4 = 1024 scores is read from memory once:
//
//   S row:  | lane0 4f | lane1 4f | ... | lane31 4f | lane0 4f | ... |  <- 512 contiguous bytes per warp step
//   P row:  | lane0 4h | lane1 4h | ... | lane31 4h | lane0 4h | ... |  <- 256 contiguous bytes per warp step
//
//   1. each lane loads its cached groups (visible scores only), takes its own max m_L and exponentiates them
//      once: cache = 2^(x - m_L), l_L = sum; groups beyond the cache are folded in online (read once here)
//   2. the 32 (m_L, l_L) pairs are merged with shuffles into the row's (m, l)
//   3. cached weights are written as cache * 2^(m_L - m) / l (one multiply each); groups beyond the cache
//      are read again (mostly from L2) and written as 2^(x - m) / l; hidden entries are written as 0.
constexpr int CACHE_VEC4 = 8;  // groups of four scores per lane kept in registers (32 registers)
static_assert(CACHE_VEC4 >= 1 && CACHE_VEC4 <= 16, "the register cache must stay small enough not to spill");

template <typename Out>
__global__ void softmax_to_half(Out* __restrict__ p, const float* __restrict__ s, long long rows, int Tq, int Tk,
                                float scale, int causal, int vec) {
    const int lane = threadIdx.x % WARP_SIZE;
    const long long row = (long long)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) return;  // a whole warp leaves together, so the shuffles below see 32 lanes
    const float* x = s + row * Tk;
    Out* y = p + row * Tk;
    int n_valid = Tk;
    if (causal) n_valid = min(max((int)(row % Tq) + Tk - Tq + 1, 0), Tk);
    const float scale2 = scale * LOG2E;  // 2^(scale2 * x) == e^(scale * x)
    const int valid4 = (n_valid + 3) / 4;  // groups of four holding at least one visible score
    const int all4 = (Tk + 3) / 4;

    // 1. cached groups: load, lane max, exponentiate once
    float4 cache[CACHE_VEC4];
    float m_lane = NEG_INF;
#pragma unroll
    for (int c = 0; c < CACHE_VEC4; ++c) {
        const int j4 = lane + c * WARP_SIZE;
        cache[c] = j4 < valid4 ? load4(x, j4, n_valid, scale2, vec) : make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
        m_lane = fmaxf(m_lane, fmaxf(fmaxf(cache[c].x, cache[c].y), fmaxf(cache[c].z, cache[c].w)));
    }
    float l_lane = 0.0f;
#pragma unroll
    for (int c = 0; c < CACHE_VEC4; ++c) {
        cache[c] = make_float4(weight(cache[c].x, m_lane, 1.0f), weight(cache[c].y, m_lane, 1.0f),
                               weight(cache[c].z, m_lane, 1.0f), weight(cache[c].w, m_lane, 1.0f));
        l_lane += (cache[c].x + cache[c].y) + (cache[c].z + cache[c].w);
    }
    MaxSum st = {m_lane, l_lane};
    for (int j4 = lane + CACHE_VEC4 * WARP_SIZE; j4 < valid4; j4 += WARP_SIZE)
        st = push4(st, load4(x, j4, n_valid, scale2, vec));

    // 2. the row's max and sum
    st = warp_reduce(st);
    const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
    const float factor = weight(m_lane, st.m, inv);  // 2^(m_L - m) / l; 0 for a lane (or row) that saw nothing

    // 3. write P
#pragma unroll
    for (int c = 0; c < CACHE_VEC4; ++c) {
        const int j4 = lane + c * WARP_SIZE;
        if (j4 < all4) {  // entries past valid4 hold 0 in the cache already
            const float4 e = cache[c];
            store4(y, j4, make_float4(e.x * factor, e.y * factor, e.z * factor, e.w * factor), Tk, vec);
        }
    }
    for (int j4 = lane + CACHE_VEC4 * WARP_SIZE; j4 < all4; j4 += WARP_SIZE) {
        float4 w = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (j4 < valid4) {
            const float4 t = load4(x, j4, n_valid, scale2, vec);
            w = make_float4(weight(t.x, st.m, inv), weight(t.y, st.m, inv), weight(t.z, st.m, inv),
                            weight(t.w, st.m, inv));
        }
        store4(y, j4, w, Tk, vec);
    }
}

// ---- 2. llm.c's permutes, for 16-bit (and float32 -> 16-bit) data -------------------------------------

// Both permutes number their threads in head-major order: idx = ((b*NH + h)*T + t)*chunks + c, chunk c holding
// elements c*VEC .. c*VEC + VEC-1 of the head row (b, h, t). split_head_major undoes that numbering.
struct HeadChunk {
    long long token;  // b*T + t: the token's row in the (B*T, ...) token-major layout
    int h, c;         // head, chunk
};

__device__ __forceinline__ HeadChunk split_head_major(long long idx, int chunks, int T, int NH) {
    const int c = (int)(idx % chunks);
    long long r = idx / chunks;
    const int t = (int)(r % T);
    r /= T;
    const int h = (int)(r % NH);
    const long long b = r / NH;
    return {b * T + t, h, c};
}

// inp (B, T, 3, NH, hs) -> q, k, v (B, NH, T, hs). Thread index = (b, h, t, chunk of VEC elements) in the
// order of the outputs, so writes are contiguous and each head row of hs elements is one contiguous read.
template <typename In, typename Out, int VEC>
__global__ void permute_qkv(Out* __restrict__ q, Out* __restrict__ k, Out* __restrict__ v,
                            const In* __restrict__ inp, int B, int T, int NH, int hs) {
    static_assert(VEC == 1 || VEC == 2 || VEC == 4 || VEC == 8, "VEC must be 1, 2, 4 or 8");
    const int chunks = hs / VEC;  // the launcher guarantees hs % VEC == 0
    const long long C = (long long)NH * hs;
    const long long total = (long long)B * NH * T * chunks;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const HeadChunk at = split_head_major(idx, chunks, T, NH);
        const long long src = at.token * 3 * C + (long long)at.h * hs + (long long)at.c * VEC;  // q part of the token
        const long long dst = idx * VEC;
        Out* outs[3] = {q, k, v};
#pragma unroll
        for (int part = 0; part < 3; ++part) {
            const Pack<In, VEC> a = *reinterpret_cast<const Pack<In, VEC>*>(inp + src + part * C);
            Pack<Out, VEC> o;
#pragma unroll
            for (int e = 0; e < VEC; ++e) o.v[e] = Convert<Out, In>::run(a.v[e]);
            *reinterpret_cast<Pack<Out, VEC>*>(outs[part] + dst) = o;
        }
    }
}

// o (B, NH, T, hs) -> out (B, T, NH*hs). Thread index in the order of the input: contiguous reads, and each
// head row lands as one contiguous run of hs elements in the output.
template <typename In, typename Out, int VEC>
__global__ void unpermute(Out* __restrict__ out, const In* __restrict__ o, int B, int T, int NH, int hs) {
    static_assert(VEC == 1 || VEC == 2 || VEC == 4 || VEC == 8, "VEC must be 1, 2, 4 or 8");
    const int chunks = hs / VEC;
    const long long total = (long long)B * NH * T * chunks;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const HeadChunk at = split_head_major(idx, chunks, T, NH);
        const long long dst = (at.token * NH + at.h) * (long long)hs + (long long)at.c * VEC;
        const Pack<In, VEC> a = *reinterpret_cast<const Pack<In, VEC>*>(o + idx * VEC);
        Pack<Out, VEC> y;
#pragma unroll
        for (int e = 0; e < VEC; ++e) y.v[e] = Convert<Out, In>::run(a.v[e]);
        *reinterpret_cast<Pack<Out, VEC>*>(out + dst) = y;
    }
}

// ---- the builds the launcher uses (kernels/cublas/cublas_half.py: NAME_EXPRESSIONS) ----------------------------
// Instantiated here too, so that `nvcc -c cublas_half.cu` compiles (and reports registers for) every kernel;
// NVRTC instantiates them by name instead.
#ifndef __CUDACC_RTC__
template __global__ void softmax_to_half<Float16>(Float16*, const float*, long long, int, int, float, int, int);
template __global__ void softmax_to_half<BFloat16>(BFloat16*, const float*, long long, int, int, float, int, int);

#define INSTANTIATE_PERMUTE(In, Out, VEC) \
    template __global__ void permute_qkv<In, Out, VEC>(Out*, Out*, Out*, const In*, int, int, int, int);
#define INSTANTIATE_UNPERMUTE(In, Out, VEC) \
    template __global__ void unpermute<In, Out, VEC>(Out*, const In*, int, int, int, int);

INSTANTIATE_PERMUTE(float, Float16, 1)
INSTANTIATE_PERMUTE(float, Float16, 8)
INSTANTIATE_PERMUTE(float, BFloat16, 1)
INSTANTIATE_PERMUTE(float, BFloat16, 8)
INSTANTIATE_PERMUTE(Float16, Float16, 1)
INSTANTIATE_PERMUTE(Float16, Float16, 8)
INSTANTIATE_PERMUTE(BFloat16, BFloat16, 1)
INSTANTIATE_PERMUTE(BFloat16, BFloat16, 8)
INSTANTIATE_UNPERMUTE(Float16, Float16, 1)
INSTANTIATE_UNPERMUTE(Float16, Float16, 8)
INSTANTIATE_UNPERMUTE(BFloat16, BFloat16, 1)
INSTANTIATE_UNPERMUTE(BFloat16, BFloat16, 8)
INSTANTIATE_UNPERMUTE(Float16, float, 1)
INSTANTIATE_UNPERMUTE(Float16, float, 8)
INSTANTIATE_UNPERMUTE(BFloat16, float, 1)
INSTANTIATE_UNPERMUTE(BFloat16, float, 8)
#endif
