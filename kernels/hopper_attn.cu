// hopper_attn.cu -- FlashAttention-3-style attention forward on Hopper: TMA loads, wgmma from shared memory for
// S = Q K^T, wgmma with P in registers for O += P V (fp16/bf16 in, float32 accumulation, float32 LSE).
//
// Checked on an H100 against the float64 reference (tests/test_attention_gpu.py and test_hopper_attn_gpu.py; the
// variant hopper_fa3, in kernels.STAGING) and clean under compute-sanitizer's memcheck, racecheck and synccheck;
// tests/test_hopper_attn_compile.py checks its SASS.
//
// What it computes
//   o[b, h] = softmax(scale q[b, h] k[b, h]^T + mask) v[b, h] and lse[b, h, i] = log sum_j exp(scale q_i . k_j)
//   (natural log) for q (B, H, Tq, D), k and v (B, H, Tk, D), row-major, D = 64 or 128, float16 or bfloat16.
//   Causal masking is bottom-right aligned: query i sees key j when j <= i + Tk - Tq. A query row that sees no key
//   gives o = 0 and lse = -inf. Same contract as flash2_mma.cu.
//
// Where it sits in the course
//   flash2_mma.cu    FlashAttention-2 on mma.sync: every warp loads its own operands (cp.async, ldmatrix) and
//                    multiplies 16 x 8 x 16 pieces; loads and math are issued by the same warps.
//   hopper_gemm.cu   Hopper's engines on a plain GEMM: TMA fills a ring of shared-memory slots, a producer warp only
//                    loads, consumer warpgroups only multiply, wgmma reads both operands from shared memory.
//   this file        the attention loop on those engines, as FlashAttention-3 does it: per K/V tile, S = Q K^T by wgmma
//                    (both operands in shared memory), the online softmax on S's accumulator registers, then
//                    O += P V by wgmma with P taken straight from registers (the "register-A" form), V from shared
//                    memory read in its natural (keys, d) layout through an MN-major ("transposed B") descriptor.
//                    Two schedules keep the tensor cores busy while the softmax runs (next section).
//   not here         what FlashAttention-3 also has: separate barriers for K and V, a TMA store of O, persistent CTAs
//                    that overlap one tile's epilogue with the next tile's loads, and FP8.
//
// Algorithm (one CTA per (BLOCK_M = 128 query rows, head, batch); grid (ceil(Tq / 128), H, B), last query tile first)
//
//   producer (warpgroup 0, one thread)              consumer warpgroups 1, 2 (query rows 0-63 and 64-127 of the CTA)
//     TMA  Q tile -> sQ            (q_full)            wait q_full
//     for j in 0 .. n_tiles-1:                         for j in 0 .. n_tiles-1:
//       wait  empty[s]                                   wait full[s]
//       expect full[s] += 2 * KV_TILE_BYTES              S = Q K_j^T         D/16 wgmma m64n128k16, SS form
//       TMA  K_j -> sK[s], V_j -> sV[s]                  scale, mask, online softmax on S (exp2), O *= alpha
//       s = s + 1 mod STAGES                             P = 16-bit(S) in registers
//                                                        O += P V_j          8 wgmma m64nDk16, RS form
//                                                        arrive empty[s]  (one arrival per consumer warp)
//                                                      o = O / l, lse = (m + log2 l) ln 2  -> global (rows < Tq)
//
//   That consumer loop is the plain schedule (OVERLAP = 0): every step waits for the one before, so while a warpgroup
//   computes its softmax (exp2 on the special function unit, 8192 per tile) its tensor-core work is done. Two
//   schedules, both on by default, fill that gap (kernels/hopper_attn.py can build the kernel without either, to
//   measure them; the results agree to rounding):
//
//   OVERLAP = 1, software pipelining inside a warpgroup. S_j = Q K_j^T and O += P_{j-1} V_{j-1} are issued together
//     as two commit groups; wgmma.wait_group 1 returns when the first is done, and the softmax of S_j runs while the
//     second is still on the tensor cores:
//         S_0 = Q K_0^T; wait; softmax(S_0) -> P_0
//         for j = 1 .. n_tiles - 1:
//             issue S_j = Q K_j^T;  issue O += P_{j-1} V_{j-1}
//             wait_group 1 (S_j ready);  softmax(S_j)          <- under the P V products
//             wait_group 0;  release slot j - 1;  O *= alpha_j;  P_j = 16-bit(p_j)
//         O += P_{n-1} V_{n-1}; wait; release the last slot
//     P_{j-1} V_{j-1} lands in O before it is scaled by alpha_j = exp2(m_{j-1} - m_j), which is right: both P_{j-1}
//     and the old O are relative to m_{j-1}. A slot is now held for two iterations, hence 3 stages for D = 128.
//   PINGPONG = 1, the two consumer warpgroups take turns at issuing their wgmmas (two named barriers, see Turns), so
//     one warpgroup's products run while the other computes its softmax instead of both competing for the tensor
//     cores at the same moments.
//
//   n_tiles = ceil(n_end / BLOCK_N) with n_end = Tk, or under the causal mask the first key that no row of the CTA
//   sees: min(Tk, last_row + Tk - Tq + 1), last_row = min(m0 + BLOCK_M, Tq) - 1. Tiles wholly above the diagonal are
//   never loaded. The producer and both consumers compute n_tiles with the same function (kv_tiles below), so they
//   agree on how many times the ring turns. n_tiles = 0 (every row of the CTA sees no key: Tq > Tk under the causal
//   mask) skips the Q load too; the consumers then write o = 0 and lse = -inf without waiting on anything.
//
// Shared memory (dynamic, aligned up to 1024 bytes)
//   [sQ: BLOCK_M x D][stage 0: sK BLOCK_N x D, sV BLOCK_N x D][stage 1 ...] ... STAGES stages, 16-bit elements.
//   Every tile is stored in the 128-byte swizzle (TMA's CU_TENSOR_MAP_SWIZZLE_128B, wgmma's swizzle mode 1): a row of
//   64 elements (128 bytes) is eight 16-byte chunks, chunk c of row r stored at position c ^ (r % 8); see
//   hopper_gemm.cu for the picture. A 128-byte swizzle row holds at most 64 16-bit elements, so a D = 128 tile is
//   stored as two column halves, each its own R x 64 swizzled block (R rows x 128 bytes), half h at h * R * 128 bytes;
//   one TMA box (64 columns x R rows) fills one half. D = 64 has one half.
//
//       sK (D = 128, BLOCK_N = 128):   [ keys 0..127, d 0..63   : 16 KB ][ keys 0..127, d 64..127 : 16 KB ]
//
// S = Q K^T: both operands K-major (d contiguous), as in hopper_gemm.cu (imm-trans-a = imm-trans-b = 0)
//   k-step kk (d elements 16 kk .. 16 kk + 15) lies in half kk / 4 at byte 32 (kk % 4) of each row, so the start
//   address of both descriptors is  tile + (kk / 4) * rows * 128 + (kk % 4) * 32;  stride byte offset 1024 (from one
//   8-row group to the next), leading byte offset unused (the 16-element k extent lies inside one 128-byte row).
//   Consumer cw's 64 rows of sQ start 64 cw rows = 8 KB further in each half.
//
// O += P V: V is (keys, d) with d contiguous; in O = P V the reduction (K) axis is the key and N is d, so V is a
//   B operand whose N axis is contiguous: "N-major" (= MN-major, the transposed B of the PTX ISA), imm-trans-b = 1.
//   The canonical MN-major 128-byte-swizzle layout (PTX ISA "Shared Memory Matrix Layout";
//   CUTLASS writes it ((8 x 8, n), (8, k)) : ((1 x 8, LBO), (64, SBO)) in elements) is:
//     - along N: 64 contiguous elements = one 128-byte swizzled row; the next 64 N-elements lie LBO bytes further
//     - along K: 8 rows of 128 bytes form one 1024-byte swizzle atom; the next 8 K-rows lie SBO bytes further
//   Our sV half-blocks are exactly that: one key per 128-byte row, keys r and r + 8 1024 bytes apart (SBO = 1024),
//   d columns 64..127 in the second half, BLOCK_N * 128 = 16 KB further (LBO = 16384; unused when D = 64, where one
//   64-element row covers all of N). k-step kk (keys 16 kk .. 16 kk + 15) starts at row 16 kk: sV + kk * 2048, a
//   multiple of 1024, so the descriptor's base offset stays 0. Note that the meaning of the two offset fields swaps
//   compared with the K-major case: there SBO walks the M/N axis and LBO is unused.
//
// The register-A operand of wgmma
//   For m64nNk16 with 16-bit A in registers, each thread holds four 32-bit registers a0..a3 of the 64 x 16 A tile:
//   warp w of the warpgroup owns rows 16 w .. 16 w + 15, lane = 4 g + t:
//     a0 = A[16 w + g][2 t, 2 t + 1]      a1 = A[16 w + g + 8][2 t, 2 t + 1]
//     a2 = A[16 w + g][2 t + 8, + 9]      a3 = A[16 w + g + 8][2 t + 8, + 9]       (low half = the lower column)
//   (the mma.sync m16n8k16 A fragment, one per warp). The float32 accumulator of S = Q K^T (m64n128) gives thread
//   (w, g, t) the values
//     s[4 i + 0, 1] = S[16 w + g][8 i + 2 t, + 1]      s[4 i + 2, 3] = S[16 w + g + 8][8 i + 2 t, + 1]
//   so for k-step kk of P V (keys 16 kk .. 16 kk + 15 = column groups i = 2 kk and 2 kk + 1):
//     a0 = pack(s[8 kk + 0], s[8 kk + 1])   a1 = pack(s[8 kk + 2], s[8 kk + 3])
//     a2 = pack(s[8 kk + 4], s[8 kk + 5])   a3 = pack(s[8 kk + 6], s[8 kk + 7])
//   i.e. register j of k-step kk is pack(s[8 kk + 2 j], s[8 kk + 2 j + 1]): P needs no shuffle at all, only a
//   conversion to 16 bits in place. (This identity is why FlashAttention-3 keeps P in registers.)
//
// Online softmax (per row, in log2 units: x = scale * log2(e) * s, computed in registers on S's fragments)
//   m' = max(m, max_j x_j);  alpha = exp2(m - m');  p_j = exp2(x_j - m');  l' = alpha l + sum_j p_j;  O' = alpha O
//   A thread holds 32 of a row's 128 scores per tile; the row max is completed across the four threads t = 0..3 of
//   a quad with two shuffles. l stays a per-thread partial sum (every thread of the quad scales it by the same
//   alpha) and is reduced across the quad once, at the end. While a row has seen no visible key, m = -inf and the
//   exponentials are taken against 0 instead, so that no -inf - -inf = NaN appears: p = 0, alpha = 0, O stays 0.
//   Masked scores (key >= Tk, or above the causal diagonal) are set to -inf; only tiles that touch the Tk edge or,
//   under the causal mask, the diagonal of this warpgroup's rows are masked.
//
// mbarriers and their phases (as in hopper_gemm.cu)
//   q_full: 1 arrival (the producer's arrive.expect_tx of Q_BYTES) + Q_BYTES of TMA; waited once, parity 0.
//   full[s]: 1 arrival + 2 * KV_TILE_BYTES (K and V); consumers wait parity `phase`.
//   empty[s]: one arrival per consumer warp (8); the producer waits parity `phase ^ 1` (a fresh barrier reports the
//   phase before its first as complete, so the first pass through the ring does not wait). Both sides flip `phase`
//   whenever s wraps to 0. TMA counts the whole box, including the parts past Tq / Tk that it fills with zeros.
//
// Launch configuration
//   grid  = (ceil(Tq / BLOCK_M), H, B): blockIdx.x counts query tiles from the last (the longest under the mask)
//   block = 384 threads: warpgroup 0 the producer (one thread issues TMA, the rest idle), warpgroups 1, 2 consumers
//   dynamic shared memory = BLOCK_M D 2 + STAGES 2 BLOCK_N D 2 + 1024 (alignment slack):
//     D = 64: STAGES = 4: 16384 + 4 * 32768 + 1024 = 148480 bytes;  D = 128: STAGES = 3: 32768 + 3 * 65536 + 1024 =
//     230400 bytes (static: the mbarriers). SMEM_BYTES below; kernels/hopper_attn.py mirrors it (a test ties them).
//   registers: __launch_bounds__(384, 1) gives 168 per thread; setmaxnreg moves them from the producer warpgroup
//   (down to 24) to the consumers (up to 240), which hold S (64 float32), O (D / 2 float32) and P (32 x 32-bit).
//   Three CUtensorMaps (Q, K, V: (D, T, B*H) 16-bit tensors read in boxes of 64 x 128 with the 128-byte swizzle,
//   built on the host by cuTensorMapEncodeTiled) are `const __grid_constant__` parameters.
//
// Limits (checked by kernels/hopper_attn.py before launch)
//   Hopper only: built for sm_90a; any other target (the course's compile test for sm_80..sm_90, `nvcc -c` alone)
//   leaves the Hopper code out and the entry points are stubs that trap. D in {64, 128}; q, k, v C-contiguous and
//   16-byte aligned (TMA); any Tq, Tk >= 1 (TMA zero-fills the rows of a box past the end, stores are guarded).
//
// Numerics
//   16-bit products, float32 sums (wgmma accumulators), softmax in float32 with ex2.approx.ftz; P rounded to the
//   inputs' 16-bit type (round to nearest) before P V, l summed from the unrounded p, o rounded once at the end.

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define DEVICE __device__ __forceinline__

// ---- tile sizes (the launcher passes them with -D; these defaults are what `nvcc -c` alone sees) ----
#ifndef BLOCK_M
#define BLOCK_M 128
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef STAGES_D64
#define STAGES_D64 4
#endif
#ifndef STAGES_D128
#define STAGES_D128 3
#endif
#ifndef OVERLAP
#define OVERLAP 1      // 1: the softmax of tile j runs while O += P V of tile j - 1 is on the tensor cores
#endif
#ifndef PINGPONG
#define PINGPONG 1     // 1: the two consumer warpgroups take turns at the tensor cores (named barriers)
#endif

constexpr int ELEM_BYTES = 2;                               // float16 / bfloat16
constexpr int WARPGROUP = 128;                              // 4 warps issue one wgmma together
constexpr int WGMMA_M = 64, WGMMA_K = 16;
constexpr int CONSUMERS = BLOCK_M / WGMMA_M;                // consumer warpgroups, 64 query rows each
constexpr int THREADS = WARPGROUP * (1 + CONSUMERS);        // + 1 producer warpgroup
constexpr int SWIZZLE_BYTES = 128;                          // one 128-byte swizzle row
constexpr int SWIZZLE_ELEMS = SWIZZLE_BYTES / ELEM_BYTES;   // 64 elements: one TMA box's width, one tile "half"
constexpr int SWIZZLE_ATOM = 8 * SWIZZLE_BYTES;             // 8 rows: the period of the XOR pattern (1024 bytes)
constexpr int SMEM_ALIGN = SWIZZLE_ATOM;                    // every tile starts on a swizzle-atom boundary
constexpr int S_ACC = WGMMA_M * BLOCK_N / WARPGROUP;        // float32 S accumulators per consumer thread (64)
constexpr int P_REGS = S_ACC / 2;                           // P as 16-bit pairs (32 registers)
constexpr int PV_STEPS = BLOCK_N / WGMMA_K;                 // k-steps of O += P V (8)
constexpr int SMEM_LIMIT = 227 * 1024;                      // static + dynamic shared memory a block may have
constexpr int PRODUCER_REGS = 24;                          // setmaxnreg: the producer warpgroup gives registers up
constexpr int CONSUMER_REGS = 240;                          // ... and the consumers take them
constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;        // what __launch_bounds__(THREADS, 1) leaves: 168

static_assert(BLOCK_M == 128, "two consumer warpgroups of 64 rows (setmaxnreg's budget assumes 384 threads)");
static_assert(BLOCK_N == 128, "S is one m64n128k16 wgmma chain per warpgroup; the TMA boxes of Q, K, V are alike");
static_assert(BLOCK_M == BLOCK_N, "one tensor-map box shape (64 x 128) serves Q, K and V");
static_assert(PV_STEPS * 4 == P_REGS, "each P V k-step takes four 32-bit A registers");
static_assert(PRODUCER_REGS % 8 == 0 && CONSUMER_REGS % 8 == 0 && PRODUCER_REGS >= 24 && CONSUMER_REGS <= 256,
              "setmaxnreg takes multiples of 8 in [24, 256]");
static_assert(WARPGROUP * (PRODUCER_REGS + CONSUMERS * CONSUMER_REGS) <= THREADS * LAUNCH_REGS,
              "the consumers cannot take more registers than the producer gives up");

// The per-head-dimension sizes: D = 64 (one 64-column half per tile) or 128 (two halves).
template <int D> struct Shape {
    static_assert(D == 64 || D == 128, "head dimension 64 or 128");
    static constexpr int HALVES = D / SWIZZLE_ELEMS;                 // 64-column swizzled blocks per tile row
    static constexpr int STAGES = D == 64 ? STAGES_D64 : STAGES_D128;
    static constexpr int Q_BYTES = BLOCK_M * D * ELEM_BYTES;         // what TMA delivers to q_full
    static constexpr int KV_TILE_BYTES = BLOCK_N * D * ELEM_BYTES;   // one K or one V tile
    static constexpr int STAGE_BYTES = 2 * KV_TILE_BYTES;            // K and V: what TMA delivers to full[s]
    static constexpr int SMEM_BYTES = Q_BYTES + STAGES * STAGE_BYTES + SMEM_ALIGN;  // the launcher's request
    static constexpr int O_ACC = WGMMA_M * D / WARPGROUP;           // float32 O accumulators per thread (32 or 64)
    static constexpr int QK_STEPS = D / WGMMA_K;                    // k-steps of S = Q K^T (4 or 8)
    static_assert(STAGES >= 2 && STAGES <= 8, "the ring needs 2..8 slots");
    static_assert(SMEM_BYTES + 2 * 8 * (STAGES + 1) <= SMEM_LIMIT, "Q, the ring and the barriers fit in 227 KB");
    static_assert(Q_BYTES % SMEM_ALIGN == 0 && KV_TILE_BYTES % SMEM_ALIGN == 0, "tiles start on 1024-byte bounds");
};

// A CUtensorMap: 128 opaque bytes, 64-byte aligned, written by cuTensorMapEncodeTiled on the host (the launcher).
struct alignas(64) TensorMap {
    u64 opaque[16];
};

// ---------------------------------------------------------------------------------------------
// PTX wrappers (sm_90a)
// ---------------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int CONSUMER_WARPS = CONSUMERS * WARPGROUP / 32;  // arrivals that release a ring slot (8)
constexpr float LN2 = 0.6931471805599453f;
#define NEG_INF __int_as_float(0xff800000)                  // -inf (NVRTC has no math.h for INFINITY)

DEVICE u32 smem_addr(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

// mbarrier: init with an arrival count; arrive; arrive and announce the bytes TMA will deliver; wait on a parity.
DEVICE void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
DEVICE void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
DEVICE void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
DEVICE void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {  // try_wait suspends the thread for a while inside the instruction; the loop does not spin hard
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

// TMA: one box of a 3-D tensor (coordinates innermost first: column, row, batch*head) into shared memory, its bytes
// counted against the mbarrier `bar`. The tensor map lives in parameter memory; TMA takes its generic address.
DEVICE void tma_load_3d(u32 dst, const TensorMap& map, int c0, int c1, int c2, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n"
        ::"r"(dst), "l"(reinterpret_cast<u64>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
DEVICE void prefetch_tensor_map(const TensorMap& map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(&map)) : "memory");
}

// setmaxnreg: all threads of a warpgroup change their register allocation together.
template <int N> DEVICE void regs_decrease() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> DEVICE void regs_increase() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

// wgmma bookkeeping: fence (register writes of ordinary instructions, to accumulators or to a register A operand,
// are visible to the next wgmma), commit the wgmmas issued so far as one group, wait until at most N groups run.
DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> DEVICE void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// The compiler must neither move nor copy registers that a running wgmma owns (accumulators, a register A operand)
// across a fence or wait: an empty asm that "reads and writes" them pins them in place.
template <int N> DEVICE void pin(float (&x)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(x[i])::"memory");
}
template <int N> DEVICE void pin(u32 (&x)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(x[i])::"memory");
}

// Shared-memory matrix descriptors (64 bits; PTX ISA "Matrix Descriptor Format"; the fields are described in
// hopper_gemm.cu): start address >> 4 in bits 0-13, leading byte offset >> 4 in 16-29, stride byte offset >> 4 in
// 32-45, base offset 0 in 49-51 (every tile starts on a 1024-byte boundary), swizzle mode 1 = 128 bytes in 62-63.
DEVICE u64 make_descriptor(u32 addr, u32 leading_bytes, u32 stride_bytes) {
    constexpr u64 SWIZZLE_128B = 1;
    return static_cast<u64>((addr & 0x3FFFF) >> 4)
           | static_cast<u64>((leading_bytes & 0x3FFFF) >> 4) << 16
           | static_cast<u64>((stride_bytes & 0x3FFFF) >> 4) << 32
           | SWIZZLE_128B << 62;
}
// K-major (Q and K for S = Q K^T): the next 8 rows are one swizzle atom further; the leading offset is unused (1).
DEVICE u64 kmajor_descriptor(u32 addr) { return make_descriptor(addr, 16, SWIZZLE_ATOM); }
// MN-major (V for O = P V, with imm-trans-b = 1): the next 64 d-columns are a whole half-block further
// (LBO = BLOCK_N * 128 bytes), the next 8 keys one swizzle atom further (SBO = 1024). See the header.
DEVICE u64 mnmajor_descriptor(u32 addr) { return make_descriptor(addr, BLOCK_N * SWIZZLE_BYTES, SWIZZLE_ATOM); }

// ---- the wgmma instructions: accumulator lists written out (PTX wants each register named) ----
#define ACC_LIST32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define ACC_LIST64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define ACC8(x, i) "+f"(x[i]), "+f"(x[i + 1]), "+f"(x[i + 2]), "+f"(x[i + 3]), \
                   "+f"(x[i + 4]), "+f"(x[i + 5]), "+f"(x[i + 6]), "+f"(x[i + 7])
#define ACC32(x) ACC8(x, 0), ACC8(x, 8), ACC8(x, 16), ACC8(x, 24)
#define ACC64(x) ACC32(x), ACC8(x, 32), ACC8(x, 40), ACC8(x, 48), ACC8(x, 56)

// S (64 x 128, float32) = A (64 x 16) B^T + (accumulate ? S : 0): both operands K-major in shared memory
// (SS form: imm-scale-a = imm-scale-b = 1, imm-trans-a = imm-trans-b = 0). %64 = A desc, %65 = B desc, %66 = flag.
#define WGMMA_SS_N128(TYPE) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " \
                 ACC_LIST64 ", %64, %65, p, 1, 1, 0, 0;\n}\n" \
                 : ACC64(s) : "l"(desc_a), "l"(desc_b), "r"(accumulate))

template <bool BF16> DEVICE void wgmma_ss_n128(float (&s)[S_ACC], u64 desc_a, u64 desc_b, int accumulate) {
    if constexpr (BF16) { WGMMA_SS_N128("bf16"); } else { WGMMA_SS_N128("f16"); }
}

// O (64 x N, float32) += A (64 x 16, 16-bit, four registers a[0..3] per thread) B, B (16 x N) N-major in shared
// memory (RS form: A from registers, imm-scale-a = imm-scale-b = 1, imm-trans-b = 1; the RS form has no
// imm-trans-a). Always accumulates (O starts at zero).
#define WGMMA_RS(TYPE, SHAPE, LIST, ACCS, OPERANDS) \
    asm volatile("wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " " LIST ", " OPERANDS \
                 ", 1, 1, 1, 1;\n" \
                 : ACCS(o) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))

template <bool BF16> DEVICE void wgmma_rs(float (&o)[32], const u32 (&a)[4], u64 desc_b) {   // D = 64
    if constexpr (BF16) { WGMMA_RS("bf16", "m64n64k16", ACC_LIST32, ACC32, "{%32, %33, %34, %35}, %36"); }
    else { WGMMA_RS("f16", "m64n64k16", ACC_LIST32, ACC32, "{%32, %33, %34, %35}, %36"); }
}
template <bool BF16> DEVICE void wgmma_rs(float (&o)[64], const u32 (&a)[4], u64 desc_b) {   // D = 128
    if constexpr (BF16) { WGMMA_RS("bf16", "m64n128k16", ACC_LIST64, ACC64, "{%64, %65, %66, %67}, %68"); }
    else { WGMMA_RS("f16", "m64n128k16", ACC_LIST64, ACC64, "{%64, %65, %66, %67}, %68"); }
}

// Two float32 -> two 16-bit values in one register (lo in the low half), round to nearest even.
template <bool BF16> DEVICE u32 pack2(float lo, float hi) {
    u32 r;
    if constexpr (BF16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 2^x on the special function unit, flushing denormal results to zero (exp2f adds a range check and two multiplies
// per call to get those right, which the softmax does not need); ex2.approx.ftz(-inf) = 0.
DEVICE float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

DEVICE float quad_max(float x) {  // over the 4 threads t = 0..3 that share a row of the accumulator
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
DEVICE float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Named barriers (id 0 is __syncthreads): bar.sync waits until `count` threads have arrived at or synced on barrier
// `id`; bar.arrive counts this thread and goes on. Ping-pong scheduling gives each consumer warpgroup one.
DEVICE void named_sync(int id, int count) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
DEVICE void named_arrive(int id, int count) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The number of K/V tiles the CTA whose first query row is m0 visits (see the header). Producer and consumers both
// call this, so they agree on the ring's turns.
__device__ __forceinline__ int kv_tiles(int m0, int Tq, int Tk, int causal) {
    int n_end = Tk;
    if (causal) {
        const int last_row = min(m0 + BLOCK_M, Tq) - 1;
        n_end = min(Tk, last_row + (Tk - Tq) + 1);  // keys 0 .. last_row + Tk - Tq are visible to last_row
    }
    return n_end > 0 ? (n_end + BLOCK_N - 1) / BLOCK_N : 0;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ---------------------------------------------------------------------------------------------
// The consumer's steps, each on one warpgroup's 64 query rows
// ---------------------------------------------------------------------------------------------

// Issue S = Q K^T (D / 16 wgmmas, both operands K-major in shared memory) as one commit group, without waiting.
// The first k-step overwrites S (accumulate = 0), so S needs no clearing.
template <int D, bool BF16> DEVICE void issue_qk(float (&acc_s)[S_ACC], u32 sQ_wg, u32 sK) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / WGMMA_K; ++kk) {       // half kk / 4, byte 32 (kk % 4) within each row
        const u32 off = (kk % 4) * WGMMA_K * ELEM_BYTES;
        wgmma_ss_n128<BF16>(acc_s, kmajor_descriptor(sQ_wg + (kk / 4) * BLOCK_M * SWIZZLE_BYTES + off),
                            kmajor_descriptor(sK + (kk / 4) * BLOCK_N * SWIZZLE_BYTES + off), kk > 0);
    }
    wgmma_commit();
}

// Issue O += P V (BLOCK_N / 16 wgmmas, P from registers, V N-major in shared memory) as one commit group.
template <bool BF16, int N> DEVICE void issue_pv(float (&acc_o)[N], const u32 (&p)[P_REGS], u32 sV) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < PV_STEPS; ++kk) {          // keys 16 kk .. 16 kk + 15: rows 16 kk of each half
        const u32 a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
        wgmma_rs<BF16>(acc_o, a, mnmajor_descriptor(sV + kk * WGMMA_K * SWIZZLE_BYTES));
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

// Scale one tile of S to log2 units, in place, setting masked scores to -inf (MASK: only tiles that reach past Tk or
// the causal diagonal), and return each of the thread's two rows' maximum over its 32 values of the tile. Two
// instantiations, so that the tiles with no mask (nearly all of them) carry no per-element test at all.
template <bool MASK> DEVICE void scale_and_mask(float (&acc_s)[S_ACC], float (&tile_max)[2], const RowInfo& r, int n0) {
#pragma unroll
    for (int i = 0; i < BLOCK_N / 8; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float x = acc_s[4 * i + 2 * h + e] * r.scale_log2;
                if (MASK) {
                    const int col = n0 + 8 * i + 2 * r.t + e;
                    const bool hidden = (col >= r.Tk) | ((r.causal != 0) & (col > r.row[h] + r.diag));  // no branches
                    x = hidden ? NEG_INF : x;
                }
                acc_s[4 * i + 2 * h + e] = x;
                tile_max[h] = fmaxf(tile_max[h], x);
            }
        }
    }
}

// One tile of the online softmax, in place (see the header): S (float32 scores of keys n0 .. n0 + 127) becomes
// p = exp2(x - m') with x = scale log2(e) S, masked entries giving 0; row_max (m) and this thread's partial row_sum
// (l) are brought up to date; alpha = exp2(m - m') is returned for O, which the caller rescales.
DEVICE void online_softmax(float (&acc_s)[S_ACC], float (&row_max)[2], float (&row_sum)[2], float (&alpha)[2],
                           const RowInfo& r, int n0) {
    float tile_max[2] = {NEG_INF, NEG_INF};
    // only tiles that reach past Tk, or (causal) past the diagonal of the warpgroup's first row, need a mask
    if (n0 + BLOCK_N > r.Tk || (r.causal && n0 + BLOCK_N - 1 > r.first_row + r.diag))
        scale_and_mask<true>(acc_s, tile_max, r, n0);
    else
        scale_and_mask<false>(acc_s, tile_max, r, n0);
    float ref[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float m_new = fmaxf(row_max[h], quad_max(tile_max[h]));
        ref[h] = m_new == NEG_INF ? 0.0f : m_new;    // a row with no visible key yet: p = 0, not NaN
        alpha[h] = exp2_ftz(row_max[h] - ref[h]);         // 0 while row_max = -inf
        row_max[h] = m_new;
        row_sum[h] *= alpha[h];
    }
#pragma unroll
    for (int i = 0; i < BLOCK_N / 8; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float p0 = exp2_ftz(acc_s[4 * i + 2 * h] - ref[h]);
            const float p1 = exp2_ftz(acc_s[4 * i + 2 * h + 1] - ref[h]);
            row_sum[h] += p0 + p1;                     // l sums the unrounded p
            acc_s[4 * i + 2 * h] = p0;
            acc_s[4 * i + 2 * h + 1] = p1;
        }
    }
}

// p (float32, S's accumulator order) -> P as 16-bit pairs in the register-A order of O += P V: register 2 i + h
// holds the columns 8 i + 2 t, + 1 of row h, i.e. register j of k-step kk is pack(s[8 kk + 2 j], s[8 kk + 2 j + 1]).
template <bool BF16> DEVICE void to_p(const float (&acc_s)[S_ACC], u32 (&p)[P_REGS]) {
#pragma unroll
    for (int i = 0; i < P_REGS; ++i) p[i] = pack2<BF16>(acc_s[2 * i], acc_s[2 * i + 1]);
}

// O *= alpha, row by row (values 4 i + 0, 1 are row 0 of the thread, 4 i + 2, 3 row 1).
template <int N> DEVICE void rescale(float (&acc_o)[N], const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
        acc_o[4 * i + 0] *= alpha[0];
        acc_o[4 * i + 1] *= alpha[0];
        acc_o[4 * i + 2] *= alpha[1];
        acc_o[4 * i + 3] *= alpha[1];
    }
}

// Ping-pong (PINGPONG = 1): the two consumer warpgroups take turns at issuing wgmmas. A "turn" is one burst of
// issued wgmmas; consumer cw may start a turn once the other consumer has finished issuing its previous one, so the
// tensor cores run one warpgroup's products while the other computes its softmax. Named barrier 1 + cw means
// "consumer cw's turn": cw waits on it (bar.sync, 256 threads: its own 128 plus the other's 128 arrivals), and at the
// end of its turn arrives at the other's. Consumer 0 goes first (consumer 1 arrives at barrier 1 once before the
// loop); both take the same number of turns (the same n_tiles), and consumer 1 skips the arrival of its last turn,
// which nobody would wait for, so every barrier ends the kernel balanced.
struct Turns {
    int cw;          // this consumer warpgroup, 0 or 1
    DEVICE void start(int n_tiles) const {
        if (PINGPONG && cw == 1 && n_tiles > 0) named_arrive(1, 2 * WARPGROUP);
    }
    DEVICE void begin() const {
        if (PINGPONG) named_sync(1 + cw, 2 * WARPGROUP);
    }
    DEVICE void end(bool last) const {
        if (PINGPONG && !(cw == 1 && last)) named_arrive(1 + (cw ^ 1), 2 * WARPGROUP);
    }
};

// The K/V ring as a consumer walks it: slot s, and the parity of the full barrier's phase to wait for.
template <int STAGES> struct RingPos {
    int s = 0;
    u32 phase = 0;
    DEVICE void advance() {
        if (++s == STAGES) { s = 0; phase ^= 1; }
    }
};
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ---------------------------------------------------------------------------------------------
// The kernel body, shared by the four entry points (dtype x D)
// ---------------------------------------------------------------------------------------------
template <int D, bool BF16>
DEVICE void attention_forward(const TensorMap& map_q, const TensorMap& map_k, const TensorMap& map_v, u16* o,
                              float* lse, int Tq, int Tk, float scale_log2, int causal) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = Shape<D>;
    extern __shared__ unsigned char smem_raw[];
    __shared__ alignas(8) u64 q_full;                 // "sQ has landed"
    __shared__ alignas(8) u64 full_bar[S::STAGES];    // "slot s holds K_j and V_j"
    __shared__ alignas(8) u64 empty_bar[S::STAGES];   // "every consumer warp is done with slot s"

    // ---- set-up: which tile, align the shared memory, initialise the barriers ---------------------------------
    const int m_tile = gridDim.x - 1 - blockIdx.x;    // the last query tile (longest under the mask) first
    const int m0 = m_tile * BLOCK_M;
    const int bh = blockIdx.z * gridDim.y + blockIdx.y;   // (batch, head) = the tensor maps' third coordinate
    const int n_tiles = kv_tiles(m0, Tq, Tk, causal);
    const u32 base = (smem_addr(smem_raw) + SMEM_ALIGN - 1) & ~u32(SMEM_ALIGN - 1);
    const u32 sQ = base, ring = base + S::Q_BYTES;    // slot s: sK at ring + s STAGE_BYTES, sV KV_TILE_BYTES on
    const int warpgroup = threadIdx.x / WARPGROUP;

    if (threadIdx.x == 0) {
        mbar_init(smem_addr(&q_full), 1);
        for (int s = 0; s < S::STAGES; ++s) {
            mbar_init(smem_addr(&full_bar[s]), 1);
            mbar_init(smem_addr(&empty_bar[s]), CONSUMER_WARPS);
        }
        // make the initialised barriers visible to the async proxy (TMA) as well as to the other threads
        asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();

    if (warpgroup == 0) {
        // ---- producer: one thread issues every TMA copy ----------------------------------------------------------
        regs_decrease<PRODUCER_REGS>();
        if (threadIdx.x == 0 && n_tiles > 0) {
            prefetch_tensor_map(map_q);
            prefetch_tensor_map(map_k);
            prefetch_tensor_map(map_v);
            mbar_arrive_expect_tx(smem_addr(&q_full), S::Q_BYTES);
#pragma unroll
            for (int h = 0; h < S::HALVES; ++h)       // half h: columns 64 h .. 64 h + 63 of rows m0 .. m0 + 127
                tma_load_3d(sQ + h * BLOCK_M * SWIZZLE_BYTES, map_q, h * SWIZZLE_ELEMS, m0, bh, smem_addr(&q_full));
            int s = 0;
            u32 phase = 0;
            for (int j = 0; j < n_tiles; ++j) {
                const u32 full = smem_addr(&full_bar[s]);
                const u32 sK = ring + s * S::STAGE_BYTES, sV = sK + S::KV_TILE_BYTES;
                mbar_wait(smem_addr(&empty_bar[s]), phase ^ 1);   // the consumers have released slot s
                mbar_arrive_expect_tx(full, S::STAGE_BYTES);      // full[s] completes when K and V have landed
#pragma unroll
                for (int h = 0; h < S::HALVES; ++h) {
                    tma_load_3d(sK + h * BLOCK_N * SWIZZLE_BYTES, map_k, h * SWIZZLE_ELEMS, j * BLOCK_N, bh, full);
                    tma_load_3d(sV + h * BLOCK_N * SWIZZLE_BYTES, map_v, h * SWIZZLE_ELEMS, j * BLOCK_N, bh, full);
                }
                if (++s == S::STAGES) { s = 0; phase ^= 1; }
            }
        }
    } else {
        // ---- consumers: 64 query rows each ---------------------------------------------------------------------
        regs_increase<CONSUMER_REGS>();
        const int cw = warpgroup - 1;
        const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
        RowInfo r;
        r.first_row = m0 + cw * WGMMA_M;
        r.row[0] = r.first_row + 16 * warp + lane / 4;
        r.row[1] = r.row[0] + 8;
        r.t = lane % 4;
        r.Tk = Tk;
        r.diag = Tk - Tq;
        r.causal = causal;
        r.scale_log2 = scale_log2;
        const Turns turns{cw};
        const u32 sQ_wg = sQ + cw * WGMMA_M * SWIZZLE_BYTES;   // this warpgroup's rows, in each half

        float acc_o[S::O_ACC];
#pragma unroll
        for (int i = 0; i < S::O_ACC; ++i) acc_o[i] = 0.0f;
        float row_max[2] = {NEG_INF, NEG_INF};         // m, in log2 units of the scaled scores
        float row_sum[2] = {0.0f, 0.0f};                   // l, this thread's partial sum (reduced at the end)
        float acc_s[S_ACC];                                // S, then p, of the tile in hand
        u32 p[P_REGS];                                     // P in 16 bits, the A operand of O += P V
        float alpha[2];
        RingPos<S::STAGES> pos;                            // the slot of the tile in hand
        const auto sK = [&](int s) { return ring + s * S::STAGE_BYTES; };
        const auto sV = [&](int s) { return ring + s * S::STAGE_BYTES + S::KV_TILE_BYTES; };
        const auto release = [&](int s) { if (lane == 0) mbar_arrive(smem_addr(&empty_bar[s])); };

        turns.start(n_tiles);
        if (n_tiles > 0) mbar_wait(smem_addr(&q_full), 0);
        if (OVERLAP && n_tiles > 0) {
            // Software pipelining inside the warpgroup: while the tensor cores compute O += P_{j-1} V_{j-1}, the
            // warpgroup runs the softmax of S_j. Tile 0 only fills the pipeline: S_0 and its softmax.
            mbar_wait(smem_addr(&full_bar[pos.s]), pos.phase);
            turns.begin();
            issue_qk<D, BF16>(acc_s, sQ_wg, sK(pos.s));
            turns.end(false);
            wgmma_wait<0>();
            pin(acc_s);
            online_softmax(acc_s, row_max, row_sum, alpha, r, 0);   // alpha = 0: O is still 0
            to_p<BF16>(acc_s, p);
            for (int j = 1; j < n_tiles; ++j) {
                const int prev = pos.s;                    // holds V_{j-1}
                pos.advance();
                mbar_wait(smem_addr(&full_bar[pos.s]), pos.phase);
                turns.begin();
                issue_qk<D, BF16>(acc_s, sQ_wg, sK(pos.s));   // S_j = Q K_j^T             (commit group 1)
                issue_pv<BF16>(acc_o, p, sV(prev));          // O += P_{j-1} V_{j-1}      (commit group 2)
                turns.end(false);
                wgmma_wait<1>();                           // group 1 is done; P V may still be running
                pin(acc_s);
                online_softmax(acc_s, row_max, row_sum, alpha, r, j * BLOCK_N);
                wgmma_wait<0>();                           // P_{j-1} V_{j-1} is done: O and P are free again
                pin(acc_o);
                pin(p);
                release(prev);
                rescale(acc_o, alpha);
                to_p<BF16>(acc_s, p);
            }
            turns.begin();
            issue_pv<BF16>(acc_o, p, sV(pos.s));           // the last tile's O += P V
            turns.end(true);
            wgmma_wait<0>();
            pin(acc_o);
            release(pos.s);
        } else {
            // The plain loop: each step waits for the one before it.
            for (int j = 0; j < n_tiles; ++j) {
                mbar_wait(smem_addr(&full_bar[pos.s]), pos.phase);   // K_j and V_j are in slot pos.s
                turns.begin();
                issue_qk<D, BF16>(acc_s, sQ_wg, sK(pos.s));
                turns.end(false);
                wgmma_wait<0>();
                pin(acc_s);
                online_softmax(acc_s, row_max, row_sum, alpha, r, j * BLOCK_N);
                rescale(acc_o, alpha);
                to_p<BF16>(acc_s, p);
                turns.begin();
                issue_pv<BF16>(acc_o, p, sV(pos.s));
                turns.end(j == n_tiles - 1);
                wgmma_wait<0>();                           // the tensor cores have finished reading slot pos.s
                pin(acc_o);
                release(pos.s);
                pos.advance();
            }
        }

        // ---- epilogue: o = O / l, lse = (m + log2 l) ln 2, rows < Tq only -----------------------------------------
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float l = quad_sum(row_sum[h]);
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;      // a row that saw no key: o = 0
            if (r.row[h] < Tq) {
                const long long row = static_cast<long long>(bh) * Tq + r.row[h];
                u32* const dst = reinterpret_cast<u32*>(o + row * D + 2 * r.t);
#pragma unroll
                for (int i = 0; i < S::O_ACC / 4; ++i)         // columns 8 i + 2 t, + 1
                    dst[4 * i] = pack2<BF16>(acc_o[4 * i + 2 * h] * inv, acc_o[4 * i + 2 * h + 1] * inv);
                if (lse != nullptr && r.t == 0)
                    lse[row] = l > 0.0f ? (row_max[h] + __log2f(l)) * LN2 : NEG_INF;
            }
        }
    }
#else
    __trap();  // built for a target without wgmma/TMA (the launcher builds this file for sm_90a only)
#endif
}

// ---------------------------------------------------------------------------------------------
// Entry points: float16 or bfloat16, D = 64 or 128
// ---------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, 1)
hopper_attn_f16_d64(const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,
                    const __grid_constant__ TensorMap map_v, u16* o, float* lse,
                    int Tq, int Tk, float scale_log2, int causal) {
    attention_forward<64, false>(map_q, map_k, map_v, o, lse, Tq, Tk, scale_log2, causal);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
hopper_attn_f16_d128(const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,
                     const __grid_constant__ TensorMap map_v, u16* o, float* lse,
                     int Tq, int Tk, float scale_log2, int causal) {
    attention_forward<128, false>(map_q, map_k, map_v, o, lse, Tq, Tk, scale_log2, causal);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
hopper_attn_bf16_d64(const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,
                     const __grid_constant__ TensorMap map_v, u16* o, float* lse,
                     int Tq, int Tk, float scale_log2, int causal) {
    attention_forward<64, true>(map_q, map_k, map_v, o, lse, Tq, Tk, scale_log2, causal);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
hopper_attn_bf16_d128(const __grid_constant__ TensorMap map_q, const __grid_constant__ TensorMap map_k,
                      const __grid_constant__ TensorMap map_v, u16* o, float* lse,
                      int Tq, int Tk, float scale_log2, int causal) {
    attention_forward<128, true>(map_q, map_k, map_v, o, lse, Tq, Tk, scale_log2, causal);
}
