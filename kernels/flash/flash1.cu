// flash1.cu -- FlashAttention-1 forward, in the loop order of the paper (Dao et al. 2022, Algorithm 1).
//
// What it computes
//   O = softmax(scale * Q K^T [+ causal mask]) V and LSE = log(sum_j exp(scale * q_i . k_j)) (natural log),
//   for Q (B, H, Tq, d), K and V (B, H, Tk, d), O (B, H, Tq, d), LSE (B, H, Tq); float32, row-major, contiguous.
//   Causal masking is bottom-right aligned: query i sees key j when j <= i + Tk - Tq. A row that sees no key gives
//   O = 0 and LSE = -inf. This is llm.c's attention_forward v2 / flash-attention-minimal made right: any Tq and Tk
//   (not only multiples of the tile), d up to 128 (more than 48 KB of shared memory, requested), causal or not,
//   any scale, rows that see nothing.
//
// Algorithm (K/V tiles OUTER, Q tiles INNER, as in the paper)
//   0. HBM holds O, l (row sums) and m (row maxima) for every query row: O = 0, l = 0, m = -inf.
//   1. For each K/V tile j of BC keys (loaded once into shared memory):
//   2.   for each Q tile i of BR rows (skipped when causal masks all of it):
//          load Q_i (SRAM), read O_i, l_i, m_i (HBM)
//          S = scale * Q_i K_j^T;  m~ = rowmax S;  P = exp(S - m~);  l~ = rowsum P
//          m_new = max(m_i, m~);   l_new = e^(m_i - m_new) l_i + e^(m~ - m_new) l~
//          O_i = (l_i e^(m_i - m_new) O_i + e^(m~ - m_new) P V_j) / l_new     (O stays normalised)
//          write O_i, l_new, m_new back to HBM
//   3. LSE = m + log l. Every query row's state makes a round trip through global memory once per K/V tile: that
//      round trip, and one block per (b, h), are what FlashAttention-2 (flash2.cu, notebook 04) removes.
//
// Parallelism (the design of the paper's reference code and of flash-attention-minimal)
//   One block (one warp) per (b, h); thread t owns query row q0 + t of every Q tile, so each O/l/m row is read and
//   written by one thread only (no race on global memory) and the Q and S rows in shared memory are private to
//   their thread (no barrier inside the Q loop). At B=8, H=12 that is 96 warps on a GPU with 132 SMs: the GPU is
//   mostly idle. That is the lesson.
//
// Global traffic of O, l, m per K/V tile (one (b, h), no causal skipping)
//   read O_i, l_i, m_i and write them back for all Tq rows: 8 * Tq * (d + 2) bytes, plus Tq * d floats of Q read
//   again; over the ceil(Tk / BC) K/V tiles 8 * Tq * (d + 2) * ceil(Tk / BC) bytes per head (B=8, H=12, T=1024,
//   d=64: 1.66 GB, about half of it with causal skipping), where the output itself is 4 * Tq * d bytes per head.
//   The O accesses are also uncoalesced (thread t walks row t).
//
// Shared memory (dynamic, floats)
//   Qs [BR][d+1]   each thread's Q row (padded by 1: thread t reads Qs[t][x], 32 different banks)
//   Ks [BC][d]     the K tile (all threads read the same element: a broadcast)
//   Vs [BC][d]     the V tile
//   Ss [BR][BC+1]  each thread's row of S, then of P (padded by 1)
//   bytes = 4 * (BR*(d+1) + 2*BC*d + BR*(BC+1));  BR = BC = 32, d = 128: 54,400 B > 48 KB (opt-in).
//
// Launch: grid = (B*H), block = (BR) = 32 threads, shared memory = the bytes above (above 48 KB: opt-in).
//
// Kernel
//   extern "C" __global__ void flash1_forward(const float* q, const float* k, const float* v, float* o,
//       float* l_hbm, float* m_hbm, float* lse, int Tq, int Tk, int d, float scale, int causal)
//     l_hbm, m_hbm  scratch, (B, H, Tq) float32 each: allocated by the caller, initialised by the kernel
//     lse           (B, H, Tq) float32, always written (not optional)
//     Tq, Tk, d     lengths (query rows, keys, head size <= 128)
//     scale         the softmax scale in natural units (e.g. 1/sqrt(d)); causal: 0 or 1
//
// Minimum compute capability: none beyond plain CUDA (no PTX header; it builds for sm_75: the course runs it from a T4 on).
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/flash/flash1.cu -o flash1.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80 (extern "C" kernels: no name expressions)
//
// Limits
//   d <= 128 (MAX_D); q and k hold at most 2^31 - 1 elements (the launcher checks).
//
// Numerics
//   float32, accurate expf/logf (no fast-math). O is renormalised after every K/V tile, as in the paper:
//   one extra rounding per tile, well inside 1e-5 for the sequence lengths of the course.
//
// Notes: kernels/flash/README.md

#define NEG_INF (-__int_as_float(0x7f800000))

constexpr int BR = 32;  // query rows per Q tile = threads per block (one thread per row)
constexpr int BC = 32;  // keys per K/V tile
constexpr int MAX_D = 128;

static_assert(BR % 32 == 0 && BR <= 1024, "BR threads per block: whole warps");
static_assert(BC >= 1, "BC keys per tile");
static_assert(4 * (BR * (MAX_D + 1) + 2 * BC * MAX_D + BR * (BC + 1)) <= 227 * 1024,
              "the shared memory of the largest d must fit the 227 KB a block may opt in to (sm_90)");

// exp(x - m), where m == -inf means "nothing seen yet": the result is 0, never exp(-inf + inf) = NaN.
__device__ __forceinline__ float exp_shift(float x, float m) { return m == NEG_INF ? 0.0f : expf(x - m); }

extern "C" __global__ void __launch_bounds__(BR)
flash1_forward(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
               float* __restrict__ o, float* __restrict__ l_hbm, float* __restrict__ m_hbm,
               float* __restrict__ lse, int Tq, int Tk, int d, float scale, int causal) {
    extern __shared__ float smem[];
    const int q_stride = d + 1;
    float* Qs = smem;                // [BR][d + 1]
    float* Ks = Qs + BR * q_stride;  // [BC][d]
    float* Vs = Ks + BC * d;         // [BC][d]
    float* Ss = Vs + BC * d;         // [BR][BC + 1]

    const int tid = threadIdx.x;
    const size_t bh = blockIdx.x;
    const float* qb = q + bh * Tq * d;
    const float* kb = k + bh * Tk * d;
    const float* vb = v + bh * Tk * d;
    float* ob = o + bh * Tq * d;
    float* lb = l_hbm + bh * Tq;
    float* mb = m_hbm + bh * Tq;
    const int diag = Tk - Tq;  // query r sees key c iff c <= r + diag

    // 0. The HBM state: O = 0, l = 0, m = -inf. Row r is always handled by thread r % BR.
    for (int r = tid; r < Tq; r += BR) {
        for (int x = 0; x < d; ++x) ob[r * d + x] = 0.0f;
        lb[r] = 0.0f;
        mb[r] = NEG_INF;
    }

    float* qrow = Qs + tid * q_stride;
    float* srow = Ss + tid * (BC + 1);

    // 1. Outer loop: K/V tiles.
    for (int k0 = 0; k0 < Tk; k0 += BC) {
        const int kc = min(BC, Tk - k0);  // keys in this tile
        __syncthreads();                  // every thread is done with the previous K_j, V_j
        for (int idx = tid; idx < BC * d; idx += BR) {
            const int j = idx / d;
            Ks[idx] = j < kc ? kb[(k0 + j) * d + idx % d] : 0.0f;
            Vs[idx] = j < kc ? vb[(k0 + j) * d + idx % d] : 0.0f;
        }
        __syncthreads();

        // 2. Inner loop: Q tiles. No barrier inside: each thread touches only its own rows.
        for (int q0 = 0; q0 < Tq; q0 += BR) {
            if (causal && k0 > min(q0 + BR, Tq) - 1 + diag) continue;  // the whole Q tile is above the diagonal
            const int r = q0 + tid;
            if (r >= Tq) continue;

            for (int x = 0; x < d; ++x) qrow[x] = qb[r * d + x];

            // S = scale * q_r K_j^T (masked: -inf), and its row max
            float m_tile = NEG_INF;
            for (int c = 0; c < BC; ++c) {
                float s = NEG_INF;
                if (c < kc && !(causal && k0 + c > r + diag)) {
                    float acc = 0.0f;
                    for (int x = 0; x < d; ++x) acc = fmaf(qrow[x], Ks[c * d + x], acc);
                    s = acc * scale;
                }
                srow[c] = s;
                m_tile = fmaxf(m_tile, s);
            }
            // P = exp(S - m~), l~ = rowsum P
            float l_tile = 0.0f;
            for (int c = 0; c < BC; ++c) {
                const float p = exp_shift(srow[c], m_tile);
                srow[c] = p;
                l_tile += p;
            }
            // Merge with the state in HBM.
            const float m_old = mb[r];
            const float l_old = lb[r];
            const float m_new = fmaxf(m_old, m_tile);
            const float a_old = exp_shift(m_old, m_new);
            const float a_tile = exp_shift(m_tile, m_new);
            const float l_new = a_old * l_old + a_tile * l_tile;
            if (l_new > 0.0f) {
                const float c_old = l_old * a_old;
                for (int x = 0; x < d; ++x) {
                    float pv = 0.0f;
                    for (int c = 0; c < BC; ++c) pv = fmaf(srow[c], Vs[c * d + x], pv);
                    ob[r * d + x] = (c_old * ob[r * d + x] + a_tile * pv) / l_new;
                }
            }
            lb[r] = l_new;
            mb[r] = m_new;
        }
    }

    // 3. LSE = m + log l (-inf for a row that saw no key; its O is still the 0 written in step 0).
    for (int r = tid; r < Tq; r += BR) {
        const float l = lb[r];
        lse[bh * Tq + r] = l > 0.0f ? mb[r] + logf(l) : NEG_INF;
    }
}
