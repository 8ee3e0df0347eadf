// ptx/mbarrier.cuh -- barriers between the warps of a block on Hopper (sm_90): mbarriers in shared memory, which
// count arrivals and the bytes of asynchronous copies (TMA), and named barriers for a subset of the block's warps.
//
// An mbarrier is a 64-bit word in shared memory (bar: its shared-window address, smem_addr). It completes a phase when
// its expected arrivals have come and the bytes announced with expect_tx have landed; the phase's parity bit then
// flips. A waiter names the parity of the phase it waits for; a fresh barrier reports the phase before its first
// (parity 1) as complete. Each call is made by the threads that take part (one thread, or lane 0 of each warp):
//
//   mbar_init(bar, count)               one thread: set the barrier to expect `count` arrivals per phase
//   mbar_init_fence()                   the initialising thread, after its mbar_init calls: make them visible to the
//                                       async proxy (TMA) and, with the __syncthreads that follows, to the block
//   mbar_arrive(bar)                    count this thread's arrival
//   mbar_arrive_expect_tx(bar, bytes)   count an arrival and announce `bytes` more that asynchronous copies will deliver
//   mbar_wait(bar, parity)              return once the phase of that parity has completed (try_wait suspends the
//                                       thread inside the instruction for a while: the loop does not spin hard)
//
// Named barriers (id 1..15; 0 is __syncthreads'), for `count` threads in whole warps; like __syncthreads they order
// the shared-memory accesses of the threads taking part:
//   named_barrier_sync(id, count)       wait until `count` threads have arrived at or synced on barrier id
//   named_barrier_arrive(id, count)     count this thread's arrival at barrier id and go on
#ifndef COURSE_PTX_MBARRIER_CUH
#define COURSE_PTX_MBARRIER_CUH

#include "common.cuh"

DEVICE void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
DEVICE void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
}
DEVICE void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
DEVICE void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
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

#endif  // COURSE_PTX_MBARRIER_CUH
