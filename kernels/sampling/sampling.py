"""Launcher for kernels/sampling/topk_lists.cu and threshold.cu: the last step of decoding (logits -> tokens) and the
beam-search step.

    tokens = sample(logits, temperature=0.8, top_k=50, top_p=0.95, seed=1234, offset=step)
    tokens, probs = sample(logits, top_p=0.9, seed=1, return_probs=True)    # probs: the renormalised rows
    values, indices = top_k(logits, 50)                                      # FasterTransformer's top-k
    scores, parent, token = beam_step(logits, cum_logprobs, beam=4)
    k_cache = reorder_cache(k_cache, parent)                                 # rows follow their parent beams
    u = philox_uniforms(n, seed, offset)                                     # the uniforms rows 0..n-1 draw

logits   (rows, V) float32 CuPy array, C-contiguous, 1 <= V <= MAX_VOCAB. Finite (|logit| < 1e37, for the threshold
         search's pivot arithmetic) or -inf; NaN entries are skipped like -inf. A row with no finite logit, or with a
         +inf logit, gives token 0 and zero probabilities.
temperature  a finite float > 0 (greedy decoding is top_k=1).
top_k    0 (off) or an int; k >= V is off too; 1 <= k <= KMAX = 64 runs the top-k path, a k in (64, V) raises.
top_p    in (0, 1]; 1 is off.
seed, offset  ints in [0, 2^64): row r draws u = Philox4x32-10(key=seed, counter=(r, 0, offset)); reference.sampling
         computes the same u, so a seed reproduces the same tokens on CPU and GPU (up to float32 rounding at a CDF
         boundary, see reference.sampling.cdf_margin).

Two ways to the same tokens (reference/sampling.py states the semantics both follow):
    top_k_method="threshold" (the default, any k and p), no sort of the row: max and sum, then the threshold
                    bracketed (top-p: by a histogram of the mass in HIST_BINS bins, one pass; top-k: from a bound of the
                    threads' maxima, or pivot rounds by count, which are also top-p's fall-back), a gather and sort of
                    the last few candidates, then the draw (among the k survivors for top-k; one pass in index order
                    otherwise).
                    Two kernels run it:
                    sample_cluster<CS> (sm_90, where a row fits): a cluster of CS blocks per row reads the row from
                        HBM once into their shared memory and runs every pass there, the blocks adding their partial
                        sums through distributed shared memory. V <= about 815 000 (16 blocks of 199 KB).
                    sample_threshold: one block per row reading the logits from HBM on every pass.
                    cluster_plan(rows, V, top_k, top_p) picks the kernel and CS: the cluster kernel for plain
                    sampling, for top-p up to SMs / 2 rows and for top-k up to about SMs / CS rows; sample_threshold
                    for larger batches, older GPUs and longer rows. Both live in threshold.cu.
    top_k_method="lists" (0 < top_k < V only): FasterTransformer's top-k, topk_stage1 (grid (rows, S)) + topk_sample<KB>
                    (one block per row): sorted lists in registers merged across blocks, then softmax, top-p and the
                    draw on the k values. Reads the logits once. topk_lists.cu.
The beam step runs beam_lse (threshold.cu), then topk_stage1 and beam_stage2<KB> (topk_lists.cu); reorder_cache runs
reorder_rows (topk_lists.cu). What was measured to choose all this: kernels/sampling/README.md.
"""

from __future__ import annotations

import math

import numpy as np

from ..core import (MAX_GRID_X, MAX_GRID_YZ, ceil_div, check_alignment, check_array, check_grid, cp, current_device,
                    defines_from, device_info, get_kernel, gpu_unavailable_reason, scalar)

LISTS_FILE, THRESHOLD_FILE = "topk_lists.cu", "threshold.cu"
KERNEL_FILES = (LISTS_FILE, THRESHOLD_FILE)
WHAT = "sampling"
DTYPES = ("float32",)
TOPK_THREADS = 256
TOPK_EPT = 16  # logits per thread in topk_stage1 (its per-thread list)
SLICE = TOPK_THREADS * TOPK_EPT  # logits per stage-1 block
SAMPLE_THREADS = 1024
PIVOTS = 7  # pivots per search round of sample_threshold
CAND_MAX = 2 * SAMPLE_THREADS  # candidates sorted in shared memory
LOAD_UNROLL = 4  # 16-byte loads in flight per thread in sample_threshold's passes
REORDER_THREADS = 256
CLUSTER_THREADS = 512  # threads per block of sample_cluster
CLUSTER_CAND = 512  # sample_cluster: pivot rounds go on until at most this many logits are left to gather and sort
HIST_BINS = 4096  # top-p: bins of the histogram round that brackets the crossing logit in one pass
MIN_BLOCK_GROUPS = 1000  # cluster_plan widens a cluster for a few rows while each block keeps this many groups
SLICE_TARGET_BYTES = 64 * 1024  # and for many rows until a block's slice is at most this (two blocks fit an SM)
CLUSTER_SIZES = (1, 2, 4, 8, 16)  # blocks per cluster (one row per cluster); 16 is non-portable (opted in, probed)
PORTABLE_CLUSTER = 8  # the largest cluster every sm_90 GPU runs
CLUSTER_MIN_CC = (9, 0)  # thread-block clusters and distributed shared memory: Hopper
GROUP_BYTES = 16  # a row is held as groups of four float32 from its alignment origin (see load4 in threshold.cu)
KMAX = 64
LIST_BUILDS = (16, 64)  # KB: per-thread list length of stage 2; the smallest >= k is used
MAX_VOCAB = 1 << 24  # counts are float32 sums in sample_threshold: exact below 2^24
ALIGN = 16
LIST_DEFINES = defines_from(TOPK_THREADS=TOPK_THREADS, TOPK_EPT=TOPK_EPT, REORDER_THREADS=REORDER_THREADS)
THRESHOLD_DEFINES = defines_from(SAMPLE_THREADS=SAMPLE_THREADS, PIVOTS=PIVOTS, CAND_MAX=CAND_MAX,
                                 LOAD_UNROLL=LOAD_UNROLL, CLUSTER_THREADS=CLUSTER_THREADS, CLUSTER_CAND=CLUSTER_CAND,
                                 HIST_BINS=HIST_BINS)
LIST_EXPRESSIONS = tuple(f"topk_sample<{kb}>" for kb in LIST_BUILDS) + tuple(f"beam_stage2<{kb}>" for kb in LIST_BUILDS)
THRESHOLD_EXPRESSIONS = tuple(f"sample_cluster<{cs}>" for cs in CLUSTER_SIZES)
NVRTC_BUILDS = {LISTS_FILE: [(LIST_EXPRESSIONS, LIST_DEFINES)],
                THRESHOLD_FILE: [(THRESHOLD_EXPRESSIONS, THRESHOLD_DEFINES)]}
U64 = 2**64


def _lists_kernel(name: str):
    """A kernel of topk_lists.cu: topk_stage1, topk_sample<KB>, beam_stage2<KB>, reorder_rows."""
    return get_kernel(LISTS_FILE, name, name_expressions=LIST_EXPRESSIONS, defines=LIST_DEFINES)


def _threshold_kernel(name: str, **kw):
    """A kernel of threshold.cu: sample_threshold, sample_cluster<CS>, beam_lse, philox_uniforms."""
    return get_kernel(THRESHOLD_FILE, name, name_expressions=THRESHOLD_EXPRESSIONS, defines=THRESHOLD_DEFINES, **kw)


# cuFuncGetAttribute / cuFuncSetAttribute attribute numbers (cuda.h, CUfunction_attribute)
_ATTR_SHARED_SIZE_BYTES = 1
_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_ATTR_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
_CLUSTER_KERNELS: dict = {}  # (device, cluster size) -> (Kernel, dynamic shared memory a block may take, bytes)
_CLUSTER_REFUSED: set = set()  # (device, cluster size) whose launch the driver refused (a non-portable size)
_CLUSTER_PLANS: dict = {}  # (device, rows, V) -> (cluster size, groups per block) or None


def _cluster_kernel(cs: int, dev: int):
    """(Kernel, dynamic shared-memory limit) of sample_cluster<cs> on device dev, configured there once: the
    opt-in to all the shared memory a block may have beside its static arrays, and for cs > 8 the non-portable
    cluster size."""
    conf = _CLUSTER_KERNELS.get((dev, cs))
    if conf is None:
        kern = _threshold_kernel(f"sample_cluster<{cs}>", carveout=100)
        fn = kern.function(dev)
        static = cp.cuda.driver.funcGetAttribute(_ATTR_SHARED_SIZE_BYTES, fn.ptr)
        dynamic = device_info(dev).smem_optin - static
        cp.cuda.driver.funcSetAttribute(fn.ptr, _ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic)
        if cs > PORTABLE_CLUSTER:
            cp.cuda.driver.funcSetAttribute(fn.ptr, _ATTR_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        conf = _CLUSTER_KERNELS[(dev, cs)] = (kern, dynamic)
    return conf


def _cluster_fits(cs: int, V: int, dev: int) -> bool:
    return ceil_div(ceil_div(V + 3, 4), cs) * GROUP_BYTES <= _cluster_kernel(cs, dev)[1]


def cluster_plan(rows: int, V: int, top_k: int = 0, top_p: float = 1.0, dev: int | None = None):
    """(cluster size, groups of four logits per block) that sample() uses for (rows, V) logits with this top_k and
    top_p on this GPU, or None where it runs the one-block kernel sample_threshold.

    Which kernel: sample_cluster for plain sampling at every batch; for top-p while rows <= SMs / 2; for top-k while
    rows * (the smallest cluster that holds a row) <= SMs; sample_threshold beyond those (every cluster block holds
    a slice of one row, so only a few rows fit on the GPU at a time), on GPUs older than sm_90 and for rows too long
    for 16 blocks' shared memory. The measurements behind these limits: kernels/sampling/README.md.
    Which size: the smallest cluster that holds the row; for a few rows, wider while rows * size <= SMs and each block
    keeps MIN_BLOCK_GROUPS groups; and at least the size whose slices are at most SLICE_TARGET_BYTES (two blocks an
    SM)."""
    if dev is None:
        dev = current_device()
    k = top_k if 0 < top_k < V else 0
    mode = "top-k" if k else ("top-p" if top_p < 1.0 else "plain")
    key = (dev, rows, V, mode)
    if key in _CLUSTER_PLANS:
        return _CLUSTER_PLANS[key]
    info = device_info(dev)
    plan = None
    groups = ceil_div(V + 3, 4)
    if info.cc >= CLUSTER_MIN_CC:
        fitting = [cs for cs in CLUSTER_SIZES if (dev, cs) not in _CLUSTER_REFUSED and _cluster_fits(cs, V, dev)]
        use = bool(fitting) and (mode == "plain" or (mode == "top-p" and 2 * rows <= info.sm_count)
                                 or (mode == "top-k" and rows * fitting[0] <= info.sm_count))
        if use:
            cs = fitting[0]
            for wider in fitting[1:]:
                if ceil_div(groups, cs) * GROUP_BYTES <= SLICE_TARGET_BYTES and (
                        rows * wider > info.sm_count or ceil_div(groups, wider) < MIN_BLOCK_GROUPS):
                    break
                cs = wider
            plan = (cs, ceil_div(groups, cs))
    _CLUSTER_PLANS[key] = plan
    return plan


def _forced_plan(cluster: int, rows: int, V: int, dev: int):
    """The plan for sample(..., cluster=cs): that size, or a ValueError naming what is missing."""
    info = device_info(dev)
    if info.cc < CLUSTER_MIN_CC:
        raise ValueError(f"cluster={cluster} needs thread-block clusters (compute capability >= 9.0); this GPU "
                         f"({info.name}) has {info.cc[0]}.{info.cc[1]}")
    if not _cluster_fits(cluster, V, dev):
        raise ValueError(f"cluster={cluster}: a row of V={V} logits needs {ceil_div(ceil_div(V + 3, 4), cluster) * 16} "
                         f"bytes of shared memory per block; this GPU allows {_cluster_kernel(cluster, dev)[1]}")
    return cluster, ceil_div(ceil_div(V + 3, 4), cluster)


def list_build(k: int) -> int:
    """KB: the stage-2 list length for k (the smallest build >= k)."""
    return next(kb for kb in LIST_BUILDS if kb >= k)


def _check_logits(logits, dev, name="logits"):
    check_array(logits, name, dtypes=DTYPES, ndim=2, dev=dev)
    rows, V = logits.shape
    if rows < 1 or V < 1:
        raise ValueError(f"{name} must be (rows, V) with rows >= 1 and V >= 1; got shape {logits.shape}")
    if V > MAX_VOCAB:
        raise ValueError(f"{name} has V={V} columns; {WHAT} takes V <= {MAX_VOCAB} (float32 counts are exact below)")
    return rows, V


def _check_int(value, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= int(value) < hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}); got {value!r}")
    return int(value)


def check_sampling_params(temperature, top_k, top_p, V: int) -> tuple[float, int, float]:
    """(temperature, k, p) after the checks: ValueError naming the argument, its value and the limit."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.floating, np.integer)):
        raise TypeError(f"temperature must be a number; got {type(temperature).__name__}")
    t = float(temperature)
    if not math.isfinite(t) or t <= 0.0:
        raise ValueError(f"temperature must be a finite number > 0; got {temperature} (greedy decoding is top_k=1)")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0: off); got {top_k!r}")
    k = int(top_k)
    if k >= V:
        k = 0
    if k > KMAX:
        raise ValueError(f"top_k={k} is larger than {WHAT} supports (top_k <= {KMAX}, or >= V={V} for no top-k)")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float, np.floating, np.integer)):
        raise TypeError(f"top_p must be a number; got {type(top_p).__name__}")
    p = float(top_p)
    if not (0.0 < p <= 1.0):
        raise ValueError(f"top_p must lie in (0, 1]; got {top_p}")
    if 1.0 / t > float(np.finfo(np.float32).max):  # a Python float: no float32 cast (and no overflow warning)
        raise ValueError(f"temperature={temperature} is too small: 1/temperature overflows float32")
    return t, k, p


def _stage1(logits, k):
    rows, V = logits.shape
    S = ceil_div(V + 3, SLICE)  # a row's 16-byte groups start up to 3 positions before it
    check_grid(rows, WHAT + " topk_stage1", MAX_GRID_X)
    check_grid(S, WHAT + " topk_stage1", MAX_GRID_YZ, axis="y")
    pv = cp.empty((rows, S, k), dtype=cp.float32)
    pi = cp.empty((rows, S, k), dtype=cp.int32)
    _lists_kernel("topk_stage1")((rows, S), (TOPK_THREADS,), (logits, scalar(np.int32, V), scalar(np.int32, k), pv, pi))
    return pv, pi, S


TOP_K_METHODS = ("threshold", "lists")


def sample(logits, *, temperature=1.0, top_k=0, top_p=1.0, seed=0, offset=0, return_probs=False,
           top_k_method="threshold", cluster=None):
    """One token per row (int32, (rows,)): temperature -> top-k -> top-p -> renormalise -> draw. See the module
    docstring. return_probs=True also returns the renormalised probabilities (rows, V) float32 (one more write of
    the row: for tests and teaching). top_k_method: "threshold" or "lists" (how a top-k is found; same tokens).
    cluster (threshold method): None picks the kernel (cluster_plan); 0 runs the one-block kernel sample_threshold;
    a size in CLUSTER_SIZES runs sample_cluster with that many blocks per row (ValueError where it cannot)."""
    dev = current_device()
    rows, V = _check_logits(logits, dev)
    t, k, p = check_sampling_params(temperature, top_k, top_p, V)
    if top_k_method not in TOP_K_METHODS:
        raise ValueError(f"top_k_method must be one of {TOP_K_METHODS}; got {top_k_method!r}")
    if cluster is not None and (isinstance(cluster, bool) or not isinstance(cluster, (int, np.integer))
                                or cluster not in (0,) + CLUSTER_SIZES):
        raise ValueError(f"cluster must be None (automatic), 0 (one block per row) or one of {CLUSTER_SIZES}; "
                         f"got {cluster!r}")
    seed = _check_int(seed, "seed", 0, U64)
    offset = _check_int(offset, "offset", 0, U64)
    tokens = cp.empty((rows,), dtype=cp.int32)
    probs = cp.empty((rows, V), dtype=cp.float32) if return_probs else None
    null = np.uintp(0)
    inv_t = scalar(np.float32, 1.0 / t)
    if k > 0 and top_k_method == "lists":
        pv, pi, S = _stage1(logits, k)
        _lists_kernel(f"topk_sample<{list_build(k)}>")(
            (check_grid(rows, WHAT, MAX_GRID_X),), (TOPK_THREADS,),
            (pv, pi, np.int32(S), np.int32(V), np.int32(k), inv_t, np.float32(p), np.uint64(seed), np.uint64(offset),
             tokens, null, null, probs if probs is not None else null))
        return (tokens, probs) if return_probs else tokens
    args = (inv_t, np.int32(k), np.float32(p), np.uint64(seed), np.uint64(offset), tokens,
            probs if probs is not None else null)
    plan = None if cluster == 0 else (_forced_plan(cluster, rows, V, dev) if cluster
                                      else cluster_plan(rows, V, k, p, dev))
    while plan is not None:  # the cluster kernel; the else branch (no plan, or none left) runs the one-block kernel
        cs, groups = plan
        try:
            _cluster_kernel(cs, dev)[0](
                (check_grid(rows * cs, WHAT, MAX_GRID_X),), (CLUSTER_THREADS,),
                (logits, np.int32(V), np.int32(groups)) + args, shared_mem=groups * GROUP_BYTES)
            break
        except cp.cuda.driver.CUDADriverError:
            if cs <= PORTABLE_CLUSTER or cluster is not None:
                raise
            # a non-portable cluster this GPU cannot place: never again on this device, plan without it
            _CLUSTER_REFUSED.add((dev, cs))
            _CLUSTER_PLANS.clear()
            plan = cluster_plan(rows, V, k, p, dev)
    else:
        _threshold_kernel("sample_threshold")((check_grid(rows, WHAT, MAX_GRID_X),), (SAMPLE_THREADS,),
                                              (logits, np.int32(V)) + args)
    return (tokens, probs) if return_probs else tokens


def top_k(logits, k: int):
    """(values (rows, k) float32, indices (rows, k) int32): the k largest logits of each row in ranking order (larger
    first, ties by the lower index), FasterTransformer's two stages. 1 <= k <= min(KMAX, V)."""
    dev = current_device()
    rows, V = _check_logits(logits, dev)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= min(KMAX, V):
        raise ValueError(f"k must be an int in [1, {min(KMAX, V)}] (k <= {KMAX} and k <= V={V}); got {k!r}")
    k = int(k)
    pv, pi, S = _stage1(logits, k)
    values = cp.empty((rows, k), dtype=cp.float32)
    indices = cp.empty((rows, k), dtype=cp.int32)
    tokens = cp.empty((rows,), dtype=cp.int32)
    _lists_kernel(f"topk_sample<{list_build(k)}>")(
        (check_grid(rows, WHAT, MAX_GRID_X),), (TOPK_THREADS,),
        (pv, pi, np.int32(S), np.int32(V), np.int32(k), np.float32(1.0), np.float32(1.0), np.uint64(0), np.uint64(0),
         tokens, values, indices, np.uintp(0)))
    return values, indices


def beam_step(logits, cum_logprobs, beam: int):
    """One beam-search step: (scores (B, beam) float32, parent (B, beam) int32, token (B, beam) int32), the `beam`
    best of cum_logprobs[b, j] + log_softmax(logits[b * beam + j]) (ties by the lower j * V + token).

    logits (B * beam, V) float32; cum_logprobs (B, beam) or (B * beam,) float32 (-inf marks a dead beam, e.g. all
    but one at the first step). 1 <= beam <= min(KMAX, V)."""
    dev = current_device()
    rows, V = _check_logits(logits, dev)
    if isinstance(beam, bool) or not isinstance(beam, (int, np.integer)) or not 1 <= beam <= min(KMAX, V):
        raise ValueError(f"beam must be an int in [1, {min(KMAX, V)}] (beam <= {KMAX} and beam <= V={V}); got {beam!r}")
    beam = int(beam)
    if rows % beam:
        raise ValueError(f"logits has {rows} rows, which is not a multiple of beam={beam} (rows = B * beam)")
    B = rows // beam
    check_array(cum_logprobs, "cum_logprobs", dtypes=DTYPES, dev=dev)
    if cum_logprobs.size != rows or cum_logprobs.shape not in ((B, beam), (rows,)):
        raise ValueError(f"cum_logprobs must be ({B}, {beam}) or ({rows},); got {cum_logprobs.shape}")
    lse = cp.empty((rows,), dtype=cp.float32)
    _threshold_kernel("beam_lse")((check_grid(rows, WHAT, MAX_GRID_X),), (SAMPLE_THREADS,), (logits, np.int32(V), lse))
    pv, pi, S = _stage1(logits, beam)
    scores = cp.empty((B, beam), dtype=cp.float32)
    parent = cp.empty((B, beam), dtype=cp.int32)
    token = cp.empty((B, beam), dtype=cp.int32)
    _lists_kernel(f"beam_stage2<{list_build(beam)}>")(
        (check_grid(B, WHAT, MAX_GRID_X),), (TOPK_THREADS,),
        (pv, pi, cum_logprobs, lse, np.int32(S), np.int32(V), np.int32(beam), scores, parent, token))
    return scores, parent, token


def reorder_cache(cache, parent, *, out=None):
    """A KV cache (B * beam, ...) (for example notebook 08's (B * beam, Hkv, Tmax, d)) reordered by parent beam:
    out[b * beam + j] = cache[b * beam + parent[b, j]]. parent (B, beam) int32 on the GPU; its values are clamped
    to [0, beam) in the kernel (no check, no sync). Any dtype; a row must be a multiple of 16 bytes. out: a
    C-contiguous array like cache, not cache itself (a gather in place would race); default a new one."""
    dev = current_device()
    if not isinstance(cache, cp.ndarray) or cache.ndim < 2:
        raise TypeError(f"cache must be a cupy.ndarray of >= 2 dimensions; got {type(cache).__name__}"
                        f"{'' if not isinstance(cache, cp.ndarray) else ' of shape ' + str(cache.shape)}")
    check_array(cache, "cache", dtypes=(cache.dtype.name,), dev=dev)
    check_array(parent, "parent", dtypes=("int32",), ndim=2, dev=dev)
    B, beam = parent.shape
    rows = cache.shape[0]
    if B * beam != rows or beam < 1:
        raise ValueError(f"parent {parent.shape} must be (B, beam) with B * beam = the cache's {rows} rows")
    row_bytes = cache.nbytes // rows
    if row_bytes % 16:
        raise ValueError(f"a cache row is {row_bytes} bytes; reorder_cache moves 16-byte chunks (a multiple of 16)")
    if out is None:
        out = cp.empty_like(cache)
    else:
        check_array(out, "out", dtypes=(cache.dtype.name,), dev=dev)
        if out.shape != cache.shape:
            raise ValueError(f"out has shape {out.shape}; it must be the cache's {cache.shape}")
        if out.data.ptr == cache.data.ptr:
            raise ValueError("out must not be cache itself: rows read by one thread are written by another")
    check_alignment("reorder_cache", ALIGN, cache=cache, out=out)
    chunks = row_bytes // 16
    total = rows * chunks
    grid = max(1, min(ceil_div(total, REORDER_THREADS), 65536))
    _lists_kernel("reorder_rows")((grid,), (REORDER_THREADS,),
                                  (cache, out, parent, np.int32(beam), np.int64(rows), np.int64(chunks)))
    return out


def philox_uniforms(n: int, seed: int = 0, offset: int = 0):
    """The uniforms (n,) float32 that rows 0 .. n-1 draw for (seed, offset): what sample() uses, exposed for tests."""
    current_device()
    n = _check_int(n, "n", 1, 2**31)
    seed = _check_int(seed, "seed", 0, U64)
    offset = _check_int(offset, "offset", 0, U64)
    out = cp.empty((n,), dtype=cp.float32)
    _threshold_kernel("philox_uniforms")((ceil_div(n, 256),), (256,),
                                         (out, np.uint64(seed), np.uint64(offset), np.int32(n)))
    return out


def kernels_used(top_k: int, V: int, top_k_method: str = "threshold", rows: int = 1,
                 top_p: float = 1.0) -> tuple[str, ...]:
    """The kernels sample() launches for this k, V, number of rows and p (for the notebook and the benchmark)."""
    k = 0 if top_k >= V else top_k
    if k and top_k_method == "lists":
        return ("topk_stage1", f"topk_sample<{list_build(k)}>")
    plan = cluster_plan(rows, V, k, top_p) if gpu_unavailable_reason() is None else None
    return (f"sample_cluster<{plan[0]}>",) if plan is not None else ("sample_threshold",)
