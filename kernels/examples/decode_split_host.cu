// decode_split_host.cu -- decoding attention over a KV cache from plain C++: decode_split_mma and decode_combine
// (kernels/inference/decode_split.cu) called the way kernels/inference/decode_split.py calls them.
//
// Build and run it from the repository root (the run needs a GPU of compute capability 8.0 or newer):
//   nvcc -std=c++17 -arch=sm_80 -I kernels kernels/examples/decode_split_host.cu -o decode_split_host
//   ./decode_split_host
//
// What it does: a float16 KV cache of B = 2 sequences, Hkv = 2 KV heads, Tmax = 1000 rows, d = 128, contiguous (no
// block table), lengths {1000, 357}; one new query row (Tq = 1) for each of Hq = 8 query heads (G = 4 per KV head),
// filled from a fixed-seed LCG. Three launches of the same problem, each checked against a decode in double on the
// CPU (o and lse):
//   1. num_splits = 4 with arrival counters: the last block of each group merges the partials (one launch; what the
//      launcher does with tensor cores and S > 1). Run twice: the kernel leaves the counters zero for the next launch.
//   2. num_splits = 4 without counters (arrivals = nullptr): the split kernel writes float32 partials, decode_combine
//      merges them (two launches).
//   3. num_splits = 1: o_part = lse_part = nullptr, the split kernel writes o and lse itself.
// Prints one line per launch, `decode_split_mma ...: max abs err ... ok`, and exits 0; 1 on any failure.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "inference/decode_split.cu"

namespace {

// Every CUDA call goes through CHECK: on an error, say which call failed and exit 1.
void check_cuda(cudaError_t err, const char* call, int line) {
    if (err == cudaSuccess) return;
    std::fprintf(stderr, "decode_split_host.cu:%d: %s failed: %s\n", line, call, cudaGetErrorString(err));
    std::exit(1);
}

constexpr int B = 2, HQ = 8, HKV = 2, TQ = 1, D = 128, TMAX = 1000;
constexpr int SEQLENS[B] = {1000, 357};
constexpr int G = HQ / HKV;
// The launcher's plan for the tensor-core kernel (decode_split.py: plan, mma_smem_bytes)
constexpr int RB = MMA_ROWS;                                             // query rows per block
constexpr int RC = (G * TQ + RB - 1) / RB;                               // row chunks per KV head
constexpr int THREADS = DECODE_WARPS * WARP_SIZE;                        // block of the split kernels
constexpr int SMEM = DECODE_WARPS * MMA_STAGES * 2 * MMA_KEYS * D * 2;   // dynamic shared memory, bytes
constexpr long long N_ROWS = (long long)B * HQ * TQ;                     // query rows = rows of o and lse
constexpr double LOG2E_D = 1.4426950408889634;

// Fixed-seed LCG -> a float16 value in [-1, 1) (the bit pattern) and the float it stands for.
struct Lcg {
    uint32_t state;
    u16 next(float& value) {
        state = state * 1664525u + 1013904223u;
        const float x = static_cast<float>(state >> 8) / 8388608.0f - 1.0f;  // 24 random bits -> [-1, 1)
        __half_raw h = __half(__float2half_rn(x));
        value = __half2float(__half(h));
        return h.x;
    }
};

float half_bits_to_float(u16 bits) {
    __half_raw h;
    h.x = bits;
    return __half2float(__half(h));
}

struct Problem {
    std::vector<u16> q, k, v;        // (B, HQ, TQ, D), (B, HKV, TMAX, D) x 2: float16 bit patterns
    std::vector<float> qf, kf, vf;   // the same values as floats
    std::vector<double> o_ref, lse_ref;
};

// The decode of reference/decode.py in double: query i of sequence b sees key j when j <= i + L_b - TQ.
void cpu_decode(Problem& p, double scale) {
    p.o_ref.assign(N_ROWS * D, 0.0);
    p.lse_ref.assign(N_ROWS, -INFINITY);
    std::vector<double> s(TMAX);
    for (int b = 0; b < B; ++b)
        for (int hq = 0; hq < HQ; ++hq)
            for (int i = 0; i < TQ; ++i) {
                const long long row = ((long long)b * HQ + hq) * TQ + i;
                const int hk = hq / G, n = std::min(std::max(SEQLENS[b] - TQ + 1 + i, 0), SEQLENS[b]);
                if (n == 0) continue;  // o = 0, lse = -inf
                double mx = -INFINITY;
                for (int j = 0; j < n; ++j) {
                    double dot = 0.0;
                    for (int e = 0; e < D; ++e)
                        dot += (double)p.qf[row * D + e] * p.kf[(((long long)b * HKV + hk) * TMAX + j) * D + e];
                    s[j] = scale * dot;
                    mx = std::max(mx, s[j]);
                }
                double l = 0.0;
                for (int j = 0; j < n; ++j) l += std::exp(s[j] - mx);
                for (int j = 0; j < n; ++j) {
                    const double w = std::exp(s[j] - mx) / l;
                    for (int e = 0; e < D; ++e)
                        p.o_ref[row * D + e] += w * p.vf[(((long long)b * HKV + hk) * TMAX + j) * D + e];
                }
                p.lse_ref[row] = mx + std::log(l);
            }
}

// Compare o (float16) and lse with the CPU decode; print the result line; true when within tolerance.
bool check(const char* what, const Problem& p, const std::vector<u16>& o, const std::vector<float>& lse) {
    double err_o = 0.0, err_lse = 0.0;
    bool finite = true;  // a value left unwritten (NaN: see poison() below) must not slip past std::max
    for (long long x = 0; x < N_ROWS * D; ++x) {
        const double d = std::fabs(half_bits_to_float(o[x]) - p.o_ref[x]);
        finite = finite && std::isfinite(d);
        err_o = std::max(err_o, d);
    }
    for (long long r = 0; r < N_ROWS; ++r) {
        const double d = std::fabs(lse[r] - p.lse_ref[r]);
        finite = finite && std::isfinite(d);
        err_lse = std::max(err_lse, d);
    }
    const bool ok = finite && err_o < 2e-3 && err_lse < 1e-3;  // float16 o and P; float32 sums and lse
    std::printf("decode_split_mma %s: max abs err o %.2e, lse %.2e: %s\n", what, err_o, err_lse, ok ? "ok" : "FAILED");
    return ok;
}

}  // namespace

#define CHECK(call) check_cuda((call), #call, __LINE__)

int main() {
    int dev = 0, major = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 8) {
        std::fprintf(stderr, "decode_split_mma needs compute capability 8.0 or newer\n");
        return 1;
    }

    // ---- the problem on the host ----------------------------------------------------------------------------
    Problem p;
    Lcg lcg{12345u};
    auto fill = [&](std::vector<u16>& bits, std::vector<float>& vals, size_t n) {
        bits.resize(n), vals.resize(n);
        for (size_t x = 0; x < n; ++x) bits[x] = lcg.next(vals[x]);
    };
    fill(p.q, p.qf, (size_t)N_ROWS * D);
    fill(p.k, p.kf, (size_t)B * HKV * TMAX * D);
    fill(p.v, p.vf, (size_t)B * HKV * TMAX * D);
    const double scale = 1.0 / std::sqrt((double)D);
    const float scale_log2 = (float)(scale * LOG2E_D);  // the kernels take scale * log2(e)
    cpu_decode(p, scale);

    // ---- device buffers ----------------------------------------------------------------------------------------
    const int max_splits = 4;
    u16 *q, *k, *v, *o;
    int* seqlens;
    float *lse, *work;
    unsigned int* arrivals;
    CHECK(cudaMalloc(&q, p.q.size() * sizeof(u16)));
    CHECK(cudaMalloc(&k, p.k.size() * sizeof(u16)));
    CHECK(cudaMalloc(&v, p.v.size() * sizeof(u16)));
    CHECK(cudaMalloc(&o, N_ROWS * D * sizeof(u16)));
    CHECK(cudaMalloc(&lse, N_ROWS * sizeof(float)));
    CHECK(cudaMalloc(&seqlens, B * sizeof(int)));
    // the float32 partials of S splits: o_part (B, HQ, TQ, S, D), then lse_part (B, HQ, TQ, S)
    CHECK(cudaMalloc(&work, N_ROWS * max_splits * (D + 1) * sizeof(float)));
    CHECK(cudaMalloc(&arrivals, B * HKV * RC * sizeof(unsigned int)));
    CHECK(cudaMemcpy(q, p.q.data(), p.q.size() * sizeof(u16), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(k, p.k.data(), p.k.size() * sizeof(u16), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(v, p.v.data(), p.v.size() * sizeof(u16), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(seqlens, SEQLENS, B * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(arrivals, 0, B * HKV * RC * sizeof(unsigned int)));  // zero before the first launch

    // ---- the kernels, configured as the launcher does: 64 KB of dynamic shared memory needs the opt-in ----------
    auto split_kernel = decode_split_mma<D, false>;
    auto combine_kernel = decode_combine<D, false>;
    CHECK(cudaFuncSetAttribute(split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    CHECK(cudaFuncSetAttribute(split_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));

    // One call of the split kernel: contiguous cache (block_table nullptr, cache_rows = Tmax, page_shift = max_pages
    // = num_pages = 0); o_part null for one split; arrivals null when decode_combine merges.
    auto launch_split = [&](int S, float* o_part, float* lse_part, unsigned int* counters) {
        const dim3 grid(S * RC, HKV, B);
        split_kernel<<<grid, THREADS, SMEM>>>(q, k, v, seqlens, nullptr, o, lse, o_part, lse_part, counters, HQ, HKV,
                                              TQ, TMAX, 0, 0, 0, S, RC, scale_log2);
        CHECK(cudaGetLastError());
    };
    std::vector<u16> o_host(N_ROWS * D);
    std::vector<float> lse_host(N_ROWS);
    auto fetch = [&]() {
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(o_host.data(), o, o_host.size() * sizeof(u16), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(lse_host.data(), lse, lse_host.size() * sizeof(float), cudaMemcpyDeviceToHost));
    };
    auto poison = [&]() {  // a result left over from the previous launch must not pass
        CHECK(cudaMemset(o, 0xff, N_ROWS * D * sizeof(u16)));
        CHECK(cudaMemset(lse, 0xff, N_ROWS * sizeof(float)));
    };
    bool ok = true;

    // 1. S = 4, merged in the kernel by the last block of each group; twice (the counters come back zero)
    {
        const int S = 4;
        float* o_part = work;
        float* lse_part = work + N_ROWS * S * D;
        for (int run = 1; run <= 2; ++run) {
            poison();
            launch_split(S, o_part, lse_part, arrivals);
            fetch();
            char what[64];
            std::snprintf(what, sizeof what, "(S=%d, merged in the kernel, launch %d)", S, run);
            ok = check(what, p, o_host, lse_host) && ok;
        }
        std::vector<unsigned int> counters(B * HKV * RC);
        CHECK(cudaMemcpy(counters.data(), arrivals, counters.size() * sizeof(unsigned int), cudaMemcpyDeviceToHost));
        bool zero = true;
        for (unsigned int c : counters) zero = zero && c == 0u;
        if (!zero) std::printf("decode_split_mma: the arrival counters were not left zero: FAILED\n");
        ok = ok && zero;
    }

    // 2. S = 4, partials merged by decode_combine: one warp per query row
    {
        const int S = 4;
        float* o_part = work;
        float* lse_part = work + N_ROWS * S * D;
        poison();
        launch_split(S, o_part, lse_part, nullptr);
        const int blocks = (int)((N_ROWS + COMBINE_WARPS - 1) / COMBINE_WARPS);
        combine_kernel<<<blocks, COMBINE_WARPS * WARP_SIZE>>>(o_part, lse_part, o, lse, N_ROWS, S);
        CHECK(cudaGetLastError());
        fetch();
        ok = check("(S=4) + decode_combine", p, o_host, lse_host) && ok;
    }

    // 3. S = 1: the split kernel writes o and lse itself
    {
        poison();
        launch_split(1, nullptr, nullptr, nullptr);
        fetch();
        ok = check("(S=1)", p, o_host, lse_host) && ok;
    }

    CHECK(cudaFree(q));
    CHECK(cudaFree(k));
    CHECK(cudaFree(v));
    CHECK(cudaFree(o));
    CHECK(cudaFree(lse));
    CHECK(cudaFree(seqlens));
    CHECK(cudaFree(work));
    CHECK(cudaFree(arrivals));
    if (!ok) std::fprintf(stderr, "decode_split_host: FAILED\n");
    return ok ? 0 : 1;
}
