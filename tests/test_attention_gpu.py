"""Every registered attention variant against the float64 reference, on the GPU.

The grid covers sequence lengths that are and are not multiples of any tile, every head size the
variant accepts from {16, 32, 64, 128, 256}, causal and not, more and fewer queries than keys (rows that see no key
under the causal mask), B and H > 1, and large-magnitude inputs that overflow a softmax without max-subtraction.
By default a covering part of that grid (see _cases); `pytest --full-grid` runs all of it. Outputs are poisoned (NaN)
before each launch, so an element a kernel does not write fails.
"""

import functools
import itertools

import numpy as np
import pytest
from ahead import Ahead
from test_flash2_triton_gpu import triton_warm_ups

import kernels
import reference as R

T_VALUES = [1, 7, 32, 33, 100, 257, 1024]
D_VALUES = [16, 32, 64, 128, 256]  # 256: Gemma's head size (flash2_mma's D = 256 build, naive, cuBLAS)
VARIANTS_BY_NAME = kernels.tested_variants()  # REGISTRY and STAGING
VARIANTS = sorted(VARIANTS_BY_NAME)


def _head_dim(v, preferred):
    """preferred if the variant takes it, else the nearest head dimension it does take (Variant.head_dims)."""
    if v.accepts_d(preferred):
        return preferred
    return min(v.head_dims, key=lambda d: (abs(d - preferred), d))


def _skip_older_gpu(v, dtype=None):
    """A variant built for a newer GPU than this one (Variant.min_cc, e.g. Hopper's sm_90a; per dtype, e.g. bfloat16 on
    a T4) is skipped, not failed; tests/test_errors_gpu.py checks that it raises a clear error there."""
    reason = v.unsupported_reason(kernels.device_compute_capability(), dtype)
    if reason is not None:
        pytest.skip(reason)


# The default grid, for every variant and dtype (the head size's builds are compiled whatever the length, so the
# default keeps every head size and drops lengths):
#   - T = 257 (several tiles and a ragged end) at every head size the variant takes, causal and not;
#   - T = 33 (no tile divides it; causal and not) and T = 1 (causal) at d = 64 or the nearest d the variant takes
#     (T = 33 at d = 64 is also the compute-sanitizer slice of .github/workflows/ci.yml);
#   - the Tq != Tk cases of PAIRS_DEFAULT: one query row, more keys than queries and more queries than keys (rows
#     that see no key under the causal mask), causal and not, and std-10 inputs with and without the mask.
# --full-grid adds every other length of T_VALUES and every (Tq, Tk) x causal x magnitude.
# tests/test_grid_coverage.py checks that the default keeps these classes.
T_DEFAULT = 257
T_DEFAULT_AT_D64 = {(33, False), (33, True), (1, True)}  # (T, causal) at d = 64 (or the nearest d the variant takes)
PAIRS = [(1, 257), (7, 100), (100, 7), (33, 1024)]
PAIRS_DEFAULT = {((1, 257), False, 10.0), ((7, 100), True, 1.0), ((7, 100), False, 10.0), ((100, 7), True, 10.0),
                 ((100, 7), False, 1.0), ((33, 1024), True, 1.0), ((33, 1024), False, 10.0)}


def _cases():
    for name, T, d, causal in itertools.product(VARIANTS, T_VALUES, D_VALUES, [False, True]):
        v = VARIANTS_BY_NAME[name]
        if not v.accepts_d(d):
            continue
        default = T == T_DEFAULT or (d == _head_dim(v, 64) and (T, causal) in T_DEFAULT_AT_D64)
        for dtype in v.dtypes:
            yield pytest.param(name, dtype, T, T, d, causal, 1.0, marks=() if default else (pytest.mark.full_grid,),
                               id=f"{name}-{dtype}-T{T}-d{d}-{'causal' if causal else 'full'}")
    # ragged query/key lengths, decoding and large magnitudes
    for name in VARIANTS:
        v = VARIANTS_BY_NAME[name]
        d = _head_dim(v, min(64, v.max_d))
        for (Tq, Tk), causal, mag in itertools.product(PAIRS, [False, True], [1.0, 10.0]):
            default = ((Tq, Tk), causal, mag) in PAIRS_DEFAULT
            for dtype in v.dtypes:
                yield pytest.param(name, dtype, Tq, Tk, d, causal, mag, marks=() if default else (pytest.mark.full_grid,),
                                   id=f"{name}-{dtype}-Tq{Tq}-Tk{Tk}-d{d}-{'causal' if causal else 'full'}-x{mag:g}")


def _triton_pair(item):
    params = item.callspec.params if hasattr(item, "callspec") else {}
    return (params["d"], params["dtype"]) if params.get("name") == "flash2_triton" and "d" in params else None


def _plan(item, tmp_path_factory):
    """flash2_triton's builds of each (d, dtype) of the selected cases compile in subprocesses at the session's start
    (tests/ahead.py; tests/test_flash2_triton_gpu.py says how): Triton compiles one build at a time in this one."""
    yield from triton_warm_ups(item, _triton_pair)


AHEAD = Ahead(_plan, first=True)
start_ahead = AHEAD.fixture()


def _inputs(cp, dtype, Tq, Tk, d, mag, seed):
    B, H = (2, 3) if max(Tq, Tk) <= 257 else (1, 2)
    q, k, v = R.make_qkv(B, H, Tq, d, Tk, magnitude=mag, seed=seed)
    return (q, k, v), [cp.asarray(x.astype(dtype)) for x in (q, k, v)]


@functools.lru_cache(maxsize=None)
def _reference(dtype, Tq, Tk, d, causal, mag, seed):
    """R.attention's (o, lse) on _inputs' values rounded to dtype, exactly what the GPU gets: the same for every variant
    of that dtype, so computed once per case and not once per variant."""
    (q, k, v), _ = _inputs(np, dtype, Tq, Tk, d, mag, seed)
    return R.attention(*(x.astype(dtype).astype(np.float64) for x in (q, k, v)), causal=causal, return_lse=True)


@pytest.mark.parametrize("name,dtype,Tq,Tk,d,causal,mag", list(_cases()))
def test_variant_matches_reference(gpu, poison, name, dtype, Tq, Tk, d, causal, mag):
    cp = gpu
    variant = VARIANTS_BY_NAME[name]
    _skip_older_gpu(variant, dtype)
    seed = Tq * 1000 + Tk + d
    _, dev = _inputs(cp, dtype, Tq, Tk, d, mag, seed)
    o_ref, lse_ref = _reference(dtype, Tq, Tk, d, causal, mag, seed)  # on the values the GPU sees, rounded to dtype
    tol_class = variant.tolerance_class(dtype)
    if variant.has_lse:
        o, lse = variant.forward(*dev, causal=causal, return_lse=True)
        assert lse.shape == lse_ref.shape
        res = kernels.check(lse, lse_ref, tol_class)
        assert res.ok, f"lse: {res.detail()}"
    else:
        o = variant.forward(*dev, causal=causal)
    assert o.dtype == dev[0].dtype and o.shape == o_ref.shape
    res = kernels.check(o, o_ref, tol_class)
    assert res.ok, res.detail()


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_explicit_scale(gpu, poison, name):
    cp = gpu
    variant = VARIANTS_BY_NAME[name]
    _skip_older_gpu(variant)
    dtype = variant.dtypes[0]
    _, dev = _inputs(cp, dtype, 45, 45, _head_dim(variant, 32), 1.0, seed=11)
    host = [x.get().astype(np.float64) for x in dev]
    o = variant.forward(*dev, causal=True, scale=0.05)
    assert kernels.check(o, R.attention(*host, causal=True, scale=0.05), variant.tolerance_class(dtype)).ok


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_is_deterministic_run_to_run(gpu, name):
    """A result that changes between identical launches points to a race."""
    cp = gpu
    variant = VARIANTS_BY_NAME[name]
    _skip_older_gpu(variant)
    _, dev = _inputs(cp, variant.dtypes[0], 257, 257, _head_dim(variant, min(64, variant.max_d)), 1.0, seed=5)
    a = variant.forward(*dev, causal=True)
    b = variant.forward(*dev, causal=True)
    assert bool((a == b).all())


@pytest.mark.parametrize("head_major", [True, False])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Tq,Tk,d", [(300, 300, 64), (129, 1000, 128), (257, 33, 32), (200, 333, 256)])
def test_flash2_mma_both_grid_orders(gpu, poison, head_major, causal, Tq, Tk, d):
    """flash2_mma's two grid orders (grid_order picks one per problem, so the grid above meets only one of them
    under a causal mask): o and lse against float64, several query tiles and heads."""
    from kernels.flash import flash2_mma

    cp = gpu
    _, dev = _inputs(cp, "float16", Tq, Tk, d, 1.0, seed=Tq + Tk + d)
    host = [x.get().astype(np.float64) for x in dev]
    o, lse = flash2_mma.forward(*dev, causal=causal, return_lse=True, head_major=head_major)
    o_ref, lse_ref = R.attention(*host, causal=causal, return_lse=True)
    for name, got, want in (("o", o, o_ref), ("lse", lse, lse_ref)):
        res = kernels.check(got, want, "float16")
        assert res.ok, f"{name}, head_major={head_major}: {res.detail()}"


@pytest.mark.parametrize("Tq,Tk,d,causal,mag,dtype", [
    (300, 100, 256, True, 1.0, "float16"),     # Tq > Tk under the causal mask: 200 rows see no key
    (100, 333, 256, False, 10.0, "bfloat16"),  # Tq < Tk, std-10 logits
    (1, 257, 256, True, 1.0, "bfloat16"),      # one query row (decoding)
    (257, 1000, 256, True, 10.0, "float16"),   # several query tiles against a longer key range
    (129, 200, 200, True, 1.0, "float16"),     # d between builds: the D = 256 build, columns 200..255 zero-filled
    (77, 40, 136, True, 1.0, "bfloat16"),
])
def test_flash2_mma_d256_ragged(gpu, poison, Tq, Tk, d, causal, mag, dtype):
    """flash2_mma's D = 256 build (Gemma's head size; the grid above runs it at Tq = Tk = 257) on Tq != Tk, decoding,
    large logits and head sizes between 128 and 256: o and lse against float64, and a row that sees no key gives
    exactly 0 and lse = -inf."""
    from kernels.flash import flash2_mma

    cp = gpu
    _, dev = _inputs(cp, dtype, Tq, Tk, d, mag, seed=Tq + 7 * Tk + d)
    host = [x.get().astype(np.float64) for x in dev]
    o, lse = flash2_mma.forward(*dev, causal=causal, return_lse=True)
    o_ref, lse_ref = R.attention(*host, causal=causal, return_lse=True)
    assert o.dtype == dev[0].dtype and o.shape == o_ref.shape and lse.shape == lse_ref.shape
    for name, got, want in (("o", o, o_ref), ("lse", lse, lse_ref)):
        res = kernels.check(got, want, dtype)
        assert res.ok, f"{name}: {res.detail()}"
    empty = np.isneginf(lse_ref)
    assert empty.any() == (causal and Tq > Tk)
    if empty.any():
        assert bool((o.get()[empty] == 0).all()) and bool(np.isneginf(lse.get()[empty]).all())


# Each case forces the row-by-row loop, a build of its own per (head-size build, dtype). By default every head-size
# build (D = 32, 64, 96, 128) meets each loop under the causal mask, in one dtype or the other (both at D = 64: a full
# square and Tq > Tk), and once without the mask; --full-grid: every shape x causal x dtype.
TWO_LOOPS_DEFAULT = {(300, 300, 64, True, "float16"), (100, 7, 64, True, "bfloat16"), (129, 1000, 128, True, "bfloat16"),
                     (129, 1000, 128, False, "bfloat16"), (257, 33, 32, True, "float16"), (1, 257, 96, True, "bfloat16")}


def _two_loops_cases():
    for (Tq, Tk, d), causal, dtype in itertools.product([(300, 300, 64), (129, 1000, 128), (100, 7, 64), (257, 33, 32),
                                                         (1, 257, 96)], [True, False], ["float16", "bfloat16"]):
        default = (Tq, Tk, d, causal, dtype) in TWO_LOOPS_DEFAULT
        yield pytest.param(dtype, causal, Tq, Tk, d, id=f"{Tq}-{Tk}-{d}-{causal}-{dtype}",
                           marks=() if default else (pytest.mark.full_grid,))


@pytest.mark.parametrize("dtype,causal,Tq,Tk,d", list(_two_loops_cases()))
def test_flash2_mma_two_loops_agree_bit_for_bit(gpu, poison, dtype, causal, Tq, Tk, d):
    """flash2_mma's ILP loop (unmasked tiles first, the rows' softmax side by side) and its row-by-row loop on the
    same tile: both within the tolerance of float64, and the same o and lse to the bit (the kernel's header says
    the arithmetic and its order are the same; a difference would mean they are not)."""
    from kernels.flash import flash2_mma

    cp = gpu
    _, dev = _inputs(cp, dtype, Tq, Tk, d, 1.0, seed=Tq + 3 * Tk + d)
    tile = flash2_mma.TILES[flash2_mma.BUILD_FOR[d]]
    assert tile.loop == "ILP"  # the default builds take the ILP loop; tile.ILP forces one or the other
    outs = {}
    for ilp in (True, False):
        outs[ilp] = flash2_mma.forward(*dev, causal=causal, return_lse=True, tile=tile._replace(ILP=ilp))
    o_ref, lse_ref = R.attention(*(x.get().astype(np.float64) for x in dev), causal=causal, return_lse=True)
    for ilp, (o, lse) in outs.items():
        for name, got, want in (("o", o, o_ref), ("lse", lse, lse_ref)):
            res = kernels.check(got, want, dtype)
            assert res.ok, f"{name}, ILP={ilp}: {res.detail()}"
    for i, name in enumerate(("o", "lse")):
        a, b = outs[True][i], outs[False][i]
        same = (a.view(cp.uint16) == b.view(cp.uint16)) if name == "o" else (a.view(cp.uint32) == b.view(cp.uint32))
        assert bool(same.all()), \
            f"{name} differs between the ILP and the row-by-row loop in {int((~same).sum())} elements"
