// decode_split.cu -- split-KV ("flash-decoding") attention over a KV cache: every SM busy even at batch 1.
//
// What it computes
//   For each sequence b, KV head hk and each of the R = G * Tq query rows that read hk (G = Hq / Hkv, Tq new rows per
//   sequence): o = softmax(scale * q K^T) V over the sequence's own L_b keys, bottom-right causal (query i sees key j
//   when j <= i + L_b - Tq), and lse = log sum exp (natural log). float16 or bfloat16 in and out, float32 arithmetic;
//   a row that sees no key gives o = 0, lse = -inf. reference/decode.py states the same contract in float64.
//   decode_ft.cu gives each query row a block that walks the whole cache (32 blocks at batch 1, 32 heads); here the
//   keys of each sequence are cut into S = num_splits ranges, and one block per (range, KV head, sequence) serves all
//   G * Tq rows of its KV head, so each byte of K and V is read once, not G times.
//
// Algorithm (same grid and partials for both split kernels: decode_split_kv on CUDA cores, the readable one;
// decode_split_mma on tensor cores, the fast one and the launcher's default)
//   1. the block's query rows (q times scale_log2) and causal limits; the split's key range
//   2. stream the range: _kv: each lane loads one 16-byte chunk of UNROLL keys of K and V, all before using any;
//      _mma: each warp copies its own 16-key tiles (w, w + NWARPS, ...) through MMA_STAGES buffers with cp.async
//   3. scores s = q . k (FMAs and a shuffle butterfly; _mma: mma.sync, K by ldmatrix), -inf past the range, past the
//      row's causal limit and on a page outside [0, num_pages)
//   4. online softmax in log2 units: m' = max(m, max s), p = 2^(s - m'), l = l 2^(m - m') + sum p
//   5. o = o 2^(m - m') + p V
//   6. merge the block's partial states (key groups, warps) by log-sum-exp; S = 1: write o and lse, else this split's
//      float32 partial (o normalised, lse)
//   7. S > 1: lse = log sum_s exp(lse_s), o = sum_s exp(lse_s - lse) o_s: decode_combine (one warp per row), or, in
//      decode_split_mma given `arrivals`, the last block of each (sequence, KV head, row chunk) to finish
//
// Layouts (C-contiguous; element indices 64-bit)
//   q, o (B, Hq, Tq, D); lse (B, Hq, Tq); query head hq reads KV head hq / G.
//   contiguous cache: k, v (B, Hkv, Tmax, D); key j of b is row (b * Hkv + hk) * Tmax + j.
//   paged cache: k, v (num_pages, Hkv, P, D), P = 2^page_shift in 16..256; block_table (B, max_pages) int32: key j of
//     b is row (page * Hkv + hk) * P + j % P, page = block_table[b, j / P].
//   partials: o_part (B, Hq, Tq, S, D) float32, lse_part (B, Hq, Tq, S) float32.
//   Row r of a block is row rc * RB + r of its KV head: query head hk * G + r / Tq, query row r % Tq.
//
// Launch (kernels/inference/decode_split.py; RC = ceil(G * Tq / RB) row chunks, blockIdx.x = split * RC + rc)
//   decode_split_kv<D, RB, UNROLL, BF16>: grid (S * RC, Hkv, B), block DECODE_WARPS * 32, static shared memory only;
//     KT = UNROLL * DECODE_WARPS * 32 / (D / 8) keys per step. Builds (RB, UNROLL): (1, 8) (2, 8) (4, 4) (8, 2).
//   decode_split_mma<D, BF16>: the same grid with RB = 16, KT = DECODE_WARPS * 16; block DECODE_WARPS * 32; dynamic
//     shared memory DECODE_WARPS * MMA_STAGES * 2 * 16 * D * 2 bytes (64 KB at D = 128: opt in above 48 KB).
//   decode_combine<D, BF16>: grid ceil(B * Hq * Tq / COMBINE_WARPS), block COMBINE_WARPS * 32, no shared memory.
//   Split s covers keys [s c, min((s + 1) c, L_b)), c = ceil(ceil(L_b / S) / KT) * KT; an empty one: o = 0, lse = -inf.
//
// Signatures (all sizes int unless said)
//   decode_split_kv(q, k_cache, v_cache, seqlens, block_table, o, lse, o_part, lse_part,
//                   Hq, Hkv, Tq, cache_rows, page_shift, max_pages, num_pages, num_splits, row_chunks, scale_log2)
//   decode_split_mma(the same, with unsigned int* arrivals after lse_part)
//   decode_combine(o_part, lse_part, o, lse, long long n_rows = B * Hq * Tq, num_splits)
//   seqlens: (B,) int32 lengths. block_table nullptr: contiguous cache, cache_rows = Tmax (the capacity), page_shift =
//   max_pages = num_pages = 0; else cache_rows = P, page_shift = log2 P. lse nullptr: not written. o_part = lse_part =
//   nullptr: S = 1, the split kernel writes o and lse; else the split kernel writes the partials (o, lse unused) and
//   the merge writes o and lse. arrivals: B * Hkv * RC unsigned ints, zero before the first launch and left zero;
//   nullptr: launch decode_combine after. row_chunks = RC; scale_log2 = scale * log2(e) (scale usually 1 / sqrt(D)).
//
// decode_split_mma and the bfloat16 builds need sm_80 (cp.async, mma.sync, __reduce_or_sync, cvt.rn.bf16.f32);
// decode_split_kv and decode_combine in float16 build for sm_75 (a T4). PTX headers: ptx/common.cuh,
// ptx/cp_async.cuh, ptx/mma_sync.cuh (copy kernels/ptx/ with this file).
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/inference/decode_split.cu -o decode_split.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80, name expressions:
//     "decode_split_kv<128, 1, 8, false>" "decode_split_kv<128, 4, 4, true>"
//     "decode_split_mma<128, false>" "decode_split_mma<64, true>" "decode_combine<128, false>"
//   For a T4: --gpu-architecture=sm_75 with the float16 decode_split_kv and decode_combine names only.
// Host-side example: kernels/examples/decode_split_host.cu (contiguous cache, decode_split_mma, both merges).
//
// Limits (checked by the launcher): D in {64, 128}; Tq * G rows per KV head (beyond RB: RC row chunks); q, k, v
// 16-byte aligned; num_splits <= MMA_MAX_SPLITS = 256 for decode_split_mma's own merge. Indices are never trusted: a
// length is clamped into [0, capacity] (Tmax, or max_pages * P); a page index outside [0, num_pages) is never
// dereferenced (its keys are masked out). No input makes these kernels read or write out of bounds.
// Numerics: float32 dot products, softmax and sums; exp2 on the special function unit (ex2.approx.ftz, relative
// error ~2^-22) with log2(e) folded into q; partials float32; o rounded to 16 bits once. decode_split_mma: q . k on
// tensor cores from the 16-bit inputs, float32 accumulation, the scale applied to the float32 scores; p rounded to 16
// bits for P V (as in FlashAttention-2) while l sums the float32 p.
// What was tried and measured: kernels/inference/README.md.

#include "ptx/common.cuh"    // u16, u32, DEVICE, smem_addr, exp2_ftz
#include "ptx/cp_async.cuh"  // cp_async_16, cp_async_commit, cp_async_wait
#include "ptx/mma_sync.cuh"  // ldmatrix_x4, ldmatrix_x4_trans, mma_16816, pack2

#define NEG_INF (-__int_as_float(0x7f800000))
#define FULL_MASK 0xffffffffu
#define LN2 0.6931471805599453f
#define LOG2E 1.4426950408889634f

// Warps per block of the split kernels and of decode_combine: the launcher passes both (-D), so the grid it computes
// and the kernel's own layout come from one number.
#ifndef DECODE_WARPS
#define DECODE_WARPS 4
#endif
#ifndef COMBINE_WARPS
#define COMBINE_WARPS 4
#endif

enum : int {
    WARP_SIZE = 32,
    CHUNK_ELEMS = 8,  // 16-bit elements in one 16-byte load
};

// ---------------------------------------------------------------------------------------------------------
// Conversions: 16-bit values travel as their bit patterns.
// ---------------------------------------------------------------------------------------------------------

template <bool BF16>
DEVICE float to_float(u32 bits16) {  // the low 16 bits of bits16
    if constexpr (BF16) {
        return __uint_as_float(bits16 << 16);  // bfloat16 is the top half of a float32
    } else {
        float f;
        asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(static_cast<u16>(bits16)));
        return f;
    }
}

template <bool BF16>
DEVICE u16 from_float(float x) {  // round to nearest even
    u16 r;
    if constexpr (BF16) {
        asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(r) : "f"(x));
    } else {
        asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(r) : "f"(x));
    }
    return r;
}

// Eight 16-bit values (one 16-byte load) -> eight floats, element e of the chunk in f[e].
template <bool BF16>
DEVICE void unpack8(const uint4& raw, float (&f)[CHUNK_ELEMS]) {
    const u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = to_float<BF16>(w[i] & 0xffffu);
        f[2 * i + 1] = to_float<BF16>(w[i] >> 16);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Where key j of sequence b lives. Returns false (and a safe row 0) for a page index outside [0, num_pages):
// such a key is skipped. j must be < the sequence's clamped length, so j / P < max_pages.
// ---------------------------------------------------------------------------------------------------------
DEVICE bool key_row(long long& row, const int* __restrict__ block_table, int b, int hk, int j, int Hkv,
                    int cache_rows, int page_shift, int max_pages, int num_pages) {
    if (block_table == nullptr) {  // contiguous: (B, Hkv, Tmax, D)
        row = ((long long)b * Hkv + hk) * cache_rows + j;
        return true;
    }
    const int page = __ldg(block_table + (long long)b * max_pages + (j >> page_shift));
    const bool ok = page >= 0 && page < num_pages;
    row = ok ? ((((long long)page * Hkv + hk) << page_shift) | (j & ((1 << page_shift) - 1))) : 0;
    return ok;
}

// The key range [begin, end) of split `split` of a sequence of L keys (see the header), KT keys per step.
template <int KT>
DEVICE void split_range(int L, int num_splits, int split, int& begin, int& end) {
    const int per = (L + num_splits - 1) / num_splits;
    const int chunk = (per + KT - 1) / KT * KT;
    const long long b0 = (long long)split * chunk;
    begin = (int)min(b0, (long long)L);
    end = (int)min(b0 + chunk, (long long)L);
}

// The log-sum-exp weights of the S partials of one row, worked out by one warp (decode_combine and the merge inside
// decode_split_mma): base = max_s lse_s (0 where every lse_s is -inf: no split saw a key, every weight is 0), and the
// return value wsum = sum_s exp(lse_s - base). lse_s: natural log; lane l reads s = l, l + 32, ...
DEVICE float warp_lse_weights(const float* lse_s, int S, int lane, float& base) {
    float mx = NEG_INF;
    for (int s = lane; s < S; s += WARP_SIZE) mx = fmaxf(mx, lse_s[s]);
#pragma unroll
    for (int off = WARP_SIZE / 2; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, off));
    base = mx == NEG_INF ? 0.f : mx;
    float wsum = 0.f;
    for (int s = lane; s < S; s += WARP_SIZE) wsum += exp2_ftz((lse_s[s] - base) * LOG2E);
#pragma unroll
    for (int off = WARP_SIZE / 2; off > 0; off /= 2) wsum += __shfl_xor_sync(FULL_MASK, wsum, off);
    return wsum;
}

// =========================================================================================================
// decode_split_kv: the CUDA-core kernel. D: head dimension; RB: query rows held in registers; UNROLL: keys per lane
// per step (loads in flight: 2 * UNROLL * 16 bytes per lane); BF16: bfloat16 (else float16).
//
// Lanes: TPK = D / 8 lanes share one key, each holding one 16-byte chunk (8 elements) of it; a warp holds
// GPW = 32 / TPK keys at once; a step covers KT = UNROLL * NWARPS * GPW consecutive keys: lane l of warp w takes key
// t0 + (u * NWARPS + w) * GPW + l / TPK for u < UNROLL, so the GPW keys of one warp load are adjacent (512 contiguous
// bytes per warp instruction, pages included: a page holds >= 16 keys).
//
//           lanes 0 .. TPK-1      lanes TPK .. 2 TPK-1   ...   (D = 128: TPK = 16, GPW = 2; D = 64: TPK = 8, GPW = 4)
//   warp w  key t0 + w GPW,       key t0 + w GPW + 1,    ...   chunk c = lane % TPK: columns 8 c .. 8 c + 7
//           chunks 0 .. TPK-1     chunks 0 .. TPK-1
//
// Why plain vector loads and not cp.async: nothing is staged in shared memory (each key is used by the lanes that load
// it, straight from registers), so cp.async would only add a trip through shared memory; what it offers, many bytes
// in flight per thread, comes here from issuing all 2 * UNROLL loads of a step before using any.
// =========================================================================================================

// Step 1: this block's RB query rows in registers: chunk c of each (zeros past R), times scale_log2, and each row's
// causal limit lim (keys j < lim are visible; 0 past R). Returns kmax, the largest limit: no row sees a key past it.
template <int D, int RB, bool BF16>
DEVICE int load_query_rows(float (&qf)[RB][CHUNK_ELEMS], int (&lim)[RB], const u16* __restrict__ q, int b, int hk,
                           int rc, int c, int Hq, int G, int Tq, int R, int L, float scale_log2) {
    int kmax = 0;
#pragma unroll
    for (int r = 0; r < RB; ++r) {
        const int gr = rc * RB + r;
        lim[r] = 0;
#pragma unroll
        for (int e = 0; e < CHUNK_ELEMS; ++e) qf[r][e] = 0.f;
        if (gr < R) {
            const int i = gr % Tq, hq = hk * G + gr / Tq;
            const uint4 raw = __ldg(reinterpret_cast<const uint4*>(q + (((long long)b * Hq + hq) * Tq + i) * D) + c);
            unpack8<BF16>(raw, qf[r]);
#pragma unroll
            for (int e = 0; e < CHUNK_ELEMS; ++e) qf[r][e] *= scale_log2;
            lim[r] = max(L - Tq + 1 + i, 0);
            kmax = max(kmax, lim[r]);
        }
    }
    return kmax;
}

// Step 2: all loads of a step first, 2 * UNROLL independent 16-byte loads per lane: chunk c of K and of V of the lane's
// key key[u] = t0 + (u * NWARPS + warp) * GPW + grp. ok[u]: the key is below ke and on a page of the pool (else zeros).
template <int D, int UNROLL, int NWARPS>
DEVICE void load_step(uint4 (&kr)[UNROLL], uint4 (&vr)[UNROLL], int (&key)[UNROLL], bool (&ok)[UNROLL],
                      const u16* __restrict__ k_cache, const u16* __restrict__ v_cache,
                      const int* __restrict__ block_table, int t0, int ke, int warp, int grp, int c, int b, int hk,
                      int Hkv, int cache_rows, int page_shift, int max_pages, int num_pages) {
    constexpr int GPW = WARP_SIZE / (D / CHUNK_ELEMS);  // keys per warp load
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        key[u] = t0 + (u * NWARPS + warp) * GPW + grp;
        long long row = 0;
        ok[u] = key[u] < ke && key_row(row, block_table, b, hk, key[u], Hkv, cache_rows, page_shift, max_pages,
                                       num_pages);
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
        kr[u] = ok[u] ? __ldg(reinterpret_cast<const uint4*>(k_cache + row * D) + c) : zero;
        vr[u] = ok[u] ? __ldg(reinterpret_cast<const uint4*>(v_cache + row * D) + c) : zero;
    }
}

// Step 3: s[u][r] = q_r . k_u in log2 units: each lane its 8 columns, then a butterfly over the TPK lanes of the key
// (every lane of the key gets the sum); -inf for a missing key and past the row's causal limit.
template <int D, int RB, int UNROLL, bool BF16>
DEVICE void step_scores(float (&s)[UNROLL][RB], const float (&qf)[RB][CHUNK_ELEMS], const uint4 (&kr)[UNROLL],
                        const int (&key)[UNROLL], const bool (&ok)[UNROLL], const int (&lim)[RB]) {
    constexpr int TPK = D / CHUNK_ELEMS;  // lanes per key
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        float kf[CHUNK_ELEMS];
        unpack8<BF16>(kr[u], kf);
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            float dot = 0.f;
#pragma unroll
            for (int e = 0; e < CHUNK_ELEMS; ++e) dot = fmaf(qf[r][e], kf[e], dot);
#pragma unroll
            for (int off = TPK / 2; off > 0; off /= 2) dot += __shfl_xor_sync(FULL_MASK, dot, off);
            s[u][r] = (ok[u] && key[u] < lim[r]) ? dot : NEG_INF;
        }
    }
}

// Step 4: the online softmax over this step's UNROLL keys of the lane's group, row by row: m' = max(m, max_u s),
// l = l 2^(m - m') + sum_u 2^(s - m'), acc *= 2^(m - m'); s becomes p = 2^(s - m') in place.
template <int RB, int UNROLL>
DEVICE void step_softmax(float (&s)[UNROLL][RB], float (&m)[RB], float (&l)[RB], float (&acc)[RB][CHUNK_ELEMS]) {
#pragma unroll
    for (int r = 0; r < RB; ++r) {
        float mx = m[r];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) mx = fmaxf(mx, s[u][r]);
        const float base = mx == NEG_INF ? 0.f : mx;  // nothing visible yet: every p below is 2^-inf = 0
        const float alpha = exp2_ftz(m[r] - base);  // 0 on the first visible key (m = -inf)
        float psum = 0.f;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            s[u][r] = exp2_ftz(s[u][r] - base);
            psum += s[u][r];
        }
        l[r] = l[r] * alpha + psum;
        m[r] = mx;
#pragma unroll
        for (int e = 0; e < CHUNK_ELEMS; ++e) acc[r][e] *= alpha;
    }
}

// Step 5: acc += p v, each V chunk converted once and used by every row.
template <int RB, int UNROLL, bool BF16>
DEVICE void step_pv(float (&acc)[RB][CHUNK_ELEMS], const float (&p)[UNROLL][RB], const uint4 (&vr)[UNROLL]) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        float vf[CHUNK_ELEMS];
        unpack8<BF16>(vr[u], vf);
#pragma unroll
        for (int r = 0; r < RB; ++r)
#pragma unroll
            for (int e = 0; e < CHUNK_ELEMS; ++e) acc[r][e] = fmaf(p[u][r], vf[e], acc[r][e]);
    }
}

// Step 6 (first half): merge the GPW key groups of the warp by log-sum-exp (lanes lane and lane ^ off, off >= TPK, hold
// the same chunk c of different keys), then lanes 0 .. TPK-1, which hold the warp's result, leave it in shared memory.
template <int D, int RB, int NWARPS>
DEVICE void warp_result_to_shared(float (&s_m)[NWARPS][RB], float (&s_l)[NWARPS][RB], float (&s_acc)[NWARPS][RB][D],
                                  float (&m)[RB], float (&l)[RB], float (&acc)[RB][CHUNK_ELEMS], int warp, int grp,
                                  int c) {
    constexpr int TPK = D / CHUNK_ELEMS;  // lanes per key
#pragma unroll
    for (int off = TPK; off < WARP_SIZE; off *= 2) {
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            const float mo = __shfl_xor_sync(FULL_MASK, m[r], off);
            const float lo = __shfl_xor_sync(FULL_MASK, l[r], off);
            const float mx = fmaxf(m[r], mo);
            const float base = mx == NEG_INF ? 0.f : mx;
            const float a = exp2_ftz(m[r] - base), a_o = exp2_ftz(mo - base);
            l[r] = l[r] * a + lo * a_o;
            m[r] = mx;
#pragma unroll
            for (int e = 0; e < CHUNK_ELEMS; ++e) {
                const float xo = __shfl_xor_sync(FULL_MASK, acc[r][e], off);
                acc[r][e] = acc[r][e] * a + xo * a_o;
            }
        }
    }
    if (grp == 0) {  // lanes 0 .. TPK-1 now hold the warp's result, chunk c each
#pragma unroll
        for (int r = 0; r < RB; ++r) {
#pragma unroll
            for (int e = 0; e < CHUNK_ELEMS; ++e) s_acc[warp][r][c * CHUNK_ELEMS + e] = acc[r][e];
            if (c == 0) {
                s_m[warp][r] = m[r];
                s_l[warp][r] = l[r];
            }
        }
    }
}

// Step 6 (second half): merge the warps' results by log-sum-exp and write: thread x handles column x % D of row x / D
// (and so on, NTHREADS apart). o_part null (num_splits == 1): the final o (16-bit) and lse; else this split's float32
// partials.
template <int D, int RB, int NWARPS, bool BF16>
DEVICE void store_rows(const float (&s_m)[NWARPS][RB], const float (&s_l)[NWARPS][RB],
                       const float (&s_acc)[NWARPS][RB][D], int rc, int R, int G, int Tq, int b, int Hq, int hk,
                       int split, int num_splits, u16* __restrict__ o, float* __restrict__ lse,
                       float* __restrict__ o_part, float* __restrict__ lse_part) {
    constexpr int NTHREADS = NWARPS * WARP_SIZE;
    const bool direct = o_part == nullptr;  // num_splits == 1: the final o and lse
    for (int idx = threadIdx.x; idx < RB * D; idx += NTHREADS) {
        const int r = idx / D, e = idx % D;
        const int gr = rc * RB + r;
        if (gr >= R) break;  // rows come in order: this thread's later indices are past R too
        float mx = NEG_INF;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) mx = fmaxf(mx, s_m[w][r]);
        const float base = mx == NEG_INF ? 0.f : mx;
        float lsum = 0.f, val = 0.f;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) {
            const float a = exp2_ftz(s_m[w][r] - base);
            lsum = fmaf(a, s_l[w][r], lsum);
            val = fmaf(a, s_acc[w][r][e], val);
        }
        const float out = lsum > 0.f ? val / lsum : 0.f;
        const float row_lse = lsum > 0.f ? (mx + __log2f(lsum)) * LN2 : NEG_INF;
        const long long qrow = ((long long)b * Hq + hk * G + gr / Tq) * Tq + gr % Tq;  // row of (B, Hq, Tq)
        if (direct) {
            o[qrow * D + e] = from_float<BF16>(out);
            if (lse != nullptr && e == 0) lse[qrow] = row_lse;
        } else {
            const long long prow = qrow * num_splits + split;  // row of (B, Hq, Tq, S)
            o_part[prow * D + e] = out;
            if (e == 0) lse_part[prow] = row_lse;
        }
    }
}

template <int D, int RB, int UNROLL, bool BF16>
__global__ void __launch_bounds__(DECODE_WARPS * WARP_SIZE)
decode_split_kv(const u16* __restrict__ q, const u16* __restrict__ k_cache, const u16* __restrict__ v_cache,
                const int* __restrict__ seqlens, const int* __restrict__ block_table, u16* __restrict__ o,
                float* __restrict__ lse, float* __restrict__ o_part, float* __restrict__ lse_part, int Hq, int Hkv,
                int Tq, int cache_rows, int page_shift, int max_pages, int num_pages, int num_splits,
                int row_chunks, float scale_log2) {
    constexpr int NWARPS = DECODE_WARPS;
    constexpr int NTHREADS = NWARPS * WARP_SIZE;
    constexpr int TPK = D / CHUNK_ELEMS;  // lanes per key
    constexpr int GPW = WARP_SIZE / TPK;  // keys per warp load
    constexpr int KT = UNROLL * NWARPS * GPW;  // keys per block step
    static_assert(D == 64 || D == 128, "D must be 64 or 128 (TPK = D / 8 lanes per key must divide a warp)");
    static_assert(RB >= 1 && RB <= 8, "RB: 1 to 8 query rows in registers");
    static_assert(UNROLL >= 1 && UNROLL <= 16, "UNROLL: 1 to 16 keys per lane per step");
    static_assert(WARP_SIZE % TPK == 0 && NWARPS >= 1 && NTHREADS <= 1024, "bad lane layout");

    __shared__ float s_m[NWARPS][RB], s_l[NWARPS][RB];  // each warp's running max and sum per row
    __shared__ __align__(16) float s_acc[NWARPS][RB][D];  // ... and its unnormalised o

    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int grp = lane / TPK, c = lane % TPK;  // the key of the lane within its warp, the chunk within the key
    const int split = blockIdx.x / row_chunks, rc = blockIdx.x % row_chunks;
    const int hk = blockIdx.y, b = blockIdx.z;
    const int G = Hq / Hkv, R = G * Tq;

    // The sequence's length, clamped into [0, capacity]: no length can make the kernel read past the cache.
    const int capacity = block_table == nullptr ? cache_rows : max_pages << page_shift;
    const int L = min(max(seqlens[b], 0), capacity);

    // ---- 1. the block's query rows (chunk c, pre-scaled) and causal limits; the split's key range ----------------
    float qf[RB][CHUNK_ELEMS];
    int lim[RB];
    const int kmax = load_query_rows<D, RB, BF16>(qf, lim, q, b, hk, rc, c, Hq, G, Tq, R, L, scale_log2);
    int kb, ke;
    split_range<KT>(L, num_splits, split, kb, ke);
    ke = min(ke, kmax);  // no row of this block sees a key at or past kmax

    float m[RB], l[RB], acc[RB][CHUNK_ELEMS];  // log2 units; every lane of a key group holds the same m and l
#pragma unroll
    for (int r = 0; r < RB; ++r) {
        m[r] = NEG_INF;
        l[r] = 0.f;
#pragma unroll
        for (int e = 0; e < CHUNK_ELEMS; ++e) acc[r][e] = 0.f;
    }

    // ---- 2-5. stream the range, KT keys a step ---------------------------------------------------------------
    // The loop bounds are the same for every thread of the block, so every shuffle below runs on a full warp.
    for (int t0 = kb; t0 < ke; t0 += KT) {
        uint4 kr[UNROLL], vr[UNROLL];
        int key[UNROLL];
        bool ok[UNROLL];
        load_step<D, UNROLL, NWARPS>(kr, vr, key, ok, k_cache, v_cache, block_table, t0, ke, warp, grp, c, b, hk, Hkv,
                                     cache_rows, page_shift, max_pages, num_pages);
        float s[UNROLL][RB];
        step_scores<D, RB, UNROLL, BF16>(s, qf, kr, key, ok, lim);
        step_softmax<RB, UNROLL>(s, m, l, acc);
        step_pv<RB, UNROLL, BF16>(acc, s, vr);
    }

    // ---- 6. merge the key groups, then the warps, and write ---------------------------------------------------
    warp_result_to_shared<D, RB, NWARPS>(s_m, s_l, s_acc, m, l, acc, warp, grp, c);
    __syncthreads();
    store_rows<D, RB, NWARPS, BF16>(s_m, s_l, s_acc, rc, R, G, Tq, b, Hq, hk, split, num_splits, o, lse, o_part,
                                    lse_part);
}

// =========================================================================================================
// decode_split_mma: the tensor-core kernel. The same grid, split ranges, masks and partials as decode_split_kv, with
// the arithmetic moved to mma.sync so that the block is limited by loads alone.
//
//   Rows: a block serves MMA_ROWS = 16 query rows of its KV head (the M of m16n8k16; rows past G * Tq are zeros and
//   their results are dropped), so row chunks are ceil(G * Tq / 16).
//   Keys: each warp streams its own tiles of MMA_KEYS = 16 keys (warp w takes tiles w, w + NWARPS, ... of the block's
//   range) through MMA_STAGES shared-memory buffers filled with cp.async: a warp waits only for its own copies, so no
//   block-wide barrier sits in the loop. The 16-byte chunks of a key row are stored XOR-swizzled (chunk c of row r at
//   position c ^ (r % 8)), so that ldmatrix's eight row addresses hit eight different banks.
//   Per tile: S = Q K^T is 2 n-tiles x D/16 k-steps of mma (K read by ldmatrix as the col-major B operand), the mask
//   (past the range, past the row's causal limit, a skipped page), the online softmax on the accumulator fragments (a
//   row's 16 scores sit in the 4 lanes of a quad), P packed to 16 bits as the A operand, and O += P V as D/8 mma (V
//   read by ldmatrix.trans). Per warp that is 3 * D / 8 mma per 16 keys: next to the 4 * D bytes the tile brings, the
//   tensor cores are idle most of the time, which is the point.
//   At the end the warps' (m, l, o) meet in shared memory (the tile buffers, drained first) and store_block_result
//   merges and writes them; with S > 1 and `arrivals`, the last block of each group merges the S partials.
// =========================================================================================================
enum : int {
    MMA_ROWS = 16,          // query rows per block: the M of the mma
    MMA_KEYS = 16,          // keys per warp tile: two n-tiles of the scores, one k-step of P V
    MMA_MAX_SPLITS = 256,   // the most splits the merge inside decode_split_mma has shared memory for
    MERGE_PREFETCH = 16,    // up to this many splits, the merge loads a thread's o partials before its weights
};
#ifndef MMA_STAGES
#define MMA_STAGES 2
#endif

// Byte offset of 16-byte chunk c of key row r in a swizzled tile of rows of D 16-bit values.
template <int D>
DEVICE u32 tile_offset(int r, int c) {
    return static_cast<u32>((r * (D / CHUNK_ELEMS) + (c ^ (r & 7))) * 16);
}

// Step 1: q of rows g and g + 8 of this chunk as mma A fragments (zeros for rows past R), and their causal limits.
// Returns kmax, the largest causal limit over the chunk's 16 rows (rows past R have limit 0).
template <int D>
DEVICE int load_query_fragments(u32 (&qa)[D / 16][4], int (&lim)[2], const u16* __restrict__ q, int b, int hk,
                                int rc, int g, int t, int Hq, int G, int Tq, int R, int L) {
    int kmax = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int gr = rc * MMA_ROWS + g + 8 * h;
        const bool real = gr < R;
        const int i = real ? gr % Tq : 0, hq = real ? hk * G + gr / Tq : 0;
        const u32* qrow = reinterpret_cast<const u32*>(q + (((long long)b * Hq + hq) * Tq + i) * D);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            qa[kk][h] = real ? __ldg(qrow + kk * 8 + t) : 0u;           // columns 16 kk + 2t, + 1
            qa[kk][h + 2] = real ? __ldg(qrow + kk * 8 + 4 + t) : 0u;   // columns 16 kk + 8 + 2t, + 1
        }
        lim[h] = real ? max(L - Tq + 1 + i, 0) : 0;
    }
    for (int r = 0; r < MMA_ROWS; ++r) {
        const int gr = rc * MMA_ROWS + r;
        if (gr < R) kmax = max(kmax, max(L - Tq + 1 + gr % Tq, 0));
    }
    return kmax;
}

// Step 2: one warp copies keys [key0, key0 + MMA_KEYS) of K and V into its tile buffers (cp.async, not waited for)
// and returns the bit mask of the keys that exist: below ke and, paged, on a page inside the pool. Missing keys are
// zero-filled and never read from memory. key0 is a multiple of MMA_KEYS (the split ranges are whole block steps) and
// a page holds at least MMA_KEYS keys, so the tile's keys are consecutive rows of one page (or of the contiguous
// cache): one look-up gives the first row, and each round of copies steps KPR rows further.
template <int D>
DEVICE u32 load_kv_tile(u32 k_tile, u32 v_tile, const u16* __restrict__ k_cache, const u16* __restrict__ v_cache,
                        const int* __restrict__ block_table, int b, int hk, int key0, int ke, int Hkv, int cache_rows,
                        int page_shift, int max_pages, int num_pages, int lane) {
    constexpr int CPK = D / CHUNK_ELEMS;   // chunks per key
    constexpr int KPR = WARP_SIZE / CPK;   // keys per warp-wide round of copies
    static_assert(MMA_KEYS <= 16, "a tile must fit in the smallest page (16 keys)");
    long long row0 = 0;
    const bool page_ok = key_row(row0, block_table, b, hk, key0, Hkv, cache_rows, page_shift, max_pages, num_pages);
    const int c = lane % CPK;
    const u16* k_src = k_cache + row0 * D + c * CHUNK_ELEMS;
    const u16* v_src = v_cache + row0 * D + c * CHUNK_ELEMS;
    u32 ok_bits = 0u;
#pragma unroll
    for (int i = 0; i < MMA_KEYS / KPR; ++i) {
        const int r = i * KPR + lane / CPK;
        const bool ok = page_ok && key0 + r < ke;
        const int step = ok ? r * D : 0;  // a missing key keeps the tile's first address (valid), and reads nothing
        cp_async_16(k_tile + tile_offset<D>(r, c), k_src + step, ok);
        cp_async_16(v_tile + tile_offset<D>(r, c), v_src + step, ok);
        ok_bits |= static_cast<u32>(ok) << r;
    }
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    return __reduce_or_sync(FULL_MASK, ok_bits);
#else  // no REDUX before sm_80; decode_split_mma is built from 8.0 only, but the file's sm_75 build must compile it
    for (int off = WARP_SIZE / 2; off > 0; off /= 2) ok_bits |= __shfl_xor_sync(FULL_MASK, ok_bits, off);
    return ok_bits;
#endif
}

// Step 3: the scores of one tile, s[nt] = q K^T for keys key0 + 8 nt .. + 7, in the mma's C layout: lane 4g + t holds
// rows g (s[nt][0], s[nt][1]) and g + 8 (s[nt][2], s[nt][3]), keys 8 nt + 2t, + 1. k_tile(stage): the shared-window
// address of the stage's K tile (the caller's function, called here: the addresses then compile as they did inline).
template <int D, bool BF16, class TileAt>
DEVICE void tile_scores(float (&s)[2][4], const u32 (&qa)[D / 16][4], const TileAt& k_tile, int stage, int lane) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        u32 kf[4];  // B fragments: n-tile 0 (kf[0], kf[1]) and n-tile 1 (kf[2], kf[3]) of k-step kk
        const int r = (lane >> 4) * 8 + (lane & 7), c = 2 * kk + ((lane >> 3) & 1);
        ldmatrix_x4(kf, k_tile(stage) + tile_offset<D>(r, c));
        mma_16816<BF16>(s[0], qa[kk], kf[0], kf[1]);
        mma_16816<BF16>(s[1], qa[kk], kf[2], kf[3]);
    }
}

// Steps 3-4: mask and online softmax on the accumulator fragments (a row's 16 scores lie in the 4 lanes of a quad):
// s -> p = 2^(s scale_log2 - m'), m -> m', l = l alpha + this lane's sum of p, alpha = 2^(m - m') per row (for the
// rescale of o), and P packed to 16 bits as the A operand of P V: row g keys 2t, 2t + 1 (pa[0]), row g + 8 (pa[1]);
// keys 8 + 2t, + 1 (pa[2], pa[3]). The C layout of the two score n-tiles is, element for element, that A layout.
template <bool BF16>
DEVICE void tile_softmax(float (&s)[2][4], float (&m)[2], float (&l)[2], float (&alpha)[2], u32 (&pa)[4], u32 valid,
                         int key0, const int (&lim)[2], int t, float scale_log2) {
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int kr = nt * 8 + 2 * t + (e & 1), h = e >> 1;
            const bool see = ((valid >> kr) & 1u) && key0 + kr < lim[h];
            s[nt][e] = see ? s[nt][e] * scale_log2 : NEG_INF;
            mx[h] = fmaxf(mx[h], s[nt][e]);
        }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_MASK, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(FULL_MASK, mx[h], 2));
        const float base = mx[h] == NEG_INF ? 0.f : mx[h];
        alpha[h] = exp2_ftz(m[h] - base);
        m[h] = mx[h];
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int h = e >> 1;
            const float base = m[h] == NEG_INF ? 0.f : m[h];
            s[nt][e] = exp2_ftz(s[nt][e] - base);
        }
        l[0] = l[0] * (nt == 0 ? alpha[0] : 1.f) + s[nt][0] + s[nt][1];
        l[1] = l[1] * (nt == 0 ? alpha[1] : 1.f) + s[nt][2] + s[nt][3];
        pa[2 * nt] = pack2<BF16>(s[nt][0], s[nt][1]);
        pa[2 * nt + 1] = pack2<BF16>(s[nt][2], s[nt][3]);
    }
}

// Step 5: o = o 2^(m - m') + P V: the rescale, then V's B fragments by ldmatrix.trans, two n-tiles of o per load.
// v_tile(stage): the shared-window address of the stage's V tile.
template <int D, bool BF16, class TileAt>
DEVICE void tile_pv(float (&acc)[D / 8][4], const float (&alpha)[2], const u32 (&pa)[4], const TileAt& v_tile,
                    int stage, int lane) {
#pragma unroll
    for (int n2 = 0; n2 < D / 8; ++n2) {
        acc[n2][0] *= alpha[0], acc[n2][1] *= alpha[0];
        acc[n2][2] *= alpha[1], acc[n2][3] *= alpha[1];
    }
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
        u32 vf[4];
        const int r = ((lane >> 3) & 1) * 8 + (lane & 7), c = 2 * dn + (lane >> 4);
        ldmatrix_x4_trans(vf, v_tile(stage) + tile_offset<D>(r, c));
        mma_16816<BF16>(acc[2 * dn], pa, vf[0], vf[1]);
        mma_16816<BF16>(acc[2 * dn + 1], pa, vf[2], vf[3]);
    }
}

// Where column e of row r of a warp's o sits in s_acc: e with bits 3 and 4 flipped by r % 4. The mma leaves columns
// 8 n + 2t, + 1 of rows g and g + 8 in lane 4g + t; stored as float2 at the plain column, the eight rows g of one store
// fall on one bank (a row is D floats, a multiple of 32 banks): an 8-way conflict. Flipped, rows g = 0..3 take four
// different 8-column groups, so a warp's 32 float2 fill the 32 banks twice: 2 wavefronts, the least 256 bytes can
// take. The swap stays inside aligned groups of 4 and of 32 columns, so float4 reads along a row stay whole and
// conflict-free.
DEVICE int acc_column(int r, int e) { return e ^ ((r & 3) << 3); }

// Step 6 (first half): the warp's (m, l, o) to shared memory, once every warp has left its tiles (the barrier inside):
// o of rows g, g + 8 into s_acc[warp] at acc_column, m and l (the quad's sum) into s_m, s_l. Rows past R are left out.
template <int D, int NWARPS>
DEVICE void warp_state_to_shared(float* s_acc, float (&s_m)[NWARPS][MMA_ROWS], float (&s_l)[NWARPS][MMA_ROWS],
                                 const float (&acc)[D / 8][4], const float (&m)[2], float (&l)[2], int warp, int g,
                                 int t, int rc, int R) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor_sync(FULL_MASK, l[h], 1);
        l[h] += __shfl_xor_sync(FULL_MASK, l[h], 2);
    }
    __syncthreads();  // every warp has left its tiles
    const int nr = min(MMA_ROWS, R - rc * MMA_ROWS);  // rows of this chunk that exist (the rest are dropped)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = g + 8 * h;
        if (row >= nr) continue;
        float* dst = s_acc + (warp * MMA_ROWS + row) * D;
#pragma unroll
        for (int n2 = 0; n2 < D / 8; ++n2)
            *reinterpret_cast<float2*>(dst + acc_column(row, n2 * 8 + 2 * t)) =
                make_float2(acc[n2][2 * h], acc[n2][2 * h + 1]);
    }
    if (t == 0) {
        s_m[warp][g] = m[0], s_m[warp][g + 8] = m[1];
        s_l[warp][g] = l[0], s_l[warp][g + 8] = l[1];
    }
}

// Step 6 (second half): merge the NWARPS warps' states of the block's RB rows by log-sum-exp and write
// (decode_split_kv's store_rows, laid out for wide stores). s_m, s_l: [NWARPS][RB] running max (log2 units) and sum;
// s_acc: [NWARPS][RB][D] unnormalised o, column e of row r at acc_column(r, e). The caller has synchronised the block
// after writing them, rows past R left out. Two steps: (1) thread r works out row r's weights (one per warp), sum and
// lse once and leaves them in s_m and s_l; (2) thread x merges 4 columns of a row (float4 reads, one 8- or 16-byte
// store), NTHREADS items apart. num_splits == 1 (o_part null): the final o (16-bit) and lse; else this split's float32
// partial o and lse.
template <int D, int RB, int NWARPS, bool BF16>
DEVICE void store_block_result(float* s_m, float* s_l, const float* s_acc, int rc, int R, int G, int Tq, int b,
                               int Hq, int hk, int split, int num_splits, u16* __restrict__ o,
                               float* __restrict__ lse, float* __restrict__ o_part, float* __restrict__ lse_part) {
    static_assert(RB <= NWARPS * WARP_SIZE && NWARPS >= 2, "one thread per row; s_l rows 0 and 1 hold sum and lse");
    const bool direct = o_part == nullptr;
    const int nr = min(RB, R - rc * RB);  // rows of this chunk
    if (threadIdx.x < nr) {  // (1) row r: the warps' weights a_w = 2^(m_w - max) over s_m, then sum and lse over s_l
        const int r = threadIdx.x;
        float mx = NEG_INF;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) mx = fmaxf(mx, s_m[w * RB + r]);
        const float base = mx == NEG_INF ? 0.f : mx;
        float lsum = 0.f;
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) {
            const float a = exp2_ftz(s_m[w * RB + r] - base);
            lsum = fmaf(a, s_l[w * RB + r], lsum);
            s_m[w * RB + r] = a;
        }
        s_l[r] = lsum;
        s_l[RB + r] = lsum > 0.f ? (mx + __log2f(lsum)) * LN2 : NEG_INF;
    }
    __syncthreads();
    constexpr int C4 = D / 4;
    for (int idx = threadIdx.x; idx < nr * C4; idx += NWARPS * WARP_SIZE) {  // (2) 4 columns of row r
        const int r = idx / C4, e = 4 * (idx % C4);
        float v[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) {
            const float a = s_m[w * RB + r];
            const float4 x = *reinterpret_cast<const float4*>(s_acc + (w * RB + r) * D + acc_column(r, e));
            v[0] = fmaf(a, x.x, v[0]), v[1] = fmaf(a, x.y, v[1]), v[2] = fmaf(a, x.z, v[2]), v[3] = fmaf(a, x.w, v[3]);
        }
        const float lsum = s_l[r];
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = lsum > 0.f ? v[i] / lsum : 0.f;
        const int gr = rc * RB + r;
        const long long qrow = ((long long)b * Hq + hk * G + gr / Tq) * Tq + gr % Tq;  // row of (B, Hq, Tq)
        if (direct) {
            uint2 packed;  // four 16-bit values, one 8-byte store
            packed.x = static_cast<u32>(from_float<BF16>(v[0])) | static_cast<u32>(from_float<BF16>(v[1])) << 16;
            packed.y = static_cast<u32>(from_float<BF16>(v[2])) | static_cast<u32>(from_float<BF16>(v[3])) << 16;
            *reinterpret_cast<uint2*>(o + qrow * D + e) = packed;
            if (lse != nullptr && e == 0) lse[qrow] = s_l[RB + r];
        } else {
            const long long prow = qrow * num_splits + split;  // row of (B, Hq, Tq, S)
            *reinterpret_cast<float4*>(o_part + prow * D + e) = make_float4(v[0], v[1], v[2], v[3]);
            if (e == 0) lse_part[prow] = s_l[RB + r];
        }
    }
}

// Step 7 (first half): count this block's arrival on its group's counter; true (in every thread) in the last of the
// num_splits blocks to arrive, which sets the counter back to zero for the next launch. No fence per thread: the
// barrier orders every thread's partial stores before thread 0's atomic, and the atomic's release half (gpu scope) is
// cumulative, so it publishes the whole block's stores, not only thread 0's (the same arrive as CUTLASS's
// GenericBarrier: a block barrier, then one releasing add). Its acquire half orders the last block's reads of the
// others' partials after it.
DEVICE bool last_to_arrive(unsigned int* __restrict__ arrivals, int b, int hk, int Hkv, int row_chunks, int rc,
                           int num_splits, int& s_last) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int* count = arrivals + ((long long)b * Hkv + hk) * row_chunks + rc;
        unsigned int before;  // release: this block's partials (above); acquire: the others' (read below, after the
                              // barrier, by every thread of the last block)
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(before) : "l"(count) : "memory");
        s_last = before == static_cast<unsigned int>(num_splits) - 1u;
        if (s_last) *count = 0u;  // every block of the group has arrived: zero again for the next launch
    }
    __syncthreads();
    return s_last;
}

// Step 7 (second half, num_splits > 1, the last block of a group): merge the S partials of the chunk's rows, so that no
// second kernel is launched. The same merge as decode_combine (lse = log sum_s exp(lse_s), o = sum_s exp(lse_s - lse)
// o_s), laid out for one block and a few rows: (1) the rows' S lse values into shared memory, (2) one warp per row
// turns them into weights, (3) each thread sums S float4 of o_part for its (row, 4 columns), the S loads independent of
// each other. The merge sits at the very end of the launch, so its loads are latency, not bandwidth: where every (row,
// 4 columns) item has a thread of its own and S <= MERGE_PREFETCH (up to 4 rows per KV head at d = 128, 8 at d = 64),
// each thread issues its S o_part loads before (1), and both kinds of partial arrive in one round trip instead of two.
// The partials were written by other blocks: they are read through L2 (ld.global.cg), never from this SM's L1. s_w:
// scratch of MMA_ROWS * num_splits + MMA_ROWS floats (the drained tile buffers).
template <int D, int NTHREADS, bool BF16>
DEVICE void merge_chunk_partials(float* s_w, const float* __restrict__ o_part, const float* __restrict__ lse_part,
                                 u16* __restrict__ o, float* __restrict__ lse, int rc, int R, int G, int Tq, int b,
                                 int Hq, int hk, int S) {
    const int nr = min(MMA_ROWS, R - rc * MMA_ROWS);  // rows of this chunk
    float* s_lse = s_w + MMA_ROWS * S;                 // [MMA_ROWS] merged lse
    auto qrow = [&](int r) {                            // row of (B, Hq, Tq) of the chunk's row r
        const int gr = rc * MMA_ROWS + r;
        return ((long long)b * Hq + hk * G + gr / Tq) * Tq + gr % Tq;
    };
    constexpr int C4 = D / 4;  // float4 columns per row
    const bool early = nr * C4 <= NTHREADS && S <= MERGE_PREFETCH;
    float4 x[MERGE_PREFETCH];  // early: this thread's S partials of (row, 4 columns) = item threadIdx.x
    if (early && threadIdx.x < nr * C4) {
        const float4* op = reinterpret_cast<const float4*>(o_part + qrow(threadIdx.x / C4) * S * D) + threadIdx.x % C4;
#pragma unroll
        for (int s = 0; s < MERGE_PREFETCH; ++s) x[s] = s < S ? __ldcg(op + (long long)s * C4) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int idx = threadIdx.x; idx < nr * S; idx += NTHREADS)
        s_w[idx] = __ldcg(lse_part + qrow(idx / S) * S + idx % S);
    __syncthreads();
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    for (int r = warp; r < nr; r += NTHREADS / WARP_SIZE) {
        float* w = s_w + r * S;
        float base;
        const float wsum = warp_lse_weights(w, S, lane, base);
        const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
        __syncwarp();  // every lane has read w before any lane overwrites it
        for (int s = lane; s < S; s += WARP_SIZE) w[s] = exp2_ftz((w[s] - base) * LOG2E) * inv;
        if (lane == 0) s_lse[r] = wsum > 0.f ? base + __logf(wsum) : NEG_INF;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < nr * C4; idx += NTHREADS) {
        const int r = idx / C4, c = idx % C4;
        const long long row = qrow(r);
        const float* w = s_w + r * S;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        if (early) {  // the loads were issued before (1)
#pragma unroll
            for (int s = 0; s < MERGE_PREFETCH; ++s) {
                const float ws = s < S ? w[s] : 0.f;
                acc.x = fmaf(ws, x[s].x, acc.x), acc.y = fmaf(ws, x[s].y, acc.y);
                acc.z = fmaf(ws, x[s].z, acc.z), acc.w = fmaf(ws, x[s].w, acc.w);
            }
        } else {
            const float4* op = reinterpret_cast<const float4*>(o_part + row * S * D) + c;
#pragma unroll 8
            for (int s = 0; s < S; ++s) {
                const float4 xs = __ldcg(op + (long long)s * C4);
                acc.x = fmaf(w[s], xs.x, acc.x), acc.y = fmaf(w[s], xs.y, acc.y);
                acc.z = fmaf(w[s], xs.z, acc.z), acc.w = fmaf(w[s], xs.w, acc.w);
            }
        }
        uint2 packed;  // four 16-bit values, one 8-byte store
        packed.x = static_cast<u32>(from_float<BF16>(acc.x)) | static_cast<u32>(from_float<BF16>(acc.y)) << 16;
        packed.y = static_cast<u32>(from_float<BF16>(acc.z)) | static_cast<u32>(from_float<BF16>(acc.w)) << 16;
        *reinterpret_cast<uint2*>(o + row * D + 4 * c) = packed;
        if (lse != nullptr && c == 0) lse[row] = s_lse[r];
    }
}

template <int D, bool BF16>
__global__ void __launch_bounds__(DECODE_WARPS * WARP_SIZE)
decode_split_mma(const u16* __restrict__ q, const u16* __restrict__ k_cache, const u16* __restrict__ v_cache,
                 const int* __restrict__ seqlens, const int* __restrict__ block_table, u16* __restrict__ o,
                 float* __restrict__ lse, float* __restrict__ o_part, float* __restrict__ lse_part,
                 unsigned int* __restrict__ arrivals, int Hq, int Hkv, int Tq, int cache_rows, int page_shift,
                 int max_pages, int num_pages, int num_splits, int row_chunks, float scale_log2) {
    constexpr int NWARPS = DECODE_WARPS;
    constexpr int KT = NWARPS * MMA_KEYS;  // keys per block step: the split ranges are whole steps
    constexpr int TILE_BYTES = MMA_KEYS * D * 2;  // one tile of K (or of V)
    constexpr int KSTEPS = D / 16;  // k-steps of q . k
    constexpr int NT_O = D / 8;  // n-tiles of o
    static_assert(D == 64 || D == 128, "D must be 64 or 128");
    static_assert(MMA_STAGES >= 2, "at least double buffering");
    static_assert(NWARPS * MMA_STAGES * 2 * TILE_BYTES >= NWARPS * MMA_ROWS * D * 4,
                  "the final exchange reuses the tiles");
    static_assert(NWARPS * MMA_STAGES * 2 * TILE_BYTES >= MMA_ROWS * (MMA_MAX_SPLITS + 1) * 4,
                  "the merge of the partials reuses the tiles");

    // [NWARPS][MMA_STAGES][K, V] tiles of 16-bit values; after the loop, [NWARPS][MMA_ROWS][D] floats
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ u32 s_valid[NWARPS][MMA_STAGES];  // which keys of each staged tile exist
    __shared__ float s_m[NWARPS][MMA_ROWS], s_l[NWARPS][MMA_ROWS];
    __shared__ int s_last;

    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int g = lane / 4, t = lane % 4;  // the mma's row group and thread-in-group
    const int split = blockIdx.x / row_chunks, rc = blockIdx.x % row_chunks;
    const int hk = blockIdx.y, b = blockIdx.z;
    const int G = Hq / Hkv, R = G * Tq;
    const int capacity = block_table == nullptr ? cache_rows : max_pages << page_shift;
    const int L = min(max(seqlens[b], 0), capacity);

    // ---- 1. q as A fragments, the causal limits; the split's key range and this warp's tiles -------------------
    u32 qa[KSTEPS][4];
    int lim[2];
    const int kmax = load_query_fragments<D>(qa, lim, q, b, hk, rc, g, t, Hq, G, Tq, R, L);
    int kb, ke;
    split_range<KT>(L, num_splits, split, kb, ke);
    ke = min(ke, kmax);
    const int n_tiles = ke > kb ? (ke - kb + MMA_KEYS - 1) / MMA_KEYS : 0;
    const int my_tiles = n_tiles > warp ? (n_tiles - warp + NWARPS - 1) / NWARPS : 0;  // tiles warp, warp + NWARPS, ..

    const u32 tiles = smem_addr(smem) + warp * (MMA_STAGES * 2 * TILE_BYTES);
    auto k_tile = [&](int stage) { return tiles + stage * 2 * TILE_BYTES; };
    auto v_tile = [&](int stage) { return tiles + stage * 2 * TILE_BYTES + TILE_BYTES; };
    auto issue = [&](int n) {  // start copying this warp's n-th tile into stage n % MMA_STAGES; always one group
        if (n < my_tiles) {
            const u32 valid = load_kv_tile<D>(k_tile(n % MMA_STAGES), v_tile(n % MMA_STAGES), k_cache, v_cache,
                                              block_table, b, hk, kb + (warp + n * NWARPS) * MMA_KEYS, ke, Hkv,
                                              cache_rows, page_shift, max_pages, num_pages, lane);
            if (lane == 0) s_valid[warp][n % MMA_STAGES] = valid;
        }
        cp_async_commit();
    };

    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};  // rows g, g + 8; l is this lane's part of the sum
    float acc[NT_O][4];
#pragma unroll
    for (int n = 0; n < NT_O; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

    // ---- 2-5. the warp's pipeline: copy tile n + MMA_STAGES - 1 while tile n is used ---------------------------
#pragma unroll
    for (int n = 0; n < MMA_STAGES - 1; ++n) issue(n);

    for (int n = 0; n < my_tiles; ++n) {
        issue(n + MMA_STAGES - 1);  // the stage it fills was read in iteration n - 1 (the __syncwarp below)
        cp_async_wait<MMA_STAGES - 1>();  // this lane's copies of tile n have landed ...
        __syncwarp();  // ... and every lane's
        const int stage = n % MMA_STAGES;
        const int key0 = kb + (warp + n * NWARPS) * MMA_KEYS;
        const u32 valid = s_valid[warp][stage];
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        tile_scores<D, BF16>(s, qa, k_tile, stage, lane);
        float alpha[2];
        u32 pa[4];
        tile_softmax<BF16>(s, m, l, alpha, pa, valid, key0, lim, t, scale_log2);
        tile_pv<D, BF16>(acc, alpha, pa, v_tile, stage, lane);
        __syncwarp();  // every lane is done with this stage before iteration n + 1 refills it
    }
    cp_async_wait<0>();  // the trailing (empty) groups too: the tiles are reused below

    // ---- 6. the warps' (m, l, o) to shared memory, then merge the warps and write ----------------------------------
    float* s_acc = reinterpret_cast<float*>(smem);  // [NWARPS][MMA_ROWS][D], columns as acc_column places them
    warp_state_to_shared<D, NWARPS>(s_acc, s_m, s_l, acc, m, l, warp, g, t, rc, R);
    __syncthreads();
    store_block_result<D, MMA_ROWS, NWARPS, BF16>(&s_m[0][0], &s_l[0][0], s_acc, rc, R, G, Tq, b, Hq, hk, split,
                                                  num_splits, o, lse, o_part, lse_part);
    if (o_part == nullptr || arrivals == nullptr) return;  // one split, or the caller runs decode_combine

    // ---- 7. the last of the S blocks of this (sequence, KV head, row chunk) to finish merges their partials ------
    if (last_to_arrive(arrivals, b, hk, Hkv, row_chunks, rc, num_splits, s_last))
        merge_chunk_partials<D, NWARPS * WARP_SIZE, BF16>(reinterpret_cast<float*>(smem), o_part, lse_part, o, lse,
                                                          rc, R, G, Tq, b, Hq, hk, num_splits);
}

// ---------------------------------------------------------------------------------------------------------
// decode_combine: one warp per query row merges its S partials by log-sum-exp. Each lane owns D / 32 columns.
// ---------------------------------------------------------------------------------------------------------
template <int D, bool BF16>
__global__ void __launch_bounds__(COMBINE_WARPS * WARP_SIZE)
decode_combine(const float* __restrict__ o_part, const float* __restrict__ lse_part, u16* __restrict__ o,
               float* __restrict__ lse, long long n_rows, int num_splits) {
    constexpr int EPL = D / WARP_SIZE;  // columns per lane: 2 or 4
    static_assert(D == 64 || D == 128, "D must be 64 or 128");
    const int lane = threadIdx.x % WARP_SIZE;
    const long long row = (long long)blockIdx.x * COMBINE_WARPS + threadIdx.x / WARP_SIZE;
    if (row >= n_rows) return;  // the whole warp leaves together
    const float* lp = lse_part + row * num_splits;

    float base;
    const float wsum = warp_lse_weights(lp, num_splits, lane, base);

    float acc[EPL];
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[e] = 0.f;
    const float* op = o_part + row * num_splits * D + lane * EPL;
    for (int s = 0; s < num_splits; ++s) {
        const float w = exp2_ftz((lp[s] - base) * LOG2E);  // exp(lse_s - max): 0 for an empty split
        float x[EPL];
        if constexpr (EPL == 4) {
            const float4 v4 = *reinterpret_cast<const float4*>(op + (long long)s * D);
            x[0] = v4.x, x[1] = v4.y, x[2] = v4.z, x[3] = v4.w;
        } else {
            const float2 v2 = *reinterpret_cast<const float2*>(op + (long long)s * D);
            x[0] = v2.x, x[1] = v2.y;
        }
#pragma unroll
        for (int e = 0; e < EPL; ++e) acc[e] = fmaf(w, x[e], acc[e]);
    }
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) o[row * D + lane * EPL + e] = from_float<BF16>(acc[e] * inv);
    if (lse != nullptr && lane == 0) lse[row] = wsum > 0.f ? base + __logf(wsum) : NEG_INF;
}

// ---- the builds the launcher uses (kernels/inference/decode_split.py: ROW_BUILDS), instantiated so that `nvcc -c
// decode_split.cu` alone yields real kernels; NVRTC instantiates them by name instead.
#ifndef __CUDACC_RTC__
#define DECODE_SPLIT_INSTANTIATE(D, RB, UNROLL, BF16)                                                             \
    template __global__ void decode_split_kv<D, RB, UNROLL, BF16>(                                                \
        const u16*, const u16*, const u16*, const int*, const int*, u16*, float*, float*, float*, int, int, int,  \
        int, int, int, int, int, int, float);
#define DECODE_MMA_INSTANTIATE(D, BF16)                                                                           \
    template __global__ void decode_split_mma<D, BF16>(                                                           \
        const u16*, const u16*, const u16*, const int*, const int*, u16*, float*, float*, float*, unsigned int*,  \
        int, int, int, int, int, int, int, int, int, float);
#define DECODE_COMBINE_INSTANTIATE(D, BF16)                                                                       \
    template __global__ void decode_combine<D, BF16>(const float*, const float*, u16*, float*, long long, int);
#define DECODE_SPLIT_ALL_ROWS(D, BF16)                                                                            \
    DECODE_SPLIT_INSTANTIATE(D, 1, 8, BF16)                                                                       \
    DECODE_SPLIT_INSTANTIATE(D, 2, 8, BF16)                                                                       \
    DECODE_SPLIT_INSTANTIATE(D, 4, 4, BF16)                                                                       \
    DECODE_SPLIT_INSTANTIATE(D, 8, 2, BF16)                                                                       \
    DECODE_MMA_INSTANTIATE(D, BF16)                                                                               \
    DECODE_COMBINE_INSTANTIATE(D, BF16)
DECODE_SPLIT_ALL_ROWS(64, false)
DECODE_SPLIT_ALL_ROWS(64, true)
DECODE_SPLIT_ALL_ROWS(128, false)
DECODE_SPLIT_ALL_ROWS(128, true)
#endif
