"""flash2_mma's variant kernel without a GPU: every variant build of the launcher compiles with NVRTC for sm_80 and
sm_90 and its CUBIN holds the kernel; the launcher's checks of the variant options raise the error that names the
argument and its limit (variant_spec and check_variant_arrays look at shapes, dtypes and values only); the tile
arithmetic of the kernel's key_tiles, written out in Python, visits exactly the tiles the reference's block_mask does
not call EMPTY and calls FULL only tiles the reference calls FULL. And the D = 256 builds (dense, varlen, variants):
which head sizes they take, that their tile fits the shared memory of every GPU the kernel runs on (and the error
that names d and the limit where a tile does not), and that NVRTC compiles them for sm_80 and sm_90 without spills."""

import math
import re
from pathlib import Path

import numpy as np
import pytest
from ahead import Ahead

import reference.variants as RV
from kernels import core
from kernels.flash import flash2_mma as F

ARCHS = ["sm_80", "sm_90"]


def _variant_builds():
    return [(names, defines) for names, defines in F.NVRTC_BUILDS
            if not names or names[0].startswith(F.VARIANTS_KERNEL_NAME)]


def test_every_variant_build_is_listed():
    names = {n for ns, _ in _variant_builds() for n in ns}
    for D in F.HEAD_DIMS:
        for dt in F.DTYPES:
            for mods in range(8):
                assert F.variant_name_expression(D, F.TILES[D], dt, mods) in names
    assert any(not ns and "-DCLASS_THREADS=128" in defines for ns, defines in _variant_builds())


def nvrtc_build(launcher, names, defines, arch):
    """launcher's kernel file compiled by NVRTC as the launcher builds it (the course's options, these -D defines and
    name expressions): compile_program's (cubin, log, lowered names). The backward's variant tests use it too."""
    from kernels.core import NVRTC_OPTIONS, compile_program, cuda_header_options
    from tests.test_compile import _cuda_include_dir

    inc = _cuda_include_dir()
    options = (*NVRTC_OPTIONS, *defines, *cuda_header_options(), *([f"-I{inc}"] if inc is not None else []))
    source = (Path(launcher.__file__).parent / launcher.KERNEL_FILE).read_text()
    return compile_program(source, launcher.KERNEL_FILE, arch, options, tuple(names))


def variant_build_plan(launcher, tests=("test_variant_build_compiles_and_holds_its_kernels",)):
    """The Ahead plan of a file whose tests (by name; each parametrized by names, defines and arch) build launcher's
    kernels: one build per distinct (names, defines, arch), shared by the tests that ask for it."""
    def plan(item, tmp_path_factory):
        if item.originalname in tests:
            p = item.callspec.params
            yield (tuple(p["names"]), tuple(p["defines"]), p["arch"]), nvrtc_build, \
                (launcher, p["names"], p["defines"], p["arch"])
    return plan


def variant_build_symbols(ahead, launcher, names, defines, arch) -> set:
    """The kernel symbols of one variant build (from ahead, the file's Ahead), once NVRTC's log is checked free of
    warnings and every name expression is found among them."""
    from tests.test_compile import _kernel_names_in

    cubin, log, lowered = ahead.result((tuple(names), tuple(defines), arch), nvrtc_build, launcher, names, defines, arch)
    assert "warning" not in log.lower(), log
    symbols = _kernel_names_in(cubin)
    for expr in names:
        assert lowered[expr].encode() in symbols, f"{expr} is not in the {arch} CUBIN"
    return symbols


# tests/ahead.py: this file's builds start together, a thread per core
AHEAD = Ahead(variant_build_plan(F, ("test_variant_build_compiles_and_holds_its_kernels",
                                     "test_d256_build_compiles_without_spills")))
start_ahead = AHEAD.fixture()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("names,defines", _variant_builds(), ids=lambda x: (x[0] if x else "classes")
                         if isinstance(x, tuple) and (not x or not x[0].startswith("-D")) else "")
def test_variant_build_compiles_and_holds_its_kernels(names, defines, arch):
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
    symbols = variant_build_symbols(AHEAD, F, names, defines, arch)
    assert F.CLASS_KERNEL_NAME.encode() in symbols, f"{F.CLASS_KERNEL_NAME} is not in the {arch} CUBIN"


# ---- the checks of the options ---------------------------------------------------------------------------------------

Q, K = (2, 8, 100, 64), (2, 2, 90, 64)  # B = 2, Hq = 8, Hkv = 2, Tq = 100, Tk = 90, d = 64


def _spec(**kw):
    return F.variant_spec(Q, K, 0.125, **kw)


@pytest.mark.parametrize("kw,error,match", [
    (dict(window=(-1, 0)), ValueError, r"window left must be >= 0.*got -1"),
    (dict(window=(4, -2)), ValueError, r"window right must be >= 0.*got -2"),
    (dict(window=(1.5, 0)), TypeError, r"window left must be an int"),
    (dict(window=(True, 0)), TypeError, r"window left must be an int"),
    (dict(window=5), ValueError, r"window must be a pair \(left, right\)"),
    (dict(window=(1, 2, 3)), ValueError, r"window must be a pair"),
    (dict(prefix=-1), ValueError, r"prefix must be in \[0, Tk=90\]; got -1"),
    (dict(prefix=91), ValueError, r"prefix must be in \[0, Tk=90\]; got 91"),
    (dict(prefix=2.0), TypeError, r"prefix must be an int"),
    (dict(softcap=0.0), ValueError, r"softcap must be a finite number > 0.*got 0.0"),
    (dict(softcap=-30), ValueError, r"softcap must be a finite number > 0"),
    (dict(softcap=float("inf")), ValueError, r"softcap must be a finite number > 0.*inf"),
    (dict(softcap=float("nan")), ValueError, r"softcap must be a finite number > 0.*nan"),
    (dict(softcap="30"), TypeError, r"softcap must be a number"),
])
def test_bad_option_is_a_clear_error(kw, error, match):
    with pytest.raises(error, match=match):
        _spec(**kw)


@pytest.mark.parametrize("Hq,Hkv", [(8, 3), (4, 8), (6, 0)])
def test_heads_not_a_multiple_is_a_value_error(Hq, Hkv):
    with pytest.raises(ValueError, match=rf"Hq={Hq} heads and k, v Hkv={Hkv}.*Hq % Hkv == 0"):
        F.variant_spec((1, Hq, 16, 64), (1, Hkv, 16, 64), 0.125)


def test_spec_folds_causal_and_unbounded_sides():
    unbounded = 100 + 90
    assert _spec() == F.VariantSpec(4, unbounded, unbounded, 0, 0, 0.0, 0.0)
    assert _spec(causal=True, window=(16, None)) == F.VariantSpec(4, 16, 0, 0, 0, 0.0, 0.0)
    assert _spec(causal=True, window=(None, 5), prefix=7)[1:4] == (unbounded, 0, 7)
    assert _spec(window=(3, 10**9))[1:3] == (3, unbounded)  # clamped to a value no position reaches
    s = _spec(softcap=30.0, docs=True, alibi=True)
    assert s.mods == F.MOD_DOCS | F.MOD_SOFTCAP | F.MOD_ALIBI
    assert math.isclose(s.cap_in, 0.125 / 30.0) and math.isclose(s.cap_out, 30.0 / math.log(2.0))


def _ids(*shape, dtype=np.int32):
    return np.zeros(shape, dtype=dtype)


@pytest.mark.parametrize("args,error,match", [
    ((_ids(2, 100), None, None), ValueError, r"doc_ids_k is needed when Tq != Tk \(Tq=100, Tk=90\)"),
    ((None, _ids(2, 90), None), ValueError, r"doc_ids_k was given without doc_ids_q"),
    ((_ids(2, 99), _ids(2, 90), None), ValueError, r"doc_ids_q must have shape \(B, Tq\) = \(2, 100\); got \(2, 99\)"),
    ((_ids(100), _ids(2, 90), None), ValueError, r"doc_ids_q must have shape \(B, Tq\) = \(2, 100\); got \(100,\)"),
    ((_ids(2, 100), _ids(1, 90), None), ValueError, r"doc_ids_k must have shape \(B, Tk\) = \(2, 90\)"),
    ((_ids(2, 100, dtype=np.int64), _ids(2, 90), None), TypeError, r"doc_ids_q has dtype int64; it must be int32"),
    ((None, None, np.ones(7, np.float32)), ValueError, r"alibi_slopes must have shape \(Hq,\).* = \(8,\); got \(7,\)"),
    ((None, None, np.ones((2, 8), np.float32)), ValueError, r"alibi_slopes must have shape \(Hq,\)"),
    ((None, None, np.ones(8, np.float64)), TypeError, r"alibi_slopes has dtype float64; it must be float32"),
    ((None, None, [0.5] * 8), TypeError, r"alibi_slopes must be an array"),
])
def test_bad_array_is_a_clear_error(args, error, match):
    with pytest.raises(error, match=match):
        F.check_variant_arrays(*args, B=2, Hq=8, Tq=100, Tk=90)


def test_doc_ids_k_defaults_to_doc_ids_q_when_the_lengths_agree():
    ids = _ids(2, 50)
    assert F.check_variant_arrays(ids, None, None, B=2, Hq=8, Tq=50, Tk=50)[1] is ids


# ---- the D = 256 build (Gemma's head size) ------------------------------------------------------------------------

# The GPUs the kernel runs on (compute capability >= 8.0), with the shared memory a block may opt into: 163 KB on an
# A100, 99 KB on sm_86 and sm_89, 227 KB on an H100 (name, cc, SMs, opt-in bytes, L2 bytes, as DeviceInfo holds them).
A100 = core.DeviceInfo(0, "NVIDIA A100-SXM4-80GB", (8, 0), 108, 163 * 1024, 40 * 2**20)
SM86 = core.DeviceInfo(0, "NVIDIA A10", (8, 6), 72, 99 * 1024, 6 * 2**20)
SM89 = core.DeviceInfo(0, "NVIDIA L4", (8, 9), 58, 99 * 1024, 48 * 2**20)
H100 = core.DeviceInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 132, 227 * 1024, 50 * 2**20)
GPUS = (A100, SM86, SM89, H100)


def test_d256_build_takes_every_head_size_above_128():
    """d in (128, 256], a multiple of 8, runs on the D = 256 build, as d <= 128 runs on the next build up; d > 256 has
    no build (validate_attention then reports d <= 256, on the GPU: tests/test_flash2_variants_gpu.py)."""
    assert F.MAX_D == 256 and F.HEAD_DIMS == (32, 64, 96, 128, 256)
    assert {F.BUILD_FOR[d] for d in range(136, 257, 8)} == {256} and F.BUILD_FOR[128] == 128
    assert 257 not in F.BUILD_FOR and F.VARLEN_TILES[256] == F.TILES[256]
    names = {n for ns, _ in F.NVRTC_BUILDS for n in ns}
    for dt in F.DTYPES:
        assert F.name_expression(256, F.TILES[256], dt) in names
        assert F.name_expression(256, F.VARLEN_TILES[256], dt, F.VARLEN_KERNEL_NAME) in names
    for D in (192, 257, 512):  # a multiple of 16 that is not a build, and sizes past the largest
        with pytest.raises(ValueError, match=rf"D={D} is not one of \(32, 64, 96, 128, 256\)"):
            F.TILES[256].check(D)


def test_d256_tile_fits_every_gpu_of_the_kernel():
    """The D = 256 tile: one m-tile per warp (O alone is MT D / 2 = 128 float registers per thread), 32 keys per tile,
    2 (64 + 4 * 32) (256 + 8) = 99 KB of shared memory: within every opt-in limit, exactly sm_86's and sm_89's. By
    shared memory an H100 holds two such blocks per SM and an A100 one (core.blocks_per_sm's rule: the opt-in limit
    plus the 1 KB the driver keeps per block)."""
    tile = F.TILES[256]
    tile.check(256)
    assert (tile.BC, tile.NWARPS, tile.MT, tile.rows, tile.threads) == (32, 4, 1, 64, 128)
    assert tile.MT * 256 // 2 == 128 and tile.loop_for(256) == "ILP"  # the unfused ILP loop (FUSED_MAX_D = 64)
    smem = tile.smem_bytes(256)
    assert smem == 2 * (64 + 4 * 32) * (256 + 8) == 99 * 1024 == SM86.smem_optin == SM89.smem_optin
    for gpu in GPUS:
        F.check_shared_memory_fits(tile, 256, 256, gpu.smem_optin)
    per_sm = {gpu.name: (gpu.smem_optin + 1024) // (smem + 1024) for gpu in GPUS}
    assert per_sm == {A100.name: 1, SM86.name: 1, SM89.name: 1, H100.name: 2}


@pytest.mark.parametrize("tile,D,d,gpu,needs", [
    ((64, 4, 1, 1), 256, 256, A100, 168960),  # 64 keys per tile: 165 KB, over an A100's 163 KB
    ((32, 8, 1, 1), 256, 200, SM86, 135168),  # 8 warps (BR = 128): 132 KB, over sm_86's 99 KB
    ((32, 8, 1, 1), 256, 136, SM89, 135168),
])
def test_a_tile_over_the_gpu_limit_names_d_and_the_limit(tile, D, d, gpu, needs):
    with pytest.raises(ValueError, match=rf"flash2_mma attention: head dimension d={d} runs on the D={D} build, whose "
                                         rf"tile \(BC, NWARPS, MT, MIN_BLOCKS, ILP\) = \({', '.join(map(str, tile))}, "
                                         rf"None\) needs {needs} bytes of shared memory per block; this GPU allows at "
                                         rf"most {gpu.smem_optin}"):
        F.check_shared_memory_fits(F.MmaTile(*tile), D, d, gpu.smem_optin)
    F.check_shared_memory_fits(F.MmaTile(*tile), D, d, H100.smem_optin)  # an H100 takes either


def _d256_builds():
    return [(names, defines) for names, defines in F.NVRTC_BUILDS
            if names and names[0].split("<")[1].startswith("256,")]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("names,defines", _d256_builds(),
                         ids=lambda x: (x[0] if len(x) == 1 else x[0].rsplit(",", 1)[0] + ", 0..7>")
                         if isinstance(x, tuple) and x and not x[0].startswith("-D") else "")
def test_d256_build_compiles_without_spills(tmp_path, names, defines, arch):
    """Each D = 256 build of the launcher (dense and varlen in fp16 and bf16, the eight variant builds of each dtype):
    NVRTC compiles it without a warning, its CUBIN holds every kernel, and cuobjdump finds no stack, no local memory
    and no local loads or stores (spills) in them: O (128 floats per thread), S and the fragments fit 255 registers."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
    from test_hopper_compile import _per_function, _run, cuobjdump_for

    variant_build_symbols(AHEAD, F, names, defines, arch)  # warning-free, every name expression in the CUBIN
    cubin, _, lowered = AHEAD.result((tuple(names), tuple(defines), arch), nvrtc_build, F, names, defines, arch)
    path = tmp_path / "d256.cubin"
    path.write_bytes(cubin)
    tool = cuobjdump_for(path)
    usage = {name: (int(reg), int(stack), int(local)) for name, reg, stack, local in re.findall(
        r"Function (\w+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", _run(tool, "-res-usage", str(path)))}
    sass = _per_function(_run(tool, "-sass", str(path)), r"Function : (\w+)")
    for expr in names:
        name = lowered[expr]
        reg, stack, local = usage[name]
        assert reg <= 255 and stack == 0 and local == 0, \
            f"{expr} ({arch}): {reg} registers, stack {stack} and local memory {local} bytes"
        assert not re.search(r"\b(?:LDL|STL)\b", sass[name]), f"{expr} ({arch}): local-memory loads/stores (spills)"


# ---- the tile arithmetic of key_tiles against the reference's block mask ---------------------------------------------

def _key_tiles(q0, q_last, Tk, diag, left, right, prefix, BC, classes=None):
    """kernels/flash/flash2_mma.cu's key_tiles and KeyTiles, step for step: [(tile, full)] in visiting order."""
    c_first, c_last = q0 + diag, q_last + diag
    lo, hi = max(0, c_first - left), min(Tk, c_last + right + 1)
    pre_end = (min(prefix, Tk) + BC - 1) // BC
    band_begin = max(lo // BC, pre_end)
    band_end = (hi + BC - 1) // BC if hi > lo else 0
    end = band_end if band_end > band_begin else pre_end

    def after(t):
        while True:
            t = t + 1 if t + 1 < pre_end else max(t + 1, band_begin)
            if classes is None or t >= end or classes[t] != RV.EMPTY:
                return t

    def full(t):
        k0, k1 = t * BC, t * BC + BC - 1
        seen = k1 < Tk and (k1 < prefix or (c_last - left <= max(k0, prefix) and k1 <= c_first + right))
        return seen and (classes is None or classes[t] == RV.FULL)

    t = 0 if pre_end > 0 else band_begin
    if classes is not None and t < end and classes[t] == RV.EMPTY:
        t = after(t)
    out = []
    while t < end:
        out.append((t, full(t)))
        t = after(t)
    return out


def _doc_classes(ids_q, ids_k, BR, BC):
    """flash2_mma_doc_classes in Python: the span test per (query tile, key tile)."""
    nq, nk = -(-len(ids_q) // BR), -(-len(ids_k) // BC)
    out = np.empty((nq, nk), np.int8)
    for i in range(nq):
        a = ids_q[i * BR:(i + 1) * BR]
        for j in range(nk):
            b = ids_k[j * BC:(j + 1) * BC]
            if b.max() < a.min() or b.min() > a.max():
                out[i, j] = RV.EMPTY
            elif a.min() == a.max() == b.min() == b.max():
                out[i, j] = RV.FULL
            else:
                out[i, j] = RV.PARTIAL
    return out


CASES = [  # (Tq, Tk, causal, window, prefix, documents)
    (300, 300, True, None, None, None), (300, 300, False, (40, 0), None, None), (300, 300, True, (100, None), None, None),
    (257, 600, True, (64, 0), None, None), (600, 257, True, None, None, None), (600, 257, False, (10, 10), None, None),
    (300, 300, True, None, 70, None), (200, 333, False, (0, 0), 129, None), (333, 200, True, (5, 0), 64, None),
    (500, 500, True, None, None, [1, 100, 37, 1, 200, 161]), (300, 300, False, None, None, [64, 64, 1, 171]),
    (130, 200, True, (30, 0), 20, "sorted"), (1, 500, True, (17, 0), None, None), (129, 129, False, (0, 3), 1, None),
]


def case_mask(Tq, Tk, causal, window, prefix, docs):
    """(mask, ids_q, ids_k) of one CASES row: its reference mask, and its document ids (None without documents;
    docs "sorted": random sorted ids from a seeded generator; otherwise the documents' lengths, one sequence)."""
    ids_q = ids_k = None
    if docs == "sorted":
        rng = np.random.default_rng(Tq + Tk)
        ids_q, ids_k = np.sort(rng.integers(0, 5, Tq)), np.sort(rng.integers(0, 5, Tk))
    elif docs is not None:
        ids_q = ids_k = np.repeat(np.arange(len(docs)), docs)
    mask = RV.variant_mask(Tq, Tk, causal=causal, window=window, prefix=prefix, doc_ids_q=ids_q, doc_ids_k=ids_k)
    return mask, ids_q, ids_k


@pytest.mark.parametrize("Tq,Tk,causal,window,prefix,docs", CASES)
def test_key_tiles_visit_what_the_block_mask_sees(Tq, Tk, causal, window, prefix, docs):
    BR, BC = 128, 64
    mask, ids_q, ids_k = case_mask(Tq, Tk, causal, window, prefix, docs)
    kinds, _ = RV.block_mask(mask, BR, BC)
    spec = F.variant_spec((1, 1, Tq, 64), (1, 1, Tk, 64), 0.125, causal=causal, window=window, prefix=prefix)
    classes = None if ids_q is None else _doc_classes(ids_q, ids_k, BR, BC)
    for qt in range(kinds.shape[0]):
        q0 = qt * BR
        tiles = _key_tiles(q0, min(q0 + BR, Tq) - 1, Tk, Tk - Tq, spec.left, spec.right, spec.prefix, BC,
                           None if classes is None else classes[qt])
        visited = [t for t, _ in tiles]
        assert visited == sorted(set(visited)), "tiles out of order or twice"
        needed = [t for t in range(kinds.shape[1]) if kinds[qt, t] != RV.EMPTY]
        assert set(needed) <= set(visited), f"query tile {qt}: tiles {sorted(set(needed) - set(visited))} are skipped"
        if ids_q is None:  # the arithmetic is exact: nothing more than the visible tiles
            assert visited == needed, f"query tile {qt}: visits {visited}, sees {needed}"
        for t, full in tiles:
            if full:
                assert kinds[qt, t] == RV.FULL, f"query tile {qt}, key tile {t}: run without the mask, but not FULL"


def test_a_window_touches_only_its_tiles():
    """The issue's shape: a causal window of 1024 at T = 16384 visits about 1024 / BC + 2 key tiles per query tile."""
    T, BR, BC = 16384, 128, 64
    spec = F.variant_spec((1, 1, T, 64), (1, 1, T, 64), 0.125, causal=True, window=(1024, 0))
    counts = [len(_key_tiles(q0, q0 + BR - 1, T, 0, spec.left, spec.right, spec.prefix, BC)) for q0 in range(0, T, BR)]
    assert max(counts) <= (1024 + BR) // BC + 1
