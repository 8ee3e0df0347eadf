"""flash2_mma_bwd's variant kernel without a GPU: every variant build of the launcher compiles with NVRTC for sm_80 and
sm_90 and its CUBIN holds its kernels; the backward checks its options with the forward's own functions (so a bad option
is the forward's error); the tile arithmetic of the kernel's query_tiles, written out in Python, visits exactly the
query tiles that see a key of the block (by the reference's block_mask) and calls FULL only tiles the reference calls
FULL, for the backward's tiles (BR = 128 or 64 queries, BC = 128 keys)."""


import numpy as np
import pytest
from ahead import Ahead

import reference.variants as RV
from kernels.flash import flash2_mma as F
from kernels.flash import flash2_mma_bwd as B
from test_flash2_variants_cpu import CASES, _doc_classes, case_mask, variant_build_plan, variant_build_symbols

ARCHS = ["sm_80", "sm_90"]


def _variant_builds():
    return [(names, defines) for names, defines in B.NVRTC_BUILDS if any(B.VARIANTS_NAME in n for n in names)]


def test_every_variant_build_is_listed():
    names = {n for ns, _ in _variant_builds() for n in ns}
    for D in B.HEAD_DIMS:
        for dt in B.DTYPES:
            for mods in range(8):
                assert set(B.variant_name_expressions(D, B.TILES[D], dt, mods)) <= names


AHEAD = Ahead(variant_build_plan(B))  # tests/ahead.py: this file's builds start together, a thread per core
compile_ahead = AHEAD.fixture()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("names,defines", _variant_builds(),
                         ids=lambda x: x[1] if isinstance(x, tuple) and x and not x[0].startswith("-D") else "")
def test_variant_build_compiles_and_holds_its_kernels(names, defines, arch):
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
    variant_build_symbols(AHEAD, B, names, defines, arch)


# ---- the options: the forward's checks ------------------------------------------------------------------------------

def test_the_backward_checks_with_the_forwards_functions():
    """One set of checks for both directions: the backward imports the forward's, it has no copy of its own."""
    assert B.variant_spec is F.variant_spec and B.check_variant_arrays is F.check_variant_arrays
    assert B.doc_classes is F.doc_classes and B.validate_variant_problem is F.validate_variant_problem


@pytest.mark.parametrize("kw,error,match", [
    (dict(window=(-1, 0)), ValueError, r"window left must be >= 0.*got -1"),
    (dict(window=(2.5, None)), TypeError, r"window left must be an int"),
    (dict(window=7), ValueError, r"window must be a pair"),
    (dict(prefix=91), ValueError, r"prefix must be in \[0, Tk=90\]; got 91"),
    (dict(softcap=float("nan")), ValueError, r"softcap must be a finite number > 0"),
    (dict(softcap="30"), TypeError, r"softcap must be a number"),
])
def test_bad_option_is_the_forwards_error(kw, error, match):
    with pytest.raises(error, match=match):
        B.variant_spec((2, 8, 100, 64), (2, 2, 90, 64), 0.125, **kw)


def test_bad_arrays_are_the_forwards_errors():
    with pytest.raises(ValueError, match=r"alibi_slopes must have shape \(Hq,\)"):
        B.check_variant_arrays(None, None, np.ones(7, np.float32), B=2, Hq=8, Tq=100, Tk=90)
    with pytest.raises(ValueError, match=r"doc_ids_k is needed when Tq != Tk"):
        B.check_variant_arrays(np.zeros((2, 100), np.int32), None, None, B=2, Hq=8, Tq=100, Tk=90)
    with pytest.raises(ValueError, match=r"Hq % Hkv == 0"):
        B.variant_spec((1, 6, 16, 64), (1, 4, 16, 64), 0.125)


# ---- the tile arithmetic of query_tiles against the reference's block mask -------------------------------------------

def _query_tiles(k0, Tq, Tk, left, right, prefix, BR, BC, classes=None):
    """kernels/flash/flash2_mma_bwd.cu's query_tiles and QueryTiles, step for step: [(query tile, full)] in order.
    classes: the block's class per query tile (MOD_DOCS), or None."""
    diag, n_qt = Tk - Tq, -(-Tq // BR)
    first, end = 0, n_qt
    if k0 >= prefix:
        lo, hi = max(0, k0 - right - diag), min(Tq - 1, min(k0 + BC, Tk) - 1 + left - diag)
        first = lo // BR
        end = hi // BR + 1 if hi >= lo else first

    def after(i):
        i += 1
        while classes is not None and i < end and classes[i] == RV.EMPTY:
            i += 1
        return i

    def full(i):
        k1, c_first, c_last = k0 + BC - 1, i * BR + diag, min(i * BR + BR, Tq) - 1 + diag
        seen = k1 < Tk and (k1 < prefix or (c_last - left <= max(k0, prefix) and k1 <= c_first + right))
        return seen and (classes is None or classes[i] == RV.FULL)

    if classes is not None and first < end and classes[first] == RV.EMPTY:
        first = after(first)
    out, i = [], first
    while i < end:
        out.append((i, full(i)))
        i = after(i)
    return out


@pytest.mark.parametrize("BR", [128, 64])
@pytest.mark.parametrize("Tq,Tk,causal,window,prefix,docs", CASES)
def test_query_tiles_visit_what_the_block_mask_sees(BR, Tq, Tk, causal, window, prefix, docs):
    BC = 128
    mask, ids_q, ids_k = case_mask(Tq, Tk, causal, window, prefix, docs)
    kinds, _ = RV.block_mask(mask, BR, BC)
    spec = F.variant_spec((1, 1, Tq, 64), (1, 1, Tk, 64), 0.125, causal=causal, window=window, prefix=prefix)
    classes = None if ids_q is None else _doc_classes(ids_q, ids_k, BR, BC)
    for kt in range(kinds.shape[1]):
        tiles = _query_tiles(kt * BC, Tq, Tk, spec.left, spec.right, spec.prefix, BR, BC,
                             None if classes is None else classes[:, kt])
        visited = [i for i, _ in tiles]
        assert visited == sorted(set(visited)), "tiles out of order or twice"
        needed = [i for i in range(kinds.shape[0]) if kinds[i, kt] != RV.EMPTY]
        assert set(needed) <= set(visited), f"key tile {kt}: query tiles {sorted(set(needed) - set(visited))} skipped"
        if ids_q is None:  # the arithmetic is exact: nothing more than the tiles that see a key
            assert visited == needed, f"key tile {kt}: visits {visited}, sees {needed}"
        for i, full in tiles:
            if full:
                assert kinds[i, kt] == RV.FULL, f"key tile {kt}, query tile {i}: run without the mask, but not FULL"


def test_without_options_the_walk_is_the_dense_kernels():
    """No option: query_tiles gives the dense kernel's range, [max(0, k0 - diag) // BR if causal else 0, n_qtiles)."""
    for Tq, Tk in [(300, 300), (129, 1000), (257, 33), (100, 7), (1, 500), (500, 1)]:
        for causal in (False, True):
            spec = F.variant_spec((1, 1, Tq, 64), (1, 1, Tk, 64), 0.125, causal=causal)
            for k0 in range(0, Tk, 128):
                first = max(0, k0 - (Tk - Tq)) // 128 if causal else 0
                got = [i for i, _ in _query_tiles(k0, Tq, Tk, spec.left, spec.right, spec.prefix, 128, 128)]
                assert got == list(range(first, -(-Tq // 128))), (Tq, Tk, causal, k0)
