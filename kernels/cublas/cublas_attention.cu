// cublas_attention.cu -- the one elementwise kernel that cuBLAS attention in llm.c's "v3" shape needs.
//
// What it computes
//   s[b, h, i, j] = scale * s[b, h, i, j]                 where query i may see key j
//   s[b, h, i, j] = -inf                                  where the causal mask hides key j from query i
//   in place, on the (B, H, Tq, Tk) float32 score matrix that the first GEMM (S = Q K^T) wrote.
//   Causal masking is bottom-right aligned: query i sees key j when j <= i + Tk - Tq (FlashAttention >= 2.1).
//
// Where it sits (kernels/cublas/cublas_attention.py)
//   v3:  cuBLAS GEMM S = Q K^T  ->  scale_causal_mask (this file)  ->  row softmax (softmax.cu, block per row)
//        ->  cuBLAS GEMM O = P V.  The scale and the mask cost one extra read and write of all of S.
//   v4:  the scale and the mask are folded into the softmax (softmax.cu: softmax_scaled_causal_warp), which
//        reads only the entries a row may see; this kernel is not launched at all.
//
// Launch configuration (1-D, grid-stride loop, chosen by the launcher)
//   block = BLOCK threads (a multiple of 32), grid = min(ceil(B*H*Tq*Tk / BLOCK), MAX_GRID)
//   No shared memory. Indices are 64-bit, so B*H*Tq*Tk may exceed 2^31.
//
// Numerics
//   One float32 multiply per element; masked entries become -inf, which the softmax turns into 0
//   (and a row with no visible key into a row of zeros).
//
// What comes next
//   v4 removes this pass. FlashAttention (notebooks 03-04) removes the score matrix altogether.

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
