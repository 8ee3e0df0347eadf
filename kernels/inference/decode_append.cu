// decode_append.cu -- write the new keys and values of a decoding step into a KV cache (contiguous or paged).
//
// What it computes
//   For each sequence b, KV head h and new row i < Tn: position p = max(L_b, 0) + i (L_b = seqlens[b], the number of
//   keys already in the cache) receives k_new[b, h, i, :] and v_new[b, h, i, :]. The lengths are not changed: the
//   caller adds Tn afterwards (a kernel that also bumped seqlens[b] would race with its own threads reading it).
//   Any element type: rows move as 16-byte chunks, so d * itemsize must be a multiple of 16.
//
// Layouts (C-contiguous; indices in 16-byte chunks, 64-bit)
//   k_new, v_new (B, Hkv, Tn, d): chunk idx = ((b * Hkv + h) * Tn + i) * CPR + c, CPR = d * itemsize / 16.
//   contiguous cache (B, Hkv, Tmax, d): row (b * Hkv + h) * Tmax + p.
//   paged cache (num_pages, Hkv, P, d), P = 2^page_shift: row (page * Hkv + h) * P + p % P, page = block_table[b, p / P].
//   FasterTransformer's key layout (k only, contiguous; ft_layout = 1): k (B, Hkv, CPR, Tmax, 16 bytes), chunk c of
//   position p at ((b * Hkv + h) * CPR + c) * Tmax + p.
//
// Launch (kernels/inference/decode_append.py)
//   one thread per 16-byte chunk of k_new (it also moves the same chunk of v_new), grid-stride loop;
//   block = APPEND_THREADS (256), grid = min(ceil(total / APPEND_THREADS), 65536), total = B * Hkv * Tn * CPR; no
//   shared memory.
//
// Signature: append_kv(k_new, v_new, k_cache, v_cache, seqlens, block_table, Hkv, Tn, cpr, cache_rows, page_shift,
//   max_pages, num_pages, ft_layout, long long total)
//   block_table nullptr: contiguous cache, cache_rows = Tmax (the capacity), page_shift = max_pages = num_pages = 0;
//   else cache_rows = P and page_shift = log2 P. seqlens: (B,) int32, the lengths before the append. cpr = CPR.
//
// No minimum beyond what nvcc 13 targets (it builds for sm_75, a T4): plain 16-byte loads and stores, no PTX header.
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/inference/decode_append.cu -o decode_append.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80 (extern "C" kernels: no name expressions)
//
// Limits: indices are never trusted. A row whose position is at or past the capacity (Tmax, or max_pages * P), or
// whose page index lies outside [0, num_pages), is dropped: nothing is written for it. A negative length counts as 0.
// Numerics: none; a copy.
// What comes next: a serving engine fuses this copy into the kernel that produces k and v (the QKV projection with
// rotary embeddings), so the new rows do not make an extra round trip through global memory.
// Notes: kernels/inference/README.md.

#ifndef APPEND_THREADS
#define APPEND_THREADS 256
#endif

extern "C" __global__ void __launch_bounds__(APPEND_THREADS)
append_kv(const uint4* __restrict__ k_new, const uint4* __restrict__ v_new, uint4* __restrict__ k_cache,
          uint4* __restrict__ v_cache, const int* __restrict__ seqlens, const int* __restrict__ block_table, int Hkv,
          int Tn, int cpr, int cache_rows, int page_shift, int max_pages, int num_pages, int ft_layout,
          long long total) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const bool paged = block_table != nullptr;
    const long long capacity = paged ? (long long)max_pages << page_shift : (long long)cache_rows;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += stride) {
        const int c = (int)(idx % cpr);
        const long long r = idx / cpr;  // row of (B, Hkv, Tn)
        const int i = (int)(r % Tn);
        const long long bh = r / Tn;     // b * Hkv + h
        const int h = (int)(bh % Hkv);
        const long long b = bh / Hkv;
        const long long p = (long long)max(seqlens[b], 0) + i;
        if (p >= capacity) continue;  // no room: dropped
        long long row;
        if (paged) {
            const int page = block_table[b * max_pages + (p >> page_shift)];
            if (page < 0 || page >= num_pages) continue;  // not a page of the pool: dropped
            row = (((long long)page * Hkv + h) << page_shift) | (p & ((1LL << page_shift) - 1));
        } else {
            row = bh * cache_rows + p;
        }
        const long long k_at = ft_layout ? (bh * cpr + c) * cache_rows + p : row * cpr + c;
        k_cache[k_at] = k_new[idx];
        v_cache[row * cpr + c] = v_new[idx];
    }
}
