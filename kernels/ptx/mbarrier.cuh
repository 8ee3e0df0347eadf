// ptx/mbarrier.cuh -- barriers between the warps of a block on Hopper (sm_90): mbarriers in shared memory, which count
// arrivals and the bytes of asynchronous copies (TMA, ptx/tma.cuh), and named barriers for some of a block's warps.
//
//   mbar_init(bar, count)              one thread: the barrier expects `count` arrivals per phase
//   mbar_init_fence()                  that thread, after its inits: make them visible to TMA (then __syncthreads)
//   mbar_arrive(bar)                   this thread arrives
//   mbar_arrive_expect_tx(bar, bytes)  this thread arrives and announces `bytes` that copies will complete_tx
//   mbar_wait(bar, parity)             return once the phase of that parity has completed
//   named_barrier_sync(id, count)      wait until `count` threads (whole warps) have arrived at or synced on barrier id
//   named_barrier_arrive(id, count)    arrive at barrier id and go on
//   RingPos<SLOTS>                     a position in a ring of SLOTS slots, each with its full/empty mbarriers:
//                                      the slot s and the parity of the phase to wait for there (advance())
//   ld_acquire_gpu(p), st_release_gpu(p, x)   a flag in global memory between blocks: a load that later reads
//                                      and writes of this thread cannot pass, a store that earlier ones cannot pass
//
// An mbarrier is 8 bytes of shared memory; `bar` is its shared-window address (smem_addr). A phase completes when its
// arrivals have come and the announced bytes have landed; its parity bit then flips, and a waiter names the parity it
// waits for. A fresh barrier reports the phase before its first (parity 1) as complete. Named barriers: ids 1..15
// (0 is __syncthreads'); like __syncthreads they order the shared-memory accesses of the threads taking part.
#ifndef COURSE_PTX_MBARRIER_CUH
#define COURSE_PTX_MBARRIER_CUH

#include "common.cuh"

DEVICE void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// The initialised barriers, visible to the async proxy (TMA) as well as, after a __syncthreads, to the other threads.
DEVICE void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}
DEVICE void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrive, and raise the phase's expected transaction count by `bytes`: the phase completes only once copies that
// name this barrier (TMA's complete_tx) have delivered them.
DEVICE void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Wait for the phase of parity `parity` to complete. try_wait suspends the thread for a while inside the instruction,
// so the loop does not spin hard.
DEVICE void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

DEVICE void named_barrier_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
DEVICE void named_barrier_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// A position in a ring of SLOTS slots (K or V tiles, say), each guarded by a full and an empty mbarrier: slot s, and
// the parity of the barrier phase to wait for there, which flips each time the position wraps around.
template <int SLOTS> struct RingPos {  // (not STAGES: a launcher may pass -DSTAGES=...)
    int s = 0;
    u32 phase = 0;
    DEVICE void advance() {
        if (++s == SLOTS) { s = 0; phase ^= 1; }
    }
};

// A flag in global memory that orders blocks (GPU scope): the writer makes its earlier writes visible before the flag,
// the reader sees them once it has read the flag. What the other threads of each block did is ordered by a barrier
// of the block between their accesses and the flag's (and, for the writer's side, a __threadfence of each writer).
DEVICE int ld_acquire_gpu(const int* p) {
    int x;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(x) : "l"(p) : "memory");
    return x;
}
DEVICE void st_release_gpu(int* p, int x) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(x) : "memory");
}

#endif  // COURSE_PTX_MBARRIER_CUH
