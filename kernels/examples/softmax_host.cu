// softmax_host.cu -- calling a course kernel from C++: softmax_warp_per_row of kernels/basics/softmax.cu.
//
// What it does
//   1. fills a float32 (rows, cols) matrix with values in [-8, 8) from a fixed-seed LCG (the same numbers every run);
//   2. copies it to the GPU and launches softmax_warp_per_row as kernels/basics/softmax.py does: a warp per row,
//      block = 256 threads (8 rows per block), grid = ceil(rows / 8), no shared memory;
//   3. copies the result back and checks every row against a softmax computed on the CPU in double precision, with
//      the course's float32 bounds (relative L2 error <= 1e-5, worst element <= 1e-4 of the largest value);
//   4. prints `softmax_warp_per_row rows=... cols=...: max abs err ..., rel L2 err ... ok` and exits 0, or exits 1
//      on a mismatch or on any CUDA error (every CUDA call is checked).
//
// Build and run it, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels kernels/examples/softmax_host.cu -o softmax_host
//   ./softmax_host [rows cols]          (default 4096 x 1000)
//
// The kernel file is included as it stands ("basics/softmax.cu", found through -I kernels); a copier takes that
// file (it includes no other) and this one.

#include "basics/softmax.cu"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

// x_{n+1} = a x_n + c mod 2^64 (Knuth's MMIX constants); the top 24 bits give a float in [0, 1).
struct Lcg {
    uint64_t state;
    float next() {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<float>(state >> 40) * (1.0f / 16777216.0f);
    }
};

// Softmax of one row in double: the reference.
static void softmax_row_cpu(const float* x, double* y, int cols) {
    double m = -INFINITY;
    for (int j = 0; j < cols; ++j) m = std::fmax(m, static_cast<double>(x[j]));
    double l = 0.0;
    for (int j = 0; j < cols; ++j) l += std::exp(static_cast<double>(x[j]) - m);
    for (int j = 0; j < cols; ++j) y[j] = std::exp(static_cast<double>(x[j]) - m) / l;
}

int main(int argc, char** argv) {
    const long long rows = argc > 2 ? std::atoll(argv[1]) : 4096;
    const int cols = argc > 2 ? std::atoi(argv[2]) : 1000;
    if (rows < 1 || cols < 1) {
        std::fprintf(stderr, "usage: %s [rows cols], both >= 1\n", argv[0]);
        return 1;
    }
    const size_t n = static_cast<size_t>(rows) * cols;

    // 1. the input
    std::vector<float> x(n), y(n);
    Lcg rng{42};
    for (size_t i = 0; i < n; ++i) x[i] = 16.0f * rng.next() - 8.0f;

    // 2. to the GPU, and the launch of kernels/basics/softmax.py's softmax(x, method="warp")
    float *d_x = nullptr, *d_y = nullptr;
    CUDA_CHECK(cudaMalloc(&d_x, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_y, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d_x, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    const int block = 256;                     // threads per block: 8 warps, 8 rows
    const int rows_per_block = block / WARP_SIZE;
    const long long grid = (rows + rows_per_block - 1) / rows_per_block;
    if (grid > 2147483647LL) {
        std::fprintf(stderr, "%lld rows need %lld blocks; grid.x allows 2^31 - 1\n", rows, grid);
        return 1;
    }
    softmax_warp_per_row<<<static_cast<unsigned>(grid), block>>>(d_y, d_x, rows, cols);
    CUDA_CHECK(cudaGetLastError());            // a bad launch configuration
    CUDA_CHECK(cudaDeviceSynchronize());       // a fault inside the kernel

    // 3. back, and the check against the CPU
    CUDA_CHECK(cudaMemcpy(y.data(), d_y, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(d_x));
    CUDA_CHECK(cudaFree(d_y));
    std::vector<double> ref(cols);
    double max_abs = 0.0, max_ref = 0.0, err2 = 0.0, ref2 = 0.0;
    bool finite = true;  // a NaN or inf in the output fails, whatever the error sums say
    for (long long r = 0; r < rows; ++r) {
        softmax_row_cpu(&x[static_cast<size_t>(r) * cols], ref.data(), cols);
        for (int j = 0; j < cols; ++j) {
            const double got = y[static_cast<size_t>(r) * cols + j], want = ref[j];
            const double e = std::fabs(got - want);
            finite = finite && std::isfinite(got);
            max_abs = std::fmax(max_abs, e);
            max_ref = std::fmax(max_ref, std::fabs(want));
            err2 += e * e;
            ref2 += want * want;
        }
    }
    const double rel_l2 = std::sqrt(err2 / ref2);
    const bool ok = finite && rel_l2 <= 1e-5 && max_abs <= 1e-4 * max_ref;

    // 4. the verdict
    std::printf("softmax_warp_per_row rows=%lld cols=%d: max abs err %.1e, rel L2 err %.1e %s\n", rows, cols, max_abs,
                rel_l2, ok ? "ok" : "MISMATCH");
    return ok ? 0 : 1;
}
