// cublas_attention.cu -- the one elementwise kernel that cuBLAS attention in llm.c's "v3" shape needs.
//
// What it computes
//   In place on the (B, H, Tq, Tk) float32 score matrix S = Q K^T that the first GEMM wrote:
//     s[b, h, i, j] = scale * s[b, h, i, j]   where query i may see key j,
//     s[b, h, i, j] = -inf                    where the causal mask hides key j from query i.
//   Causal masking is bottom-right aligned: query i sees key j when j <= i + Tk - Tq (FlashAttention >= 2.1).
//
// Algorithm (kernels/cublas/cublas_attention.py)
//   v3: 1. cuBLAS GEMM S = Q K^T; 2. scale_causal_mask (this file): one more read and write of all of S;
//       3. row softmax (softmax.cu, block per row); 4. cuBLAS GEMM O = P V.
//   v4 folds step 2 into step 3 (softmax.cu: softmax_scaled_causal_warp, which reads only the entries a row may see)
//   and does not launch this kernel.
//   The kernel: a grid-stride loop over the elements; element idx is key j = idx % Tk of query i = (idx / Tk) % Tq.
//
// Layout: s (B, H, Tq, Tk) float32, row-major, C-contiguous.
//
// Launch: 1-D; block = BLOCK threads, a multiple of 32 (256 in the launcher);
//   grid = min(ceil(B*H*Tq*Tk / BLOCK), 65536) (the loop strides over the rest); no shared memory.
//
// Kernel (extern "C")
//   scale_causal_mask(float* s, long long total, int Tq, int Tk, float scale, int causal)
//       total = B*H*Tq*Tk elements (a length); scale multiplies s (natural-log units: 1/sqrt(d) for attention);
//       causal = 1 masks, 0 only scales.
//
// Minimum compute capability: plain loads and stores; `nvcc -arch=sm_75` (the oldest CUDA 13 targets) builds it. The
// course runs it from 7.5 (a T4). It includes no header.
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/cublas/cublas_attention.cu -o cublas_attention.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80 (extern "C" kernels: no name expressions)
//
// Limits: indices are 64-bit, so total may exceed 2^31.
// Numerics: one float32 multiply per element; masked entries become -inf, which the softmax turns into 0 (and a row
//   with no visible key into a row of zeros).
// Notes (what comes next, what was tried and measured): kernels/cublas/README.md

#define NEG_INF (-__int_as_float(0x7f800000))

extern "C" __global__ void scale_causal_mask(float* __restrict__ s, long long total, int Tq, int Tk,
                                             float scale, int causal) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const long long j = idx % Tk;           // key index
        const long long i = (idx / Tk) % Tq;    // query index
        const bool hidden = causal && j > i + Tk - Tq;
        s[idx] = hidden ? NEG_INF : s[idx] * scale;
    }
}
