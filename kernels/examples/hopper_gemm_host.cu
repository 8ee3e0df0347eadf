// hopper_gemm_host.cu -- calling a Hopper kernel from C++: hopper_gemm_f16_f32 of kernels/hopper/hopper_gemm.cu.
//
// What it does
//   1. fills A (batch, M, K) and B (batch, N, K), float16, with values in [-1, 1) from a fixed-seed LCG (the same
//      numbers every run); M, N and K are not multiples of the kernel's tiles, so the ragged edges are exercised;
//   2. describes each to TMA with a CUtensorMap, as kernels/hopper/hopper_gemm.py does: a (K, rows, batch) tensor,
//      innermost first, read in boxes of BLOCK_K x BLOCK_M (A) or BLOCK_K x BLOCK_N (B) with the 128-byte swizzle and
//      zero fill. cuTensorMapEncodeTiled is a driver function; it is fetched through the runtime
//      (cudaGetDriverEntryPointByVersion), so the program needs no -lcuda;
//   3. launches the kernel as the launcher does: grid = min(tiles, SMs) (persistent), block = THREADS (384),
//      SMEM_BYTES of dynamic shared memory (opted into above 48 KB with cudaFuncSetAttribute); C starts as NaN;
//   4. copies C back and checks every entry against a CPU GEMM in double on the same float16 inputs: |error| at most
//      1e-4 of sum_k |a_ik b_jk| (the products are exact in float32, only the sums round: a wrong or unwritten entry
//      is off by the order of that sum, a right one by a few float32 roundings of it);
//   5. prints `hopper_gemm_f16_f32 batch=... M=... N=... K=...: max abs err ..., worst error / bound ... ok` and exits
//      0, or exits 1 on a mismatch, on a GPU that is not compute capability 9.0, or on any CUDA error.
//
// Build and run it, from the repository root (a Hopper GPU: the kernel is built for sm_90a):
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I kernels kernels/examples/hopper_gemm_host.cu -o hopper_gemm_host
//   ./hopper_gemm_host [batch M N K]          (default 2 300 520 136; K % 8 == 0)
//
// The kernel file is included as it stands ("hopper/hopper_gemm.cu", found through -I kernels); a copier takes that
// file, kernels/ptx/ (the PTX headers it includes) and this one.

#include "hopper/hopper_gemm.cu"

#include <cuda.h>  // CUtensorMap and its enums (types only: nothing is linked from libcuda)
#include <cuda_fp16.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CUDA_CHECK(call)                                                                                 \
    do {                                                                                                 \
        const cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                    \
                         cudaGetErrorString(err_));                                                      \
            std::exit(1);                                                                                \
        }                                                                                                \
    } while (0)

static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) >= 64,
              "the kernel's TensorMap holds a CUtensorMap: 128 bytes, aligned as the driver requires (64)");

// x_{n+1} = a x_n + c mod 2^64 (Knuth's MMIX constants); the top 24 bits give a float in [0, 1).
struct Lcg {
    uint64_t state;
    float next() {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<float>(state >> 40) * (1.0f / 16777216.0f);
    }
};

// The tensor map of a (batch, rows, K) row-major float16 tensor at `data`, read in boxes of BLOCK_K x box_rows.
static TensorMap make_map(PFN_cuTensorMapEncodeTiled_v12000 encode, void* data, int batch, int rows, int K,
                          int box_rows) {
    CUtensorMap encoded;
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(rows),
                                static_cast<cuuint64_t>(batch)};
    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(K) * ELEM_BYTES,  // bytes from one row to the next
                                   static_cast<cuuint64_t>(rows) * K * ELEM_BYTES};  // ... one batch entry to the next
    const cuuint32_t box[3] = {BLOCK_K, static_cast<cuuint32_t>(box_rows), 1};
    const cuuint32_t steps[3] = {1, 1, 1};
    const CUresult err = encode(&encoded, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, data, dims,
                                strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (err != CUDA_SUCCESS) {
        std::fprintf(stderr, "cuTensorMapEncodeTiled failed with CUresult %d for a (%d, %d, %d) tensor\n",
                     static_cast<int>(err), batch, rows, K);
        std::exit(1);
    }
    TensorMap map;
    std::memcpy(&map, &encoded, sizeof(map));
    return map;
}

int main(int argc, char** argv) {
    const int batch = argc > 4 ? std::atoi(argv[1]) : 2;
    const int M = argc > 4 ? std::atoi(argv[2]) : 300;
    const int N = argc > 4 ? std::atoi(argv[3]) : 520;
    const int K = argc > 4 ? std::atoi(argv[4]) : 136;
    if (batch < 1 || M < 1 || N < 1 || K < 8 || K % 8 != 0) {
        std::fprintf(stderr, "usage: %s [batch M N K], all >= 1, K a multiple of 8\n", argv[0]);
        return 1;
    }
    int dev = 0, major = 0, minor = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (major != 9 || minor != 0) {
        std::fprintf(stderr, "the kernel is built for sm_90a, which runs on compute capability 9.0 only; this GPU "
                             "has %d.%d\n", major, minor);
        return 1;
    }

    // 1. the inputs, rounded to float16 once (the CPU reference uses the rounded values)
    const size_t na = static_cast<size_t>(batch) * M * K, nb = static_cast<size_t>(batch) * N * K;
    const size_t nc = static_cast<size_t>(batch) * M * N;
    std::vector<__half> a(na), b(nb);
    Lcg rng{42};
    for (auto& x : a) x = __float2half(2.0f * rng.next() - 1.0f);
    for (auto& x : b) x = __float2half(2.0f * rng.next() - 1.0f);
    __half *d_a = nullptr, *d_b = nullptr;
    float* d_c = nullptr;
    CUDA_CHECK(cudaMalloc(&d_a, na * sizeof(__half)));  // cudaMalloc aligns to 256 bytes: TMA needs 16
    CUDA_CHECK(cudaMalloc(&d_b, nb * sizeof(__half)));
    CUDA_CHECK(cudaMalloc(&d_c, nc * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_a, a.data(), na * sizeof(__half), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(d_b, b.data(), nb * sizeof(__half), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(d_c, 0xff, nc * sizeof(float)));  // all bits set: NaN, so an entry never written fails

    // 2. the tensor maps
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
        std::fprintf(stderr, "the driver has no cuTensorMapEncodeTiled (a driver for CUDA 12.0 or later is needed)\n");
        return 1;
    }
    const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    const TensorMap map_a = make_map(encode, d_a, batch, M, K, BLOCK_M);
    const TensorMap map_b = make_map(encode, d_b, batch, N, K, BLOCK_N);

    // 3. the launch of kernels/hopper/hopper_gemm.py's gemm_abt(a, b)
    const long long tiles =
        static_cast<long long>(batch) * ((M + BLOCK_M - 1) / BLOCK_M) * ((N + BLOCK_N - 1) / BLOCK_N);
    const int grid = static_cast<int>(std::min<long long>(tiles, sms));  // persistent: one block per SM at most
    CUDA_CHECK(cudaFuncSetAttribute(hopper_gemm_f16_f32, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
    hopper_gemm_f16_f32<<<grid, THREADS, SMEM_BYTES>>>(map_a, map_b, d_c, M, N, K, batch);
    CUDA_CHECK(cudaGetLastError());            // a bad launch configuration
    CUDA_CHECK(cudaDeviceSynchronize());       // a fault inside the kernel

    // 4. back, and the check against the CPU
    std::vector<float> c(nc);
    CUDA_CHECK(cudaMemcpy(c.data(), d_c, nc * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_a));
    CUDA_CHECK(cudaFree(d_b));
    CUDA_CHECK(cudaFree(d_c));
    std::vector<double> af(na), bf(nb);
    for (size_t i = 0; i < na; ++i) af[i] = __half2float(a[i]);
    for (size_t i = 0; i < nb; ++i) bf[i] = __half2float(b[i]);
    double max_abs = 0.0, worst = 0.0;  // worst: the largest |error| / bound
    bool finite = true;
    for (int e = 0; e < batch; ++e) {
        for (int i = 0; i < M; ++i) {
            const double* ar = &af[(static_cast<size_t>(e) * M + i) * K];
            for (int j = 0; j < N; ++j) {
                const double* br = &bf[(static_cast<size_t>(e) * N + j) * K];
                double want = 0.0, mag = 0.0;
                for (int k = 0; k < K; ++k) {
                    want += ar[k] * br[k];
                    mag += std::fabs(ar[k] * br[k]);
                }
                const double got = c[(static_cast<size_t>(e) * M + i) * N + j];
                const double err = std::fabs(got - want);
                finite = finite && std::isfinite(got);
                max_abs = std::fmax(max_abs, err);
                worst = std::fmax(worst, err / (1e-4 * mag + 1e-30));
            }
        }
    }
    const bool ok = finite && worst <= 1.0;

    // 5. the verdict
    std::printf("hopper_gemm_f16_f32 batch=%d M=%d N=%d K=%d: max abs err %.1e, worst error / bound %.2f %s\n", batch,
                M, N, K, max_abs, worst, ok ? "ok" : "MISMATCH");
    return ok ? 0 : 1;
}
