// ptx/wgmma.cuh -- warpgroup tensor-core products on Hopper (sm_90a): the bookkeeping around wgmma.mma_async, the
// shared-memory descriptors that name its operands, setmaxnreg, and the wgmma instructions the kernels use (one asm
// per shape, every accumulator register named; at the end of this file).
//
// A warpgroup is 4 consecutive warps (128 threads, the first warp a multiple of 4); all of its threads make each call:
//   wgmma_fence()              before a wgmma reads registers written by ordinary instructions (accumulators, a
//                              register A operand): makes those writes visible to it
//   wgmma_commit()             close the group of wgmmas issued since the last commit
//   wgmma_wait<N>()            wait until at most N committed groups are still running
//   wgmma_pin(x)               an empty asm that "reads and writes" each register of x (float or u32 array), so that
//                              the compiler neither moves nor copies registers a running wgmma owns across a fence or
//                              a wait; it emits no instruction
//   regs_decrease<N>()         setmaxnreg: this warpgroup's registers per thread down to N, or up to N (waiting until
//   regs_increase<N>()         the block's pool has them); N a multiple of 8 in [24, 256]
//   smem_descriptor(addr, leading_bytes, stride_bytes), kmajor_descriptor(addr), mn_major_descriptor(addr, block)
//                              the 64-bit descriptor of an operand tile in the 128-byte swizzle (below)
//   fence_async_shared()       after ordinary stores to shared memory that a wgmma (or TMA) will read: makes them
//                              visible to the async proxy (then a barrier before the wgmma is issued)
//   wgmma_ss<BF16[, TRANS_A, TRANS_B]>(d, desc_a, desc_b, accumulate)   d (64 x N, float32) = A B (+ d): both
//                              operands in shared memory; N = 2 x the accumulators of d (64, 128, 176, 192)
//   wgmma_rs<BF16>(d, a, desc_b)   d (64 x N) += A B, A (64 x 16) from four registers, B N-major; N = 64 or 128
#ifndef COURSE_PTX_WGMMA_CUH
#define COURSE_PTX_WGMMA_CUH

#include "common.cuh"

DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> DEVICE void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

template <int N> DEVICE void wgmma_pin(float (&x)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(x[i])::"memory");
}
template <int N> DEVICE void wgmma_pin(u32 (&x)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(x[i])::"memory");
}

template <int N> DEVICE void regs_decrease() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> DEVICE void regs_increase() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

// The descriptor of a tile in the 128-byte swizzle (TMA's CU_TENSOR_MAP_SWIZZLE_128B: 16-byte chunk c of a 128-byte
// row r stored at chunk position c ^ (r % 8)); PTX ISA, "Matrix Descriptor Format" of the warpgroup MMA section:
//   bits  0-13  start address >> 4          the shared-window address of the operand's first element
//   bits 16-29  leading byte offset >> 4    K-major: unused (a k-step's 32 bytes lie inside one 128-byte row);
//                                           MN-major: from one 64-element block of the M/N axis to the next
//   bits 32-45  stride byte offset >> 4     from one group of 8 rows (K-major: of M/N; MN-major: of K) to the next
//   bits 49-51  base offset                 0: every tile starts on a 1024-byte boundary (the swizzle's period)
//   bits 62-63  swizzle mode                1 = 128-byte swizzle
DEVICE u64 smem_descriptor(u32 addr, u32 leading_bytes, u32 stride_bytes) {
    constexpr u64 SWIZZLE_128B = 1;
    return static_cast<u64>((addr & 0x3FFFF) >> 4)
           | static_cast<u64>((leading_bytes & 0x3FFFF) >> 4) << 16
           | static_cast<u64>((stride_bytes & 0x3FFFF) >> 4) << 32
           | SWIZZLE_128B << 62;
}
// A K-major tile (rows of 64 16-bit elements = 128 bytes): the next 8 rows are one 1024-byte swizzle atom further; the
// leading offset is unused (16, as is customary). A k-step of 16 elements further along the rows is the start address
// + 32 bytes, even inside a swizzled row: the hardware applies the XOR to the address bits itself, so chunk 2j of row r
// is found at 2j ^ (r % 8), exactly where TMA put it.
DEVICE u64 kmajor_descriptor(u32 addr) { return smem_descriptor(addr, 16, 1024); }

// An MN-major tile (the transposed operand: the M or N axis contiguous, 64 elements to a 128-byte swizzled row, one
// K index per row): the next 8 K rows are one 1024-byte atom further (stride), and the next 64 M/N elements lie
// `block_bytes` further (leading), the size of one 64-column block of the tile (rows x 128 bytes). A k-step of 16
// is 16 rows = 2048 bytes further, so the base offset stays 0.
DEVICE u64 mn_major_descriptor(u32 addr, u32 block_bytes) { return smem_descriptor(addr, block_bytes, 1024); }

// Ordinary stores to shared memory, made visible to the async proxy that wgmma and TMA read it through; each writing
// thread calls it after its stores, and a barrier then orders them before the wgmma that reads them.
DEVICE void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- the wgmma instructions: accumulator lists written out (PTX wants each register named) ----
#define WG_REGS_0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
#define WG_REGS_16 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS_32 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
#define WG_REGS_48 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_REGS_64 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
#define WG_REGS_80 "%80, %81, %82, %83, %84, %85, %86, %87"
#define WG_REGS_88 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define WG_ACC_LIST32 "{" WG_REGS_0 WG_REGS_16 "}"
#define WG_ACC_LIST64 "{" WG_REGS_0 WG_REGS_16 ", " WG_REGS_32 WG_REGS_48 "}"
#define WG_ACC_LIST88 "{" WG_REGS_0 WG_REGS_16 ", " WG_REGS_32 WG_REGS_48 ", " WG_REGS_64 WG_REGS_80 "}"
#define WG_ACC_LIST96 "{" WG_REGS_0 WG_REGS_16 ", " WG_REGS_32 WG_REGS_48 ", " WG_REGS_64 WG_REGS_80 WG_REGS_88 "}"
#define WG_ACC8(x, i) "+f"(x[i]), "+f"(x[i + 1]), "+f"(x[i + 2]), "+f"(x[i + 3]), \
                      "+f"(x[i + 4]), "+f"(x[i + 5]), "+f"(x[i + 6]), "+f"(x[i + 7])
#define WG_ACC32(x) WG_ACC8(x, 0), WG_ACC8(x, 8), WG_ACC8(x, 16), WG_ACC8(x, 24)
#define WG_ACC64(x) WG_ACC32(x), WG_ACC8(x, 32), WG_ACC8(x, 40), WG_ACC8(x, 48), WG_ACC8(x, 56)
#define WG_ACC88(x) WG_ACC64(x), WG_ACC8(x, 64), WG_ACC8(x, 72), WG_ACC8(x, 80)
#define WG_ACC96(x) WG_ACC88(x), WG_ACC8(x, 88)

// d (64 x N, float32) = A (64 x 16) B (16 x N) + (accumulate ? d : 0), both operands in shared memory (SS form,
// imm-scale-a = imm-scale-b = 1). TRANS_A = 0: A K-major (its rows along K), 1: M-major; TRANS_B = 0: B K-major (B^T's
// rows along K: S = Q K^T with K as stored), 1: N-major. After the accumulators come the A descriptor, the B
// descriptor, the accumulate flag and the two transpose immediates (the "n" operands print as 0 or 1).
#define WG_SS(TYPE, SHAPE, LIST, ACCS, PRED, TAIL) asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\n" \
    "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " " LIST ", " TAIL ";\n}\n" \
    : ACCS(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(int(TRANS_A)), "n"(int(TRANS_B)))
#define WG_SS_TYPED(SHAPE, LIST, ACCS, PRED, TAIL) \
    if constexpr (BF16) { WG_SS("bf16", SHAPE, LIST, ACCS, PRED, TAIL); } \
    else { WG_SS("f16", SHAPE, LIST, ACCS, PRED, TAIL); }

template <bool BF16, bool TRANS_A = false, bool TRANS_B = false, int N>
DEVICE void wgmma_ss(float (&d)[N], u64 desc_a, u64 desc_b, int accumulate) {
    static_assert(N == 32 || N == 64 || N == 88 || N == 96, "tiles of 64, 128, 176 or 192 columns");
    if constexpr (N == 32) {
        WG_SS_TYPED("m64n64k16", WG_ACC_LIST32, WG_ACC32, "%34", "%32, %33, p, 1, 1, %35, %36")
    } else if constexpr (N == 64) {
        WG_SS_TYPED("m64n128k16", WG_ACC_LIST64, WG_ACC64, "%66", "%64, %65, p, 1, 1, %67, %68")
    } else if constexpr (N == 88) {
        WG_SS_TYPED("m64n176k16", WG_ACC_LIST88, WG_ACC88, "%90", "%88, %89, p, 1, 1, %91, %92")
    } else {
        WG_SS_TYPED("m64n192k16", WG_ACC_LIST96, WG_ACC96, "%98", "%96, %97, p, 1, 1, %99, %100")
    }
}

// d (64 x N, float32) += A (64 x 16, 16-bit, four registers a[0..3] per thread) B, B (16 x N) N-major in shared
// memory (RS form: A from registers, imm-scale-a = imm-scale-b = 1, imm-trans-b = 1; the RS form has no
// imm-trans-a). Always accumulates (d starts at zero).
#define WG_RS(TYPE, SHAPE, LIST, ACCS, OPERANDS) \
    asm volatile("wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " " LIST ", " OPERANDS \
                 ", 1, 1, 1, 1;\n" \
                 : ACCS(o) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))

template <bool BF16> DEVICE void wgmma_rs(float (&o)[32], const u32 (&a)[4], u64 desc_b) {   // N = 64
    if constexpr (BF16) { WG_RS("bf16", "m64n64k16", WG_ACC_LIST32, WG_ACC32, "{%32, %33, %34, %35}, %36"); }
    else { WG_RS("f16", "m64n64k16", WG_ACC_LIST32, WG_ACC32, "{%32, %33, %34, %35}, %36"); }
}
template <bool BF16> DEVICE void wgmma_rs(float (&o)[64], const u32 (&a)[4], u64 desc_b) {   // N = 128
    if constexpr (BF16) { WG_RS("bf16", "m64n128k16", WG_ACC_LIST64, WG_ACC64, "{%64, %65, %66, %67}, %68"); }
    else { WG_RS("f16", "m64n128k16", WG_ACC_LIST64, WG_ACC64, "{%64, %65, %66, %67}, %68"); }
}

#endif  // COURSE_PTX_WGMMA_CUH
