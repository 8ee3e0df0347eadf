// ptx/tma.cuh -- the Tensor Memory Accelerator (sm_90): one thread asks for a whole box of a tensor in global memory;
// TMA copies it into shared memory, swizzled as the tensor map says, and counts its bytes on an mbarrier.
//
//   TensorMap                               a CUtensorMap: 128 opaque bytes, 64-byte aligned, written on the host by
//                                           the driver's cuTensorMapEncodeTiled (address, sizes, strides, box, swizzle)
//   tma_load_3d(dst, map, c0, c1, c2, bar)  one thread: the box at (c0, c1, c2) -> shared address dst
//   prefetch_tensor_map(map)                one thread: bring the map into the cache TMA reads it from
//   bulk_load(dst, src, bytes, bar)         one thread: `bytes` contiguous bytes (no tensor map) -> shared dst
//   bulk_reduce_add_f32(dst, src, bytes)    one thread: global float32 dst += shared src, element-wise, in L2
//   bulk_commit(), bulk_wait_read<N>(), bulk_wait<N>()   the issuing thread's bulk groups: close one; wait until at
//                                           most N are still reading their shared source (or still running at all)
//
// A kernel takes each map as a `const __grid_constant__ TensorMap` parameter, which keeps it in parameter memory,
// where TMA may read it. Announce the box's bytes on the mbarrier first (mbar_arrive_expect_tx, ptx/mbarrier.cuh).
#ifndef COURSE_PTX_TMA_CUH
#define COURSE_PTX_TMA_CUH

#include "common.cuh"

struct alignas(64) TensorMap {
    u64 opaque[16];
};

// One box of a 3-D tensor, coordinates innermost first, into shared memory at dst (the shared-window address, aligned
// as the swizzle needs: 1024 bytes for the 128-byte swizzle); its bytes complete_tx on the mbarrier bar. Parts of the
// box outside the tensor arrive as zeros, and count. The map's generic address (parameter memory) is what TMA takes.
DEVICE void tma_load_3d(u32 dst, const TensorMap& map, int c0, int c1, int c2, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n"
        ::"r"(dst), "l"(reinterpret_cast<u64>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
DEVICE void prefetch_tensor_map(const TensorMap& map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(&map)) : "memory");
}

// A plain bulk copy (no tensor map, no swizzle): `bytes` bytes from global src to shared dst (a shared-window
// address), both 16-byte aligned, `bytes` a multiple of 16; they complete_tx on the mbarrier bar like a tensor load's.
// Unlike a tensor load nothing is zero-filled: every byte must lie inside the allocation.
DEVICE void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// The other direction, with a reduction: `bytes` bytes of float32 at the shared-window address src added element by
// element into global dst (both 16-byte aligned, `bytes` a multiple of 16), the additions done atomically at L2. It
// belongs to the issuing thread's current bulk group: bulk_commit() closes the group; bulk_wait_read<N>() returns
// once at most N groups still read their shared source (so it may be overwritten), bulk_wait<N>() once at most N are
// unfinished (their writes done). Shared writes that a reduction reads must be fenced first (fence.proxy.async).
DEVICE void bulk_reduce_add_f32(float* dst, u32 src, u32 bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}
DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N> DEVICE void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N> DEVICE void bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }

#endif  // COURSE_PTX_TMA_CUH
