// naive.cu -- attention as three plain kernels, one thread per output element (llm.c's "v1" design).
//
// What it computes
//   O = softmax(scale * Q K^T [+ causal mask]) V for Q (B, H, Tq, d), K and V (B, H, Tk, d), float32. Causal masking
//   is bottom-right aligned: query i sees key j when j <= i + Tk - Tq. A query row that sees no key gives O = 0.
//
// Algorithm (three launches; the whole score matrix goes through global memory)
//   1. attention_query_key: preatt[bh, i, j] = scale * dot(Q[bh, i, :], K[bh, j, :]), or -inf where masked.
//   2. attention_softmax:   att[bh, i, :] = softmax(preatt[bh, i, :]) in three passes (max, sum, normalise); a row
//                           that is all -inf becomes zeros.
//   3. attention_value:     O[bh, i, c] = sum_j att[bh, i, j] * V[bh, j, c].
//   permute_qkv and unpermute convert llm.c's packed layout to the head-major one and back.
//
// Layouts (row-major, C-contiguous; BH = B*H)
//   q (BH, Tq, d), k and v (BH, Tk, d), preatt and att (BH, Tq, Tk), out (BH, Tq, d).
//   permute_qkv: inp (B, T, 3, NH, d) -> q, k, v (B, NH, T, d);  unpermute: o (B, NH, T, d) -> out (B, T, NH, d).
//
// Launch (1-D grids; block = BLOCK threads, a multiple of 32 that the launcher picks, 256 by default; no shared memory)
//   attention_query_key:    grid = ceil(BH*Tq*Tk / BLOCK)    one thread per score
//   attention_softmax:      grid = ceil(BH*Tq / BLOCK)       one thread per row
//   attention_value:        grid = ceil(BH*Tq*d / BLOCK)     one thread per output element
//   permute_qkv, unpermute: grid = ceil(B*NH*T*d / BLOCK)    one thread per element of q (and of k and v)
//
// Kernels (extern "C"; every size is a length, none a capacity)
//   attention_query_key(float* preatt, const float* q, const float* k, int BH, int Tq, int Tk, int d, float scale,
//                       int causal)      scale multiplies q.k (natural-log units: 1/sqrt(d) for attention);
//                                        causal = 1 applies the bottom-right mask, 0 none
//   attention_softmax(float* att, const float* preatt, long long rows, int Tk)      rows = BH*Tq
//   attention_value(float* out, const float* att, const float* v, int BH, int Tq, int Tk, int d)
//   permute_qkv(float* q, float* k, float* v, const float* inp, int B, int T, int NH, int d)
//   unpermute(float* out, const float* o, int B, int T, int NH, int d)
//
// Minimum compute capability: nothing here needs more than plain loads, stores and expf; `nvcc -arch=sm_75` (the
// oldest CUDA 13 targets) builds it. The course runs it from 7.5 (a T4). It includes no header.
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/basics/naive.cu -o naive.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80 (extern "C" kernels: no name expressions)
//
// Limits: indices are 64-bit, so BH*Tq*Tk may exceed 2^31; preatt and att take 2 * 4 * BH*Tq*Tk bytes of scratch,
//   which is what limits T in practice. Each size must fit an int.
// Numerics: float32 throughout, accurate expf (no fast-math), max-subtracted softmax with a compensated (Kahan) sum.
// Notes (why it is slow, what was tried and measured): kernels/basics/README.md

#define NEG_INF (-__int_as_float(0x7f800000))

// ---- 1. scores -------------------------------------------------------------------------------------
extern "C" __global__ void attention_query_key(float* __restrict__ preatt,
                                               const float* __restrict__ q,
                                               const float* __restrict__ k,
                                               int BH, int Tq, int Tk, int d,
                                               float scale, int causal) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)BH * Tq * Tk;
    if (idx >= total) return;
    int j = (int)(idx % Tk);
    int i = (int)((idx / Tk) % Tq);
    long long bh = idx / ((long long)Tk * Tq);
    if (causal && j > i + Tk - Tq) {  // bottom-right aligned mask
        preatt[idx] = NEG_INF;
        return;
    }
    const float* qi = q + (bh * Tq + i) * d;
    const float* kj = k + (bh * Tk + j) * d;
    float acc = 0.0f;
    for (int c = 0; c < d; ++c) acc += qi[c] * kj[c];
    preatt[idx] = acc * scale;
}

// ---- 2. softmax, one thread per row ----------------------------------------------------------------
extern "C" __global__ void attention_softmax(float* __restrict__ att,
                                             const float* __restrict__ preatt,
                                             long long rows, int Tk) {
    long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* x = preatt + row * Tk;
    float* y = att + row * Tk;
    float maxval = NEG_INF;
    for (int j = 0; j < Tk; ++j) maxval = fmaxf(maxval, x[j]);
    if (maxval == NEG_INF) {  // the row sees no key: zeros, not 0/0
        for (int j = 0; j < Tk; ++j) y[j] = 0.0f;
        return;
    }
    float sum = 0.0f, carry = 0.0f;  // Kahan summation: one thread adds up Tk terms
    for (int j = 0; j < Tk; ++j) {
        float e = expf(x[j] - maxval);  // expf(-inf) == 0 for masked scores
        y[j] = e;
        const float term = e - carry;
        const float next = sum + term;
        carry = (next - sum) - term;
        sum = next;
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < Tk; ++j) y[j] *= inv;
}

// ---- 3. weighted sum of values ---------------------------------------------------------------------
extern "C" __global__ void attention_value(float* __restrict__ out,
                                           const float* __restrict__ att,
                                           const float* __restrict__ v,
                                           int BH, int Tq, int Tk, int d) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)BH * Tq * d;
    if (idx >= total) return;
    int c = (int)(idx % d);
    long long row = idx / d;  // = bh * Tq + i
    long long bh = row / Tq;
    const float* a = att + row * Tk;
    const float* vc = v + bh * Tk * d + c;
    float acc = 0.0f;
    for (int j = 0; j < Tk; ++j) acc += a[j] * vc[(long long)j * d];
    out[idx] = acc;
}

// ---- llm.c layout bridge ---------------------------------------------------------------------------
// Element idx of a head-major (B, NH, T, d) tensor is (b, h, t, c); its offset in a token-major tensor whose tokens
// hold `slots` head rows of d: ((b*T + t) * slots + h) * d + c. permute_qkv reads inp with slots = 3*NH (q's rows;
// k's and v's follow NH*d later), unpermute writes out with slots = NH.
__device__ __forceinline__ long long token_major_offset(long long idx, int T, int NH, int d, long long slots) {
    int c = (int)(idx % d);
    int t = (int)((idx / d) % T);
    int h = (int)((idx / ((long long)d * T)) % NH);
    int b = (int)(idx / ((long long)d * T * NH));
    return (((long long)b * T + t) * slots + h) * d + c;
}

// inp: (B, T, 3, NH, d)  ->  q, k, v: (B, NH, T, d)
extern "C" __global__ void permute_qkv(float* __restrict__ q, float* __restrict__ k, float* __restrict__ v,
                                       const float* __restrict__ inp, int B, int T, int NH, int d) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)B * NH * T * d;
    if (idx >= total) return;
    long long src = token_major_offset(idx, T, NH, d, 3LL * NH);  // the q slot; k and v follow
    long long stride = (long long)NH * d;
    q[idx] = inp[src];
    k[idx] = inp[src + stride];
    v[idx] = inp[src + 2 * stride];
}

// o: (B, NH, T, d)  ->  out: (B, T, NH, d)
extern "C" __global__ void unpermute(float* __restrict__ out, const float* __restrict__ o,
                                     int B, int T, int NH, int d) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)B * NH * T * d;
    if (idx >= total) return;
    long long dst = token_major_offset(idx, T, NH, d, NH);
    out[dst] = o[idx];
}
