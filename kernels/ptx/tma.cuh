// ptx/tma.cuh -- the Tensor Memory Accelerator (sm_90): one thread asks for a whole box of a tensor in global memory,
// and TMA copies it into shared memory (swizzled as the tensor map says) and counts its bytes against an mbarrier.
//
//   TensorMap                           a CUtensorMap: 128 opaque bytes, 64-byte aligned, written on the host by the
//                                       driver's cuTensorMapEncodeTiled (base address, sizes, strides, box, swizzle).
//                                       A kernel takes it as a `const __grid_constant__ TensorMap` parameter, which
//                                       keeps it in parameter memory, where TMA may read it.
//   tma_load_3d(dst, map, c0, c1, c2, bar)
//                                       one thread: copy the box at coordinates (c0, c1, c2) (innermost first) to the
//                                       shared-window address dst; its bytes complete_tx on the mbarrier bar (announce
//                                       them first with mbar_arrive_expect_tx, ptx/mbarrier.cuh). Parts of the box
//                                       outside the tensor arrive as zeros and count as bytes too.
//   prefetch_tensor_map(map)            one thread: fetch the map into the cache TMA reads it from
#ifndef COURSE_PTX_TMA_CUH
#define COURSE_PTX_TMA_CUH

#include "common.cuh"

struct alignas(64) TensorMap {
    u64 opaque[16];
};

DEVICE void tma_load_3d(u32 dst, const TensorMap& map, int c0, int c1, int c2, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];\n"
        ::"r"(dst), "l"(reinterpret_cast<u64>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
DEVICE void prefetch_tensor_map(const TensorMap& map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<u64>(&map)) : "memory");
}

#endif  // COURSE_PTX_TMA_CUH
