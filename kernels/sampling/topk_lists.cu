// topk_lists.cu -- FasterTransformer's two-stage top-k with sorted lists in registers: the k largest logits of each
// row, sampling among them, and the beam-search step's merge of a sequence's K rows (and its KV-cache reorder).
//
// What it computes (reference/sampling.py states the same in float64)
//   The ranking: larger logit first, ties by the lower index; top_k = the first k of a row's ranking. Sampling among
//   them: w = exp((x - max) / T), top-p = the shortest prefix of the ranking whose mass reaches top_p * sum w (the
//   crossing entry is kept), then an inverse CDF in VOCABULARY order at u * (kept mass), u from Philox4x32-10 with
//   key = seed and counter = (row, 0, offset). The beam step: the K best of cum[row] + x - lse[row] over the K rows of
//   a sequence (lse = log sum exp of the row: beam_lse in threshold.cu).
//
// Algorithm
//   1. topk_stage1: a block owns SLICE = TOPK_THREADS * TOPK_EPT logits of a row, read as 16-byte groups from the
//      row's alignment origin (load4), all loads issued before any is used; each thread inserts its TOPK_EPT logits
//      into a sorted list in registers (TopList: one bubble pass, unrolled, so register indices stay constant).
//   2. block_merge: k rounds of a block-wide arg-max over the threads' list heads (shuffles, one word per warp through
//      shared memory, shuffles); the thread holding the winner pops its head. The slice's top k go to the partials.
//   3. topk_sample<KB>: one block per row reads the row's S * k partials into lists of KB >= k entries and merges
//      them the same way -> the row's top k, sorted. Softmax with T and top-p on those k (one thread), then the draw:
//      the kept entries ranked by index, one walk to u * (kept mass).
//   4. beam_stage2<KB>: one block per sequence merges the K * S * K partials of its K rows (stage 1 with k = K),
//      scored cum + x - lse; the flat index j * V + token of each winner gives its parent beam j and its token.
//   5. reorder_rows: the KV cache follows the survivors: row n <- row (n / K) * K + parent[n], in 16-byte chunks.
//
// Layouts: logits (rows, V) float32 C-contiguous; partial_v, partial_i (rows, S, k); tokens int32 (rows,); topk_v,
//   topk_i (rows, k); probs (rows, V) float32; cum, lse (B * K,) float32; scores, parent, token (B, K); a KV cache
//   (rows, ...) of row_bytes a multiple of 16, moved as chunks_per_row = row_bytes / 16 uint4 per row.
//
// Launch (kernels/sampling/sampling.py; no dynamic shared memory, at most 2.6 KB static)
//   topk_stage1      grid (rows, S), S = ceil((V + 3) / SLICE) (+3: a row's groups start up to 3 positions before it)
//   topk_sample<KB>  grid rows          block TOPK_THREADS for these three; KB = 16 for k <= 16, else 64
//   beam_stage2<KB>  grid B
//   reorder_rows     grid min(ceil(rows * chunks_per_row / REORDER_THREADS), 65536), block REORDER_THREADS
//
// Kernels
//   topk_stage1(logits, V, k, partial_v, partial_i)    1 <= k <= 64; a slice past the row's end pads (-inf, BIG_INDEX)
//   topk_sample<KB>(partial_v, partial_i, S, V, k, inv_t, top_p, seed, offset, tokens, topk_v, topk_i, probs)
//     inv_t = 1 / temperature; top_p >= 1 is off; topk_v and topk_i (both or neither) == nullptr: no top-k output;
//     probs == nullptr: no renormalised row (else the whole row is written, zeros outside the kept set).
//   beam_stage2<KB>(partial_v, partial_i, cum, lse, S, V, K, scores, parent, token)   partials with k = K; a dead beam
//     has cum = -inf
//   reorder_rows(src, dst, parent, K, rows, chunks_per_row)   parent clamped to [0, K); dst must not overlap src
//
// Requirements: any GPU of the course (sm_75, a T4, and newer; nothing architecture-specific); includes no PTX header.
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/sampling/topk_lists.cu -o topk_lists.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80, name expressions:
//     "topk_sample<16>" "topk_sample<64>" "beam_stage2<16>" "beam_stage2<64>"
//
// Limits: k <= 64 (a list holds k entries in registers; a larger k needs another select); V <= 2^24. Indices read
//   from memory (partials, parents) are clamped, so no input makes a kernel read or write out of bounds. NaN logits
//   are skipped like -inf; a row whose largest logit is not finite (all -inf, or +inf) gives token 0, zero probs.
// Numerics: float32; every weight is wexp(d) = exp2f(d * log2 e).
// Notes (what was tried and measured): kernels/sampling/README.md.

#ifndef TOPK_THREADS
#define TOPK_THREADS 256
#endif
#ifndef TOPK_EPT
#define TOPK_EPT 16
#endif
#ifndef REORDER_THREADS
#define REORDER_THREADS 256
#endif

#define SLICE (TOPK_THREADS * TOPK_EPT)
#ifndef INFINITY  // NVRTC has no <math.h>
#define INFINITY __int_as_float(0x7f800000)
#endif
#define BIG_INDEX 0x7fffffff

static_assert(TOPK_THREADS % 32 == 0 && TOPK_THREADS <= 1024, "TOPK_THREADS: whole warps");
static_assert(TOPK_EPT % 4 == 0, "16-byte groups");

// ---------------------------------------------------------------------------------------------------------------
// What topk_lists.cu and threshold.cu share, in the same words in both (tests/test_sampling_files.py keeps the two
// copies equal): the weight of a logit, the ranking, the Philox uniform, top-p on a ranked prefix, 16-byte row loads.
// ---------------------------------------------------------------------------------------------------------------

// The weight e^d of a logit, d = (x - M) * inv_t, as 2^(d * log2 e): exp2f is one MUFU.EX2 and a few instructions where
// expf first reduces its argument. Rounding d * log2 e to float32 moves the weight by at most |d| * 2^-24 relative (a
// millionth for the weights that matter, d > -20); every weight, sum and comparison in this file uses this one formula.
__device__ __forceinline__ float wexp(float d) { return exp2f(d * 1.4426950408889634f); }

// a ranks before b: larger value first, ties by the lower index
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

// Philox4x32-10: counter (row, 0, offset_lo, offset_hi), key (seed_lo, seed_hi); u = top 24 bits of word 0 * 2^-24.
__device__ __forceinline__ float philox_uniform(unsigned long long seed, unsigned int row, unsigned long long offset) {
    unsigned int c0 = row, c1 = 0u, c2 = (unsigned int)offset, c3 = (unsigned int)(offset >> 32);
    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        const unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    }
    return (float)(c0 >> 8) * (1.0f / 16777216.0f);
}

// top-p on k masses in ranking order (k <= 64, one thread): how many the shortest prefix whose sum reaches
// top_p * their total holds (all k for top_p >= 1).
__device__ __forceinline__ int top_p_prefix(const float* w, int k, float top_p) {
    if (top_p >= 1.0f) return k;
    float total = 0.f;
    for (int j = 0; j < k; ++j) total += w[j];
    const float target = top_p * total;
    float cum = 0.f;
    for (int j = 0; j < k; ++j) {
        cum += w[j];
        if (cum >= target) return j + 1;
    }
    return k;
}

// Reading a row with 16-byte loads. Row r starts at logits + r * V, 16-byte aligned only when V % 4 == 0, so groups
// of four start at the row's alignment origin o in (-4, 0]: group g holds x[o + 4g .. o + 4g + 3]; the first and the
// last group may stick out of the row, and those positions read as -inf.
__device__ __forceinline__ int align_origin(const float* x) {
    return -(int)((reinterpret_cast<unsigned long long>(x) & 15ull) >> 2);
}

__device__ __forceinline__ void load4(const float* __restrict__ x, int V, int i0, float (&v)[4]) {
    if (i0 >= 0 && i0 + 4 <= V) {
        const float4 t = __ldg(reinterpret_cast<const float4*>(x + i0));
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = (i0 + e >= 0 && i0 + e < V) ? __ldg(x + i0 + e) : -INFINITY;
    }
}
// (end of what topk_lists.cu and threshold.cu share)

// ---------------------------------------------------------------------------------------------------------------
// Per-thread sorted lists in registers and their block-wide merge (FasterTransformer's top-k).
// ---------------------------------------------------------------------------------------------------------------
template <int L>
struct TopList {
    float v[L];
    int i[L];
    __device__ __forceinline__ void init() {
#pragma unroll
        for (int j = 0; j < L; ++j) { v[j] = -INFINITY; i[j] = BIG_INDEX; }
    }
    // insert (x, idx) if it ranks before the last entry: one bubble pass from the end (constant indices only)
    __device__ __forceinline__ void insert(float x, int idx) {
        if (!ranks_before(x, idx, v[L - 1], i[L - 1])) return;
        v[L - 1] = x; i[L - 1] = idx;
#pragma unroll
        for (int j = L - 1; j > 0; --j) {
            if (ranks_before(v[j], i[j], v[j - 1], i[j - 1])) {
                const float tv = v[j]; v[j] = v[j - 1]; v[j - 1] = tv;
                const int ti = i[j]; i[j] = i[j - 1]; i[j - 1] = ti;
            }
        }
    }
    __device__ __forceinline__ void pop() {
#pragma unroll
        for (int j = 0; j < L - 1; ++j) { v[j] = v[j + 1]; i[j] = i[j + 1]; }
        v[L - 1] = -INFINITY; i[L - 1] = BIG_INDEX;
    }
};

// k rounds of a block-wide arg-max over the threads' list heads; the winner pops. out_v/out_i (shared, k entries)
// get the block's top k in ranking order. red: 2 * 2 * 32 words (double-buffered per round: one barrier per round).
template <int NT, int L>
__device__ void block_merge(TopList<L>& list, int k, float* out_v, int* out_i, float* red_v, int* red_i) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = 0; r < k; ++r) {
        float bv = list.v[0];
        int bi = list.i[0];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ranks_before(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        const int buf = (r & 1) * 32;
        if (lane == 0) { red_v[buf + warp] = bv; red_i[buf + warp] = bi; }
        __syncthreads();
        bv = lane < NT / 32 ? red_v[buf + lane] : -INFINITY;
        bi = lane < NT / 32 ? red_i[buf + lane] : BIG_INDEX;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ranks_before(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        // (bv, bi) is unique: indices differ, so exactly one thread holds it at its head (sentinels aside)
        if (list.i[0] == bi && list.v[0] == bv && bi != BIG_INDEX) list.pop();
        if (threadIdx.x == 0) { out_v[r] = bv; out_i[r] = bi; }
    }
    __syncthreads();
}

// ---------------------------------------------------------------------------------------------------------------
// topk_stage1: the top k (k <= 64) of each SLICE of a row. grid (rows, S), block TOPK_THREADS.
// ---------------------------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
topk_stage1(const float* __restrict__ logits, int V, int k, float* __restrict__ partial_v, int* __restrict__ partial_i) {
    __shared__ float out_v[64];
    __shared__ int out_i[64];
    __shared__ float red_v[64];
    __shared__ int red_i[64];
    const int S = gridDim.y, s = blockIdx.y;
    const long long row = blockIdx.x;
    const float* x = logits + row * V;
    const int start = align_origin(x) + s * SLICE;  // slices of whole 16-byte groups (see load4)
    // ---- load this thread's TOPK_EPT logits (TOPK_EPT / 4 16-byte loads, all issued before any is used), sort ----
    float vals[TOPK_EPT];
#pragma unroll
    for (int g = 0; g < TOPK_EPT / 4; ++g) {
        float v4[4];
        load4(x, V, start + 4 * (g * TOPK_THREADS + (int)threadIdx.x), v4);
#pragma unroll
        for (int e = 0; e < 4; ++e) vals[4 * g + e] = v4[e];
    }
    TopList<TOPK_EPT> list;
    list.init();
#pragma unroll
    for (int e = 0; e < TOPK_EPT; ++e) {
        const int idx = start + 4 * ((e / 4) * TOPK_THREADS + (int)threadIdx.x) + e % 4;
        if (idx >= 0 && idx < V) list.insert(vals[e], idx);
    }
    // ---- merge across the block ----
    block_merge<TOPK_THREADS, TOPK_EPT>(list, k, out_v, out_i, red_v, red_i);
    if (threadIdx.x < k) {
        const long long o = (row * S + s) * k + threadIdx.x;
        partial_v[o] = out_v[threadIdx.x];
        partial_i[o] = out_i[threadIdx.x];
    }
}

// ---------------------------------------------------------------------------------------------------------------
// topk_sample<KB>: stage 2 of top-k, then softmax, top-p and the draw on the k survivors. One block per row.
// ---------------------------------------------------------------------------------------------------------------
template <int KB>
__global__ void __launch_bounds__(TOPK_THREADS)
topk_sample(const float* __restrict__ partial_v, const int* __restrict__ partial_i, int S, int V, int k, float inv_t,
            float top_p, unsigned long long seed, unsigned long long offset, int* __restrict__ tokens,
            float* __restrict__ topk_v, int* __restrict__ topk_i, float* __restrict__ probs) {
    static_assert(KB >= 1 && KB <= 64, "KB: at most 64 entries per list");
    __shared__ float top_v[64];
    __shared__ int top_i[64];
    __shared__ float red_v[64];
    __shared__ int red_i[64];
    __shared__ float w[64];
    __shared__ int order[64];
    __shared__ int n_kept;
    __shared__ float inv_zp;
    const long long row = blockIdx.x;
    const int n = S * k;
    // ---- merge the S partial lists of this row ----
    TopList<KB> list;
    list.init();
    for (int c = threadIdx.x; c < n; c += TOPK_THREADS) {
        const long long o = row * n + c;
        const int id = partial_i[o];
        if (id >= 0 && id < V) list.insert(partial_v[o], id);  // a short slice pads with (-inf, BIG_INDEX)
    }
    block_merge<TOPK_THREADS, KB>(list, k, top_v, top_i, red_v, red_i);
    // ---- softmax over the k survivors, top-p within them (ranking order) ----
    const float m = top_v[0];
    const bool finite = m > -INFINITY && m < INFINITY;  // NaN fails both
    if (threadIdx.x < k) w[threadIdx.x] = finite ? wexp((top_v[threadIdx.x] - m) * inv_t) : 0.f;
    __syncthreads();
    if (threadIdx.x == 0) n_kept = top_p_prefix(w, k, top_p);
    __syncthreads();
    // ---- the draw: inverse CDF over the kept entries in INDEX order (rank by index, then one walk) ----
    if (threadIdx.x < k) {
        const int j = threadIdx.x;
        if (j >= n_kept) w[j] = 0.f;
        int rank = 0;  // unique even if indices repeat (sentinels of a row with NaN logits)
        for (int l = 0; l < n_kept; ++l) rank += (top_i[l] < top_i[j] || (top_i[l] == top_i[j] && l < j)) ? 1 : 0;
        if (j < n_kept) order[rank] = j;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int token = 0;
        float zp = 0.f;
        for (int j = 0; j < n_kept; ++j) zp += w[order[j]];
        if (finite && zp > 0.f) {
            const float target = philox_uniform(seed, (unsigned int)row, offset) * zp;
            float cum = 0.f;
            int last = -1;
            token = -1;
            for (int j = 0; j < n_kept; ++j) {
                const int e = order[j];
                if (w[e] > 0.f) last = top_i[e];
                cum += w[e];
                if (w[e] > 0.f && cum > target) { token = top_i[e]; break; }
            }
            if (token < 0) token = last;  // rounding: u * zp at or past the total
        }
        tokens[row] = min(max(token, 0), V - 1);
        inv_zp = zp > 0.f ? 1.f / zp : 0.f;
    }
    __syncthreads();
    if (threadIdx.x < k) w[threadIdx.x] *= inv_zp;
    __syncthreads();
    if (topk_v != nullptr && threadIdx.x < k) {
        topk_v[row * k + threadIdx.x] = top_v[threadIdx.x];
        topk_i[row * k + threadIdx.x] = min(max(top_i[threadIdx.x], 0), V - 1);
    }
    if (probs != nullptr) {
        float* p = probs + row * V;
        for (int i = threadIdx.x; i < V; i += TOPK_THREADS) p[i] = 0.f;
        __syncthreads();
        if (threadIdx.x < k && w[threadIdx.x] > 0.f) p[min(max(top_i[threadIdx.x], 0), V - 1)] = w[threadIdx.x];
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The beam-search step: the merge of a sequence's K rows (after topk_stage1 with k = K), and the KV-cache reorder.
// ---------------------------------------------------------------------------------------------------------------
// One block per sequence b: the K best of cum[row] + x - lse[row] over the K rows' stage-1 partials (S * K each).
template <int KB>
__global__ void __launch_bounds__(TOPK_THREADS)
beam_stage2(const float* __restrict__ partial_v, const int* __restrict__ partial_i, const float* __restrict__ cum,
            const float* __restrict__ lse, int S, int V, int K, float* __restrict__ scores, int* __restrict__ parent,
            int* __restrict__ token) {
    static_assert(KB >= 1 && KB <= 64, "KB: at most 64 entries per list");
    __shared__ float top_v[64];
    __shared__ int top_i[64];
    __shared__ float red_v[64];
    __shared__ int red_i[64];
    const long long b = blockIdx.x;
    const int per_row = S * K, n = K * per_row;
    TopList<KB> list;
    list.init();
    for (int c = threadIdx.x; c < n; c += TOPK_THREADS) {
        const int j = c / per_row;  // beam
        const long long row = b * K + j;
        const int tok = partial_i[b * n + c];
        if (tok >= 0 && tok < V) list.insert(cum[row] + (partial_v[b * n + c] - lse[row]), j * V + tok);
    }
    block_merge<TOPK_THREADS, KB>(list, K, top_v, top_i, red_v, red_i);
    if (threadIdx.x < K) {
        const int flat = min(max(top_i[threadIdx.x], 0), K * V - 1);
        scores[b * K + threadIdx.x] = top_v[threadIdx.x];
        parent[b * K + threadIdx.x] = flat / V;
        token[b * K + threadIdx.x] = flat % V;
    }
}

// The KV cache after a beam step: dst row n <- src row (n / K) * K + parent[n], parent clamped to [0, K).
extern "C" __global__ void __launch_bounds__(REORDER_THREADS)
reorder_rows(const uint4* __restrict__ src, uint4* __restrict__ dst, const int* __restrict__ parent, int K,
             long long rows, long long chunks_per_row) {
    const long long total = rows * chunks_per_row;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long n = idx / chunks_per_row, c = idx % chunks_per_row;
        const int p = min(max(parent[n], 0), K - 1);
        dst[idx] = src[((n / K) * K + p) * chunks_per_row + c];
    }
}

#ifndef __CUDACC_RTC__
template __global__ void topk_sample<16>(const float*, const int*, int, int, int, float, float, unsigned long long,
                                         unsigned long long, int*, float*, int*, float*);
template __global__ void topk_sample<64>(const float*, const int*, int, int, int, float, float, unsigned long long,
                                         unsigned long long, int*, float*, int*, float*);
template __global__ void beam_stage2<16>(const float*, const int*, const float*, const float*, int, int, int, float*,
                                         int*, int*);
template __global__ void beam_stage2<64>(const float*, const int*, const float*, const float*, int, int, int, float*,
                                         int*, int*);
#endif
