"""Every registered decoding kernel (kernels.DECODE_REGISTRY) against the float64 reference (reference/decode.py),
plus the cache append, the out-of-range clamping and every error path, on the GPU.

The grid is not a full product (that would take minutes): five base shapes (B in {1, 3, 16}; lengths ragged with 0,
1, 15, 16, 17, 255, 4097 and lengths at and one below Tmax; Hq / Hkv in {1, 4, 8}; Tq in {1, 2, 4}) are crossed with
every dtype and head size a kernel takes, and the page size (contiguous, 16, 32, 64, 128, 256) and the number of splits
(the heuristic's choice, 1, 2, 7) rotate through the cases, so each value meets several shapes. Outputs are poisoned
(NaN) before each launch, so an element a kernel does not write fails the check. By default a covering part of these
grids (see _cases, _split_count_cases, MERGE_DEFAULT); `pytest --full-grid` runs all of them.
"""

import itertools

import numpy as np
import pytest

import kernels
import reference as R
from kernels.inference import decode_append, decode_ft, decode_split

VARIANTS = sorted(kernels.DECODE_REGISTRY)
BASES = [  # B, Hq, Hkv, Tq, lengths, Tmax
    (1, 8, 8, 1, [4097], 4100),
    (3, 4, 1, 2, [0, 1, 17], 64),
    (3, 8, 8, 4, [1, 15, 16], 16),
    (16, 8, 1, 1, [0, 1, 15, 16, 17, 255, 4097, 4111, 3, 64, 100, 1000, 2048, 31, 33, 4112], 4112),
    (3, 16, 2, 4, [255, 256, 4095], 4096),
]
PAGE_CYCLE = [None, 16, 32, 64, 128, 256]
SPLIT_CYCLE = [None, 1, 2, 7]


def make_problem(cp, B, Hq, Hkv, Tq, d, lengths, Tmax, dtype, *, page_size=None, seed=0, magnitude=1.0,
                 unused_entry=-1):
    """Device inputs (q, k_cache, v_cache, seqlens, block_table) and the float64 host copies the reference needs.

    Paged: the pages of all sequences are shuffled through a pool with spare pages full of other numbers, and the
    block-table entries past a sequence's last page hold `unused_entry` (never read)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, Tq, d)) * magnitude
    k = rng.standard_normal((B, Hkv, Tmax, d)) * magnitude
    v = rng.standard_normal((B, Hkv, Tmax, d))
    seqlens = np.asarray(lengths, dtype=np.int32)
    table = None
    if page_size is not None:
        max_pages = -(-Tmax // page_size)
        n_pages = B * max_pages + 3
        order = rng.permutation(n_pages)[: B * max_pages].reshape(B, max_pages)
        kp = rng.standard_normal((n_pages, Hkv, page_size, d)) * magnitude
        vp = rng.standard_normal((n_pages, Hkv, page_size, d))
        for b, p in itertools.product(range(B), range(max_pages)):
            n = min(page_size, Tmax - p * page_size)
            kp[order[b, p], :, :n] = k[b, :, p * page_size:p * page_size + n]
            vp[order[b, p], :, :n] = v[b, :, p * page_size:p * page_size + n]
        used = np.arange(max_pages)[None, :] * page_size < np.maximum(seqlens, 0)[:, None]
        table = np.where(used, order, unused_entry).astype(np.int32)
        k, v = kp, vp
    dev = [cp.asarray(x.astype(dtype)) for x in (q, k, v)]
    host = [x.get().astype(np.float64) for x in dev]  # exactly the values the GPU sees
    dev += [cp.asarray(seqlens), None if table is None else cp.asarray(table)]
    host += [seqlens, table]
    return dev, host


SMALL_BASES = (1, 2)  # default for every (dtype, d); the larger bases 0, 3, 4 rotate over the (dtype, d) combinations


def _cases():
    """By default every (dtype, d) of a kernel on the two small bases and on one of the three large ones (in turn, so
    each kernel meets every base; the page sizes, split counts and FT layouts that rotate with n all appear too:
    tests/test_grid_coverage.py checks it); --full-grid: every (dtype, d) on every base."""
    for name in VARIANTS:
        var = kernels.DECODE_REGISTRY[name]
        combos = list(itertools.product(var.dtypes, var.head_dims))
        large = [bi for bi in range(len(BASES)) if bi not in SMALL_BASES]
        for n, ((dtype, d), (bi, base)) in enumerate(itertools.product(combos, enumerate(BASES))):
            page = PAGE_CYCLE[n % len(PAGE_CYCLE)] if var.paged else None
            splits = SPLIT_CYCLE[n % len(SPLIT_CYCLE)] if var.splits else None
            ft_layout = name == "decode_ft" and n % 2 == 1
            default = bi in SMALL_BASES or bi == large[(n // len(BASES)) % len(large)]
            yield pytest.param(name, dtype, d, bi, page, splits, ft_layout,
                               id=f"{name}-{dtype}-d{d}-base{bi}-page{page}-splits{splits}{'-ftlayout' if ft_layout else ''}",
                               marks=() if default else (pytest.mark.full_grid,))


def _run(var, dev, *, num_splits=None, ft_layout=False, **kw):
    q, k, v, seqlens, table = dev
    if ft_layout:
        k = decode_ft.to_ft_layout(k)
    extra = {} if num_splits is None else {"num_splits": num_splits}
    return var.decode(q, k, v, seqlens, block_table=table, return_lse=True, **extra, **kw)


def _check(o, lse, host, dtype, var, scale=None, out_of_range="error"):
    q, k, v, seqlens, table = host
    ro, rl = R.decode_attention(q, k, v, seqlens, block_table=table, scale=scale, out_of_range=out_of_range)
    assert o.dtype == np.dtype(dtype) and o.shape == ro.shape and lse.shape == rl.shape
    res_o = kernels.check(o, ro, var.tolerance_class(dtype))
    res_l = kernels.check(lse, rl, var.tolerance_class(dtype))
    assert res_o.ok, f"o: {res_o.detail()}"
    assert res_l.ok, f"lse: {res_l.detail()}"


@pytest.mark.parametrize("name,dtype,d,bi,page,splits,ft_layout", list(_cases()))
def test_decode_matches_reference(gpu, poison, name, dtype, d, bi, page, splits, ft_layout):
    var = kernels.DECODE_REGISTRY[name]
    B, Hq, Hkv, Tq, lengths, Tmax = BASES[bi]
    dev, host = make_problem(gpu, B, Hq, Hkv, Tq, d, lengths, Tmax, dtype, page_size=page, seed=bi * 100 + d)
    o, lse = _run(var, dev, num_splits=splits, ft_layout=ft_layout)
    _check(o, lse, host, dtype, var)


@pytest.mark.parametrize("name", VARIANTS)
def test_large_logits_and_explicit_scale(gpu, poison, name):
    """Inputs of standard deviation 10 (logits in the hundreds) test the max subtraction; scale is passed."""
    var = kernels.DECODE_REGISTRY[name]
    dtype = "float16" if "float16" in var.dtypes else var.dtypes[0]
    dev, host = make_problem(gpu, 3, 8, 2, 2, 64, [0, 300, 1000], 1024, dtype, seed=3, magnitude=10.0)
    o, lse = var.decode(*dev[:4], block_table=None, return_lse=True, scale=0.05)
    _check(o, lse, host, dtype, var, scale=0.05)


@pytest.mark.parametrize("name", VARIANTS)
def test_without_lse(gpu, poison, name):
    var = kernels.DECODE_REGISTRY[name]
    dtype = var.dtypes[-1]
    dev, host = make_problem(gpu, 2, 4, 4, 1, 128, [7, 500], 512, dtype, seed=4)
    o = var.decode(*dev[:4])
    ro, _ = R.decode_attention(*host[:4])
    assert kernels.check(o, ro, var.tolerance_class(dtype)).ok


SPLIT_KERNELS = ["decode_split", "decode_split_mma"]  # the CUDA-core and the tensor-core kernel of decode_split.cu


def _split_count_cases():
    """By default each kernel at every split count, paged and contiguous in turn; --full-grid: both at every count."""
    for k, name in enumerate(SPLIT_KERNELS):
        for i, splits in enumerate([1, 2, 7, 33, None, 256]):
            for j, page in enumerate([None, 64]):
                yield pytest.param(splits, page, name, id=f"{page}-{splits}-{name}",
                                   marks=() if (i + k) % 2 == j else (pytest.mark.full_grid,))


@pytest.mark.parametrize("splits,page,name", list(_split_count_cases()))
def test_split_counts_agree(gpu, poison, splits, page, name):
    """Both split kernels at every split count (256: the most, where the tensor-core kernel's own merge fills its
    scratch), paged or not, bf16, d = 128, a GQA group of 4 with Tq = 2."""
    var = kernels.DECODE_REGISTRY[name]
    dev, host = make_problem(gpu, 3, 8, 2, 2, 128, [1, 700, 3000], 3000, "bfloat16", page_size=page, seed=5)
    o, lse = _run(var, dev, num_splits=splits)
    _check(o, lse, host, "bfloat16", var)


# By default both limits of the one-round merge from both sides, at both head sizes: the thread limit reached
# (d = 128, G = 4; d = 64, 8 rows) and crossed (d = 128, 5 and 8 rows), each with 16 splits (the limit) and 17; one
# row and few splits; --full-grid: every (d, rows, splits).
MERGE_DEFAULT = {(128, 1, 1, 2), (128, 4, 1, 16), (128, 4, 1, 17), (128, 5, 1, 16), (128, 5, 1, 17), (128, 2, 4, 2),
                 (64, 1, 1, 17), (64, 4, 1, 2), (64, 5, 1, 16), (64, 2, 4, 16), (64, 2, 4, 17)}


def _merge_cases():
    for d, (G, Tq), splits in itertools.product([64, 128], [(1, 1), (4, 1), (5, 1), (2, 4)], [2, 16, 17]):
        yield pytest.param(d, G, Tq, splits, id=f"{splits}-{G}-{Tq}-{d}",
                           marks=() if (d, G, Tq, splits) in MERGE_DEFAULT else (pytest.mark.full_grid,))


@pytest.mark.parametrize("d,G,Tq,splits", list(_merge_cases()))
def test_mma_merge_paths(gpu, poison, d, G, Tq, splits):
    """decode_split_mma's own merge on both sides of its one-round path, which needs a thread per (row, 4 columns)
    item (rows * d / 4 <= 128 threads) and at most MERGE_PREFETCH = 16 splits: 1 to 8 rows per KV head cross the
    first limit at d = 128 and reach it at d = 64; 16 and 17 splits cross the second. The short sequence leaves
    splits with no key (their lse is -inf)."""
    var = kernels.DECODE_REGISTRY["decode_split_mma"]
    dev, host = make_problem(gpu, 2, 2 * G, 2, Tq, d, [1500, 37], 1600, "float16", seed=11)
    o, lse = _run(var, dev, num_splits=splits)
    _check(o, lse, host, "float16", var)


def test_split_heuristic_plan(gpu):
    """What decode() launches at batch 1 fills the GPU; at a large batch it does not split."""
    info = kernels.device_info()
    RB, RC, KT, S = decode_split.plan(1, 32, 1, 128, 8, 32768, "float16", tensor_cores=False)
    assert (RB, RC) == (4, 1) and 1 < S <= decode_split.MAX_SPLITS
    assert 8 * S >= info.sm_count  # at least one block per SM
    for tc in (False, True):
        *_, S_big = decode_split.plan(256, 32, 1, 128, 32, 2048, "float16", tensor_cores=tc)
        assert S_big == 1
    if info.cc < (8, 0):  # below 8.0 (a T4) decode() runs only the CUDA-core kernel: no tensor-core plan to check
        return
    RB, RC, KT, S = decode_split.plan(1, 32, 1, 128, 8, 32768, "float16")  # the default: tensor cores
    assert (RB, RC, KT) == (16, 1, 64) and 1 < S <= decode_split.MAX_SPLITS
    assert 8 * S >= 0.9 * info.sm_count  # one block per SM, within the model's 10% tolerance
    assert decode_split.blocks_per_sm(128, 16, "float16", info.id) >= 1


@pytest.mark.parametrize("launcher", ["decode_split_kv", "decode_split_mma", "decode_ft"])
def test_prepared_calls_still_check_their_arrays(gpu, poison, launcher):
    """decode_split and decode_ft prepare a problem on its first call. A later call with arrays of the same shapes
    still gets every check that belongs to the arrays (type, dtype, layout, alignment, device), check_indices still
    works, and new arrays with alternating options give the reference's result."""
    if launcher == "decode_ft":
        decode, kw, pages, splits_forced = decode_ft.decode, {}, (None,), 1
    else:
        decode, kw, pages, splits_forced = decode_split.decode, {"tensor_cores": launcher == "decode_split_mma"}, \
            (None, 16), 3
    for page in pages:
        dev, host = make_problem(gpu, 3, 8, 2, 2, 64, [0, 17, 64], 64, "float16", page_size=page, seed=12)
        q, k, v, s, t = dev
        for splits, lse_too in ((None, True), (splits_forced, False), (None, False), (splits_forced, True)):
            out = decode(q, k, v, s, block_table=t, num_splits=splits, return_lse=lse_too, **kw)
            o, lse = out if lse_too else (out, None)
            ro, rl = R.decode_attention(*host[:4], block_table=host[4])
            assert kernels.check(o, ro, "float16").ok
            if lse_too:
                assert kernels.check(lse, rl, "float16").ok
        with pytest.raises(ValueError, match=r"k_cache must be C-contiguous"):
            decode(q, gpu.concatenate([k, k], axis=2)[:, :, ::2], v, s, block_table=t, **kw)
        flat = gpu.empty(q.size + 1, dtype=q.dtype)
        shifted = flat[1:].reshape(q.shape)
        shifted[...] = q
        with pytest.raises(ValueError, match=r"q starts at address .* not 16-byte aligned"):
            decode(shifted, k, v, s, block_table=t, **kw)
        with pytest.raises(TypeError, match=r"seqlens_k has dtype int64"):
            decode(q, k, v, s.astype(gpu.int64), block_table=t, **kw)
        with pytest.raises(TypeError, match=r"v_cache has dtype|must share one dtype"):
            decode(q, k, v.astype(gpu.float32), s, block_table=t, **kw)
        with pytest.raises(TypeError, match=r"q must be a cupy\.ndarray"):
            decode(q.get(), k, v, s, block_table=t, **kw)
        with pytest.raises(ValueError, match=r"num_splits must be None or (an int in \[1, 256\]|1); got True"):
            decode(q, k, v, s, block_table=t, num_splits=True, **kw)
        with pytest.raises(ValueError, match=r"scale must be a finite number; got nan"):
            decode(q, k, v, s, block_table=t, scale=float("nan"), **kw)
        bad = gpu.asarray(np.array([0, 17, 65], np.int32))
        with pytest.raises(ValueError, match=r"seqlens_k must lie in \[0, 64\]"):
            decode(q, k, v, bad, block_table=t, check_indices=True, **kw)
        if t is not None:
            with pytest.raises(TypeError, match=r"block_table has dtype int64"):
                decode(q, k, v, s, block_table=t.astype(gpu.int64), **kw)
        # new arrays of the same shapes: the prepared launch reads the arrays it is given
        q2, k2, v2 = (gpu.asarray(gpu.random.standard_normal(x.shape).astype(x.dtype)) for x in (q, k, v))
        host2 = [x.get().astype(np.float64) for x in (q2, k2, v2)] + host[3:]
        o, lse = decode(q2, k2, v2, s, block_table=t, return_lse=True, **kw)
        ro, rl = R.decode_attention(*host2[:4], block_table=host2[4])
        assert kernels.check(o, ro, "float16").ok and kernels.check(lse, rl, "float16").ok
    if kw:
        with pytest.raises(ValueError, match=r"tensor_cores must be True or False; got 'yes'"):
            decode(q, k, v, s, block_table=t, tensor_cores="yes")


def test_merging_kernel_on_two_streams(gpu, poison):
    """decode_split_mma with S > 1 counts its blocks' arrivals in an array kept per stream and left zero by each
    launch. Calls alternating between two streams (each with its own data), many times over, all match the
    reference: a counter left non-zero, or shared between streams, would leave rows unmerged (NaN from poison)."""
    probs = [make_problem(gpu, 3, 8, 2, 2, 128, [5, 700, 3000], 3000, "float16", seed=20 + i) for i in range(2)]
    refs = [R.decode_attention(*host[:4]) for _, host in probs]
    streams = [gpu.cuda.Stream(non_blocking=True) for _ in probs]
    outs = []
    for rep in range(4):
        for (dev, _), stream in zip(probs, streams):
            with stream:
                outs.append(decode_split.decode(*dev[:4], num_splits=7, return_lse=True))
    for stream in streams:
        stream.synchronize()
    for n, (o, lse) in enumerate(outs):
        ro, rl = refs[n % 2]
        assert kernels.check(o, ro, "float16").ok and kernels.check(lse, rl, "float16").ok, f"call {n}"
    # the counters are back at zero after the launches
    key_entries = [e for e in decode_split._CALLS.values() if e.n_groups]
    assert key_entries and all(int(a.sum()) == 0 for e in key_entries for a in e.arrivals.values())


@pytest.mark.parametrize("name", VARIANTS)
def test_deterministic_run_to_run(gpu, name):
    """A result that changes between identical launches points to a race."""
    var = kernels.DECODE_REGISTRY[name]
    dev, _ = make_problem(gpu, 3, 8, 2, 4, 128, [33, 1000, 2049], 2100, var.dtypes[-1], seed=6)
    extra = {"num_splits": 7} if var.splits else {}
    a, la = var.decode(*dev[:4], return_lse=True, **extra)
    b, lb = var.decode(*dev[:4], return_lse=True, **extra)
    assert bool((a == b).all()) and bool((la == lb).all())


# ---------------------------------------------------------------------------------------------------------
# Out-of-range indices: checked on request, clamped otherwise
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", VARIANTS)
def test_out_of_range_lengths_are_clamped(gpu, poison, name):
    """With check_indices off, a negative length counts as 0 and one past Tmax as Tmax; nothing faults."""
    var = kernels.DECODE_REGISTRY[name]
    dtype = var.dtypes[-1]
    dev, host = make_problem(gpu, 4, 4, 2, 2, 64, [0, 0, 0, 0], 96, dtype, seed=7)
    bad = np.array([-3, 96 + 100, 2**31 - 1, 5], np.int32)
    dev[3] = gpu.asarray(bad)
    host[3] = bad
    o, lse = var.decode(*dev[:4], return_lse=True)
    gpu.cuda.Device().synchronize()
    _check(o, lse, host, dtype, var, out_of_range="clamp")
    with pytest.raises(ValueError, match=r"seqlens_k must lie in \[0, 96\]; got values in \[-3, 2147483647\]"):
        var.decode(*dev[:4], check_indices=True)


@pytest.mark.parametrize("name", SPLIT_KERNELS)
@pytest.mark.parametrize("page", [16, 256])
def test_out_of_range_pages_are_skipped(gpu, poison, page, name):
    """With check_indices off, a used page index outside [0, num_pages) is never dereferenced: its keys are skipped."""
    var = kernels.DECODE_REGISTRY[name]
    dev, host = make_problem(gpu, 4, 8, 2, 1, 128, [40, 3 * page, 2 * page + 1, 20], 4 * page, "float16",
                             page_size=page, seed=8, unused_entry=-7)
    table, n_pages = host[4].copy(), dev[1].shape[0]
    table[0, 1 if page == 16 else 0] = n_pages  # one past the end
    table[1, 2] = -1
    table[2, 0] = 10**9
    table[3, :2] = -(2**31)  # sequence 3 (20 keys) loses every page it uses: its rows see no key
    lengths = np.array([40, 3 * page, 10**6, 20], np.int32)  # sequence 2 is also clamped to the capacity
    dev[3], dev[4], host[3], host[4] = gpu.asarray(lengths), gpu.asarray(table), lengths, table
    for splits in (1, 3):
        o, lse = var.decode(*dev[:4], block_table=dev[4], return_lse=True, num_splits=splits)
        gpu.cuda.Device().synchronize()
        _check(o, lse, host, "float16", var, out_of_range="clamp")
    assert bool(gpu.isneginf(lse[3]).all()) and bool((o[3] == 0).all())
    with pytest.raises(ValueError, match=r"seqlens_k must lie in"):
        var.decode(*dev[:4], block_table=dev[4], check_indices=True)
    dev[3] = gpu.asarray(np.array([40, 3 * page, 2 * page + 1, 20], np.int32))
    with pytest.raises(ValueError, match=r"block_table \(the entries in use\) must lie in \[0, \d+\]"):
        var.decode(*dev[:4], block_table=dev[4], check_indices=True)


@pytest.mark.parametrize("name", SPLIT_KERNELS)
def test_check_indices_accepts_good_input(gpu, poison, name):
    """Unused block-table entries may hold anything (here -1): check_indices looks only at the pages in use."""
    var = kernels.DECODE_REGISTRY[name]
    dev, host = make_problem(gpu, 3, 4, 4, 1, 64, [0, 17, 64], 64, "float16", page_size=16, seed=9)
    assert (host[4] == -1).any()
    o, lse = var.decode(*dev[:4], block_table=dev[4], return_lse=True, check_indices=True)
    _check(o, lse, host, "float16", var)


# ---------------------------------------------------------------------------------------------------------
# Errors before launch
# ---------------------------------------------------------------------------------------------------------

def _good(cp, var, *, paged=False):
    dev, _ = make_problem(cp, 2, 4, 2, 1, 64, [3, 16], 32, var.dtypes[-1], page_size=16 if paged else None, seed=10)
    return dev


@pytest.mark.parametrize("name", VARIANTS)
def test_dtype_errors(gpu, name):
    var = kernels.DECODE_REGISTRY[name]
    q, k, v, s, _ = _good(gpu, var)
    with pytest.raises(TypeError, match=r"q has dtype float64; this kernel takes"):
        var.decode(q.astype(gpu.float64), k, v, s)
    other = next(dt for dt in ("float16", "bfloat16", "float32") if dt != q.dtype.name)
    with pytest.raises(TypeError, match=r"k_cache has dtype|q, k_cache, v_cache must share one dtype"):
        var.decode(q, k.astype(other), v, s)
    with pytest.raises(TypeError, match=r"seqlens_k has dtype int64; this kernel takes int32"):
        var.decode(q, k, v, s.astype(gpu.int64))
    with pytest.raises(TypeError, match=r"q must be a cupy\.ndarray.*numpy\.ndarray"):
        var.decode(q.get(), k, v, s)


@pytest.mark.parametrize("name", VARIANTS)
def test_layout_errors(gpu, name):
    var = kernels.DECODE_REGISTRY[name]
    q, k, v, s, _ = _good(gpu, var)
    with pytest.raises(ValueError, match=r"k_cache must be C-contiguous.*strides"):
        var.decode(q, gpu.concatenate([k, k], axis=2)[:, :, ::2], v, s)
    with pytest.raises(ValueError, match=r"must be 4-D"):
        var.decode(q[0], k, v, s)
    flat = gpu.empty(q.size + 1, dtype=q.dtype)
    shifted = flat[1:].reshape(q.shape)  # C-contiguous, but 2 bytes off a 16-byte boundary
    shifted[...] = q
    with pytest.raises(ValueError, match=r"q starts at address .* not 16-byte aligned"):
        var.decode(shifted, k, v, s)


@pytest.mark.parametrize("name", VARIANTS)
def test_shape_errors(gpu, name):
    var = kernels.DECODE_REGISTRY[name]
    cp = gpu
    q, k, v, s, _ = _good(cp, var)
    with pytest.raises(ValueError, match=r"Hq=3 query heads must be a multiple of Hkv=2 KV heads"):
        var.decode(q[:, :3].copy(), k, v, s)
    with pytest.raises(ValueError, match=r"k_cache \(2, 2, 32, 64\) and v_cache \(2, 2, 16, 64\) must have the same shape"):
        var.decode(q, k, v[:, :, :16].copy(), s)
    with pytest.raises(ValueError, match=r"seqlens_k has shape \(3,\); q has B=2 sequences"):
        var.decode(q, k, v, cp.zeros(3, dtype=cp.int32))
    with pytest.raises(ValueError, match=r"a contiguous cache must have B=1 rows"):
        var.decode(q[:1].copy(), k, v, s[:1].copy())
    q96 = cp.zeros((2, 4, 1, 96), dtype=q.dtype)
    k96 = cp.zeros((2, 2, 32, 96), dtype=q.dtype)
    with pytest.raises(ValueError, match=r"head dimension d=96 is not supported by .* \(d in \{64, 128\}\)"):
        var.decode(q96, k96, k96, s)
    with pytest.raises(ValueError, match=r"q has d=128, but the caches have d=64"):
        var.decode(cp.zeros((2, 4, 1, 128), dtype=q.dtype), k, v, s)
    qtq = cp.zeros((2, 4, var.max_tq + 1, 64), dtype=q.dtype)
    with pytest.raises(ValueError, match=rf"q has Tq={var.max_tq + 1} query rows per sequence; .* Tq <= {var.max_tq}"):
        var.decode(qtq, k, v, s)
    with pytest.raises(ValueError, match=r"scale must be a finite number; got nan"):
        var.decode(q, k, v, s, scale=float("nan"))


@pytest.mark.parametrize("name", SPLIT_KERNELS)
def test_paged_errors(gpu, name):
    var = kernels.DECODE_REGISTRY[name]
    cp = gpu
    q, k, v, s, t = _good(cp, var, paged=True)
    with pytest.raises(TypeError, match=r"block_table has dtype int64; this kernel takes int32"):
        var.decode(q, k, v, s, block_table=t.astype(cp.int64))
    with pytest.raises(ValueError, match=r"block_table has shape \(3, 2\); it must be \(2, max_pages\)"):
        var.decode(q, k, v, s, block_table=cp.zeros((3, 2), dtype=cp.int32))
    with pytest.raises(ValueError, match=r"block_table must be 2-D"):
        var.decode(q, k, v, s, block_table=t[0].copy())
    with pytest.raises(ValueError, match=r"page_size=8 \(k_cache.shape\[2\]\) is not supported by decode_split; "
                                         r"page sizes: 16, 32, 64, 128, 256"):
        var.decode(q, k[:, :, :8].copy(), v[:, :, :8].copy(), s, block_table=t)
    with pytest.raises(ValueError, match=r"num_splits must be None or an int in \[1, 256\]; got 0"):
        var.decode(q, k, v, s, block_table=t, num_splits=0)
    with pytest.raises(ValueError, match=r"num_splits must be None or an int in \[1, 256\]; got 257"):
        var.decode(q, k, v, s, block_table=t, num_splits=257)


def test_ft_errors(gpu):
    var = kernels.DECODE_REGISTRY["decode_ft"]
    cp = gpu
    q, k, v, s, _ = _good(cp, var)
    _, _, _, _, t = _good(cp, var, paged=True)
    with pytest.raises(ValueError, match=r"decode_ft reads contiguous caches only; block_table is not supported"):
        var.decode(q, k, v, s, block_table=t)
    with pytest.raises(ValueError, match=r"num_splits must be None or 1; got 2"):
        var.decode(q, k, v, s, num_splits=2)
    with pytest.raises(ValueError, match=r"threads_per_key=3 must be one of"):
        var.decode(q, k, v, s, threads_per_key=3)
    with pytest.raises(ValueError, match=r"k_cache in the FT layout must have shape"):
        var.decode(q, decode_ft.to_ft_layout(k)[:, :, :, :16].copy(), v, s)
    big = decode_ft.max_cache_len() + 16
    kb = cp.zeros((1, 1, big, 64), dtype=q.dtype)
    with pytest.raises(ValueError, match=rf"Tmax={big} needs .* bytes; this GPU allows Tmax <= "):
        var.decode(q[:1, :1].copy(), kb, kb, s[:1].copy())


@pytest.mark.parametrize("tpk", [1, 2, 8, 16])
def test_ft_threads_per_key_and_layouts(gpu, poison, tpk):
    var = kernels.DECODE_REGISTRY["decode_ft"]
    dev, host = make_problem(gpu, 2, 4, 2, 2, 128, [1, 1000], 1024, "float16", seed=11)
    for ft_layout in (False, True):
        o, lse = _run(var, dev, ft_layout=ft_layout, threads_per_key=tpk)
        _check(o, lse, host, "float16", var)


# ---------------------------------------------------------------------------------------------------------
# The cache append, and a decode loop built from it
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,d,page,ft_layout", [("float16", 128, None, False), ("bfloat16", 64, 16, False),
                                                    ("float32", 64, None, True), ("float16", 64, 256, False)])
def test_append_matches_reference(gpu, dtype, d, page, ft_layout):
    cp = gpu
    B, H, Tmax, Tn = 3, 2, 512, 3
    dev, host = make_problem(cp, B, H, H, 1, d, [Tmax] * B, Tmax, dtype, page_size=page, seed=12)  # full table
    _, k, v, _, table = dev
    rng = np.random.default_rng(13)
    kn = cp.asarray(rng.standard_normal((B, H, Tn, d)).astype(dtype))
    vn = cp.asarray(rng.standard_normal((B, H, Tn, d)).astype(dtype))
    lengths = np.array([0, 100, Tmax - 1], np.int32)  # the last has room for one row: two are dropped
    kc = decode_ft.to_ft_layout(k) if ft_layout else k.copy()
    vc = v.copy()
    decode_append.append(kc, vc, kn, vn, cp.asarray(lengths), block_table=table)
    rk, rv = R.append_kv(k.get(), v.get(), kn.get(), vn.get(), lengths, block_table=host[4])
    got_k = kc.get()
    if ft_layout:
        got_k = got_k.transpose(0, 1, 3, 2, 4).reshape(k.shape)
    assert np.array_equal(got_k, rk) and np.array_equal(vc.get(), rv)


def test_append_errors_and_checks(gpu):
    cp = gpu
    dev, host = make_problem(cp, 2, 2, 2, 1, 64, [0, 0], 64, "float16", page_size=16, seed=14)
    _, k, v, _, _ = dev
    table = cp.asarray(np.arange(8, dtype=np.int32).reshape(2, 4))
    kn = cp.zeros((2, 2, 2, 64), dtype=cp.float16)
    with pytest.raises(ValueError, match=r"seqlens_k must lie in \[0, 62\]; got values in \[0, 63\]"):
        decode_append.append(k, v, kn, kn, cp.asarray(np.array([0, 63], np.int32)), block_table=table,
                             check_indices=True)
    bad = table.copy()
    bad[1, 0] = 99
    with pytest.raises(ValueError, match=r"block_table \(the pages the new rows land in\) must lie in \[0, \d+\]"):
        decode_append.append(k, v, kn, kn, cp.asarray(np.array([0, 1], np.int32)), block_table=bad,
                             check_indices=True)
    with pytest.raises(TypeError, match=r"v_new has dtype float32; this kernel takes float16"):
        decode_append.append(k, v, kn, kn.astype(cp.float32), cp.zeros(2, dtype=cp.int32), block_table=table)
    with pytest.raises(ValueError, match=r"k_new \(2, 3, 2, 64\) must be \(B, Hkv, Tn, d\) with the caches' Hkv=2"):
        k3 = cp.zeros((2, 3, 2, 64), dtype=cp.float16)
        decode_append.append(k, v, k3, k3, cp.zeros(2, dtype=cp.int32), block_table=table)
    # with the check off, the bad page is skipped and nothing else changes
    before = k.get()
    decode_append.append(k, v, kn + 1, kn + 1, cp.asarray(np.array([0, 1], np.int32)), block_table=bad)
    after = k.get()
    changed = sorted(np.argwhere((after != before).any(axis=(1, 2, 3))).ravel().tolist())
    assert changed == [0]


@pytest.mark.parametrize("page", [None, 16])
def test_decode_loop(gpu, poison, page):
    """Append one row per step with decode_append and decode with decode_split, against the reference each step."""
    cp = gpu
    B, Hq, Hkv, d, Tmax, steps = 3, 8, 2, 64, 96, 12
    dev, host = make_problem(cp, B, Hq, Hkv, 1, d, [Tmax] * B, Tmax, "float16", page_size=page, seed=15)
    _, k, v, _, table = dev  # every page of the table in use
    lengths = np.array([0, 5, 40], np.int32)
    seq = cp.asarray(lengths)
    rng = np.random.default_rng(16)
    hk, hv = k.get().astype(np.float64), v.get().astype(np.float64)
    tab = None if table is None else table.get()
    for step in range(steps):
        kn, vn, q = (cp.asarray(rng.standard_normal(s).astype("float16"))
                     for s in ((B, Hkv, 1, d), (B, Hkv, 1, d), (B, Hq, 1, d)))
        decode_append.append(k, v, kn, vn, seq, block_table=table)
        hk, hv = R.append_kv(hk, hv, kn.get(), vn.get(), lengths, block_table=tab)
        seq += 1
        lengths = lengths + 1
        o, lse = decode_split.decode(q, k, v, seq, block_table=table, return_lse=True)
        ro, rl = R.decode_attention(q.get().astype(np.float64), hk, hv, lengths, block_table=tab)
        assert kernels.check(o, ro, "float16").ok and kernels.check(lse, rl, "float16").ok, f"step {step}"
