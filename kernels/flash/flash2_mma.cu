// flash2_mma.cu -- FlashAttention-2 forward on tensor cores: mma.sync.m16n8k16, ldmatrix, cp.async (fp16/bf16).
//
// What it computes
//   O[b, h] = softmax(scale * Q[b, h] K[b, h]^T + mask) V[b, h], and optionally the log-sum-exp of each row, for 16-bit
//   inputs (float16 or bfloat16) with float32 accumulation. Causal masking is bottom-right aligned: query i sees key j
//   when j <= i + Tk - Tq. A query row that sees no key gives 0 (lse = -inf). Notebook 06 teaches it (after flash2.cu on
//   CUDA cores and flash2_wmma.cu, whose fragments hide which element a register holds: the mma.sync layouts are
//   documented, so the softmax runs on the accumulator registers); notebook 09 the varlen kernel. flash2_mma_variants
//   adds what reference/variants.py defines: grouped-query heads, a sliding window, a prefix, document ids, tanh
//   soft-capping and ALiBi; it skips EMPTY key tiles and runs FULL ones without mask code.
//
// Algorithm (one block: BR = 16 MT NWARPS query rows of one head; each warp owns 16 MT whole rows, see attention_block)
//   1. Q tile and K, V tile 0 -> shared memory (cp.async); m = -inf, l = 0, O = 0 in registers.
//   2. For each key tile j of BC keys (causal: only tiles that hold a visible key; variants: those of key_tiles):
//      a. wait for tile j; __syncthreads (the one barrier per tile); prefetch tile j+1 into the other stage
//      b. S = Q K^T             ldmatrix Q (A operand) and K (B operand), mma.sync into float32 registers
//      c. mask keys >= Tk and, if causal, keys after the diagonal (-inf); variants: score_mods, then on PARTIAL
//         tiles variant_mask
//      d. m~ = c rowmax S, c = scale log2(e); a row's base m moves to m~ only when m~ > m + 8 (lazy rescaling)
//      e. P = exp2(c S - m) in place; l = l 2^(m_old - m) + rowsum P; O *= 2^(m_old - m) where a base moved
//      f. O += P V              P, packed to 16 bits in registers, is the A operand: the C layout of two 16x8 tiles of S
//                               is the A layout of one 16x16 tile of P (ptx/mma_sync.cuh); V by ldmatrix.trans
//   3. O /= l, rounded to 16 bits, through the warp's own rows of sQ to global memory in 16-byte chunks;
//      lse = ln2 (m + log2 l).
//   Step 2 runs in one of three loops chosen per build at compile time (row by row, ILP, fused ILP): see IlpBuild.
//
// Layouts
//   dense   q, o (B, H, Tq, d) and k, v (B, H, Tk, d), contiguous; lse (B, H, Tq) float32.
//   varlen  q (total_q, H, d), k and v (total_k, H, d): token rows ld_q / ld_kv elements apart (H d when contiguous,
//           3 H d inside one fused QKV projection); o (total_q, H, d) contiguous; lse (H, total_q). cu_seqlens_q and
//           cu_seqlens_k (int32, B+1): sequence b owns rows cu[b] .. cu[b+1]-1; causal is bottom-right per sequence.
//   shared  sQ [BR][D+8], sK [2][BC][D+8], sV [2][BC][D+8], 16-bit; each row padded by SMEM_PAD = 8 elements (16 bytes),
//           which spreads the eight rows one ldmatrix reads over all 32 banks.
//
// Launch (kernels/flash/flash2_mma.py: TILES, _launch_config; default tile BC = 64, NWARPS = 4, MT = 2, so BR = 128,
// and MIN_BLOCKS = 2 at D = 64, else 1; at D = 256 BC = 32, NWARPS = 4, MT = 1, so BR = 64 and 99 KB of shared memory,
// which every GPU of compute capability >= 8.0 allows a block, sm_86 and sm_89 included)
//   dense   grid = B H ceil(Tq / BR) blocks (1-D), block = 32 NWARPS threads,
//           dynamic shared memory = 2 (BR + 4 BC) (D + 8) bytes (above 48 KB: cudaFuncSetAttribute first)
//   varlen  grid = (ceil(max_seqlen_q / BR), H, B), the same block and shared memory
//
// Kernels: template <int D, int BC, int NWARPS, int MT, int MIN_BLOCKS, bool BF16> (D: the head-dim build, 32, 64, 96,
// 128 or 256; BC: keys per K/V tile; MT: 16-row m-tiles per warp; MIN_BLOCKS: blocks per SM for __launch_bounds__)
//   flash2_mma_forward(const u16* q, const u16* k, const u16* v, u16* o, float* lse, int Tq, int Tk, int d,
//                      float scale_log2, int causal, int head_major)
//   flash2_mma_varlen(const u16* q, const u16* k, const u16* v, u16* o, float* lse, const int* cu_seqlens_q,
//                     const int* cu_seqlens_k, int total_q, int total_k, int H, int d, int ld_q, int ld_kv,
//                     float scale_log2, int causal)
//   flash2_mma_variants<..., int MODS>(q, k, v, o, lse, const int* doc_q, const int* doc_k, const signed char* classes,
//                      const float* alibi_slopes, int Tq, int Tk, int d, float scale_log2, int head_major, int Hq,
//                      int group, int left, int right, int prefix, float cap_in, float cap_out): see the kernel.
//   flash2_mma_doc_classes(const int* doc_q, const int* doc_k, signed char* classes, int Tq, int Tk, int br, int bc)
//   u16: the bits of float16 (BF16 = false) or bfloat16 (BF16 = true). lse == nullptr: no lse is written.
//   scale_log2 = scale * log2(e) (scale > 0, usually 1/sqrt(d)). Tq, Tk, d, total_q, total_k: lengths; D is the
//   capacity (d <= D). causal, head_major: 0 or 1. head_major = 1: block x takes head x / ceil(Tq/BR), so blocks side
//   by side share a head's K and V in L2; 0: head x % (B H), the longest causal tile of every head first (the launcher
//   picks it under a causal mask on small problems: grid_order). Query tiles run last to first either way.
//   cu_seqlens are read on the GPU and clamped to [0, total], so a malformed array gives wrong rows, never an
//   out-of-bounds access; blocks past a sequence's last tile exit at once.
//   -D switches, defaults as the launcher passes them: SMEM_PAD 8, ILP_MIN_REGS 200, FUSED_MAX_D 64, ILP_MODE -1
//   (0 forces the row-by-row loop, 1 an ILP loop: notebook 06 compares their bits and times them).
//
// Requires compute capability 8.0 (cp.async, ldmatrix, bf16 mma.sync); includes ptx/common.cuh, ptx/cp_async.cuh and
// ptx/mma_sync.cuh. Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/flash/flash2_mma.cu -o flash2_mma.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80, name expressions:
//     "flash2_mma_forward<64, 64, 4, 2, 2, false>" "flash2_mma_forward<64, 64, 4, 2, 2, true>"
//     "flash2_mma_varlen<64, 64, 4, 2, 2, false>" "flash2_mma_variants<64, 64, 4, 2, 2, false, 7>"
//     "flash2_mma_forward<256, 32, 4, 1, 1, true>" "flash2_mma_variants<256, 32, 4, 1, 1, false, 7>"
// Host-side example (allocate, fill, launch, check): kernels/examples/flash2_mma_host.cu.
//
// Limits (checked by the launcher): d % 8 == 0 (cp.async moves 16-byte chunks) and d <= D <= 256 (O alone takes
// MT D / 2 float registers per thread: 128 at D = 256, MT = 1); columns d..D-1 are zero-filled and never written. Any
// Tq, Tk >= 1: rows past the end are zero-filled on load, masked as keys and not stored as queries. q, k, v, o 16-byte
// aligned. Element indices are 64-bit, row indices 32-bit.
// Numerics: products in 16 bits, sums in float32 (the mma accumulators); softmax in float32 with ex2.approx (relative
// error ~2^-22, subnormals flushed); P rounded to 16 bits before P V, O once at the end. The three loops give the same
// bits.
// What was tried and measured (tiles, loops, registers, timings): kernels/flash/README.md.

#include "ptx/common.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mma_sync.cuh"

#define NEG_INF (-__int_as_float(0x7f800000))
#define FULL_MASK 0xffffffffu

// Elements of padding per shared-memory row (16 bytes). The launcher passes -DSMEM_PAD from its own constant, so
// that the shared memory it allocates and the layout the kernel assumes come from one number.
#ifndef SMEM_PAD
#define SMEM_PAD 8
#endif

enum : int {
    WARP_SIZE = 32,
    MMA_M = 16,    // rows of an mma.m16n8k16 tile
    MMA_N = 8,     // columns
    MMA_K = 16,    // depth
    CHUNK = 8,     // 16-bit elements in one 16-byte cp.async / ldmatrix row
};
// The exponent base of a row moves only when a tile's max exceeds it by more than this (log2 units), so
// probabilities stay <= 2^8 before normalisation: exact in float32, representable in fp16 and bf16.
#define RESCALE_THRESHOLD 8.0f
#define LN2 0.6931471805599453f
#define LOG2E 1.4426950408889634f

DEVICE float quad_max(float x) {  // the 4 lanes of a quad hold one row's columns
    x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, 1));
    return fmaxf(x, __shfl_xor_sync(FULL_MASK, x, 2));
}
DEVICE float quad_sum(float x) {
    x += __shfl_xor_sync(FULL_MASK, x, 1);
    return x + __shfl_xor_sync(FULL_MASK, x, 2);
}

// Rows [row0, row0 + ROWS) of a (T x d) 16-bit matrix whose rows lie ld elements apart (ld = d when dense; H d
// or 3 H d for packed tokens) -> the shared tile at `tile` ([ROWS][LD], 32-bit shared address); zero-fill past T
// and d. Thread i copies 16-byte chunk i % CHUNKS of rows i / CHUNKS,
// i / CHUNKS + STEP, ...: the same chunk of every tile, so its offsets are computed once per call and a tile
// fully in range (all but the last, when d == D) needs one add and one cp.async per chunk.
template <int ROWS, int D, int NTHREADS>
DEVICE void load_tile_async(u32 tile, const u16* __restrict__ src, int row0, int T, int d, int ld) {
    constexpr int CHUNKS = D / CHUNK;  // 16-byte chunks per row
    constexpr int LD = D + SMEM_PAD;
    if constexpr (NTHREADS % CHUNKS == 0) {
        constexpr int STEP = NTHREADS / CHUNKS;  // rows one pass of the block covers
        constexpr int PASSES = (ROWS + STEP - 1) / STEP;
        const int r = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS;
        const u16* from = src + (long long)(row0 + r) * ld + c * CHUNK;
        const long long step = (long long)STEP * ld;
        const u32 to = tile + 2 * (r * LD + c * CHUNK);
        if (row0 + ROWS <= T && d == D && ROWS % STEP == 0) {
#pragma unroll
            for (int p = 0; p < PASSES; ++p) cp_async_16(to + 2 * p * STEP * LD, from + p * step);
        } else {
            const bool col_ok = c * CHUNK < d;
#pragma unroll
            for (int p = 0; p < PASSES; ++p) {
                if (ROWS % STEP == 0 || r + p * STEP < ROWS) {
                    const bool ok = col_ok && row0 + r + p * STEP < T;
                    cp_async_16(to + 2 * p * STEP * LD, ok ? from + p * step : src, ok);
                }
            }
        }
    } else {  // D = 96: 12 chunks per row do not divide the block; the plain loop
        for (int i = threadIdx.x; i < ROWS * CHUNKS; i += NTHREADS) {
            const int r = i / CHUNKS, c = i % CHUNKS;
            const int row = row0 + r;
            const bool ok = row < T && c * CHUNK < d;
            cp_async_16(tile + 2 * (r * LD + c * CHUNK), ok ? src + (long long)row * ld + c * CHUNK : src, ok);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// The steps of one K/V tile, as one warp sees them. Each works on the warp's own registers: S (acc_s),
// O (acc_o) and the running row state (row_max, row_sum); only K and V come from shared memory.
// They are force-inlined, so the kernel compiles as if it were written out in one piece.
//   warp_scores           S = Q K^T                                  (ldmatrix + mma.sync)
//   online_softmax        mask, row max, P = exp2(c S - m), l        (row by row, in place in the S registers)
//   softmax_max_ilp       mask, row max, base moves: all rows of a lane side by side (the ILP loops' first half)
//   online_softmax_ilp    softmax_max_ilp, then P and l for all rows side by side (ILP loop)
//   rescale_output        O *= 2^(m_old - m_new) where a row's base moved
//   warp_accumulate_pv    O += P V                                   (P from registers, V by ldmatrix.trans)
//   softmax_exp_pv        P and l made 16 keys at a time inside O += P V (fused ILP loop)
//   store_output          O / l through shared memory in 16-byte chunks, and the LSE
// kv_tile runs them for one K/V tile, attention_block for one block.
// ---------------------------------------------------------------------------------------------------------

// S = Q K^T for this warp's 16*MT rows against the tile's BC keys: (16MT x D) x (D x BC), float32 accumulators.
// q_lane and k_tile are this lane's ldmatrix row addresses in sQ and in the K stage of the tile.
template <int D, int BC, int MT, bool BF16>
DEVICE void warp_scores(float (&acc_s)[MT][BC / MMA_N][4], u32 q_lane, u32 k_tile) {
    constexpr int LD = D + SMEM_PAD;
    constexpr int S_NT = BC / MMA_N;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < S_NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / MMA_K; ++kk) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)  // A = Q rows 16mt + (l % 16), columns 16kk + 8 (l / 16)
            ldmatrix_x4(a[mt], q_lane + 2 * (mt * MMA_M * LD + kk * MMA_K));
#pragma unroll
        for (int np = 0; np < S_NT / 2; ++np) {  // B = K^T: K rows (keys) are B's columns
            u32 b[4];  // b[0], b[1]: n-tile 2np; b[2], b[3]: n-tile 2np + 1
            ldmatrix_x4(b, k_tile + 2 * (np * 2 * MMA_N * LD + kk * MMA_K));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma_16816<BF16>(acc_s[mt][2 * np], a[mt], b[0], b[1]);
                mma_16816<BF16>(acc_s[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// The second half of the softmax for one row of the lane (m-tile mt, row g + 8h): P = 2^(c s - base) in place of its
// scores, and l = l * correction + rowsum P (this lane's part of the row). base: the row's max m, or 0 while the row
// has seen no visible key (then every s is -inf and p = 0).
template <int BC, int MT>
DEVICE void exp_row(float (&acc_s)[MT][BC / MMA_N][4], int mt, int h, float m, float correction, float& row_sum,
                    float scale_log2) {
    const float base = m == NEG_INF ? 0.f : m;  // nothing visible: p = 0
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < BC / MMA_N; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float p = exp2_ftz(fmaf(acc_s[mt][nt][2 * h + e], scale_log2, -base));
            acc_s[mt][nt][2 * h + e] = p;
            sum += p;
        }
    }
    row_sum = row_sum * correction + sum;
}

// Mask the scores, then the online softmax on the registers: S becomes P = exp2(c s - base) in place.
// row_max holds the exponent base of each row (log2 units, scale folded in). It moves only when the tile's
// max exceeds it by more than RESCALE_THRESHOLD: until then p = 2^(c s - base) <= 2^8, exact in float32 and
// far inside float16/bfloat16 range, and O and l need no rescaling. The result is the same; only the common
// factor differs. correction[mt][h] is the factor O's row must be multiplied by (1 where the base stayed);
// the return value says whether any row of this lane moved.
// warp_row0: the first query row of the warp; k0: the tile's first key; edge: the tile holds a masked key.
template <int BC, int MT>
DEVICE bool online_softmax(float (&acc_s)[MT][BC / MMA_N][4], float (&row_max)[MT][2], float (&row_sum)[MT][2],
                           float (&correction)[MT][2], int warp_row0, int k0, bool edge, int Tk, int diag,
                           int causal, float scale_log2) {
    constexpr int S_NT = BC / MMA_N;
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // h = 0: row g, h = 1: row g + 8
            const int row = warp_row0 + mt * MMA_M + g + 8 * h;
            float mx = NEG_INF;  // the row's largest raw score in this tile
#pragma unroll
            for (int nt = 0; nt < S_NT; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    if (edge) {
                        const int col = k0 + nt * MMA_N + 2 * t + e;
                        if (col >= Tk || (causal && col > row + diag)) acc_s[mt][nt][2 * h + e] = NEG_INF;
                    }
                    mx = fmaxf(mx, acc_s[mt][nt][2 * h + e]);
                }
            }
            // scale > 0, so max(c s) = c max(s): the scale is applied once per row here and folded into
            // the exponent's FMA below, not multiplied into every score.
            const float m_tile = quad_max(mx) * scale_log2;
            const float old = row_max[mt][h];
            const bool move = m_tile > old + RESCALE_THRESHOLD;  // true on a row's first visible key
            row_max[mt][h] = move ? m_tile : old;
            correction[mt][h] = move ? exp2_ftz(old - m_tile) : 1.f;  // 2^-inf = 0 on the first move
            moved |= move;
            exp_row<BC, MT>(acc_s, mt, h, row_max[mt][h], correction[mt][h], row_sum[mt][h], scale_log2);
        }
    }
    return moved;
}

// The ILP loops' softmax comes in two halves (the ILP loop of attention_block, for builds with registers to spare).
// softmax_max_ilp, the first half: the mask, each row's max, the move of its base and the correction, in place in the
// S registers; it returns whether any row of this lane moved. MASK (compile time): the tile may hold a masked key (a
// key >= Tk, or under the causal mask a key after a row's diagonal); without it no mask code is emitted at all. With
// it, one integer compare per score against rel, the last visible key of the row relative to this lane's first column.
// The steps run for all 2 MT rows of the lane at once (all maxima, then all first shuffles, then all second
// shuffles), with no branch in between: the 2 MT dependency chains (a shuffle waits about 30 cycles) overlap instead
// of running one row after the other. Each row's arithmetic is the same as one row at a time, in the same order, so
// P, l and O are bit for bit what the row-by-row loop gave.
template <int BC, int MT, bool MASK>
DEVICE bool softmax_max_ilp(float (&acc_s)[MT][BC / MMA_N][4], float (&row_max)[MT][2], float (&correction)[MT][2],
                            int warp_row0, int k0, int Tk, int diag, int causal, float scale_log2) {
    constexpr int S_NT = BC / MMA_N;
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    if constexpr (MASK) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // h = 0: row g, h = 1: row g + 8
                const int row = warp_row0 + mt * MMA_M + g + 8 * h;
                // key k0 + 2t + c (c = 8 nt + e) is visible when it is <= last: key < Tk and, if causal, <= row + diag
                const int last = causal ? min(Tk - 1, row + diag) : Tk - 1;
                const int rel = last - k0 - 2 * t;  // visible iff c <= rel
#pragma unroll
                for (int nt = 0; nt < S_NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        if (nt * MMA_N + e > rel) acc_s[mt][nt][2 * h + e] = NEG_INF;
            }
        }
    }
    float mx[MT][2];  // each row's largest raw score in this tile: this lane's columns, then the quad's
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float m = NEG_INF;
#pragma unroll
            for (int nt = 0; nt < S_NT; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) m = fmaxf(m, acc_s[mt][nt][2 * h + e]);
            mx[mt][h] = m;
        }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)  // quad_max of every row, the 2 MT rows' shuffles side by side
#pragma unroll
        for (int h = 0; h < 2; ++h) mx[mt][h] = fmaxf(mx[mt][h], __shfl_xor_sync(FULL_MASK, mx[mt][h], 1));
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) mx[mt][h] = fmaxf(mx[mt][h], __shfl_xor_sync(FULL_MASK, mx[mt][h], 2));
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // scale > 0, so max(c s) = c max(s): the scale is applied once per row here and folded into
            // the exponent's FMA (the second half), not multiplied into every score.
            const float m_tile = mx[mt][h] * scale_log2;
            const float old = row_max[mt][h];
            const bool move = m_tile > old + RESCALE_THRESHOLD;  // true on a row's first visible key
            row_max[mt][h] = move ? m_tile : old;
            correction[mt][h] = move ? exp2_ftz(old - m_tile) : 1.f;  // 2^-inf = 0 on the first move
            moved |= move;
        }
    }
    return moved;
}

// online_softmax_ilp: the same computation as online_softmax, as the unfused ILP loop runs it: softmax_max_ilp, then
// P = exp2(c S - base) in place and l, all 2 MT rows side by side (an ex2 waits about 20 cycles).
template <int BC, int MT, bool MASK>
DEVICE bool online_softmax_ilp(float (&acc_s)[MT][BC / MMA_N][4], float (&row_max)[MT][2], float (&row_sum)[MT][2],
                               float (&correction)[MT][2], int warp_row0, int k0, int Tk, int diag, int causal,
                               float scale_log2) {
    const bool moved =
        softmax_max_ilp<BC, MT, MASK>(acc_s, row_max, correction, warp_row0, k0, Tk, diag, causal, scale_log2);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            exp_row<BC, MT>(acc_s, mt, h, row_max[mt][h], correction[mt][h], row_sum[mt][h], scale_log2);
    return moved;
}

// O *= correction, row by row: e / 2 picks row g (accumulators 0, 1) or g + 8 (2, 3).
template <int D, int MT>
DEVICE void rescale_output(float (&acc_o)[MT][D / MMA_N][4], const float (&correction)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < D / MMA_N; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[mt][nt][e] *= correction[mt][e / 2];
}

// One 16x16 A tile of P from two 16x8 accumulator tiles side by side (keys 0..7 in c0, keys 8..15 in c1), rounded to
// 16 bits: the C layout of S is, element for element, the A layout of P (ptx/mma_sync.cuh), so P stays in registers.
template <bool BF16>
DEVICE void c_pair_to_a(u32 (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack2<BF16>(c0[0], c0[1]);  // row g,   keys 0..7
    a[1] = pack2<BF16>(c0[2], c0[3]);  // row g+8, keys 0..7
    a[2] = pack2<BF16>(c1[0], c1[1]);  // row g,   keys 8..15
    a[3] = pack2<BF16>(c1[2], c1[3]);  // row g+8, keys 8..15
}

// O += P V for the 16-key step kk: a[mt], the A fragments of P for the warp's m-tiles; V (B operand) by
// ldmatrix.trans from v_tile, this lane's row address in the V stage (V rows 16kk + (l % 8) + 8 ((l / 8) % 2),
// columns 16np + 8 (l / 16)).
template <int D, int MT, bool BF16>
DEVICE void pv_step(float (&acc_o)[MT][D / MMA_N][4], const u32 (&a)[MT][4], u32 v_tile, int kk) {
    constexpr int LD = D + SMEM_PAD;
#pragma unroll
    for (int np = 0; np < D / (2 * MMA_N); ++np) {  // two n-tiles (16 columns of O) per ldmatrix.x4
        u32 b[4];
        ldmatrix_x4_trans(b, v_tile + 2 * (kk * MMA_K * LD + np * 2 * MMA_N));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            mma_16816<BF16>(acc_o[mt][2 * np], a[mt], b[0], b[1]);
            mma_16816<BF16>(acc_o[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
    }
}

// O += P V: P from the S registers (converted to 16 bits, they are the A operand), V by ldmatrix.trans
// (B operand). v_tile is this lane's ldmatrix row address in the V stage of the tile.
template <int D, int BC, int MT, bool BF16>
DEVICE void warp_accumulate_pv(float (&acc_o)[MT][D / MMA_N][4], const float (&acc_s)[MT][BC / MMA_N][4],
                               u32 v_tile) {
#pragma unroll
    for (int kk = 0; kk < BC / MMA_K; ++kk) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) c_pair_to_a<BF16>(a[mt], acc_s[mt][2 * kk], acc_s[mt][2 * kk + 1]);
        pv_step<D, MT, BF16>(acc_o, a, v_tile, kk);
    }
}

// The second half of the softmax fused with O += P V (the fused ILP loop): P = exp2(c S - base) and its row sums are
// made 16 keys at a time, right before the mma.sync that takes them as its A operand. With the rescale branch before
// it, the exponentials of one 16-key step and the MMAs of the step before are one basic block, which the compiler
// interleaves; in the unfused loops every exponential is done before the first MMA of P V. Same arithmetic in the
// same order as online_softmax_ilp + warp_accumulate_pv (the row sums add their keys in the same order), so the same
// bits. acc_s holds the raw (masked) scores; row_max and correction are softmax_max_ilp's.
template <int D, int BC, int MT, bool BF16>
DEVICE void softmax_exp_pv(float (&acc_o)[MT][D / MMA_N][4], const float (&acc_s)[MT][BC / MMA_N][4],
                           const float (&row_max)[MT][2], float (&row_sum)[MT][2], const float (&correction)[MT][2],
                           float scale_log2, u32 v_tile) {
    float base[MT][2], sum[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            base[mt][h] = row_max[mt][h] == NEG_INF ? 0.f : row_max[mt][h];  // nothing visible: p = 0
            sum[mt][h] = 0.f;
        }
#pragma unroll
    for (int kk = 0; kk < BC / MMA_K; ++kk) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            float p[2][4];  // n-tiles 2kk + i of P in the C layout: [i][2h + e] = row g + 8h, column 2t + e
#pragma unroll
            for (int h = 0; h < 2; ++h)  // the row sums add their keys in the order online_softmax_ilp does
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        p[i][2 * h + e] = exp2_ftz(fmaf(acc_s[mt][2 * kk + i][2 * h + e], scale_log2, -base[mt][h]));
                        sum[mt][h] += p[i][2 * h + e];
                    }
            c_pair_to_a<BF16>(a[mt], p[0], p[1]);
        }
        pv_step<D, MT, BF16>(acc_o, a, v_tile, kk);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) row_sum[mt][h] = row_sum[mt][h] * correction[mt][h] + sum[mt][h];
}

// The epilogue: O / l in 16 bits (the 4 lanes of a row add their partial l first), lse = ln2 * (m + log2 l).
// oh: this head's O, rows ld_o elements apart; lse[lse_base + row] is the row's log-sum-exp (lse may be null).
// O goes out through shared memory: each lane puts its packed pairs into the warp's own rows of sQ (sq_warp: the
// warp's first row there; 4-byte stores, the pad keeps the 32 lanes on 32 banks), then the warp copies them out in
// whole 16-byte chunks, a row's chunks side by side. Stored straight from the accumulators, the same O took four
// times as many store instructions, each writing 16-byte pieces of 8 rows, and the kernel was slower where a block's
// loop is short (kernels/flash/README.md).
template <int D, int MT, bool BF16>
DEVICE void store_output(u16* __restrict__ oh, float* __restrict__ lse, long long lse_base,
                         const float (&acc_o)[MT][D / MMA_N][4], const float (&row_max)[MT][2],
                         const float (&row_sum)[MT][2], int warp_row0, int Tq, int d, int ld_o, u32 sq_warp) {
    constexpr int LD = D + SMEM_PAD;
    constexpr int WR = MMA_M * MT;
    constexpr int CHUNKS = D / CHUNK;
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    __syncwarp();  // every lane's last ldmatrix of these Q rows comes before any lane's store over them
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = mt * MMA_M + g + 8 * h;  // row within the warp
            const float l = quad_sum(row_sum[mt][h]);
            const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
            for (int nt = 0; nt < D / MMA_N; ++nt)
                st_shared_u32(sq_warp + 2 * (r * LD + nt * MMA_N + 2 * t),
                              pack2<BF16>(acc_o[mt][nt][2 * h] * inv, acc_o[mt][nt][2 * h + 1] * inv));
            if (lse != nullptr && t == 0 && warp_row0 + r < Tq)
                lse[lse_base + warp_row0 + r] = l > 0.f ? LN2 * (row_max[mt][h] + __log2f(l)) : NEG_INF;
        }
    }
    __syncwarp();
#pragma unroll
    for (int i = lane; i < WR * CHUNKS; i += WARP_SIZE) {
        const int r = i / CHUNKS, c = i % CHUNKS;
        if (warp_row0 + r < Tq && c * CHUNK < d)
            *reinterpret_cast<uint4*>(oh + (long long)(warp_row0 + r) * ld_o + c * CHUNK) =
                ld_shared_v4(sq_warp + 2 * (r * LD + c * CHUNK));
    }
}

// ---------------------------------------------------------------------------------------------------------
// The variants (flash2_mma_variants below): a mask more general than causal, document ids, and score modifiers.
// MODS, a compile-time sum of the MOD_ flags, says which code exists in a build; the dense and varlen kernels pass 0,
// so none of it is compiled into them. Tiles are classified as EMPTY (never visited), FULL (no mask code) or PARTIAL.
//   key_tiles        the key tiles a block visits, from the bounds of its rows (window, causal, prefix) and the classes
//   score_mods       s -> log2 e (softcap tanh(scale s / softcap) - slope |j - c_i|) in place, before the mask
//   variant_mask     -inf where query i does not see key j (band, prefix, Tk, documents): PARTIAL tiles only
// ---------------------------------------------------------------------------------------------------------
enum : int {
    MOD_DOCS = 1,     // document ids: doc_q[i] == doc_k[j], and a class per (query tile, key tile) to skip by
    MOD_SOFTCAP = 2,  // tanh soft-capping of the scaled scores
    MOD_ALIBI = 4,    // ALiBi: minus slope_h |j - c_i|
    MOD_VARIANT = 8,  // set by flash2_mma_variants itself: the band mask and the tile classes are on
};
enum : int { TILE_EMPTY = 0, TILE_FULL = 1, TILE_PARTIAL = 2 };  // the classes of reference/variants.py

// What the variant steps read. Query i sits at c = i + Tk - Tq among the keys and sees key j < Tk when
// (c - left <= j <= c + right or j < prefix) and, with MOD_DOCS, doc_q[i] == doc_k[j]. Causal is folded in by the
// launcher (right = min(right, 0)); an unbounded side is Tq + Tk, which no position reaches.
struct VariantArgs {
    int left = 0, right = 0, prefix = 0, Tq = 0;
    const int* doc_q = nullptr;           // this batch entry's Tq query ids and Tk key ids (MOD_DOCS)
    const int* doc_k = nullptr;
    const signed char* classes = nullptr; // this (batch entry, query tile)'s class per key tile (MOD_DOCS)
    float cap_in = 0.f, cap_out = 0.f;    // softcap: s' = cap_out tanh(s cap_in), cap_in = scale / softcap,
                                          // cap_out = softcap log2 e
    float slope = 0.f;                    // ALiBi slope of this query head, times log2 e
};

// The key tiles one block visits, in order: the prefix tiles [0, pre_end), then the band's [band_begin, end),
// without the EMPTY ones (MOD_DOCS). A tile is FULL when each of its keys is < Tk and seen by every row of the block
// (a prefix key, or inside the band of the first row c_first and of the last row c_last), and its class says FULL.
template <int BC, int MODS>
struct KeyTiles {
    int first, pre_end, band_begin, end;
    int c_first, c_last, left, right, prefix;  // the block's first and last row's positions; VariantArgs' bounds
    const signed char* classes;
    DEVICE int after(int t) const {  // the next tile of the sequence after t, EMPTY ones skipped
        do t = t + 1 < pre_end ? t + 1 : max(t + 1, band_begin);
        while ((MODS & MOD_DOCS) != 0 && t < end && classes[t] == TILE_EMPTY);
        return t;
    }
    DEVICE bool full(int t, int Tk) const {
        const int k0 = t * BC, k1 = k0 + BC - 1;
        const int from = max(k0, prefix);  // keys from here on need the band of every row
        const bool seen = k1 < Tk && (k1 < prefix || (c_last - left <= from && k1 <= c_first + right));
        if constexpr ((MODS & MOD_DOCS) != 0) return seen && classes[t] == TILE_FULL;
        return seen;
    }
};

// The tiles of the block whose rows are [q0, q_last] (q_last < Tq): arithmetic on the tile bounds. The band's keys are
// [c_first - left, c_last + right] within [0, Tk); the prefix's [0, prefix).
template <int BC, int MODS>
DEVICE KeyTiles<BC, MODS> key_tiles(int q0, int q_last, int Tk, int diag, const VariantArgs& va) {
    KeyTiles<BC, MODS> kt;
    kt.left = va.left;
    kt.right = va.right;
    kt.prefix = va.prefix;
    kt.classes = va.classes;
    kt.c_first = q0 + diag;
    kt.c_last = q_last + diag;
    const int lo = max(0, kt.c_first - va.left), hi = min(Tk, kt.c_last + va.right + 1);  // band keys [lo, hi)
    kt.pre_end = (min(va.prefix, Tk) + BC - 1) / BC;
    kt.band_begin = max(lo / BC, kt.pre_end);
    const int band_end = hi > lo ? (hi + BC - 1) / BC : 0;
    kt.end = band_end > kt.band_begin ? band_end : kt.pre_end;
    kt.first = kt.pre_end > 0 ? 0 : kt.band_begin;
    if ((MODS & MOD_DOCS) != 0 && kt.first < kt.end && va.classes[kt.first] == TILE_EMPTY)
        kt.first = kt.after(kt.first);
    return kt;
}

// The score modifiers, in place on the warp's S (raw q.k): each score becomes its logit in log2 units, so the softmax
// that follows takes a scale of 1. Order as in the reference: scale, softcap, ALiBi (then the mask).
template <int BC, int MT, int MODS>
DEVICE void score_mods(float (&acc_s)[MT][BC / MMA_N][4], int warp_row0, int k0, int diag, float scale_log2,
                       const VariantArgs& va) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = warp_row0 + mt * MMA_M + g + 8 * h;
            const float rel0 = (float)(k0 + 2 * t - row - diag);  // j - c_i for this lane's first key (exact < 2^24)
#pragma unroll
            for (int nt = 0; nt < BC / MMA_N; ++nt) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float s = acc_s[mt][nt][2 * h + e];
                    if constexpr ((MODS & MOD_SOFTCAP) != 0)
                        s = va.cap_out * tanh_exp2(s * va.cap_in);
                    else
                        s *= scale_log2;
                    if constexpr ((MODS & MOD_ALIBI) != 0)
                        s = fmaf(-va.slope, fabsf(rel0 + (float)(nt * MMA_N + e)), s);
                    acc_s[mt][nt][2 * h + e] = s;
                }
            }
        }
    }
}

// The mask of a PARTIAL tile: key k0 + 2t + cc (cc = 8 nt + e) of a row is visible when cc <= last (key < Tk) and
// (lo <= cc <= hi (the band) or cc < pre (the prefix)), all relative to the lane's first key; with MOD_DOCS also when
// its document id is the row's. Each key's id is read once (an L1 hit after the first row) for all the lane's rows.
template <int BC, int MT, int MODS>
DEVICE void variant_mask(float (&acc_s)[MT][BC / MMA_N][4], int warp_row0, int k0, int Tk, int diag,
                         const VariantArgs& va) {
    const int lane = threadIdx.x % WARP_SIZE, g = lane / 4, t = lane % 4;
    const int c0 = k0 + 2 * t, last = Tk - 1 - c0, pre = va.prefix - c0;
    int lo[MT][2], hi[MT][2], doc[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = warp_row0 + mt * MMA_M + g + 8 * h, c = row + diag;
            lo[mt][h] = c - va.left - c0;
            hi[mt][h] = c + va.right - c0;
            if constexpr ((MODS & MOD_DOCS) != 0) doc[mt][h] = __ldg(va.doc_q + min(row, va.Tq - 1));
        }
#pragma unroll
    for (int nt = 0; nt < BC / MMA_N; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int cc = nt * MMA_N + e;
            int key_doc = 0;
            if constexpr ((MODS & MOD_DOCS) != 0) key_doc = __ldg(va.doc_k + min(c0 + cc, Tk - 1));
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    bool seen = cc <= last && ((lo[mt][h] <= cc && cc <= hi[mt][h]) || cc < pre);
                    if constexpr ((MODS & MOD_DOCS) != 0) seen = seen && key_doc == doc[mt][h];
                    if (!seen) acc_s[mt][nt][2 * h + e] = NEG_INF;
                }
        }
    }
}

// Which ILP builds fuse the exponentials into P V (softmax_exp_pv) and wait for tile 0's V apart from its K: those with
// D <= FUSED_MAX_D (see IlpBuild; above it the fused loop spilled). -DFUSED_MAX_D=0 turns both off.
#ifndef FUSED_MAX_D
#define FUSED_MAX_D 64
#endif
template <int D, bool ILP>
struct FusedBuild {
    static constexpr bool value = ILP && D <= FUSED_MAX_D;
};

// Tile 0's V (its own cp.async group) before the first P V: when tile 1's prefetch is in flight too, at most that
// one group may stay pending; then the barrier makes every thread's copies of V visible.
DEVICE void wait_v0(bool next_in_flight) {
    if (next_in_flight)
        cp_async_wait<1>();
    else
        cp_async_wait<0>();
    __syncthreads();
}

// One K/V tile j of the loop in attention_block, as the whole block runs it: wait for the tile, the barrier, the
// prefetch of tile j+1 into the other stage, then S = Q K^T, the softmax, O *= correction and O += P V.
// The variant kernel visits a subsequence of the tiles: j counts the tiles visited (the stage is j % 2), key tile
// `tile` is the one computed and key tile `next` the one prefetched (if next < n_tiles, then its end).
// ILP: online_softmax_ilp, masked when MASK (compile time); otherwise online_softmax, masked when edge (run time).
// Fused (FusedBuild): softmax_max_ilp, the rescale, then softmax_exp_pv in place of the softmax's exponentials and
// O += P V; on tile 0 the wait for V (its own cp.async group) and a second barrier come just before that.
// MODS & MOD_VARIANT (ILP only): score_mods, and variant_mask in place of the causal mask when MASK.
// sK, sV: the two stages' base addresses; kh, vh: the head's K and V rows, ld_kv elements apart.
template <int D, int BC, int NWARPS, int MT, bool BF16, bool ILP, bool MASK, int MODS = 0>
DEVICE void kv_tile(float (&acc_o)[MT][D / MMA_N][4], float (&row_max)[MT][2], float (&row_sum)[MT][2], int j,
                    int n_tiles, u32 sK, u32 sV, const u16* __restrict__ kh, const u16* __restrict__ vh, int Tk, int d,
                    int ld_kv, u32 q_lane, u32 k_lane, u32 v_lane, int warp_row0, int diag, int causal,
                    float scale_log2, bool edge, const VariantArgs& va, int tile = 0, int next = 0) {
    constexpr int NTHREADS = NWARPS * WARP_SIZE;
    constexpr u32 TILE_KV = 2 * BC * (D + SMEM_PAD);  // bytes of one K (or V) stage
    constexpr bool VARIANT = (MODS & MOD_VARIANT) != 0, SCORE_MODS = (MODS & (MOD_SOFTCAP | MOD_ALIBI)) != 0;
    static_assert(!VARIANT || ILP, "the variant kernel runs the ILP loops");
    const int stage = j & 1;
    const int k_tile = VARIANT ? tile : j;  // the key tile computed; the one prefetched is VARIANT ? next : j + 1,
                                            // written out where it is used (so the plain loops' code stays the same)
    constexpr bool FUSED = FusedBuild<D, ILP>::value;
    const bool split_v = FUSED && j == 0;  // tile 0 of a fused build: K came with Q, V in a cp.async group of its own
    if (split_v)
        cp_async_wait<1>();
    else
        cp_async_wait<0>();  // tile j (issued one iteration ago, a whole tile of math to land in) is here
    __syncthreads();     // ... for every thread's copies; and every warp is done with the previous tile's stage
    if ((VARIANT ? next : j + 1) < n_tiles) {  // double buffering: the next tile streams into the freed stage
        load_tile_async<BC, D, NTHREADS>(sK + (stage ^ 1) * TILE_KV, kh, (VARIANT ? next : j + 1) * BC, Tk, d, ld_kv);
        load_tile_async<BC, D, NTHREADS>(sV + (stage ^ 1) * TILE_KV, vh, (VARIANT ? next : j + 1) * BC, Tk, d, ld_kv);
        cp_async_commit();
    }

    float acc_s[MT][BC / MMA_N][4];
    warp_scores<D, BC, MT, BF16>(acc_s, q_lane, sK + stage * TILE_KV + k_lane);  // S = Q K^T
    if constexpr (SCORE_MODS) score_mods<BC, MT, MODS>(acc_s, warp_row0, k_tile * BC, diag, scale_log2, va);
    if constexpr (VARIANT && MASK) variant_mask<BC, MT, MODS>(acc_s, warp_row0, k_tile * BC, Tk, diag, va);
    constexpr bool CAUSAL_MASK = MASK && !VARIANT;    // the dense and varlen kernels' mask
    const float c = SCORE_MODS ? 1.f : scale_log2;  // score_mods made the logits in log2 units already

    float correction[MT][2];
    if constexpr (FUSED) {
        const bool moved = softmax_max_ilp<BC, MT, CAUSAL_MASK>(acc_s, row_max, correction, warp_row0, k_tile * BC,
                                                                Tk, diag, causal, c);
        if (__any_sync(FULL_MASK, moved)) rescale_output<D, MT>(acc_o, correction);
        if (split_v) wait_v0((VARIANT ? next : j + 1) < n_tiles);
        softmax_exp_pv<D, BC, MT, BF16>(acc_o, acc_s, row_max, row_sum, correction, c, sV + stage * TILE_KV + v_lane);
        return;
    }
    bool moved;
    if constexpr (ILP)
        moved = online_softmax_ilp<BC, MT, CAUSAL_MASK>(acc_s, row_max, row_sum, correction, warp_row0, k_tile * BC,
                                                        Tk, diag, causal, c);                       // S -> P
    else
        moved = online_softmax<BC, MT>(acc_s, row_max, row_sum, correction, warp_row0, k_tile * BC, edge, Tk, diag,
                                       causal, scale_log2);                                          // S -> P
    if (__any_sync(FULL_MASK, moved)) rescale_output<D, MT>(acc_o, correction);  // skipped if no row moved
    if (split_v) wait_v0((VARIANT ? next : j + 1) < n_tiles);
    warp_accumulate_pv<D, BC, MT, BF16>(acc_o, acc_s, sV + stage * TILE_KV + v_lane);  // O += P V
}

// The variant kernel's K/V loop: the tiles of key_tiles in order, each FULL one without mask code, the others through
// variant_mask; i counts the tiles visited (kv_tile's j: the stage, and the split wait of the first).
template <int D, int BC, int NWARPS, int MT, bool BF16, int MODS>
DEVICE void variant_kv_loop(float (&acc_o)[MT][D / MMA_N][4], float (&row_max)[MT][2], float (&row_sum)[MT][2],
                            const KeyTiles<BC, MODS>& kt, u32 sK, u32 sV, const u16* __restrict__ kh,
                            const u16* __restrict__ vh, int Tk, int d, int ld_kv, u32 q_lane, u32 k_lane, u32 v_lane,
                            int warp_row0, int diag, float scale_log2, const VariantArgs& va) {
    int i = 0;  // tiles visited
    for (int j = kt.first; j < kt.end; ++i) {
        const int next = kt.after(j);
        if (kt.full(j, Tk))
            kv_tile<D, BC, NWARPS, MT, BF16, true, false, MODS>(acc_o, row_max, row_sum, i, kt.end, sK, sV, kh, vh, Tk,
                                                                d, ld_kv, q_lane, k_lane, v_lane, warp_row0, diag, 0,
                                                                scale_log2, false, va, j, next);
        else
            kv_tile<D, BC, NWARPS, MT, BF16, true, true, MODS>(acc_o, row_max, row_sum, i, kt.end, sK, sV, kh, vh, Tk,
                                                               d, ld_kv, q_lane, k_lane, v_lane, warp_row0, diag, 0,
                                                               scale_log2, true, va, j, next);
        j = next;
    }
}

// ---------------------------------------------------------------------------------------------------------
// The work of one block: BR query rows [q0, q0 + BR) of one head against its keys, for both kernels below.
//
//            K/V tile j: BC keys, shared by all warps
//          +-------------------------------------------+
//   warp 0 | rows   0 .. 16MT-1  : S (16MT x BC) and O (16MT x D) in registers
//   warp 1 | rows 16MT .. 32MT-1 :   "
//     ...  |                        (BR = 16 MT NWARPS rows; the default builds: NWARPS = 4, MT = 2; MT = 1 at D = 256)
//          +-------------------------------------------+
//   No warp needs another warp's S, so the softmax needs no shared memory and no __syncthreads.
//
// qh, kh, vh: the head's first query / key / value row; rows lie ld_q, ld_kv elements apart. oh: the head's first
// output row, rows ld_o apart; lse[lse_base + row] (lse may be null). Tq, Tk: this head's (this sequence's) rows.
// MODS & MOD_VARIANT (flash2_mma_variants): the tiles of key_tiles, through variant_kv_loop; va its mask and modifiers.
// ---------------------------------------------------------------------------------------------------------
template <int D, int BC, int NWARPS, int MT, bool BF16, bool ILP, int MODS = 0>
DEVICE void attention_block(const u16* __restrict__ qh, const u16* __restrict__ kh, const u16* __restrict__ vh,
                            u16* __restrict__ oh, float* __restrict__ lse, long long lse_base, int ld_q, int ld_kv,
                            int ld_o, int q0, int Tq, int Tk, int d, float scale_log2, int causal,
                            const VariantArgs& va) {
    constexpr int NTHREADS = NWARPS * WARP_SIZE;
    constexpr int WR = MMA_M * MT;    // query rows per warp
    constexpr int BR = WR * NWARPS;   // query rows per block
    constexpr int LD = D + SMEM_PAD;  // shared-memory row stride, elements
    static_assert(D % MMA_K == 0 && D >= 32 && D <= 256, "D must be a multiple of 16 in [32, 256]");
    static_assert(BC % (2 * MMA_N) == 0 && BC >= 16, "BC must be a multiple of 16 (ldmatrix.x4 loads 2 n-tiles)");
    static_assert(MT >= 1 && NWARPS >= 1 && NTHREADS <= 1024, "bad warp tiling");
    static_assert((LD * 2) % 16 == 0, "shared rows must stay 16-byte aligned for cp.async and ldmatrix");

    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr u32 TILE_KV = 2 * BC * LD;  // bytes of one K (or V) stage
    const u32 sQ = smem_addr(smem_raw);   // 32-bit shared-window addresses: ldmatrix and cp.async take these
    const u32 sK = sQ + 2 * BR * LD;      // [2][BC][LD]
    const u32 sV = sK + 2 * TILE_KV;      // [2][BC][LD]
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int diag = Tk - Tq;  // query i sees keys j <= i + diag

    // ---- Q, and the first K/V tile, in flight; the running state of each row in registers ----------------
    // Keys this block needs: all of them, or (causal) up to the last visible key of its last real row.
    // (The variant kernel: the tiles of key_tiles, the first one at kt.first.)
    constexpr bool VARIANT = (MODS & MOD_VARIANT) != 0;
    int kv_end = Tk;
    if (causal) kv_end = min(Tk, min(q0 + BR, Tq) + diag);
    const int n_tiles = kv_end > 0 ? (kv_end + BC - 1) / BC : 0;
    KeyTiles<BC, MODS> kt{};
    if constexpr (VARIANT) kt = key_tiles<BC, MODS>(q0, min(q0 + BR, Tq) - 1, Tk, diag, va);
    const bool any_tile = VARIANT ? kt.first < kt.end : n_tiles > 0;
    const int k_first = VARIANT ? kt.first * BC : 0;

    load_tile_async<BR, D, NTHREADS>(sQ, qh, q0, Tq, d, ld_q);
    if (any_tile) load_tile_async<BC, D, NTHREADS>(sK, kh, k_first, Tk, d, ld_kv);
    if constexpr (FusedBuild<D, ILP>::value) cp_async_commit();  // Q and K of tile 0: what S = Q K^T waits for
    if (any_tile) load_tile_async<BC, D, NTHREADS>(sV, vh, k_first, Tk, d, ld_kv);
    cp_async_commit();

    float acc_o[MT][D / MMA_N][4];
    float row_max[MT][2], row_sum[MT][2];  // [m-tile][row g or g+8], in log2 units; row_sum is this lane's part
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < D / MMA_N; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[mt][nt][e] = 0.f;
        row_max[mt][0] = row_max[mt][1] = NEG_INF;
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
    // Per-lane byte offsets of the ldmatrix row addresses (lane l gives row l % 8 of matrix l / 8):
    //   Q (A operand, 16x16): rows l % 16, column half l / 16
    //   K (B operand, two n-tiles): key rows l % 8 + 8 (l / 16), column half (l / 8) % 2
    //   V (B operand, .trans, two n-tiles): key rows l % 8 + 8 ((l / 8) % 2), column half l / 16
    const u32 q_lane = sQ + 2 * ((warp * WR + lane % 16) * LD + (lane / 16) * CHUNK);
    const u32 k_lane = 2 * ((lane % 8 + (lane / 16) * 8) * LD + ((lane / 8) % 2) * CHUNK);
    const u32 v_lane = 2 * ((lane % 8 + ((lane / 8) % 2) * 8) * LD + (lane / 16) * CHUNK);

    // ---- the K/V loop: one barrier per tile; the next tile streams in while this one is computed ----------
    if constexpr (VARIANT) {
        variant_kv_loop<D, BC, NWARPS, MT, BF16, MODS>(acc_o, row_max, row_sum, kt, sK, sV, kh, vh, Tk, d, ld_kv,
                                                       q_lane, k_lane, v_lane, q0 + warp * WR, diag, scale_log2, va);
    } else if constexpr (ILP) {
        // Tiles [0, n_full) hold no masked key for any row of the block (every key < Tk and, if causal, at or before
        // the diagonal of the block's first row q0): they run without mask code, so the softmax is one straight run
        // of instructions. The rest (the last tile when BC does not divide Tk, the tiles on the causal diagonal) run
        // with it. Tile j is free of masks when (j + 1) BC <= Tk and, if causal, j BC + BC - 1 <= q0 + diag.
        int n_full = min(n_tiles, Tk / BC);
        if (causal) n_full = min(n_full, max(q0 + diag + 1, 0) / BC);
        int j = 0;
        for (; j < n_full; ++j)
            kv_tile<D, BC, NWARPS, MT, BF16, true, false>(acc_o, row_max, row_sum, j, n_tiles, sK, sV, kh, vh, Tk, d,
                                                          ld_kv, q_lane, k_lane, v_lane, q0 + warp * WR, diag, causal,
                                                          scale_log2, false, va);
        for (; j < n_tiles; ++j)
            kv_tile<D, BC, NWARPS, MT, BF16, true, true>(acc_o, row_max, row_sum, j, n_tiles, sK, sV, kh, vh, Tk, d,
                                                         ld_kv, q_lane, k_lane, v_lane, q0 + warp * WR, diag, causal,
                                                         scale_log2, true, va);
    } else {
        for (int j = 0; j < n_tiles; ++j) {
            const int k0 = j * BC;
            const bool edge = k0 + BC > Tk || (causal && k0 + BC - 1 > q0 + diag);  // any masked key in the tile?
            kv_tile<D, BC, NWARPS, MT, BF16, false, false>(acc_o, row_max, row_sum, j, n_tiles, sK, sV, kh, vh, Tk, d,
                                                           ld_kv, q_lane, k_lane, v_lane, q0 + warp * WR, diag, causal,
                                                           scale_log2, edge, va);
        }
    }
    // ---- the end: normalise and store ------------------------------------------------------------------------
    cp_async_wait<0>();  // nothing may be in flight when the block exits (n_tiles == 0 leaves Q's group)
    // O goes out through this warp's own rows of sQ, which no other warp reads. With no K/V tile there was no
    // barrier after Q's copies: another thread's copy into those rows may still be landing, so wait for all of them.
    if (VARIANT ? kt.first >= kt.end : n_tiles == 0) __syncthreads();
    store_output<D, MT, BF16>(oh, lse, lse_base, acc_o, row_max, row_sum, q0 + warp * WR, Tq, d, ld_o,
                              sQ + 2 * warp * WR * LD);
}

// Which loop a build runs. Three loops over the K/V tiles do the same arithmetic in the same order, so o and lse are
// bit for bit the same (notebook 06, section 6); they differ in what the compiler may overlap:
//   row by row  online_softmax: each of a lane's 2 MT rows in turn (max, two shuffles, exponentials, sum), the mask
//               applied where a run-time flag says the tile needs it. The shuffles (~30 cycles each) and the ex2
//               latency of one row are paid before the next row starts; the fewest registers.
//   ILP         the tiles with no masked key (every key < Tk and, if causal, at or before the diagonal of the block's
//               first row) first, through kv_tile<..., MASK = false>, which holds no mask code; the rest with it.
//               online_softmax_ilp runs the maxima, the shuffles and the exponentials of all 2 MT rows side by side
//               with no branch between them, so their latencies overlap. The D = 96, 128 and 256 builds.
//   fused ILP   the ILP loop with each 16-key step's exponentials made right before the MMAs that take them
//               (softmax_exp_pv), and tile 0's V waited for only before its first P V. The D = 32 and 64 builds.
// The ILP loops keep more values live, so a build whose register cap (65536 / (32 NWARPS MIN_BLOCKS) per thread) is
// below ILP_MIN_REGS keeps the row-by-row loop (the D = 64 tile at three blocks per SM, 168 registers, would spill).
// ILP_MODE overrides that for every build of one compilation: 0 row by row, 1 ILP, -1 (default) by the cap. The
// launcher passes ILP_MIN_REGS from its own constant (MmaTile.loop applies the same rule in Python), and ILP_MODE for a
// tile whose ILP field is set (MmaTile), so that notebook 06 can compare and time the loops on the same tile.
#ifndef ILP_MIN_REGS
#define ILP_MIN_REGS 200
#endif
#ifndef ILP_MODE
#define ILP_MODE -1
#endif
template <int NWARPS, int MIN_BLOCKS>
struct IlpBuild {
    static constexpr bool value =
        ILP_MODE >= 0 ? ILP_MODE == 1 : 65536 / (NWARPS * WARP_SIZE * MIN_BLOCKS) >= ILP_MIN_REGS;
};

// ---------------------------------------------------------------------------------------------------------
// The dense kernel: q (B, H, Tq, d), k and v (B, H, Tk, d). D: head-dim build; BC: keys per tile; NWARPS: warps
// per block; MT: 16-row m-tiles per warp; MIN_BLOCKS: blocks per SM the compiler must leave registers for
// (65536 / (32 NWARPS MIN_BLOCKS) each).
// ---------------------------------------------------------------------------------------------------------
template <int D, int BC, int NWARPS, int MT, int MIN_BLOCKS, bool BF16>
__global__ void __launch_bounds__(NWARPS * WARP_SIZE, MIN_BLOCKS)
flash2_mma_forward(const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v,
                   u16* __restrict__ o, float* __restrict__ lse, int Tq, int Tk, int d, float scale_log2,
                   int causal, int head_major) {
    constexpr int BR = MMA_M * MT * NWARPS;  // query rows per block
    // ---- which head and which query rows this block owns ------------------------------------------------
    // One block per (b*h, query tile), in a 1-D grid. Head-major: the blocks that run side by side share a
    // head, so its K and V come from L2 rather than DRAM. Heads fastest (head_major = 0): the longest query
    // tile of every head first (causal masks on small problems: the launcher's grid_order). Query tiles go last to first.
    const int n_qtiles = (Tq + BR - 1) / BR;
    const int n_heads = gridDim.x / n_qtiles;
    const int bh = head_major ? blockIdx.x / n_qtiles : blockIdx.x % n_heads;
    const int q0 = (n_qtiles - 1 - (head_major ? blockIdx.x % n_qtiles : blockIdx.x / n_heads)) * BR;
    const long long q_base = (long long)bh * Tq * d, k_base = (long long)bh * Tk * d;
    constexpr bool ILP = IlpBuild<NWARPS, MIN_BLOCKS>::value;
    attention_block<D, BC, NWARPS, MT, BF16, ILP>(q + q_base, k + k_base, v + k_base, o + q_base, lse,
                                                  (long long)bh * Tq, d, d, d, q0, Tq, Tk, d, scale_log2, causal,
                                                  VariantArgs());
}

// ---------------------------------------------------------------------------------------------------------
// The varlen kernel: packed tokens, FlashAttention's varlen interface.
//   q (total_q, H, d) and k, v (total_k, H, d): token rows ld_q / ld_kv elements apart (H d when contiguous;
//   3 H d when q, k, v are views into one fused QKV projection (total, 3, H, d)); o (total_q, H, d) contiguous;
//   lse (H, total_q). Sequence b owns query rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1, key rows likewise.
//   grid = (ceil(max_seqlen_q / BR), H, B): block (x, h, b) takes query tile x of sequence b, head h, counted from
//   the sequence's last tile (the longest under a causal mask first); a block past the sequence's tiles exits at
//   once, so padding costs one block launch per missing tile and no loads or math.
//   cu_seqlens are GPU values: each is clamped to [0, total] and to not below the one before it, so a malformed
//   array gives wrong rows but no out-of-bounds access (kernels/flash/flash2_mma.py: check_inputs=True rejects it).
// ---------------------------------------------------------------------------------------------------------
template <int D, int BC, int NWARPS, int MT, int MIN_BLOCKS, bool BF16>
__global__ void __launch_bounds__(NWARPS * WARP_SIZE, MIN_BLOCKS)
flash2_mma_varlen(const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v,
                  u16* __restrict__ o, float* __restrict__ lse, const int* __restrict__ cu_seqlens_q,
                  const int* __restrict__ cu_seqlens_k, int total_q, int total_k, int H, int d, int ld_q, int ld_kv,
                  float scale_log2, int causal) {
    constexpr int BR = MMA_M * MT * NWARPS;  // query rows per block
    // ---- this block's sequence, head and query tile; early exit past the sequence's end -------------------
    const int b = blockIdx.z, h = blockIdx.y;
    const int qs = min(max(cu_seqlens_q[b], 0), total_q), qe = min(max(cu_seqlens_q[b + 1], qs), total_q);
    const int ks = min(max(cu_seqlens_k[b], 0), total_k), ke = min(max(cu_seqlens_k[b + 1], ks), total_k);
    const int Tq = qe - qs, Tk = ke - ks;
    const int n_qtiles = (Tq + BR - 1) / BR;
    if ((int)blockIdx.x >= n_qtiles) return;  // no work on padding (and none at all for an empty sequence)
    const int q0 = (n_qtiles - 1 - (int)blockIdx.x) * BR;
    // ---- the same block of work as the dense kernel, on this sequence's rows ----------------------------------
    const long long kv_base = (long long)ks * ld_kv + (long long)h * d;
    constexpr bool ILP = IlpBuild<NWARPS, MIN_BLOCKS>::value;
    attention_block<D, BC, NWARPS, MT, BF16, ILP>(q + (long long)qs * ld_q + (long long)h * d, k + kv_base,
                                                  v + kv_base, o + ((long long)qs * H + h) * d, lse,
                                                  (long long)h * total_q + qs, ld_q, ld_kv, H * d, q0, Tq, Tk, d,
                                                  scale_log2, causal, VariantArgs());
}

// ---------------------------------------------------------------------------------------------------------
// The variant kernel: the dense layout with grouped-query heads, a band mask (sliding window and causal), a prefix,
// document ids and score modifiers. q, o (B, Hq, Tq, d); k, v (B, Hq / group, Tk, d): query head h reads kv head
// h / group. MODS: MOD_DOCS + MOD_SOFTCAP + MOD_ALIBI, the switches of this build (0: GQA and the band only).
// doc_q (B, Tq), doc_k (B, Tk) int32 and classes (B, ceil(Tq / BR), ceil(Tk / BC)) int8 from flash2_mma_doc_classes
// (MOD_DOCS; else null); alibi_slopes (Hq,) float32 (MOD_ALIBI; else null). left, right, prefix: see VariantArgs
// (causal folded into right, an unbounded side given as Tq + Tk). cap_in = scale / softcap, cap_out = softcap log2 e.
// The grid and its order (head_major) as in flash2_mma_forward; every build runs the ILP loops.
// ---------------------------------------------------------------------------------------------------------
template <int D, int BC, int NWARPS, int MT, int MIN_BLOCKS, bool BF16, int MODS>
__global__ void __launch_bounds__(NWARPS * WARP_SIZE, MIN_BLOCKS)
flash2_mma_variants(const u16* __restrict__ q, const u16* __restrict__ k, const u16* __restrict__ v,
                    u16* __restrict__ o, float* __restrict__ lse, const int* __restrict__ doc_q,
                    const int* __restrict__ doc_k, const signed char* __restrict__ classes,
                    const float* __restrict__ alibi_slopes, int Tq, int Tk, int d, float scale_log2, int head_major,
                    int Hq, int group, int left, int right, int prefix, float cap_in, float cap_out) {
    static_assert(MODS >= 0 && MODS < MOD_VARIANT, "MODS is a sum of MOD_DOCS, MOD_SOFTCAP and MOD_ALIBI");
    constexpr int BR = MMA_M * MT * NWARPS;  // query rows per block
    // ---- the block's (batch entry, query head) and query tile, as in flash2_mma_forward; its kv head ----------
    const int n_qtiles = (Tq + BR - 1) / BR;
    const int n_heads = gridDim.x / n_qtiles;
    const int bh = head_major ? blockIdx.x / n_qtiles : blockIdx.x % n_heads;
    const int qt = n_qtiles - 1 - (head_major ? blockIdx.x % n_qtiles : blockIdx.x / n_heads);
    const int b = bh / Hq, h = bh % Hq;
    const long long q_base = (long long)bh * Tq * d;
    const long long k_base = ((long long)b * (Hq / group) + h / group) * Tk * d;
    // ---- the mask and the modifiers ----------------------------------------------------------------------
    VariantArgs va;
    va.left = left;
    va.right = right;
    va.prefix = prefix;
    va.Tq = Tq;
    if constexpr ((MODS & MOD_DOCS) != 0) {
        va.doc_q = doc_q + (long long)b * Tq;
        va.doc_k = doc_k + (long long)b * Tk;
        va.classes = classes + ((long long)b * n_qtiles + qt) * ((Tk + BC - 1) / BC);
    }
    va.cap_in = cap_in;
    va.cap_out = cap_out;
    if constexpr ((MODS & MOD_ALIBI) != 0) va.slope = alibi_slopes[h] * LOG2E;
    attention_block<D, BC, NWARPS, MT, BF16, true, MODS | MOD_VARIANT>(
        q + q_base, k + k_base, v + k_base, o + q_base, lse, (long long)bh * Tq, d, d, d, qt * BR, Tq, Tk, d,
        scale_log2, 0, va);
}

// The tile classes of document masking, one block per (query tile, batch entry): grid (ceil(Tq / br), B), block
// CLASS_THREADS. A tile's ids span [min, max]: a (query tile, key tile) pair is EMPTY when the two spans are disjoint
// (no id in common), FULL when both hold one and the same id, PARTIAL otherwise. Exact for ids that never decrease
// along the sequence (packed documents); for others EMPTY and FULL are still never wrong, only PARTIAL more common.
// classes: (B, ceil(Tq / br), ceil(Tk / bc)) int8.
#ifndef CLASS_THREADS
#define CLASS_THREADS 128
#endif
extern "C" __global__ void __launch_bounds__(CLASS_THREADS)
flash2_mma_doc_classes(const int* __restrict__ doc_q, const int* __restrict__ doc_k, signed char* __restrict__ classes,
                       int Tq, int Tk, int br, int bc) {
    __shared__ int span[2][CLASS_THREADS / WARP_SIZE];
    const int qt = blockIdx.x, b = blockIdx.y, n_kt = (Tk + bc - 1) / bc;
    const int* ids = doc_q + (long long)b * Tq;
    int lo = 0x7fffffff, hi = -0x7fffffff - 1;  // the query tile's span: this thread's rows, its warp's, the block's
    for (int i = qt * br + (int)threadIdx.x; i < min(Tq, (qt + 1) * br); i += CLASS_THREADS) {
        lo = min(lo, ids[i]);
        hi = max(hi, ids[i]);
    }
    for (int m = 16; m > 0; m /= 2) {
        lo = min(lo, __shfl_xor_sync(FULL_MASK, lo, m));
        hi = max(hi, __shfl_xor_sync(FULL_MASK, hi, m));
    }
    if (threadIdx.x % WARP_SIZE == 0) {
        span[0][threadIdx.x / WARP_SIZE] = lo;
        span[1][threadIdx.x / WARP_SIZE] = hi;
    }
    __syncthreads();
    for (int w = 0; w < CLASS_THREADS / WARP_SIZE; ++w) {
        lo = min(lo, span[0][w]);
        hi = max(hi, span[1][w]);
    }
    const int* keys = doc_k + (long long)b * Tk;
    signed char* out = classes + ((long long)b * gridDim.x + qt) * n_kt;
    for (int kt = threadIdx.x; kt < n_kt; kt += CLASS_THREADS) {  // one key tile per thread
        int klo = 0x7fffffff, khi = -0x7fffffff - 1;
        for (int j = kt * bc; j < min(Tk, (kt + 1) * bc); ++j) {
            klo = min(klo, keys[j]);
            khi = max(khi, keys[j]);
        }
        const bool one_id = lo == hi && klo == khi && klo == lo;
        out[kt] = (khi < lo || klo > hi) ? TILE_EMPTY : one_id ? TILE_FULL : TILE_PARTIAL;
    }
}

// ---- the builds the launcher uses by default (kernels/flash/flash2_mma.py: TILES and VARLEN_TILES), instantiated so that
// `nvcc -c flash2_mma.cu` alone yields these kernels; NVRTC instantiates the launcher's builds by name instead.
#ifndef __CUDACC_RTC__
#define FLASH2_MMA_INSTANTIATE(D, BC, NWARPS, MT, MIN_BLOCKS, BF16)                                               \
    template __global__ void flash2_mma_forward<D, BC, NWARPS, MT, MIN_BLOCKS, BF16>(                             \
        const u16*, const u16*, const u16*, u16*, float*, int, int, int, float, int, int);
#define FLASH2_MMA_VARLEN_INSTANTIATE(D, BC, NWARPS, MT, MIN_BLOCKS, BF16)                                        \
    template __global__ void flash2_mma_varlen<D, BC, NWARPS, MT, MIN_BLOCKS, BF16>(                              \
        const u16*, const u16*, const u16*, u16*, float*, const int*, const int*, int, int, int, int, int, int,   \
        float, int);
FLASH2_MMA_INSTANTIATE(32, 64, 4, 2, 1, false)
FLASH2_MMA_INSTANTIATE(64, 64, 4, 2, 2, false)
FLASH2_MMA_INSTANTIATE(96, 64, 4, 2, 1, false)
FLASH2_MMA_INSTANTIATE(128, 64, 4, 2, 1, false)
FLASH2_MMA_INSTANTIATE(32, 64, 4, 2, 1, true)
FLASH2_MMA_INSTANTIATE(64, 64, 4, 2, 2, true)
FLASH2_MMA_INSTANTIATE(96, 64, 4, 2, 1, true)
FLASH2_MMA_INSTANTIATE(128, 64, 4, 2, 1, true)
FLASH2_MMA_INSTANTIATE(256, 32, 4, 1, 1, false)
FLASH2_MMA_INSTANTIATE(256, 32, 4, 1, 1, true)
FLASH2_MMA_VARLEN_INSTANTIATE(32, 64, 4, 2, 1, false)
FLASH2_MMA_VARLEN_INSTANTIATE(64, 64, 4, 2, 2, false)
FLASH2_MMA_VARLEN_INSTANTIATE(96, 64, 4, 2, 1, false)
FLASH2_MMA_VARLEN_INSTANTIATE(128, 64, 4, 2, 1, false)
FLASH2_MMA_VARLEN_INSTANTIATE(32, 64, 4, 2, 1, true)
FLASH2_MMA_VARLEN_INSTANTIATE(64, 64, 4, 2, 2, true)
FLASH2_MMA_VARLEN_INSTANTIATE(96, 64, 4, 2, 1, true)
FLASH2_MMA_VARLEN_INSTANTIATE(128, 64, 4, 2, 1, true)
FLASH2_MMA_VARLEN_INSTANTIATE(256, 32, 4, 1, 1, false)
FLASH2_MMA_VARLEN_INSTANTIATE(256, 32, 4, 1, 1, true)
// one variant build per head size (all three switches on at D = 64; the launcher compiles the others it needs)
#define FLASH2_MMA_VARIANTS_INSTANTIATE(D, BC, NWARPS, MT, MIN_BLOCKS, BF16, MODS)                                \
    template __global__ void flash2_mma_variants<D, BC, NWARPS, MT, MIN_BLOCKS, BF16, MODS>(                      \
        const u16*, const u16*, const u16*, u16*, float*, const int*, const int*, const signed char*, const float*, \
        int, int, int, float, int, int, int, int, int, int, float, float);
FLASH2_MMA_VARIANTS_INSTANTIATE(64, 64, 4, 2, 2, false, 7)
FLASH2_MMA_VARIANTS_INSTANTIATE(128, 64, 4, 2, 1, true, 0)
FLASH2_MMA_VARIANTS_INSTANTIATE(256, 32, 4, 1, 1, false, 7)
#endif
