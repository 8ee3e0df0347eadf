// decode_split.cu -- split-KV ("flash-decoding") attention over a KV cache: every SM busy even at batch 1.
//
// What it computes
//   For each sequence b, KV head hk and each of the R = G * Tq query rows that read hk (G = Hq / Hkv query heads,
//   Tq new rows each): o = softmax(scale * q K^T) V over the sequence's own L_b keys, with bottom-right causal
//   masking (query i sees key j when j <= i + L_b - Tq), and lse = log sum exp (natural log). float16 or
//   bfloat16 in and out, float32 arithmetic. A row that sees no key gives o = 0, lse = -inf.
//   reference/decode.py is the float64 statement of the same contract.
//
// Where it sits in the course
//   decode_ft.cu   FasterTransformer's design: one block per query row walks the whole cache. At batch 1 with 32
//                  heads that is 32 blocks for 132 SMs, and the logits of the row sit in shared memory.
//   this file      the keys of each sequence are cut into num_splits ranges; one block per (range, KV head,
//                  sequence) computes a partial o and lse with an online softmax (nothing sized by L), and
//                  decode_combine merges the partials by log-sum-exp. One block serves all G * Tq query rows of
//                  its KV head, so each byte of K and V is read from memory once, not G times. Two kernels do a
//                  block's work: decode_split_kv on CUDA cores (below: the readable one) and decode_split_mma on
//                  tensor cores (further down: the fast one, the launcher's default), same grid, same partials;
//                  decode_split_mma merges its partials itself, in the last block of each group to finish.
//
// Algorithm of decode_split_kv: one block = NWARPS warps, KT keys per step
//   Lane layout: TPK = D / 8 lanes share one key (each holds one 16-byte chunk, 8 elements, of it); a warp holds
//   GPW = 32 / TPK keys at once; a step covers KT = UNROLL * NWARPS * GPW consecutive keys, key
//   t0 + (u * NWARPS + warp) * GPW + lane / TPK for u < UNROLL, so the GPW keys of one warp load are adjacent
//   (512 contiguous bytes per warp instruction, pages included: a page holds >= 16 keys).
//
//     q rows -> registers: chunk lane % TPK of each of the block's RB rows, times scale * log2(e)
//     m = -inf, l = 0, acc = 0 per row (each lane: its 8 columns)
//     for each step of KT keys in [split start, split end):
//         issue the 2 * UNROLL 16-byte loads of K and V (a paged key first looks up its page)
//         s = q . k: 8 FMAs per lane per row, then a butterfly of log2(TPK) shuffles (every lane of a key gets s)
//         mask keys past the split, past the row's causal limit, on a page outside [0, num_pages)
//         online softmax over the UNROLL keys of the lane: m' = max(m, max s), acc = acc 2^(m - m') + sum 2^(s - m') v
//     merge the GPW key groups of a warp (shuffles), then the NWARPS warps (shared memory), by log-sum-exp
//     num_splits = 1: write o (16-bit) and lse;  else: write the partial o (float32, normalised) and lse
//
//   decode_combine, one warp per query row: lse = log sum_s exp(lse_s); o = sum_s exp(lse_s - lse) o_s.
//
// Why plain vector loads and not cp.async: nothing is staged in shared memory (each key is used by the lanes that
//   load it, straight from registers), so cp.async would only add a trip through shared memory; what it offers,
//   many bytes in flight per thread, comes here from issuing all 2 * UNROLL loads of a step before using any.
//
// Layouts (all C-contiguous; element indices are 64-bit)
//   q (B, Hq, Tq, D), o (B, Hq, Tq, D), lse (B, Hq, Tq); query head hq reads KV head hq / G.
//   contiguous cache: k, v (B, Hkv, Tmax, D); key j of b is row (b * Hkv + hk) * Tmax + j.
//   paged cache: k, v (num_pages, Hkv, P, D), P = 2^page_shift in 16..256; block_table (B, max_pages) int32;
//     key j of b is row (page * Hkv + hk) * P + j % P with page = block_table[b, j / P].
//   partials: o_part (B, Hq, Tq, S, D) float32, lse_part (B, Hq, Tq, S) float32 (S = num_splits).
//   Row r of a block is row rc * RB + r of its KV head: query head hk * G + r / Tq, query row r % Tq.
//
// Launch configuration (kernels/inference/decode_split.py)
//   decode_split_kv: grid = (S * RC, Hkv, B) with RC = ceil(G * Tq / RB) row chunks, blockIdx.x = split * RC + rc
//                    (the RC blocks that read the same keys run side by side, so repeats come from L2);
//                    block = NWARPS * 32 threads; static shared memory NWARPS * RB * (D + 2) floats.
//   decode_split_mma: the same grid with RB = MMA_ROWS = 16 and KT = NWARPS * MMA_KEYS; block = NWARPS * 32;
//                    dynamic shared memory NWARPS * MMA_STAGES * 2 * MMA_KEYS * D * 2 bytes (64 KB at D = 128).
//                    With S > 1 and an `arrivals` array (B * Hkv * RC unsigned ints, zero before the first launch;
//                    the kernel leaves them zero), the last block of each (sequence, KV head, row chunk) to finish
//                    merges the S partials itself (merge_chunk_partials): one launch per call, no decode_combine.
//   decode_combine:  grid = ceil(B * Hq * Tq / COMBINE_WARPS), block = COMBINE_WARPS * 32; after decode_split_kv
//                    when S > 1 (or after decode_split_mma launched with arrivals = NULL).
//   Split s of sequence b covers keys [s * c, min((s + 1) * c, L_b)) with c = ceil(ceil(L_b / S) / KT) * KT, so
//   the ranges follow each sequence's own length; trailing ranges may be empty (they write o = 0, lse = -inf).
//
// Limits (checked by the launcher before launch)
//   D in {64, 128}; RB in {1, 2, 4, 8} rows in registers (16 in decode_split_mma); G * Tq rows per KV head (beyond
//   RB: RC row chunks); compute capability 8.0 or newer (cp.async, ldmatrix, bf16 mma, __reduce_or_sync);
//   q, k, v 16-byte aligned; num_splits <= MMA_MAX_SPLITS = 256 for decode_split_mma's own merge (its shared
//   memory scratch). Indices are never trusted: a length outside [0, capacity] is clamped into it
//   (capacity = Tmax, or max_pages * P); a page index outside [0, num_pages) is never dereferenced: the keys of that
//   page are skipped (masked out). So no input can make this kernel read or write out of bounds.
//
// Numerics
//   16-bit inputs converted to float32; dot products, softmax and accumulation in float32; exp2 on the special
//   function unit (ex2.approx.ftz, relative error ~2^-22) with log2(e) folded into q; partials stay float32;
//   o is rounded to 16 bits once, at the end. decode_split_mma: q . k on tensor cores from the 16-bit inputs with
//   float32 accumulation, the scale applied to the float32 scores; p is rounded to 16 bits for the p V mma (as in
//   FlashAttention-2), while l sums the float32 p.
//
// What comes next
//   In decode_split_kv each key costs 8 FMAs per lane per query row on CUDA cores plus log2(TPK) shuffles: its
//   arithmetic grows with G * Tq while the bytes do not, and at 4 rows it stays near 80% of the read bandwidth;
//   decode_split_mma's does not grow (16 rows cost what 1 costs) and it reaches the read bandwidth on large caches.
//   decode_split_mma merges its own partials (the last block of a group), which saves the combine's launch at
//   batch 1. What is left: with one split the grid is B * Hkv blocks, which leaves SMs idle when that is a little
//   under a multiple of the SM count. An even cut of all key tiles over the SMs, as stream-K does for GEMMs, fills
//   them; but a plain one, where a block whose run crosses a head boundary handles each piece as a pass of its own
//   (q loaded, pipeline filled and drained, partial flushed and merged by arrival counters), was 3-11% slower than
//   this grid on the H100 on every shape timed (B = 16, Hkv = 8, L = 4096: 100.0 us against 93.5 us; B = 64,
//   L = 2048: 189 us against 182): each boundary idles the memory pipe for longer than the idle SMs cost. To win,
//   each warp's copies would have to stay in flight across a boundary, and even then the gain is small: shapes whose
//   block count is a multiple of 132 (B = 33, Hkv = 4, L = 4096: 132 blocks; B = 66, Hkv = 8, L = 2048: 528) kept
//   0.980 and 0.984 of cuDNN's speed, as B = 16 and B = 64 did (0.980, 0.984; kernel time, 3 paired rounds, one
//   run): with one block per SM the busy SMs already draw the whole bandwidth (a plain read of 256 MiB, one slice
//   per block of 512 threads, ran at 2.95-2.97 TB/s on 128 blocks and 2.87-2.88 on 132). Storing the cache in 8
//   bits halves the bytes to read.
//   Where one launch's time goes, from %globaltimer stamps in every block (an instrumented copy of this kernel as it
//   was before the end-of-block change below, H100, d = 128, one launch; medians over blocks):
//     B = 1, Hkv = 32, L = 4096, S = 4 (29.2 us from the first block's start to the last block's end):
//       first tile landed 3.3 us after a block starts, 19.6 us of streaming, 1.3 us from warp 0's last tile to
//       the block's partial stored, then 3.2 us for the last block of a group to count its arrival and merge the
//       4 partials (fence, atomic, two rounds of loads).
//     B = 16, Hkv = 8, L = 4096, S = 1 (90.8 us): 3.7 + 82.6 + 2.3 us, and the last block ends 2 us after the median.
//   The streaming itself runs at the memory's speed (64 MiB in 19.6 us is faster than DRAM alone: part of the cache
//   is still in L2 from the previous launch). So what is left is the fixed cost at both ends:
//     - The start: the first tile lands 3-4 us after a block starts. The wait is not the sequence length: a version
//       that copied each warp's first tile before the length arrived (the range taken from the capacity, checked
//       once the length was known, copied again when wrong) sent its copies out about 1.1 us after a block's start
//       instead of 2.3, yet its tiles landed no sooner (medians 3.8-3.9 us against 3.4-4.1 on the first three shapes
//       of kernels.bench.decode; outputs bit-equal, times within 0.5% on all five), and paged caches were 2-4%
//       slower for the extra page look-up: what a block waits for is the burst of every block's first copies.
//     - The block's end. Its warps stream their own tiles and drift apart: the last finishes 1.1-1.5 us after the
//       first (medians at B = 16 and 64; 2.4-2.7 us at the 90th percentile), and the block's barrier waits for it.
//       Which warp ends last is random (each of the four about as often; equal mean loop times), so no fixed
//       reassignment of tiles to warps helps. Giving each tile to whichever warp is free would even them out, but
//       would make o depend on the timing (each warp's sums in a different order), and the course keeps results
//       bit-reproducible. From the last warp's loop to the stores took 2.0 us while the warps' o went to shared
//       memory with an 8-way bank conflict and every output element worked out its row's weights again; 1.0 us
//       since (acc_column, store_block_result), which made the launch 1-2.6% faster on kernels.bench.decode's shapes.
//     - The merge (S > 1): 2.75 us from a block's stores to the merged o at B = 1 with 4096 keys, an atomic and two
//       rounds of loads, each a trip to L2. Loading the lse and o partials in one round took the step from 31.3 to
//       30.9 us; dropping the fence every thread ran before the arrival saved 0.1-0.25 us more. Merging through
//       distributed shared memory instead, with a group's S blocks as one thread-block cluster (sm_90: partials
//       left in each block's shared memory, one cluster barrier, ld.shared::cluster, no L2 trip, no atomic), was
//       tried and not kept: the merge got about 0.8 us shorter, but where a cluster's blocks may land decides more.
//       Free to share SMs, S = 4 at B = 1, Hkv = 32, L = 4096 went from 30.1 to 29.4 us, yet the same shape paged
//       went from 31.1 to 32.2 and S = 16 at L = 32768 from 51.6 to 54.3 (3 to 5 blocks of a cluster on one SM
//       while other SMs idle); held to one block per SM (more than half the shared memory asked for), the GPU could
//       not place all clusters of 4 or more at once: 43.3 and 76.8 us (H100, 5 paired rounds). Only S = 2 gained
//       everywhere (35.9 -> 34.4 us), a count the heuristic does not pick on these shapes.
//     - The instructions. cuDNN's kernel for these shapes (an sm80 FlashAttention forward with 16 x 128 tiles) runs the
//       same grid, B * Hkv blocks of 128 threads. Profiled alone (Nsight Compute, clocks not locked, medians of 5) it
//       took about the time this one took (93.5 against 93.8 us at B = 16; 182.2 against 181.6 at B = 64), yet ran
//       1.1-1.4% faster at B = 16 in launches timed as the benches time them, cold L2 or warm, while this kernel issued
//       1.8 times its instructions (17.1 M against 9.6 M at B = 16). Half of them were the copies' address arithmetic:
//       every round of copies looked its key up again (key_row: a branch, 64-bit index arithmetic, a page read when
//       paged). One look-up per tile (load_kv_tile) took the count to 14.0 M and made the launch 0.2-1.7% faster on
//       contiguous caches (most at batch 1), 4.5-5.7% paged and 7% with ragged lengths (outputs bit-equal; H100, 7 and
//       9 paired rounds, kernels.bench.decode's shapes).
//   Tried next to that and not kept (H100, 7-9 paired rounds, outputs bit-equal):
//     - Fewer instructions still: copies at fixed offsets for whole tiles (no per-key test) were level (within
//       0.5%). Skipping the mask on whole tiles below every row's causal limit, and the rescale of o when no
//       real row's max moved, was 0.4-1.4% slower at B = 1 and 16 with the split counts held, 2-4% with ragged lengths,
//       and 4.5-6.5% at B = 64 and on the 2 GiB shape: the kernel fell to 168 registers, so three blocks fit on an SM
//       and the 512 blocks of those two shapes no longer ran two to an SM.
//     - Holding the warps together with a block barrier at every step, so that none can drift ahead (measured against
//       the kernel before the one look-up): 0.7-1.4% slower at B = 16 with 2 or 3 stages and 2.9% with 4, 9-12% at
//       B = 64 with 2; each step now waits for the block's slowest copy.
//     - The L2 prefetch-size hints of cp.async (.L2::128B, .L2::256B): no change. Each warp streaming one contiguous
//       quarter of the block's range instead of every fourth tile: 3.3% slower at B = 16.
//     - A warp's copies of K and of V in two cp.async groups, so that the scores are worked out while V lands: level
//       (within 0.7%) with 2 stages, 0.3-2.9% slower with 3. The valid-key mask worked out from ke instead of the
//       warp's __reduce_or_sync: level (within 0.8%). A warp waiting on its copies is not what holds the kernel back.
//     - The products transposed, so that the query rows are the N of the mma (8) instead of its M (16, of which
//       G * Tq = 1 or 4 are real on these shapes): S^T = K Q^T with K as the A operand, P^T moved into the B layout
//       by movmatrix, O^T += V^T P^T with V^T from ldmatrix.trans. Half the mma, half the rescale of o, 128
//       registers instead of 196; outputs within 16-bit rounding of this kernel's, tests/test_decode_gpu.py passing
//       with 8-row chunks. Level: 0.4-1.5% faster at B = 1 (1.0-1.6% on an H200), 0.0% at B = 16, and at B = 64
//       and 2 GiB only when held to two blocks per SM (free to take three, 5-6% slower there, as with the skip
//       above); the freed registers spent on 3 or 4 stages, or 8 warps, moved it by -2.7% to +1.3%, with no setting
//       gaining on every shape (H100, 7 and 9 paired rounds; H200, 9). Rows past 8 would need a second n-tile or
//       twice the reads. The tensor cores were never what the kernel waits for.
//     - sm_90's copy engine (cp.async.bulk, completion counted on one mbarrier per stage) instead of the lanes'
//       cp.async: one bulk copy per warp tile of K and of V (4 KB at d = 128), missing keys zero-filled by the lanes.
//       With plain rows, the 8 row addresses of an ldmatrix fall on the same banks (8-way conflict): 4-8% slower, 19%
//       with ragged lengths. Timed with the reads at the swizzled positions (outputs wrong: the best a swizzling
//       tensor copy could do, which would need a tensor map built on the host) it was still 0.4-1.8% slower on every
//       shape and 5% with ragged lengths; with 3 stages 0.7-2.9%, with 4 1.8-3.0%. One bulk copy per key row instead
//       (256 bytes, rows padded 16 bytes so that ldmatrix is conflict-free): 6-21% slower, 34% ragged. All held to
//       two blocks per SM as this kernel runs (4 stages: one fits), H100, 7-9 paired rounds; the row copies passed
//       tests/test_decode_gpu.py. Two copy instructions per tile, where each lane issues 16 cp.async at d = 128:
//       fewer instructions, and slower all the same.
//     - Deeper pipelines, again: 3 stages lost 0.8-2.8% (6-7% with ragged lengths), mostly to the compiler's
//       schedule (ptxas settles on 168 registers, where 2 stages get 196). With the loop unrolled 3 times (201
//       registers) 3 stages were 0.4-1.1% slower (1.7% ragged); 4 stages unrolled 4 times were within 1% at B = 1 and
//       16 and 1.4-2.4% slower at B = 64 and 2 GiB (one block per SM). The L1 / shared-memory carveout, left to the
//       driver or set to 50%, changed nothing (within 0.2%). At B = 1, fewer and deeper blocks were slower too: 2
//       splits of 8 warps (64 blocks at 4k keys) by 0.5-1.3%, 8 warps with 3 stages by 5-15%, although a plain read of
//       64 MiB by 64 blocks of 1024 threads is as fast as by 128 blocks of 512.
//     - q . k summed in 2 or 4 independent chains of mma (k-steps alternating between accumulators, added at the
//       end) instead of one chain of 8: level (within 0.2%, 9 paired rounds). The chain's latency is hidden already.
//     - The block's end with one barrier instead of three: each warp leaves its (m, l, o) in its own tile buffers as
//       soon as its loop is done (no barrier before the writes), and each thread of the merge works out its row's
//       weights itself (NWARPS exp2 per item, no barrier between weights and sums). Level: within 0.2% on every
//       shape, outputs bit-equal (H100, 9 paired rounds). The end's cost is not its barriers.
//   Where B = 16 stands, from timing-only builds (outputs wrong) on one H100, minutes apart: this kernel 89.7 us,
//   cuDNN 89.2; without the math in the loop (copies and waits only) 88.3; without the block's end (no merge of the
//   warps, no stores) 88.4; the kernel's copies alone (128 blocks of 4 warps, each streaming 8 KB tiles through 2
//   stages) 87.2, and 86.1-86.8 with more warps, stages or blocks; kernels.timing's plain read 87.4. So the math and
//   the end each cost about 1.3 us that the copies do not hide, and cuDNN's kernel hides 0.5 us more than this one.
//   How far apart the two are depends on the machine: in paired rounds (kernels.bench.decode's B = 16 shape, 7 to 9
//   rounds each) seven H100 machine starts gave this kernel 0.994-1.001 of cuDNN's speed, six of them below 1.

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
    return __reduce_or_sync(FULL_MASK, ok_bits);
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
