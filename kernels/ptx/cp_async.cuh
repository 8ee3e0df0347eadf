// ptx/cp_async.cuh -- cp.async (sm_80+): 16-byte copies from global to shared memory that do not pass through
// registers, grouped and waited for per thread (below sm_80, a synchronous copy with the same calls: see below).
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
//
// Before sm_80 (a T4 is 7.5) there is no cp.async, and the same five calls compile to a synchronous copy through
// registers: a 16-byte load that bypasses L1 (ld.global.cg), or 16 zero bytes, then a 16-byte shared store; commit and
// wait have nothing left to wait for. A kernel correct with cp.async is correct with these (the copy lands earlier),
// it only loses the overlap of the copy with the math issued after it. The sm_80+ code is unchanged.
#ifndef COURSE_PTX_CP_ASYNC_CUH
#define COURSE_PTX_CP_ASYNC_CUH

#include "common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
DEVICE void cp_async_16(u32 dst, const void* src, bool in_range) {
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (in_range) x = __ldcg(static_cast<const uint4*>(src));
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(x.x), "r"(x.y), "r"(x.z), "r"(x.w)
                 : "memory");
}
DEVICE void cp_async_16(u32 dst, const void* src) { cp_async_16(dst, src, true); }
DEVICE void cp_async_commit() {}
template <int PENDING>
DEVICE void cp_async_wait() {}
DEVICE void cp_async_wait_all() {}
#else
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
#endif

#endif  // COURSE_PTX_CP_ASYNC_CUH
