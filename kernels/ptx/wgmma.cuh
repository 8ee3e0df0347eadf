// ptx/wgmma.cuh -- warpgroup-level tensor-core products on Hopper (sm_90a): the bookkeeping around wgmma.mma_async,
// the shared-memory matrix descriptors its operands are named by, and setmaxnreg. The wgmma instructions themselves
// (one asm per shape, every accumulator register named) live in the kernel files that use them.
//
// A warpgroup is 4 consecutive warps (128 threads, the first warp a multiple of 4); every call below is made by all of
// its threads together:
//   wgmma_fence()                 before the first wgmma that reads registers written by ordinary instructions
//                                 (accumulators, a register A operand): makes those writes visible to it
//   wgmma_commit()                close the group of the wgmmas issued since the last commit
//   wgmma_wait<N>()               wait until at most N committed groups are still running
//   wgmma_pin(x)                  an empty asm that "reads and writes" each register of x (float or u32 array), so
//                                 that the compiler neither moves nor copies registers a running wgmma owns across
//                                 a fence or a wait (no instruction: the machine code holds nothing of it)
//   regs_decrease<N>()            setmaxnreg: shrink this warpgroup's registers per thread to N (a multiple of 8 in
//   regs_increase<N>()            [24, 256]), or grow them, waiting until the block's pool has that many free
//
// Descriptors (64 bits; PTX ISA, "Matrix Descriptor Format" of the warpgroup MMA section), for a tile in the 128-byte
// swizzle (TMA's CU_TENSOR_MAP_SWIZZLE_128B: chunk c of 16 bytes of row r stored at chunk position c ^ (r % 8)):
//   smem_descriptor(addr, leading_bytes, stride_bytes)
//        bits  0-13  start address >> 4   the shared-window address of the operand's first element
//        bits 16-29  leading byte offset  K-major: unused (a k-step's 32 bytes lie inside one 128-byte row), 16 by
//                                         custom; MN-major: from one 64-element block of N (or M) to the next
//        bits 32-45  stride byte offset   from one group of 8 rows (K-major) or 8 k-rows (MN-major) to the next
//        bits 49-51  base offset          0: every tile starts on a 1024-byte boundary (the swizzle's period)
//        bits 62-63  swizzle mode         1 = 128-byte swizzle
//   kmajor_descriptor(addr)       smem_descriptor(addr, 16, 1024): a K-major tile of 128-byte rows, 8 rows per 1024
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

DEVICE u64 smem_descriptor(u32 addr, u32 leading_bytes, u32 stride_bytes) {
    constexpr u64 SWIZZLE_128B = 1;
    return static_cast<u64>((addr & 0x3FFFF) >> 4)
           | static_cast<u64>((leading_bytes & 0x3FFFF) >> 4) << 16
           | static_cast<u64>((stride_bytes & 0x3FFFF) >> 4) << 32
           | SWIZZLE_128B << 62;
}
DEVICE u64 kmajor_descriptor(u32 addr) { return smem_descriptor(addr, 16, 1024); }

#endif  // COURSE_PTX_WGMMA_CUH
