// hopper_attn_bwd.cu -- FlashAttention-3-style attention backward on Hopper: TMA loads, the five products on wgmma
// (fp16/bf16 in, float32 accumulation), dQ summed across key tiles by TMA bulk reduce-adds.
//
// What it computes: dQ, dK, dV of o = softmax(scale q k^T + mask) v (hopper_attn.cu's contract) given o, its lse
//   and dO; S = scale Q K^T, P = softmax(S) (rebuilt from lse), dV = P^T dO, dP = dO V^T, dS = P (dP - delta),
//   delta_i = sum_c dO_ic O_ic, dQ = scale dS K, dK = scale dS^T Q (reference/backward.py). The mask is a band,
//   bottom-right aligned: query i sees key j when c - left <= j <= c + right, c = i + Tk - Tq (causal: right = 0;
//   a sliding window: left too; PREFIX: or j < prefix; reference/variants.py); a row that sees no key has P = 0.
//   ALIBI adds - slope |j - c| to each scaled score (no gradient to the slopes). DOCS: query i sees key j only in the
//   same document (doc_q[i] == doc_k[j]); a key tile skips the query tiles its class says are EMPTY. SOFTCAP: the
//   scores are softcap tanh(S / softcap) before ALiBi, so dS is also multiplied by the cap's derivative 1 - tanh^2.
//
// Algorithm: three kernels on one stream, four with grouped-query heads (kernels/hopper/hopper_attn_bwd.py)
//   1. hopper_bwd_preprocess  one warp per row of (B H, Tq_pad): delta = rowsum(dO o) (- dlse), lse2 = lse log2 e
//      (+inf for lse = -inf or a padding row i >= Tq: there P = 2^-inf = 0), a row's worth of dQ_acc zeroed, turns too.
//   2. hopper_bwd_{f16,bf16}_d{64,128}  one CTA per (key tile n of BLOCK_N = 128 keys from k0 = n BLOCK_N, b h),
//      n fastest in the grid. Warpgroup 0 (one thread) loads by TMA K, V once, then per query tile m = m_first ..
//      m_end - 1 (the tiles that see a key of the CTA: query_tiles; DOCS: not EMPTY, next_query_tile) Q_m and dO_m
//      into a STAGES-slot ring (q_full / q_empty mbarriers). Warpgroups 1, 2 own keys k0 + 64 c .. + 63 (c = 0, 1),
//      dK and dV in registers; they load the next tile's lse2, delta rows themselves (fetch_row_value, one float a
//      thread, while a. runs) into one of two row buffers:
//        a. S^T = K_c Q_m^T, dP^T = V_c dO_m^T             SS wgmma, m64 x BLOCK_M, K-major both      scores
//        b. P^T = 2^(S^T scale log2 e - lse2), 0 where masked; dS^T = P^T (dP^T - delta)            probabilities
//        c. dS^T (16-bit) -> sdS [keys][queries], swizzled; fence.proxy.async                       stash_ds
//        d. dV += P^T dO_m, dK += dS^T Q_m                  RS wgmma: A = registers (S's accumulator layout is
//           the A layout), B = dO / Q N-major ("transposed")                                       accumulate
//           named barrier (both), dQ_part = dS K            SS wgmma, A = sdS M-major, B = sK N-major
//           wait, release the ring slot
//        e. dQ_part -> sdQ (float32, fragment order); one thread adds the tile into dQ_acc by one bulk reduce-add
//           (-D DQ_BULK=0: float4 atomics per thread instead; -D DETERMINISTIC=1: key tiles in order n = 0, 1, ...
//           through a per-(b h, m) turn counter in global memory)                                   add_dq
//      then dK = scale dK, dV in 16 bits, keys < Tk                                                 store_dk_dv
//      dQ_part: BLOCK_M = 128 (D = 64): consumer c takes query rows 64 c .. + 63, all D columns; BLOCK_M = 64
//      (D = 128): all rows, columns 64 c .. + 63. Either way 64 x 64 per warpgroup, over the CTA's 128 keys.
//   3. hopper_bwd_postprocess  dq = scale dQ_acc in 16 bits, rows and columns back from the fragment order.
//   4. hopper_bwd_reduce_heads  k, v of Hkv < H heads only (2. reads kv head h / group and writes each query
//      head's dK, dV part): dK, dV of kv head j = the float32 sum of its group's 16-bit parts, rounded once.
//
// Layouts: q, o, do, dq (B, H, Tq, D), k, v, dk, dv (B, H, Tk, D), 16-bit, row-major. Workspace (float32 unless said;
//   Tq_pad = m_count BLOCK_M, m_count = ceil(Tq / BLOCK_M)): dq_acc (B H m_count, BLOCK_M D: one block per query
//   tile, in the consumers' fragment order, see add_dq), lse2, delta (B H, Tq_pad), turns (B H m_count int32).
//   Shared memory (dynamic, aligned to 1024; 16-bit tiles in the 128-byte swizzle of hopper_attn.cu, D = 128 as two
//   64-column halves): [sK BLOCK_N x D][sV][STAGES x (sQ BLOCK_M x D, sdO)][2 x sdS BLOCK_N x BLOCK_M: one
//   64-query half after the other][2 x (lse2, delta: BLOCK_M float32 each)][DOCS: 2 x query doc ids, BLOCK_M int32;
//   the key tile's doc ids, 128 int32][sdQ BLOCK_M D float32 (DQ_BULK)]
//
// Launch: preprocess grid = ceil(B H Tq_pad / PRE_WARPS), block = 32 PRE_WARPS; main grid = ceil(Tk / 128) B H,
//   block = 384, dynamic shared memory = SMEM_BYTES = 2 BLOCK_N D 2 + STAGES 2 BLOCK_M D 2 + 16 BLOCK_M
//   + 2 BLOCK_N BLOCK_M 2 + 4 BLOCK_M D + 1024: 199680 (D = 64) and 198656 bytes (D = 128) (DQ_BULK = 0: 32768
//   less; DOCS: 8 BLOCK_M + 512 more); postprocess and reduce_heads grid = min(ceil(quads or pairs / 256), 8192),
//   block = 256. Registers: __launch_bounds__(384, 1) = 168; setmaxnreg 24 producer, 240 consumers.
//
// Kernels (extern "C"; u16: the bits of float16, f16, or bfloat16, bf16):
//   hopper_bwd_preprocess_{f16,bf16}(const u16* o, const u16* dout, const float* lse, const float* dlse,
//       float* lse2, float* delta, float* dq_acc, int* turns, int d, int Tq, int Tq_pad, long long padded_rows,
//       int n_turns)   dlse == nullptr: none; d = 64 or 128; padded_rows = B H Tq_pad; n_turns = B H m_count
//   hopper_bwd_{f16,bf16}_d{64,128}(TensorMap map_q, map_k, map_v, map_do (__grid_constant__), const float* lse2,
//       const float* delta, float* dq_acc, int* turns, u16* dk, u16* dv, int Tq, int Tk, float scale_log2,
//       float scale, int left, int right, int group, const float* alibi_log2, const int* doc_q, const int* doc_k,
//       const signed char* classes, int heads, float cap_in, float cap_out, int prefix)   maps: (D, T, B H) tensors
//       (k, v: B Hkv, H / group), boxes of 64 columns x BLOCK_M (q, do) or BLOCK_N (k, v) rows, 128-byte swizzle;
//       scale: the softmax scale (any finite value, negative too); scale_log2 = scale log2 e; left, right: the band
//       (Tq + Tk: unbounded); group: query heads per kv head (dk, dv then (B, H, Tk, D) parts for reduce_heads);
//       turns: used only by the DETERMINISTIC = 1 build, where every query tile's key tiles are 0 .. N (left
//       unbounded); alibi_log2: (B H,) slope log2 e per (batch, head), read by the ALIBI = 1 build only; doc_q (B,
//       Tq), doc_k (B, Tk), classes (B, m_count, n_count: EMPTY 0, FULL 1, PARTIAL 2 at BLOCK_M x 128), heads = H:
//       read by the DOCS = 1 build only; cap_in = scale / softcap, cap_out = softcap log2 e: by SOFTCAP = 1 only;
//       prefix (keys every query sees, 0 for none): by PREFIX = 1 only
//   hopper_bwd_postprocess_{f16,bf16}(const float* dq_acc, u16* dq, long long quads, int d, int Tq, float scale)
//       quads = B H Tq D / 4
//   hopper_bwd_reduce_heads_{f16,bf16}(const u16* part, u16* out, long long pairs, long long head_pairs, int group)
//       part (B, Hkv group, Tk, D), out (B, Hkv, Tk, D); pairs = B Hkv Tk D / 2, head_pairs = Tk D / 2
//   -D defaults as the launcher passes them: BLOCK_M_D64 128, BLOCK_M_D128 64, STAGES 2, PRE_WARPS 4, DQ_BULK 1,
//   DETERMINISTIC, ALIBI, DOCS, SOFTCAP and PREFIX 0 (1: builds of their own); the schedule, 0 or 1 each, any mix, the
//   same results: EARLY_P 1 (b. once S^T alone has completed; SOFTCAP needs 0), EARLY_KV 0 (1: dV, dK issued before
//   d.'s barrier), DQ_FIRST 1 (dQ_part waited for first, e. while dK, dV run); see accumulate.
//
// Needs compute capability 9.0 and the sm_90a target (wgmma, setmaxnreg, TMA); built for another target the main
// kernel is a stub that traps. Includes ptx/mbarrier.cuh, ptx/tma.cuh, ptx/wgmma.cuh, ptx/mma_sync.cuh (pack2,
// unpack2, st_shared_u32, st_shared_f32x4).
// Build it alone, from the repository root:
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/hopper/hopper_attn_bwd.cu -o bwd.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_90a (extern "C" kernels: no name expressions)
//
// Limits (checked by the launcher): D in {64, 128}; 16-bit tensors C-contiguous, 16-byte aligned; any Tq, Tk >= 1
// (TMA zero-fills rows past the end, P is masked there, stores are guarded). No host example yet.
// Numerics: 16-bit products (P, dS rounded to the inputs' type), float32 sums; exp2 by ex2.approx.ftz; dQ's key-tile
// parts summed in L2 in an order that varies between runs, unless DETERMINISTIC. Notes: kernels/hopper/README.md.

#include "ptx/mbarrier.cuh"
#include "ptx/mma_sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

// ---- sizes (the launcher passes them with -D; these defaults are what `nvcc -c` sees) ----
#ifndef BLOCK_M_D64
#define BLOCK_M_D64 128    // query rows per tile at D = 64
#endif
#ifndef BLOCK_M_D128
#define BLOCK_M_D128 64    // at D = 128 (dK, dV take 128 registers a thread there)
#endif
#ifndef STAGES
#define STAGES 2           // Q/dO ring slots
#endif
#ifndef PRE_WARPS
#define PRE_WARPS 4        // rows (one warp each) per preprocess block
#endif
#ifndef DETERMINISTIC
#define DETERMINISTIC 0    // 1: dQ's key-tile parts added in a fixed order (bitwise repeatable dQ); its own build
#endif
#ifndef ALIBI
#define ALIBI 0            // 1: ALiBi, - slope log2 e |j - c| added to each score's exponent; a build of its own
#endif
#ifndef DOCS
#define DOCS 0             // 1: document masking (ids per query and key, classes per tile pair); a build of its own
#endif
#ifndef SOFTCAP
#define SOFTCAP 0          // 1: tanh soft-capping of the scaled scores; a build of its own, with EARLY_P 0
#endif
#ifndef PREFIX
#define PREFIX 0           // 1: prefix-LM, keys j < prefix seen by every query as well as the band; a build of its own
#endif
#ifndef DQ_BULK
#define DQ_BULK 1          // dQ_part into dQ_acc: 1 by one bulk reduce-add per tile, 0 by float4 atomics per thread
#endif
// The schedule of steps a. and d. (each 0 or 1, any combination; the results are the same bits, only waits move)
#ifndef EARLY_P
#define EARLY_P 1          // 1: P^T's exponentials once S^T alone has completed, dS^T once dP^T has too
#endif
#ifndef EARLY_KV
#define EARLY_KV 0         // 1: dV, dK issued ahead of the dS barrier, dQ_part behind it in a commit group of its own
#endif
#ifndef DQ_FIRST
#define DQ_FIRST 1         // 1: dQ_part waited for first and added while dK (and dV) still run
#endif
static_assert(!(SOFTCAP && EARLY_P), "SOFTCAP needs EARLY_P 0: dS^T's factor 1 - tanh^2 is not kept across the wait");

constexpr int ELEM_BYTES = 2;                               // float16 / bfloat16
constexpr int WARPGROUP = 128;
constexpr int WGMMA_M = 64;
constexpr int SWIZZLE_BYTES = 128;                          // one swizzled row: 64 16-bit elements
constexpr int SWIZZLE_ELEMS = SWIZZLE_BYTES / ELEM_BYTES;
constexpr int SWIZZLE_ATOM = 8 * SWIZZLE_BYTES;             // 1024 bytes: the XOR pattern's period
constexpr int SMEM_ALIGN = SWIZZLE_ATOM;
constexpr int SMEM_LIMIT = 227 * 1024;
constexpr int REGISTER_FILE = 65536;
constexpr int BLOCK_N = 128;                                // keys per CTA: 64 per consumer warpgroup
constexpr int CONSUMERS = BLOCK_N / WGMMA_M;                // 2
constexpr int CONSUMER_THREADS = CONSUMERS * WARPGROUP;

template <int D> struct Shape {
    static_assert(D == 64 || D == 128, "head dimension 64 or 128");
    static constexpr int HEAD_DIM = D;
    static constexpr int HALVES = D / SWIZZLE_ELEMS;                    // 64-column swizzled blocks per tile row
    static constexpr int BLOCK_M = D == 64 ? BLOCK_M_D64 : BLOCK_M_D128;
    static constexpr int THREADS = WARPGROUP * (1 + CONSUMERS);         // 384
    static constexpr int CONSUMER_WARPS = CONSUMER_THREADS / 32;        // arrivals that free a ring slot
    static constexpr int LAUNCH_REGS = REGISTER_FILE / THREADS / 8 * 8; // 168
    static constexpr int PRODUCER_REGS = 24;
    static constexpr int CONSUMER_REGS = (LAUNCH_REGS * (1 + CONSUMERS) - PRODUCER_REGS) / CONSUMERS / 8 * 8;  // 240
    static constexpr int S_ACC = WGMMA_M * BLOCK_M / WARPGROUP;         // S^T, dP^T accumulators per thread
    static constexpr int A_REGS = S_ACC / 2;                            // P^T, dS^T as 16-bit pairs
    static constexpr int KV_ACC = WGMMA_M * D / WARPGROUP;              // dK, dV accumulators per thread
    static constexpr bool DQ_SPLIT_ROWS = BLOCK_M == 2 * WGMMA_M;       // dQ split by query rows, else by columns
    static constexpr int DQ_COLS = DQ_SPLIT_ROWS ? D : D / CONSUMERS;   // 64 either way
    static constexpr int DQ_ACC = WGMMA_M * DQ_COLS / WARPGROUP;        // 32
    static constexpr int DQ_QUADS = DQ_ACC / 4;                         // float4s of dQ_part per thread
    static constexpr int Q_BYTES = BLOCK_M * D * ELEM_BYTES;            // one Q or dO tile
    static constexpr int KV_BYTES = BLOCK_N * D * ELEM_BYTES;           // one K or V tile
    static constexpr int DS_BYTES = BLOCK_N * BLOCK_M * ELEM_BYTES;     // one dS^T buffer
    static constexpr int ROW_BYTES = BLOCK_M * 4;                       // lse2 or delta of one query tile
    static constexpr int DQ_BYTES = BLOCK_M * D * 4;                    // a query tile's dQ_part, float32
    static constexpr int TX_BYTES = 2 * Q_BYTES;                        // what q_full[s] receives
    static constexpr int RING = 2 * KV_BYTES;                           // offsets in the dynamic shared memory
    static constexpr int DS = RING + STAGES * 2 * Q_BYTES;
    static constexpr int ROWS = DS + 2 * DS_BYTES;
    static constexpr int DOC_ROWS = ROWS + 2 * 2 * ROW_BYTES;           // DOCS: two buffers of query doc ids
    static constexpr int KEY_DOCS = DOC_ROWS + 2 * ROW_BYTES;           // DOCS: the CTA's BLOCK_N key doc ids
    static constexpr int DQ = DOC_ROWS + (DOCS ? 2 * ROW_BYTES + BLOCK_N * 4 : 0);  // the dQ_part staging tile
    static constexpr int SMEM_BYTES = DQ + (DQ_BULK ? DQ_BYTES : 0) + SMEM_ALIGN;  // the launcher's request
    static_assert(BLOCK_M == 64 || BLOCK_M == 128, "64 or 128 query rows per tile (S^T is one m64nBLOCK_Mk16)");
    static_assert(DQ_COLS == 64, "BLOCK_M = 128 or D = 128: each consumer's share of dQ is 64 x 64");
    static_assert(BLOCK_M + D <= 192, "registers: dK, dV (D) and S^T, dP^T (BLOCK_M) per thread");
    static_assert(STAGES >= 2 && STAGES <= 4, "2..4 ring slots");
    static_assert(SMEM_BYTES + 8 * (1 + 2 * STAGES) <= SMEM_LIMIT, "tiles and barriers fit in 227 KB");
    static_assert(Q_BYTES % SMEM_ALIGN == 0 && DS_BYTES % SMEM_ALIGN == 0, "tiles start on 1024-byte bounds");
};

// Where a CTA's tiles and barriers are: shared-window addresses (wgmma, TMA) and, for the float32 rows, pointers.
template <class T> struct Smem {
    u32 base;
    unsigned char* raw;        // the same byte as `base`, as a generic pointer
    u64* kv_full;              // "K and V have landed"
    u64* q_full;               // [s] "slot s holds Q_m, dO_m"
    u64* q_empty;              // [s] "every consumer warp is done with slot s"
    DEVICE u32 sK() const { return base; }
    DEVICE u32 sV() const { return base + T::KV_BYTES; }
    DEVICE u32 sQ(int s) const { return base + T::RING + s * 2 * T::Q_BYTES; }
    DEVICE u32 sdO(int s) const { return sQ(s) + T::Q_BYTES; }
    DEVICE u32 sdS(int b) const { return base + T::DS + b * T::DS_BYTES; }
    DEVICE u32 sdQ() const { return base + T::DQ; }
    DEVICE float* rows(int b) const {  // buffer b (0, 1) of a query tile's lse2, then delta rows
        return reinterpret_cast<float*>(raw + T::ROWS + b * 2 * T::ROW_BYTES);
    }
    DEVICE int* doc_rows(int b) const {  // DOCS: buffer b of a query tile's document ids
        return reinterpret_cast<int*>(raw + T::DOC_ROWS + b * T::ROW_BYTES);
    }
    DEVICE int* key_docs() const { return reinterpret_cast<int*>(raw + T::KEY_DOCS); }  // DOCS
};

// What every thread of a CTA knows about its problem.
struct Problem {
    int Tq, Tk, diag;          // diag = Tk - Tq: query i's position among the keys is c = i + diag
    int lo, hi;                // the band: query i sees key j < Tk when i + lo <= j <= i + hi (lo = diag - left,
                               // hi = diag + right; causal: right = 0; an unbounded side is Tq + Tk)
    int bh, n, k0;             // (batch, head), the key tile and its first key
    int kv_bh;                 // the (batch, kv head) of k and v this head reads: bh / group
    int m_first, m_end;        // the query tiles this key tile meets: m_first .. m_end - 1
    int m_count;               // the query tiles in all (dq_acc's blocks)
    float scale, scale_log2;
    float alibi;               // ALIBI: this head's slope log2 e
    float cap_in, cap_out;     // SOFTCAP: the logit in log2 units is cap_out tanh(s cap_in), s = q.k
    int prefix;                // PREFIX: keys j < prefix are seen by every query
    int n_count;               // DOCS: key tiles per head, the stride of classes along m
};

// DOCS: the classes of flash2_mma_doc_classes for (query tile m, key tile n) of batch entry b.
enum : int { CLASS_EMPTY = 0, CLASS_PARTIAL = 2 };
struct Docs {                  // the CTA's rows of the DOCS build's arrays (attention_backward offsets them)
    const int* q;              // doc_q + b Tq: the document id of each query of batch entry b
    const int* k;              // doc_k + b Tk: of each key
    const signed char* classes;  // classes + b m_count n_count + n: the CTA's key tile's column, stride n_count
    DEVICE signed char of(const Problem& pb, int m) const { return __ldg(classes + m * pb.n_count); }
};

// The first query tile from m on that meets the CTA's key tile: m itself, or under DOCS the first whose class is not
// EMPTY (m_end if none). Producer and consumers both walk the tiles with it.
DEVICE int next_query_tile(const Problem& pb, const Docs& docs, int m) {
    if constexpr (DOCS)
        while (m < pb.m_end && docs.of(pb, m) == CLASS_EMPTY) ++m;
    return m;
}

// The query tiles that see a key of the tile k0 .. k0 + BLOCK_N - 1: query i sees one when i + hi >= k0 and
// i + lo <= k0 + BLOCK_N - 1, and every query does when k0 < prefix. Producer and consumers both use them, so they
// agree on the ring's turns.
template <int BLOCK_M> DEVICE void query_tiles(Problem& pb) {
    pb.m_first = max(0, pb.k0 - pb.hi) / BLOCK_M;
    const int last = pb.k0 + BLOCK_N - 1 - pb.lo;  // the last query that sees a key of the tile
    pb.m_end = last < 0 ? 0 : min(pb.m_count, last / BLOCK_M + 1);
    if (PREFIX && pb.k0 < pb.prefix) pb.m_first = 0, pb.m_end = pb.m_count;  // PREFIX: every query sees its first key
}

// DOCS: the CTA's first and one past its last query tile that is not EMPTY (range[0] >= range[1]: none), all threads
// reading the classes of query_tiles' range side by side, so that next_query_tile never walks the runs of EMPTY
// tiles before and after the key tile's documents one load at a time. range starts at (m_count, 0); a __syncthreads
// ends it.
template <class T> DEVICE void doc_tile_range(Problem pb, const Docs& docs, int* range) {
    query_tiles<T::BLOCK_M>(pb);
    int first = pb.m_count, end = 0;
    for (int m = pb.m_first + threadIdx.x; m < pb.m_end; m += blockDim.x)
        if (docs.of(pb, m) != CLASS_EMPTY) {
            first = min(first, m);
            end = m + 1;
        }
    if (end > 0) {
        atomicMin(&range[0], first);
        atomicMax(&range[1], end);
    }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr int WGMMA_K = 16;
constexpr int BAR_DS_READY = 1;                             // named barriers of the two consumer warpgroups
constexpr int BAR_DQ_TURN = 2;

// ---------------------------------------------------------------------------------------------
// The producer: one thread of warpgroup 0
// ---------------------------------------------------------------------------------------------

// K and V once; then for each query tile Q and dO (D / 64 boxes each) into the next ring slot.
template <class T>
DEVICE void produce(const Smem<T>& sm, const Problem& pb, const Docs& docs, const TensorMap& map_q,
                    const TensorMap& map_k, const TensorMap& map_v, const TensorMap& map_do) {
    prefetch_tensor_map(map_q);
    prefetch_tensor_map(map_k);
    prefetch_tensor_map(map_v);
    prefetch_tensor_map(map_do);
    mbar_arrive_expect_tx(smem_addr(sm.kv_full), 2 * T::KV_BYTES);
#pragma unroll
    for (int h = 0; h < T::HALVES; ++h) {
        const u32 half = h * BLOCK_N * SWIZZLE_BYTES;
        tma_load_3d(sm.sK() + half, map_k, h * SWIZZLE_ELEMS, pb.k0, pb.kv_bh, smem_addr(sm.kv_full));
        tma_load_3d(sm.sV() + half, map_v, h * SWIZZLE_ELEMS, pb.k0, pb.kv_bh, smem_addr(sm.kv_full));
    }
    RingPos<STAGES> pos;
    for (int m = pb.m_first; m < pb.m_end; m = next_query_tile(pb, docs, m + 1)) {
        mbar_wait(smem_addr(&sm.q_empty[pos.s]), pos.phase ^ 1);
        const u32 bar = smem_addr(&sm.q_full[pos.s]);
        mbar_arrive_expect_tx(bar, T::TX_BYTES);
#pragma unroll
        for (int h = 0; h < T::HALVES; ++h) {
            const u32 half = h * T::BLOCK_M * SWIZZLE_BYTES;
            tma_load_3d(sm.sQ(pos.s) + half, map_q, h * SWIZZLE_ELEMS, m * T::BLOCK_M, pb.bh, bar);
            tma_load_3d(sm.sdO(pos.s) + half, map_do, h * SWIZZLE_ELEMS, m * T::BLOCK_M, pb.bh, bar);
        }
        pos.advance();
    }
}

// ---------------------------------------------------------------------------------------------
// The consumers: warpgroups 1 and 2, 64 keys each. Accumulators of m64nN: thread (warp w, lane 4 g + t) holds
// d[4 i + e] at row 16 w + g, column 8 i + 2 t + e, and d[4 i + 2 + e] at row 16 w + g + 8 (e = 0, 1).
// ---------------------------------------------------------------------------------------------

// acc (64 rows x BLOCK_M queries) = X_c Y^T, X = this warpgroup's 64 rows of sK or sV, Y = sQ or sdO: K-major
// both, as S = Q K^T in hopper_attn.cu; k-step kk in half kk / 4 at byte 32 (kk % 4) of each row. One commit group.
template <class T, bool BF16>
DEVICE void issue_scores(float (&acc)[T::S_ACC], u32 x_rows, u32 y_tile) {
    constexpr int D = T::HEAD_DIM;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / WGMMA_K; ++kk) {
        const u32 off = (kk % 4) * WGMMA_K * ELEM_BYTES;
        wgmma_ss<BF16>(acc, kmajor_descriptor(x_rows + (kk / 4) * BLOCK_N * SWIZZLE_BYTES + off),
                       kmajor_descriptor(y_tile + (kk / 4) * T::BLOCK_M * SWIZZLE_BYTES + off), kk > 0);
    }
    wgmma_commit();
}

// The rest of step b under EARLY_P: dS^T = P^T (dP^T - delta[q]), the same product as above (P^T = 0 where masked).
template <int N> DEVICE void ds_from_p(const float (&acc_s)[N], float (&acc_dp)[N], const float* delta, int t) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
        const float2 dl = *reinterpret_cast<const float2*>(delta + 8 * i + 2 * t);
#pragma unroll
        for (int j = 0; j < 4; ++j) acc_dp[4 * i + j] = acc_s[4 * i + j] * (acc_dp[4 * i + j] - (j % 2 ? dl.y : dl.x));
    }
}

// SOFTCAP (not SPLIT), a sweep of its own first: acc_s becomes the capped logit minus lse2 (log2 units), acc_dp
// becomes (dP^T - delta[q]) (1 - tanh^2), with tanh = 1 - r, 1 - tanh^2 = r (2 - r); probabilities then takes the
// logits as they are.
template <int N>
DEVICE void softcap_logits(float (&acc_s)[N], float (&acc_dp)[N], const float* lse2, const float* delta,
                           const Problem& pb, int t) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
        const float2 l = *reinterpret_cast<const float2*>(lse2 + 8 * i + 2 * t);
        const float2 dl = *reinterpret_cast<const float2*>(delta + 8 * i + 2 * t);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int idx = 4 * i + j;
            const float r = one_minus_tanh(acc_s[idx] * pb.cap_in);
            acc_s[idx] = fmaf(-pb.cap_out, r, pb.cap_out - (j % 2 ? l.y : l.x));
            acc_dp[idx] = (acc_dp[idx] - (j % 2 ? dl.y : dl.x)) * (r * (2.0f - r));
        }
    }
}

// Step b, in place: acc_s (S^T) becomes P^T = 2^(S^T scale log2 e - lse2[q]), acc_dp (dP^T) becomes
// dS^T = P^T (dP^T - delta[q]). MASK: P^T = 0 where key >= Tk or key is outside the band; a select, not a product,
// so an overflowing exponent of a hidden entry cannot leak; DOCS: also where the query's document (q_doc, the tile's
// row buffer) is not the key's (k_docs, the CTA's key buffer; r0: the thread's first key row in the CTA's tile). A
// padding query row q >= Tq needs no test: its Q and dO rows are TMA's zero fill and its lse2 is +inf, so P^T =
// 2^-inf = 0 and dS^T = 0. key[h]: this thread's two keys. SOFTCAP: softcap_logits first, then P^T from its logits.
// SPLIT (EARLY_P): P^T only, acc_dp left alone (its wgmma may still run); ds_from_p does dS^T once it has completed.
template <bool MASK, bool SPLIT, int N>
DEVICE void probabilities(float (&acc_s)[N], float (&acc_dp)[N], const float* lse2, const float* delta,
                          const Problem& pb, const int (&key)[2], int q0, int t, const int* q_doc,
                          const int* k_docs, int r0) {
    int k_doc[2] = {0, 0};  // DOCS: the documents of the thread's two keys, from the CTA's key buffer (k_docs)
    if constexpr (DOCS && MASK) {  // read on the tiles that test entries only: no registers held across tiles
#pragma unroll
        for (int h = 0; h < 2; ++h) k_doc[h] = k_docs[r0 + 8 * h];
    }
    if constexpr (SOFTCAP) softcap_logits(acc_s, acc_dp, lse2, delta, pb, t);
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {                 // query columns 8 i + 2 t, + 1
        const float2 l = SOFTCAP ? float2{0.0f, 0.0f} : *reinterpret_cast<const float2*>(lse2 + 8 * i + 2 * t);
        const float2 dl = SOFTCAP ? float2{0.0f, 0.0f} : *reinterpret_cast<const float2*>(delta + 8 * i + 2 * t);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int idx = 4 * i + 2 * h + e;
                const int q = q0 + 8 * i + 2 * t + e;
                float x = SOFTCAP ? acc_s[idx] : fmaf(acc_s[idx], pb.scale_log2, -(e ? l.y : l.x));
                if constexpr (ALIBI) x = fmaf(-pb.alibi, fabsf(static_cast<float>(key[h] - (q + pb.diag))), x);
                float p = exp2_ftz(x);
                if (MASK) {
                    bool hidden = (key[h] > q + pb.hi) | (key[h] < q + pb.lo);
                    if constexpr (PREFIX) hidden &= key[h] >= pb.prefix;  // a prefix key is seen whatever the band
                    hidden |= key[h] >= pb.Tk;
                    if constexpr (DOCS) hidden |= q_doc[8 * i + 2 * t + e] != k_doc[h];
                    p = hidden ? 0.0f : p;
                }
                if constexpr (!SPLIT) acc_dp[idx] = p * (SOFTCAP ? acc_dp[idx] : acc_dp[idx] - (e ? dl.y : dl.x));
                acc_s[idx] = p;
            }
        }
    }
    if constexpr (SPLIT) {
        wgmma_wait<0>();
        wgmma_pin(acc_dp);
        ds_from_p(acc_s, acc_dp, delta, t);
    }
}

// Step c: P^T and dS^T to 16 bits (register j = values 2 j, 2 j + 1: the RS A-operand order, as to_p in
// hopper_attn.cu), and dS^T into sdS, key row r = 64 c + 16 w + g (+ 8), query column 8 i + 2 t in 64-query half
// i / 8, at chunk (i % 8) ^ (r % 8) of the swizzled row (r % 8 = g); then fenced for wgmma (accumulate's barrier
// makes both warpgroups' stores complete before dQ_part reads them).
template <int N, bool BF16>
DEVICE void stash_ds(const float (&acc_s)[N], const float (&acc_dp)[N], u32 (&p)[N / 2], u32 (&ds)[N / 2], u32 sds,
                     int r0, int g, int t) {
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
        p[j] = pack2<BF16>(acc_s[2 * j], acc_s[2 * j + 1]);
        ds[j] = pack2<BF16>(acc_dp[2 * j], acc_dp[2 * j + 1]);
    }
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = r0 + 8 * h;
            st_shared_u32(sds + (i / 8) * BLOCK_N * SWIZZLE_BYTES + r * SWIZZLE_BYTES + (((i % 8) ^ g) * 16) + 4 * t,
                          ds[2 * i + h]);
        }
    fence_async_shared();
}

// Step d's products, each issued without a commit. dV += P^T dO or dK += dS^T Q: A from registers (issue_rs), B
// N-major, k-step kk = queries 16 kk .., rows 16 kk of the tile, 2048 bytes each; the next 64 columns one BLOCK_M-row
// half further. dQ_part = dS K over the CTA's 128 keys (issue_dq): A = sdS M-major, B = sK N-major, k-step kk = keys
// 16 kk ..
template <class T, bool BF16>
DEVICE void issue_rs(float (&acc)[T::KV_ACC], const u32 (&a)[T::A_REGS], u32 tile) {
#pragma unroll
    for (int kk = 0; kk < T::BLOCK_M / WGMMA_K; ++kk) {
        const u32 ak[4] = {a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3]};
        wgmma_rs<BF16>(acc, ak, mn_major_descriptor(tile + kk * WGMMA_K * SWIZZLE_BYTES, T::BLOCK_M * SWIZZLE_BYTES));
    }
}
template <class T, bool BF16> DEVICE void issue_dq(float (&acc_dq)[T::DQ_ACC], u32 sds_c, u32 sk_c) {
    constexpr u32 KEY_HALF = BLOCK_N * SWIZZLE_BYTES;
#pragma unroll
    for (int kk = 0; kk < BLOCK_N / WGMMA_K; ++kk)
        wgmma_ss<BF16, true, true>(acc_dq, mn_major_descriptor(sds_c + kk * WGMMA_K * SWIZZLE_BYTES, KEY_HALF),
                                   mn_major_descriptor(sk_c + kk * WGMMA_K * SWIZZLE_BYTES, KEY_HALF), kk > 0);
}

// Step d: the dS barrier (both warpgroups' dS^T in sdS, for dQ_part) and the three products, in commit groups
// (| a commit, B the barrier):           default  B dV dK dQ |             wait<0>
//   EARLY_KV  dV dK | B dQ |        wait<0>       DQ_FIRST  B dQ | dV dK |  wait<1>
//   both      dV | B dQ | dK |      wait<1>
// dV and dK need only this warpgroup's registers and the ring slot, so EARLY_KV issues them before the barrier and
// the tensor cores run them while the warpgroup waits there. DQ_FIRST returns once dQ_part has completed (wait<1>:
// every group but the last one), and wait_grads waits for the rest after step e. p and ds stay pinned until the
// wgmmas that read them have completed, and the ring slot is handed back only after that.
template <class T, bool BF16>
DEVICE void accumulate(float (&acc_dv)[T::KV_ACC], float (&acc_dk)[T::KV_ACC], float (&acc_dq)[T::DQ_ACC],
                       u32 (&p)[T::A_REGS], u32 (&ds)[T::A_REGS], u32 sq, u32 sdo, u32 sds_c, u32 sk_c) {
    if constexpr (EARLY_KV) {
        wgmma_fence();
        issue_rs<T, BF16>(acc_dv, p, sdo);
        if constexpr (!DQ_FIRST) issue_rs<T, BF16>(acc_dk, ds, sq);
        wgmma_commit();
    }
    named_barrier_sync(BAR_DS_READY, CONSUMER_THREADS);
    wgmma_fence();
    if constexpr (DQ_FIRST) {
        issue_dq<T, BF16>(acc_dq, sds_c, sk_c);
        wgmma_commit();
    }
    if constexpr (!EARLY_KV) issue_rs<T, BF16>(acc_dv, p, sdo);
    if constexpr (!(EARLY_KV && !DQ_FIRST)) issue_rs<T, BF16>(acc_dk, ds, sq);
    if constexpr (!DQ_FIRST) issue_dq<T, BF16>(acc_dq, sds_c, sk_c);
    wgmma_commit();
    if constexpr (DQ_FIRST) {
        wgmma_wait<1>();
        wgmma_pin(acc_dq);
    } else {
        wgmma_wait<0>();
        wgmma_pin(acc_dv);
        wgmma_pin(acc_dk);
        wgmma_pin(acc_dq);
        wgmma_pin(p);
        wgmma_pin(ds);
    }
}
// DQ_FIRST: the wait for dK (and dV), after step e.
template <class T>
DEVICE void wait_grads(float (&acc_dv)[T::KV_ACC], float (&acc_dk)[T::KV_ACC], u32 (&p)[T::A_REGS],
                       u32 (&ds)[T::A_REGS]) {
    wgmma_wait<0>();
    wgmma_pin(acc_dv);
    wgmma_pin(acc_dk);
    wgmma_pin(p);
    wgmma_pin(ds);
}

// Step e: dQ_acc += dQ_part. dQ_acc keeps each query tile's BLOCK_M x D floats as one block, at (b h m_count + m)
// BLOCK_M D, in the consumers' fragment order: float4 j of consumer c's thread tid at (c DQ_QUADS + j) WARPGROUP + tid
// (the postprocess puts rows and columns back). DQ_BULK: every consumer thread stores its float4s into the staging
// tile sdQ (consecutive threads, consecutive 16 bytes: no bank conflicts), and the leader adds the whole tile with one
// bulk reduce-add (the tile was free again once the leader's previous reduce had read it: bulk_wait_read before
// the dS barrier, which precedes e. in every schedule). Else each thread adds its float4s by atomics. IN_ORDER
// (DETERMINISTIC = 1): key tile n adds only once turns[b h, m] == n (set by tile n - 1), then sets it to n + 1, so
// every element of dQ_acc receives its key tiles' parts in the order n = 0, 1, ... and dQ is the same bit for bit.
// (The key tiles that meet query tile m are a prefix n = 0 .. N_m: m_first grows with n.)
template <class T, bool IN_ORDER>
DEVICE void add_dq(const float (&acc_dq)[T::DQ_ACC], const Smem<T>& sm, float* dq_acc, int* turns, const Problem& pb,
                   int m, int c, bool leader) {
    const int tid = threadIdx.x % WARPGROUP;
    const long long at = static_cast<long long>(pb.bh) * pb.m_count + m;  // the (b h, m) block and turn counter
    if constexpr (DQ_BULK) {
#pragma unroll
        for (int j = 0; j < T::DQ_QUADS; ++j)
            st_shared_f32x4(sm.sdQ() + ((c * T::DQ_QUADS + j) * WARPGROUP + tid) * 16, acc_dq[4 * j],
                            acc_dq[4 * j + 1], acc_dq[4 * j + 2], acc_dq[4 * j + 3]);
        fence_async_shared();  // the stores, visible to the bulk copy engine
        named_barrier_sync(BAR_DQ_TURN, CONSUMER_THREADS);
        if (leader) {
            if constexpr (IN_ORDER) {
                while (ld_acquire_gpu(turns + at) != pb.n) __nanosleep(32);
            }
            bulk_reduce_add_f32(dq_acc + at * (T::BLOCK_M * T::HEAD_DIM), sm.sdQ(), T::DQ_BYTES);
            bulk_commit();
            if constexpr (IN_ORDER) {
                bulk_wait<0>();  // the additions done in L2 before the next key tile may start its own
                __threadfence();
                st_release_gpu(turns + at, pb.n + 1);
            }
        }
    } else {
        if constexpr (IN_ORDER) {
            if (leader)
                while (ld_acquire_gpu(turns + at) != pb.n) __nanosleep(32);
            named_barrier_sync(BAR_DQ_TURN, CONSUMER_THREADS);
        }
        float4* const tile = reinterpret_cast<float4*>(dq_acc + at * (T::BLOCK_M * T::HEAD_DIM));
#pragma unroll
        for (int j = 0; j < T::DQ_QUADS; ++j)
            atomicAdd(tile + (c * T::DQ_QUADS + j) * WARPGROUP + tid,
                      make_float4(acc_dq[4 * j], acc_dq[4 * j + 1], acc_dq[4 * j + 2], acc_dq[4 * j + 3]));
        if constexpr (IN_ORDER) {
            __threadfence();
            named_barrier_sync(BAR_DQ_TURN, CONSUMER_THREADS);
            if (leader) st_release_gpu(turns + at, pb.n + 1);
        }
    }
}

// The end: dK = scale dK and dV in 16 bits for the thread's keys k0 + 64 c + 16 w + g (+ 8) < Tk.
template <class T, bool BF16>
DEVICE void store_dk_dv(const float (&acc_dk)[T::KV_ACC], const float (&acc_dv)[T::KV_ACC], u16* dk, u16* dv,
                        const Problem& pb, const int (&key)[2], int t) {
    constexpr int D = T::HEAD_DIM;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (key[h] < pb.Tk) {
            const long long at = (static_cast<long long>(pb.bh) * pb.Tk + key[h]) * D + 2 * t;
#pragma unroll
            for (int i = 0; i < T::KV_ACC / 4; ++i) {
                const int a = 4 * i + 2 * h;
                *reinterpret_cast<u32*>(dk + at + 8 * i) = pack2<BF16>(acc_dk[a] * pb.scale, acc_dk[a + 1] * pb.scale);
                *reinterpret_cast<u32*>(dv + at + 8 * i) = pack2<BF16>(acc_dv[a], acc_dv[a + 1]);
            }
        }
    }
}

// The lse2 and delta rows of query tile m: consumer thread ct (0 .. 255) fetches value ct of the 2 BLOCK_M (lse2, then
// delta; the workspace rows are padded to Tq_pad, so every read lies inside it) and later stores it into a row buffer
// (split so the load's latency passes while the products run). A buffer is rewritten two tiles after it was read,
// ahead of that tile's BAR_DS_READY barrier, and its readers wait for the barrier of the tile that wrote it.
template <class T>
DEVICE float fetch_row_value(const float* lse2, const float* delta, const Problem& pb, int m) {
    const int ct = threadIdx.x - WARPGROUP;
    const long long row = (static_cast<long long>(pb.bh) * pb.m_count + m) * T::BLOCK_M;
    if (ct >= 2 * T::BLOCK_M) return 0.0f;
    return ct < T::BLOCK_M ? __ldg(lse2 + row + ct) : __ldg(delta + row + ct - T::BLOCK_M);
}
template <class T> DEVICE void store_row_value(const Smem<T>& sm, int b, float x) {
    const int ct = threadIdx.x - WARPGROUP;
    if (ct < 2 * T::BLOCK_M) sm.rows(b)[ct] = x;
}
// DOCS: the same for the tile's query document ids, consumer threads 0 .. BLOCK_M - 1 (-1 past Tq: no key's id).
template <class T> DEVICE int fetch_doc_value(const Docs& docs, const Problem& pb, int m) {
    const int ct = threadIdx.x - WARPGROUP, q = m * T::BLOCK_M + ct;
    return ct < T::BLOCK_M && q < pb.Tq ? __ldg(docs.q + q) : -1;
}
template <class T> DEVICE void store_doc_value(const Smem<T>& sm, int b, int x) {
    const int ct = threadIdx.x - WARPGROUP;
    if (ct < T::BLOCK_M) sm.doc_rows(b)[ct] = x;
}
// DOCS: the CTA's key document ids into shared memory, once (-2 past Tk, where the keys are masked anyway).
template <class T> DEVICE void store_key_docs(const Smem<T>& sm, const Docs& docs, const Problem& pb) {
    const int ct = threadIdx.x - WARPGROUP, j = pb.k0 + ct;
    if (ct < BLOCK_N) sm.key_docs()[ct] = j < pb.Tk ? __ldg(docs.k + j) : -2;
}

// One consumer warpgroup c (0 or 1): its 64 keys against every query tile of the CTA, steps a .. e per tile.
template <class T, bool BF16, bool IN_ORDER>
DEVICE void consume(const Smem<T>& sm, const Problem& pb, const Docs& docs, int c, const float* lse2,
                    const float* delta, float* dq_acc, int* turns, u16* dk, u16* dv) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, warp = (threadIdx.x / 32) % 4;
    const int r0 = c * WGMMA_M + 16 * warp + g;                  // this thread's first key row in the CTA's tile
    const int key[2] = {pb.k0 + r0, pb.k0 + r0 + 8};
    const int k_last = pb.k0 + c * WGMMA_M + WGMMA_M - 1;         // the warpgroup's last key
    // step b tests each entry only in tiles that reach past Tk or an edge of the band (hoisted: fewer live registers)
    const bool past_tk = k_last >= pb.Tk;
    const bool in_prefix = PREFIX && k_last < pb.prefix;  // PREFIX: every key of the warpgroup in it, no band edges
    const int below = in_prefix ? -0x7fffffff : k_last - pb.hi;  // q0 >= 0: no tile is below or above then
    const int above = in_prefix ? 0x7fffffff : k_last - (WGMMA_M - 1) - (T::BLOCK_M - 1) - pb.lo;
    const u32 sk_rows = sm.sK() + c * WGMMA_M * SWIZZLE_BYTES, sv_rows = sm.sV() + c * WGMMA_M * SWIZZLE_BYTES;
    // this warpgroup's share of dQ_part: A = its 64-query half of sdS, or B = its 64-column half of sK
    const u32 ds_half = T::DQ_SPLIT_ROWS ? c * BLOCK_N * SWIZZLE_BYTES : 0;
    const u32 sk_dq = sm.sK() + (T::DQ_SPLIT_ROWS ? 0 : c * BLOCK_N * SWIZZLE_BYTES);
    const bool leader = c == 0 && threadIdx.x % WARPGROUP == 0;

    float acc_dk[T::KV_ACC], acc_dv[T::KV_ACC];
#pragma unroll
    for (int i = 0; i < T::KV_ACC; ++i) acc_dk[i] = acc_dv[i] = 0.0f;
    if (pb.m_first < pb.m_end) {
        store_row_value(sm, 0, fetch_row_value<T>(lse2, delta, pb, pb.m_first));
        if constexpr (DOCS) {
            store_doc_value(sm, 0, fetch_doc_value<T>(docs, pb, pb.m_first));
            store_key_docs(sm, docs, pb);
        }
        named_barrier_sync(BAR_DS_READY, CONSUMER_THREADS);
        mbar_wait(smem_addr(sm.kv_full), 0);
    }
    RingPos<STAGES> pos;
    for (int m = pb.m_first; m < pb.m_end;) {
        // the row and dS buffers alternate per tile: the tile's count is m - m_first, or under DOCS (tiles skipped)
        // STAGES phase + s of the ring position, which has the same parity
        const int q0 = m * T::BLOCK_M, buf = DOCS ? (STAGES * pos.phase + pos.s) & 1 : (m - pb.m_first) & 1;
        const bool partial = DOCS && docs.of(pb, m) == CLASS_PARTIAL;  // DOCS: the tile needs the document test
        const int m_next = DOCS ? next_query_tile(pb, docs, m + 1) : m + 1;
        const bool more = m_next < pb.m_end;
        const float next_row_value = more ? fetch_row_value<T>(lse2, delta, pb, m_next) : 0.0f;
        const int next_doc = DOCS && more ? fetch_doc_value<T>(docs, pb, m_next) : -1;
        mbar_wait(smem_addr(&sm.q_full[pos.s]), pos.phase);
        // ---- a. S^T = K_c Q^T and dP^T = V_c dO^T ----
        float acc_s[T::S_ACC], acc_dp[T::S_ACC];
        issue_scores<T, BF16>(acc_s, sk_rows, sm.sQ(pos.s));
        issue_scores<T, BF16>(acc_dp, sv_rows, sm.sdO(pos.s));
        wgmma_wait<EARLY_P ? 1 : 0>();  // EARLY_P: S^T alone
        wgmma_pin(acc_s);
        if constexpr (!EARLY_P) wgmma_pin(acc_dp);
        // ---- b. P^T and dS^T; the mask only in tiles past Tk (past_tk) or across the band's edges (below, above) ----
        const float* rows = sm.rows(buf);
        const int* q_doc = sm.doc_rows(buf);
        if (past_tk || q0 < below || q0 > above || partial)
            probabilities<true, EARLY_P>(acc_s, acc_dp, rows, rows + T::BLOCK_M, pb, key, q0, t, q_doc,
                                         sm.key_docs(), r0);
        else
            probabilities<false, EARLY_P>(acc_s, acc_dp, rows, rows + T::BLOCK_M, pb, key, q0, t, q_doc,
                                          sm.key_docs(), r0);
        // ---- c. 16-bit P^T, dS^T; dS^T into sdS[buf] for both warpgroups ----
        u32 p[T::A_REGS], ds[T::A_REGS];
        if (more) store_row_value(sm, buf ^ 1, next_row_value);  // the next tile's rows, ahead of d.'s dS barrier
        if (DOCS && more) store_doc_value(sm, buf ^ 1, next_doc);
        if (DQ_BULK && leader) bulk_wait_read<0>();  // the previous tile's reduce has read sdQ: it may be rewritten
        stash_ds<T::S_ACC, BF16>(acc_s, acc_dp, p, ds, sm.sdS(buf), r0, g, t);
        // ---- d. dV += P^T dO, dK += dS^T Q, dQ_part = dS K; the ring slot handed back ----
        float acc_dq[T::DQ_ACC];
        accumulate<T, BF16>(acc_dv, acc_dk, acc_dq, p, ds, sm.sQ(pos.s), sm.sdO(pos.s), sm.sdS(buf) + ds_half, sk_dq);
        if constexpr (DQ_FIRST) {  // e. while dK (and dV) still run; the slot only once they have completed
            add_dq<T, IN_ORDER>(acc_dq, sm, dq_acc, turns, pb, m, c, leader);
            wait_grads<T>(acc_dv, acc_dk, p, ds);
        }
        if (lane == 0) mbar_arrive(smem_addr(&sm.q_empty[pos.s]));
        pos.advance();
        // ---- e. dQ_acc += dQ_part ----
        if constexpr (!DQ_FIRST) add_dq<T, IN_ORDER>(acc_dq, sm, dq_acc, turns, pb, m, c, leader);
        m = m_next;
    }
    if (DQ_BULK && leader) bulk_wait<0>();  // sdQ must outlive the last reduce's reads
    store_dk_dv<T, BF16>(acc_dk, acc_dv, dk, dv, pb, key, t);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ---------------------------------------------------------------------------------------------
// Kernel 1: delta = rowsum(dO o) - dlse, lse2 = lse log2 e (+inf for lse = -inf and padding rows), dQ_acc row = 0,
// turns = 0. One warp per padded row (b h, i), i < Tq_pad; lane l holds columns 2 P l .. 2 P l + 2 P - 1 of the row,
// P = d / 64 pairs of 16-bit values.
// ---------------------------------------------------------------------------------------------
template <bool BF16>
DEVICE void preprocess(const u16* __restrict__ o, const u16* __restrict__ dout, const float* __restrict__ lse,
                       const float* __restrict__ dlse, float* __restrict__ lse2, float* __restrict__ delta,
                       float* __restrict__ dq_acc, int* __restrict__ turns, int d, int Tq, int Tq_pad,
                       long long padded_rows, int n_turns) {
    const long long gid = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (gid < n_turns) turns[gid] = 0;
    const long long row = gid / 32;
    const int lane = threadIdx.x % 32;
    if (row >= padded_rows) return;
    const long long bh = row / Tq_pad;
    const int i = static_cast<int>(row % Tq_pad);
    const int pairs = d / 64;
    for (int j = 0; j < pairs; ++j)  // dQ_acc has Tq_pad rows' worth of floats per head: zero all of them
        reinterpret_cast<float2*>(dq_acc + row * d + lane * 2 * pairs)[j] = make_float2(0.0f, 0.0f);
    if (i >= Tq) {                                   // padding: P = 2^-inf = 0 there
        if (lane == 0) {
            lse2[row] = __int_as_float(0x7f800000);
            delta[row] = 0.0f;
        }
        return;
    }
    const long long src = (bh * Tq + i) * d + lane * 2 * pairs;
    float sum = 0.0f;
    for (int j = 0; j < pairs; ++j) {
        const float2 a = unpack2<BF16>(reinterpret_cast<const u32*>(o + src)[j]);
        const float2 b = unpack2<BF16>(reinterpret_cast<const u32*>(dout + src)[j]);
        sum = fmaf(a.x, b.x, fmaf(a.y, b.y, sum));
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
        const float l = lse[bh * Tq + i];
        lse2[row] = l == -__int_as_float(0x7f800000) ? __int_as_float(0x7f800000) : l * 1.4426950408889634f;
        delta[row] = sum - (dlse != nullptr ? dlse[bh * Tq + i] : 0.0f);
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel 2: the main kernel (the steps above), one CTA per (key tile, b h)
// ---------------------------------------------------------------------------------------------
template <int D, bool BF16>
DEVICE void attention_backward(const TensorMap& map_q, const TensorMap& map_k, const TensorMap& map_v,
                               const TensorMap& map_do, const float* lse2, const float* delta, float* dq_acc,
                               int* turns, u16* dk, u16* dv, int Tq, int Tk, float scale_log2, float scale,
                               int left, int right, int group, const float* alibi_log2, const int* doc_q,
                               const int* doc_k, const signed char* classes, int heads, float cap_in,
                               float cap_out, int prefix) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using T = Shape<D>;
    extern __shared__ unsigned char smem_raw[];
    __shared__ alignas(8) u64 kv_full;
    __shared__ alignas(8) u64 q_full[STAGES];
    __shared__ alignas(8) u64 q_empty[STAGES];
    __shared__ int doc_range[2];  // DOCS: the query tiles that are not EMPTY, doc_tile_range

    // ---- set-up: the CTA's key tile and query tiles, the shared memory aligned, the barriers initialised ----------
    const int n_count = (Tk + BLOCK_N - 1) / BLOCK_N;
    Problem pb;
    pb.Tq = Tq;
    pb.Tk = Tk;
    pb.diag = Tk - Tq;
    pb.lo = pb.diag - left;
    pb.hi = pb.diag + right;
    pb.n = blockIdx.x % n_count;
    pb.bh = blockIdx.x / n_count;
    pb.kv_bh = pb.bh / group;  // b H + h over group = b Hkv + h / group, as H = Hkv group
    pb.k0 = pb.n * BLOCK_N;
    pb.m_count = (Tq + T::BLOCK_M - 1) / T::BLOCK_M;
    pb.scale = scale;
    pb.scale_log2 = scale_log2;
    pb.alibi = ALIBI ? alibi_log2[pb.bh] : 0.0f;
    pb.cap_in = cap_in;
    pb.cap_out = cap_out;
    pb.prefix = prefix;
    pb.n_count = n_count;
    const long long b = pb.bh / heads;
    const Docs docs{DOCS ? doc_q + b * Tq : nullptr, DOCS ? doc_k + b * Tk : nullptr,
                    DOCS ? classes + b * pb.m_count * n_count + pb.n : nullptr};
    const u32 raw = smem_addr(smem_raw);
    const u32 base = (raw + SMEM_ALIGN - 1) & ~u32(SMEM_ALIGN - 1);
    const Smem<T> sm{base, smem_raw + (base - raw), &kv_full, q_full, q_empty};
    if (threadIdx.x == 0) {
        mbar_init(smem_addr(&kv_full), 1);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(smem_addr(&q_full[s]), 1);
            mbar_init(smem_addr(&q_empty[s]), T::CONSUMER_WARPS);
        }
        mbar_init_fence();
        if constexpr (DOCS) doc_range[0] = pb.m_count, doc_range[1] = 0;
    }
    __syncthreads();
    if constexpr (DOCS) {
        doc_tile_range<T>(pb, docs, doc_range);
        __syncthreads();
    }

    // ---- warp specialisation: warpgroup 0 loads, warpgroups 1 and 2 compute ---------------------------------------
    const int warpgroup = threadIdx.x / WARPGROUP;
    if (warpgroup == 0) {
        regs_decrease<T::PRODUCER_REGS>();
        query_tiles<T::BLOCK_M>(pb);  // here: not held across setmaxnreg
        if constexpr (DOCS) pb.m_first = doc_range[0], pb.m_end = doc_range[1];
        if (threadIdx.x == 0 && pb.m_first < pb.m_end) produce(sm, pb, docs, map_q, map_k, map_v, map_do);
    } else {
        regs_increase<T::CONSUMER_REGS>();
        query_tiles<T::BLOCK_M>(pb);
        if constexpr (DOCS) pb.m_first = doc_range[0], pb.m_end = doc_range[1];
        consume<T, BF16, DETERMINISTIC != 0>(sm, pb, docs, warpgroup - 1, lse2, delta, dq_acc, turns, dk, dv);
    }
#else
    __trap();  // built for a target without wgmma/TMA (the launcher builds this file for sm_90a only)
#endif
}

// ---------------------------------------------------------------------------------------------
// Kernel 3: dq = scale dQ_acc in 16 bits, four columns of a row per step of a grid-stride loop. Row q, column col of
// a head sit in tile m = q / BLOCK_M, consumer c's 64 x 64 share at (rr, cc); there, m64n64's fragment order puts
// row 16 w + 8 h + g, column 8 i + 2 t + e at float 2 h + e of float4 i of thread 32 w + 4 g + t (add_dq).
// ---------------------------------------------------------------------------------------------
template <class T, bool BF16>
DEVICE void dq_from_fragments(const float* __restrict__ dq_acc, u16* __restrict__ dq, long long quad, int Tq,
                              int m_count, float scale) {
    constexpr int D = T::HEAD_DIM;
    const long long row = quad / (D / 4);  // (b h) Tq + q
    const int col = static_cast<int>(quad % (D / 4)) * 4;
    const long long bh = row / Tq;
    const int q = static_cast<int>(row % Tq), m = q / T::BLOCK_M, r = q % T::BLOCK_M;
    const int c = T::DQ_SPLIT_ROWS ? r / WGMMA_M : col / WGMMA_M;
    const int rr = T::DQ_SPLIT_ROWS ? r % WGMMA_M : r, cc = T::DQ_SPLIT_ROWS ? col : col % WGMMA_M;
    const int w = rr / 16, h = (rr / 8) % 2, g = rr % 8, i = cc / 8, t = (cc % 8) / 2;  // t is 0 or 2
    const float* tile = dq_acc + (bh * m_count + m) * (T::BLOCK_M * D) + c * T::DQ_QUADS * WARPGROUP * 4;
    const int at = (i * WARPGROUP + 32 * w + 4 * g + t) * 4 + 2 * h;
    const float2 lo = *reinterpret_cast<const float2*>(tile + at);      // columns cc, cc + 1: thread t
    const float2 hi = *reinterpret_cast<const float2*>(tile + at + 4);  // cc + 2, cc + 3: thread t + 1
    reinterpret_cast<uint2*>(dq)[quad] = make_uint2(pack2<BF16>(lo.x * scale, lo.y * scale),
                                                    pack2<BF16>(hi.x * scale, hi.y * scale));
}

template <bool BF16>
DEVICE void postprocess(const float* __restrict__ dq_acc, u16* __restrict__ dq, long long quads, int d, int Tq,
                        float scale) {
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    const int m_count = (Tq + (d == 64 ? BLOCK_M_D64 : BLOCK_M_D128) - 1) / (d == 64 ? BLOCK_M_D64 : BLOCK_M_D128);
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < quads; i += stride) {
        if (d == 64)
            dq_from_fragments<Shape<64>, BF16>(dq_acc, dq, i, Tq, m_count, scale);
        else
            dq_from_fragments<Shape<128>, BF16>(dq_acc, dq, i, Tq, m_count, scale);
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel 4, grouped-query heads only: the main kernel wrote each query head's part of dK and dV (rounded to 16 bits);
// kv head j's gradient is the float32 sum of the parts of query heads j group .. j group + group - 1, rounded once.
// Two columns per step of a grid-stride loop.
// ---------------------------------------------------------------------------------------------
template <bool BF16>
DEVICE void reduce_heads(const u16* __restrict__ part, u16* __restrict__ out, long long pairs, long long head_pairs,
                         int group) {
    const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
    const u32* parts = reinterpret_cast<const u32*>(part);
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < pairs; i += stride) {
        const u32* first = parts + (i / head_pairs) * group * head_pairs + i % head_pairs;  // query head j group
        float lo = 0.0f, hi = 0.0f;
        for (int g = 0; g < group; ++g) {
            const float2 x = unpack2<BF16>(first[g * head_pairs]);
            lo += x.x;
            hi += x.y;
        }
        reinterpret_cast<u32*>(out)[i] = pack2<BF16>(lo, hi);
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points, with the signatures of the header's "Kernels": float16 or bfloat16; D = 64 or 128 for the main one
// ---------------------------------------------------------------------------------------------
#define PRE_PARAMS                                                                                                  \
    const u16* o, const u16* dout, const float* lse, const float* dlse, float* lse2, float* delta, float* dq_acc,   \
    int* turns, int d, int Tq, int Tq_pad, long long padded_rows, int n_turns
#define PRE_ARGS o, dout, lse, dlse, lse2, delta, dq_acc, turns, d, Tq, Tq_pad, padded_rows, n_turns
#define MAIN_PARAMS                                                                                                 \
    const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,                               \
    const __grid_constant__ TensorMap map_v, const __grid_constant__ TensorMap map_do, const float* lse2,           \
    const float* delta, float* dq_acc, int* turns, u16* dk, u16* dv, int Tq, int Tk, float scale_log2, float scale, \
    int left, int right, int group, const float* alibi_log2, const int* doc_q, const int* doc_k,                   \
    const signed char* classes, int heads, float cap_in, float cap_out, int prefix
#define MAIN_ARGS map_q, map_k, map_v, map_do, lse2, delta, dq_acc, turns, dk, dv, Tq, Tk, scale_log2, scale, left, \
    right, group, alibi_log2, doc_q, doc_k, classes, heads, cap_in, cap_out, prefix
#define MAIN_BOUNDS __launch_bounds__((1 + CONSUMERS) * WARPGROUP, 1)

extern "C" __global__ void __launch_bounds__(PRE_WARPS * 32) hopper_bwd_preprocess_f16(PRE_PARAMS) {
    preprocess<false>(PRE_ARGS);
}
extern "C" __global__ void __launch_bounds__(PRE_WARPS * 32) hopper_bwd_preprocess_bf16(PRE_PARAMS) {
    preprocess<true>(PRE_ARGS);
}
extern "C" __global__ void MAIN_BOUNDS hopper_bwd_f16_d64(MAIN_PARAMS) {
    attention_backward<64, false>(MAIN_ARGS);
}
extern "C" __global__ void MAIN_BOUNDS hopper_bwd_f16_d128(MAIN_PARAMS) {
    attention_backward<128, false>(MAIN_ARGS);
}
extern "C" __global__ void MAIN_BOUNDS hopper_bwd_bf16_d64(MAIN_PARAMS) {
    attention_backward<64, true>(MAIN_ARGS);
}
extern "C" __global__ void MAIN_BOUNDS hopper_bwd_bf16_d128(MAIN_PARAMS) {
    attention_backward<128, true>(MAIN_ARGS);
}
#define POST_PARAMS const float* dq_acc, u16* dq, long long quads, int d, int Tq, float scale
#define POST_ARGS dq_acc, dq, quads, d, Tq, scale
extern "C" __global__ void hopper_bwd_postprocess_f16(POST_PARAMS) { postprocess<false>(POST_ARGS); }
extern "C" __global__ void hopper_bwd_postprocess_bf16(POST_PARAMS) { postprocess<true>(POST_ARGS); }
#define REDUCE_PARAMS const u16* part, u16* out, long long pairs, long long head_pairs, int group
#define REDUCE_ARGS part, out, pairs, head_pairs, group
extern "C" __global__ void hopper_bwd_reduce_heads_f16(REDUCE_PARAMS) { reduce_heads<false>(REDUCE_ARGS); }
extern "C" __global__ void hopper_bwd_reduce_heads_bf16(REDUCE_PARAMS) { reduce_heads<true>(REDUCE_ARGS); }
