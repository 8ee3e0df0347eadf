// timing.cu -- three helper kernels for measuring other kernels: hold the GPU busy, flush the L2 cache, read memory.
//
// What they compute
//   hold_gpu(ns)            does nothing for `ns` nanoseconds of the GPU's global timer, on one thread. The timing
//                           helper (kernels/core/timing.py) launches it first, then queues the calls to be timed behind
//                           it: while the GPU waits here, Python has time to queue every launch, so the events around
//                           the queued calls measure GPU work only, back to back, with no gap where the GPU waits for
//                           the host.
//   flush_l2(buf, n, value) writes `value` to n 32-bit words of `buf` (a buffer larger than the L2 cache), so that the
//                           next kernel finds none of its inputs in L2: the "cold L2" measurement.
//   read_only(src, n4, out) reads n4 16-byte words of `src` and writes one word per block (their XOR), so that nothing
//                           is optimised away: the read bandwidth a memory-bound kernel that only reads (a decoding
//                           kernel streaming its KV cache) is measured against. Each thread issues READ_UNROLL loads
//                           before it uses any, so that enough bytes are in flight to cover the memory's latency
//                           (kernels/core/README.md has what one load at a time measured).
//
// Launch (kernels/core/timing.py)
//   hold_gpu:  grid = 1, block = 1.
//   flush_l2:  grid-stride loop; block = 256 threads, grid = min(ceil(n / 256), 65536).
//   read_only: grid-stride loop; block = 256 threads, grid = 4 blocks per SM x SMs; out has grid entries.
//
// Needs compute capability 7.0 (__nanosleep); CUDA 13 compiles for 7.5 and newer. Includes nothing.
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_75 -I kernels -c kernels/core/timing.cu -o timing.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_75 (extern "C" kernels: no name expressions)
//
// Numerics
//   None. %globaltimer is a 64-bit nanosecond clock shared by the whole GPU (PTX ISA, "Special Registers");
//   __nanosleep lets the warp yield instead of spinning at full issue rate.

typedef unsigned long long u64;

__device__ __forceinline__ u64 global_timer_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void hold_gpu(u64 ns) {
    const u64 start = global_timer_ns();
    while (global_timer_ns() - start < ns) __nanosleep(2000);
}

extern "C" __global__ void flush_l2(unsigned* __restrict__ buf, long long n, unsigned value) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) buf[i] = value;
}

#define READ_UNROLL 8

extern "C" __global__ void read_only(const uint4* __restrict__ src, long long n4, unsigned* __restrict__ out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (READ_UNROLL - 1) * stride < n4; i += READ_UNROLL * stride) {  // READ_UNROLL loads in flight
        uint4 x[READ_UNROLL];
#pragma unroll
        for (int u = 0; u < READ_UNROLL; ++u) x[u] = __ldcs(src + i + u * stride);  // streaming: read once
#pragma unroll
        for (int u = 0; u < READ_UNROLL; ++u) acc ^= x[u].x ^ x[u].y ^ x[u].z ^ x[u].w;
    }
    for (; i < n4; i += stride) {  // the last words, one at a time
        const uint4 x = __ldcs(src + i);
        acc ^= x.x ^ x.y ^ x.z ^ x.w;
    }
    for (int off = 16; off > 0; off /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, off);
    __shared__ unsigned warp_acc[32];
    if (threadIdx.x % 32 == 0) warp_acc[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < blockDim.x / 32; ++w) acc ^= warp_acc[w];
        out[blockIdx.x] = acc;
    }
}
