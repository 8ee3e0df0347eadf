// flash2_mma_bwd.cu -- FlashAttention-2 backward on tensor cores: mma.sync.m16n8k16, ldmatrix, cp.async (fp16/bf16).
//
// What it computes
//   Given q, k, v, the forward's output o and log-sum-exp lse (flash2_mma.cu with lse) and the gradient dO = dL/do,
//   the gradients dQ, dK, dV of o = softmax(scale q k^T + mask) v, in 16 bits with float32 accumulation. Causal
//   masking is bottom-right aligned as in the forward: query i sees key j when j <= i + Tk - Tq. A query row that sees
//   no key (lse = -inf) has P = 0: its dQ row is 0 and it adds nothing to dK or dV. Optionally the gradient of the lse
//   output too (dlse): d lse_i / d S_ij = P_ij, so it only shifts the row term (delta_i becomes delta_i - dlse_i).
//   Notebook 12 teaches it. flash2_bwd_variants differentiates flash2_mma.cu's flash2_mma_variants (grouped-query heads,
//   window, prefix, document ids, softcap, ALiBi; reference/variants.py): its query tiles are the forward's key tiles
//   read along the other axis (EMPTY skipped, FULL without mask code); through the cap dS_raw = dS (1 - t^2).
//   Grouped heads: each query head's dK, dV in float32, summed by flash2_bwd_reduce_heads (no atomics, reproducible).
//
// The math (per head; S = scale Q K^T masked, P = softmax(S) by rows, O = P V; reference/backward.py)
//   dV = P^T dO      dP = dO V^T      dS = P * (dP - delta),  delta_i = sum_c dO_ic O_ic      dQ = scale dS K
//   dK = scale dS^T Q. P is recomputed from the forward's lse, one exp2 per score: P_ij = 2^(c S_ij - lse_i log2 e)
//   with c = scale log2 e, exactly the normalised probability.
//
// Algorithm: three kernels, launched in this order on one stream (kernels/flash/flash2_mma_bwd.py)
//   1. flash2_bwd_preprocess  one warp per query row: delta = rowsum(dO * O) - dlse; lse2 = lse log2 e (+inf where
//      lse = -inf, so that 2^(c s - lse2) = 0); the row of the float32 dQ accumulator set to 0.
//   2. flash2_bwd_main  one block per (K/V tile of BC = 16 NWARPS keys, b h): K and V stay in shared memory, dK and dV
//      in registers (each warp owns 16 keys, so it computes S^T and dP^T: keys in rows). For each query tile i of BR
//      queries (causal: from the first that sees one of the block's keys), Q_i and dO_i double buffered by cp.async:
//        a. S^T = K Q_i^T (warp_abt); P^T = 2^(c S^T - lse2), masked entries 0             recompute_p
//        b. dV += P^T dO_i    P^T from registers (the C layout is the A layout), dO by ldmatrix.trans   accumulate_dv
//        c. dP^T = V dO_i^T; dS^T = P^T * (dP^T - delta)                                    compute_ds
//        d. dK += dS^T Q_i    dS^T in 16 bits from registers, and into shared memory (sdS)  accumulate_dk
//        e. __syncthreads; dQ_i += dS K: each warp a slice of the BR x D tile, float32 atomic adds into the
//           accumulator (four floats per instruction from sm_90 on)                         accumulate_dq
//      then dK = scale dK and dV are stored in 16 bits                                      store_dk_dv
//   3. flash2_bwd_convert  dQ = scale * accumulator, in 16 bits.
//   Why atomics for dQ: dK and dV sum over queries, dQ over keys, so no loop order keeps all three in registers. A
//   second kernel per query tile would need no atomics and no float32 scratch but would recompute S and dP (two of the
//   five products: 40% more tensor work). The atomics' order varies, so dQ is not bitwise reproducible; dK, dV are.
//
// Layouts: q, o, dO, dq (B, H, Tq, d) and k, v, dk, dv (B, H, Tk, d), contiguous 16-bit; lse, dlse, delta, lse2
//   (B, H, Tq) and dq_acc (B, H, Tq, d) float32. Shared memory of the main kernel (16-bit unless said; rows padded by
//   SMEM_PAD = 8 elements): sK, sV [BC][D+8], sQ, sdO [2][BR][D+8], sdS [BC][BR+8], lse2, delta [2][BR] float32.
//
// Launch
//   preprocess  grid = ceil(B H Tq / PRE_WARPS), block = 32 PRE_WARPS, no shared memory
//   main        grid = (ceil(Tk / BC), B H), block = 32 NWARPS (blockIdx.x = 0, the first keys, sees the most query tiles
//               under a causal mask: the longest blocks start first); dynamic shared memory =
//               2 (D + 8)(2 BC + 4 BR) + 2 BC (BR + 8) + 16 BR bytes (above 48 KB: cudaFuncSetAttribute first).
//               Default builds: NWARPS = 8 (BC = 128), BR = 128 at D <= 64 and 64 at D = 96, 128, MIN_BLOCKS = 1
//   convert     grid = min(ceil(B H Tq d / 2 / 256), 8192), block = 256 (a grid-stride loop)
//   variants    as main with H = Hq; then, with grouped heads, reduce twice (dK, dV) as convert, over B Hkv Tk d / 2
//
// Kernels (u16: the bits of float16, BF16 = false, or bfloat16, BF16 = true)
//   template <bool BF16> flash2_bwd_preprocess(const u16* o, const u16* dout, const float* lse, const float* dlse,
//       float* delta, float* lse2, float* dq_acc, long long rows, int d)      rows = B H Tq; dlse == nullptr: no dlse
//   template <int D, int BR, int NWARPS, int MIN_BLOCKS, bool BF16> flash2_bwd_main(const u16* q, const u16* k,
//       const u16* v, const u16* dout, const float* lse2, const float* delta, float* dq_acc, u16* dk, u16* dv,
//       int Tq, int Tk, int d, float scale, int causal)
//   template <bool BF16> flash2_bwd_convert(const float* dq_acc, u16* dq, long long pairs, float scale)
//                                                                                pairs = B H Tq d / 2
//   template <..., bool BF16, int MODS> flash2_bwd_variants(q, k, v, dout, lse2, delta, dq_acc, dk, dv,
//       float* dkv_part, const int* doc_q, const int* doc_k, const signed char* classes, const float* alibi_slopes,
//       int Tq, int Tk, int d, float scale, int Hq, int group, int left, int right, int prefix, float cap_in,
//       float cap_out): MODS and the rest as flash2_mma_variants takes them; dkv_part null when group == 1 (see there)
//   template <bool BF16> flash2_bwd_reduce_heads(const float* part, u16* out, long long pairs, long long head_pairs,
//       int group, float scale)                                      pairs = B Hkv Tk d / 2, head_pairs = Tk d / 2
//   scale: the softmax scale itself (> 0; the forward takes scale log2 e instead). D: the head-dim build (32, 64, 96
//   or 128), a capacity; d <= D is the length. causal: 0 or 1. -D switches, defaults as the launcher passes them:
//   SMEM_PAD 8, PRE_WARPS 4.
//
// Requires compute capability 8.0 (cp.async, ldmatrix, bf16 mma.sync; the float4 atomics of sm_90 are chosen at compile
// time); includes ptx/common.cuh, ptx/cp_async.cuh and ptx/mma_sync.cuh. Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/flash/flash2_mma_bwd.cu -o flash2_mma_bwd.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80, name expressions:
//     "flash2_bwd_preprocess<false>" "flash2_bwd_main<64, 128, 8, 1, false>" "flash2_bwd_convert<false>"
//     "flash2_bwd_variants<64, 128, 8, 1, false, 7>" "flash2_bwd_reduce_heads<false>"
//
// Limits (checked by the launcher): d % 8 == 0 and d <= D; columns d..D-1 zero-filled, never written; any Tq, Tk >= 1
//   (rows past the end zero-filled, masked, not stored); the 16-bit tensors 16-byte aligned; dq_acc 16-byte aligned for
//   the float4 atomics (the launcher puts it at the start of its workspace, delta and lse2 after it).
// Numerics: products in 16 bits (P and dS rounded to 16 bits first, as in FlashAttention-2), sums in float32; exp2 by
//   ex2.approx; dQ summed by float32 atomics in an order that varies between runs.
// What the next version would improve, and what was measured: kernels/flash/README.md.

#include "ptx/common.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mma_sync.cuh"

#define NEG_INF (-__int_as_float(0x7f800000))
#define POS_INF (__int_as_float(0x7f800000))
#define FULL_MASK 0xffffffffu
#define LOG2E 1.4426950408889634f

// Elements of padding per shared-memory row (16 bytes); the launcher passes -DSMEM_PAD from its own constant.
#ifndef SMEM_PAD
#define SMEM_PAD 8
#endif
// Warps (query rows) per block of the preprocess kernel; the launcher passes -DPRE_WARPS.
#ifndef PRE_WARPS
#define PRE_WARPS 4
#endif

enum : int {
    WARP_SIZE = 32,
    MMA_M = 16,  // rows of an mma.m16n8k16 tile
    MMA_N = 8,   // columns
    MMA_K = 16,  // depth
    CHUNK = 8,   // 16-bit elements in one 16-byte cp.async / ldmatrix row
};
static_assert(PRE_WARPS >= 1 && PRE_WARPS <= 32, "PRE_WARPS: 1..32 warps per preprocess block");
static_assert(SMEM_PAD % CHUNK == 0, "SMEM_PAD must keep shared rows 16-byte aligned");

// One 16-bit value -> float (not a PTX wrapper of kernels/ptx/: bfloat16 is a shift, float16 one cvt).
template <bool BF16>
DEVICE float to_float(u16 x) {
    float f;
    if constexpr (BF16) {
        f = __uint_as_float(((u32)x) << 16);
    } else {
        asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(x));
    }
    return f;
}

DEVICE float warp_sum(float x) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) x += __shfl_xor_sync(FULL_MASK, x, o);
    return x;
}

// Rows [row0, row0 + ROWS) of a (T x d) 16-bit matrix (rows d elements apart) -> the shared tile at `tile`
// ([ROWS][D + SMEM_PAD], 32-bit shared address); rows past T and columns past d are zero-filled.
template <int ROWS, int D, int NTHREADS>
DEVICE void load_tile_async(u32 tile, const u16* __restrict__ src, int row0, int T, int d) {
    constexpr int CHUNKS = D / CHUNK;
    constexpr int LD = D + SMEM_PAD;
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += NTHREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS;
        const int row = row0 + r;
        const bool ok = row < T && c * CHUNK < d;
        cp_async_16(tile + 2 * (r * LD + c * CHUNK), ok ? src + (long long)row * d + c * CHUNK : src, ok);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Warp-level products. acc has the C layout: 16 rows (g, g + 8) x N columns (n-tile nt: columns 8nt + 2t, +1).
// ---------------------------------------------------------------------------------------------------------

// acc = A B (16 x N, depth KD), both operands from shared memory by ldmatrix. DEPTH_MAJOR = false: A's 16 rows and B's
// N columns are rows of their tiles (depth along a row, A B^T of two row-major tiles); DEPTH_MAJOR = true: the depth runs
// down the tiles' rows (A stored [KD][16], B [KD][N], row strides LDA and LDB), read with ldmatrix.trans. a_lane,
// b_lane: this lane's ldmatrix row addresses for k-step 0 (B: n-tiles 0 and 1).
template <int KD, int N, int LDA, int LDB, bool DEPTH_MAJOR, bool BF16>
DEVICE void warp_mma_smem(float (&acc)[N / MMA_N][4], u32 a_lane, u32 b_lane) {
#pragma unroll
    for (int nt = 0; nt < N / MMA_N; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KD / MMA_K; ++kk) {
        u32 a[4];
        if constexpr (DEPTH_MAJOR)
            ldmatrix_x4_trans(a, a_lane + 2 * kk * MMA_K * LDA);
        else
            ldmatrix_x4(a, a_lane + 2 * kk * MMA_K);
#pragma unroll
        for (int np = 0; np < N / (2 * MMA_N); ++np) {
            u32 b[4];  // b[0], b[1]: n-tile 2np; b[2], b[3]: n-tile 2np + 1
            if constexpr (DEPTH_MAJOR)
                ldmatrix_x4_trans(b, b_lane + 2 * (kk * MMA_K * LDB + np * 2 * MMA_N));
            else
                ldmatrix_x4(b, b_lane + 2 * (np * 2 * MMA_N * LDB + kk * MMA_K));
            mma_16816<BF16>(acc[2 * np], a, b[0], b[1]);
            mma_16816<BF16>(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// acc = A B^T: A = 16 rows of a shared tile (a_lane: this lane's ldmatrix address for row l % 16, column half
// l / 16), B = N rows of another shared tile (b_tile: its first row; row stride LD), depth KD.
// Used for S^T = K Q^T and dP^T = V dO^T (the warp's 16 keys against the BR queries).
template <int KD, int N, int LD, bool BF16>
DEVICE void warp_abt(float (&acc)[N / MMA_N][4], u32 a_lane, u32 b_tile) {
    const int lane = threadIdx.x % WARP_SIZE;
    // B rows (the n index) l % 8 + 8 (l / 16), column half (l / 8) % 2
    const u32 b_lane = b_tile + 2 * ((lane % 8 + (lane / 16) * 8) * LD + ((lane / 8) % 2) * CHUNK);
    warp_mma_smem<KD, N, LD, LD, false, BF16>(acc, a_lane, b_lane);
}

// The A fragments of a 16 x KD 16-bit matrix held in C-layout float registers (KD / 8 n-tiles): k-step kk takes
// n-tiles 2kk (columns 0..7) and 2kk + 1 (columns 8..15).
template <int KD, bool BF16>
DEVICE void c_to_a(u32 (&a)[KD / MMA_K][4], const float (&c)[KD / MMA_N][4]) {
#pragma unroll
    for (int kk = 0; kk < KD / MMA_K; ++kk) {
        a[kk][0] = pack2<BF16>(c[2 * kk][0], c[2 * kk][1]);          // row g,   columns 0..7
        a[kk][1] = pack2<BF16>(c[2 * kk][2], c[2 * kk][3]);          // row g+8, columns 0..7
        a[kk][2] = pack2<BF16>(c[2 * kk + 1][0], c[2 * kk + 1][1]);  // row g,   columns 8..15
        a[kk][3] = pack2<BF16>(c[2 * kk + 1][2], c[2 * kk + 1][3]);  // row g+8, columns 8..15
    }
}

// acc += A B: A from registers (16 x KD, A fragments), B = a shared tile [KD][LD] read k-major with ldmatrix.trans
// (its rows are the depth), N columns from column 0 of b_tile.
// Used for dV += P^T dO, dK += dS^T Q (depth = the BR queries).
template <int KD, int N, int LD, bool BF16>
DEVICE void warp_ab_regs(float (&acc)[N / MMA_N][4], const u32 (&a)[KD / MMA_K][4], u32 b_tile) {
    const int lane = threadIdx.x % WARP_SIZE;
    // B rows (depth) l % 8 + 8 ((l / 8) % 2), column half l / 16
    const u32 b_lane = b_tile + 2 * ((lane % 8 + ((lane / 8) % 2) * 8) * LD + (lane / 16) * CHUNK);
#pragma unroll
    for (int kk = 0; kk < KD / MMA_K; ++kk) {
#pragma unroll
        for (int np = 0; np < N / (2 * MMA_N); ++np) {
            u32 b[4];
            ldmatrix_x4_trans(b, b_lane + 2 * (kk * MMA_K * LD + np * 2 * MMA_N));
            mma_16816<BF16>(acc[2 * np], a[kk], b[0], b[1]);
            mma_16816<BF16>(acc[2 * np + 1], a[kk], b[2], b[3]);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Kernel 1: delta = rowsum(dO * O) - dlse, lse2 = lse * log2(e) (+inf where lse = -inf), dQ accumulator row = 0.
// One warp per row of the (B H Tq) rows; dlse may be null.
// ---------------------------------------------------------------------------------------------------------
template <bool BF16>
__global__ void __launch_bounds__(PRE_WARPS * WARP_SIZE)
flash2_bwd_preprocess(const u16* __restrict__ o, const u16* __restrict__ dout, const float* __restrict__ lse,
                      const float* __restrict__ dlse, float* __restrict__ delta, float* __restrict__ lse2,
                      float* __restrict__ dq_acc, long long rows, int d) {
    const long long row = (long long)blockIdx.x * PRE_WARPS + threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) return;
    const u16* orow = o + row * d;
    const u16* drow = dout + row * d;
    float* qrow = dq_acc + row * d;
    float s = 0.f;
    for (int c = lane; c < d; c += WARP_SIZE) {
        s += to_float<BF16>(orow[c]) * to_float<BF16>(drow[c]);
        qrow[c] = 0.f;
    }
    s = warp_sum(s);
    if (lane == 0) {
        const float l = lse[row];
        delta[row] = s - (dlse != nullptr ? dlse[row] : 0.f);
        lse2[row] = l == NEG_INF ? POS_INF : l * LOG2E;  // a row that sees no key: 2^(c s - inf) = 0
    }
}

// ---------------------------------------------------------------------------------------------------------
// Kernel 3: dq = scale * dq_acc, rounded to 16 bits, two elements per thread (d is even).
// ---------------------------------------------------------------------------------------------------------
template <bool BF16>
__global__ void flash2_bwd_convert(const float* __restrict__ dq_acc, u16* __restrict__ dq, long long pairs,
                                   float scale) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < pairs;
         i += (long long)gridDim.x * blockDim.x) {
        const float2 x = reinterpret_cast<const float2*>(dq_acc)[i];
        reinterpret_cast<u32*>(dq)[i] = pack2<BF16>(x.x * scale, x.y * scale);
    }
}

// ---------------------------------------------------------------------------------------------------------
// The steps of the main kernel, as one warp sees them: its 16 keys (rows 16 warp .. 16 warp + 15 of the block's K/V
// tile) against the BR queries of query tile i. acc arrays have the C layout of mma.m16n8k16: lane (g, t) holds rows g
// and g + 8, columns 2t and 2t + 1 of each n-tile. The steps are force-inlined, and the register arrays they fill are
// declared by the kernel, in a block around the call: so the kernel compiles to the machine code it had as one body
// (declared inside the steps, the same arrays gave other register assignments; kernels/flash/README.md).
// ---------------------------------------------------------------------------------------------------------

// Q_i and dO_i, BR rows from q0 of this head (qh, doh), into one stage of sQ and sdO (cp.async; the caller commits).
template <int D, int BR, int NTHREADS>
DEVICE void load_query_tile(u32 sq, u32 sdo, const u16* __restrict__ qh, const u16* __restrict__ doh, int q0, int Tq,
                            int d) {
    load_tile_async<BR, D, NTHREADS>(sq, qh, q0, Tq, d);
    load_tile_async<BR, D, NTHREADS>(sdo, doh, q0, Tq, d);
}

// P^T = 2^(c S^T - lse2) in place of S^T = K Q_i^T (the warp's 16 keys x BR queries): the forward's probabilities,
// recomputed from its lse (lse2 = lse log2 e). Where edge (the tile holds a masked pair), masked entries (keys >= Tk;
// if causal, a key after its query's diagonal) give 0. tl: this lane's pair (lse2 of queries 2t, 2t + 1) of n-tile 0
// in shared memory; k0, q0: the block's first key, the tile's first query.
template <int BR>
DEVICE void recompute_p(float (&acc_s)[BR / MMA_N][4], const float2* tl, bool edge, int k0, int q0, int Tk, int diag,
                        int causal, float scale_log2) {
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < BR / MMA_N; ++nt) {
        const float2 l2 = tl[nt * (MMA_N / 2)];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int col = nt * MMA_N + 2 * t + (e & 1);  // query within the tile
            const int key = k0 + warp * MMA_M + g + 8 * (e >> 1);
            float s = acc_s[nt][e];
            if (edge && (key >= Tk || (causal && key > q0 + col + diag))) s = NEG_INF;
            acc_s[nt][e] = exp2_ftz(fmaf(s, scale_log2, -((e & 1) ? l2.y : l2.x)));
        }
    }
}

// dV += P^T dO_i: P^T from registers, in 16 bits (pt: its A fragments; the C layout of two n-tiles is the A layout),
// dO_i by ldmatrix.trans.
template <int D, int BR, bool BF16>
DEVICE void accumulate_dv(float (&acc_dv)[D / MMA_N][4], u32 (&pt)[BR / MMA_K][4], const float (&acc_s)[BR / MMA_N][4],
                          u32 do_tile) {
    c_to_a<BR, BF16>(pt, acc_s);
    warp_ab_regs<BR, D, D + SMEM_PAD, BF16>(acc_dv, pt, do_tile);
}

// dP^T = V dO_i^T (the warp's 16 keys x BR queries), then dS^T = P^T (dP^T - delta) in place. v_lane: this lane's A row
// address in sV; td: this lane's (delta of query 2t, 2t + 1) pair of n-tile 0 in shared memory.
template <int D, int BR, bool BF16>
DEVICE void compute_ds(float (&acc_dp)[BR / MMA_N][4], const float (&acc_s)[BR / MMA_N][4], u32 v_lane, u32 do_tile,
                       const float2* td) {
    warp_abt<D, BR, D + SMEM_PAD, BF16>(acc_dp, v_lane, do_tile);
#pragma unroll
    for (int nt = 0; nt < BR / MMA_N; ++nt) {
        const float2 dl = td[nt * (MMA_N / 2)];
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dp[nt][e] = acc_s[nt][e] * (acc_dp[nt][e] - ((e & 1) ? dl.y : dl.x));
    }
}

// dK += dS^T Q_i: dS^T from registers, in 16 bits (dst: its A fragments), Q_i by ldmatrix.trans. The same 16-bit dS^T
// goes to the warp's 16 rows of sdS [keys][queries] (sds: its first byte, a generic pointer into shared memory), for
// dQ = dS K.
template <int D, int BR, bool BF16>
DEVICE void accumulate_dk(float (&acc_dk)[D / MMA_N][4], u32 (&dst)[BR / MMA_K][4], const float (&acc_ds)[BR / MMA_N][4],
                          u32 q_tile, unsigned char* sds) {
    constexpr int LDS = BR + SMEM_PAD;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    c_to_a<BR, BF16>(dst, acc_ds);
#pragma unroll
    for (int kk = 0; kk < BR / MMA_K; ++kk) {  // dst[kk][0..3]: (g, 0..7), (g+8, 0..7), (g, 8..15), (g+8, 8..15)
        u32* r0 = reinterpret_cast<u32*>(sds + 2 * ((warp * MMA_M + g) * LDS + kk * MMA_K + 2 * t));
        u32* r1 = reinterpret_cast<u32*>(sds + 2 * ((warp * MMA_M + g + 8) * LDS + kk * MMA_K + 2 * t));
        r0[0] = dst[kk][0];
        r1[0] = dst[kk][1];
        r0[CHUNK / 2] = dst[kk][2];
        r1[CHUNK / 2] = dst[kk][3];
    }
    warp_ab_regs<BR, D, D + SMEM_PAD, BF16>(acc_dk, dst, q_tile);
}

// dQ_acc[row, col] += acc_q for the warp's slice: rows row0 + (g, g + 8), DN columns from col0 (acc_q in the C layout).
// dq_acc + q_base is this head's float32 accumulator (rows d floats apart); rows >= Tq and columns >= d are skipped.
template <int DN>
DEVICE void atomic_add_dq(float* __restrict__ dq_acc, long long q_base, const float (&acc_q)[DN / MMA_N][4], int row0,
                          int col0, int Tq, int d) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int nt = 0; nt < DN / MMA_N; ++nt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        // Hopper adds four floats in one reduction. Lanes t and t^1 trade halves: the even lane then holds columns
        // 2t..2t+3 of row g, the odd lane columns 2t-2..2t+1 of row g + 8 (16-byte aligned, as d % 8 == 0 and the
        // accumulator starts 16-byte aligned).
        const bool odd = t & 1;
        const float s0 = __shfl_xor_sync(FULL_MASK, odd ? acc_q[nt][0] : acc_q[nt][2], 1);
        const float s1 = __shfl_xor_sync(FULL_MASK, odd ? acc_q[nt][1] : acc_q[nt][3], 1);
        const int row = row0 + g + (odd ? 8 : 0);
        const int col = col0 + nt * MMA_N + 2 * (t & ~1);
        if (row < Tq && col < d) {
            const float4 x = odd ? make_float4(s0, s1, acc_q[nt][2], acc_q[nt][3])
                                 : make_float4(acc_q[nt][0], acc_q[nt][1], s0, s1);
            atomicAdd(reinterpret_cast<float4*>(dq_acc + q_base + (long long)row * d + col), x);
        }
#else
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // before Hopper: 32-bit reductions, two per row
            const int row = row0 + g + 8 * h;
            const int col = col0 + nt * MMA_N + 2 * t;
            if (row < Tq && col < d) {
                float* dst = dq_acc + q_base + (long long)row * d + col;
                atomicAdd(dst, acc_q[nt][2 * h]);
                atomicAdd(dst + 1, acc_q[nt][2 * h + 1]);
            }
        }
#endif
    }
}

// dQ_i += dS K for the warp's slice of the BR x D tile: 16 queries from row0 x DN columns from dn0 (acc_q), depth the
// BC keys of the block. dS by ldmatrix.trans from sdS [keys][queries] (ds_lane), K by ldmatrix.trans (kt_lane: this
// lane's row address, at column dn0); then float32 atomic adds into the accumulator.
template <int D, int BR, int NWARPS, bool BF16, int DN = D / (NWARPS / (BR / MMA_M))>
DEVICE void accumulate_dq(float (&acc_q)[DN / MMA_N][4], float* __restrict__ dq_acc, long long q_base, u32 ds_lane,
                          u32 kt_lane, int row0, int dn0, int Tq, int d) {
    warp_mma_smem<MMA_M * NWARPS, DN, BR + SMEM_PAD, D + SMEM_PAD, true, BF16>(acc_q, ds_lane, kt_lane);  // depth: keys
    atomic_add_dq<DN>(dq_acc, q_base, acc_q, row0, dn0, Tq, d);
}

// The end: dK = scale dK and dV in 16 bits, keys < Tk and columns < d. k_base: this head's first element; key_g: the
// key of this lane's row g (its row g + 8 holds key_g + 8).
template <int D, bool BF16>
DEVICE void store_dk_dv(u16* __restrict__ dk, u16* __restrict__ dv, long long k_base, const float (&acc_dk)[D / MMA_N][4],
                        const float (&acc_dv)[D / MMA_N][4], int key_g, int Tk, int d, float scale) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key_g + 8 * h;
        if (key < Tk) {
#pragma unroll
            for (int nt = 0; nt < D / MMA_N; ++nt) {
                const int col = nt * MMA_N + 2 * t;
                if (col < d) {
                    const long long at = k_base + (long long)key * d + col;
                    *reinterpret_cast<u32*>(dk + at) =
                        pack2<BF16>(acc_dk[nt][2 * h] * scale, acc_dk[nt][2 * h + 1] * scale);
                    *reinterpret_cast<u32*>(dv + at) = pack2<BF16>(acc_dv[nt][2 * h], acc_dv[nt][2 * h + 1]);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Kernel 2: one block per (K/V tile, b h). D: head-dim build; BR: queries per tile; NWARPS: warps (BC = 16 NWARPS
// keys); MIN_BLOCKS: blocks per SM the compiler must leave registers for.
// ---------------------------------------------------------------------------------------------------------
template <int D, int BR, int NWARPS, int MIN_BLOCKS, bool BF16>
__global__ void __launch_bounds__(NWARPS * WARP_SIZE, MIN_BLOCKS)
flash2_bwd_main(const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v,
                const u16* __restrict__ dout, const float* __restrict__ lse2, const float* __restrict__ delta,
                float* __restrict__ dq_acc, u16* __restrict__ dk, u16* __restrict__ dv, int Tq, int Tk, int d,
                float scale, int causal) {
    constexpr int NTHREADS = NWARPS * WARP_SIZE;
    constexpr int BC = MMA_M * NWARPS;   // keys per block: 16 per warp
    constexpr int LD = D + SMEM_PAD;     // row stride of the Q, dO, K, V tiles (elements)
    constexpr int LDS = BR + SMEM_PAD;   // row stride of sdS
    constexpr int S_NT = BR / MMA_N;     // n-tiles of S^T, dP^T (queries)
    constexpr int O_NT = D / MMA_N;      // n-tiles of dK, dV (head dims)
    constexpr int QM = BR / MMA_M;       // m-tiles of the dQ tile
    constexpr int WN = NWARPS / QM;      // warps sharing one m-tile of dQ, each DN columns
    constexpr int DN = D / WN;
    static_assert(D % MMA_K == 0 && D >= 32 && D <= 128, "D must be a multiple of 16 in [32, 128]");
    static_assert(BR % (2 * MMA_N) == 0 && BR >= 16, "BR must be a multiple of 16");
    static_assert(NWARPS >= 1 && NTHREADS <= 1024, "bad warp count");
    static_assert(NWARPS % QM == 0 && D % WN == 0 && DN % (2 * MMA_N) == 0,
                  "the dQ tile (BR x D) must split into whole 16-row, 16-column slices, one per warp");
    static_assert(NTHREADS >= BR, "one thread per query row loads lse2 and delta");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const u32 sK = smem_addr(smem_raw);
    const u32 sV = sK + 2 * BC * LD;
    const u32 sQ = sV + 2 * BC * LD;          // [2][BR][LD]
    const u32 sdO = sQ + 2 * 2 * BR * LD;     // [2][BR][LD]
    const u32 sdS = sdO + 2 * 2 * BR * LD;    // [BC][LDS]
    float* s_lse2 = reinterpret_cast<float*>(smem_raw + 2 * (2 * BC * LD + 4 * BR * LD + BC * LDS));  // [2][BR]
    float* s_delta = s_lse2 + 2 * BR;                                                                  // [2][BR]
    constexpr u32 TILE_Q = 2 * BR * LD;       // bytes of one Q (or dO) stage
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    const int bh = blockIdx.y, k0 = blockIdx.x * BC;  // this block: head bh, keys k0 .. k0 + BC - 1
    const int diag = Tk - Tq;  // query i sees keys j <= i + diag
    const long long q_base = (long long)bh * Tq * d, k_base = (long long)bh * Tk * d, r_base = (long long)bh * Tq;

    // ---- the query tiles this K/V tile meets; K, V and the first Q, dO tile in flight ----------------------
    int first = 0;  // causal: the first query that sees key k0 is k0 - diag
    if (causal) first = max(0, k0 - diag) / BR;
    const int n_qtiles = (Tq + BR - 1) / BR;

    load_tile_async<BC, D, NTHREADS>(sK, k + k_base, k0, Tk, d);
    load_tile_async<BC, D, NTHREADS>(sV, v + k_base, k0, Tk, d);
    if (first < n_qtiles) {
        load_query_tile<D, BR, NTHREADS>(sQ, sdO, q + q_base, dout + q_base, first * BR, Tq, d);
        if (threadIdx.x < BR) {
            const int row = first * BR + threadIdx.x;
            s_lse2[threadIdx.x] = row < Tq ? lse2[r_base + row] : POS_INF;  // a row past Tq: P = 0
            s_delta[threadIdx.x] = row < Tq ? delta[r_base + row] : 0.f;
        }
    }
    cp_async_commit();
    float acc_dk[O_NT][4], acc_dv[O_NT][4];
#pragma unroll
    for (int nt = 0; nt < O_NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dk[nt][e] = acc_dv[nt][e] = 0.f;

    // this lane's ldmatrix row address in sK / sV as an A operand (keys 16 warp + l % 16, column half l / 16)
    const u32 a_off = 2 * ((warp * MMA_M + lane % 16) * LD + (lane / 16) * CHUNK);
    // the warp's slice of the dQ tile: m-tile qm (queries), columns [dn0, dn0 + DN)
    const int qm = warp % QM, dn0 = (warp / QM) * DN;
    // dS as the A operand of dQ = dS K, read transposed from sdS [keys][queries]: matrix l / 8 of the x4 is
    // (keys 8 (l / 16) + l % 8, queries 16 qm + 8 ((l / 8) % 2))
    const u32 ds_lane = sdS + 2 * (((lane / 16) * 8 + lane % 8) * LDS + qm * MMA_M + ((lane / 8) % 2) * CHUNK);
    // K as the B operand of dQ = dS K (depth = keys, ldmatrix.trans): key rows l % 8 + 8 ((l / 8) % 2), half l / 16
    const u32 kt_lane = sK + 2 * ((lane % 8 + ((lane / 8) % 2) * 8) * LD + dn0 + (lane / 16) * CHUNK);
    const float scale_log2 = scale * LOG2E;

    // ---- the loop over query tiles: two barriers per tile ----------------------------------------------------
    for (int i = first; i < n_qtiles; ++i) {
        const int stage = (i - first) & 1;
        const int q0 = i * BR;
        cp_async_wait<0>();
        __syncthreads();  // tile i (and lse2, delta) visible to all; every warp is done with tile i-1's stage and sdS
        float next_lse2 = POS_INF, next_delta = 0.f;
        if (i + 1 < n_qtiles) {  // tile i+1 streams into the other stage while this one computes
            load_query_tile<D, BR, NTHREADS>(sQ + (stage ^ 1) * TILE_Q, sdO + (stage ^ 1) * TILE_Q, q + q_base,
                                             dout + q_base, q0 + BR, Tq, d);
            cp_async_commit();
            const int row = q0 + BR + threadIdx.x;
            if (threadIdx.x < BR && row < Tq) {  // loaded now, stored at the end of the tile
                next_lse2 = lse2[r_base + row];
                next_delta = delta[r_base + row];
            }
        }
        const u32 q_tile = sQ + stage * TILE_Q, do_tile = sdO + stage * TILE_Q;
        // lse2 and delta of this lane's query columns 2t, 2t + 1 of each n-tile: one 8-byte shared load per pair
        const float2* tl = reinterpret_cast<const float2*>(s_lse2 + stage * BR) + t;
        const float2* td = reinterpret_cast<const float2*>(s_delta + stage * BR) + t;

        // ---- S^T = K Q^T, then P^T = 2^(c S^T - lse2) ------------------------------------------------------------
        float acc_s[S_NT][4];
        warp_abt<D, BR, LD, BF16>(acc_s, sK + a_off, q_tile);
        const bool edge = k0 + BC > Tk || (causal && k0 + BC - 1 > q0 + diag);  // a masked (key, query) in the tile?
        recompute_p<BR>(acc_s, tl, edge, k0, q0, Tk, diag, causal, scale_log2);
        // ---- dV += P^T dO ---------------------------------------------------------------------------------------
        {
            u32 pt[BR / MMA_K][4];
            accumulate_dv<D, BR, BF16>(acc_dv, pt, acc_s, do_tile);
        }
        // ---- dP^T = V dO^T, then dS^T = P^T (dP^T - delta) --------------------------------------------------------
        float acc_ds[S_NT][4];
        compute_ds<D, BR, BF16>(acc_ds, acc_s, sV + a_off, do_tile, td);
        // ---- dK += dS^T Q; dS^T into sdS ------------------------------------------------------------------------
        {
            u32 dst[BR / MMA_K][4];
            accumulate_dk<D, BR, BF16>(acc_dk, dst, acc_ds, q_tile, smem_raw + (sdS - sK));
        }
        __syncthreads();  // sdS holds every warp's keys
        // ---- dQ_i += dS K: this warp's 16 queries x DN columns, float32 atomic adds -----------------------------
        {
            float acc_q[DN / MMA_N][4];
            accumulate_dq<D, BR, NWARPS, BF16>(acc_q, dq_acc, q_base, ds_lane, kt_lane, q0 + qm * MMA_M, dn0, Tq, d);
        }
        if (threadIdx.x < BR) {  // the next tile's lse2 and delta, into the stage no warp reads now
            s_lse2[(stage ^ 1) * BR + threadIdx.x] = next_lse2;
            s_delta[(stage ^ 1) * BR + threadIdx.x] = next_delta;
        }
    }
    cp_async_wait<0>();  // nothing in flight at exit

    // ---- dK = scale dK, dV: 16 bits, rows < Tk and columns < d --------------------------------------------------
    store_dk_dv<D, BF16>(dk, dv, k_base, acc_dk, acc_dv, k0 + warp * MMA_M + g, Tk, d, scale);
}

// ---------------------------------------------------------------------------------------------------------
// The variants (flash2_bwd_variants): the gradients of flash2_mma.cu's flash2_mma_variants, with its mask, tile classes
// and score modifiers mirrored here (a kernel file includes only kernels/ptx/). MODS: MOD_DOCS + MOD_SOFTCAP +
// MOD_ALIBI, the switches of one build, as in the forward; the dense kernel above has none of this code.
//   query_tiles     the query tiles a block of keys meets: the forward's key_tiles, read along the other axis
//   variant_p       P^T from the forward's logits (scale, softcap, ALiBi), the mask on PARTIAL tiles only
//   variant_query_tile  one query tile: the dense kernel's loop body with variant_p, FULL tiles without mask code
// ---------------------------------------------------------------------------------------------------------
enum : int { MOD_DOCS = 1, MOD_SOFTCAP = 2, MOD_ALIBI = 4, MOD_ALL = 7 };  // flash2_mma.cu's MOD_ flags
enum : int { TILE_EMPTY = 0, TILE_FULL = 1, TILE_PARTIAL = 2 };        // the classes of reference/variants.py

// Query i sits at c = i + Tk - Tq among the keys and sees key j < Tk when (c - left <= j <= c + right or j < prefix)
// and, with MOD_DOCS, doc_q[i] == doc_k[j] (causal folded into right, an unbounded side Tq + Tk: flash2_mma.cu).
struct VariantArgs {
    int left = 0, right = 0, prefix = 0;
    const int* doc_q = nullptr;            // this batch entry's Tq query ids and Tk key ids (MOD_DOCS)
    const int* doc_k = nullptr;
    const signed char* classes = nullptr;  // this (batch entry, key tile)'s class of query tile i: classes[i * stride]
    int stride = 0;                        // key tiles per query tile in the class array
    float cap_in = 0.f, cap_out = 0.f;     // softcap: logit = cap_out tanh(s cap_in), cap_in = scale / softcap,
                                           // cap_out = softcap log2 e
    const float* slope = nullptr;          // ALiBi: this query head's slope (natural-log units)
};

// The query tiles one block (keys [k0, k0 + BC)) meets, in order, EMPTY ones (MOD_DOCS) skipped: all of them when the
// block holds a prefix key; else those holding a row whose band [c - left, c + right] reaches the block's keys. A tile
// is FULL when each key of the block is < Tk and seen by every row of the tile (the forward's KeyTiles::full) and its
// class says FULL.
template <int BR, int BC, int MODS>
struct QueryTiles {
    int first, end, k0, Tq, diag;
    const VariantArgs* va;
    DEVICE int after(int i) const {  // the next tile after i, EMPTY ones skipped
        do ++i;
        while ((MODS & MOD_DOCS) != 0 && i < end && va->classes[i * va->stride] == TILE_EMPTY);
        return i;
    }
    DEVICE bool full(int i, int Tk) const {
        const int k1 = k0 + BC - 1, c_first = i * BR + diag, c_last = min(i * BR + BR, Tq) - 1 + diag;
        const int from = max(k0, va->prefix);  // keys from here on need the band of every row
        const bool seen = k1 < Tk && (k1 < va->prefix || (c_last - va->left <= from && k1 <= c_first + va->right));
        if constexpr ((MODS & MOD_DOCS) != 0) return seen && va->classes[i * va->stride] == TILE_FULL;
        return seen;
    }
};

template <int BR, int BC, int MODS>
DEVICE QueryTiles<BR, BC, MODS> query_tiles(int k0, int Tq, int Tk, int diag, const VariantArgs& va) {
    QueryTiles<BR, BC, MODS> qt{0, (Tq + BR - 1) / BR, k0, Tq, diag, &va};
    if (k0 >= va.prefix) {  // no prefix key: the rows i with k0 - right <= i + diag <= k_last + left
        const int lo = max(0, k0 - va.right - diag), hi = min(Tq - 1, min(k0 + BC, Tk) - 1 + va.left - diag);
        qt.first = lo / BR;
        qt.end = hi >= lo ? hi / BR + 1 : qt.first;
    }
    if ((MODS & MOD_DOCS) != 0 && qt.first < qt.end && va.classes[qt.first * va.stride] == TILE_EMPTY)
        qt.first = qt.after(qt.first);
    return qt;
}

// P^T = 2^(logit - lse2) in place of S^T = K Q_i^T (raw q.k; the warp's 16 keys x BR queries). The logit is the
// forward's, op for op: scale log2 e, or cap_out tanh(s cap_in) (MOD_SOFTCAP); minus slope |j - c_i| (MOD_ALIBI);
// -inf where the mask hides the pair (MASK: PARTIAL tiles). Without score modifiers the same FMA as recompute_p.
// MOD_SOFTCAP: pt gets P^T in 16 bits (the A fragments of dV += P^T dO, as c_to_a packs them) and acc_s keeps
// P^T (1 - t^2), t = tanh(s cap_in): the cap's derivative, so compute_ds yields dS_raw = dS (1 - t^2) directly.
// key_g: the key of this lane's row g (row g + 8: key_g + 8); q0: the tile's first query; tl as in recompute_p.
template <int BR, bool BF16, int MODS, bool MASK>
DEVICE void variant_p(float (&acc_s)[BR / MMA_N][4], u32 (&pt)[BR / MMA_K][4], const float2* tl, int key_g, int q0,
                      int Tq, int Tk, int diag, float scale_log2, const VariantArgs& va) {
    constexpr bool SOFTCAP = (MODS & MOD_SOFTCAP) != 0, SCORE_MODS = (MODS & (MOD_SOFTCAP | MOD_ALIBI)) != 0;
    const int t = threadIdx.x % 4;
    // ALiBi's slope times log2 e, read here rather than held in a register across the loop (an L1 hit per tile)
    const float slope = (MODS & MOD_ALIBI) != 0 ? __ldg(va.slope) * LOG2E : 0.f;
    int q_lo[2], q_hi[2], key_doc[2];  // per key row: the queries whose band holds it; its document
    bool key_in[2], key_pre[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key_g + 8 * h;
        q_lo[h] = key - va.right - diag;
        q_hi[h] = key + va.left - diag;
        key_in[h] = key < Tk;
        key_pre[h] = key < va.prefix;
        key_doc[h] = (MASK && (MODS & MOD_DOCS) != 0) ? __ldg(va.doc_k + min(key, Tk - 1)) : 0;
    }
#pragma unroll
    for (int nt = 0; nt < BR / MMA_N; ++nt) {
        const float2 l2 = tl[nt * (MMA_N / 2)];
        const int qc = q0 + nt * MMA_N + 2 * t;  // this lane's first query of the n-tile
        int q_doc[2] = {0, 0};
        if constexpr (MASK && (MODS & MOD_DOCS) != 0)
#pragma unroll
            for (int e = 0; e < 2; ++e) q_doc[e] = __ldg(va.doc_q + min(qc + e, Tq - 1));
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int h = e >> 1, query = qc + (e & 1);
            float s = acc_s[nt][e], tc = 0.f;
            if constexpr (SOFTCAP) {
                tc = tanh_exp2(s * va.cap_in);
                s = va.cap_out * tc;
            } else if constexpr (SCORE_MODS) {
                s *= scale_log2;
            }
            if constexpr ((MODS & MOD_ALIBI) != 0) s = fmaf(-slope, fabsf((float)(key_g + 8 * h - query - diag)), s);
            if constexpr (MASK) {
                bool seen = key_in[h] && (key_pre[h] || (q_lo[h] <= query && query <= q_hi[h]));
                if constexpr ((MODS & MOD_DOCS) != 0) seen = seen && key_doc[h] == q_doc[e & 1];
                if (!seen) s = NEG_INF;
            }
            const float l = (e & 1) ? l2.y : l2.x;
            p[e] = SCORE_MODS ? exp2_ftz(s - l) : exp2_ftz(fmaf(s, scale_log2, -l));
            acc_s[nt][e] = SOFTCAP ? p[e] * fmaf(-tc, tc, 1.f) : p[e];
        }
        if constexpr (SOFTCAP) {  // n-tile nt is half nt % 2 of k-step nt / 2 (c_to_a)
            pt[nt / 2][2 * (nt % 2)] = pack2<BF16>(p[0], p[1]);
            pt[nt / 2][2 * (nt % 2) + 1] = pack2<BF16>(p[2], p[3]);
        }
    }
}

// One query tile i of a variant block, as the whole block runs it: the dense kernel's loop body with variant_p in place
// of recompute_p, its masked form where the tile is PARTIAL. (The whole body twice, FULL and PARTIAL, spilled.) n counts the tiles visited (the stage is n % 2); `next` is the tile
// prefetched (none when next >= end). q_base, r_base: this query head's first element and row; k0: the block's first key.
template <int D, int BR, int NWARPS, bool BF16, int MODS>
DEVICE void variant_query_tile(float (&acc_dk)[D / MMA_N][4], float (&acc_dv)[D / MMA_N][4], int n, int i, int next,
                               int end, bool partial, const u16* __restrict__ q, const u16* __restrict__ dout,
                               const float* __restrict__ lse2, const float* __restrict__ delta,
                               float* __restrict__ dq_acc, long long q_base, long long r_base, int k0, int Tq, int Tk,
                               int d, float scale_log2, const VariantArgs& va) {
    constexpr int NTHREADS = NWARPS * WARP_SIZE, BC = MMA_M * NWARPS, LD = D + SMEM_PAD, LDS = BR + SMEM_PAD;
    constexpr int QM = BR / MMA_M, DN = D / (NWARPS / QM);
    constexpr u32 TILE_Q = 2 * BR * LD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const u32 sK = smem_addr(smem_raw), sV = sK + 2 * BC * LD, sQ = sV + 2 * BC * LD, sdO = sQ + 2 * TILE_Q;
    const u32 sdS = sdO + 2 * TILE_Q;
    float* s_lse2 = reinterpret_cast<float*>(smem_raw + 2 * (2 * BC * LD + 4 * BR * LD + BC * LDS));
    float* s_delta = s_lse2 + 2 * BR;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE, t = lane % 4;
    const int qm = warp % QM, dn0 = (warp / QM) * DN, stage = n & 1, q0 = i * BR;

    cp_async_wait<0>();
    __syncthreads();  // tile i (and lse2, delta) visible to all; every warp is done with the previous stage and sdS
    float next_lse2 = POS_INF, next_delta = 0.f;
    if (next < end) {  // tile `next` streams into the other stage while this one computes
        load_query_tile<D, BR, NTHREADS>(sQ + (stage ^ 1) * TILE_Q, sdO + (stage ^ 1) * TILE_Q, q + q_base,
                                         dout + q_base, next * BR, Tq, d);
        cp_async_commit();
        const int row = next * BR + threadIdx.x;
        if (threadIdx.x < BR && row < Tq) {
            next_lse2 = lse2[r_base + row];
            next_delta = delta[r_base + row];
        }
    }
    const u32 q_tile = sQ + stage * TILE_Q, do_tile = sdO + stage * TILE_Q;
    const u32 a_off = 2 * ((warp * MMA_M + lane % 16) * LD + (lane / 16) * CHUNK);
    const float2* tl = reinterpret_cast<const float2*>(s_lse2 + stage * BR) + t;
    const float2* td = reinterpret_cast<const float2*>(s_delta + stage * BR) + t;

    float acc_s[BR / MMA_N][4];
    warp_abt<D, BR, LD, BF16>(acc_s, sK + a_off, q_tile);  // S^T = K Q^T
    {
        u32 pt[BR / MMA_K][4];
        const int key_g = k0 + warp * MMA_M + lane / 4;
        if (partial)  // the mask code runs on PARTIAL tiles only (a branch the whole block takes alike)
            variant_p<BR, BF16, MODS, true>(acc_s, pt, tl, key_g, q0, Tq, Tk, Tk - Tq, scale_log2, va);
        else
            variant_p<BR, BF16, MODS, false>(acc_s, pt, tl, key_g, q0, Tq, Tk, Tk - Tq, scale_log2, va);
        if constexpr ((MODS & MOD_SOFTCAP) != 0)
            warp_ab_regs<BR, D, LD, BF16>(acc_dv, pt, do_tile);  // dV += P^T dO, P^T packed by variant_p
        else
            accumulate_dv<D, BR, BF16>(acc_dv, pt, acc_s, do_tile);
    }
    float acc_ds[BR / MMA_N][4];
    compute_ds<D, BR, BF16>(acc_ds, acc_s, sV + a_off, do_tile, td);  // dS^T (times 1 - t^2 with MOD_SOFTCAP)
    {
        u32 dst[BR / MMA_K][4];
        accumulate_dk<D, BR, BF16>(acc_dk, dst, acc_ds, q_tile, smem_raw + (sdS - sK));
    }
    __syncthreads();  // sdS holds every warp's keys
    {
        const u32 ds_lane = sdS + 2 * (((lane / 16) * 8 + lane % 8) * LDS + qm * MMA_M + ((lane / 8) % 2) * CHUNK);
        const u32 kt_lane = sK + 2 * ((lane % 8 + ((lane / 8) % 2) * 8) * LD + dn0 + (lane / 16) * CHUNK);
        float acc_q[DN / MMA_N][4];
        accumulate_dq<D, BR, NWARPS, BF16>(acc_q, dq_acc, q_base, ds_lane, kt_lane, q0 + qm * MMA_M, dn0, Tq, d);
    }
    if (threadIdx.x < BR) {  // the next tile's lse2 and delta, into the stage no warp reads now
        s_lse2[(stage ^ 1) * BR + threadIdx.x] = next_lse2;
        s_delta[(stage ^ 1) * BR + threadIdx.x] = next_delta;
    }
}

// Grouped heads: this query head's dK (unscaled) and dV in float32 (part_k, part_v: its (Tk, d) slices), which
// flash2_bwd_reduce_heads sums over the group. key_g as in store_dk_dv.
template <int D>
DEVICE void store_dk_dv_partial(float* __restrict__ part_k, float* __restrict__ part_v,
                                const float (&acc_dk)[D / MMA_N][4], const float (&acc_dv)[D / MMA_N][4], int key_g,
                                int Tk, int d) {
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key_g + 8 * h;
        if (key < Tk) {
#pragma unroll
            for (int nt = 0; nt < D / MMA_N; ++nt) {
                const int col = nt * MMA_N + 2 * t;
                if (col < d) {
                    const long long at = (long long)key * d + col;
                    *reinterpret_cast<float2*>(part_k + at) = make_float2(acc_dk[nt][2 * h], acc_dk[nt][2 * h + 1]);
                    *reinterpret_cast<float2*>(part_v + at) = make_float2(acc_dv[nt][2 * h], acc_dv[nt][2 * h + 1]);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Kernel 2, variants: one block per (K/V tile, b, query head h), as flash2_bwd_main, over the query tiles of
// query_tiles. q, o, dout (B, Hq, Tq, d); k, v, dk, dv (B, Hq / group, Tk, d): query head h reads kv head h / group.
// group == 1: dk, dv written in 16 bits (dkv_part null). group > 1: dkv_part (2, B, Hq, Tk, d) float32 gets each query
// head's dK (unscaled) and dV, summed by flash2_bwd_reduce_heads. doc_q (B, Tq), doc_k (B, Tk) and classes
// (B, ceil(Tq / BR), ceil(Tk / BC)) from flash2_mma_doc_classes (MOD_DOCS, else null); alibi_slopes (Hq,) (MOD_ALIBI).
// left, right, prefix, cap_in, cap_out: as flash2_mma_variants takes them.
// ---------------------------------------------------------------------------------------------------------
template <int D, int BR, int NWARPS, int MIN_BLOCKS, bool BF16, int MODS>
__global__ void __launch_bounds__(NWARPS * WARP_SIZE, MIN_BLOCKS)
flash2_bwd_variants(const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v,
                    const u16* __restrict__ dout, const float* __restrict__ lse2, const float* __restrict__ delta,
                    float* __restrict__ dq_acc, u16* __restrict__ dk, u16* __restrict__ dv, float* __restrict__ dkv_part,
                    const int* __restrict__ doc_q, const int* __restrict__ doc_k,
                    const signed char* __restrict__ classes, const float* __restrict__ alibi_slopes, int Tq, int Tk,
                    int d, float scale, int Hq, int group, int left, int right, int prefix, float cap_in,
                    float cap_out) {
    static_assert(MODS >= 0 && MODS <= MOD_ALL, "MODS is a sum of MOD_DOCS, MOD_SOFTCAP and MOD_ALIBI");
    constexpr int NTHREADS = NWARPS * WARP_SIZE, BC = MMA_M * NWARPS, LD = D + SMEM_PAD, O_NT = D / MMA_N;
    static_assert(D % MMA_K == 0 && D >= 32 && D <= 128 && BR % (2 * MMA_N) == 0 && BR >= 16 && NTHREADS >= BR &&
                      NWARPS % (BR / MMA_M) == 0 && (D / (NWARPS / (BR / MMA_M))) % (2 * MMA_N) == 0,
                  "the tiles of flash2_bwd_main");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const u32 sK = smem_addr(smem_raw), sV = sK + 2 * BC * LD, sQ = sV + 2 * BC * LD, sdO = sQ + 2 * 2 * BR * LD;
    float* s_lse2 = reinterpret_cast<float*>(smem_raw + 2 * (2 * BC * LD + 4 * BR * LD + BC * (BR + SMEM_PAD)));
    float* s_delta = s_lse2 + 2 * BR;
    // ---- this block: keys k0 .. k0 + BC - 1 of kv head h / group, for query head h of batch entry b ------------
    const int bh = blockIdx.y, b = bh / Hq, h = bh % Hq, k0 = blockIdx.x * BC, diag = Tk - Tq;
    const long long q_base = (long long)bh * Tq * d, r_base = (long long)bh * Tq;
    const long long k_base = ((long long)b * (Hq / group) + h / group) * Tk * d;
    VariantArgs va;
    va.left = left;
    va.right = right;
    va.prefix = prefix;
    if constexpr ((MODS & MOD_DOCS) != 0) {
        va.doc_q = doc_q + (long long)b * Tq;
        va.doc_k = doc_k + (long long)b * Tk;
        va.classes = classes + (long long)b * ((Tq + BR - 1) / BR) * gridDim.x + blockIdx.x;
        va.stride = gridDim.x;
    }
    va.cap_in = cap_in;
    va.cap_out = cap_out;
    if constexpr ((MODS & MOD_ALIBI) != 0) va.slope = alibi_slopes + h;
    const QueryTiles<BR, BC, MODS> qt = query_tiles<BR, BC, MODS>(k0, Tq, Tk, diag, va);

    // ---- K, V and the first query tile in flight -----------------------------------------------------------------
    load_tile_async<BC, D, NTHREADS>(sK, k + k_base, k0, Tk, d);
    load_tile_async<BC, D, NTHREADS>(sV, v + k_base, k0, Tk, d);
    if (qt.first < qt.end) {
        load_query_tile<D, BR, NTHREADS>(sQ, sdO, q + q_base, dout + q_base, qt.first * BR, Tq, d);
        if (threadIdx.x < BR) {
            const int row = qt.first * BR + threadIdx.x;
            s_lse2[threadIdx.x] = row < Tq ? lse2[r_base + row] : POS_INF;  // a row past Tq: P = 0
            s_delta[threadIdx.x] = row < Tq ? delta[r_base + row] : 0.f;
        }
    }
    cp_async_commit();
    float acc_dk[O_NT][4], acc_dv[O_NT][4];
#pragma unroll
    for (int nt = 0; nt < O_NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dk[nt][e] = acc_dv[nt][e] = 0.f;

    // ---- the query tiles: FULL ones without mask code ------------------------------------------------------------
    const float scale_log2 = scale * LOG2E;
    int n = 0;  // tiles visited
    for (int i = qt.first; i < qt.end; ++n) {
        const int next = qt.after(i);
        variant_query_tile<D, BR, NWARPS, BF16, MODS>(acc_dk, acc_dv, n, i, next, qt.end, !qt.full(i, Tk), q, dout,
                                                      lse2, delta, dq_acc, q_base, r_base, k0, Tq, Tk, d, scale_log2,
                                                      va);
        i = next;
    }
    cp_async_wait<0>();  // nothing in flight at exit

    // ---- dK, dV: 16 bits (group == 1), or this query head's float32 part -------------------------------------------
    const int key_g = k0 + (threadIdx.x / WARP_SIZE) * MMA_M + (threadIdx.x % WARP_SIZE) / 4;
    if (dkv_part == nullptr) {
        store_dk_dv<D, BF16>(dk, dv, k_base, acc_dk, acc_dv, key_g, Tk, d, scale);
    } else {
        const long long part = (long long)bh * Tk * d, half = (long long)gridDim.y * Tk * d;
        store_dk_dv_partial<D>(dkv_part + part, dkv_part + half + part, acc_dk, acc_dv, key_g, Tk, d);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Kernel 4 (grouped heads only): out (B, Hkv, Tk, d) = scale * the sum over its group of query heads of part
// (B, Hq, Tk, d) float32, in 16 bits, two elements per thread: kv head x sums parts x group .. x group + group - 1.
// pairs = B Hkv Tk d / 2, head_pairs = Tk d / 2. Called for dK (scale) and dV (1); the order of the sum is fixed.
// ---------------------------------------------------------------------------------------------------------
template <bool BF16>
__global__ void flash2_bwd_reduce_heads(const float* __restrict__ part, u16* __restrict__ out, long long pairs,
                                        long long head_pairs, int group, float scale) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < pairs;
         i += (long long)gridDim.x * blockDim.x) {
        const long long kv = i / head_pairs;
        const float2* src = reinterpret_cast<const float2*>(part) + (kv * group) * head_pairs + (i - kv * head_pairs);
        float2 s = src[0];
        for (int r = 1; r < group; ++r) {
            const float2 x = src[r * head_pairs];
            s.x += x.x;
            s.y += x.y;
        }
        reinterpret_cast<u32*>(out)[i] = pack2<BF16>(s.x * scale, s.y * scale);
    }
}

// ---- the builds the launcher uses by default (kernels/flash/flash2_mma_bwd.py: TILES), instantiated so that
// `nvcc -c flash2_mma_bwd.cu` alone yields these kernels; NVRTC instantiates the launcher's builds by name.
#ifndef __CUDACC_RTC__
#define FLASH2_BWD_INSTANTIATE(D, BR, NWARPS, MIN_BLOCKS, BF16)                                                     \
    template __global__ void flash2_bwd_main<D, BR, NWARPS, MIN_BLOCKS, BF16>(                                      \
        const u16*, const u16*, const u16*, const u16*, const float*, const float*, float*, u16*, u16*, int, int,  \
        int, float, int);
FLASH2_BWD_INSTANTIATE(32, 128, 8, 1, false)
FLASH2_BWD_INSTANTIATE(64, 128, 8, 1, false)
FLASH2_BWD_INSTANTIATE(96, 64, 8, 1, false)
FLASH2_BWD_INSTANTIATE(128, 64, 8, 1, false)
FLASH2_BWD_INSTANTIATE(32, 128, 8, 1, true)
FLASH2_BWD_INSTANTIATE(64, 128, 8, 1, true)
FLASH2_BWD_INSTANTIATE(96, 64, 8, 1, true)
FLASH2_BWD_INSTANTIATE(128, 64, 8, 1, true)
template __global__ void flash2_bwd_preprocess<false>(const u16*, const u16*, const float*, const float*, float*,
                                                      float*, float*, long long, int);
template __global__ void flash2_bwd_preprocess<true>(const u16*, const u16*, const float*, const float*, float*,
                                                     float*, float*, long long, int);
template __global__ void flash2_bwd_convert<false>(const float*, u16*, long long, float);
template __global__ void flash2_bwd_convert<true>(const float*, u16*, long long, float);
// the variant kernel: every switch at D = 64, none at D = 128 (the launcher compiles the others it needs)
#define FLASH2_BWD_VARIANTS_INSTANTIATE(D, BR, NWARPS, MIN_BLOCKS, BF16, MODS)                                      \
    template __global__ void flash2_bwd_variants<D, BR, NWARPS, MIN_BLOCKS, BF16, MODS>(                           \
        const u16*, const u16*, const u16*, const u16*, const float*, const float*, float*, u16*, u16*, float*,    \
        const int*, const int*, const signed char*, const float*, int, int, int, float, int, int, int, int, int,   \
        float, float);
FLASH2_BWD_VARIANTS_INSTANTIATE(64, 128, 8, 1, false, 7)
FLASH2_BWD_VARIANTS_INSTANTIATE(128, 64, 8, 1, true, 0)
template __global__ void flash2_bwd_reduce_heads<false>(const float*, u16*, long long, long long, int, float);
template __global__ void flash2_bwd_reduce_heads<true>(const float*, u16*, long long, long long, int, float);
#endif
