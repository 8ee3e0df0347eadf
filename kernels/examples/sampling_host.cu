// sampling_host.cu -- calling kernels/sampling/threshold.cu from C++: top-p sampling of a batch of logit rows with
// sample_threshold, checked on the CPU: every sampled token must lie in its row's kept set (the shortest prefix of the
// ranking whose probability mass reaches p), computed in double precision.
//
// Build and run, from the repository root (any GPU of sm_80 or newer):
//   nvcc -std=c++17 -arch=sm_80 -I kernels kernels/examples/sampling_host.cu -o sampling_host
//   ./sampling_host
//
// The launch, as the header of threshold.cu gives it: grid rows, block SAMPLE_THREADS, no dynamic shared memory (the
// kernel's static shared memory, about 35 KB, fits the default 48 KB). Arguments: inv_t = 1 / temperature, top_k = 0
// (off), probs = nullptr (no renormalised rows). A row's token is exact against the float64 reference except where a
// cumulative mass lies within float32 rounding of p * Z; the check below allows that margin (1e-5 of the row's mass).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "sampling/threshold.cu"

#define CHECK(call)                                                                                      \
    do {                                                                                                 \
        cudaError_t err_ = (call);                                                                       \
        if (err_ != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
            return 1;                                                                                    \
        }                                                                                                \
    } while (0)

// The tokens a row may give under top-p (and temperature t): the shortest prefix of the ranking (larger logit first,
// ties by the lower index) whose mass reaches p * Z, widened by `slack` of Z for float32 rounding at the boundary.
static std::vector<bool> kept_set(const float* x, int V, double t, double p, double slack) {
    std::vector<int> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    const double m = x[order[0]];
    std::vector<double> w(V);
    double z = 0.0;
    for (int i = 0; i < V; ++i) z += (w[i] = std::exp((x[i] - m) / t));
    std::vector<bool> kept(V, false);
    double cum = 0.0;
    for (int j = 0; j < V; ++j) {
        kept[order[j]] = true;
        cum += w[order[j]];
        if (cum >= (p + slack) * z) break;
    }
    return kept;
}

int main() {
    const int rows = 8, V = 50257;  // an odd V: rows start at every alignment, as in a real (rows, V) logits matrix
    const float temperature = 0.8f, top_p = 0.9f;
    const unsigned long long seed = 1234, offset = 7;

    std::vector<float> logits((size_t)rows * V);
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    for (float& v : logits) v = normal(rng);

    float* d_logits = nullptr;
    int* d_tokens = nullptr;
    CHECK(cudaMalloc(&d_logits, logits.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_tokens, rows * sizeof(int)));
    CHECK(cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));

    sample_threshold<<<rows, SAMPLE_THREADS>>>(d_logits, V, 1.0f / temperature, /*top_k=*/0, top_p, seed, offset,
                                               d_tokens, /*probs=*/nullptr);
    CHECK(cudaGetLastError());
    std::vector<int> tokens(rows);
    CHECK(cudaMemcpy(tokens.data(), d_tokens, rows * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d_logits));
    CHECK(cudaFree(d_tokens));

    int bad = 0;
    for (int r = 0; r < rows; ++r) {
        const float* x = logits.data() + (size_t)r * V;
        const std::vector<bool> kept = kept_set(x, V, temperature, top_p, 1e-5);
        const int n_kept = (int)std::count(kept.begin(), kept.end(), true);
        const bool ok = tokens[r] >= 0 && tokens[r] < V && kept[tokens[r]];
        bad += ok ? 0 : 1;
        std::printf("row %d: token %5d (logit %+.3f), %d tokens kept%s\n", r, tokens[r],
                    tokens[r] >= 0 && tokens[r] < V ? x[tokens[r]] : 0.0f, n_kept, ok ? "" : "  <- outside the kept set");
    }
    if (bad) {
        std::printf("sampling_host: %d of %d tokens outside their kept set: FAILED\n", bad, rows);
        return 1;
    }
    std::printf("sampling_host: %d rows, V = %d, top-p %.2f, temperature %.2f: every token in its kept set ... ok\n",
                rows, V, top_p, temperature);
    return 0;
}
