// ptx/wgmma.cuh -- warpgroup tensor-core products on Hopper (sm_90a): the bookkeeping around wgmma.mma_async, the
// shared-memory descriptors that name its operands, and setmaxnreg. The wgmma instructions themselves (one asm per
// shape, every accumulator register named) live in the kernel files that use them.
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
//   smem_descriptor(addr, leading_bytes, stride_bytes), kmajor_descriptor(addr)
//                              the 64-bit descriptor of an operand tile in the 128-byte swizzle (below)
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

#endif  // COURSE_PTX_WGMMA_CUH
