// varlen.cu -- padding removal for variable-length batches: block-level prefix sums, cu_seqlens, gather/scatter.
//
// What it computes
//   A batch of B sequences padded to Tmax tokens, with a padding mask (B, Tmax) (nonzero = real token) or just the
//   lengths (B,) (the first lengths[b] positions are real). The packed ("varlen") layout keeps the real tokens one
//   sequence after the other; sequence b's tokens are packed rows cu_seqlens[b] .. cu_seqlens[b+1]-1, where
//   cu_seqlens = [0, l0, l0+l1, ..., total] is the exclusive prefix sum of the lengths (int32, B+1 entries). A
//   real token (b, t) goes to packed row cu_seqlens[b] + rank(b, t), rank = the real tokens before it in its row.
//
//   mask_row_scan(mask, Tmax, lengths, rank)      mask (B, Tmax) uint8 -> lengths (B,) and rank (B, Tmax) (-1 on
//                   padding): one block per row, a block scan of the row's 0/1 flags, chunk after chunk with a carry.
//   scan_lengths(lengths, B, max_len, cu_seqlens) lengths (B,) -> cu_seqlens (B+1,): ONE block that walks the whole
//                   batch, SCAN_ITEMS values per thread per pass, a block scan of the threads' sums, a carry from pass
//                   to pass. Lengths are clamped to [0, max_len] on the way in.
//   gather_rows<UNIT>(x, packed, cu_seqlens, rank, B, Tmax, total, row_units)   padded x (B, Tmax, row) -> packed
//                   (total, row) ("remove padding")
//   scatter_rows<UNIT>(packed, y, cu_seqlens, rank, B, Tmax, total, row_units)  packed (total, row) -> padded y
//                   (B, Tmax, row), zeros on the padding ("restore")
//   rank nullptr: the first cu_seqlens[b+1] - cu_seqlens[b] positions of row b are the real ones. row_units = the
//   row's bytes / UNIT; total = cu_seqlens[B] (the packed rows), a length.
//
// The block scan (block_exclusive_scan): the classic two-level shape.
//   1. inside a warp: an inclusive scan with __shfl_up_sync, 5 steps (1, 2, 4, 8, 16 lanes back);
//   2. lane 31 of each warp writes the warp's total to shared memory; one barrier;
//   3. warp 0 scans those NWARPS totals the same way (NWARPS <= 32); one barrier;
//   4. each thread adds the total of the warps before it: exclusive prefix = that + its inclusive - its own value.
//   Three barriers per pass (the third lets the next pass reuse the shared totals).
//   Why one block for scan_lengths: a batch holds hundreds to a few thousand sequences, which one block of 1024
//   threads covers in one or two passes (a few microseconds, about one launch). A multi-block scan (reduce, then
//   scan the block sums, then add them back; or a single-pass scan with decoupled look-back) pays off from about
//   a million elements, where one SM's bandwidth becomes the limit: exercise in notebook 09.
//
// Layouts and launch (kernels/inference/varlen.py; static shared memory only)
//   mask_row_scan : grid = B,  block = ROW_THREADS;  mask uint8 (B, Tmax) row-major, rank int32 (B, Tmax).
//   scan_lengths  : grid = 1,  block = SCAN_THREADS; each pass covers SCAN_THREADS * SCAN_ITEMS lengths.
//   gather/scatter: grid = ceil(B * Tmax / ROWS_PER_BLOCK), block = COPY_THREADS; one warp per padded row; a row
//                   is row_bytes / UNIT units of UNIT bytes (UNIT = 16: uint4 copies, the launcher's choice when
//                   row_bytes and both base addresses are multiples of 16; else 4 or 2 bytes per unit).
//   Padded row (b, t) is real when rank[b, t] >= 0 (mask given) or t < cu_seqlens[b+1] - cu_seqlens[b] (lengths).
//
// No minimum beyond what nvcc 13 targets (it builds for sm_75, a T4): warp shuffles only, no PTX header.
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/inference/varlen.cu -o varlen.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80, name expressions:
//     "gather_rows<16>" "gather_rows<4>" "gather_rows<2>" "scatter_rows<16>" "scatter_rows<4>" "scatter_rows<2>"
//
// Limits and safety (kernels/inference/varlen.py checks the host-side facts: dtypes, shapes, B * Tmax < 2^31)
//   Values that live on the GPU are clamped here, so no input the launcher accepts reads or writes out of bounds:
//   lengths to [0, max_len]; cu_seqlens[b] to [0, total] and cu_seqlens[b+1] to [cu_seqlens[b], total]; the packed
//   row of a token is used only when it lies in [0, total) and inside its sequence's range. A malformed cu_seqlens
//   gives wrong rows, never a wild access; kernels/inference/varlen.py's check_inputs=True (a sync) rejects it.
// Numerics: integer only; sums are int32 (the launcher rejects B * max_len >= 2^31, so they cannot overflow).
// What comes next: fusing these copies into the neighbouring GEMMs (the QKV projection reads the padded rows
// through the index map, the output projection writes them back), so that padding removal costs no pass at all.
// Notes: kernels/inference/README.md.

#define DEVICE __device__ __forceinline__
#define FULL_MASK 0xffffffffu

#ifndef SCAN_THREADS
#define SCAN_THREADS 1024
#endif
#ifndef SCAN_ITEMS
#define SCAN_ITEMS 4
#endif
#ifndef ROW_THREADS
#define ROW_THREADS 256
#endif
#ifndef COPY_THREADS
#define COPY_THREADS 256
#endif

enum : int { WARP_SIZE = 32, ROWS_PER_BLOCK = COPY_THREADS / WARP_SIZE };
static_assert(SCAN_THREADS % WARP_SIZE == 0 && SCAN_THREADS <= 1024, "SCAN_THREADS: whole warps, <= 1024");
static_assert(ROW_THREADS % WARP_SIZE == 0 && ROW_THREADS <= 1024, "ROW_THREADS: whole warps, <= 1024");
static_assert(COPY_THREADS % WARP_SIZE == 0 && COPY_THREADS <= 1024, "COPY_THREADS: whole warps, <= 1024");
static_assert(SCAN_ITEMS >= 1 && SCAN_ITEMS <= 16, "SCAN_ITEMS in [1, 16]");

// Inclusive scan of x over the 32 lanes of a warp: lane i gets x_0 + ... + x_i.
DEVICE int warp_inclusive_scan(int x) {
    const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int offset = 1; offset < WARP_SIZE; offset <<= 1) {
        const int y = __shfl_up_sync(FULL_MASK, x, offset);
        if (lane >= offset) x += y;
    }
    return x;
}

// Exclusive scan of x over the NTHREADS threads of the block (every thread must call it); `total` gets the sum of
// all x. warp_sums: NTHREADS / 32 ints of shared memory, free again when the function returns.
template <int NTHREADS>
DEVICE int block_exclusive_scan(int x, int* warp_sums, int& total) {
    constexpr int NWARPS = NTHREADS / WARP_SIZE;
    static_assert(NWARPS <= WARP_SIZE, "one warp scans the warp totals");
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int inclusive = warp_inclusive_scan(x);                   // 1. within the warp
    if (lane == WARP_SIZE - 1) warp_sums[warp] = inclusive;         // 2. the warp's total
    __syncthreads();
    if (warp == 0) {                                                // 3. scan the warp totals
        const int w = lane < NWARPS ? warp_sums[lane] : 0;
        const int w_inclusive = warp_inclusive_scan(w);
        if (lane < NWARPS) warp_sums[lane] = w_inclusive;
    }
    __syncthreads();
    const int before = warp > 0 ? warp_sums[warp - 1] : 0;          // 4. the warps before this one
    total = warp_sums[NWARPS - 1];
    __syncthreads();                                                // warp_sums may be reused after this
    return before + inclusive - x;
}

// lengths (B,) -> cu_seqlens (B+1,), one block walking the batch. Thread i takes SCAN_ITEMS consecutive lengths of
// each pass, adds them up, and the block scan of those sums gives where its run starts.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
scan_lengths(const int* __restrict__ lengths, int B, int max_len, int* __restrict__ cu_seqlens) {
    __shared__ int warp_sums[SCAN_THREADS / WARP_SIZE];
    constexpr int PASS = SCAN_THREADS * SCAN_ITEMS;
    if (threadIdx.x == 0) cu_seqlens[0] = 0;
    int carry = 0;  // sum of every length of the passes before this one (the same in every thread)
    for (int base = 0; base < B; base += PASS) {
        // ---- load SCAN_ITEMS lengths, clamped to [0, max_len]; the thread's own running sums -------------------
        const int first = base + threadIdx.x * SCAN_ITEMS;
        int run[SCAN_ITEMS];
        int sum = 0;
#pragma unroll
        for (int i = 0; i < SCAN_ITEMS; ++i) {
            const int idx = first + i;
            const int len = idx < B ? min(max(lengths[idx], 0), max_len) : 0;
            sum += len;
            run[i] = sum;  // inclusive within the thread
        }
        // ---- where this thread's run starts: block scan of the per-thread sums, plus the carry ------------------
        int pass_total;
        const int start = carry + block_exclusive_scan<SCAN_THREADS>(sum, warp_sums, pass_total);
#pragma unroll
        for (int i = 0; i < SCAN_ITEMS; ++i)
            if (first + i < B) cu_seqlens[first + i + 1] = start + run[i];
        carry += pass_total;
    }
}

// mask (B, Tmax) -> lengths (B,), rank (B, Tmax): rank[b, t] = real tokens before t in row b, or -1 on padding.
// One block per row; each pass scans ROW_THREADS flags.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
mask_row_scan(const unsigned char* __restrict__ mask, int Tmax, int* __restrict__ lengths, int* __restrict__ rank) {
    __shared__ int warp_sums[ROW_THREADS / WARP_SIZE];
    const long long row = (long long)blockIdx.x * Tmax;
    int carry = 0;
    for (int t0 = 0; t0 < Tmax; t0 += ROW_THREADS) {
        const int t = t0 + threadIdx.x;
        const int real = t < Tmax && mask[row + t] != 0;
        int pass_total;
        const int before = block_exclusive_scan<ROW_THREADS>(real, warp_sums, pass_total);
        if (t < Tmax) rank[row + t] = real ? carry + before : -1;
        carry += pass_total;
    }
    if (threadIdx.x == 0) lengths[blockIdx.x] = carry;
}

// The UNIT-byte type one copy moves: uint4 (16 bytes, one vector load/store), unsigned int or unsigned short.
template <int UNIT> struct Unit;
template <> struct Unit<16> { typedef uint4 type; };
template <> struct Unit<4> { typedef unsigned int type; };
template <> struct Unit<2> { typedef unsigned short type; };

// The packed row of padded row (b, t), or -1 for padding and for anything a malformed input would put out of range.
// rank may be null: then the first cu_seqlens[b+1] - cu_seqlens[b] positions of row b are the real ones.
DEVICE long long packed_row(const int* __restrict__ cu_seqlens, const int* __restrict__ rank, int b, int t, int Tmax,
                            int total) {
    const int start = min(max(cu_seqlens[b], 0), total);
    const int end = min(max(cu_seqlens[b + 1], start), total);
    const int r = rank != nullptr ? rank[(long long)b * Tmax + t] : t;
    return r >= 0 && r < end - start ? (long long)start + r : -1;
}

// ---- remove padding: packed[packed_row(b, t)] = x[b, t] for the real rows; one warp per padded row ---------
template <int UNIT>
__global__ void __launch_bounds__(COPY_THREADS)
gather_rows(const void* __restrict__ x, void* __restrict__ packed, const int* __restrict__ cu_seqlens,
            const int* __restrict__ rank, int B, int Tmax, int total, int row_units) {
    typedef typename Unit<UNIT>::type T;
    const long long row = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;  // b * Tmax + t
    if (row >= (long long)B * Tmax) return;
    const int b = (int)(row / Tmax), t = (int)(row % Tmax);
    const long long dst = packed_row(cu_seqlens, rank, b, t, Tmax, total);
    if (dst < 0) return;  // padding: nothing to move
    const T* from = static_cast<const T*>(x) + row * row_units;
    T* to = static_cast<T*>(packed) + dst * row_units;
    for (int i = threadIdx.x % WARP_SIZE; i < row_units; i += WARP_SIZE) to[i] = from[i];
}

// ---- restore padding: y[b, t] = packed[packed_row(b, t)], zeros on the padding; every padded row is written --
template <int UNIT>
__global__ void __launch_bounds__(COPY_THREADS)
scatter_rows(const void* __restrict__ packed, void* __restrict__ y, const int* __restrict__ cu_seqlens,
             const int* __restrict__ rank, int B, int Tmax, int total, int row_units) {
    typedef typename Unit<UNIT>::type T;
    const long long row = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    if (row >= (long long)B * Tmax) return;
    const int b = (int)(row / Tmax), t = (int)(row % Tmax);
    const long long src = packed_row(cu_seqlens, rank, b, t, Tmax, total);
    T* to = static_cast<T*>(y) + row * row_units;
    if (src < 0) {
        const T zero{};  // value-initialised: all bytes 0
        for (int i = threadIdx.x % WARP_SIZE; i < row_units; i += WARP_SIZE) to[i] = zero;
        return;
    }
    const T* from = static_cast<const T*>(packed) + src * row_units;
    for (int i = threadIdx.x % WARP_SIZE; i < row_units; i += WARP_SIZE) to[i] = from[i];
}

#ifndef __CUDACC_RTC__
template __global__ void gather_rows<16>(const void*, void*, const int*, const int*, int, int, int, int);
template __global__ void gather_rows<4>(const void*, void*, const int*, const int*, int, int, int, int);
template __global__ void gather_rows<2>(const void*, void*, const int*, const int*, int, int, int, int);
template __global__ void scatter_rows<16>(const void*, void*, const int*, const int*, int, int, int, int);
template __global__ void scatter_rows<4>(const void*, void*, const int*, const int*, int, int, int, int);
template __global__ void scatter_rows<2>(const void*, void*, const int*, const int*, int, int, int, int);
#endif
