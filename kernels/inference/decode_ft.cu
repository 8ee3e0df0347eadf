// decode_ft.cu -- decoding attention the FasterTransformer way: one block per query row walks the whole KV cache.
//
// What it computes
//   For query row i of head hq of sequence b: o = softmax(scale * q K^T) V over the sequence's own L_b keys, with
//   bottom-right causal masking (query i sees key j when j <= i + L_b - Tq), and lse = log sum exp (natural log).
//   K and V are read from KV head hq / G (G = Hq / Hkv, grouped-query attention). float32, float16 or bfloat16 in
//   and out; float32 arithmetic. A row that sees no key gives o = 0 and lse = -inf. reference/decode.py is the
//   float64 statement of the same contract.
//
// The design (NVIDIA FasterTransformer's "masked multi-head attention" decoder kernel, rewritten for this course)
//   One block per query row; NTHREADS threads; three passes over the row's n = min(L_b, i + L_b - Tq + 1) keys:
//     1. keys:    TPK threads share one key; each keeps its share of q (16-byte chunks, times scale * log2(e)) in
//                 registers, loads the same chunks of the key (16-byte loads, K_UNROLL keys at a time so that
//                 several loads are in flight), multiplies and adds in float32, and the TPK partial sums meet in a
//                 butterfly of warp shuffles. The logit of key t goes to shared memory: logits[t].
//     2. softmax: block-wide max of the logits (warp shuffles, then shared memory), p = 2^(logit - max) in place,
//                 block-wide sum l.
//     3. values:  TPV = D / X threads share one value row (one 16-byte chunk each); the NTHREADS / TPV value groups
//                 take every (NTHREADS / TPV)-th key, V_UNROLL at a time, and accumulate p * v in float32; the
//                 groups' sums meet in shared memory; o = sum / l.
//
// Key-cache layouts (the template argument FT_LAYOUT)
//   plain (false)  k (B, Hkv, Tmax, D): a key is one contiguous row of D elements.
//   FT    (true)   k (B, Hkv, D / X, Tmax, X), X = 16 bytes / element size (8 for 16-bit, 4 for float32): the key
//                  is cut into 16-byte chunks along D, and chunk c of ALL keys is stored contiguously. Pass 1 reads
//                  one chunk of GPW = 32 / TPK consecutive keys in one warp instruction: in the FT layout those are
//                  GPW * 16 adjacent bytes, in the plain layout GPW pieces of TPK * 16 bytes, D * size bytes apart.
//                  With TPK = 1 (one thread per key, FasterTransformer's choice for long caches) the plain layout
//                  touches 32 separate 16-byte pieces per instruction, each in a different 32-byte sector, half of
//                  which the instruction does not use; the FT layout reads 512 adjacent bytes. notebooks/08 counts
//                  the sectors and times both.
//   v is always plain (B, Hkv, Tmax, D): pass 3 already reads whole rows. q, o (B, Hq, Tq, D); lse (B, Hq, Tq).
//
// Launch (kernels/inference/decode_ft.py)
//   grid = B * Hq * Tq blocks (1-D; block x is output row x of (B, Hq, Tq)), block = DECODE_FT_THREADS (128).
//   dynamic shared memory = ceil(4 * Tmax / 16) * 16 bytes (one float logit per key of the cache's capacity; above
//   48 KB: opt in); static shared memory: the reductions and (NTHREADS / TPV) * D floats for the value groups.
//
// Signature: decode_ft<D, DT, TPK, FT_LAYOUT>(q, k_cache, v_cache, seqlens, o, lse, Hq, Hkv, Tq, Tmax, scale_log2)
//   DT: DT_F32, DT_F16 or DT_BF16 (q, k, v and o of that type); seqlens: (B,) int32 lengths; Tmax: the caches'
//   capacity (their third dimension); lse nullptr: not written; scale_log2 = scale * log2(e) (scale usually
//   1 / sqrt(D)). Builds: TPK = 4 for every type and D; float16, D = 128 with TPK 1, 2, 8, 16 (notebook 08).
//
// Requires sm_80 for the bfloat16 builds (cvt.rn.bf16.f32); the float32 and float16 builds compile for sm_75.
// PTX header: ptx/common.cuh (copy kernels/ptx/ with this file).
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/inference/decode_ft.cu -o decode_ft.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80, name expressions:
//     "decode_ft<128, DT_F16, 4, false>" "decode_ft<128, DT_F16, 4, true>" "decode_ft<64, DT_BF16, 4, false>"
//     "decode_ft<128, DT_F32, 4, true>" "decode_ft<128, DT_F16, 1, true>"
//
// Limits (checked by the launcher): D in {64, 128}; TPK a power of two dividing D / X, at most 32; Tmax * 4 bytes of
// logits must fit in one block's shared memory (Tmax <= about 56000 on an H100). Contiguous caches only (no paging).
// Indices are never trusted: a length outside [0, Tmax] is clamped into it, so no input makes the kernel read or
// write out of bounds. q, k, v 16-byte aligned; element indices 64-bit.
// Numerics: float32 arithmetic throughout; exp2 (ex2.approx.ftz, relative error ~2^-22) with log2(e) folded into q;
// o rounded to the output type once, at the end.
// What comes next: decode_split.cu (split-KV: every SM busy at batch 1, each KV head read once under GQA, no limit on
// the cache length). Notes: kernels/inference/README.md.

#include "ptx/common.cuh"  // u16, u32, DEVICE, exp2_ftz

#define NEG_INF (-__int_as_float(0x7f800000))
#define FULL_MASK 0xffffffffu
#define LN2 0.6931471805599453f

// Threads per block; the launcher passes its own constant (-D), so its grid and this layout agree.
#ifndef DECODE_FT_THREADS
#define DECODE_FT_THREADS 128
#endif

enum : int {
    WARP_SIZE = 32,
    DT_F32 = 0,  // element types (the template argument DT)
    DT_F16 = 1,
    DT_BF16 = 2,
    V_UNROLL = 4,         // value rows per thread per step of pass 3
    LOADS_IN_FLIGHT = 8,  // pass 1 unrolls keys until each thread has this many 16-byte loads in flight
};

template <int DT>
struct Elem {  // the storage type of one element and how many fit in 16 bytes
    typedef u16 type;
    static constexpr int X = 8;
};
template <>
struct Elem<DT_F32> {
    typedef float type;
    static constexpr int X = 4;
};

DEVICE float half_to_float(u32 bits16) {
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(static_cast<u16>(bits16)));
    return f;
}

// One 16-byte chunk -> X floats, element e of the chunk in f[e].
template <int DT>
DEVICE void unpack(const uint4& raw, float (&f)[Elem<DT>::X]) {
    const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (DT == DT_F32) {
            f[i] = __uint_as_float(w[i]);
        } else if constexpr (DT == DT_F16) {
            f[2 * i] = half_to_float(w[i] & 0xffffu);
            f[2 * i + 1] = half_to_float(w[i] >> 16);
        } else {  // bfloat16 is the top half of a float32
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
}

template <int DT>
DEVICE void store(typename Elem<DT>::type* p, float x) {  // round to nearest even
    if constexpr (DT == DT_F32) {
        *p = x;
    } else if constexpr (DT == DT_F16) {
        u16 r;
        asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(r) : "f"(x));
        *p = r;
    } else {
        u16 r;
        asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(r) : "f"(x));
        *p = r;
    }
}

// Block-wide max (MAX) or sum of one value per thread; `scratch` holds one float per warp. Every thread gets the
// result. The leading __syncthreads lets a caller reuse `scratch` right after an earlier reduction, and makes the
// shared-memory writes every thread did before the call visible to all after it.
template <bool MAX>
DEVICE float block_reduce(float x, float* scratch) {
    constexpr int NWARPS = DECODE_FT_THREADS / WARP_SIZE;
#pragma unroll
    for (int off = WARP_SIZE / 2; off > 0; off /= 2) {
        const float y = __shfl_xor_sync(FULL_MASK, x, off);
        x = MAX ? fmaxf(x, y) : x + y;
    }
    __syncthreads();
    if (threadIdx.x % WARP_SIZE == 0) scratch[threadIdx.x / WARP_SIZE] = x;
    __syncthreads();
    x = scratch[0];
#pragma unroll
    for (int w = 1; w < NWARPS; ++w) x = MAX ? fmaxf(x, scratch[w]) : x + scratch[w];
    return x;
}

// ---------------------------------------------------------------------------------------------------------
// The kernel. D: head dimension; DT: element type; TPK: threads per key in pass 1; FT_LAYOUT: the key layout.
// ---------------------------------------------------------------------------------------------------------
template <int D, int DT, int TPK, bool FT_LAYOUT>
__global__ void __launch_bounds__(DECODE_FT_THREADS)
decode_ft(const typename Elem<DT>::type* __restrict__ q, const typename Elem<DT>::type* __restrict__ k_cache,
          const typename Elem<DT>::type* __restrict__ v_cache, const int* __restrict__ seqlens,
          typename Elem<DT>::type* __restrict__ o, float* __restrict__ lse, int Hq, int Hkv, int Tq, int Tmax,
          float scale_log2) {
    typedef typename Elem<DT>::type T;
    constexpr int NTHREADS = DECODE_FT_THREADS;
    constexpr int X = Elem<DT>::X;           // elements per 16-byte chunk
    constexpr int CHUNKS = D / X;            // chunks per key or value row
    constexpr int K_VECS = CHUNKS / TPK;     // chunks of a key per thread
    constexpr int GPW = WARP_SIZE / TPK;     // keys per warp per load
    constexpr int NGROUPS = NTHREADS / TPK;  // keys per block per load
    constexpr int K_UNROLL = K_VECS >= LOADS_IN_FLIGHT ? 1 : LOADS_IN_FLIGHT / K_VECS;  // keys per thread per step
    constexpr int TPV = CHUNKS;              // threads per value row
    constexpr int VGROUPS = NTHREADS / TPV;  // value rows per block per step
    static_assert(D == 64 || D == 128, "D must be 64 or 128");
    static_assert(TPK >= 1 && TPK <= WARP_SIZE && (TPK & (TPK - 1)) == 0 && CHUNKS % TPK == 0,
                  "TPK must be a power of two that divides the chunks of a key, at most a warp");
    static_assert(NTHREADS % WARP_SIZE == 0 && NTHREADS % TPV == 0 && TPV <= WARP_SIZE, "bad block layout");

    extern __shared__ __align__(16) float logits[];  // [Tmax]: the row's logits, then its probabilities
    __shared__ float red[NTHREADS / WARP_SIZE];
    __shared__ __align__(16) float vsum[VGROUPS][D];

    const int row = blockIdx.x;  // row of (B, Hq, Tq)
    const int i = row % Tq, hq = (row / Tq) % Hq, b = row / (Tq * Hq);
    const int hk = hq / (Hq / Hkv);
    const int L = min(max(seqlens[b], 0), Tmax);   // clamped: no length makes the kernel read past the cache
    const int n = min(max(L - Tq + 1 + i, 0), L);  // keys this row sees: 0 .. n-1
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const long long head = (long long)b * Hkv + hk;

    // ---- pass 1: logits. Thread (key group grp, lane-in-group c) owns chunks c, c + TPK, ... of q and of each key.
    const int c = lane % TPK, grp = lane / TPK;
    float qf[K_VECS][X];
    const uint4* q4 = reinterpret_cast<const uint4*>(q + (long long)row * D);
#pragma unroll
    for (int kv = 0; kv < K_VECS; ++kv) {
        unpack<DT>(__ldg(q4 + c + kv * TPK), qf[kv]);
#pragma unroll
        for (int e = 0; e < X; ++e) qf[kv][e] *= scale_log2;
    }
    float local_max = NEG_INF;
    // t0 steps over whole warps of keys, so the trip count is the same for every lane of a warp (the shuffles
    // below need the full warp); keys t >= n are loaded as zeros and not written.
    for (int t0 = warp * GPW; t0 < n; t0 += K_UNROLL * NGROUPS) {
        uint4 kr[K_UNROLL][K_VECS];
#pragma unroll
        for (int u = 0; u < K_UNROLL; ++u) {
            const int t = t0 + u * NGROUPS + grp;
            const int ts = t < n ? t : 0;  // a safe address for a key that is not there
#pragma unroll
            for (int kv = 0; kv < K_VECS; ++kv) {
                const int chunk = c + kv * TPK;
                const long long at = FT_LAYOUT ? ((head * CHUNKS + chunk) * Tmax + ts) * X
                                               : (head * Tmax + ts) * D + chunk * X;
                kr[u][kv] = t < n ? __ldg(reinterpret_cast<const uint4*>(k_cache + at)) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int u = 0; u < K_UNROLL; ++u) {
            const int t = t0 + u * NGROUPS + grp;
            float dot = 0.f;
#pragma unroll
            for (int kv = 0; kv < K_VECS; ++kv) {
                float kf[X];
                unpack<DT>(kr[u][kv], kf);
#pragma unroll
                for (int e = 0; e < X; ++e) dot = fmaf(qf[kv][e], kf[e], dot);
            }
#pragma unroll
            for (int off = TPK / 2; off > 0; off /= 2) dot += __shfl_xor_sync(FULL_MASK, dot, off);
            if (t < n) {
                local_max = fmaxf(local_max, dot);
                if (c == 0) logits[t] = dot;
            }
        }
    }

    // ---- pass 2: softmax over logits[0 .. n-1], in place (block_reduce's barriers publish pass 1's writes).
    const float mx = block_reduce<true>(local_max, red);
    const float base = mx == NEG_INF ? 0.f : mx;
    float local_sum = 0.f;
    for (int t = threadIdx.x; t < n; t += NTHREADS) {
        const float p = exp2_ftz(logits[t] - base);
        logits[t] = p;
        local_sum += p;
    }
    const float l = block_reduce<false>(local_sum, red);  // its barriers also publish the p's

    // ---- pass 3: o = sum_t p_t v_t. Thread (value group vg, chunk vc) sums keys vg, vg + VGROUPS, ...
    const int vc = threadIdx.x % TPV, vg = threadIdx.x / TPV;
    float acc[X];
#pragma unroll
    for (int e = 0; e < X; ++e) acc[e] = 0.f;
    const T* vh = v_cache + head * Tmax * D + vc * X;
    for (int t0 = vg; t0 < n; t0 += V_UNROLL * VGROUPS) {
        uint4 vr[V_UNROLL];
#pragma unroll
        for (int u = 0; u < V_UNROLL; ++u) {
            const int t = t0 + u * VGROUPS;
            vr[u] = t < n ? __ldg(reinterpret_cast<const uint4*>(vh + (long long)t * D)) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < V_UNROLL; ++u) {
            const int t = t0 + u * VGROUPS;
            const float p = t < n ? logits[t] : 0.f;
            float vf[X];
            unpack<DT>(vr[u], vf);
#pragma unroll
            for (int e = 0; e < X; ++e) acc[e] = fmaf(p, vf[e], acc[e]);
        }
    }
#pragma unroll
    for (int e = 0; e < X; ++e) vsum[vg][vc * X + e] = acc[e];
    __syncthreads();
    const float inv = l > 0.f ? 1.f / l : 0.f;
    for (int e = threadIdx.x; e < D; e += NTHREADS) {
        float s = 0.f;
#pragma unroll
        for (int g = 0; g < VGROUPS; ++g) s += vsum[g][e];
        store<DT>(o + (long long)row * D + e, s * inv);
    }
    if (lse != nullptr && threadIdx.x == 0) lse[row] = l > 0.f ? (mx + __log2f(l)) * LN2 : NEG_INF;
}

// ---- the launcher's builds (kernels/inference/decode_ft.py: BUILDS), instantiated so that `nvcc -c decode_ft.cu` alone yields
// real kernels; NVRTC instantiates them by name instead.
#ifndef __CUDACC_RTC__
#define DECODE_FT_INSTANTIATE(D, DT, TPK, FT)                                                                     \
    template __global__ void decode_ft<D, DT, TPK, FT>(const Elem<DT>::type*, const Elem<DT>::type*,              \
                                                       const Elem<DT>::type*, const int*, Elem<DT>::type*, float*, \
                                                       int, int, int, int, float);
#define DECODE_FT_LAYOUTS(D, DT, TPK) DECODE_FT_INSTANTIATE(D, DT, TPK, false) DECODE_FT_INSTANTIATE(D, DT, TPK, true)
// the defaults: TPK = 4 for every type and D
DECODE_FT_LAYOUTS(64, DT_F32, 4)
DECODE_FT_LAYOUTS(128, DT_F32, 4)
DECODE_FT_LAYOUTS(64, DT_F16, 4)
DECODE_FT_LAYOUTS(128, DT_F16, 4)
DECODE_FT_LAYOUTS(64, DT_BF16, 4)
DECODE_FT_LAYOUTS(128, DT_BF16, 4)
// the layout lesson of notebooks/08: float16, D = 128, one to sixteen threads per key
DECODE_FT_LAYOUTS(128, DT_F16, 1)
DECODE_FT_LAYOUTS(128, DT_F16, 2)
DECODE_FT_LAYOUTS(128, DT_F16, 8)
DECODE_FT_LAYOUTS(128, DT_F16, 16)
#endif
