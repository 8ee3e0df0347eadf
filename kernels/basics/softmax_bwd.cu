// softmax_bwd.cu -- the backward of the masked softmax by lengths (softmax.cu: softmax_masked_lengths).
//
// What it computes
//   Row r of y = softmax(x[r, :n_r]) (zeros beyond n_r = clamp(lengths[r], 0, cols)) has the Jacobian
//   dy_j/dx_i = y_j (delta_ij - y_i), so for an upstream gradient dy:
//       dx[r, j] = y[r, j] (dy[r, j] - sum_{i < n_r} dy[r, i] y[r, i])   for j < n_r,   dx[r, j] = 0 beyond.
//   A row with n_r = 0 gives zeros.
//
// Algorithm (one block per row, as the forward's block-per-row kernel)
//   1. each thread loads its float4s of y and dy (up to CACHE_VEC4 of each, kept in registers) and adds up y * dy over
//      the entries j < n_r;
//   2. the block sums the partials (warp shuffles, then one value per warp in shared memory);
//   3. dx = y (dy - sum) from the registers (float4s past the cache are read again), and zeros from n_r to the end of
//      the row, so dx is written entirely.
//   A row of up to blockDim * 4 * CACHE_VEC4 floats costs one read of y and dy and one write of dx: the floor.
//
// Layouts: y, dy and dx float32 (rows, cols) row-major; lengths int32 (rows).
//
// Launch (kernels/basics/softmax_bwd.py): grid = rows (1-D); block = min(softmax.py's auto_block(cols), MAX_BLOCK), a
//   multiple of 32 such that each thread holds at most CACHE_VEC4 float4 (rows of up to 512 * 4 * 8 = 16 384 floats
//   are read once; longer rows read the rest a second time). Static shared memory (MAX_WARPS + 1) * 4 bytes, no
//   dynamic shared memory. -DCACHE_VEC4 (default 8) and -DMAX_BLOCK (default 512) come from the launcher.
//
// Kernel (extern "C")
//   masked_softmax_backward(float* dx, const float* y, const float* dy, const int* lengths, long long rows, int cols,
//                           int vec)
//       rows and cols are lengths; vec = 1 takes the float4 paths, which need cols % 4 == 0 and 16-byte aligned y, dy
//       and dx, vec = 0 the scalar ones. __launch_bounds__(MAX_BLOCK): at 1024 threads the register cache (2 x
//       CACHE_VEC4 float4 per thread) would not fit the SM's 64K registers, so the launcher stops at MAX_BLOCK.
//
// Minimum compute capability: warp shuffles only; `nvcc -arch=sm_75` (the oldest CUDA 13 targets) builds it. The
// course runs it from 7.5 (a T4). It includes no header.
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/basics/softmax_bwd.cu -o softmax_bwd.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80 (extern "C" kernels: no name expressions)
//
// Limits: entries of y and dy at j >= n_r may be loaded inside a float4 that straddles n_r but never enter the result
//   (selected away, so a NaN there does not spread); lengths are clamped in the kernel, so no value can move an
//   access out of its row.
// Numerics: float32; the row sum in tree order (per thread, then per warp, then across warps).
// Notes (what comes next, what was tried and measured): kernels/basics/README.md

#define MAX_WARPS 32
#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu
#ifndef CACHE_VEC4
#define CACHE_VEC4 8  // float4 of y and of dy per thread held in registers
#endif
// Most threads per block: the launcher clamps the forward's block size to this. At 1024 threads the registers of the
// cache (2 x CACHE_VEC4 float4 per thread) would not fit in the SM's 64K (a launch would fail); __launch_bounds__
// makes the compiler keep each thread within 65536 / MAX_BLOCK registers.
#ifndef MAX_BLOCK
#define MAX_BLOCK 512
#endif
static_assert(MAX_BLOCK % WARP_SIZE == 0 && MAX_BLOCK <= 1024, "MAX_BLOCK: a multiple of 32, at most 1024");
static_assert(CACHE_VEC4 >= 1 && CACHE_VEC4 <= 16, "CACHE_VEC4 float4s of y and dy per thread live in registers");

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) x += __shfl_xor_sync(FULL_MASK, x, o);
    return x;
}

// The sum of x over the block, returned to every thread. red: MAX_WARPS + 1 floats of shared memory.
__device__ __forceinline__ float block_sum(float x, float* red) {
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int nwarps = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;
    x = warp_sum(x);
    if (lane == 0) red[warp] = x;
    __syncthreads();
    if (warp == 0) {
        float s = lane < nwarps ? red[lane] : 0.f;
        s = warp_sum(s);
        if (lane == 0) red[MAX_WARPS] = s;
    }
    __syncthreads();
    return red[MAX_WARPS];
}

__device__ __forceinline__ float masked_dot4(float4 y, float4 d, int j, int n) {  // sum of y*d over j..j+3 < n
    float s = 0.f;
    s += j + 0 < n ? y.x * d.x : 0.f;
    s += j + 1 < n ? y.y * d.y : 0.f;
    s += j + 2 < n ? y.z * d.z : 0.f;
    s += j + 3 < n ? y.w * d.w : 0.f;
    return s;
}

__device__ __forceinline__ float4 grad4(float4 y, float4 d, float s, int j, int n) {
    float4 r;
    r.x = j + 0 < n ? y.x * (d.x - s) : 0.f;
    r.y = j + 1 < n ? y.y * (d.y - s) : 0.f;
    r.z = j + 2 < n ? y.z * (d.z - s) : 0.f;
    r.w = j + 3 < n ? y.w * (d.w - s) : 0.f;
    return r;
}

extern "C" __global__ void __launch_bounds__(MAX_BLOCK)
masked_softmax_backward(float* __restrict__ dx, const float* __restrict__ y, const float* __restrict__ dy,
                        const int* __restrict__ lengths, long long rows, int cols, int vec) {
    __shared__ float red[MAX_WARPS + 1];
    const long long row = blockIdx.x;
    if (row >= rows) return;
    const int n = min(max(lengths[row], 0), cols);  // clamped: no length can move an access out of the row
    const float* yr = y + row * cols;
    const float* dr = dy + row * cols;
    float* xr = dx + row * cols;
    const int bd = blockDim.x, tid = threadIdx.x;

    if (vec) {
        // ---- pass 1: y . dy over the row's first n entries, float4s cached in registers -----------------------
        const int n4 = cols / 4;
        const float4* y4 = reinterpret_cast<const float4*>(yr);
        const float4* d4 = reinterpret_cast<const float4*>(dr);
        float4 cy[CACHE_VEC4], cd[CACHE_VEC4];
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < CACHE_VEC4; ++c) {
            const int i = tid + c * bd;
            if (i < n4 && 4 * i < n) {
                cy[c] = y4[i];
                cd[c] = d4[i];
                s += masked_dot4(cy[c], cd[c], 4 * i, n);
            }
        }
        for (int i = tid + CACHE_VEC4 * bd; i < n4 && 4 * i < n; i += bd) s += masked_dot4(y4[i], d4[i], 4 * i, n);
        s = block_sum(s, red);
        // ---- pass 2: dx = y (dy - s) below n, 0 from n on ------------------------------------------------------
        float4* x4 = reinterpret_cast<float4*>(xr);
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int c = 0; c < CACHE_VEC4; ++c) {
            const int i = tid + c * bd;
            if (i < n4) x4[i] = 4 * i < n ? grad4(cy[c], cd[c], s, 4 * i, n) : zero;
        }
        for (int i = tid + CACHE_VEC4 * bd; i < n4; i += bd)
            x4[i] = 4 * i < n ? grad4(y4[i], d4[i], s, 4 * i, n) : zero;
    } else {
        float s = 0.f;
        for (int j = tid; j < n; j += bd) s += yr[j] * dr[j];
        s = block_sum(s, red);
        for (int j = tid; j < cols; j += bd) xr[j] = j < n ? yr[j] * (dr[j] - s) : 0.f;
    }
}
