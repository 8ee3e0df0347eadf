// softmax.cu -- row softmax on CUDA cores, from one thread per row to a block per row at copy speed.
//
// What it computes
//   y[r, j] = exp(s*x[r, j] - m_r) / l_r for j < n_r and y[r, j] = 0 for n_r <= j < cols, where
//   m_r = max_{j<n_r} s*x[r, j] and l_r = sum_{j<n_r} exp(s*x[r, j] - m_r). A row with only -inf (or n_r = 0) becomes
//   zeros. n_r and s by kernel:
//     softmax_thread_per_row, softmax_warp_per_row, softmax_block_per_row   n_r = cols, s = 1
//     softmax_scaled_causal_warp, softmax_scaled_causal_block               s = scale; row r is query i = r % Tq of a
//         (Tq, Tk) score matrix; with causal n_r = clamp(i + Tk - Tq + 1, 0, Tk) (bottom-right aligned), else Tk
//     softmax_masked_lengths, softmax_masked_lengths_warp                   s = 1, n_r = clamp(lengths[r], 0, cols)
//   Entries at j >= n_r are never used: a float4 load may fetch up to 3 of them (inside the row, in the float4 that
//   holds entry n_r - 1) and replaces them by -inf, so padding may hold anything.
//
// Algorithm
//   thread per row: three passes over the row (max, compensated sum, normalise), one thread per row.
//   warp per row:   1. each lane folds a strided slice of the row into an online (max, sum); 2. the 32 pairs are merged
//                   with __shfl_xor_sync; 3. a second pass writes.
//   block per row:  1. each thread loads up to CACHE_VEC4 float4 of its row into registers and exponentiates them once,
//                   against its own max m_t (the rest of a longer row is folded in online); 2. the block merges the
//                   pairs (warp shuffles, then one pair per warp in shared memory); 3. the cached values are written
//                   times exp(m_t - m) / l, the rest is read again.
//   masked lengths, warp per row: each lane holds up to WARP_CACHE_VEC4 float4; max by shuffles, exponentiate once,
//                   sum by shuffles, write (with the whole row at hand no online merge is needed).
//   Merging two partial (max, sum) pairs:  m = max(m1, m2),  l = l1 exp(m1 - m) + l2 exp(m2 - m).
//
// Layouts: inp (x) and out (y) float32 (rows, cols) row-major, cols = Tk for the causal kernels; lengths int32 (rows).
//
// Launch (1-D grids; BLOCK a multiple of 32, at most 1024, chosen by kernels/basics/softmax.py; no dynamic shared
// memory)
//   thread per row:               grid = ceil(rows / BLOCK), BLOCK = 256 by default
//   warp per row (three kernels): grid = ceil(rows / (BLOCK / 32)), BLOCK = 256 by default
//   block per row (three):        grid = rows, BLOCK = clamp(pow2ceil(cols / (4 * CACHE_VEC4)), 32, 1024), so that each
//                                 thread holds at most CACHE_VEC4 float4 and rows of up to 32 768 floats are read once;
//                                 static shared memory (MAX_WARPS + 1) * 8 bytes
//
// Kernels (extern "C"; rows and cols are lengths; vec = 1 takes the float4 paths, which need cols % 4 == 0 and 16-byte
// aligned inp and out, vec = 0 the scalar ones; scale multiplies inp, natural-log units; causal: 1 masks, 0 not)
//   softmax_thread_per_row(float* out, const float* inp, long long rows, int cols)
//   softmax_warp_per_row(float* out, const float* inp, long long rows, int cols)
//   softmax_block_per_row(float* out, const float* inp, long long rows, int cols, int vec)
//   softmax_scaled_causal_warp(float* out, const float* inp, long long rows, int Tq, int Tk, float scale, int causal,
//                              int vec)       inp holds raw dot products q.k; rows = B*H*Tq
//   softmax_scaled_causal_block(...)          the same arguments, for rows longer than 1024
//   softmax_masked_lengths(float* out, const float* inp, const int* lengths, long long rows, int cols, int vec)
//   softmax_masked_lengths_warp(...)          the same arguments, for rows of up to 32 * 4 * WARP_CACHE_VEC4 = 512
//                                             floats (longer rows stay correct but read their rest again)
//
// Minimum compute capability: warp shuffles and streaming stores (__stcs) only; `nvcc -arch=sm_75` (the oldest CUDA 13
// targets) builds it. The course runs it from 7.5 (a T4). It includes no header.
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/basics/softmax.cu -o softmax.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80 (extern "C" kernels: no name expressions)
// Host-side example: kernels/examples/softmax_host.cu (softmax_warp_per_row on a random matrix, checked on the CPU).
//
// Limits: cols <= 2^31 - 1 - 1024 (a thread steps its 32-bit column index by up to 1024); rows < 2^31 for the
//   block-per-row kernels (one block per row in grid.x).
// Numerics: float32, accurate expf (no fast-math); inputs may hold -inf (masked scores). One thread adding up a whole
//   row uses Kahan summation: a plain float sum of 40 000 terms drifts past the 1e-5 tolerance.
// Notes (what was tried and measured): kernels/basics/README.md

#define NEG_INF (-__int_as_float(0x7f800000))

constexpr int WARP_SIZE = 32;
constexpr int MAX_WARPS = 1024 / WARP_SIZE;
constexpr int CACHE_VEC4 = 8;  // float4 per thread kept in registers by the block-per-row kernels
constexpr unsigned FULL_MASK = 0xffffffffu;

// A running softmax state: the largest value seen and the sum of exp(value - m).
struct MaxSum {
    float m;
    float l;
};

// exp(x - m), with an empty state (m == -inf) giving 0 rather than exp(-inf + inf) = NaN.
__device__ __forceinline__ float exp_shift(float x, float m) {
    return m == NEG_INF ? 0.0f : expf(x - m);
}

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
    float m = fmaxf(a.m, b.m);
    if (m == NEG_INF) return {NEG_INF, 0.0f};
    return {m, a.l * expf(a.m - m) + b.l * expf(b.m - m)};  // expf(-inf) == 0 for an empty side
}

// Fold one value into the state (the online softmax recurrence).
__device__ __forceinline__ MaxSum push(MaxSum s, float x) {
    float m = fmaxf(s.m, x);
    if (m == NEG_INF) return s;
    return {m, s.l * expf(s.m - m) + expf(x - m)};
}

__device__ __forceinline__ MaxSum warp_reduce(MaxSum s) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) {
        MaxSum o = {__shfl_xor_sync(FULL_MASK, s.m, offset), __shfl_xor_sync(FULL_MASK, s.l, offset)};
        s = merge(s, o);
    }
    return s;
}

// Block-wide merge; every thread gets the result. `red` holds MAX_WARPS + 1 entries. Called once per block.
__device__ MaxSum block_reduce(MaxSum s, MaxSum* red) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE;
    const int nwarps = blockDim.x / WARP_SIZE;
    s = warp_reduce(s);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    if (warp == 0) {
        MaxSum t = lane < nwarps ? red[lane] : MaxSum{NEG_INF, 0.0f};
        t = warp_reduce(t);
        if (lane == 0) red[MAX_WARPS] = t;  // a separate slot: no lane is still reading it
    }
    __syncthreads();
    return red[MAX_WARPS];
}

__device__ __forceinline__ float4 load_masked4(const float* x, int j4, int n_valid, float scale) {
    float4 t = reinterpret_cast<const float4*>(x)[j4];
    const int j = 4 * j4;
    t.x = j + 0 < n_valid ? t.x * scale : NEG_INF;
    t.y = j + 1 < n_valid ? t.y * scale : NEG_INF;
    t.z = j + 2 < n_valid ? t.z * scale : NEG_INF;
    t.w = j + 3 < n_valid ? t.w * scale : NEG_INF;
    return t;
}

__device__ __forceinline__ float4 normalise4(float4 t, float m, float inv) {
    return make_float4(exp_shift(t.x, m) * inv, exp_shift(t.y, m) * inv,
                       exp_shift(t.z, m) * inv, exp_shift(t.w, m) * inv);
}

// One block computes the softmax of one row: y[j] for j < n_total, reading x only at j < n_valid.
__device__ void block_softmax_row(float* __restrict__ y, const float* __restrict__ x,
                                  int n_valid, int n_total, float scale, int vec, MaxSum* red) {
    if (vec) {
        const int n4 = n_total / 4;            // float4 in the row
        const int valid4 = (n_valid + 3) / 4;  // float4 holding at least one valid entry
        float4 cache[CACHE_VEC4];
        float m = NEG_INF;
#pragma unroll
        for (int c = 0; c < CACHE_VEC4; ++c) {
            const int j4 = threadIdx.x + c * blockDim.x;
            float4 t = make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
            if (j4 < valid4) t = load_masked4(x, j4, n_valid, scale);
            cache[c] = t;
            m = fmaxf(m, fmaxf(fmaxf(t.x, t.y), fmaxf(t.z, t.w)));
        }
        // Exponentiate once, against this thread's own max m; the cache now holds exp(x - m).
        float l = 0.0f;
#pragma unroll
        for (int c = 0; c < CACHE_VEC4; ++c) {
            const float4 t = cache[c];
            cache[c] = make_float4(exp_shift(t.x, m), exp_shift(t.y, m), exp_shift(t.z, m), exp_shift(t.w, m));
            l += (cache[c].x + cache[c].y) + (cache[c].z + cache[c].w);
        }
        MaxSum s = {m, l};
        // Rows longer than the register cache: the rest is folded in online and read again below.
        for (int j4 = threadIdx.x + CACHE_VEC4 * blockDim.x; j4 < valid4; j4 += blockDim.x) {
            const float4 t = load_masked4(x, j4, n_valid, scale);
            s = push(push(push(push(s, t.x), t.y), t.z), t.w);
        }
        s = block_reduce(s, red);
        const float inv = s.l > 0.0f ? 1.0f / s.l : 0.0f;
        // exp(x - M) / L = exp(x - m) * (exp(m - M) / L): one multiply per cached value, no second exp.
        const float factor = exp_shift(m, s.m) * inv;
        float4* y4 = reinterpret_cast<float4*>(y);
#pragma unroll
        for (int c = 0; c < CACHE_VEC4; ++c) {
            const int j4 = threadIdx.x + c * blockDim.x;
            const float4 e = cache[c];
            if (j4 < n4)  // streaming store: the output is not read again, so keep it from evicting the input
                __stcs(y4 + j4, make_float4(e.x * factor, e.y * factor, e.z * factor, e.w * factor));
        }
        for (int j4 = threadIdx.x + CACHE_VEC4 * blockDim.x; j4 < n4; j4 += blockDim.x) {
            __stcs(y4 + j4, j4 < valid4 ? normalise4(load_masked4(x, j4, n_valid, scale), s.m, inv)
                                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f));
        }
    } else {
        MaxSum s = {NEG_INF, 0.0f};
        for (int j = threadIdx.x; j < n_valid; j += blockDim.x) s = push(s, x[j] * scale);
        s = block_reduce(s, red);
        const float inv = s.l > 0.0f ? 1.0f / s.l : 0.0f;
        for (int j = threadIdx.x; j < n_total; j += blockDim.x)
            y[j] = j < n_valid ? exp_shift(x[j] * scale, s.m) * inv : 0.0f;
    }
}

__device__ __forceinline__ int causal_valid(long long row, int Tq, int Tk, int causal) {
    if (!causal) return Tk;
    const int i = (int)(row % Tq);
    return min(max(i + Tk - Tq + 1, 0), Tk);
}

// ---- 1. one thread per row: three passes -----------------------------------------------------------
extern "C" __global__ void softmax_thread_per_row(float* __restrict__ out, const float* __restrict__ inp,
                                                  long long rows, int cols) {
    const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* x = inp + row * cols;
    float* y = out + row * cols;
    float m = NEG_INF;
    for (int j = 0; j < cols; ++j) m = fmaxf(m, x[j]);
    // One thread adds up the whole row: a plain float sum of 40 000 terms drifts by more than the
    // 1e-5 tolerance, so the rounding error of each addition is carried along (Kahan summation).
    float l = 0.0f, carry = 0.0f;
    for (int j = 0; j < cols; ++j) {
        const float term = exp_shift(x[j], m) - carry;
        const float next = l + term;
        carry = (next - l) - term;
        l = next;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int j = 0; j < cols; ++j) y[j] = exp_shift(x[j], m) * inv;
}

// ---- 2. one warp per row: online (max, sum) per lane, merged with shuffles -------------------------
extern "C" __global__ void softmax_warp_per_row(float* __restrict__ out, const float* __restrict__ inp,
                                                long long rows, int cols) {
    const int lane = threadIdx.x % WARP_SIZE;
    const long long row = (long long)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) return;  // a whole warp leaves together, so the shuffles below see 32 lanes
    const float* x = inp + row * cols;
    float* y = out + row * cols;
    MaxSum s = {NEG_INF, 0.0f};
    for (int j = lane; j < cols; j += WARP_SIZE) s = push(s, x[j]);
    s = warp_reduce(s);
    const float inv = s.l > 0.0f ? 1.0f / s.l : 0.0f;
    for (int j = lane; j < cols; j += WARP_SIZE) y[j] = exp_shift(x[j], s.m) * inv;
}

// ---- 3. one block per row, row cached in registers ---------------------------------------------------
extern "C" __global__ void softmax_block_per_row(float* __restrict__ out, const float* __restrict__ inp,
                                                 long long rows, int cols, int vec) {
    __shared__ MaxSum red[MAX_WARPS + 1];
    const long long row = blockIdx.x;
    block_softmax_row(out + row * cols, inp + row * cols, cols, cols, 1.0f, vec, red);
}

// ---- 4. scale and causal mask fused into the softmax (llm.c kernel 5's idea) -------------------------
// Warp per row, float4 loads. inp holds raw dot products q.k (unscaled); masked entries are never read.
extern "C" __global__ void softmax_scaled_causal_warp(float* __restrict__ out, const float* __restrict__ inp,
                                                      long long rows, int Tq, int Tk, float scale,
                                                      int causal, int vec) {
    const int lane = threadIdx.x % WARP_SIZE;
    const long long row = (long long)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) return;
    const float* x = inp + row * Tk;
    float* y = out + row * Tk;
    const int n_valid = causal_valid(row, Tq, Tk, causal);
    MaxSum s = {NEG_INF, 0.0f};
    if (vec) {
        const int valid4 = (n_valid + 3) / 4;
        for (int j4 = lane; j4 < valid4; j4 += WARP_SIZE) {
            const float4 t = load_masked4(x, j4, n_valid, scale);
            s = push(push(push(push(s, t.x), t.y), t.z), t.w);
        }
        s = warp_reduce(s);
        const float inv = s.l > 0.0f ? 1.0f / s.l : 0.0f;
        float4* y4 = reinterpret_cast<float4*>(y);
        for (int j4 = lane; j4 < Tk / 4; j4 += WARP_SIZE)
            y4[j4] = j4 < valid4 ? normalise4(load_masked4(x, j4, n_valid, scale), s.m, inv)
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    } else {
        for (int j = lane; j < n_valid; j += WARP_SIZE) s = push(s, x[j] * scale);
        s = warp_reduce(s);
        const float inv = s.l > 0.0f ? 1.0f / s.l : 0.0f;
        for (int j = lane; j < Tk; j += WARP_SIZE) y[j] = j < n_valid ? exp_shift(x[j] * scale, s.m) * inv : 0.0f;
    }
}

// Block per row: the same function for long rows.
extern "C" __global__ void softmax_scaled_causal_block(float* __restrict__ out, const float* __restrict__ inp,
                                                       long long rows, int Tq, int Tk, float scale,
                                                       int causal, int vec) {
    __shared__ MaxSum red[MAX_WARPS + 1];
    const long long row = blockIdx.x;
    block_softmax_row(out + row * Tk, inp + row * Tk, causal_valid(row, Tq, Tk, causal), Tk, scale, vec, red);
}

// ---- 5. per-row lengths instead of a mask tensor ------------------------------------------------------
extern "C" __global__ void softmax_masked_lengths(float* __restrict__ out, const float* __restrict__ inp,
                                                  const int* __restrict__ lengths, long long rows, int cols,
                                                  int vec) {
    __shared__ MaxSum red[MAX_WARPS + 1];
    const long long row = blockIdx.x;
    // Clamped here, so that a length outside [0, cols] can never make the kernel read or write past its row:
    // the launcher checks the lengths only on request (check_lengths=True), since that waits for the GPU.
    const int n_valid = min(max(lengths[row], 0), cols);
    block_softmax_row(out + row * cols, inp + row * cols, n_valid, cols, 1.0f, vec, red);
}

// ---- 6. per-row lengths, short rows: one warp per row ----------------------------------------------------
// For rows of up to 32 * 4 * WARP_CACHE_VEC4 = 512 floats (BERT's 128 keys, say) the block-per-row kernel above
// runs one warp per block: the SM holds at most 32 resident blocks, so it is half full, and each row pays a
// block-wide merge through shared memory and two barriers for a single warp. Here a block of blockDim / 32 warps
// takes as many rows and each warp keeps its row in registers. With the whole row at hand no online merge is
// needed (merge() costs two expf per shuffle step): the warp takes the max with shuffles, exponentiates each valid
// value once against it, sums with shuffles and writes. Only the float4s that hold valid entries are loaded or
// exponentiated, so a short row in a long buffer costs little. Rows longer than the cache stay correct (their
// remainder is read again in each pass), but the launcher sends them to softmax_masked_lengths.
constexpr int WARP_CACHE_VEC4 = 4;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

extern "C" __global__ void softmax_masked_lengths_warp(float* __restrict__ out, const float* __restrict__ inp,
                                                       const int* __restrict__ lengths, long long rows, int cols,
                                                       int vec) {
    const int lane = threadIdx.x % WARP_SIZE;
    const long long row = (long long)blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE;
    if (row >= rows) return;  // a whole warp leaves together, so the shuffles below see 32 lanes
    const int n_valid = min(max(lengths[row], 0), cols);  // clamped, as in softmax_masked_lengths
    const float* x = inp + row * cols;
    float* y = out + row * cols;
    if (vec) {
        const int n4 = cols / 4;
        const int valid4 = (n_valid + 3) / 4;  // float4s holding at least one valid entry
        float4 cache[WARP_CACHE_VEC4];
        // ---- max: the cached float4s, then (rows longer than the cache) the rest ----
        float m = NEG_INF;
#pragma unroll
        for (int c = 0; c < WARP_CACHE_VEC4; ++c) {
            const int j4 = lane + c * WARP_SIZE;
            if (j4 < valid4) {
                cache[c] = load_masked4(x, j4, n_valid, 1.0f);
                m = fmaxf(m, fmaxf(fmaxf(cache[c].x, cache[c].y), fmaxf(cache[c].z, cache[c].w)));
            }
        }
        for (int j4 = lane + WARP_CACHE_VEC4 * WARP_SIZE; j4 < valid4; j4 += WARP_SIZE) {
            const float4 t = load_masked4(x, j4, n_valid, 1.0f);
            m = fmaxf(m, fmaxf(fmaxf(t.x, t.y), fmaxf(t.z, t.w)));
        }
        m = warp_max(m);
        // ---- sum of exp(x - m); the cache now holds the exponentials ----
        float l = 0.0f;
#pragma unroll
        for (int c = 0; c < WARP_CACHE_VEC4; ++c) {
            if (lane + c * WARP_SIZE < valid4) {
                const float4 t = cache[c];
                cache[c] = make_float4(exp_shift(t.x, m), exp_shift(t.y, m), exp_shift(t.z, m), exp_shift(t.w, m));
                l += (cache[c].x + cache[c].y) + (cache[c].z + cache[c].w);
            }
        }
        for (int j4 = lane + WARP_CACHE_VEC4 * WARP_SIZE; j4 < valid4; j4 += WARP_SIZE) {
            const float4 t = load_masked4(x, j4, n_valid, 1.0f);
            l += (exp_shift(t.x, m) + exp_shift(t.y, m)) + (exp_shift(t.z, m) + exp_shift(t.w, m));
        }
        l = warp_sum(l);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        // ---- write: valid float4s scaled, zeros for the padding ----
        float4* y4 = reinterpret_cast<float4*>(y);
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int c = 0; c < WARP_CACHE_VEC4; ++c) {
            const int j4 = lane + c * WARP_SIZE;
            const float4 e = cache[c];
            if (j4 < valid4) __stcs(y4 + j4, make_float4(e.x * inv, e.y * inv, e.z * inv, e.w * inv));
            else if (j4 < n4) __stcs(y4 + j4, zero);
        }
        for (int j4 = lane + WARP_CACHE_VEC4 * WARP_SIZE; j4 < n4; j4 += WARP_SIZE)
            __stcs(y4 + j4, j4 < valid4 ? normalise4(load_masked4(x, j4, n_valid, 1.0f), m, inv) : zero);
    } else {  // scalar loads (rows not 16-byte aligned, or cols % 4 != 0): three passes over the row
        float m = NEG_INF;
        for (int j = lane; j < n_valid; j += WARP_SIZE) m = fmaxf(m, x[j]);
        m = warp_max(m);
        float l = 0.0f;
        for (int j = lane; j < n_valid; j += WARP_SIZE) l += exp_shift(x[j], m);
        l = warp_sum(l);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int j = lane; j < cols; j += WARP_SIZE) y[j] = j < n_valid ? exp_shift(x[j], m) * inv : 0.0f;
    }
}
