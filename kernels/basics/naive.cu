// naive.cu -- attention in three plain kernels, one thread per output element (the llm.c "v1" design).
//
// What it computes
//   O = softmax(scale * Q K^T [+ causal mask]) V  for Q (B, H, Tq, d), K and V (B, H, Tk, d), float32,
//   all row-major and contiguous. Causal masking is bottom-right aligned: query i sees key j when
//   j <= i + Tk - Tq. A query row that sees no key gives O = 0.
//
// Algorithm (three launches, the full score matrix goes through global memory)
//   1. attention_query_key: preatt[b,h,i,j] = scale * dot(Q[b,h,i,:], K[b,h,j,:]), or -inf if masked.
//   2. attention_softmax:   att[b,h,i,:] = softmax(preatt[b,h,i,:]); a fully masked row becomes zeros.
//   3. attention_value:     O[b,h,i,c] = sum_j att[b,h,i,j] * V[b,h,j,c].
//   Plus permute_qkv / unpermute, which convert llm.c's packed (B, T, 3, NH, d) layout to (B, NH, T, d)
//   and back.
//
// Launch configuration (block = BLOCK threads, chosen by the launcher; 1-D grids)
//   attention_query_key: grid = ceil(B*H*Tq*Tk / BLOCK)  one thread per score
//   attention_softmax:   grid = ceil(B*H*Tq / BLOCK)     one thread per row (three passes over the row)
//   attention_value:     grid = ceil(B*H*Tq*d / BLOCK)   one thread per output element
//   permute_qkv:         grid = ceil(B*NH*T*d / BLOCK)   one thread per (q, k, v) triple of elements
//   No shared memory.
//
// Limits
//   Scores are indexed with 64-bit integers, so B*H*Tq*Tk may exceed 2^31; the score matrix needs
//   2 * 4 * B*H*Tq*Tk bytes of scratch, which is what limits T in practice.
//
// Numerics
//   float32 throughout, accurate expf (no fast-math), max-subtracted softmax with a compensated (Kahan) sum.
//
// Why it is slow, and what comes next
//   Every score is written to and read back from global memory (O(T^2) traffic), each thread of
//   attention_query_key reads its own 2*d inputs with no reuse between threads, and the one-thread-per-row
//   softmax leaves most of the GPU idle for small B*H*Tq. Notebook 02 makes the softmax fast; notebooks
//   03-04 (FlashAttention) never write the score matrix at all.

#define NEG_INF (-__int_as_float(0x7f800000))

// ---- 1. scores -------------------------------------------------------------------------------------
extern "C" __global__ void attention_query_key(float* __restrict__ preatt,
                                               const float* __restrict__ q,
                                               const float* __restrict__ k,
                                               int BH, int Tq, int Tk, int d,
                                               float scale, int causal) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)BH * Tq * Tk;
    if (idx >= total) return;
    int j = (int)(idx % Tk);
    int i = (int)((idx / Tk) % Tq);
    long long bh = idx / ((long long)Tk * Tq);
    if (causal && j > i + Tk - Tq) {  // bottom-right aligned mask
        preatt[idx] = NEG_INF;
        return;
    }
    const float* qi = q + (bh * Tq + i) * d;
    const float* kj = k + (bh * Tk + j) * d;
    float acc = 0.0f;
    for (int c = 0; c < d; ++c) acc += qi[c] * kj[c];
    preatt[idx] = acc * scale;
}

// ---- 2. softmax, one thread per row ----------------------------------------------------------------
extern "C" __global__ void attention_softmax(float* __restrict__ att,
                                             const float* __restrict__ preatt,
                                             long long rows, int Tk) {
    long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) return;
    const float* x = preatt + row * Tk;
    float* y = att + row * Tk;
    float maxval = NEG_INF;
    for (int j = 0; j < Tk; ++j) maxval = fmaxf(maxval, x[j]);
    if (maxval == NEG_INF) {  // the row sees no key: zeros, not 0/0
        for (int j = 0; j < Tk; ++j) y[j] = 0.0f;
        return;
    }
    float sum = 0.0f, carry = 0.0f;  // Kahan summation: one thread adds up Tk terms
    for (int j = 0; j < Tk; ++j) {
        float e = expf(x[j] - maxval);  // expf(-inf) == 0 for masked scores
        y[j] = e;
        const float term = e - carry;
        const float next = sum + term;
        carry = (next - sum) - term;
        sum = next;
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < Tk; ++j) y[j] *= inv;
}

// ---- 3. weighted sum of values ---------------------------------------------------------------------
extern "C" __global__ void attention_value(float* __restrict__ out,
                                           const float* __restrict__ att,
                                           const float* __restrict__ v,
                                           int BH, int Tq, int Tk, int d) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)BH * Tq * d;
    if (idx >= total) return;
    int c = (int)(idx % d);
    long long row = idx / d;  // = bh * Tq + i
    long long bh = row / Tq;
    const float* a = att + row * Tk;
    const float* vc = v + bh * Tk * d + c;
    float acc = 0.0f;
    for (int j = 0; j < Tk; ++j) acc += a[j] * vc[(long long)j * d];
    out[idx] = acc;
}

// ---- llm.c layout bridge ---------------------------------------------------------------------------
// inp: (B, T, 3, NH, d)  ->  q, k, v: (B, NH, T, d)
extern "C" __global__ void permute_qkv(float* __restrict__ q, float* __restrict__ k, float* __restrict__ v,
                                       const float* __restrict__ inp, int B, int T, int NH, int d) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)B * NH * T * d;
    if (idx >= total) return;
    int c = (int)(idx % d);
    int t = (int)((idx / d) % T);
    int h = (int)((idx / ((long long)d * T)) % NH);
    int b = (int)(idx / ((long long)d * T * NH));
    long long src = (((long long)b * T + t) * 3 * NH + h) * d + c;  // the q slot; k and v follow
    long long stride = (long long)NH * d;
    q[idx] = inp[src];
    k[idx] = inp[src + stride];
    v[idx] = inp[src + 2 * stride];
}

// o: (B, NH, T, d)  ->  out: (B, T, NH, d)
extern "C" __global__ void unpermute(float* __restrict__ out, const float* __restrict__ o,
                                     int B, int T, int NH, int d) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)B * NH * T * d;
    if (idx >= total) return;
    int c = (int)(idx % d);
    int t = (int)((idx / d) % T);
    int h = (int)((idx / ((long long)d * T)) % NH);
    int b = (int)(idx / ((long long)d * T * NH));
    out[(((long long)b * T + t) * NH + h) * d + c] = o[idx];
}
