// hopper_attn.cu -- FlashAttention-3-style attention forward on Hopper: TMA loads, wgmma from shared memory for
// S = Q K^T, wgmma with P in registers for O += P V (fp16/bf16 in, float32 accumulation, float32 LSE).
//
// What it computes
//   o[b, h] = softmax(scale q[b, h] k[b, h / group]^T + mask) v[b, h / group], lse[b, h, i] = log sum_j exp(scale
//   q_i . k_j) (natural log) for q (B, H, Tq, D), k and v (B, H / group, Tk, D) (group = 1 without grouped-query
//   heads), row-major, D = 64, 128 or 256, float16 or bfloat16. Causal masking is bottom-right aligned: query i sees
//   key j when j <= i + Tk - Tq; a query row that sees no key gives o = 0 and lse = -inf (flash2_mma.cu's contract).
//   The engines of hopper_gemm.cu (TMA rings, a producer warp, consumer warpgroups on wgmma), K and V in rings of
//   their own. Variant builds (-D VARIANT_MODS, a sum of MOD_DOCS, MOD_SOFTCAP, MOD_ALIBI) compute attention_variant
//   (reference/variants.py): a band c - left <= j <= c + right (c = i + Tk - Tq), a prefix, documents, softcap, ALiBi.
//
// Algorithm (work tile w = query tile m_count - 1 - w % m_count of (batch, head) w / m_count; CTA c takes w = c,
// c + gridDim.x, ...: one CTA per work tile, or one per SM that walks them, "persistent"; or, given tile_counter, w =
// c and then the next tile no CTA has claimed (atomicAdd), longest first within sections of heads: TileQueue, Work)
//
//   producer (warpgroup 0, one thread)              consumer warpgroups 1 .. C (64 query rows each)
//   for each work tile of this CTA:                 for each work tile of this CTA:
//     wait  q_empty;  TMA Q tile -> sQ  (q_full)      wait q_full
//     K_0, then for j = 1 .. n_tiles:                 for j in 0 .. n_tiles-1:
//       K_j (if j < n_tiles), V_{j-1}, each:            1. wait k_full[s]; S = Q K_j^T (D/16 wgmma m64nNk16, SS form);
//         wait  k_empty[s] / v_empty[s]                    arrive k_empty[s]
//         expect k_full[s] / v_full[s] += tile bytes    2. scale, mask, online softmax on S (exp2), O *= alpha,
//         TMA  K_j -> sK[s] / V_j -> sV[s]                 P = 16-bit(S) in registers
//                                                       3. wait v_full[s]; O += P V_j (BLOCK_N/16 wgmma m64nDk16,
//                                                          RS form: P from registers; at D = 256 two m64n128k16
//                                                          per k-step, one per 128 columns); arrive v_empty[s]
//                                                     arrive q_empty (after the tile's last S)
//                                                     4. o = O / l, lse = (m + log2 l) ln 2 -> global (rows < Tq)
//
//   That is the plain loop (OVERLAP = 0): while a warpgroup computes its softmax, its tensor-core work is done. Two
//   schedules, both on by default (kernels/hopper/hopper_attn.py builds the kernel without either to measure them;
//   the results agree to rounding), fill that gap:
//   OVERLAP = 1, software pipelining inside a warpgroup: S_j = Q K_j^T and O += P_{j-1} V_{j-1} are issued together
//     as two commit groups; wgmma.wait_group 1 returns when S_j is done, and its softmax runs while P V is still on
//     the tensor cores (attend_pipelined below). That is why the producer loads K_j before V_{j-1}.
//   PINGPONG = 1: the consumer warpgroups take turns, round robin, at issuing their wgmmas (a named barrier each,
//     Turns below), so one warpgroup's products run while the others compute their softmax.
//   n_tiles = ceil(n_end / BLOCK_N), n_end = Tk or, under the causal mask, the first key no row of the CTA sees
//   (kv_tiles, which producer and consumers share). Tiles wholly above the diagonal are never loaded; n_tiles = 0
//   (Tq > Tk, causal) skips Q too, and the consumers write o = 0, lse = -inf. Variant builds walk key_tiles instead
//   (prefix tiles, then the band's, EMPTY document tiles skipped); a tile FULL for a warpgroup's rows runs unmasked.
//   mbarriers (as in hopper_gemm.cu): the *_full ones expect 1 arrival + the tile's bytes, the *_empty ones one
//   arrival per consumer warp; each side keeps a (slot, phase) per ring, running on from one work tile to the next.
//
// Shared memory (dynamic, aligned up to 1024 bytes)
//   [sQ: BLOCK_M x D][slot 0: sK BLOCK_N x D, sV BLOCK_N x D][slot 1 ...] ... STAGES slots, 16-bit elements, every
//   tile in the 128-byte swizzle of hopper_gemm.cu (chunk c of row r at c ^ (r % 8)). A swizzled row holds 64 16-bit
//   elements, so a D = 128 tile is two column halves, each its own R x 64 block, half h at h * R * 128 bytes; one TMA
//   box (64 columns x R rows) fills one half:
//
//       sK (D = 128, BLOCK_N = 176):   [ keys 0..175, d 0..63   : 22 KB ][ keys 0..175, d 64..127 : 22 KB ]
//
//   Tiles (Shape<D>, -D BLOCK_M_D64 ... STAGES_D256, chosen by the launcher per D and mask): D = 64: 192 x 128, 4 slots
//   (three consumer warpgroups); D = 128: 128 x 176, 2 slots, 128 x 128 under the causal mask; D = 256: 128 x 64, 2.
//
// Launch configuration
//   grid  = m_count * heads (m_count = ceil(Tq / BLOCK_M), heads = B H), or the number of SMs (persistent)
//   block = 128 (1 + C) threads, C = BLOCK_M / 64 = 2 or 3 consumer warpgroups after the producer warpgroup
//   dynamic shared memory = BLOCK_M D 2 + STAGES 2 BLOCK_N D 2 + 1024 (alignment slack): 156672 bytes at D = 64,
//           214016 at D = 128, 164864 under the causal mask, 197632 at D = 256 (SMEM_BYTES); barriers static
//   registers: __launch_bounds__(THREADS, 1) gives 168 a thread for 384 threads, 128 for 512; setmaxnreg moves them
//           from the producer (to 24 or 32) to the consumers (240 or 160): S, O and P live in registers.
//
// Kernels (extern "C"): hopper_attn_{f16,bf16}_d{64,128,256}
//   (const __grid_constant__ TensorMap map_q, map_k, map_v, u16* o, float* lse, int Tq, int Tk, int heads,
//    float scale_log2, int causal, int* tile_counter, int group)
//   map_q, map_k, map_v: CUtensorMaps of q, k, v as (D, T, B*H) and (D, T, B*H/group) 16-bit tensors (innermost
//   first), boxes of 64 columns x BLOCK_M (q) or BLOCK_N (k, v) rows, 128-byte swizzle, zero fill. o: (B, H, Tq, D),
//   the inputs' type. lse: (B, H, Tq) float32, or nullptr for none. Tq, Tk: lengths; heads = B * H; scale_log2 =
//   scale * log2(e); causal: 0 or 1; tile_counter: nullptr (the fixed order), or one int, 0 at launch, that the
//   dynamic schedule counts with; group: query heads per kv head, >= 1.
// Variant kernels: hopper_attn_variants_{f16,bf16}_d{64,128,256}(map_q, map_k, map_v, o, lse, Tq, Tk, heads,
//   scale_log2, const int* doc_q, const int* doc_k, const signed char* classes, const float* alibi_slopes, int Hq,
//   int group, int left, int right, int prefix, float cap_in, float cap_out, int* tile_counter): nullptr for arrays
//   a build does not read; classes from flash2_mma_doc_classes (BLOCK_M x BLOCK_N tiles) with 3 readable bytes past
//   its end; tile_counter ignored (the round robin) with documents or at D = 256.
//
// Needs Hopper: compute capability 9.0 and the sm_90a target (wgmma, setmaxnreg, TMA); built for another target the
// kernels are stubs that trap. Includes ptx/mbarrier.cuh, ptx/tma.cuh, ptx/wgmma.cuh and ptx/mma_sync.cuh (pack2).
// Build it alone, from the repository root:
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/hopper/hopper_attn.cu -o hopper_attn.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_90a (extern "C" kernels: no name expressions)
//
// Limits (checked by kernels/hopper/hopper_attn.py): D in {64, 128, 256}; q, k, v C-contiguous and 16-byte aligned; any
// Tq, Tk >= 1 (TMA zero-fills rows past the end, stores are guarded); m_count * heads < 2^30 work tiles.
// Numerics: 16-bit products, float32 sums; softmax in float32 with ex2.approx.ftz; P (at most 2^8 with lazy
// rescaling) rounded to the inputs' type before P V, l summed from the unrounded p, o rounded once at the end.
// What was tried and measured: kernels/hopper/README.md.

#include "ptx/mbarrier.cuh"
#include "ptx/mma_sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

// ---- tile sizes per head dimension (the launcher passes them with -D; these defaults are what `nvcc -c` sees) ----
#ifndef BLOCK_M_D64
#define BLOCK_M_D64 192    // query rows per CTA: three consumer warpgroups of 64
#endif
#ifndef BLOCK_N_D64
#define BLOCK_N_D64 128    // keys per K/V tile
#endif
#ifndef STAGES_D64
#define STAGES_D64 4       // K/V ring slots
#endif
#ifndef BLOCK_M_D128
#define BLOCK_M_D128 128   // two consumer warpgroups
#endif
#ifndef BLOCK_N_D128
#define BLOCK_N_D128 176   // the launcher builds 128 for the causal mask (fewer keys past the diagonal)
#endif
#ifndef STAGES_D128
#define STAGES_D128 2
#endif
#ifndef BLOCK_M_D256
#define BLOCK_M_D256 128   // two consumer warpgroups, each with 64 rows of O: 128 float registers a thread
#endif
#ifndef BLOCK_N_D256
#define BLOCK_N_D256 64    // Q (64 KB) and two slots of 64-key K and V tiles (32 KB each) fill 193 KB
#endif
#ifndef STAGES_D256
#define STAGES_D256 2
#endif
#ifndef OVERLAP
#define OVERLAP 1      // 1: the softmax of tile j runs while O += P V of tile j - 1 is on the tensor cores
#endif
#ifndef PINGPONG
#define PINGPONG 1     // 1: the consumer warpgroups take turns at the tensor cores (named barriers)
#endif
#ifndef LAZY_RESCALE
#define LAZY_RESCALE 1 // 1: keep the running max unless a tile exceeds it by more than RESCALE_SLACK (online_softmax)
#endif

constexpr int ELEM_BYTES = 2;                               // float16 / bfloat16
constexpr int WARPGROUP = 128;                              // 4 warps issue one wgmma together
constexpr int WGMMA_M = 64, WGMMA_K = 16;
constexpr int SWIZZLE_BYTES = 128;                          // one 128-byte swizzle row
constexpr int SWIZZLE_ELEMS = SWIZZLE_BYTES / ELEM_BYTES;   // 64 elements: one TMA box's width, one tile "half"
constexpr int SWIZZLE_ATOM = 8 * SWIZZLE_BYTES;             // 8 rows: the period of the XOR pattern (1024 bytes)
constexpr int SMEM_ALIGN = SWIZZLE_ATOM;                    // every tile starts on a swizzle-atom boundary
constexpr int SMEM_LIMIT = 227 * 1024;                      // static + dynamic shared memory a block may have
constexpr int REGISTER_FILE = 65536;                        // 32-bit registers per SM

// Everything that follows from the head dimension D: the tile (BLOCK_M query rows x BLOCK_N keys), the ring, the
// warpgroups and how setmaxnreg shares the register file among them.
template <int D> struct Shape {
    static_assert(D == 64 || D == 128 || D == 256, "head dimension 64, 128 or 256");
    static constexpr int HEAD_DIM = D;
    static constexpr int BLOCK_M = D == 64 ? BLOCK_M_D64 : D == 128 ? BLOCK_M_D128 : BLOCK_M_D256;
    static constexpr int BLOCK_N = D == 64 ? BLOCK_N_D64 : D == 128 ? BLOCK_N_D128 : BLOCK_N_D256;
    static constexpr int STAGES = D == 64 ? STAGES_D64 : D == 128 ? STAGES_D128 : STAGES_D256;
    static constexpr int CONSUMERS = BLOCK_M / WGMMA_M;              // consumer warpgroups, 64 query rows each
    static constexpr int THREADS = WARPGROUP * (1 + CONSUMERS);      // + 1 producer warpgroup
    static constexpr int CONSUMER_WARPS = CONSUMERS * WARPGROUP / 32;  // arrivals that release a ring slot
    static constexpr int LAUNCH_REGS = REGISTER_FILE / THREADS / 8 * 8;  // __launch_bounds__(THREADS, 1): 168 / 128
    // setmaxnreg: the producer warpgroup gives registers up, the consumers take them (2 consumers: 24 + 2 x 240 =
    // 3 x 168; 3 consumers: 32 + 3 x 160 = 4 x 128)
    static constexpr int PRODUCER_REGS = CONSUMERS == 2 ? 24 : 32;
    static constexpr int CONSUMER_REGS = (LAUNCH_REGS * (1 + CONSUMERS) - PRODUCER_REGS) / CONSUMERS / 8 * 8;
    static constexpr int HALVES = D / SWIZZLE_ELEMS;                 // 64-column swizzled blocks per tile row
    static constexpr int S_ACC = WGMMA_M * BLOCK_N / WARPGROUP;      // float32 S accumulators per thread (BLOCK_N / 2)
    static constexpr int P_REGS = S_ACC / 2;                         // P as 16-bit pairs
    static constexpr int PV_STEPS = BLOCK_N / WGMMA_K;               // k-steps of O += P V
    static constexpr int O_ACC = WGMMA_M * D / WARPGROUP;            // float32 O accumulators per thread (32..128)
    static constexpr int PV_N = D < 128 ? D : 128;                   // columns of O per wgmma of O += P V (m64nNk16)
    static constexpr int PV_BLOCKS = D / PV_N;                       // wgmmas per k-step of O += P V (1 or 2)
    static constexpr int QK_STEPS = D / WGMMA_K;                     // k-steps of S = Q K^T (4 or 8)
    static constexpr int Q_BYTES = BLOCK_M * D * ELEM_BYTES;         // what TMA delivers to q_full
    static constexpr int KV_TILE_BYTES = BLOCK_N * D * ELEM_BYTES;   // one K or one V tile: what k_full / v_full get
    static constexpr int STAGE_BYTES = 2 * KV_TILE_BYTES;            // slot s: K then V
    static constexpr int SMEM_BYTES = Q_BYTES + STAGES * STAGE_BYTES + SMEM_ALIGN;  // the launcher's request
    static_assert(CONSUMERS == 2 || CONSUMERS == 3, "BLOCK_M = 128 or 192: two or three consumer warpgroups");
    static_assert(BLOCK_N == 64 || BLOCK_N == 128 || BLOCK_N == 176 || BLOCK_N == 192,
                  "S = Q K^T is one m64nNk16 chain, N = BLOCK_N");
    static_assert(BLOCK_M <= 256 && BLOCK_N <= 256, "a TMA box is at most 256 rows");
    static_assert(PV_STEPS * 4 == P_REGS, "each P V k-step takes four 32-bit A registers");
    static_assert(PRODUCER_REGS >= 24 && CONSUMER_REGS % 8 == 0 && CONSUMER_REGS <= 256,
                  "setmaxnreg takes multiples of 8 in [24, 256]");
    static_assert(WARPGROUP * (PRODUCER_REGS + CONSUMERS * CONSUMER_REGS) <= THREADS * LAUNCH_REGS,
                  "the consumers cannot take more registers than the producer gives up");
    static_assert(STAGES >= 2 && STAGES <= 8, "the ring needs 2..8 slots");
    static_assert(SMEM_BYTES + 8 * (2 + 4 * STAGES) <= SMEM_LIMIT, "Q, the ring and the barriers fit in 227 KB");
    static_assert(Q_BYTES % SMEM_ALIGN == 0 && KV_TILE_BYTES % SMEM_ALIGN == 0, "tiles start on 1024-byte bounds");
};

// ---------------------------------------------------------------------------------------------
// Constants and descriptors of this kernel (sm_90a; its wgmma instructions are ptx/wgmma.cuh's wgmma_ss, wgmma_rs)
// ---------------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr float LN2 = 0.6931471805599453f;
constexpr float RESCALE_SLACK = 8.0f;  // LAZY_RESCALE: log2 units, so p <= 2^8 = 256 (see online_softmax)
#define NEG_INF __int_as_float(0xff800000)                  // -inf (NVRTC has no math.h for INFINITY)

// O += P V: V is (keys, d) with d contiguous; in O = P V the reduction (K) axis is the key and N is d, so V is a
// B operand whose N axis is contiguous: "N-major" (= MN-major, the transposed B of the PTX ISA), imm-trans-b = 1.
// The canonical MN-major 128-byte-swizzle layout (PTX ISA "Shared Memory Matrix Layout"; CUTLASS writes it
// ((8 x 8, n), (8, k)) : ((1 x 8, LBO), (64, SBO)) in elements) is:
//   - along N: 64 contiguous elements = one 128-byte swizzled row; the next 64 N-elements lie LBO bytes further
//   - along K: 8 rows of 128 bytes form one 1024-byte swizzle atom; the next 8 K-rows lie SBO bytes further
// Our sV half-blocks are exactly that: one key per 128-byte row, keys r and r + 8 1024 bytes apart (SBO = 1024),
// d columns 64..127 in the second half, BLOCK_N * 128 bytes further (LBO = 22528 for 176 keys; unused when D = 64,
// where one 64-element row covers all of N). k-step kk (keys 16 kk .. 16 kk + 15) starts at row 16 kk:
// sV + kk * 2048, a multiple of 1024, so the descriptor's base offset stays 0. The two offset fields swap meaning
// compared with the K-major case (kmajor_descriptor), where SBO walks the M/N axis and LBO is unused.
template <int BLOCK_N> DEVICE u64 mnmajor_descriptor(u32 addr) {
    return smem_descriptor(addr, BLOCK_N * SWIZZLE_BYTES, SWIZZLE_ATOM);
}

DEVICE float quad_max(float x) {  // over the 4 threads t = 0..3 that share a row of the accumulator
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
DEVICE float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The number of K/V tiles the CTA whose first query row is m0 visits (see the header). Producer and consumers both
// call this, so they agree on the ring's turns.
template <int BLOCK_M, int BLOCK_N> DEVICE int kv_tiles(int m0, int Tq, int Tk, int causal) {
    int n_end = Tk;
    if (causal) {
        const int last_row = min(m0 + BLOCK_M, Tq) - 1;
        n_end = min(Tk, last_row + (Tk - Tq) + 1);  // keys 0 .. last_row + Tk - Tq are visible to last_row
    }
    return n_end > 0 ? (n_end + BLOCK_N - 1) / BLOCK_N : 0;
}

// The key tiles of a dense build's work tile: n of them, 0 .. n - 1. The consumers walk any work tile's key tiles as
// i = 0 .. n - 1, j = first(), after(j), ...: i counts, j is the tile (in a dense build the two agree, and the machine
// code is the same as that of the plain loop over j before the variants).
struct DenseTiles {
    int n;
    DEVICE int first() const { return 0; }
    DEVICE int after(int t) const { return t + 1; }
};

// ---------------------------------------------------------------------------------------------
// The variants (-D VARIANT_MODS: the hopper_attn_variants_* entry points). MODS, a sum of the MOD_ flags, says which
// code a build has; the dense entry points pass 0, so none of it is compiled into them. Query i sits at c = i + Tk - Tq
// among the keys and sees key j < Tk when (c - left <= j <= c + right or j < prefix) and, with MOD_DOCS, doc_q[i] ==
// doc_k[j] (causal is right = 0; an unbounded side is Tq + Tk, which no position reaches). Each (query tile, key
// tile) is EMPTY (never loaded), FULL (no mask code) or PARTIAL, as in reference/variants.py.
// ---------------------------------------------------------------------------------------------
enum : int {
    MOD_DOCS = 1,     // document ids, and a class per (query tile, key tile) to skip EMPTY ones by
    MOD_SOFTCAP = 2,  // tanh soft-capping of the scaled scores
    MOD_ALIBI = 4,    // ALiBi: minus slope_h |j - c_i|
    MOD_VARIANT = 8,  // set by the variant entry points: the band, the prefix and grouped heads
};
enum : int { TILE_EMPTY = 0, TILE_FULL = 1, TILE_PARTIAL = 2 };

// The variant kernels' arguments (see the header's "Kernels"), as the entry points receive them.
struct VariantArgs {
    const int* doc_q;            // (B, Tq) and (B, Tk) int32 document ids (MOD_DOCS)
    const int* doc_k;
    const signed char* classes;  // (B, ceil(Tq / BLOCK_M), ceil(Tk / BLOCK_N)) int8 tile classes (MOD_DOCS)
    const float* slopes;         // (Hq,) float32 ALiBi slopes (MOD_ALIBI)
    int Hq, group, left, right, prefix;
    float cap_in, cap_out;       // softcap: s' = cap_out tanh(s cap_in); cap_in = scale / softcap, cap_out = softcap
                                 // log2 e
};

// The key tiles of a variant build's work tile, n of them in order: the prefix's tiles [0, pre_end), then the band's
// [band_begin, end), each once, EMPTY ones (MOD_DOCS) skipped. Producer and consumers both build it from the same
// arguments (and read the same classes), so they walk the same tiles and the rings stay in step.
template <int MODS> struct KeyTiles {
    int n, start, pre_end, band_begin, end;
    const signed char* classes;  // this (batch entry, query tile)'s row of classes (MOD_DOCS)
    DEVICE int first() const { return start; }
    DEVICE int after(int t) const { return next(t + 1 < pre_end ? t + 1 : max(t + 1, band_begin)); }
    // t if it is in the sequence, else the sequence's next tile (end if none); t < pre_end or t >= band_begin
    DEVICE int next(int t) const {
        if constexpr ((MODS & MOD_DOCS) != 0) {
            if (t < pre_end) {
                t = not_empty(t, pre_end);
                if (t < pre_end) return t;
                t = band_begin;
            }
            t = not_empty(t, end);
        }
        return t;
    }
    // MOD_DOCS: the classes are read four at a time, by the aligned 32-bit word that holds tile t's (the array has 3
    // bytes to spare past its end): bytes of 0xff for a tile that is not EMPTY, tile t's in the lowest byte.
    DEVICE int skew(int t) const { return static_cast<int>(reinterpret_cast<unsigned long long>(classes + t) & 3); }
    DEVICE unsigned seen_from(int t) const {
        const unsigned word = __ldg(reinterpret_cast<const unsigned*>(classes + t - skew(t)));
        return __vcmpne4(word, 0u) >> (8 * skew(t));
    }
    DEVICE int not_empty(int t, int stop) const {  // the first tile of [t, stop) that is not EMPTY, else stop
        for (; t < stop; t += 4 - skew(t))
            if (const unsigned seen = seen_from(t)) return min(t + (__ffs(seen) - 1) / 8, stop);
        return stop;
    }
    DEVICE int count(int t, int stop) const {  // the tiles of [t, stop) that are not EMPTY
        int n = 0;
        for (; t < stop; t += 4 - skew(t)) {
            const int here = min(4 - skew(t), stop - t);  // tiles t .. t + here - 1 share this word
            n += __popc(seen_from(t) & (0xffffffffu >> (32 - 8 * here))) / 8;
        }
        return n;
    }
};

// The key tiles of the CTA whose rows are m0 .. min(m0 + BLOCK_M, Tq) - 1, at positions c_first .. c_last: arithmetic
// on the tile bounds. The band's keys are [c_first - left, c_last + right] within [0, Tk); the prefix's [0, prefix).
template <class T, int MODS>
DEVICE KeyTiles<MODS> key_tiles(int m0, int bh, int Tq, int Tk, const VariantArgs& va) {
    constexpr int BN = T::BLOCK_N;
    KeyTiles<MODS> kt;
    const int c_first = m0 + Tk - Tq, c_last = min(m0 + T::BLOCK_M, Tq) - 1 + Tk - Tq;
    const int lo = max(0, c_first - va.left), hi = min(Tk, c_last + va.right + 1);  // band keys [lo, hi)
    kt.pre_end = (min(va.prefix, Tk) + BN - 1) / BN;
    kt.band_begin = max(lo / BN, kt.pre_end);
    const int band_end = hi > lo ? (hi + BN - 1) / BN : 0;
    kt.end = band_end > kt.band_begin ? band_end : kt.pre_end;
    kt.start = kt.pre_end > 0 ? 0 : kt.band_begin;
    kt.n = kt.pre_end + max(0, kt.end - kt.band_begin);
    kt.classes = nullptr;
    if constexpr ((MODS & MOD_DOCS) != 0) {  // count the tiles that are not EMPTY
        const int m_count = (Tq + T::BLOCK_M - 1) / T::BLOCK_M, n_count = (Tk + BN - 1) / BN;
        kt.classes = va.classes + (static_cast<long long>(bh / va.Hq) * m_count + m0 / T::BLOCK_M) * n_count;
        kt.start = kt.next(kt.start);
        kt.n = kt.count(0, kt.pre_end) + kt.count(kt.band_begin, kt.end);
    }
    return kt;
}

// The key tiles of the work tile (m0, bh), as the consumers walk them (the producer branches on MODS itself).
template <class T, int MODS>
DEVICE auto work_tiles(int m0, int bh, int Tq, int Tk, int causal, const VariantArgs& va) {
    if constexpr ((MODS & MOD_VARIANT) == 0)
        return DenseTiles{kv_tiles<T::BLOCK_M, T::BLOCK_N>(m0, Tq, Tk, causal)};
    else
        return key_tiles<T, MODS>(m0, bh, Tq, Tk, va);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ---------------------------------------------------------------------------------------------
// The consumer's steps, each on one warpgroup's 64 query rows (T = Shape<D>)
// ---------------------------------------------------------------------------------------------

// Issue S = Q K^T (D / 16 wgmmas, both operands K-major in shared memory, as in hopper_gemm.cu) as one commit group,
// without waiting. k-step kk (d elements 16 kk .. 16 kk + 15) lies in half kk / 4 at byte 32 (kk % 4) of each row, so
// both descriptors start at tile + (kk / 4) * rows * 128 + (kk % 4) * 32 (the consumer's 64 rows of sQ start 64 cw
// rows = 8 KB further in each half). The first k-step overwrites S (accumulate = 0), so S needs no clearing.
template <class T, bool BF16> DEVICE void issue_qk(float (&acc_s)[T::S_ACC], u32 sQ_wg, u32 sK) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < T::QK_STEPS; ++kk) {       // half kk / 4, byte 32 (kk % 4) within each row
        const u32 off = (kk % 4) * WGMMA_K * ELEM_BYTES;
        wgmma_ss<BF16>(acc_s, kmajor_descriptor(sQ_wg + (kk / 4) * T::BLOCK_M * SWIZZLE_BYTES + off),
                       kmajor_descriptor(sK + (kk / 4) * T::BLOCK_N * SWIZZLE_BYTES + off), kk > 0);
    }
    wgmma_commit();
}

// Issue O += P V (BLOCK_N / 16 k-steps, P from registers, V N-major in shared memory) as one commit group. A k-step is
// one wgmma m64nDk16, or at D = 256 two m64n128k16: columns 128 c .. 128 c + 127 of O are the accumulators
// 64 c .. 64 c + 63 (the accumulator layout of m64n256k16 cut in two), and of sV the halves 2 c and 2 c + 1.
template <class T, bool BF16> DEVICE void issue_pv(float (&acc_o)[T::O_ACC], const u32 (&p)[T::P_REGS], u32 sV) {
    constexpr int ACC = T::O_ACC / T::PV_BLOCKS;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < T::PV_STEPS; ++kk) {       // keys 16 kk .. 16 kk + 15: rows 16 kk of each half
        const u32 a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
#pragma unroll
        for (int c = 0; c < T::PV_BLOCKS; ++c) {
            float (&acc)[ACC] = *reinterpret_cast<float (*)[ACC]>(&acc_o[c * ACC]);
            const u32 half_pair = c * 2 * T::BLOCK_N * SWIZZLE_BYTES;
            wgmma_rs<BF16>(acc, a, mnmajor_descriptor<T::BLOCK_N>(sV + half_pair + kk * WGMMA_K * SWIZZLE_BYTES));
        }
    }
    wgmma_commit();
}

// What one consumer thread needs to know about its rows for the softmax and the epilogue.
struct RowInfo {
    int row[2];       // its two query rows (accumulator halves h = 0, 1): 16 warp + g and + 8, from the CTA's m0
    int first_row;    // the warpgroup's first query row: under the causal mask the one that sees the fewest keys
    int t;            // lane % 4: its columns in every group of 8 are 2 t and 2 t + 1
    int Tk, diag;     // key j is visible to query i when j < Tk and (no causal mask or j <= i + diag), diag = Tk - Tq
    int causal;
    float scale_log2; // scale * log2(e): the scores in log2 units
};

// Scale one tile of S to log2 units, in place, setting masked scores to -inf, and return each of the thread's two
// rows' maximum over its values of the tile. Only for the tiles that need a mask (they reach past Tk or the causal
// diagonal); the others are left as they are (raw_extreme).
template <int N>
DEVICE void scale_and_mask(float (&acc_s)[N], float (&tile_max)[2], const RowInfo& r, int n0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {                // column groups of 8: BLOCK_N / 8 = N / 4
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = n0 + 8 * i + 2 * r.t + e;
                const bool hidden = (col >= r.Tk) | ((r.causal != 0) & (col > r.row[h] + r.diag));  // no branches
                const float x = hidden ? NEG_INF : acc_s[4 * i + 2 * h + e] * r.scale_log2;
                acc_s[4 * i + 2 * h + e] = x;
                tile_max[h] = fmaxf(tile_max[h], x);
            }
        }
    }
}

// The maximum (MAX) or minimum of each of the thread's two rows over its raw scores of the tile: with scale < 0 the
// largest scaled score is the smallest raw one.
template <bool MAX, int N> DEVICE void raw_extreme(const float (&acc_s)[N], float (&ext)[2]) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float a = acc_s[4 * i + 2 * h], b = acc_s[4 * i + 2 * h + 1];
            ext[h] = MAX ? fmaxf(ext[h], fmaxf(a, b)) : fminf(ext[h], fminf(a, b));
        }
    }
}

// p = 2^(mul acc_s - ref) for one tile, in place, with this thread's row sums (float32, unrounded p). After
// scale_and_mask, mul = 1 (masked entries, -inf, give 0); on raw scores mul = scale log2(e), and one FFMA per score
// makes the exponent.
template <int N>
DEVICE void exponentiate(float (&acc_s)[N], float (&row_sum)[2], const float (&ref)[2], float mul) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float p0 = exp2_ftz(fmaf(acc_s[4 * i + 2 * h], mul, -ref[h]));
            const float p1 = exp2_ftz(fmaf(acc_s[4 * i + 2 * h + 1], mul, -ref[h]));
            row_sum[h] += p0 + p1;                     // l sums the unrounded p
            acc_s[4 * i + 2 * h] = p0;
            acc_s[4 * i + 2 * h + 1] = p1;
        }
    }
}

// The online softmax's update from a tile's row maxima (this thread's, in log2 units): m' (kept under lazy
// rescaling), alpha = exp2(m - m'), l scaled by alpha, then p = 2^(mul acc_s - m') in place (see online_softmax).
template <int N>
DEVICE void softmax_update(float (&acc_s)[N], const float (&tile_max)[2], float (&row_max)[2], float (&row_sum)[2],
                           float (&alpha)[2], float mul) {
    float ref[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float m_new = fmaxf(row_max[h], quad_max(tile_max[h]));
        if (LAZY_RESCALE && m_new <= row_max[h] + RESCALE_SLACK) m_new = row_max[h];
        ref[h] = m_new == NEG_INF ? 0.0f : m_new;    // a row with no visible key yet: p = 0, not NaN
        alpha[h] = m_new == row_max[h] ? 1.0f : exp2_ftz(row_max[h] - ref[h]);  // 0 when leaving row_max = -inf
        row_max[h] = m_new;
        row_sum[h] *= alpha[h];
    }
    exponentiate(acc_s, row_sum, ref, mul);
}

// One tile of the online softmax, in place: S (float32 scores of keys n0 .. n0 + BLOCK_N - 1) becomes p = exp2(x - m)
// with x = scale log2(e) S, masked entries giving 0; row_max (m) and this thread's partial row_sum (l) are brought up
// to date; alpha = exp2(m_old - m) is returned for O, which the caller rescales. Per row, in log2 units:
//   m' = max(m, max_j x_j);  alpha = exp2(m - m');  p_j = exp2(x_j - m');  l' = alpha l + sum_j p_j;  O' = alpha O
// A thread holds BLOCK_N / 4 of a row's scores per tile; the row max is completed across the four threads t = 0..3
// of a quad with two shuffles. l stays a per-thread partial sum (every thread of the quad scales it by the same
// alpha) and is reduced across the quad once, at the end. While a row has seen no visible key, m = -inf and the
// exponentials are taken against 0 instead, so that no -inf - -inf = NaN appears: p = 0 and O stays 0. Masked scores
// (key >= Tk, or above the causal diagonal) are set to -inf; only tiles that touch the Tk edge or, under the causal
// mask, the diagonal of this warpgroup's rows are masked. Two savings in instructions per score (the softmax's limit
// on the H100), both as in flash2_mma.cu:
// - The scale is folded into the exponent. In a tile without a mask the scores stay raw: the row maximum is taken
//   over raw s and scaled once (the minimum when scale < 0), and x_j - m' is one FFMA, s_j * scale log2(e) - m'.
//   Per score that leaves FMNMX, FFMA, MUFU.EX2, FADD (for l) and half an F2FP (to 16 bits).
// - Lazy rescaling (LAZY_RESCALE = 1): m is kept unless a tile's maximum exceeds it by more than RESCALE_SLACK = 8
//   (log2 units). Then alpha = 1 and O needs no rescale; a warp skips O *= alpha (D / 2 FMULs per thread) when
//   every alpha of its rows is 1, which after the first few tiles is nearly always. Nothing is lost: p <= 2^8 is
//   rounded to float16 or bfloat16 with the same relative precision as p <= 1 (only the exponent is larger), O and
//   l are float32, and o = O / l and lse = m + log2 l use the same m.
template <int N>
DEVICE void online_softmax(float (&acc_s)[N], float (&row_max)[2], float (&row_sum)[2], float (&alpha)[2],
                           const RowInfo& r, int n0) {
    constexpr int BLOCK_N = 2 * N;
    float tile_max[2] = {NEG_INF, NEG_INF};
    // only tiles that reach past Tk, or (causal) past the diagonal of the warpgroup's first row, need a mask
    const bool mask = n0 + BLOCK_N > r.Tk || (r.causal && n0 + BLOCK_N - 1 > r.first_row + r.diag);
    if (mask) {
        scale_and_mask(acc_s, tile_max, r, n0);
    } else {                                        // raw scores: scale the two extremes, not every score
        float ext[2];
        if (r.scale_log2 >= 0.0f) {
            ext[0] = ext[1] = NEG_INF;
            raw_extreme<true>(acc_s, ext);
        } else {
            ext[0] = ext[1] = -NEG_INF;
            raw_extreme<false>(acc_s, ext);
        }
        tile_max[0] = ext[0] * r.scale_log2;
        tile_max[1] = ext[1] * r.scale_log2;
    }
    softmax_update(acc_s, tile_max, row_max, row_sum, alpha, mask ? 1.0f : r.scale_log2);
}

// A dense build's rows need nothing besides RowInfo.
struct NoRows {};

// What a consumer thread of a variant build knows about its rows, per work tile.
struct VariantRows {
    int left, right, prefix;  // VariantArgs'
    float cap_in, cap_out;
    const int* doc_k;         // this batch entry's key ids (MOD_DOCS)
    int doc[2];               // the document ids of the thread's two rows (MOD_DOCS)
    float slope;              // the query head's ALiBi slope times log2 e (MOD_ALIBI)
    int band_from, band_to;   // every row of the warpgroup sees the keys in [band_from, band_to] (and the prefix)
};

template <int MODS>
DEVICE VariantRows variant_rows(const RowInfo& r, int bh, int Tq, const VariantArgs& va) {
    VariantRows v;
    v.left = va.left;
    v.right = va.right;
    v.prefix = va.prefix;
    v.cap_in = va.cap_in;
    v.cap_out = va.cap_out;
    const int b = bh / va.Hq;
    v.doc_k = nullptr;
    v.doc[0] = v.doc[1] = 0;
    if constexpr ((MODS & MOD_DOCS) != 0) {
        v.doc_k = va.doc_k + static_cast<long long>(b) * r.Tk;
        for (int h = 0; h < 2; ++h) v.doc[h] = __ldg(va.doc_q + static_cast<long long>(b) * Tq + min(r.row[h], Tq - 1));
    }
    v.slope = 0.0f;
    if constexpr ((MODS & MOD_ALIBI) != 0) v.slope = __ldg(va.slopes + bh % va.Hq) * (1.0f / LN2);
    v.band_from = r.first_row + WGMMA_M - 1 + r.diag - va.left;   // the warpgroup's last row's first key
    v.band_to = r.first_row + r.diag + va.right;                  // its first row's last key
    return v;
}

// The consumer's row data of a work tile: none in a dense build.
template <int MODS> DEVICE auto consumer_rows(const RowInfo& r, int bh, int Tq, const VariantArgs& va) {
    if constexpr ((MODS & MOD_VARIANT) == 0)
        return NoRows{};
    else
        return variant_rows<MODS>(r, bh, Tq, va);
}

// Soft-capping without ALiBi leaves t = tanh(s cap_in) in S: the logit cap_out t is taken in the exponent (one FFMA,
// as a dense build takes its scale), not as a product of its own.
template <int MODS> constexpr bool CAP_ONLY = (MODS & MOD_SOFTCAP) != 0 && (MODS & MOD_ALIBI) == 0;

// The score modifiers on one tile of S (raw q.k), in place: each score becomes its logit in log2 units, scale ->
// softcap -> ALiBi as in reference/variants.py, so the softmax that follows takes a scale of 1 (with CAP_ONLY, t).
template <int MODS, int N>
DEVICE void score_mods(float (&acc_s)[N], const RowInfo& r, const VariantRows& v, int n0) {
    float rel0[2];                                   // j - c_i of the thread's first key of the tile (exact < 2^24)
#pragma unroll
    for (int h = 0; h < 2; ++h) rel0[h] = static_cast<float>(n0 + 2 * r.t - r.row[h] - r.diag);
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float x = acc_s[4 * i + 2 * h + e];
                if constexpr (CAP_ONLY<MODS>)
                    x = tanh_approx(x * v.cap_in);
                else if constexpr ((MODS & MOD_SOFTCAP) != 0)
                    x = v.cap_out * tanh_approx(x * v.cap_in);
                else
                    x *= r.scale_log2;
                if constexpr ((MODS & MOD_ALIBI) != 0)
                    x = fmaf(-v.slope, fabsf(rel0[h] + static_cast<float>(8 * i + e)), x);
                acc_s[4 * i + 2 * h + e] = x;
            }
}

// The mask of a PARTIAL tile, in place (scaled to log2 units first when SCALE): -inf where the row does not see the
// key: key >= Tk, outside the row's band and the prefix, or (MOD_DOCS) of another document. Each key's id is read once
// for both rows (L1 hits after the first warp).
template <int MODS, bool SCALE, int N>
DEVICE void variant_mask(float (&acc_s)[N], const RowInfo& r, const VariantRows& v, int n0) {
    int lo[2], hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        lo[h] = r.row[h] + r.diag - v.left;
        hi[h] = r.row[h] + r.diag + v.right;
    }
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int col = n0 + 8 * i + 2 * r.t + e;
            int key_doc = 0;
            if constexpr ((MODS & MOD_DOCS) != 0) key_doc = __ldg(v.doc_k + min(col, r.Tk - 1));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                bool seen = col < r.Tk && ((lo[h] <= col && col <= hi[h]) || col < v.prefix);
                if constexpr ((MODS & MOD_DOCS) != 0) seen = seen && key_doc == v.doc[h];
                const float x = SCALE ? acc_s[4 * i + 2 * h + e] * r.scale_log2 : acc_s[4 * i + 2 * h + e];
                acc_s[4 * i + 2 * h + e] = seen ? x : NEG_INF;
            }
        }
}

// One tile of the online softmax in a dense build: online_softmax, masked where the tile reaches the edge or diagonal.
template <int N>
DEVICE void tile_softmax(float (&acc_s)[N], float (&row_max)[2], float (&row_sum)[2], float (&alpha)[2],
                         const RowInfo& r, const DenseTiles&, const NoRows&, int t) {
    online_softmax(acc_s, row_max, row_sum, alpha, r, t * 2 * N);
}

// One tile of the online softmax in a variant build: the score modifiers, the mask on a tile that is not FULL for
// this warpgroup's rows (keys < Tk, each in the prefix or in the band of every row, and, with MOD_DOCS, a FULL class),
// then the same update as online_softmax. Without modifiers a FULL tile keeps its raw scores (the scale folded into
// the exponent, as online_softmax does); with CAP_ONLY every tile keeps t, cap_out folded into the exponent alike.
template <int N, int MODS>
DEVICE void tile_softmax(float (&acc_s)[N], float (&row_max)[2], float (&row_sum)[2], float (&alpha)[2],
                         const RowInfo& r, const KeyTiles<MODS>& kt, const VariantRows& v, int t) {
    constexpr bool MODDED = (MODS & (MOD_SOFTCAP | MOD_ALIBI)) != 0;
    const int n0 = t * 2 * N, n1 = n0 + 2 * N - 1;
    bool full = n1 < r.Tk && (n1 < v.prefix || (v.band_from <= max(n0, v.prefix) && n1 <= v.band_to));
    if constexpr ((MODS & MOD_DOCS) != 0) full = full && kt.classes[t] == TILE_FULL;
    if constexpr (MODDED) score_mods<MODS>(acc_s, r, v, n0);
    if (!full) variant_mask<MODS, !MODDED>(acc_s, r, v, n0);
    // the scores are logits in log2 units already, or (raw scores, CAP_ONLY's t) the exponent multiplies them by unit
    const bool scaled = (MODDED && !CAP_ONLY<MODS>) || (!MODDED && !full);
    const float unit = CAP_ONLY<MODS> ? v.cap_out : r.scale_log2;
    float ext[2];
    if (scaled || unit >= 0.0f) {
        ext[0] = ext[1] = NEG_INF;
        raw_extreme<true>(acc_s, ext);
    } else {                                         // raw scores and scale < 0: the smallest is the largest logit
        ext[0] = ext[1] = -NEG_INF;
        raw_extreme<false>(acc_s, ext);
    }
    const float mul = scaled ? 1.0f : unit;
    const float tile_max[2] = {ext[0] * mul, ext[1] * mul};
    softmax_update(acc_s, tile_max, row_max, row_sum, alpha, mul);
}

// p (float32, S's accumulator order) -> P as 16-bit pairs in the register-A order of O += P V.
// For m64nNk16 with 16-bit A in registers, each thread holds four 32-bit registers a0..a3 of the 64 x 16 A tile:
// warp w of the warpgroup owns rows 16 w .. 16 w + 15, lane = 4 g + t:
//   a0 = A[16 w + g][2 t, 2 t + 1]      a1 = A[16 w + g + 8][2 t, 2 t + 1]
//   a2 = A[16 w + g][2 t + 8, + 9]      a3 = A[16 w + g + 8][2 t + 8, + 9]       (low half = the lower column)
// (the mma.sync m16n8k16 A fragment, one per warp). The float32 accumulator of S = Q K^T (m64nN) gives thread
// (w, g, t) the values
//   s[4 i + 0, 1] = S[16 w + g][8 i + 2 t, + 1]      s[4 i + 2, 3] = S[16 w + g + 8][8 i + 2 t, + 1]
// so for k-step kk of P V (keys 16 kk .. 16 kk + 15 = column groups i = 2 kk and 2 kk + 1), register j is
// pack(s[8 kk + 2 j], s[8 kk + 2 j + 1]): P needs no shuffle at all, only a conversion to 16 bits in place. (This
// identity is why FlashAttention-3 keeps P in registers.)
template <bool BF16, int N> DEVICE void to_p(const float (&acc_s)[N], u32 (&p)[N / 2]) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) p[i] = pack2<BF16>(acc_s[2 * i], acc_s[2 * i + 1]);
}

// O *= alpha, row by row (values 4 i + 0, 1 are row 0 of the thread, 4 i + 2, 3 row 1); with LAZY_RESCALE only
// when some row of the warp has alpha != 1 (a warp-uniform branch).
template <int N> DEVICE void rescale(float (&acc_o)[N], const float (&alpha)[2]) {
    if (LAZY_RESCALE && !__any_sync(0xffffffffu, (alpha[0] != 1.0f) | (alpha[1] != 1.0f))) return;
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
        acc_o[4 * i + 0] *= alpha[0];
        acc_o[4 * i + 1] *= alpha[0];
        acc_o[4 * i + 2] *= alpha[1];
        acc_o[4 * i + 3] *= alpha[1];
    }
}

// Ping-pong (PINGPONG = 1): the consumer warpgroups take turns, round robin, at issuing wgmmas. A "turn" is one burst
// of issued wgmmas; consumer cw may start a turn once consumer cw - 1 (mod C) has finished issuing its previous one,
// so the tensor cores run one warpgroup's products while the others compute their softmax instead of all competing
// for the tensor cores at the same moments. Named barrier 1 + cw means "consumer cw's turn": cw waits on it
// (bar.sync, 256 threads: its own 128 plus the previous consumer's 128 arrivals), and at the end of each turn arrives
// at the next one's. Consumer 0 goes first: consumer C - 1 arrives at barrier 1 once before its first tile. All
// consumers of a CTA take the same number of turns (they walk the same tiles), so the only arrival left over is
// consumer C - 1's last one, at barrier 1; consumer 0 takes it with one more bar.sync after its last tile, and every
// barrier ends the kernel balanced.
template <int C> struct Turns {
    int cw;          // this consumer warpgroup, 0 .. C - 1
    DEVICE void start() const {
        if (PINGPONG && cw == C - 1) named_barrier_arrive(1, 2 * WARPGROUP);
    }
    DEVICE void begin() const {
        if (PINGPONG) named_barrier_sync(1 + cw, 2 * WARPGROUP);
    }
    DEVICE void end() const {
        if (PINGPONG) named_barrier_arrive(1 + (cw + 1) % C, 2 * WARPGROUP);
    }
    DEVICE void finish() const {
        if (PINGPONG && cw == 0) named_barrier_sync(1, 2 * WARPGROUP);
    }
};

// Where a CTA's tiles and barriers are (T = Shape<D>): sQ, then STAGES slots of [sK | sV] in the dynamic shared
// memory (shared-window addresses), and the mbarriers (static; see the end of "Algorithm" in the header).
template <class T> struct Smem {
    u32 sQ, ring;
    u64* q_full;      // "sQ holds the tile's Q"
    u64* q_empty;     // "every consumer warp is done with sQ"
    u64* k_full;      // [s] "slot s holds K_j"
    u64* v_full;      // [s] "slot s holds V_j"
    u64* k_empty;     // [s] "every consumer warp is done with K in slot s"
    u64* v_empty;     // [s] "every consumer warp is done with V in slot s"
    DEVICE u32 sK(int s) const { return ring + s * T::STAGE_BYTES; }
    DEVICE u32 sV(int s) const { return ring + s * T::STAGE_BYTES + T::KV_TILE_BYTES; }
};

// The work tiles. Work tile w (0 .. m_count * heads - 1) is query tile m_count - 1 - w % m_count of (batch, head)
// w / m_count: the query tiles of one head are neighbours (they run together and share its K and V in L2), the last
// (the longest under the causal mask) first. CTA c takes tiles c, c + gridDim.x, ...: one each when the grid has a
// CTA per tile, several when the launcher makes it persistent (one CTA per SM).
//
// The dynamic schedule numbers them longest first within sections of `section` heads (the last section may have
// fewer): every head's last query tile of the section, then every head's next-to-last, ... The tiles running at once
// then read the K and V of a section or two, which fit in L2 together (L2_SECTION_BYTES), so a head's K and V are
// still there when its next query tile runs; numbered longest first across all heads, 132 heads' K and V would have
// to stay in L2 at once (64 MB at T = 1024, d = 128).
constexpr int L2_SECTION_BYTES = 16 << 20;  // K and V of a section's heads: a third of the H100's 50 MB L2

template <class T> struct Work {
    int m_count, count;
    int section;  // the dynamic schedule's heads per section (L2_SECTION_BYTES over 4 Tk D bytes, 1..heads); 0: none
    DEVICE void tile(int w, int& m0, int& bh) const {
        if (section > 0) {                             // under the causal mask, the later the tile the more keys
            const int heads = count / m_count, per_section = section * m_count;
            const int first = w / per_section * section, r = w % per_section;
            const int in_section = min(section, heads - first);
            bh = first + r % in_section;
            m0 = (m_count - 1 - r / in_section) * T::BLOCK_M;
        } else {
            bh = w / m_count;                          // (batch, head) = the tensor maps' third coordinate
            m0 = (m_count - 1 - w % m_count) * T::BLOCK_M;
        }
    }
};

// Which work tile a CTA takes after w. Without a counter, w + gridDim.x: the fixed round robin. With one (the dynamic
// schedule), the producer claims the next tile no CTA has taken (one atomicAdd on the counter, which starts at 0 at
// launch: tiles gridDim.x, gridDim.x + 1, ... after each CTA's first, blockIdx.x) and hands it to the consumers
// through a two-slot ring in shared memory (full: the producer's arrival; empty: one arrival per consumer warp, from
// the lane that read the slot and shuffles it to the others, so that the arrival orders that read). With the tiles
// numbered longest first (Work), a CTA that finishes early takes the longest tile left: the greedy longest-first
// schedule, which a fixed round robin misses when m_count and the number of SMs share factors.
__shared__ alignas(8) u64 tile_full[2];   // the ring (file scope: fixed addresses, no registers to hold them)
__shared__ alignas(8) u64 tile_empty[2];
__shared__ int tile_slots[2];              // the next tile, as the producer hands it over

struct TileQueue {
    bool dynamic;                  // false: the round robin
    int* counter;                  // global, the producer's only (the consumers' queue holds nullptr: no registers)
    u32 taken = 0;                 // tiles this thread has taken from the ring: slot taken % 2, phase taken / 2 % 2
    DEVICE static void init(int consumer_warps) {  // one thread, with the kernel's other barriers
        for (int s = 0; s < 2; ++s) {
            mbar_init(smem_addr(&tile_full[s]), 1);
            mbar_init(smem_addr(&tile_empty[s]), consumer_warps);
        }
    }
    DEVICE int producer_next(int w) {
        if (!dynamic) return w + gridDim.x;
        const int next = gridDim.x + atomicAdd(counter, 1);
        const u32 s = taken % 2, phase = taken / 2 % 2;
        mbar_wait(smem_addr(&tile_empty[s]), phase ^ 1);
        tile_slots[s] = next;
        mbar_arrive(smem_addr(&tile_full[s]));       // release: the consumers read the slot after their wait
        ++taken;
        return next;
    }
    DEVICE int consumer_next(int w, int lane) {
        if (!dynamic) return w + gridDim.x;
        const u32 s = taken % 2, phase = taken / 2 % 2;
        mbar_wait(smem_addr(&tile_full[s]), phase);
        int next = 0;
        if (lane == 0) {                               // the lane that frees the slot is the one that read it
            next = *reinterpret_cast<volatile int*>(&tile_slots[s]);
            mbar_arrive(smem_addr(&tile_empty[s]));
        }
        ++taken;
        return __shfl_sync(0xffffffffu, next, 0);
    }
};

// ---------------------------------------------------------------------------------------------
// The producer: one thread of warpgroup 0 issues every TMA copy
// ---------------------------------------------------------------------------------------------

// Tile j of K or V of (batch, head) bh into the next slot of its ring, once the consumers have released that slot (a
// fresh barrier reports the phase before its first as complete, so the first pass does not wait).
template <class T>
DEVICE void load_kv(const TensorMap& map, RingPos<T::STAGES>& pos, u64* full, u64* empty, u32 dst, int j, int bh) {
    mbar_wait(smem_addr(&empty[pos.s]), pos.phase ^ 1);
    mbar_arrive_expect_tx(smem_addr(&full[pos.s]), T::KV_TILE_BYTES);
#pragma unroll
    for (int h = 0; h < T::HALVES; ++h)
        tma_load_3d(dst + h * T::BLOCK_N * SWIZZLE_BYTES, map, h * SWIZZLE_ELEMS, j * T::BLOCK_N, bh,
                    smem_addr(&full[pos.s]));
    pos.advance();
}

// Q of the work tile (m0, bh) into sQ, once the consumers are done with the previous tile's (they release it after
// its last S).
template <class T>
DEVICE void load_q(const Smem<T>& sm, const TensorMap& map_q, u32& q_phase, int m0, int bh) {
    mbar_wait(smem_addr(sm.q_empty), q_phase ^ 1);
    mbar_arrive_expect_tx(smem_addr(sm.q_full), T::Q_BYTES);
#pragma unroll
    for (int h = 0; h < T::HALVES; ++h)   // half h: columns 64 h .. 64 h + 63, rows m0 .. m0 + BLOCK_M - 1
        tma_load_3d(sm.sQ + h * T::BLOCK_M * SWIZZLE_BYTES, map_q, h * SWIZZLE_ELEMS, m0, bh, smem_addr(sm.q_full));
    q_phase ^= 1;
}

// For each work tile of the CTA: Q, once the consumers are done with the previous tile's (they release it after its
// last S), then the K/V tiles in the order the consumers need them: K_j before V_{j-1} (S_j = Q K_j^T is issued first
// in iteration j of the pipelined loop): K_0, K_1, V_0, K_2, V_1, ..., V_{n-1}.
template <class T, int MODS>
DEVICE void produce(const Smem<T>& sm, const Work<T>& work, TileQueue queue, const TensorMap& map_q,
                    const TensorMap& map_k, const TensorMap& map_v, int Tq, int Tk, int causal, const VariantArgs& va) {
    prefetch_tensor_map(map_q);
    prefetch_tensor_map(map_k);
    prefetch_tensor_map(map_v);
    RingPos<T::STAGES> kpos, vpos;
    u32 q_phase = 0;
    // the next tile is claimed once the loads of this one are issued
    for (int w = blockIdx.x; w < work.count; w = queue.producer_next(w)) {
        int m0, bh;
        work.tile(w, m0, bh);
        if constexpr ((MODS & MOD_VARIANT) == 0) {
            const int n_tiles = kv_tiles<T::BLOCK_M, T::BLOCK_N>(m0, Tq, Tk, causal);
            if (n_tiles == 0) continue;           // no row of the tile sees a key: the consumers write zeros
            load_q(sm, map_q, q_phase, m0, bh);
            const int kvh = bh / va.group;        // the kv head of query head bh
            for (int j = 0; j <= n_tiles; ++j) {
                if (j < n_tiles) load_kv<T>(map_k, kpos, sm.k_full, sm.k_empty, sm.sK(kpos.s), j, kvh);
                if (j > 0) load_kv<T>(map_v, vpos, sm.v_full, sm.v_empty, sm.sV(vpos.s), j - 1, kvh);
            }
        } else {                                  // the same over key_tiles' tiles j, from kv head bh / group
            const KeyTiles<MODS> kt = key_tiles<T, MODS>(m0, bh, Tq, Tk, va);
            if (kt.n == 0) continue;
            load_q(sm, map_q, q_phase, m0, bh);
            for (int i = 0, j = kt.first(), prev = 0; i <= kt.n; ++i, prev = j, j = kt.after(j)) {
                if (i < kt.n) load_kv<T>(map_k, kpos, sm.k_full, sm.k_empty, sm.sK(kpos.s), j, bh / va.group);
                if (i > 0) load_kv<T>(map_v, vpos, sm.v_full, sm.v_empty, sm.sV(vpos.s), prev, bh / va.group);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The consumers: warpgroups 1 .. C, 64 query rows each
// ---------------------------------------------------------------------------------------------

// One consumer warpgroup's hold on the shared memory: its rows of sQ, the ring slots of the next K and the next V
// tile, and its turns at the tensor cores.
template <class T, bool BF16> struct Consumer {
    const Smem<T>& sm;
    u32 sQ_wg;                         // this warpgroup's rows of sQ, in each half
    int lane;
    Turns<T::CONSUMERS> turns;
    RingPos<T::STAGES> kpos, vpos;     // the slots of the next K and of the next V to use

    DEVICE void release(u64* empty, int s) const {
        if (lane == 0) mbar_arrive(smem_addr(&empty[s]));
    }
    // S = Q K^T of the next K tile on its own (one turn), waited for; K's slot handed back
    DEVICE void scores(float (&acc_s)[T::S_ACC]) {
        mbar_wait(smem_addr(&sm.k_full[kpos.s]), kpos.phase);
        turns.begin();
        issue_qk<T, BF16>(acc_s, sQ_wg, sm.sK(kpos.s));
        turns.end();
        wgmma_wait<0>();
        wgmma_pin(acc_s);
        release(sm.k_empty, kpos.s);
        kpos.advance();
    }
    // O += P V of the next V tile on its own (one turn), waited for; V's slot handed back
    DEVICE void accumulate(float (&acc_o)[T::O_ACC], const u32 (&p)[T::P_REGS]) {
        mbar_wait(smem_addr(&sm.v_full[vpos.s]), vpos.phase);
        turns.begin();
        issue_pv<T, BF16>(acc_o, p, sm.sV(vpos.s));
        turns.end();
        wgmma_wait<0>();                               // the tensor cores have finished reading V
        wgmma_pin(acc_o);
        release(sm.v_empty, vpos.s);
        vpos.advance();
    }
};

// The plain loop (OVERLAP = 0) over one work tile's K/V tiles (kt: DenseTiles or KeyTiles, rows: NoRows or
// VariantRows): each step waits for the one before it.
template <class T, bool BF16, class Tiles, class Rows>
DEVICE void attend_plain(Consumer<T, BF16>& c, float (&acc_s)[T::S_ACC], u32 (&p)[T::P_REGS], float (&alpha)[2],
                         float (&acc_o)[T::O_ACC], float (&row_max)[2], float (&row_sum)[2], const RowInfo& r,
                         const Tiles& kt, const Rows& rows) {
    for (int i = 0, j = kt.first(); i < kt.n; ++i, j = kt.after(j)) {
        c.scores(acc_s);                               // S_j = Q K_j^T
        tile_softmax(acc_s, row_max, row_sum, alpha, r, kt, rows, j);
        rescale(acc_o, alpha);
        to_p<BF16>(acc_s, p);
        c.accumulate(acc_o, p);                        // O += P_j V_j
    }
    if (kt.n > 0) c.release(c.sm.q_empty, 0);
}

// The pipelined loop (OVERLAP = 1, at least one tile), software pipelining inside the warpgroup: while the tensor
// cores compute O += P_{j-1} V_{j-1}, the warpgroup runs the softmax of S_j (j: the tiles of kt in turn, j - 1 the one
// before). The first K/V tile only fills the pipeline: its S and softmax.
template <class T, bool BF16, class Tiles, class Rows>
DEVICE void attend_pipelined(Consumer<T, BF16>& c, float (&acc_s)[T::S_ACC], u32 (&p)[T::P_REGS],
                             float (&alpha)[2], float (&acc_o)[T::O_ACC], float (&row_max)[2], float (&row_sum)[2],
                             const RowInfo& r, const Tiles& kt, const Rows& rows) {
    c.scores(acc_s);
    tile_softmax(acc_s, row_max, row_sum, alpha, r, kt, rows, kt.first());   // alpha = 0: O is still 0
    to_p<BF16>(acc_s, p);
    for (int i = 1, j = kt.after(kt.first()); i < kt.n; ++i, j = kt.after(j)) {
        mbar_wait(smem_addr(&c.sm.k_full[c.kpos.s]), c.kpos.phase);   // K_j
        mbar_wait(smem_addr(&c.sm.v_full[c.vpos.s]), c.vpos.phase);   // V_{j-1}
        c.turns.begin();
        issue_qk<T, BF16>(acc_s, c.sQ_wg, c.sm.sK(c.kpos.s));         // S_j = Q K_j^T          (commit group 1)
        issue_pv<T, BF16>(acc_o, p, c.sm.sV(c.vpos.s));               // O += P_{j-1} V_{j-1}   (commit group 2)
        c.turns.end();
        wgmma_wait<1>();                               // group 1 is done; P V may still be running
        wgmma_pin(acc_s);
        c.release(c.sm.k_empty, c.kpos.s);
        c.kpos.advance();
        tile_softmax(acc_s, row_max, row_sum, alpha, r, kt, rows, j);
        wgmma_wait<0>();                               // P_{j-1} V_{j-1} is done: O and P are free again
        wgmma_pin(acc_o);
        wgmma_pin(p);
        c.release(c.sm.v_empty, c.vpos.s);
        c.vpos.advance();
        rescale(acc_o, alpha);
        to_p<BF16>(acc_s, p);
    }
    c.release(c.sm.q_empty, 0);                        // every S of the tile is done: the producer may load Q
    c.accumulate(acc_o, p);                            // the last K/V tile's O += P V
}

// The epilogue: o = O / l, lse = (m + log2 l) ln 2 for the thread's two rows, rows < Tq only (l reduced over the quad).
template <class T, bool BF16>
DEVICE void store_o_lse(const float (&acc_o)[T::O_ACC], const float (&row_max)[2], const float (&row_sum)[2],
                        const RowInfo& r, u16* o, float* lse, int bh, int Tq) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float l = quad_sum(row_sum[h]);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // a row that saw no key: o = 0
        if (r.row[h] < Tq) {
            const long long row = static_cast<long long>(bh) * Tq + r.row[h];
            u32* const dst = reinterpret_cast<u32*>(o + row * T::HEAD_DIM + 2 * r.t);
#pragma unroll
            for (int i = 0; i < T::O_ACC / 4; ++i)     // columns 8 i + 2 t, + 1
                dst[4 * i] = pack2<BF16>(acc_o[4 * i + 2 * h] * inv, acc_o[4 * i + 2 * h + 1] * inv);
            if (lse != nullptr && r.t == 0)
                lse[row] = l > 0.0f ? (row_max[h] + __log2f(l)) * LN2 : NEG_INF;
        }
    }
}

// A consumer warpgroup's loop over the CTA's work tiles: its 64 query rows of each, against all the tile's keys.
template <class T, bool BF16, int MODS>
DEVICE void consume(const Smem<T>& sm, const Work<T>& work, TileQueue queue, int cw, u16* o, float* lse, int Tq,
                    int Tk, float scale_log2, int causal, const VariantArgs& va) {
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    Consumer<T, BF16> c{sm, sm.sQ + cw * WGMMA_M * SWIZZLE_BYTES, lane, {cw}};
    u32 q_phase = 0;
    c.turns.start();
    for (int w = blockIdx.x; w < work.count; w = queue.consumer_next(w, lane)) {
        int m0, bh;
        work.tile(w, m0, bh);
        const auto kt = work_tiles<T, MODS>(m0, bh, Tq, Tk, causal, va);
        RowInfo r;
        r.first_row = m0 + cw * WGMMA_M;
        r.row[0] = r.first_row + 16 * warp + lane / 4;
        r.row[1] = r.row[0] + 8;
        r.t = lane % 4;
        r.Tk = Tk;
        r.diag = Tk - Tq;
        r.causal = causal;
        r.scale_log2 = scale_log2;
        const auto rows = consumer_rows<MODS>(r, bh, Tq, va);

        float acc_o[T::O_ACC];
#pragma unroll
        for (int i = 0; i < T::O_ACC; ++i) acc_o[i] = 0.0f;
        float row_max[2] = {NEG_INF, NEG_INF};         // m, in log2 units of the scaled scores
        float row_sum[2] = {0.0f, 0.0f};               // l, this thread's partial sum (reduced at the end)
        float acc_s[T::S_ACC];                         // S, then p, of the K/V tile in hand
        u32 p[T::P_REGS];                              // P in 16 bits, the A operand of O += P V
        float alpha[2];                                // (declared here, not in attend_*: the same register use)
        if (kt.n > 0) {
            mbar_wait(smem_addr(sm.q_full), q_phase);
            q_phase ^= 1;
        }
        if (OVERLAP && kt.n > 0)
            attend_pipelined(c, acc_s, p, alpha, acc_o, row_max, row_sum, r, kt, rows);
        else
            attend_plain(c, acc_s, p, alpha, acc_o, row_max, row_sum, r, kt, rows);
        store_o_lse<T, BF16>(acc_o, row_max, row_sum, r, o, lse, bh, Tq);
    }
    c.turns.finish();
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ---------------------------------------------------------------------------------------------
// The kernel body, shared by the four entry points (dtype x D)
// ---------------------------------------------------------------------------------------------
template <int D, bool BF16, int MODS>
DEVICE void attention_forward(const TensorMap& map_q, const TensorMap& map_k, const TensorMap& map_v, u16* o,
                              float* lse, int Tq, int Tk, int heads, float scale_log2, int causal,
                              const VariantArgs& va, int* tile_counter) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using T = Shape<D>;
    extern __shared__ unsigned char smem_raw[];
    __shared__ alignas(8) u64 q_full;
    __shared__ alignas(8) u64 q_empty;
    __shared__ alignas(8) u64 k_full[T::STAGES];
    __shared__ alignas(8) u64 v_full[T::STAGES];
    __shared__ alignas(8) u64 k_empty[T::STAGES];
    __shared__ alignas(8) u64 v_empty[T::STAGES];

    // ---- set-up: the work tiles, the shared memory aligned, the barriers initialised ----------------------------
    const int m_count = (Tq + T::BLOCK_M - 1) / T::BLOCK_M;
    const int work_count = m_count * heads;
    const long long fit = L2_SECTION_BYTES / (4ll * Tk * D) * va.group;  // Work::section: the heads whose K and V
    // fit, 1..heads (a group of heads shares one K and V)
    const int section = fit < 1 ? 1 : fit > heads ? heads : static_cast<int>(fit);
    const u32 base = (smem_addr(smem_raw) + SMEM_ALIGN - 1) & ~u32(SMEM_ALIGN - 1);
    const int warpgroup = threadIdx.x / WARPGROUP;
    if (threadIdx.x == 0) {
        mbar_init(smem_addr(&q_full), 1);
        mbar_init(smem_addr(&q_empty), T::CONSUMER_WARPS);
        for (int s = 0; s < T::STAGES; ++s) {
            mbar_init(smem_addr(&k_full[s]), 1);
            mbar_init(smem_addr(&v_full[s]), 1);
            mbar_init(smem_addr(&k_empty[s]), T::CONSUMER_WARPS);
            mbar_init(smem_addr(&v_empty[s]), T::CONSUMER_WARPS);
        }
        TileQueue::init(T::CONSUMER_WARPS);
        mbar_init_fence();  // the initialised barriers, visible to TMA (the async proxy) and to the other threads
    }
    __syncthreads();

    // ---- warp specialisation: warpgroup 0 loads, the others compute ---------------------------------------------
    // (each side builds its own Smem, Work and TileQueue views: built once before the branch, they change the
    // registers the compiler assigns, kernels/hopper/README.md)
    if (warpgroup == 0) {
        regs_decrease<T::PRODUCER_REGS>();
        const Smem<T> sm{base, base + T::Q_BYTES, &q_full, &q_empty, k_full, v_full, k_empty, v_empty};
        const Work<T> work{m_count, work_count, tile_counter != nullptr ? section : 0};
        const TileQueue queue{tile_counter != nullptr, tile_counter};
        if (threadIdx.x == 0) produce<T, MODS>(sm, work, queue, map_q, map_k, map_v, Tq, Tk, causal, va);
    } else {
        regs_increase<T::CONSUMER_REGS>();
        const Smem<T> sm{base, base + T::Q_BYTES, &q_full, &q_empty, k_full, v_full, k_empty, v_empty};
        const Work<T> work{m_count, work_count, tile_counter != nullptr ? section : 0};
        const TileQueue queue{tile_counter != nullptr, nullptr};
        consume<T, BF16, MODS>(sm, work, queue, warpgroup - 1, o, lse, Tq, Tk, scale_log2, causal, va);
    }
#else
    __trap();  // built for a target without wgmma/TMA (the launcher builds this file for sm_90a only)
#endif
}

// ---------------------------------------------------------------------------------------------
// Entry points: float16 or bfloat16, D = 64 or 128, all with the signature of the header's "Kernels"
// ---------------------------------------------------------------------------------------------
#ifndef VARIANT_MODS
#define HOPPER_ATTN_PARAMS                                                                                          \
    const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,                               \
    const __grid_constant__ TensorMap map_v, u16* o, float* lse, int Tq, int Tk, int heads, float scale_log2,         \
    int causal, int* tile_counter, int group
#define HOPPER_ATTN_ARGS                                                                                            \
    map_q, map_k, map_v, o, lse, Tq, Tk, heads, scale_log2, causal,                                                 \
    VariantArgs{nullptr, nullptr, nullptr, nullptr, 0, group, 0, 0, 0, 0.0f, 0.0f}, tile_counter

extern "C" __global__ void __launch_bounds__(Shape<64>::THREADS, 1) hopper_attn_f16_d64(HOPPER_ATTN_PARAMS) {
    attention_forward<64, false, 0>(HOPPER_ATTN_ARGS);
}
extern "C" __global__ void __launch_bounds__(Shape<128>::THREADS, 1) hopper_attn_f16_d128(HOPPER_ATTN_PARAMS) {
    attention_forward<128, false, 0>(HOPPER_ATTN_ARGS);
}
extern "C" __global__ void __launch_bounds__(Shape<64>::THREADS, 1) hopper_attn_bf16_d64(HOPPER_ATTN_PARAMS) {
    attention_forward<64, true, 0>(HOPPER_ATTN_ARGS);
}
extern "C" __global__ void __launch_bounds__(Shape<128>::THREADS, 1) hopper_attn_bf16_d128(HOPPER_ATTN_PARAMS) {
    attention_forward<128, true, 0>(HOPPER_ATTN_ARGS);
}
extern "C" __global__ void __launch_bounds__(Shape<256>::THREADS, 1) hopper_attn_f16_d256(HOPPER_ATTN_PARAMS) {
    attention_forward<256, false, 0>(HOPPER_ATTN_ARGS);
}
extern "C" __global__ void __launch_bounds__(Shape<256>::THREADS, 1) hopper_attn_bf16_d256(HOPPER_ATTN_PARAMS) {
    attention_forward<256, true, 0>(HOPPER_ATTN_ARGS);
}
#else
// The variant entry points, built instead of the four above with -D VARIANT_MODS = a sum of MOD_DOCS, MOD_SOFTCAP and
// MOD_ALIBI (the switches of the build): hopper_attn_variants_{f16,bf16}_d{64,128}, the header's "Variant kernels".
static_assert(VARIANT_MODS >= 0 && VARIANT_MODS < MOD_VARIANT, "VARIANT_MODS: a sum of MOD_DOCS, MOD_SOFTCAP and "
                                                                "MOD_ALIBI");
// The dynamic schedule's producer fits its registers beside key_tiles only without documents and at D <= 128; the
// other builds take the argument and run the round robin.
#define VARIANT_DYNAMIC(D) ((VARIANT_MODS & MOD_DOCS) == 0 && (D) <= 128)
#define HOPPER_ATTN_VARIANTS(NAME, D, BF16)                                                                         \
    __global__ void __launch_bounds__(Shape<D>::THREADS, 1)                                                         \
    NAME(const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,                          \
         const __grid_constant__ TensorMap map_v, u16* o, float* lse, int Tq, int Tk, int heads, float scale_log2,  \
         const int* doc_q, const int* doc_k, const signed char* classes, const float* alibi_slopes, int Hq,         \
         int group, int left, int right, int prefix, float cap_in, float cap_out, int* tile_counter) {              \
        attention_forward<D, BF16, VARIANT_MODS | MOD_VARIANT>(                                                     \
            map_q, map_k, map_v, o, lse, Tq, Tk, heads, scale_log2, 0,                                              \
            VariantArgs{doc_q, doc_k, classes, alibi_slopes, Hq, group, left, right, prefix, cap_in, cap_out},      \
            VARIANT_DYNAMIC(D) ? tile_counter : nullptr);                                                           \
    }
extern "C" {
HOPPER_ATTN_VARIANTS(hopper_attn_variants_f16_d64, 64, false)
HOPPER_ATTN_VARIANTS(hopper_attn_variants_f16_d128, 128, false)
HOPPER_ATTN_VARIANTS(hopper_attn_variants_bf16_d64, 64, true)
HOPPER_ATTN_VARIANTS(hopper_attn_variants_bf16_d128, 128, true)
HOPPER_ATTN_VARIANTS(hopper_attn_variants_f16_d256, 256, false)
HOPPER_ATTN_VARIANTS(hopper_attn_variants_bf16_d256, 256, true)
}
#endif
