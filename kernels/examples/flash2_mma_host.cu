// flash2_mma_host.cu -- flash2_mma.cu's dense forward called from C++: allocate, fill, launch, copy back, check.
//
// Build and run it from the repository root (a GPU of compute capability 8.0 or newer):
//   nvcc -std=c++17 -arch=sm_80 -I kernels kernels/examples/flash2_mma_host.cu -o flash2_mma_host
//   ./flash2_mma_host
//
// It makes the launch that kernels/flash/flash2_mma.py makes for float16 inputs with d = 64, the default build
// flash2_mma_forward<D = 64, BC = 64, NWARPS = 4, MT = 2, MIN_BLOCKS = 2, BF16 = false> (TILES[64]):
//   grid = B H ceil(Tq / BR) blocks with BR = 16 MT NWARPS = 128, block = 32 NWARPS = 128 threads,
//   dynamic shared memory = 2 (BR + 4 BC)(D + SMEM_PAD) = 55296 bytes: above 48 KB, so the kernel opts in first
//   (cudaFuncSetAttribute), and, as the launcher does, asks for the largest shared-memory carveout;
//   scale_log2 = scale * log2(e) with scale = 1 / sqrt(d); head_major as the launcher's grid_order picks it.
// q, k, v (B, H, T, d) are filled from a fixed-seed LCG with values in [-1, 1), rounded to float16; o and lse come
// back for a full and a causal launch, and every row is checked against attention computed on the CPU in double from
// the same float16 values, with the course's float16 bounds (kernels/core/check.py): relative L2 error <= 2e-3 and
// worst element <= 2e-2 of max |ref|; lse within 1e-3. Prints one line per launch; exits 0 when both pass, else 1.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "flash/flash2_mma.cu"

#define CHECK(call)                                                                                         \
    do {                                                                                                    \
        cudaError_t err_ = (call);                                                                          \
        if (err_ != cudaSuccess) {                                                                          \
            std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            std::exit(1);                                                                                   \
        }                                                                                                   \
    } while (0)

// The build: the template arguments of TILES[64] in kernels/flash/flash2_mma.py.
constexpr int D = 64, BC = 64, NWARPS = 4, MT = 2, MIN_BLOCKS = 2;
constexpr int BR = MMA_M * MT * NWARPS;                      // 128 query rows per block
constexpr int THREADS = WARP_SIZE * NWARPS;                  // 128
constexpr int SMEM_BYTES = 2 * (BR + 4 * BC) * (D + SMEM_PAD);  // MmaTile.smem_bytes(D)

static float lcg_uniform(unsigned& state) {  // [-1, 1), fixed sequence for a fixed seed
    state = state * 1664525u + 1013904223u;
    return (state >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

static u16 to_half_bits(float x) {
    const __half h = __float2half_rn(x);
    u16 bits;
    std::memcpy(&bits, &h, sizeof bits);
    return bits;
}

static double half_bits_to_double(u16 bits) {
    __half h;
    std::memcpy(&h, &bits, sizeof h);
    return static_cast<double>(__half2float(h));
}

// The launcher's grid_order: heads fastest (0) only under a causal mask, while K and V of all heads take at most 3 L2
// sizes and the grid is at most 12 waves (blocks / (SMs x blocks of this build an SM holds)); head-major (1) otherwise.
template <typename Kernel>
static int grid_order(Kernel kernel, bool causal, int BH, int Tk, int d, int blocks) {
    int dev = 0, sms = 0, l2 = 0, per_sm = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, SMEM_BYTES));
    const double kv_bytes = 2.0 * BH * Tk * d * sizeof(u16);
    const double waves = static_cast<double>(blocks) / (sms * (per_sm > 0 ? per_sm : 1));
    return causal && kv_bytes <= 3.0 * l2 && waves <= 12.0 ? 0 : 1;
}

// softmax(scale q k^T + mask) v and the natural-log lse of every row, in double, on the float16 values.
static void cpu_attention(const std::vector<u16>& q, const std::vector<u16>& k, const std::vector<u16>& v, int BH,
                          int Tq, int Tk, int d, double scale, bool causal, std::vector<double>& o,
                          std::vector<double>& lse) {
    std::vector<double> s(Tk);
    for (int bh = 0; bh < BH; ++bh) {
        for (int i = 0; i < Tq; ++i) {
            const size_t qi = (static_cast<size_t>(bh) * Tq + i) * d;
            const int last = causal ? i + Tk - Tq : Tk - 1;  // bottom-right causal mask: keys j <= i + Tk - Tq
            double m = -INFINITY;
            for (int j = 0; j <= last && j < Tk; ++j) {
                const size_t kj = (static_cast<size_t>(bh) * Tk + j) * d;
                double dot = 0.0;
                for (int c = 0; c < d; ++c) dot += half_bits_to_double(q[qi + c]) * half_bits_to_double(k[kj + c]);
                s[j] = scale * dot;
                m = std::fmax(m, s[j]);
            }
            double l = 0.0;
            for (int c = 0; c < d; ++c) o[qi + c] = 0.0;
            for (int j = 0; j <= last && j < Tk; ++j) {
                const double p = std::exp(s[j] - m);
                l += p;
                const size_t vj = (static_cast<size_t>(bh) * Tk + j) * d;
                for (int c = 0; c < d; ++c) o[qi + c] += p * half_bits_to_double(v[vj + c]);
            }
            for (int c = 0; c < d; ++c) o[qi + c] = l > 0.0 ? o[qi + c] / l : 0.0;
            lse[static_cast<size_t>(bh) * Tq + i] = l > 0.0 ? m + std::log(l) : -INFINITY;
        }
    }
}

int main() {
    const int B = 2, H = 2, Tq = 300, Tk = 300, d = 64;  // T not a multiple of BR or BC: ragged last tiles
    const int BH = B * H;
    const size_t nq = static_cast<size_t>(BH) * Tq * d, nk = static_cast<size_t>(BH) * Tk * d;
    std::vector<u16> q(nq), k(nk), v(nk);
    unsigned seed = 2024u;
    for (auto* x : {&q, &k, &v})
        for (auto& e : *x) e = to_half_bits(lcg_uniform(seed));

    int dev = 0, major = 0, optin = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (major < 8 || optin < SMEM_BYTES) {
        std::fprintf(stderr, "flash2_mma needs compute capability 8.0 and %d bytes of shared memory per block\n",
                     SMEM_BYTES);
        return 1;
    }

    u16 *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
    float* dlse = nullptr;
    CHECK(cudaMalloc(&dq, nq * sizeof(u16)));
    CHECK(cudaMalloc(&dk, nk * sizeof(u16)));
    CHECK(cudaMalloc(&dv, nk * sizeof(u16)));
    CHECK(cudaMalloc(&dout, nq * sizeof(u16)));
    CHECK(cudaMalloc(&dlse, static_cast<size_t>(BH) * Tq * sizeof(float)));
    CHECK(cudaMemcpy(dq, q.data(), nq * sizeof(u16), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dk, k.data(), nk * sizeof(u16), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dv, v.data(), nk * sizeof(u16), cudaMemcpyHostToDevice));

    auto kernel = flash2_mma_forward<D, BC, NWARPS, MT, MIN_BLOCKS, false>;
    if (SMEM_BYTES > 48 * 1024)  // past the default 48 KB a kernel must opt in to its dynamic shared memory
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));

    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const float scale_log2 = static_cast<float>(scale * 1.4426950408889634);  // the kernel takes scale * log2(e)
    const int blocks = BH * ((Tq + BR - 1) / BR);
    bool all_ok = true;
    for (int causal = 0; causal <= 1; ++causal) {
        const int head_major = grid_order(kernel, causal, BH, Tk, d, blocks);
        CHECK(cudaMemset(dout, 0xff, nq * sizeof(u16)));  // NaN bits: a row the kernel does not write fails
        kernel<<<blocks, THREADS, SMEM_BYTES>>>(dq, dk, dv, dout, dlse, Tq, Tk, d, scale_log2, causal, head_major);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());

        std::vector<u16> o(nq);
        std::vector<float> lse(static_cast<size_t>(BH) * Tq);
        CHECK(cudaMemcpy(o.data(), dout, nq * sizeof(u16), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(lse.data(), dlse, lse.size() * sizeof(float), cudaMemcpyDeviceToHost));
        std::vector<double> ref(nq), ref_lse(lse.size());
        cpu_attention(q, k, v, BH, Tq, Tk, d, scale, causal, ref, ref_lse);

        double err2 = 0.0, ref2 = 0.0, max_err = 0.0, max_ref = 0.0, max_lse_err = 0.0;
        for (size_t i = 0; i < nq; ++i) {
            const double diff = half_bits_to_double(o[i]) - ref[i];
            err2 += diff * diff;
            ref2 += ref[i] * ref[i];
            max_err = std::isfinite(diff) ? std::fmax(max_err, std::fabs(diff)) : INFINITY;
            max_ref = std::fmax(max_ref, std::fabs(ref[i]));
        }
        for (size_t i = 0; i < lse.size(); ++i) {
            const double diff = ref_lse[i] == -INFINITY ? (lse[i] == -INFINITY ? 0.0 : INFINITY) : lse[i] - ref_lse[i];
            max_lse_err = std::isfinite(diff) ? std::fmax(max_lse_err, std::fabs(diff)) : INFINITY;
        }
        const double rel = std::sqrt(err2 / ref2);
        const bool ok = rel <= 2e-3 && max_err <= 2e-2 * max_ref && max_lse_err <= 1e-3;
        all_ok = all_ok && ok;
        std::printf("flash2_mma_forward<%d, %d, %d, %d, %d, false> B=%d H=%d Tq=%d Tk=%d d=%d causal=%d head_major=%d: "
                    "max abs err %.2e (rel L2 %.2e, lse %.2e) %s\n",
                    D, BC, NWARPS, MT, MIN_BLOCKS, B, H, Tq, Tk, d, causal, head_major, max_err, rel, max_lse_err,
                    ok ? "ok" : "FAILED");
    }

    CHECK(cudaFree(dq));
    CHECK(cudaFree(dk));
    CHECK(cudaFree(dv));
    CHECK(cudaFree(dout));
    CHECK(cudaFree(dlse));
    return all_ok ? 0 : 1;
}
