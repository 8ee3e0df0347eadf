// ptx/cp_async.cuh -- cp.async (sm_80+): 16-byte copies from global to shared memory that do not pass through
// registers, grouped and waited for per thread.
//
//   cp_async_16(dst, src)            copy 16 bytes; dst is a shared-window address (smem_addr), src 16-byte aligned
//   cp_async_16(dst, src, in_range)  the same, or, when in_range is false, write 16 zero bytes and read nothing
//                                    (the rows and columns of a tile past the end of a tensor)
//   cp_async_commit()                close the group of this thread's copies issued since the last commit
//   cp_async_wait<N>()               wait until at most N of this thread's committed groups are still in flight
//   cp_async_wait_all()              wait for all of this thread's copies, committed or not
//
// The copies use .cg (L2 only, L1 bypassed): a tile is read once per block. A wait covers this thread's copies only;
// a __syncthreads (or __syncwarp, where one warp reads what it copied) must follow before other threads read them.
#ifndef COURSE_PTX_CP_ASYNC_CUH
#define COURSE_PTX_CP_ASYNC_CUH

#include "common.cuh"

DEVICE void cp_async_16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
DEVICE void cp_async_16(u32 dst, const void* src, bool in_range) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in_range ? 16 : 0)
                 : "memory");
}
DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int PENDING>
DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory"); }
DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

#endif  // COURSE_PTX_CP_ASYNC_CUH
