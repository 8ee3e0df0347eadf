// hopper_gemm.cu -- C = A B^T on Hopper: TMA into a shared-memory ring, wgmma straight from shared memory (fp16/bf16).
//
// What it computes
//   C[b] = A[b] B[b]^T for every b < batch: A (batch, M, K) and B (batch, N, K) row-major (K contiguous), float16 or
//   bfloat16; C (batch, M, N) row-major, float32 or the inputs' 16-bit type; products summed in float32. With A = Q and
//   B = K of one head this is attention's S = Q K^T, the first product FlashAttention-3 runs on wgmma. Hopper's two
//   engines: TMA copies a whole 2-D tile from global to shared memory on one thread's request, swizzled on the way;
//   wgmma lets a warpgroup (4 warps) multiply a 64 x N tile whose operands stay in shared memory (no ldmatrix). One
//   warpgroup only loads, the others only compute (warp specialisation).
//
// Algorithm (a persistent kernel: one block per SM, each block walks the output tiles tile = blockIdx.x, + gridDim.x)
//
//   producer warp (1 thread)                         consumer warpgroups 0 and 1 (rows 0-63 and 64-127 of the tile)
//   for each tile, for each k-block kb:             for each tile, for each k-block kb:
//     wait  empty[s]            (slot s is free)        wait full[s]           (A and B of kb have landed)
//     expect full[s] += STAGE_BYTES                     4 x wgmma 64x256x16    (K = 64 = 4 steps of 16)
//     TMA   A[b, tile rows, kb] -> slot s (sA)          wait for the wgmmas, then arrive on empty[s]
//     TMA   B[b, tile cols, kb] -> slot s (sB)        epilogue (store_tile), per chunk of 64 (float32) or 128
//     s = s + 1 mod STAGES                              (16-bit) columns: accumulators -> the warpgroup's staging
//                                                       buffer (swizzled) -> C, 16 bytes a thread, whole rows a warp
//
//   The producer runs up to STAGES k-blocks ahead, across tiles too, so the loads of the next tile overlap this one's
//   epilogue (with K = 64 a tile is a single k-block, and writing C is most of the work): the epilogue has buffers of
//   its own. wgmma leaves each thread pairs of neighbouring columns in rows 8 apart, which stored directly would fill
//   C's 32-byte sectors in halves and quarters; each warpgroup instead stages its 64 x 256 tile through a 16 KB buffer,
//   a column chunk at a time, and copies it out in 16-byte pieces, two whole 256-byte row segments of C per warp
//   store. Only the warpgroup's 128 threads synchronise (named barrier 1 + its index): the rest of the block runs on.
//   mbarriers: full[s] expects 1 arrival (the producer's arrive.expect_tx) + STAGE_BYTES of TMA, empty[s] one arrival
//   per consumer warp. Both sides walk the ring with (s, phase), flipping phase when s wraps to 0; consumers wait
//   full[s] for parity phase, the producer empty[s] for phase ^ 1, which a fresh barrier reports as complete.
//
// Shared memory: STAGES slots of [sA: BLOCK_M x 64][sB: BLOCK_N x 64] 16-bit elements, each row 128 bytes (dynamic),
// plus one 64 x 256-byte epilogue staging buffer per consumer warpgroup and the mbarriers (static)
//
//   128-byte swizzle (the layout TMA writes with CU_TENSOR_MAP_SWIZZLE_128B and wgmma reads with swizzle mode 1):
//   a row of 64 elements is eight 16-byte chunks; in row r, chunk c is stored at chunk position c ^ (r % 8).
//
//       row 0:  c0 c1 c2 c3 c4 c5 c6 c7          A wgmma k-step reads chunks 2j, 2j+1 (16 elements) of 8 rows at
//       row 1:  c1 c0 c3 c2 c5 c4 c7 c6          once; without the XOR all 8 rows would sit in the same 4 banks
//       row 2:  c2 c3 c0 c1 c6 c7 c4 c5          (rows are 128 bytes apart); with it they cover all 32 banks.
//       ...                                     The pattern repeats every 8 rows = 1024 bytes (a swizzle atom),
//       row 7:  c7 c6 c5 c4 c3 c2 c1 c0          so every tile starts on a 1024-byte boundary.
//
//   wgmma accumulators (m64nNk16, float32, warp w of the warpgroup, lane = 4 g + t; i = 0 .. N/8 - 1):
//   d[4i], d[4i + 1] -> row 16 w + g, columns 8 i + 2 t, + 1;  d[4i + 2], d[4i + 3] -> row 16 w + g + 8, the same.
//   The operand descriptors (kmajor_descriptor, ptx/wgmma.cuh) step 32 bytes per k-step of 16 elements.
//
// Launch configuration
//   grid  = min(tiles, number of SMs), tiles = batch * ceil(M / BLOCK_M) * ceil(N / BLOCK_N), N fastest
//   block = 128 * (1 + BLOCK_M / 64) = 384 threads: warpgroup 0 the producer, warpgroups 1, 2 the consumers
//   dynamic shared memory = STAGES * (BLOCK_M + BLOCK_N) * BLOCK_K * 2 + 1024 (alignment slack) = 197632 bytes;
//   static 32896 (staging buffers, mbarriers): 230528 of the 232448 a block may have (cuobjdump adds the 1 KB the
//   system reserves). Registers: __launch_bounds__(384, 1) gives 168 a thread; setmaxnreg moves them from the producer
//   warpgroup (40) to the consumers (232), which hold 128 float32 accumulators each.
//
// Kernels (extern "C"), one per input and output type:
//   hopper_gemm_f16_f32 / hopper_gemm_bf16_f32 (float* c), hopper_gemm_f16_f16 / hopper_gemm_bf16_bf16 (u16* c):
//   (const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_b, c, int M, int N, int K,
//    int batch)   map_a, map_b: CUtensorMaps of A and B as (K, rows, batch) tensors (innermost first), box 64 x BLOCK_M
//   (A) or 64 x BLOCK_N (B), 128-byte swizzle, zero fill; M, N, K, batch: the sizes, all lengths.
//
// Needs Hopper: compute capability 9.0 and the sm_90a target (wgmma, setmaxnreg, TMA); built for another target the
// kernels are stubs that trap. Includes ptx/mbarrier.cuh, ptx/tma.cuh, ptx/wgmma.cuh and ptx/mma_sync.cuh (pack2).
// Build it alone, from the repository root:
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/hopper/hopper_gemm.cu -o hopper_gemm.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_90a (extern "C" kernels: no name expressions)
// Host-side example: kernels/examples/hopper_gemm_host.cu (the tensor maps, the launch, a check).
//
// Limits (checked by kernels/hopper/hopper_gemm.py): K % 8 == 0 (TMA strides are multiples of 16 bytes); A, B
// 16-byte aligned; any M, N, K >= 1: TMA fills what lies outside the tensor with zeros (batch is the map's third
// dimension, so never the next entry's rows), and stores are guarded.
// Numerics: 16-bit products, float32 sums in the tensor cores' order; a 16-bit C is rounded once (to nearest).
// What was tried and measured: kernels/hopper/README.md.

#include "ptx/mbarrier.cuh"
#include "ptx/mma_sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"

// ---- tile sizes (the launcher passes them with -D; these defaults are what `nvcc -c` alone sees) ----
#ifndef BLOCK_M
#define BLOCK_M 128
#endif
#ifndef BLOCK_N
#define BLOCK_N 256
#endif
#ifndef BLOCK_K
#define BLOCK_K 64
#endif
#ifndef STAGES
#define STAGES 4
#endif

constexpr int ELEM_BYTES = 2;                               // float16 / bfloat16
constexpr int WARPGROUP = 128;                              // 4 warps issue one wgmma together
constexpr int WGMMA_M = 64, WGMMA_N = BLOCK_N, WGMMA_K = 16;
constexpr int CONSUMERS = BLOCK_M / WGMMA_M;                // consumer warpgroups, 64 rows each
constexpr int THREADS = WARPGROUP * (1 + CONSUMERS);        // + 1 producer warpgroup
constexpr int ACC = WGMMA_M * WGMMA_N / WARPGROUP;          // float32 accumulators per consumer thread (128)
constexpr int ROW_BYTES = BLOCK_K * ELEM_BYTES;             // one row of a tile in shared memory
constexpr int SWIZZLE_BYTES = 128;                          // the 128-byte swizzle: one row = 8 chunks of 16 bytes
constexpr int SWIZZLE_ATOM = 8 * SWIZZLE_BYTES;             // 8 rows: the period of the XOR pattern
constexpr int A_TILE_BYTES = BLOCK_M * ROW_BYTES;
constexpr int B_TILE_BYTES = BLOCK_N * ROW_BYTES;
constexpr int STAGE_BYTES = A_TILE_BYTES + B_TILE_BYTES;    // bytes TMA delivers per k-block (full boxes, OOB too)
constexpr int SMEM_ALIGN = SWIZZLE_ATOM;                    // tiles start on a swizzle-atom boundary (1024 bytes)
constexpr int SMEM_BYTES = STAGES * STAGE_BYTES + SMEM_ALIGN;  // what the launcher requests (hopper_gemm.py)
constexpr int EPI_ROW_BYTES = 256;                          // epilogue chunk row: 64 float32 or 128 16-bit columns
constexpr int EPI_BYTES = WGMMA_M * EPI_ROW_BYTES;          // a consumer warpgroup's staging buffer: 64 rows, 16 KB
constexpr int EPI_ALIGN = 128;                              // the staging buffers' alignment (16 for the vectors)
constexpr int VEC_BYTES = 16;                               // epilogue: one shared-memory read, one store to C
constexpr int EPI_ROW_VECS = EPI_ROW_BYTES / VEC_BYTES;     // 16-byte pieces per chunk row (16: half a warp)
constexpr int EPI_PASS_ROWS = WARPGROUP / EPI_ROW_VECS;     // chunk rows the warpgroup copies per pass (8)
constexpr int EPI_BARRIER = 1;                              // consumer cw syncs on named barrier 1 + cw
constexpr int STATIC_SMEM_BYTES = CONSUMERS * EPI_BYTES + EPI_ALIGN;  // staging buffers + mbarriers (2 STAGES x 8 B)
constexpr int SMEM_LIMIT = 227 * 1024;                      // static + dynamic shared memory a block may have (Hopper)
constexpr int PRODUCER_REGS = 40;                           // setmaxnreg: the producer warpgroup gives registers up
constexpr int CONSUMER_REGS = 232;                          // ... and the consumers take them
constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;        // what __launch_bounds__(THREADS, 1) leaves: 168

static_assert(BLOCK_K * ELEM_BYTES == SWIZZLE_BYTES, "a tile row must be exactly one 128-byte swizzle row");
static_assert(BLOCK_M == 128, "two consumer warpgroups of 64 rows (setmaxnreg's budget below assumes 384 threads)");
static_assert(BLOCK_N == 256, "the wgmma below is m64n256k16");
static_assert(BLOCK_K % WGMMA_K == 0 && ACC == BLOCK_N / 2, "a k-block is whole k-steps; 64 x N float32 per warpgroup");
static_assert(STAGES >= 2 && STAGES <= 8, "the ring needs 2..8 slots");
static_assert(SMEM_BYTES + STATIC_SMEM_BYTES <= SMEM_LIMIT,
              "the ring and the staging buffers must fit in the 227 KB of shared memory a block may have on Hopper");
static_assert(2 * STAGES * 8 <= EPI_ALIGN, "STATIC_SMEM_BYTES counts the mbarriers within the buffers' alignment");
static_assert(32 % EPI_ROW_VECS == 0 && WGMMA_M % EPI_PASS_ROWS == 0 && EPI_PASS_ROWS == 8,
              "epilogue: a warp copies whole chunk rows; a pass covers 8 rows, the period of the staging swizzle");
static_assert(EPI_BARRIER >= 1 && EPI_BARRIER + CONSUMERS <= 16, "named barriers are 0..15; 0 is __syncthreads'");
static_assert(STAGE_BYTES % SMEM_ALIGN == 0 && A_TILE_BYTES % SMEM_ALIGN == 0 &&
              (WGMMA_M * ROW_BYTES) % SMEM_ALIGN == 0, "every tile must start on a 1024-byte boundary");
static_assert(PRODUCER_REGS % 8 == 0 && CONSUMER_REGS % 8 == 0 && PRODUCER_REGS >= 24 && CONSUMER_REGS <= 256,
              "setmaxnreg takes multiples of 8 in [24, 256]");
static_assert(WARPGROUP * (PRODUCER_REGS + CONSUMERS * CONSUMER_REGS) <= THREADS * LAUNCH_REGS,
              "the consumers cannot take more registers than the producer gives up");

// ---------------------------------------------------------------------------------------------
// The wgmma of this kernel, and its epilogue (sm_90a)
// ---------------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// D (64 x 256, float32, 128 registers per thread) = A (64 x 16) B^T (16 x 256) + (accumulate ? D : 0), both operands
// K-major in shared memory (imm-trans-a = imm-trans-b = 0), scale-a = scale-b = 1.
#define WGMMA_D "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define WGMMA_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
                      "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WGMMA_ACC128 WGMMA_ACC8(0), WGMMA_ACC8(8), WGMMA_ACC8(16), WGMMA_ACC8(24), WGMMA_ACC8(32), WGMMA_ACC8(40), \
    WGMMA_ACC8(48), WGMMA_ACC8(56), WGMMA_ACC8(64), WGMMA_ACC8(72), WGMMA_ACC8(80), WGMMA_ACC8(88), WGMMA_ACC8(96), \
    WGMMA_ACC8(104), WGMMA_ACC8(112), WGMMA_ACC8(120)
// %128 = A descriptor, %129 = B descriptor, %130 = accumulate flag (-> predicate scale-d)
#define WGMMA_64x256x16(TYPE) \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " " \
                 WGMMA_D ", %128, %129, p, 1, 1, 0, 0;\n}\n" \
                 : WGMMA_ACC128 : "l"(desc_a), "l"(desc_b), "r"(accumulate))

template <bool BF16>
DEVICE void wgmma_64x256x16(float (&d)[ACC], u64 desc_a, u64 desc_b, int accumulate) {
    static_assert(ACC == 128, "WGMMA_D lists 128 accumulator registers");
    if constexpr (BF16) {
        WGMMA_64x256x16("bf16");
    } else {
        WGMMA_64x256x16("f16");
    }
}

// The epilogue: one consumer warpgroup's 64 x 256 accumulator tile -> C through its staging buffer buf, in chunks of
// EPI_ROW_BYTES per row (64 float32 or 128 16-bit columns: 4 or 2 chunks), rounded to C's type on the way in.
// The buffer is swizzled in units of 8 columns (one accumulator quadruple d[4i .. 4i+3] spans 8 columns of two rows):
//
//       chunk row r:  group q stored at group position q ^ (r % 8)   (32-byte groups for float32, 16-byte for 16-bit)
//
// A warp's write covers one group of 8 rows r % 8 = 0..7, 256 bytes apart: unswizzled they would fall on the same
// 8 banks (float32) or 4 (16-bit), an 8-way conflict; swizzled they take 2 wavefronts for 256 bytes (float32) or 1
// for 128 (16-bit), the least possible. A half-warp reading one row's 16 pieces gets a permutation of them: 4
// wavefronts for a warp's 512 bytes, again the least possible. C's rows start every N elements, so 16-byte stores are
// aligned only when N * sizeof(C) % 16 == 0; otherwise (and never past column N or row M) the pieces are written
// element by element. For each chunk:
//   1. barrier   the warpgroup has finished reading the previous chunk out of the buffer
//   2. write     each thread its pairs (row 16 w + g (+ 8), columns 8 i + 2 t, + 1) into the buffer; the 8-column
//                group q of chunk row r goes to group position q ^ (r % 8)
//   3. barrier   the whole chunk is in the buffer
//   4. copy      16-byte pieces of the buffer to C: lane l of warp w takes piece l % 16 of row 2 w + l / 16 (+ 8 p),
//                so each warp writes whole 256-byte row segments of C, guarded for rows >= M and columns >= N
// row0, col0: the warpgroup's first row and column of C[b]; barrier: its named barrier.
template <bool BF16, bool OUT16>
DEVICE void store_tile(const float (&d)[ACC], unsigned char* buf, int barrier, void* c, int M, int N, int b,
                       int row0, int col0, int warp, int lane) {
    constexpr int OUT_BYTES = OUT16 ? 2 : 4;
    constexpr int GROUP_BYTES = 8 * OUT_BYTES;                     // 8 columns: one accumulator quadruple's span
    constexpr int CHUNK_COLS = EPI_ROW_BYTES / OUT_BYTES;          // columns per staged chunk
    constexpr int CHUNK_GROUPS = CHUNK_COLS / 8;
    constexpr int VEC = VEC_BYTES / OUT_BYTES;                     // columns per 16-byte piece
    constexpr int PASSES = WGMMA_M / EPI_PASS_ROWS;                // step 4 covers the chunk in 8 passes of 8 rows
    static_assert(CHUNK_GROUPS >= 8 && WGMMA_N % CHUNK_COLS == 0, "the XOR with r % 8 stays inside a chunk row");

    // step 2's place: row 16 w + g (+ 8) of the chunk, bytes t * 2 * OUT_BYTES of each column group
    const int g = lane / 4, t = lane % 4;
    unsigned char* const wr = buf + (16 * warp + g) * EPI_ROW_BYTES + t * 2 * OUT_BYTES;
    // step 4's place: piece v of row r (then r + 8, r + 16, ...); r % 8 is the same in every pass
    const int r = 2 * warp + lane / EPI_ROW_VECS, v = lane % EPI_ROW_VECS;
    const unsigned char* const rd = buf + r * EPI_ROW_BYTES + (v ^ (r % 8) * (GROUP_BYTES / VEC_BYTES)) * VEC_BYTES;
    // C rows start at multiples of N elements: 16-byte stores are aligned only if a row is a whole number of pieces
    const bool vector = N % VEC == 0;
    const long long row_stride = static_cast<long long>(N) * OUT_BYTES;
    unsigned char* const out = static_cast<unsigned char*>(c) + (static_cast<long long>(b) * M + row0 + r) * row_stride;
    const int rows_left = M - row0 - r;                           // pass p writes row r + 8 p if 8 p < rows_left

#pragma unroll
    for (int chunk = 0; chunk < WGMMA_N / CHUNK_COLS; ++chunk) {
        named_barrier_sync(barrier, WARPGROUP);                   // 1. the buffer is free again
#pragma unroll
        for (int h = 0; h < 2; ++h) {                             // 2. registers -> buffer
#pragma unroll
            for (int q = 0; q < CHUNK_GROUPS; ++q) {
                const int i = chunk * CHUNK_GROUPS + q;
                unsigned char* p = wr + h * 8 * EPI_ROW_BYTES + (q ^ g) * GROUP_BYTES;  // (16 w + g + 8 h) % 8 = g
                if constexpr (OUT16)
                    *reinterpret_cast<u32*>(p) = pack2<BF16>(d[4 * i + 2 * h], d[4 * i + 2 * h + 1]);
                else
                    *reinterpret_cast<float2*>(p) = make_float2(d[4 * i + 2 * h], d[4 * i + 2 * h + 1]);
            }
        }
        named_barrier_sync(barrier, WARPGROUP);                   // 3. the chunk is complete
        const int col = col0 + chunk * CHUNK_COLS + v * VEC;      // 4. buffer -> C
        if (col < N) {
            uint4 x[PASSES];                                      // all reads first: their latencies overlap
#pragma unroll
            for (int pass = 0; pass < PASSES; ++pass)
                x[pass] = *reinterpret_cast<const uint4*>(rd + pass * EPI_PASS_ROWS * EPI_ROW_BYTES);
            unsigned char* const dst = out + static_cast<long long>(col) * OUT_BYTES;
#pragma unroll
            for (int pass = 0; pass < PASSES; ++pass) {
                if (pass * EPI_PASS_ROWS >= rows_left) break;
                unsigned char* const p = dst + pass * EPI_PASS_ROWS * row_stride;
                if (vector) {                                     // col + VEC <= N: N and col are multiples of VEC
                    *reinterpret_cast<uint4*>(p) = x[pass];
                } else {                                          // misaligned rows or the ragged edge: one by one
                    const u32 w[4] = {x[pass].x, x[pass].y, x[pass].z, x[pass].w};
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        if (col + e >= N) break;
                        if constexpr (OUT16)
                            reinterpret_cast<u16*>(p)[e] = static_cast<u16>(w[e / 2] >> (16 * (e % 2)));
                        else
                            reinterpret_cast<u32*>(p)[e] = w[e];
                    }
                }
            }
        }
    }
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ---------------------------------------------------------------------------------------------
// The kernel body, shared by the four entry points (input type x output type)
// ---------------------------------------------------------------------------------------------
template <bool BF16, bool OUT16>
DEVICE void gemm_abt(const TensorMap& map_a, const TensorMap& map_b, void* c, int M, int N, int K, int batch) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    __shared__ alignas(8) u64 full_bar[STAGES];   // "slot s holds k-block data": TMA's bytes have landed
    __shared__ alignas(8) u64 empty_bar[STAGES];  // "slot s may be overwritten": every consumer warp is done with it
    __shared__ alignas(EPI_ALIGN) unsigned char epi_buf[CONSUMERS][EPI_BYTES];  // a staging buffer per consumer

    // ---- set-up: align the ring, initialise the barriers -------------------------------------------------
    const u32 ring = (smem_addr(smem_raw) + SMEM_ALIGN - 1) & ~u32(SMEM_ALIGN - 1);
    const int warpgroup = threadIdx.x / WARPGROUP;
    const int tiles_m = (M + BLOCK_M - 1) / BLOCK_M, tiles_n = (N + BLOCK_N - 1) / BLOCK_N;
    const int k_blocks = (K + BLOCK_K - 1) / BLOCK_K;
    const int tiles = batch * tiles_m * tiles_n;  // < 2^31: checked by the launcher

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(smem_addr(&full_bar[s]), 1);
            mbar_init(smem_addr(&empty_bar[s]), CONSUMERS * WARPGROUP / 32);
        }
        mbar_init_fence();  // the initialised barriers, visible to TMA (the async proxy) and to the other threads
    }
    __syncthreads();

    if (warpgroup == 0) {
        // ---- producer: one thread issues every TMA copy -----------------------------------------------------
        regs_decrease<PRODUCER_REGS>();
        if (threadIdx.x == 0) {
            prefetch_tensor_map(map_a);
            prefetch_tensor_map(map_b);
            int s = 0;
            u32 phase = 0;
            for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
                const int tn = tile % tiles_n, tm = (tile / tiles_n) % tiles_m, b = tile / (tiles_n * tiles_m);
                for (int kb = 0; kb < k_blocks; ++kb) {
                    const u32 full = smem_addr(&full_bar[s]), slot = ring + s * STAGE_BYTES;
                    mbar_wait(smem_addr(&empty_bar[s]), phase ^ 1);  // the consumers have released slot s
                    mbar_arrive_expect_tx(full, STAGE_BYTES);        // full[s] completes when these bytes land
                    tma_load_3d(slot, map_a, kb * BLOCK_K, tm * BLOCK_M, b, full);
                    tma_load_3d(slot + A_TILE_BYTES, map_b, kb * BLOCK_K, tn * BLOCK_N, b, full);
                    if (++s == STAGES) { s = 0; phase ^= 1; }
                }
            }
        }
    } else {
        // ---- consumers: wgmma on each slot as it fills, then the epilogue -----------------------------------
        regs_increase<CONSUMER_REGS>();
        const int cw = warpgroup - 1;                    // this warpgroup's 64 rows of the tile
        const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
        float d[ACC];
#pragma unroll
        for (int i = 0; i < ACC; ++i) d[i] = 0.0f;
        int s = 0;
        u32 phase = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int tn = tile % tiles_n, tm = (tile / tiles_n) % tiles_m, b = tile / (tiles_n * tiles_m);
            for (int kb = 0; kb < k_blocks; ++kb) {
                mbar_wait(smem_addr(&full_bar[s]), phase);   // A and B of this k-block are in slot s
                const u32 a_tile = ring + s * STAGE_BYTES + cw * WGMMA_M * ROW_BYTES;
                const u32 b_tile = ring + s * STAGE_BYTES + A_TILE_BYTES;
                wgmma_pin(d);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < BLOCK_K / WGMMA_K; ++kk)  // 16 elements = 32 bytes further along each row
                    wgmma_64x256x16<BF16>(d, kmajor_descriptor(a_tile + kk * WGMMA_K * ELEM_BYTES),
                                          kmajor_descriptor(b_tile + kk * WGMMA_K * ELEM_BYTES), kb > 0 || kk > 0);
                wgmma_commit();
                wgmma_wait<0>();                             // the tensor cores have finished reading slot s
                wgmma_pin(d);
                if (lane == 0) mbar_arrive(smem_addr(&empty_bar[s]));
                if (++s == STAGES) { s = 0; phase ^= 1; }
            }

            // ---- epilogue: accumulators -> staging buffer -> C in whole rows (store_tile above) ----------------
            store_tile<BF16, OUT16>(d, epi_buf[cw], EPI_BARRIER + cw, c, M, N, b, tm * BLOCK_M + cw * WGMMA_M,
                                    tn * BLOCK_N, warp, lane);
        }
    }
#else
    __trap();  // built for a target without wgmma/TMA (the launcher builds this file for sm_90a only)
#endif
}

// ---------------------------------------------------------------------------------------------
// Entry points: C = A B^T with float16 or bfloat16 A, B and a float32 or 16-bit C (OUT: float or u16)
// ---------------------------------------------------------------------------------------------
#define HOPPER_GEMM_PARAMS(OUT)                                                                \
    const __grid_constant__ TensorMap map_a, const __grid_constant__ TensorMap map_b, OUT* c, \
    int M, int N, int K, int batch
#define HOPPER_GEMM_ARGS map_a, map_b, c, M, N, K, batch

extern "C" __global__ void __launch_bounds__(THREADS, 1) hopper_gemm_f16_f32(HOPPER_GEMM_PARAMS(float)) {
    gemm_abt<false, false>(HOPPER_GEMM_ARGS);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) hopper_gemm_bf16_f32(HOPPER_GEMM_PARAMS(float)) {
    gemm_abt<true, false>(HOPPER_GEMM_ARGS);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) hopper_gemm_f16_f16(HOPPER_GEMM_PARAMS(u16)) {
    gemm_abt<false, true>(HOPPER_GEMM_ARGS);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1) hopper_gemm_bf16_bf16(HOPPER_GEMM_PARAMS(u16)) {
    gemm_abt<true, true>(HOPPER_GEMM_ARGS);
}
