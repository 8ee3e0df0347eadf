// threshold.cu -- sampling without sorting the row: logits (rows, V) float32 -> one token per row through temperature,
// top-k and top-p, by a threshold found in a few passes. One block per row (sample_threshold), or on Hopper a cluster
// of blocks per row that reads the row from HBM once (sample_cluster<CS>). Also the beam step's log-sum-exp and the
// Philox uniforms themselves.
//
// What it computes (reference/sampling.py states the same in float64)
//   temperature T -> softmax -> top-k (a prefix of the ranking: larger logit first, ties by the lower index) -> top-p
//   (the shortest prefix of the ranking whose mass reaches p; the crossing token is kept) -> renormalise -> draw: the
//   inverse CDF in VOCABULARY order at u * (kept mass), u = Philox4x32-10(key = seed, counter = (row, 0, offset)).
//   The kept set is every x > v* and the first r logits equal to v* (by index): only v* and r are searched for.
//
// Algorithm (sample_threshold: the row read a few times with 16-byte loads, LOAD_UNROLL in flight per thread)
//   1. pass 1      M = max, mn = smallest finite logit, Z = sum exp((x - M) / T), online per thread      row_stats
//   2. top-k       a lower bound of the k-th logit from the threads' own maxima (no pass): the k-th largest of each
//                  warp's 4 largest thread maxima; every logit at or above it is gathered (3)          kth_max_bound
//      top-p       one pass adds each logit's mass, in 32-bit fixed point, to one of HIST_BINS equal bins over
//                  [mn, M]; the bins around p * Z bracket the crossing logit v*, checked at the gather   top_p_kept
//      fall-back   pivot rounds: PIVOTS values over [lo, hi] count (top-k) or weigh (top-p) the logits above them;
//                  the pivot where that reaches k (or p * Z) narrows [lo, hi] 8 times, until at most CAND_MAX
//                  logits are left or lo = hi (1 to 3 rounds on real logits)                                bracket
//   3. gather      the candidates to shared memory, bitonic sort (value desc, index asc). top-k: the first k ARE
//                  the top k; softmax, top-p and the draw on them, no further pass (topk_kept, draw_kept). top-p: a
//                  scan of their masses over the mass above them gives v* and r                     crossing_scan
//   4. sample      one pass in index order: a block scan of (mass of x > v*, count of x == v*) per tile; the thread
//                  whose group crosses u * (kept mass) walks it; with probs, the renormalised row    sample_pass
//   sample_cluster<CS> runs the same steps on a cluster of CS blocks: block `rank` holds a contiguous slice of the row
//   in shared memory (cp.async, once) and every pass reads it there; the blocks add their partials through distributed
//   shared memory in rank order (mapa + ld.shared::cluster, one barrier.cluster per exchange), so every block holds the
//   same totals to the bit; histogram bins add up as integers (red.shared::cluster.add). Its sampling pass: each warp
//   sums its segment, one warp scans the cluster's segments, the warp whose segment crosses walks it.
//
// Layouts: logits (rows, V) float32 C-contiguous; tokens int32 (rows,); probs (rows, V) float32; lse (rows,) float32.
// Launch (kernels/sampling/sampling.py)
//   sample_threshold, beam_lse  grid rows, block SAMPLE_THREADS; static shared memory only (about 35 KB)
//   sample_cluster<CS>  grid rows * CS (blocks r * CS .. r * CS + CS - 1 hold row r; cluster dims (CS, 1, 1) compiled
//                       in), block CLUSTER_THREADS, dynamic shared memory slice_groups * 16 bytes, slice_groups =
//                       ceil(ceil((V + 3) / 4) / CS), opted in up to the per-block limit minus the 27 to 35 KB static
//                       (about 199 KB on an H100); CS = 16 is non-portable (opted in). sampling.cluster_plan picks CS.
//   philox_uniforms     grid ceil(n / 256), block 256
// Kernels
//   sample_threshold(logits, V, inv_t, top_k, top_p, seed, offset, tokens, probs)
//   sample_cluster<CS>(logits, V, slice_groups, inv_t, top_k, top_p, seed, offset, tokens, probs)
//     inv_t = 1 / temperature; top_k = 0 (or >= the number of finite logits): no top-k; top_p >= 1: no top-p; probs ==
//     nullptr: no renormalised row, else the whole row is written. slice_groups: groups of 4 logits a block holds.
//   beam_lse(logits, V, lse)                  lse = M + log sum exp(x - M) (pass 1 alone)
//   philox_uniforms(out, seed, offset, n)     out[i] = u(seed, row i, offset), the uniforms the rows draw
//
// Requirements: sm_75 (cp.async from sm_80, plain copies below); sample_cluster sm_90 (compiled for an older GPU its body is a trap). Includes
//   ptx/cp_async.cuh (and through it ptx/common.cuh): copy kernels/ptx/ with this file.
// Build it alone, from the repository root:
//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/sampling/threshold.cu -o threshold.o
//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80, name expressions:
//     "sample_cluster<1>" "sample_cluster<2>" "sample_cluster<4>" "sample_cluster<8>" "sample_cluster<16>"
// Host-side example: kernels/examples/sampling_host.cu (top-p with sample_threshold, checked on the CPU).
//
// Limits: top_k <= KMAX = 64 (the gather and the serial top-p over the k are sized for it); V <= 2^24 (counts are
//   float32 sums); |logit| < 1e37 (the pivot arithmetic); after MAX_ROUNDS pivot rounds (never reached by finite
//   logits of a sane range) [lo, hi] counts as ties at hi. NaN logits are skipped like -inf; a row without a finite
//   logit, or with +inf, gives token 0 and zero probabilities. sample_cluster: a row must fit the cluster's shared
//   memory (V <= about 815 000 at CS = 16 on an H100); longer rows run sample_threshold.
// Numerics: float32; every weight is wexp(d) = exp2f(d * log2 e). The kept set and token equal the float64
//   reference's except where a cumulative mass lies within float32 rounding of p * Z or of u * (kept mass).
// Notes (what was tried and measured): kernels/sampling/README.md.

#include "ptx/cp_async.cuh"

#ifndef SAMPLE_THREADS
#define SAMPLE_THREADS 1024
#endif
#ifndef PIVOTS
#define PIVOTS 7
#endif
#ifndef CAND_MAX
#define CAND_MAX 2048
#endif
#ifndef BOUND_PER_WARP
#define BOUND_PER_WARP 4  // thread maxima per warp in the top-k bound of sample_threshold (kth_max_bound)
#endif
#ifndef LOAD_UNROLL
#define LOAD_UNROLL 4
#endif
#ifndef CLUSTER_THREADS
#define CLUSTER_THREADS 512
#endif
#ifndef CLUSTER_CAND
#define CLUSTER_CAND 512
#endif
#ifndef HIST_BINS
#define HIST_BINS 4096
#endif
#ifndef HIST_SHIFT
#define HIST_SHIFT 0  // tests only: moves the histogram's bracket by this many bins, so that its fall-back runs
#endif

#ifndef INFINITY  // NVRTC has no <math.h>
#define INFINITY __int_as_float(0x7f800000)
#endif
#define MAX_ROUNDS 64
#define KMAX 64
#define BIG_INDEX 0x7fffffff

static_assert(SAMPLE_THREADS % 32 == 0 && SAMPLE_THREADS <= 1024, "SAMPLE_THREADS: whole warps");
static_assert((CAND_MAX & (CAND_MAX - 1)) == 0 && CAND_MAX == 2 * SAMPLE_THREADS, "bitonic sort: one pair per thread");
static_assert(PIVOTS >= 1 && PIVOTS <= 31, "PIVOTS: registers");
static_assert(LOAD_UNROLL >= 1, "16-byte loads in flight");
static_assert(CLUSTER_THREADS % 32 == 0 && CLUSTER_THREADS <= 1024, "CLUSTER_THREADS: whole warps");
static_assert((CLUSTER_CAND & (CLUSTER_CAND - 1)) == 0 && CLUSTER_CAND >= 4 * KMAX,
              "CLUSTER_CAND: a power of two (the bitonic sort), room for the top k and more");
static_assert((HIST_BINS & (HIST_BINS - 1)) == 0 && HIST_BINS % SAMPLE_THREADS == 0 &&
              HIST_BINS % CLUSTER_THREADS == 0 && HIST_BINS >= 16,
              "HIST_BINS: a power of two, whole bins per thread of either kernel, and split evenly over 16 blocks");

// ---------------------------------------------------------------------------------------------------------------
// What topk_lists.cu and threshold.cu share, in the same words in both (tests/test_sampling_files.py keeps the two
// copies equal): the weight of a logit, the ranking, the Philox uniform, top-p on a ranked prefix, 16-byte row loads.
// ---------------------------------------------------------------------------------------------------------------

// The weight e^d of a logit, d = (x - M) * inv_t, as 2^(d * log2 e): exp2f is one MUFU.EX2 and a few instructions where
// expf first reduces its argument. Rounding d * log2 e to float32 moves the weight by at most |d| * 2^-24 relative (a
// millionth for the weights that matter, d > -20); every weight, sum and comparison in this file uses this one formula.
__device__ __forceinline__ float wexp(float d) { return exp2f(d * 1.4426950408889634f); }

// a ranks before b: larger value first, ties by the lower index
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

// Philox4x32-10: counter (row, 0, offset_lo, offset_hi), key (seed_lo, seed_hi); u = top 24 bits of word 0 * 2^-24.
__device__ __forceinline__ float philox_uniform(unsigned long long seed, unsigned int row, unsigned long long offset) {
    unsigned int c0 = row, c1 = 0u, c2 = (unsigned int)offset, c3 = (unsigned int)(offset >> 32);
    unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        const unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    }
    return (float)(c0 >> 8) * (1.0f / 16777216.0f);
}

// top-p on k masses in ranking order (k <= 64, one thread): how many the shortest prefix whose sum reaches
// top_p * their total holds (all k for top_p >= 1).
__device__ __forceinline__ int top_p_prefix(const float* w, int k, float top_p) {
    if (top_p >= 1.0f) return k;
    float total = 0.f;
    for (int j = 0; j < k; ++j) total += w[j];
    const float target = top_p * total;
    float cum = 0.f;
    for (int j = 0; j < k; ++j) {
        cum += w[j];
        if (cum >= target) return j + 1;
    }
    return k;
}

// Reading a row with 16-byte loads. Row r starts at logits + r * V, 16-byte aligned only when V % 4 == 0, so groups
// of four start at the row's alignment origin o in (-4, 0]: group g holds x[o + 4g .. o + 4g + 3]; the first and the
// last group may stick out of the row, and those positions read as -inf.
__device__ __forceinline__ int align_origin(const float* x) {
    return -(int)((reinterpret_cast<unsigned long long>(x) & 15ull) >> 2);
}

__device__ __forceinline__ void load4(const float* __restrict__ x, int V, int i0, float (&v)[4]) {
    if (i0 >= 0 && i0 + 4 <= V) {
        const float4 t = __ldg(reinterpret_cast<const float4*>(x + i0));
        v[0] = t.x; v[1] = t.y; v[2] = t.z; v[3] = t.w;
    } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = (i0 + e >= 0 && i0 + e < V) ? __ldg(x + i0 + e) : -INFINITY;
    }
}
// (end of what topk_lists.cu and threshold.cu share)

// philox_uniforms: out[i] = u(seed, i, offset), the uniforms rows 0 .. n - 1 draw (the tests compare their bits).
extern "C" __global__ void philox_uniforms(float* __restrict__ out, unsigned long long seed, unsigned long long offset,
                                           int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = philox_uniform(seed, (unsigned int)i, offset);
}

// ---------------------------------------------------------------------------------------------------------------
// Warp and block reductions, and a pass over the row.
// ---------------------------------------------------------------------------------------------------------------
__device__ __forceinline__ float warp_reduce(float v) {  // sum
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Inclusive scan over the lanes of a warp of a (mass, count) pair, in place: lane l ends with the sums of lanes 0..l.
__device__ __forceinline__ void warp_scan_pair(float& g, int& c) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, g, d);
        const int z = __shfl_up_sync(0xffffffffu, c, d);
        if (lane >= d) { g += y; c += z; }
    }
}

// Sum of N values per thread over the block; every thread gets the N sums. red holds N * 32 floats.
template <int NT, int N>
__device__ __forceinline__ void block_sum(float (&v)[N], float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = warp_reduce(v[j]);
    __syncthreads();  // red may still be read from a previous call
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < N; ++j) red[j * 32 + warp] = v[j];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < N; ++j) {
        float s = lane < NT / 32 ? red[j * 32 + lane] : 0.f;
        v[j] = warp_reduce(s);
    }
}

template <int NT>
__device__ __forceinline__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < NT / 32 ? red[lane] : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// f(value, index) for every position of the row's groups (LOAD_UNROLL 16-byte loads in flight per thread); positions
// outside [0, V) come with the value -inf.
template <int NT, typename F>
__device__ __forceinline__ void for_each_logit(const float* __restrict__ x, int V, F& f) {
    const int o = align_origin(x);
    for (int base = o + 4 * (int)threadIdx.x; base < V; base += 4 * NT * LOAD_UNROLL) {
        float v[LOAD_UNROLL][4];
#pragma unroll
        for (int u = 0; u < LOAD_UNROLL; ++u) load4(x, V, base + 4 * NT * u, v[u]);
#pragma unroll
        for (int u = 0; u < LOAD_UNROLL; ++u) {
#pragma unroll
            for (int e = 0; e < 4; ++e) f(v[u][e], base + 4 * NT * u + e);
        }
    }
}


// Pass 1 of a row (sample_threshold and beam_lse): M = max, mn = smallest finite logit, Z = sum exp((x - M) * inv_t)
// (online per thread, then the threads' sums rescaled to the block's max), n = the number of finite logits.
// m_thread: this thread's own max (-inf if it saw no finite logit).
template <int NT>
__device__ void row_stats(const float* __restrict__ x, int V, float inv_t, float* red, float& M, float& mn, float& Z,
                          float& n, float& m_thread) {
    float m = -INFINITY, lo = INFINITY, s = 0.f, cnt = 0.f;
    auto visit = [&](float v, int) {
        if (v > -INFINITY) {
            lo = fminf(lo, v);
            cnt += 1.f;
            if (v > m) { s = (m > -INFINITY) ? s * wexp((m - v) * inv_t) : 0.f; m = v; }
            s += wexp((v - m) * inv_t);
        }
    };
    for_each_logit<NT>(x, V, visit);
    M = block_max<NT>(m, red);
    mn = -block_max<NT>(-lo, red);
    float t[2] = {(m > -INFINITY && M < INFINITY) ? s * wexp((m - M) * inv_t) : 0.f, cnt};
    block_sum<NT, 2>(t, red);
    Z = t[0];
    n = t[1];
    m_thread = m;
}

// A lower bound for the k-th largest logit of the row (k <= KMAX), from the threads' own maxima and no pass over the
// row: any k values taken from k different threads' maxima are k logits of the row, so the k-th largest of any set
// of at least k thread maxima is at or below the row's k-th largest. The set: each warp's BOUND_PER_WARP largest
// (4 rounds of a warp arg-max), ranked by BOUND_PER_WARP * NT / 32 threads against each other in shared memory.
// It leaves only a few more than k logits at or above it (a NumPy mirror of this kernel's thread layout: 51 to 57
// for k = 50 on rows of 32000 to 256000 normal logits), so one gather collects the top k.
// scratch: BOUND_PER_WARP * NT / 32 floats.
template <int NT>
__device__ float kth_max_bound(float m_thread, int k, float* scratch, float* s_bound) {
    constexpr int NS = BOUND_PER_WARP * (NT / 32);
    static_assert(NS >= KMAX && NS <= NT, "the set must hold KMAX values and be ranked by one thread each");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float v = m_thread;
#pragma unroll
    for (int j = 0; j < BOUND_PER_WARP; ++j) {
        float best = v;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) best = fmaxf(best, __shfl_xor_sync(0xffffffffu, best, off));
        if (lane == 0) scratch[warp * BOUND_PER_WARP + j] = best;
        const unsigned holders = __ballot_sync(0xffffffffu, v == best);  // remove one copy: the lowest lane's
        if (lane == __ffs(holders) - 1) v = -INFINITY;
    }
    __syncthreads();
    if (threadIdx.x < NS) {  // the value of rank k - 1 (larger first, ties by position) is the bound
        const float mine = scratch[threadIdx.x];
        int rank = 0;
        for (int j = 0; j < NS; ++j) {
            const float o = scratch[j];
            rank += (o > mine || (o == mine && j < (int)threadIdx.x)) ? 1 : 0;
        }
        if (rank == k - 1) *s_bound = mine;
    }
    __syncthreads();
    return *s_bound;
}

// One search round, in three steps that sample_threshold (bracket) and sample_cluster (cluster_bracket) share; only the
// pass over the row and the sum of the accumulators differ between them.
//   set_pivots      PIVOTS values spread evenly over [lo, hi]; acc[j] counts the logits above pivot j, acc[PIVOTS + j]
//                   adds up their mass (top-p only)
//   count_above     one logit of the bracket into the accumulators
//   narrow_bracket  from the round's totals: the largest pivot whose measure above still reaches the target becomes lo
//                   (open: its successor), the next pivot up becomes hi; above and n_in follow
__device__ __forceinline__ void set_pivots(float lo, float hi, float (&piv)[PIVOTS], float (&acc)[2 * PIVOTS]) {
    const float width = hi - lo;
#pragma unroll
    for (int j = 0; j < PIVOTS; ++j) {
        piv[j] = fminf(lo + width * ((float)(j + 1) / (float)(PIVOTS + 1)), hi);
        acc[j] = 0.f; acc[PIVOTS + j] = 0.f;
    }
}

template <bool BY_COUNT>
__device__ __forceinline__ void count_above(float v, float M, float inv_t, const float (&piv)[PIVOTS],
                                            float (&acc)[2 * PIVOTS]) {
    const float q = BY_COUNT ? 0.f : wexp((v - M) * inv_t);
#pragma unroll
    for (int j = 0; j < PIVOTS; ++j) {
        const bool up = v > piv[j];
        acc[j] += up ? 1.f : 0.f;
        if (!BY_COUNT) acc[PIVOTS + j] += up ? q : 0.f;
    }
}

template <bool BY_COUNT>
__device__ __forceinline__ void narrow_bracket(const float (&piv)[PIVOTS], const float (&acc)[2 * PIVOTS],
                                               float target, float& lo, float& hi, float& above, float& n_in) {
    int jl = -1;
#pragma unroll
    for (int j = 0; j < PIVOTS; ++j)
        if (above + (BY_COUNT ? acc[j] : acc[PIVOTS + j]) >= target) jl = j;
    // (constant register indices only: the pivot's values are selected in an unrolled loop)
    float new_lo = lo, new_hi = piv[0], new_n = n_in - acc[0];
    float new_above = above + (BY_COUNT ? acc[0] : acc[PIVOTS]);
#pragma unroll
    for (int j = 0; j < PIVOTS; ++j) {
        if (j == jl) {
            const int j1 = j + 1 < PIVOTS ? j + 1 : j;
            const bool last = j + 1 == PIVOTS;
            new_lo = nextafterf(piv[j], INFINITY);
            new_hi = last ? hi : piv[j1];
            new_n = acc[j] - (last ? 0.f : acc[j1]);
            new_above = above + (last ? 0.f : (BY_COUNT ? acc[j1] : acc[PIVOTS + j1]));
        }
    }
    lo = new_lo; hi = fmaxf(new_hi, new_lo); n_in = new_n; above = new_above;
}

// The search rounds: narrow [lo, hi] around the crossing logit, the first logit of the ranking at which the measure
// of the logits ranked up to it reaches `target`. BY_COUNT: the measure is their number (top-k: target = k); else
// their mass exp((x - M) * inv_t) (top-p: target = p * Z). above: the measure of the logits > hi; n_in: the number of
// logits in [lo, hi]. Stops when n_in + (BY_COUNT ? above : 0) <= CAND_MAX, or lo = hi. Uniform across the block.
template <int NT, bool BY_COUNT>
__device__ void bracket(const float* __restrict__ x, int V, float M, float inv_t, float target, float* red, float& lo,
                        float& hi, float& above, float& n_in) {
    for (int round = 0; round < MAX_ROUNDS && n_in + (BY_COUNT ? above : 0.f) > (float)CAND_MAX && lo < hi; ++round) {
        float piv[PIVOTS], acc[2 * PIVOTS];
        set_pivots(lo, hi, piv, acc);
        const float blo = lo, bhi = hi;
        auto visit = [&](float v, int) {
            if (v >= blo && v <= bhi) count_above<BY_COUNT>(v, M, inv_t, piv, acc);  // only the bracket does any work
        };
        for_each_logit<NT>(x, V, visit);
        block_sum<NT, 2 * PIVOTS>(acc, red);
        narrow_bracket<BY_COUNT>(piv, acc, target, lo, hi, above, n_in);
    }
}

// The top-p histogram round (sample_threshold and sample_cluster): one pass that brackets the crossing logit about as
// tightly as three or four pivot rounds.
//   bins     HIST_BINS bins of equal width over [mn, M]: bin(v) = (int)min((v - mn) * bscale, HIST_BINS - 1) with
//            bscale = HIST_BINS / (M - mn). bin() never decreases as v grows, so a run of bins holds an interval of
//            values, equal logits share a bin, and every logit of a higher bin is larger.
//   mass     each logit adds its mass exp((x - M) * inv_t) to its bin in fixed point, round(q * 2^31 / Z), with a
//            32-bit shared-memory atomicAdd. Integer sums do not depend on the order of the additions, so the histogram
//            and every decision taken from it are the same on every run (float atomics would not be). Z >= 1 (the max
//            contributes 1) and V <= 2^24, so the total stays below 2^32.
//   bracket  C(b) = the fixed-point mass of bin b and above. Its rounding errors (at most half a unit a logit, of
//            either sign) mostly cancel, and the float32 sums that decide later differ a little from exact ones; with
//            slack = HIST_SLACK * target, the crossing logit's bin lies in [b_lo, b_hi]: b_hi the highest bin with
//            C(b) >= target - slack, b_lo the highest with C(b) >= target + slack (0 if none). Usually one bin, at
//            times two. The slack is a bet, not a bound: the check below catches a bracket that misses.
//   check    the gather collects the logits of bins [b_lo, b_hi] and adds up, in float32, the mass of the logits above
//            them (mass_hi) and in them (mass_in). When mass_hi < target <= mass_hi + mass_in and the candidates fit,
//            their scan finds the crossing exactly as after pivot rounds. Otherwise (more candidates than fit, as in a
//            long run of equal logits, or a bracket that missed) the pivot rounds run from [mn, M]: the same answer,
//            one histogram pass and one gather later.
// HIST_SLACK: 2^-14 of the target (on normal logits a bin at the crossing holds 4 to 10 times more mass)
#define HIST_SLACK 6.103515625e-5f
struct HistMap {
    float mn, bscale, M, inv_t, fx;  // fx = 2^31 / Z
    __device__ __forceinline__ int bin(float v) const {
        return (int)fminf((v - mn) * bscale, (float)(HIST_BINS - 1));
    }
    __device__ __forceinline__ unsigned int fixed(float v) const {
        return (unsigned int)(wexp((v - M) * inv_t) * fx + 0.5f);
    }
};

// Whether the histogram can cut [mn, M] (a finite bscale), and its map.
__device__ __forceinline__ bool hist_map(float mn, float M, float inv_t, float Z, HistMap& h) {
    h.mn = mn; h.M = M; h.inv_t = inv_t;
    h.bscale = (float)HIST_BINS / (M - mn);
    h.fx = 2147483648.f / fmaxf(Z, 1.f);
    return mn < M && h.bscale <= 3.0e38f;
}

// One logit into the block's histogram (-inf and NaN fail v >= mn and add nothing).
__device__ __forceinline__ void hist_add(float v, const HistMap& h, unsigned int* hist) {
    if (v >= h.mn) {
        const unsigned int f = h.fixed(v);
        if (f) atomicAdd(&hist[h.bin(v)], f);
    }
}

// [b_lo, b_hi] from the complete histogram (every thread returns the same). target and slack in fixed-point units.
// Thread t holds bins t * BPT .. t * BPT + BPT - 1; a suffix scan over the threads gives each its C(b).
// wsum: NT / 32 words; s_b: 2 ints.
template <int NT>
__device__ void hist_bracket(const unsigned int* hist, float target, float slack, unsigned long long* wsum, int* s_b,
                             int& b_lo, int& b_hi) {
    constexpr int BPT = HIST_BINS / NT;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned long long t_hi = (unsigned long long)(target + slack);
    const unsigned long long t_lo = target > slack ? (unsigned long long)(target - slack) : 0ull;
    unsigned int h[BPT];
    unsigned long long mine = 0ull;
#pragma unroll
    for (int j = 0; j < BPT; ++j) { h[j] = hist[tid * BPT + j]; mine += h[j]; }
    unsigned long long incl = mine;  // the sum over lanes >= this one
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const unsigned long long y = __shfl_down_sync(0xffffffffu, incl, d);
        if (lane + d < 32) incl += y;
    }
    if (lane == 0) wsum[warp] = incl;
    if (tid == 0) { s_b[0] = -1; s_b[1] = -1; }
    __syncthreads();
    unsigned long long c = incl - mine;  // C of the bin above this thread's highest
    for (int w2 = warp + 1; w2 < NT / 32; ++w2) c += wsum[w2];
    int lo = -1, hi = -1;
#pragma unroll
    for (int j = BPT - 1; j >= 0; --j) {
        c += h[j];
        if (hi < 0 && c >= t_lo) hi = tid * BPT + j;
        if (lo < 0 && c >= t_hi) lo = tid * BPT + j;
    }
    if (lo >= 0) atomicMax(&s_b[0], lo);
    if (hi >= 0) atomicMax(&s_b[1], hi);
    __syncthreads();
    const int blo = max(s_b[0], 0), bhi = s_b[1] >= 0 ? s_b[1] : HIST_BINS - 1;
    b_lo = min(max(blo + HIST_SHIFT, 0), HIST_BINS - 1);
    b_hi = min(max(bhi + HIST_SHIFT, 0), HIST_BINS - 1);
    __syncthreads();  // s_b and wsum are read before anyone reuses them
}

// The gather's test for the histogram's bracket: in bins [b_lo, b_hi] (true), and the masses of the logits above the
// bracket and in it added to m_hi and m_in.
struct HistIn {
    const HistMap& h;
    int b_lo, b_hi;
    float& m_hi;
    float& m_in;
    __device__ __forceinline__ bool operator()(float v) const {
        if (!(v >= h.mn)) return false;
        const int b = h.bin(v);
        if (b < b_lo) return false;
        const float q = wexp((v - h.M) * h.inv_t);
        if (b > b_hi) { m_hi += q; return false; }
        m_in += q;
        return true;
    }
};

// Bitonic sort of cand[0, nc) in ranking order (value desc, index asc), padded with (-inf, BIG_INDEX) to the next power
// of two (at least 32). Where that fits the block (sort_n <= NT), thread t holds element t in registers through the whole
// network: a step whose partner t ^ stride lies in the same warp (stride < 32; 35 of the 45 steps for 512 elements)
// exchanges by shuffle, with no barrier; a wider step goes through cand_v/cand_i (write, barrier, read the partner).
// Larger sorts (sample_threshold's up to CAND_MAX) loop over pairs in shared memory, one barrier a step.
template <int NT>
__device__ void sort_candidates(float* cand_v, int* cand_i, int nc) {
    int sort_n = 32;
    while (sort_n < nc) sort_n <<= 1;
    const int t = threadIdx.x;
    if (sort_n <= NT) {
        const bool act = t < sort_n;  // whole warps (sort_n is a multiple of 32)
        __syncthreads();  // the candidates written by other threads are visible
        float v = act && t < nc ? cand_v[t] : -INFINITY;
        int i = act && t < nc ? cand_i[t] : BIG_INDEX;
        for (int size = 2; size <= sort_n; size <<= 1) {
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                float pv = v;
                int pi = i;
                if (stride >= 32) {
                    __syncthreads();  // the previous step's reads are done
                    if (act) { cand_v[t] = v; cand_i[t] = i; }
                    __syncthreads();
                    if (act) { pv = cand_v[t ^ stride]; pi = cand_i[t ^ stride]; }
                } else if (act) {
                    pv = __shfl_xor_sync(0xffffffffu, v, stride);
                    pi = __shfl_xor_sync(0xffffffffu, i, stride);
                }
                // The pair's first position (t & stride == 0) takes the element that ranks first where this
                // half-sequence sorts in ranking order ((t & size) == 0), the other one elsewhere.
                const bool take_first = ((t & stride) == 0) == ((t & size) == 0);
                if (act && ranks_before(pv, pi, v, i) == take_first) { v = pv; i = pi; }
            }
        }
        __syncthreads();
        if (act) { cand_v[t] = v; cand_i[t] = i; }
        __syncthreads();
        return;
    }
    for (int j = nc + t; j < sort_n; j += NT) { cand_v[j] = -INFINITY; cand_i[j] = BIG_INDEX; }
    for (int size = 2; size <= sort_n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int q = t; q < sort_n / 2; q += NT) {
                const int a = 2 * q - (q & (stride - 1)), b = a + stride;  // the pair (a, b), a < b
                const bool desc = (a & size) == 0;  // this half-sequence sorts in ranking order
                const bool swap = desc ? ranks_before(cand_v[b], cand_i[b], cand_v[a], cand_i[a])
                                       : ranks_before(cand_v[a], cand_i[a], cand_v[b], cand_i[b]);
                if (swap) {
                    const float tv = cand_v[a]; cand_v[a] = cand_v[b]; cand_v[b] = tv;
                    const int ti = cand_i[a]; cand_i[a] = cand_i[b]; cand_i[b] = ti;
                }
            }
        }
    }
    __syncthreads();
}

// Gather the logits for which in(v) holds (an interval of values: [lo, hi], or the histogram's bins) into shared
// memory and sort them in ranking order (bitonic, on the next power of two); returns how many there are. More than
// CAND_MAX: returns that count, with CAND_MAX of them kept unsorted (the caller narrows further). Uniform across the
// block. in() is called once for every finite or -inf position of the row and may add to the caller's sums.
template <int NT, typename In>
__device__ int gather_sort(const float* __restrict__ x, int V, In& in, float* cand_v, int* cand_i, int* n_cand) {
    if (threadIdx.x == 0) *n_cand = 0;
    __syncthreads();
    auto visit = [&](float v, int i) {
        if (in(v) && i >= 0 && i < V) {
            const int slot = atomicAdd(n_cand, 1);
            if (slot < CAND_MAX) { cand_v[slot] = v; cand_i[slot] = i; }
        }
    };
    for_each_logit<NT>(x, V, visit);
    __syncthreads();
    const int total = *n_cand;
    if (total > CAND_MAX) {
        __syncthreads();  // every thread has read n_cand before a later gather resets it
        return total;
    }
    sort_candidates<NT>(cand_v, cand_i, total);
    return total;
}

template <int NT>
__device__ int gather_sort(const float* __restrict__ x, int V, float lo, float hi, float* cand_v, int* cand_i,
                           int* n_cand) {
    auto in = [&](float v) { return v >= lo && v <= hi; };
    return gather_sort<NT>(x, V, in, cand_v, cand_i, n_cand);
}

// ---------------------------------------------------------------------------------------------------------------
// The ends that sample_threshold and sample_cluster share, once the candidates sit sorted in shared memory.
// ---------------------------------------------------------------------------------------------------------------
// Top-k: the k survivors (cand_v in ranking order, the first n_exact exact, the rest ties at hi), their weights
// w = exp((x - M) * inv_t), top-p within them, and the kept set: v* (s_vstar), r, its mass zp (s_zp) and how many are
// kept (s_n). Every thread of the block returns with the same values in the shared variables.
__device__ void topk_kept(const float* cand_v, int k, int n_exact, float hi, float M, float inv_t, float top_p, float* w,
                          float& s_vstar, int& s_r, float& s_zp, int& s_n) {
    if (threadIdx.x < k) w[threadIdx.x] = wexp(((threadIdx.x < n_exact ? cand_v[threadIdx.x] : hi) - M) * inv_t);
    __syncthreads();
    if (threadIdx.x == 0) {
        const int n = top_p_prefix(w, k, top_p);
        float z = 0.f;
        for (int j = 0; j < n; ++j) z += w[j];
        const float vs = n - 1 < n_exact ? cand_v[n - 1] : hi;
        int rr = 0;
        for (int j = 0; j < n; ++j) rr += (j < n_exact ? cand_v[j] : hi) == vs ? 1 : 0;
        s_vstar = vs; s_r = rr; s_zp = z; s_n = n;
    }
    __syncthreads();
}

// Top-k, every kept logit gathered: the draw among the first n candidates in index order, with no further pass over
// the row. Threads below n rank their indices (distinct) into `order`; thread 0 walks the weights to u * zp (target).
__device__ void draw_kept(const int* cand_i, const float* w, int n, float target, int* order, int* tokens,
                          long long row, int V) {
    if (threadIdx.x < n) {
        int rank = 0;
        for (int l = 0; l < n; ++l) rank += cand_i[l] < cand_i[threadIdx.x] ? 1 : 0;
        order[rank] = threadIdx.x;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float cum = 0.f;
        int token = -1, last = cand_i[0];
        for (int j = 0; j < n; ++j) {
            const int e = order[j];
            if (w[e] > 0.f) last = cand_i[e];
            cum += w[e];
            if (w[e] > 0.f && cum > target) { token = cand_i[e]; break; }
        }
        tokens[row] = min(max(token >= 0 ? token : last, 0), V - 1);  // no crossing (rounding): the last
    }
}

// Top-p: the nc candidates of [lo, hi] in ranking order, EPC a thread (thread t holds t * EPC .. t * EPC + EPC - 1). A
// block scan of their masses on top of mass_hi (the mass of the logits > hi) finds the first that reaches the target
// (rounding, none: the last): v* is its value, r how many of the candidates equal to v* rank up to it (equal values sit
// side by side), zp the kept mass. scan_g: NT / 32 floats. Every thread returns the same values.
template <int NT, int EPC>
__device__ void crossing_scan(const float* cand_v, int nc, float M, float inv_t, float mass_hi, float target,
                              float* scan_g, int* found, int* first_pos, float* s_zp, float& vstar, int& r, float& zp) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float q[EPC], c[EPC], tsum = 0.f;
#pragma unroll
    for (int e = 0; e < EPC; ++e) {
        const int j = tid * EPC + e;
        q[e] = j < nc ? wexp((cand_v[j] - M) * inv_t) : 0.f;
        tsum += q[e];
    }
    float incl = tsum;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += y;
    }
    if (lane == 31) scan_g[warp] = incl;
    if (tid == 0) *found = BIG_INDEX;
    __syncthreads();
    float before = mass_hi;
    for (int w2 = 0; w2 < warp; ++w2) before += scan_g[w2];
    const float prev = __shfl_up_sync(0xffffffffu, incl, 1);
    before += lane > 0 ? prev : 0.f;
#pragma unroll
    for (int e = 0; e < EPC; ++e) { before += q[e]; c[e] = before; }  // the mass up to and including each
#pragma unroll
    for (int e = 0; e < EPC; ++e) {
        if (tid * EPC + e < nc && c[e] >= target) { atomicMin(found, tid * EPC + e); break; }
    }
    __syncthreads();
    const int js = max(*found == BIG_INDEX ? nc - 1 : *found, 0);  // rounding: no crossing -> all candidates
    vstar = cand_v[js];
#pragma unroll
    for (int e = 0; e < EPC; ++e)
        if (tid * EPC + e == js) *s_zp = c[e];
    if (tid == 0) *first_pos = js;
    __syncthreads();
    for (int j = tid; j <= js; j += NT)
        if (cand_v[j] == vstar && (j == 0 || cand_v[j - 1] != vstar)) *first_pos = j;
    __syncthreads();
    r = js - *first_pos + 1;
    zp = *s_zp;
}

// Top-p, the search stopped on ties (every logit of [lo, hi] equals hi, or the round cap was hit): v* = hi, and the
// fewest r of the n_in ties at hi (at least one) whose mass on top of mass_hi reaches the target.
__device__ __forceinline__ void ties_at_hi(float hi, float M, float inv_t, float target, float mass_hi, float n_in,
                                           float& vstar, int& r, float& zp) {
    vstar = hi;
    const float qv = wexp((hi - M) * inv_t);
    const float need = qv > 0.f ? ceilf((target - mass_hi) / qv) : n_in;
    r = (int)fminf(fmaxf(need, 1.f), n_in);
    zp = mass_hi + (float)r * qv;
}

// Top-p, in both kernels: the kept set (v*, r, zp) from the histogram round, or from pivot rounds by mass where its
// bracket misses. Row is how the kernel reads its row and adds up over it: OneBlockRow (sample_threshold: every pass
// reads the row from memory, sums over the block) or ClusterRow (sample_cluster: every pass reads the block's slice in
// shared memory, sums over the cluster). Both give
//   Row::NT, Row::EPC, Row::CAND       threads, candidates a thread scans, at most this many candidates
//   fill_histogram(hm)                 the row's fixed-point masses in row.hist, complete on return
//   gather(in) / gather(lo, hi)        the logits for which in(v) holds / of [lo, hi], sorted into cand_v, cand_i
//   sum(m)                             two floats a thread summed over the row's threads
//   mass_rounds(target, lo, hi, above, n_in)    the pivot rounds by mass (bracket / cluster_bracket)
// and the shared arrays hist, wsum, s_b, cand_v, scan_g and the words found, first_pos, s_zp.
template <typename Row>
__device__ __forceinline__ void top_p_kept(Row& row, float top_p, float mn, float Z, float n_finite, float& vstar,
                                           int& r, float& zp) {
    constexpr int NT = Row::NT, EPC = Row::EPC;
    const float M = row.M, inv_t = row.inv_t;
    const float target = top_p * Z;
    bool crossed = false;
    HistMap hm;
    if (hist_map(mn, M, inv_t, Z, hm)) {
        // ---- top-p: the histogram round, one pass: a bracket of one or two bins around the crossing logit ----
        row.fill_histogram(hm);
        int b_lo, b_hi;
        hist_bracket<NT>(row.hist, target * hm.fx, HIST_SLACK * target * hm.fx, row.wsum, row.s_b, b_lo, b_hi);
        // ---- top-p: gather the bracket's logits, sort, and if it holds the crossing, scan their masses ----
        float m[2] = {0.f, 0.f};  // the mass above the bracket, in it
        HistIn in{hm, b_lo, b_hi, m[0], m[1]};
        const int nc = row.gather(in);
        row.sum(m);
        crossed = nc <= Row::CAND && m[0] < target && m[0] + m[1] >= target;
        if (crossed)
            crossing_scan<NT, EPC>(row.cand_v, nc, M, inv_t, m[0], target, row.scan_g, row.found, row.first_pos,
                                   row.s_zp, vstar, r, zp);
    }
    if (!crossed) {
        // ---- top-p, the fall-back: bracket the crossing logit by mass with pivot rounds ----
        float lo = mn, hi = M, mass_hi = 0.f, n_in = n_finite;
        row.mass_rounds(target, lo, hi, mass_hi, n_in);
        if (n_in <= (float)Row::CAND && lo < hi) {
            // ---- top-p: gather the logits of [lo, hi], sort, scan their masses on top of mass_hi ----
            const int nc = row.gather(lo, hi);
            crossing_scan<NT, EPC>(row.cand_v, nc, M, inv_t, mass_hi, target, row.scan_g, row.found, row.first_pos,
                                   row.s_zp, vstar, r, zp);
        } else {
            // ---- top-p: ties (every logit in [lo, hi] equals hi, or the round cap was hit) ----
            ties_at_hi(hi, M, inv_t, target, mass_hi, n_in, vstar, r, zp);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// sample_threshold: temperature -> softmax -> top-k -> top-p -> draw, no sort of the row. One block per row.
// ---------------------------------------------------------------------------------------------------------------
// sample_threshold's row for top_p_kept: every pass reads the row from memory (for_each_logit), every sum is the
// block's.
struct OneBlockRow {
    static constexpr int NT = SAMPLE_THREADS, EPC = CAND_MAX / SAMPLE_THREADS, CAND = CAND_MAX;
    const float* x;
    int V;
    float M, inv_t;
    float *red, *cand_v, *scan_g, *s_zp;
    int *cand_i, *n_cand, *s_b, *found, *first_pos;
    unsigned int* hist;
    unsigned long long* wsum;
    __device__ __forceinline__ void fill_histogram(const HistMap& hm) {
        for (int b = threadIdx.x; b < HIST_BINS; b += NT) hist[b] = 0u;
        __syncthreads();
        auto fill = [&](float v, int) { hist_add(v, hm, hist); };
        for_each_logit<NT>(x, V, fill);
        __syncthreads();
    }
    template <typename In>
    __device__ __forceinline__ int gather(In& in) { return gather_sort<NT>(x, V, in, cand_v, cand_i, n_cand); }
    __device__ __forceinline__ int gather(float lo, float hi) {
        return gather_sort<NT>(x, V, lo, hi, cand_v, cand_i, n_cand);
    }
    __device__ __forceinline__ void sum(float (&m)[2]) { block_sum<NT, 2>(m, red); }
    __device__ __forceinline__ void mass_rounds(float target, float& lo, float& hi, float& above, float& n_in) {
        bracket<NT, false>(x, V, M, inv_t, target, red, lo, hi, above, n_in);
    }
    __device__ __forceinline__ void count_rounds(float target, float& lo, float& hi, float& above, float& n_in) {
        bracket<NT, true>(x, V, M, inv_t, target, red, lo, hi, above, n_in);
    }
};

// The sampling pass of sample_threshold: the row once more, in index order, in tiles of NT groups of four. A block scan
// of (mass of x > vstar, count of x == vstar) gives each thread the kept mass before its group (the first r ties at
// vstar are kept); the first position where it passes u * zp is the token (atomicMin on found). With probs the pass
// writes the renormalised row and runs to the end. No crossing (u * zp at or past the kept total by rounding): the
// last kept token. red: 32 floats; scan_g, scan_c: NT / 32 each. tid, lane, warp: the kernel's (computed once there;
// the steps of sample_cluster take them the same way).
template <int NT>
__device__ __forceinline__ void sample_pass(const float* __restrict__ x, int V, float M, float inv_t, float vstar,
                                            int r, float zp, float u, float* red, float* scan_g, int* scan_c,
                                            int& found, int* __restrict__ tokens, float* __restrict__ probs,
                                            long long row, int tid, int lane, int warp) {
    const float qv = vstar > -INFINITY ? wexp((vstar - M) * inv_t) : 0.f;
    const float target = u * zp;
    const float inv_zp = 1.f / zp;
    const int o = align_origin(x);
    float carry_g = 0.f;
    int carry_c = 0, last_kept = -1;
    __syncthreads();
    if (tid == 0) found = BIG_INDEX;
    __syncthreads();
    for (int base = o; base < V; base += NT * 4) {
        const int i0 = base + 4 * tid;  // this thread's group of four
        float v[4];
        load4(x, V, i0, v);
        float g = 0.f;
        int c = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (v[e] > vstar) g += wexp((v[e] - M) * inv_t);
            c += (v[e] == vstar && i0 + e >= 0 && i0 + e < V) ? 1 : 0;
        }
        // inclusive warp scans, then across warps
        float gi = g;
        int ci = c;
        warp_scan_pair(gi, ci);
        if (lane == 31) { scan_g[warp] = gi; scan_c[warp] = ci; }
        __syncthreads();
        float g_before = carry_g, g_tile = 0.f;
        int c_before = carry_c, c_tile = 0;
        for (int w2 = 0; w2 < NT / 32; ++w2) {
            if (w2 < warp) { g_before += scan_g[w2]; c_before += scan_c[w2]; }
            g_tile += scan_g[w2];
            c_tile += scan_c[w2];
        }
        g_before += gi - g;
        c_before += ci - c;
        // walk the group: kept mass so far = g_before + qv * min(ties so far, r)
        float cum = g_before + qv * (float)min(c_before, r);
        int ties = c_before;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = i0 + e;
            if (i >= 0 && i < V) {
                bool keep = v[e] > vstar;
                if (v[e] == vstar) { keep = ties < r; ++ties; }
                const float q = keep ? wexp((v[e] - M) * inv_t) : 0.f;
                if (keep && q > 0.f) last_kept = i;
                cum += q;
                if (keep && q > 0.f && cum > target) atomicMin(&found, i);
                if (probs != nullptr) probs[row * V + i] = q * inv_zp;
            }
        }
        carry_g += g_tile;
        carry_c += c_tile;
        __syncthreads();  // scan_g reused; found visible
        if (found != BIG_INDEX && probs == nullptr) break;
    }
    // ---- no crossing (u * zp at or past the kept total by rounding): the last kept token ----
    if (found == BIG_INDEX) {
        const float lk = block_max<NT>((float)last_kept, red);
        if (tid == 0) tokens[row] = min(max((int)lk, 0), V - 1);
    } else if (tid == 0) {
        tokens[row] = min(max(found, 0), V - 1);
    }
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_threshold(const float* __restrict__ logits, int V, float inv_t, int top_k, float top_p,
                 unsigned long long seed, unsigned long long offset, int* __restrict__ tokens,
                 float* __restrict__ probs) {
    constexpr int NT = SAMPLE_THREADS;
    __shared__ float red[32 * 2 * PIVOTS];
    __shared__ float cand_v[CAND_MAX];
    __shared__ int cand_i[CAND_MAX];
    __shared__ float w[KMAX];
    __shared__ int order[KMAX];
    __shared__ int n_cand, found, first_pos, s_r, s_n;
    __shared__ float s_vstar, s_zp, s_bound;
    __shared__ float scan_g[NT / 32];
    __shared__ int scan_c[NT / 32];
    __shared__ unsigned int hist[HIST_BINS];
    __shared__ unsigned long long wsum[NT / 32];
    __shared__ int s_b[2];
    const long long row = blockIdx.x;
    const float* x = logits + row * V;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    // ---- pass 1: max, smallest finite logit, softmax denominator ----
    float M, mn, Z, n_finite, m_thread;
    row_stats<NT>(x, V, inv_t, red, M, mn, Z, n_finite, m_thread);
    if (!(M > -INFINITY && M < INFINITY)) {  // no finite logit, or +inf / NaN: token 0, zero probabilities
        if (tid == 0) tokens[row] = 0;
        if (probs != nullptr)
            for (int i = tid; i < V; i += NT) probs[row * V + i] = 0.f;
        return;
    }
    const float u = philox_uniform(seed, (unsigned int)row, offset);
    OneBlockRow rd{x, V, M, inv_t, red, cand_v, scan_g, &s_zp, cand_i, &n_cand, s_b, &found, &first_pos, hist, wsum};

    // The kept set: x > vstar, and the first r logits equal to vstar (by index). zp: its mass.
    float vstar = -INFINITY, zp = Z;
    int r = 0;
    const int k = (float)top_k < n_finite ? top_k : 0;  // k >= the finite logits: every one of them is in the top k
    if (k > 0) {
        // ---- top-k: gather every logit at or above a lower bound of the k-th; the first k sorted ARE the top k ----
        float lo = fmaxf(kth_max_bound<NT>(m_thread, k, cand_v, &s_bound), mn), hi = M, above = 0.f;
        int nc = rd.gather(lo, INFINITY);
        bool all_in = nc <= CAND_MAX;
        if (!all_in) {
            // ---- more than CAND_MAX at or above the bound (a row of many equal logits): bracket the k-th logit
            // by counts from there; then every logit >= lo fits, or (a run of equal logits at hi) gather the fewer
            // than k logits > hi, and the rest of the top k are the first ties at hi ----
            float n_in = (float)nc;
            rd.count_rounds((float)k, lo, hi, above, n_in);
            all_in = above + n_in <= (float)CAND_MAX && lo < hi;
            nc = rd.gather(all_in ? lo : nextafterf(hi, INFINITY), INFINITY);
        }
        const int n_exact = all_in ? k : min(nc, k);
        // ---- top-k: softmax of the k, top-p within them ----
        topk_kept(cand_v, k, n_exact, hi, M, inv_t, top_p, w, s_vstar, s_r, s_zp, s_n);
        vstar = s_vstar; r = s_r; zp = s_zp;
        if (all_in && probs == nullptr) {
            // ---- top-k: the draw among the kept candidates, in index order (no further pass over the row) ----
            draw_kept(cand_i, w, s_n, u * zp, order, tokens, row, V);
            return;
        }
    } else if (top_p < 1.0f) {
        // ---- top-p: the histogram round, and pivot rounds where its bracket misses (top_p_kept) ----
        top_p_kept(rd, top_p, mn, Z, n_finite, vstar, r, zp);
    }

    // ---- sample: one pass in index order, block scan of (mass of x > vstar, count of x == vstar) ----
    sample_pass<NT>(x, V, M, inv_t, vstar, r, zp, u, red, scan_g, scan_c, found, tokens, probs, row, tid, lane,
                    warp);
}

// ---------------------------------------------------------------------------------------------------------------
// The beam step's log-sum-exp: lse = M + log sum exp(x - M) of each row (sample_threshold's pass 1). One block per row.
// ---------------------------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
beam_lse(const float* __restrict__ logits, int V, float* __restrict__ lse) {
    __shared__ float red[64];
    float M, mn, Z, n, m_thread;
    row_stats<SAMPLE_THREADS>(logits + (long long)blockIdx.x * V, V, 1.0f, red, M, mn, Z, n, m_thread);
    if (threadIdx.x == 0) lse[blockIdx.x] = (M > -INFINITY && M < INFINITY) ? M + logf(Z) : M;
}

// ---------------------------------------------------------------------------------------------------------------
// sample_cluster<CS>: sample_threshold's algorithm with the row read from HBM once. A cluster of CS blocks (sm_90) holds
// the row in shared memory, block `rank` a contiguous slice of it; every pass runs on the slices, and the blocks add up
// their partial results through distributed shared memory (one cluster barrier per exchange).
//
//   row (groups of four from the alignment origin, as in load4):  |  rank 0  |  rank 1  | ... | rank CS-1 |
//   block:   NW = CLUSTER_THREADS / 32 warps; for the sampling pass warp w owns the groups [w * gw, (w + 1) * gw) of
//            its block's slice, so (rank, warp) enumerates the row's segments in index order.
//   exchange: block partials -> xch (this block's shared memory) -> cluster barrier -> every block reads all CS
//            partials with ld.shared::cluster and adds them in rank order, so every block holds the same totals to
//            the bit and takes the same decisions (bracket, kept set) without a second barrier.
// ---------------------------------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define HAS_CLUSTERS 0
#define CLUSTER_DIMS(n)
#else
#define HAS_CLUSTERS 1
#define CLUSTER_DIMS(n) __cluster_dims__(n, 1, 1)
#endif
#define CLUSTER_WARPS (CLUSTER_THREADS / 32)
#define XCH (2 * PIVOTS > 4 ? 2 * PIVOTS : 4)  // floats one block contributes to an exchange

#if HAS_CLUSTERS
__device__ __forceinline__ unsigned int cluster_rank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// The cluster barrier: arrive (release: this thread's shared-memory writes and reads are done) and wait (acquire).
// Every thread of every block of the cluster takes part; a block may leave only after the others stop reading it.
// (Not .aligned: some calls follow code where the threads of a warp took different branches.)
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
__device__ __forceinline__ void cluster_sync() { cluster_arrive(); cluster_wait(); }

// The shared-memory variable *p of block `rank` of this cluster (mapa: its address in the cluster's window).
__device__ __forceinline__ unsigned int cluster_address(const void* p, unsigned int rank) {
    unsigned int a = smem_addr(p), r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
__device__ __forceinline__ float load_remote(const float* p, unsigned int rank) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_address(p, rank)) : "memory");
    return v;
}
__device__ __forceinline__ int load_remote(const int* p, unsigned int rank) {
    int v;
    asm volatile("ld.shared::cluster.s32 %0, [%1];" : "=r"(v) : "r"(cluster_address(p, rank)) : "memory");
    return v;
}
__device__ __forceinline__ unsigned int load_remote(const unsigned int* p, unsigned int rank) {
    unsigned int v;
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(cluster_address(p, rank)) : "memory");
    return v;
}
// *p of block `rank` += v, atomically (integer adds: the total does not depend on their order)
__device__ __forceinline__ void add_remote(unsigned int* p, unsigned int rank, unsigned int v) {
    asm volatile("red.relaxed.cluster.shared::cluster.add.u32 [%0], %1;" ::"r"(cluster_address(p, rank)), "r"(v)
                 : "memory");
}


// The cluster's sums of N values per thread: every thread of every block gets the same N totals (the same additions
// in the same order everywhere). One cluster barrier; xch alternates between two buffers (buf), so a block may write
// the next exchange while a slower one still reads this one.
template <int CS, int N>
__device__ __forceinline__ void cluster_sum(float (&v)[N], float* red, float (*xch)[XCH], float* tot, int& buf) {
    static_assert(N <= XCH, "exchange buffer");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = warp_reduce(v[j]);
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < N; ++j) red[j * 32 + warp] = v[j];
    }
    __syncthreads();
    if (threadIdx.x < N) {
        float s = 0.f;
        for (int w2 = 0; w2 < CLUSTER_WARPS; ++w2) s += red[threadIdx.x * 32 + w2];
        xch[buf][threadIdx.x] = s;
    }
    cluster_sync();
    if (threadIdx.x < N) {
        float part[CS];
#pragma unroll
        for (int r = 0; r < CS; ++r) part[r] = load_remote(&xch[buf][threadIdx.x], r);  // all loads in flight
        float s = 0.f;
#pragma unroll
        for (int r = 0; r < CS; ++r) s += part[r];
        tot[threadIdx.x] = s;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = tot[j];
    buf ^= 1;
}

// bracket() on the cluster's slices: the same pivots and update, the counts and masses summed over the cluster, and
// rounds until at most CLUSTER_CAND logits are left.
template <int CS, bool BY_COUNT>
__device__ void cluster_bracket(const float4* slice, int ng, float M, float inv_t, float target, float* red,
                                float (*xch)[XCH], float* tot, int& buf, float& lo, float& hi, float& above,
                                float& n_in) {
    for (int round = 0; round < MAX_ROUNDS && n_in + (BY_COUNT ? above : 0.f) > (float)CLUSTER_CAND && lo < hi;
         ++round) {
        float piv[PIVOTS], acc[2 * PIVOTS];
        set_pivots(lo, hi, piv, acc);
        for (int g = threadIdx.x; g < ng; g += CLUSTER_THREADS) {
            const float4 t = slice[g];
            const float v4[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
                if (v4[e] >= lo && v4[e] <= hi) count_above<BY_COUNT>(v4[e], M, inv_t, piv, acc);
        }
        cluster_sum<CS, 2 * PIVOTS>(acc, red, xch, tot, buf);
        narrow_bracket<BY_COUNT>(piv, acc, target, lo, hi, above, n_in);
    }
}

// The logits of the cluster's slices for which in(v) holds (an interval of values, as in gather_sort): each block
// gathers its own into loc, then every block copies all blocks' (in rank order) into cand and sorts them; returns how
// many there are. More than CLUSTER_CAND: returns that count and copies nothing (the caller narrows first).
// i_base: the index of slice[0].x. last_remote: no exchange follows on this path, so arrive at the final cluster
// barrier after the copy.
template <int CS, typename In>
__device__ int cluster_gather_sort(const float4* slice, int ng, int i_base, int V, In& in, float* loc_v, int* loc_i,
                                   int* n_loc, int* off, float* cand_v, int* cand_i, bool last_remote) {
    if (threadIdx.x == 0) *n_loc = 0;
    __syncthreads();
    for (int g = threadIdx.x; g < ng; g += CLUSTER_THREADS) {
        const float4 t = slice[g];
        const float v4[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = i_base + 4 * g + e;
            if (in(v4[e]) && i >= 0 && i < V) {
                const int slot = atomicAdd(n_loc, 1);
                if (slot < CLUSTER_CAND) { loc_v[slot] = v4[e]; loc_i[slot] = i; }
            }
        }
    }
    cluster_sync();
    if (threadIdx.x == 0) {
        int cnt[CS];
#pragma unroll
        for (int r = 0; r < CS; ++r) cnt[r] = load_remote(n_loc, r);
        int o = 0;
#pragma unroll
        for (int r = 0; r < CS; ++r) { off[r] = o; o += cnt[r]; }
        off[CS] = o;
    }
    __syncthreads();
    const int nc = off[CS];
    if (nc > CLUSTER_CAND) {
        if (last_remote) cluster_arrive();
        return nc;
    }
    for (int c = threadIdx.x; c < nc; c += CLUSTER_THREADS) {  // candidate c of the cluster: one pair of loads each
        int r = 0;
        while (c >= off[r + 1]) ++r;
        const float v = load_remote(&loc_v[c - off[r]], r);
        const int i = load_remote(&loc_i[c - off[r]], r);
        cand_v[c] = v;
        cand_i[c] = i;
    }
    if (last_remote) cluster_arrive();
    sort_candidates<CLUSTER_THREADS>(cand_v, cand_i, nc);
    return nc;
}

template <int CS>
__device__ int cluster_gather_sort(const float4* slice, int ng, int i_base, int V, float lo, float hi, float* loc_v,
                                   int* loc_i, int* n_loc, int* off, float* cand_v, int* cand_i, bool last_remote) {
    auto in = [&](float v) { return v >= lo && v <= hi; };
    return cluster_gather_sort<CS>(slice, ng, i_base, V, in, loc_v, loc_i, n_loc, off, cand_v, cand_i, last_remote);
}

// The histogram round's pass on the cluster: each block bins its slice into its own hist, then adds its bins into
// their owners' hsum (bin b lives in block b / (HIST_BINS / CS)) with remote atomic adds, and after a cluster barrier
// copies the whole sum back into hist (CS = 1: hist is the sum). hist and hsum start zeroed (before the kernel's first
// cluster barrier).
template <int CS>
__device__ void cluster_hist_fill(const float4* slice, int ng, const HistMap& hm, unsigned int* hist,
                                  unsigned int* hsum) {
    constexpr int PER = HIST_BINS / CS;
    for (int g = threadIdx.x; g < ng; g += CLUSTER_THREADS) {
        const float4 t = slice[g];
        hist_add(t.x, hm, hist); hist_add(t.y, hm, hist); hist_add(t.z, hm, hist); hist_add(t.w, hm, hist);
    }
    __syncthreads();
    if (CS > 1) {
        constexpr int BPT = HIST_BINS / CLUSTER_THREADS;  // bins b = threadIdx.x + j * CLUSTER_THREADS, j < BPT
        unsigned int h[BPT];
#pragma unroll
        for (int j = 0; j < BPT; ++j) h[j] = hist[threadIdx.x + j * CLUSTER_THREADS];
#pragma unroll
        for (int j = 0; j < BPT; ++j) {
            const int b = threadIdx.x + j * CLUSTER_THREADS;
            if (h[j]) add_remote(&hsum[b % PER], b / PER, h[j]);
        }
        cluster_sync();
#pragma unroll
        for (int j = 0; j < BPT; ++j) {  // all BPT remote loads in flight before the first store
            const int b = threadIdx.x + j * CLUSTER_THREADS;
            h[j] = load_remote(&hsum[b % PER], b / PER);
        }
#pragma unroll
        for (int j = 0; j < BPT; ++j) hist[threadIdx.x + j * CLUSTER_THREADS] = h[j];
        __syncthreads();
    }
}

// Pass 1 on the cluster: M = max, mn = smallest finite logit, Z = sum exp((x - M) * inv_t), n = the finite logits;
// online per thread over its groups of the slice, then per warp, per block (thread 0, in warp order) and over the
// cluster (thread 0 of every block, in rank order: the same totals in every block). One exchange through xch[buf].
template <int CS>
__device__ __forceinline__ void cluster_row_stats(const float4* slice, int ng, float inv_t, float* red,
                                                  float (*xch)[XCH], float* tot, int& buf, float& M, float& mn,
                                                  float& Z, float& n_finite, int tid, int lane, int warp) {
    constexpr int NT = CLUSTER_THREADS, NW = CLUSTER_WARPS;
    float m = -INFINITY, lo = INFINITY, s = 0.f, cnt = 0.f;
    for (int g = tid; g < ng; g += NT) {
        const float4 t = slice[g];
        const float v4[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float v = v4[e];
            if (v > -INFINITY) {
                lo = fminf(lo, v);
                cnt += 1.f;
                if (v > m) { s = (m > -INFINITY) ? s * wexp((m - v) * inv_t) : 0.f; m = v; }
                s += wexp((v - m) * inv_t);
            }
        }
    }
    float wm = m;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        wm = fmaxf(wm, __shfl_xor_sync(0xffffffffu, wm, d));
        lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, d));
    }
    s = (m > -INFINITY && wm < INFINITY) ? s * wexp((m - wm) * inv_t) : 0.f;
    s = warp_reduce(s);
    cnt = warp_reduce(cnt);
    if (lane == 0) { red[warp] = wm; red[32 + warp] = lo; red[64 + warp] = s; red[96 + warp] = cnt; }
    __syncthreads();
    if (tid == 0) {  // the block's, in warp order
        float bm = -INFINITY, blo = INFINITY, bs = 0.f, bn = 0.f;
        for (int w2 = 0; w2 < NW; ++w2) { bm = fmaxf(bm, red[w2]); blo = fminf(blo, red[32 + w2]); bn += red[96 + w2]; }
        for (int w2 = 0; w2 < NW; ++w2)
            bs += (red[w2] > -INFINITY && bm < INFINITY) ? red[64 + w2] * wexp((red[w2] - bm) * inv_t) : 0.f;
        xch[buf][0] = bm; xch[buf][1] = blo; xch[buf][2] = bs; xch[buf][3] = bn;
    }
    cluster_sync();
    if (tid == 0) {  // the cluster's, in rank order (the same in every block)
        float pm[CS], plo[CS], ps[CS], pn[CS];
#pragma unroll
        for (int r = 0; r < CS; ++r) {
            pm[r] = load_remote(&xch[buf][0], r); plo[r] = load_remote(&xch[buf][1], r);
            ps[r] = load_remote(&xch[buf][2], r); pn[r] = load_remote(&xch[buf][3], r);
        }
        float cm = -INFINITY, clo = INFINITY, cs = 0.f, cn = 0.f;
#pragma unroll
        for (int r = 0; r < CS; ++r) { cm = fmaxf(cm, pm[r]); clo = fminf(clo, plo[r]); cn += pn[r]; }
#pragma unroll
        for (int r = 0; r < CS; ++r) cs += (pm[r] > -INFINITY && cm < INFINITY) ? ps[r] * wexp((pm[r] - cm) * inv_t) : 0.f;
        tot[0] = cm; tot[1] = clo; tot[2] = cs; tot[3] = cn;
    }
    __syncthreads();
    M = tot[0]; mn = tot[1]; Z = tot[2]; n_finite = tot[3];
    buf ^= 1;
}

// sample_cluster's row for top_p_kept: every pass reads this block's slice in shared memory, every sum is the
// cluster's (cluster_sum), and a gather collects the candidates of all the cluster's slices.
template <int CS>
struct ClusterRow {
    static constexpr int NT = CLUSTER_THREADS, EPC = (CLUSTER_CAND + NT - 1) / NT, CAND = CLUSTER_CAND;
    const float4* slice;
    int ng, i_base, V;
    float M, inv_t;
    float *red, (*xch)[XCH], *tot;
    int& buf;
    float *loc_v, *cand_v, *scan_g, *s_zp;
    int *loc_i, *n_loc, *off, *cand_i, *s_b, *found, *first_pos;
    unsigned int *hist, *hsum;
    unsigned long long* wsum;
    __device__ __forceinline__ void fill_histogram(const HistMap& hm) {
        cluster_hist_fill<CS>(slice, ng, hm, hist, hsum);
    }
    template <typename In>
    __device__ __forceinline__ int gather(In& in) {
        return cluster_gather_sort<CS>(slice, ng, i_base, V, in, loc_v, loc_i, n_loc, off, cand_v, cand_i, false);
    }
    __device__ __forceinline__ int gather(float lo, float hi, bool last_remote = false) {
        return cluster_gather_sort<CS>(slice, ng, i_base, V, lo, hi, loc_v, loc_i, n_loc, off, cand_v, cand_i,
                                       last_remote);
    }
    __device__ __forceinline__ void sum(float (&m)[2]) { cluster_sum<CS, 2>(m, red, xch, tot, buf); }
    __device__ __forceinline__ void mass_rounds(float target, float& lo, float& hi, float& above, float& n_in) {
        cluster_bracket<CS, false>(slice, ng, M, inv_t, target, red, xch, tot, buf, lo, hi, above, n_in);
    }
    __device__ __forceinline__ void count_rounds(float target, float& lo, float& hi, float& above, float& n_in) {
        cluster_bracket<CS, true>(slice, ng, M, inv_t, target, red, xch, tot, buf, lo, hi, above, n_in);
    }
};

// The load: this block's slice of the row (groups [g0, g0 + ng) from the alignment origin, i_base the index of its
// first logit), HBM -> shared memory once, 16-byte cp.async all in flight; a group that sticks out of the row (the
// first or the last) goes through load4 and holds -inf there.
__device__ __forceinline__ void load_slice(float4* slice, const float* __restrict__ x, int V, int i_base, int ng,
                                           int tid) {
    for (int g = tid; g < ng; g += CLUSTER_THREADS) {
        const int i0 = i_base + 4 * g;
        if (i0 >= 0 && i0 + 4 <= V) {
            float4* dst = &slice[g];
            const float* src = x + i0;
            cp_async_16(smem_addr(dst), src);
        } else {
            float v[4];
            load4(x, V, i0, v);
            slice[g] = make_float4(v[0], v[1], v[2], v[3]);
        }
    }
    cp_async_wait_all();
    __syncthreads();
}

// The sampling pass, 1: the mass of x > vstar and the count of x == vstar over this warp's segment of the slice (groups
// [jb, je)), into seg_g[warp] and seg_c[warp], which the cluster's scan reads.
__device__ __forceinline__ void segment_sums(const float4* slice, int jb, int je, int i_base, int V, float M,
                                             float inv_t, float vstar, float* seg_g, int* seg_c, int lane, int warp) {
    float g = 0.f;
    int c = 0;
    for (int j = jb + lane; j < je; j += 32) {
        const float4 t = slice[j];
        const float v4[4] = {t.x, t.y, t.z, t.w};
        const int i0 = i_base + 4 * j;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (v4[e] > vstar) g += wexp((v4[e] - M) * inv_t);
            c += (v4[e] == vstar && i0 + e >= 0 && i0 + e < V) ? 1 : 0;
        }
    }
    g = warp_reduce(g);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) c += __shfl_xor_sync(0xffffffffu, c, d);
    if (lane == 0) { seg_g[warp] = g; seg_c[warp] = c; }
}

// The sampling pass, 2 (warp 0 of every block, after a cluster barrier): the cluster's NE = CS * NW segments
// e = rank * NW + warp, in index order, EPL a lane, read from every block and scanned. The kept mass before segment e
// is g_before + qv * min(ties_before, r). s_walk: the first segment whose kept mass crosses target = u * zp (s_cross =
// 1), or (rounding: none does) the last segment that keeps any mass (s_cross = 0). This block's segments get the mass
// and ties before them in seg_gb, seg_cb.
template <int CS>
__device__ __forceinline__ void scan_segments(unsigned int rank, float qv, int r, float target, const float* seg_g,
                                              const int* seg_c, float* seg_gb, int* seg_cb, int& s_walk, int& s_cross,
                                              int lane) {
    constexpr int NW = CLUSTER_WARPS, NE = CS * NW, EPL = (NE + 31) / 32;  // segments, and segments a lane
    float eg[EPL];
    int ec[EPL];
#pragma unroll
    for (int t = 0; t < EPL; ++t) {
        const int e = lane * EPL + t;
        eg[t] = e < NE ? load_remote(&seg_g[e % NW], e / NW) : 0.f;
        ec[t] = e < NE ? load_remote(&seg_c[e % NW], e / NW) : 0;
    }
    float sg = 0.f;
    int sc = 0;
#pragma unroll
    for (int t = 0; t < EPL; ++t) { sg += eg[t]; sc += ec[t]; }
    warp_scan_pair(sg, sc);
    float gb = __shfl_up_sync(0xffffffffu, sg, 1);
    int cb = __shfl_up_sync(0xffffffffu, sc, 1);
    if (lane == 0) { gb = 0.f; cb = 0; }
    int cross = BIG_INDEX, last = -1;
#pragma unroll
    for (int t = 0; t < EPL; ++t) {
        const int e = lane * EPL + t;
        if (e < NE) {
            const float ga = gb + eg[t];
            const int ca = cb + ec[t];
            const float kb = gb + qv * (float)min(cb, r), ka = ga + qv * (float)min(ca, r);
            if (kb <= target && target < ka && cross == BIG_INDEX) cross = e;
            if (eg[t] > 0.f || (qv > 0.f && min(ca, r) > min(cb, r))) last = e;
            if (e / NW == (int)rank) { seg_gb[e % NW] = gb; seg_cb[e % NW] = cb; }
            gb = ga; cb = ca;
        }
    }
    cross = __reduce_min_sync(0xffffffffu, cross);
    last = __reduce_max_sync(0xffffffffu, last);
    if (lane == 0) { s_walk = cross != BIG_INDEX ? cross : max(last, 0); s_cross = cross != BIG_INDEX; }
}

// The sampling pass, 3: walk this warp's segment in tiles of 32 groups (a warp scan per tile), from the mass and ties
// before it (gcar, ccar). mine: the segment s_walk names, whose warp writes the token: with cross, the first kept
// position where the kept mass passes target; without (rounding), its last kept position. With probs every warp walks
// its segment and writes its part of the renormalised row.
__device__ __forceinline__ void walk_segment(const float4* slice, int jb, int je, int i_base, int V, float M,
                                             float inv_t, float vstar, float qv, int r, float target, float inv_zp,
                                             bool mine, bool cross, float gcar, int ccar, int* __restrict__ tokens,
                                             float* __restrict__ probs, long long row, int lane) {
    int token = -1, last_kept = -1;
    for (int jt = jb; jt < je; jt += 32) {
        const int j = jt + lane;
        const bool in = j < je;
        const float4 t = in ? slice[j] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        const float v4[4] = {t.x, t.y, t.z, t.w};
        const int i0 = i_base + 4 * j;
        float gl = 0.f;
        int cl = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (v4[e] > vstar) gl += wexp((v4[e] - M) * inv_t);
            cl += (in && v4[e] == vstar && i0 + e >= 0 && i0 + e < V) ? 1 : 0;
        }
        float gi = gl;
        int ci = cl;
        warp_scan_pair(gi, ci);
        float gx = __shfl_up_sync(0xffffffffu, gi, 1);
        int ties = __shfl_up_sync(0xffffffffu, ci, 1);
        if (lane == 0) { gx = 0.f; ties = 0; }
        ties += ccar;
        float cum = (gcar + gx) + qv * (float)min(ties, r);
        int hit = BIG_INDEX;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = i0 + e;
            if (in && i >= 0 && i < V) {
                bool keep = v4[e] > vstar;
                if (v4[e] == vstar) { keep = ties < r; ++ties; }
                const float q = keep ? wexp((v4[e] - M) * inv_t) : 0.f;
                if (keep && q > 0.f) last_kept = i;
                cum += q;
                if (keep && q > 0.f && cum > target && hit == BIG_INDEX) hit = i;
                if (probs != nullptr) probs[row * V + i] = q * inv_zp;
            }
        }
        gcar += __shfl_sync(0xffffffffu, gi, 31);
        ccar += __shfl_sync(0xffffffffu, ci, 31);
        if (cross && token < 0) {
            hit = __reduce_min_sync(0xffffffffu, hit);
            if (hit != BIG_INDEX) token = hit;
        }
        if (token >= 0 && probs == nullptr) break;
    }
    last_kept = __reduce_max_sync(0xffffffffu, last_kept);
    if (mine && lane == 0) tokens[row] = min(max(token >= 0 ? token : last_kept, 0), V - 1);
}
#endif  // HAS_CLUSTERS

template <int CS>
CLUSTER_DIMS(CS) __global__ void __launch_bounds__(CLUSTER_THREADS, 2)
sample_cluster(const float* __restrict__ logits, int V, int slice_groups, float inv_t, int top_k, float top_p,
               unsigned long long seed, unsigned long long offset, int* __restrict__ tokens, float* __restrict__ probs) {
    static_assert(CS >= 1 && CS <= 16, "CS: 1 to 16 blocks per cluster (above 8: non-portable, opted in by the launcher)");
#if HAS_CLUSTERS
    constexpr int NT = CLUSTER_THREADS, NW = CLUSTER_WARPS;
    extern __shared__ float4 slice[];  // this block's groups of the row: slice_groups * 16 bytes
    __shared__ float cand_v[CLUSTER_CAND];  // the cluster's candidates, sorted
    __shared__ int cand_i[CLUSTER_CAND];
    __shared__ float loc_v[CLUSTER_CAND];  // this block's candidates (the other blocks copy them)
    __shared__ int loc_i[CLUSTER_CAND];
    __shared__ float red[32 * 2 * PIVOTS];
    __shared__ float xch[2][XCH], tot[XCH];
    __shared__ float seg_g[NW], seg_gb[NW];  // sampling pass: each warp's segment's mass above v* and ties (read by
    __shared__ int seg_c[NW], seg_cb[NW];    // the cluster), and the mass and ties before it in the row
    __shared__ float w[KMAX], scan_g[NW], s_vstar, s_zp;
    __shared__ int order[KMAX], off[CS + 1], n_loc, found, first_pos, s_r, s_n, s_walk, s_cross;
    __shared__ unsigned int hist[HIST_BINS], hsum[CS > 1 ? HIST_BINS / CS : 1];  // top-p: this block's bins, the
    //                                                                                  bins it owns
    __shared__ unsigned long long wsum[NW];
    __shared__ int s_b[2];
    const unsigned int rank = cluster_rank();
    const long long row = blockIdx.x / CS;
    const float* x = logits + row * V;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int o = align_origin(x);
    const int g0 = (int)rank * slice_groups;              // this block's first group of the row
    const int ng = max(0, min(slice_groups, (V - o + 3) / 4 - g0));  // and how many it holds
    const int i_base = o + 4 * g0;                        // the index of slice[0].x
    int buf = 0;
    if (top_p < 1.0f) {  // zeroed before the first cluster barrier, so before any block adds to hsum
        for (int b = tid; b < HIST_BINS; b += NT) hist[b] = 0u;
        for (int b = tid; b < (CS > 1 ? HIST_BINS / CS : 0); b += NT) hsum[b] = 0u;
    }

    // ---- load: this block's slice, HBM -> shared memory once (16-byte cp.async, all in flight) ----
    load_slice(slice, x, V, i_base, ng, tid);

    // ---- pass 1: max, smallest finite logit, softmax denominator (per thread online, per warp, per block, cluster) ----
    float M, mn, Z, n_finite;
    cluster_row_stats<CS>(slice, ng, inv_t, red, xch, tot, buf, M, mn, Z, n_finite, tid, lane, warp);
    if (!(M > -INFINITY && M < INFINITY)) {  // no finite logit, or +inf / NaN: token 0, zero probabilities
        cluster_arrive();
        if (rank == 0 && tid == 0) tokens[row] = 0;
        if (probs != nullptr)
            for (int i = max(i_base, 0) + tid; i < min(i_base + 4 * ng, V); i += NT) probs[row * V + i] = 0.f;
        cluster_wait();
        return;
    }
    const float u = philox_uniform(seed, (unsigned int)row, offset);
    ClusterRow<CS> rd{slice, ng, i_base, V, M, inv_t, red, xch, tot, buf, loc_v, cand_v, scan_g, &s_zp,
                      loc_i, &n_loc, off, cand_i, s_b, &found, &first_pos, hist, hsum, wsum};

    // The kept set: x > vstar, and the first r logits equal to vstar (by index). zp: its mass.
    float vstar = -INFINITY, zp = Z;
    int r = 0;
    const int k = (float)top_k < n_finite ? top_k : 0;
    if (k > 0) {
        // ---- top-k: bracket the k-th logit by counts over the cluster, gather, sort ----
        float lo = mn, hi = M, above = 0.f, n_in = n_finite;
        rd.count_rounds((float)k, lo, hi, above, n_in);
        const bool all_in = above + n_in <= (float)CLUSTER_CAND && lo < hi;
        const bool draw_here = all_in && probs == nullptr;  // the draw among the candidates: no sampling pass
        const int nc = rd.gather(all_in ? lo : nextafterf(hi, INFINITY), INFINITY, draw_here);
        const int n_exact = all_in ? k : min(nc, k);
        // ---- top-k: softmax of the k, top-p within them (every block, the same numbers) ----
        topk_kept(cand_v, k, n_exact, hi, M, inv_t, top_p, w, s_vstar, s_r, s_zp, s_n);
        vstar = s_vstar; r = s_r; zp = s_zp;
        if (draw_here) {
            // ---- top-k: the draw among the kept candidates, in index order (block 0 of the cluster) ----
            if (rank == 0) draw_kept(cand_i, w, s_n, u * zp, order, tokens, row, V);
            cluster_wait();
            return;
        }
    } else if (top_p < 1.0f) {
        // ---- top-p: the histogram round over the cluster, and pivot rounds where its bracket misses (top_p_kept) ----
        top_p_kept(rd, top_p, mn, Z, n_finite, vstar, r, zp);
    }

    // ---- sample: each warp's segment summed, the cluster's segments scanned, one warp walks the crossing one ----
    const float qv = vstar > -INFINITY ? wexp((vstar - M) * inv_t) : 0.f;
    const float target = u * zp;
    const float inv_zp = 1.f / zp;
    const int gw = (slice_groups + NW - 1) / NW;
    const int jb = min(warp * gw, ng), je = min(jb + gw, ng);  // this warp's segment of the slice
    segment_sums(slice, jb, je, i_base, V, M, inv_t, vstar, seg_g, seg_c, lane, warp);
    cluster_sync();
    if (warp == 0) scan_segments<CS>(rank, qv, r, target, seg_g, seg_c, seg_gb, seg_cb, s_walk, s_cross, lane);
    __syncthreads();
    cluster_arrive();  // the last read of another block's shared memory
    const bool mine = s_walk == (int)rank * NW + warp;  // this warp's segment holds the token
    if (mine || probs != nullptr) {
        // ---- sample: walk the segment in tiles of 32 groups (a warp scan per tile); with probs, every warp ----
        const bool cross = mine && s_cross;
        walk_segment(slice, jb, je, i_base, V, M, inv_t, vstar, qv, r, target, inv_zp, mine, cross, seg_gb[warp],
                     seg_cb[warp], tokens, probs, row, lane);
    }
    cluster_wait();
#else
    __trap();  // launched only on sm_90 and newer (the launcher checks)
#endif
}

#ifndef __CUDACC_RTC__
#define SAMPLE_CLUSTER_INSTANCE(CS)                                                                                     \
    template __global__ void sample_cluster<CS>(const float*, int, int, float, int, float, unsigned long long,          \
                                                unsigned long long, int*, float*);
SAMPLE_CLUSTER_INSTANCE(1)
SAMPLE_CLUSTER_INSTANCE(2)
SAMPLE_CLUSTER_INSTANCE(4)
SAMPLE_CLUSTER_INSTANCE(8)
SAMPLE_CLUSTER_INSTANCE(16)
#endif
