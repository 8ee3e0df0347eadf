"""The variant entry points of kernels/hopper/hopper_attn.cu (-D VARIANT_MODS) without a GPU.

Each variant build of the launcher (kernels.hopper.hopper_attn.VARIANT_BUILDS: one per MODS, a sum of MOD_DOCS,
MOD_SOFTCAP, MOD_ALIBI, at the tilings of VARIANT_TILES) compiles with NVRTC for sm_90a, holds its four kernels with
the products of those tilings (HGMMA SS and RS, as tests/test_hopper_attn_compile.py counts them), the registers that
setmaxnreg's budget assumes and no local memory; the build with every switch compiles so under the other schedules
too, and as stubs for sm_90. The launcher's constants agree with the kernel's. Then the tile walk: the kernel's
key_tiles and the per-warpgroup FULL test of tile_softmax, written out in Python, visit exactly the key tiles that
reference.variants.block_mask does not call EMPTY (at the CTA's rows) and run unmasked only tiles it calls FULL (at a
warpgroup's 64 rows), and the producer's order of K and V loads is the order the consumers' loops take them in; and
the consumers' arithmetic on those tiles (modifiers, mask only off FULL tiles, online softmax with lazy rescaling),
emulated in float64, gives attention_variant's o and lse.
"""

import inspect
import re

import numpy as np
import pytest
from ahead import Ahead

import reference.variants as RV
from kernels import core
from kernels.flash import flash2_mma as F
from kernels.hopper import hopper_attn as A
from test_flash2_variants_cpu import _doc_classes, case_mask
from test_flash2_variants_cpu import _key_tiles as _flash2_key_tiles
from test_hopper_compile import _nvrtc_available, _per_function, _run, cuobjdump_for

ARCH = "sm_90a"
HGMMA = re.compile(r"\bHGMMA\.64x(\d+)x16\.F32(\.BF16)?\s+R\d+,\s*(R\d+|gdesc\[\w+\])")
NAMES = {v: k for k, v in A.VARIANT_KERNEL_NAMES.items()}  # kernel name -> (dtype, d)


def _nvrtc_build(defines, arch):
    source = core.kernel_path(A.KERNEL_FILE).read_text()
    return core.compile_cubin(source, A.KERNEL_FILE, arch, core.NVRTC_OPTIONS + tuple(defines))


def _schedule_defines(schedule):
    return (sum((A.tiles_defines(d, A.VARIANT_TILES[d]) for d in A.HEAD_DIMS), ())
            + A.SCHEDULES[schedule] + core.defines_from(VARIANT_MODS=7))


def _plan(item, tmp_path_factory):
    params = item.callspec.params if hasattr(item, "callspec") else {}
    if not _nvrtc_available():
        return
    if item.originalname == "test_variant_build_compiles_for_sm90a_without_spills":
        defines = tuple(params["defines"])
        yield (defines, ARCH), _nvrtc_build, (defines, ARCH)
    elif item.originalname == "test_every_switch_under_the_other_schedules":
        defines = tuple(_schedule_defines(params["schedule"]))
        yield (defines, ARCH), _nvrtc_build, (defines, ARCH)


AHEAD = Ahead(_plan)  # tests/ahead.py: this file's builds start together, a thread per core
start_ahead = AHEAD.fixture()


def _compile(defines, arch=ARCH):
    if not _nvrtc_available():
        pytest.skip("NVRTC is not installed (pip install cuda-bindings nvidia-cuda-nvrtc)")
    data, log = AHEAD.result((tuple(defines), arch), _nvrtc_build, tuple(defines), arch)
    assert "warning" not in log.lower(), f"{A.KERNEL_FILE} ({arch}, {defines}) compiles with warnings:\n{log}"
    return data


def _check_cubin(tmp_path, data, overlap):
    """The variant kernels of one CUBIN: their products, TMA loads, registers and (no) local memory."""
    path = tmp_path / "variants.cubin"
    path.write_bytes(data)
    tool = cuobjdump_for(path)
    sass = _per_function(_run(tool, "-sass", str(path)), r"Function : (\w+)")
    assert set(sass) == set(NAMES), f"functions: {sorted(sass)}"
    copies = 2 if overlap else 1
    for name, code in sass.items():
        dtype, d = NAMES[name]
        N = A.VARIANT_TILES[d].block_n
        found = HGMMA.findall(code)
        assert all(bool(bf) == (dtype == "bfloat16") for _, bf, _ in found), name
        ss = [f for f in found if f[2].startswith("gdesc")]
        rs = [f for f in found if f[2].startswith("R")]
        assert len(ss) == copies * d // 16 and all(n == str(N) for n, *_ in ss), f"{name}: S = Q K^T: {ss}"
        pv_n = min(d, 128)  # at d = 256 two m64n128k16 per k-step of O += P V
        assert len(rs) == copies * N // 16 * (d // pv_n) and all(n == str(pv_n) for n, *_ in rs), \
            f"{name}: O += P V: {rs}"
        assert len(re.findall(r"\bUTMALDG\.3D\b", code)) == 3 * (d // 64), f"{name}: Q, K, V per 64 columns"
        assert not re.search(r"\b(?:LDL|STL)\b", code), f"{name}: local-memory loads/stores (spills)"
    info = _per_function(_run(tool, "-elf", str(path)), r"^\.nv\.info\.(\w+)")
    for name in NAMES:  # map_q, map_k, map_v by value; o, lse, 3 ints, a float; 4 pointers; 5 ints, 2 floats; the
        params = [int(s, 16) for _, s in sorted(  # tile counter
            (int(o, 16), s) for o, s in
            re.findall(r"Ordinal : (0x[0-9a-f]+)\s+Offset\s*: 0x[0-9a-f]+\s+Size\s*: (0x[0-9a-f]+)", info[name]))]
        assert params == [128] * 3 + [8] * 2 + [4] * 4 + [8] * 4 + [4] * 7 + [8], f"{name}: {params}"
    usage = _run(tool, "-res-usage", str(path))
    found = re.findall(r"Function (\w+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    assert {f[0] for f in found} == set(NAMES), usage
    for name, reg, stack, _, local in found:
        t = A.VARIANT_TILES[NAMES[name][1]]
        assert int(reg) == t.launch_regs, f"{name}: {reg} registers; setmaxnreg's budget assumes {t.launch_regs}"
        assert int(stack) == 0 and int(local) == 0, f"{name}: stack {stack}, local {local} bytes (spills)"


@pytest.mark.parametrize("mods,defines", A.VARIANT_BUILDS, ids=lambda x: f"mods{x}" if isinstance(x, int) else "")
def test_variant_build_compiles_for_sm90a_without_spills(tmp_path, mods, defines):
    assert f"-DVARIANT_MODS={mods}" in defines
    _check_cubin(tmp_path, _compile(defines), overlap=True)


@pytest.mark.parametrize("schedule", [s for s in sorted(A.SCHEDULES) if s != (True, True)],
                         ids=lambda s: f"overlap{int(s[0])}-pingpong{int(s[1])}")
def test_every_switch_under_the_other_schedules(tmp_path, schedule):
    _check_cubin(tmp_path, _compile(_schedule_defines(schedule)), overlap=schedule[0])


def test_variant_build_is_a_stub_elsewhere():
    """Built for sm_90 (no 'a'), the variant entry points exist and trap, as the dense ones do."""
    data = _compile(A.VARIANT_BUILDS[-1][1], arch="sm_90")
    for name in NAMES:
        assert name.encode() in data, f"{name} is not in the sm_90 CUBIN"


def test_constants_agree_with_the_kernel():
    source = core.kernel_path(A.KERNEL_FILE).read_text()
    for name, value in (("MOD_DOCS", A.MOD_DOCS), ("MOD_SOFTCAP", A.MOD_SOFTCAP), ("MOD_ALIBI", A.MOD_ALIBI)):
        assert re.search(rf"\b{name} = {value},", source), f"{name} is not {value} in {A.KERNEL_FILE}"
    assert (A.MOD_DOCS, A.MOD_SOFTCAP, A.MOD_ALIBI) == (F.MOD_DOCS, F.MOD_SOFTCAP, F.MOD_ALIBI)
    assert re.search(r"TILE_EMPTY = 0, TILE_FULL = 1, TILE_PARTIAL = 2", source)
    assert (RV.EMPTY, RV.FULL, RV.PARTIAL) == (0, 1, 2)
    for dtype, d in A.VARIANT_KERNEL_NAMES:
        assert re.search(rf"HOPPER_ATTN_VARIANTS\({A.VARIANT_KERNEL_NAMES[(dtype, d)]}, {d}, "
                         rf"{'true' if dtype == 'bfloat16' else 'false'}\)", source)
    for d, t in A.VARIANT_TILES.items():
        A.check_tiles(d, t)
        assert t.consumers == 2 and t.launch_regs == 168
    assert [mods for mods, _ in A.VARIANT_BUILDS] == list(range(8))


def test_forward_takes_flash2_mmas_variant_options():
    """The same keyword arguments as flash2_mma.forward, so a caller can switch kernels."""
    options = {"window", "prefix", "doc_ids_q", "doc_ids_k", "alibi_slopes", "softcap"}
    assert options <= set(inspect.signature(F.forward).parameters)
    assert options <= set(inspect.signature(A.forward).parameters)
    assert options <= set(inspect.signature(A.forward_variants).parameters)


@pytest.mark.parametrize("d,tiles,match", [
    (96, None, r"head dimension d=96 is not supported"),
    (64, (64, 128, 2), r"tiles.block_m=64"),
    (128, (128, 160, 2), r"tiles.block_n=160"),
])
def test_problem_checks(d, tiles, match):
    with pytest.raises(ValueError, match=match):
        A._check_problem(2, 1, 100, 100, d, tiles, A.VARIANT_TILES.__getitem__)


# ---- the tile walk of the variant kernels against the reference's block mask ----------------------------------------

def _key_tiles(m0, Tq, Tk, left, right, prefix, BM, BN, classes=None):
    """hopper_attn.cu's key_tiles and KeyTiles.after: the key tiles of the CTA at m0, in order. Its arithmetic is
    flash2_mma.cu's at BLOCK_N keys a tile, on the CTA's first and last row, so flash2_mma's Python transcription
    (tests/test_flash2_variants_cpu.py) serves for both."""
    tiles = _flash2_key_tiles(m0, min(m0 + BM, Tq) - 1, Tk, Tk - Tq, left, right, prefix, BN, classes)
    return [t for t, _ in tiles]


def _count(m0, Tq, Tk, left, right, prefix, BM, BN):
    """key_tiles' n without documents: pre_end + max(0, end - band_begin)."""
    c_first, c_last = m0 + Tk - Tq, min(m0 + BM, Tq) - 1 + Tk - Tq
    lo, hi = max(0, c_first - left), min(Tk, c_last + right + 1)
    pre_end = (min(prefix, Tk) + BN - 1) // BN
    band_begin = max(lo // BN, pre_end)
    band_end = (hi + BN - 1) // BN if hi > lo else 0
    end = band_end if band_end > band_begin else pre_end
    return pre_end + max(0, end - band_begin)


def _full(t, first_row, Tq, Tk, left, right, prefix, BN, classes=None):
    """tile_softmax's test: key tile t runs without the mask for the warpgroup whose first row is first_row."""
    diag = Tk - Tq
    band_from, band_to = first_row + 64 - 1 + diag - left, first_row + diag + right
    n0, n1 = t * BN, t * BN + BN - 1
    full = n1 < Tk and (n1 < prefix or (band_from <= max(n0, prefix) and n1 <= band_to))
    return full and (classes is None or classes[t] == RV.FULL)


def _producer_order(tiles):
    """produce()'s variant loop, i = 0 .. n: [("K" or "V", tile)], K of each tile before V of the one before."""
    out, n = [], len(tiles)
    for i in range(n + 1):
        if i < n:
            out.append(("K", tiles[i]))
        if i > 0:
            out.append(("V", tiles[i - 1]))
    return out


def _pipelined_order(tiles):
    """attend_pipelined's needs: K_first; then per later tile K_j and V of the one before; the last V at the end."""
    if not tiles:
        return []
    out = [("K", tiles[0])]
    for prev, j in zip(tiles, tiles[1:]):
        out += [("K", j), ("V", prev)]
    return out + [("V", tiles[-1])]


WALK_CASES = [  # (Tq, Tk, causal, window, prefix, documents)
    (300, 300, True, None, None, None), (300, 300, False, (40, 0), None, None),
    (300, 300, True, (100, None), None, None), (257, 600, True, (64, 0), None, None),
    (600, 257, True, None, None, None), (600, 257, False, (10, 10), None, None), (300, 300, True, None, 70, None),
    (200, 333, False, (0, 0), 129, None), (333, 200, True, (5, 0), 64, None),
    (500, 500, True, None, None, [1, 100, 37, 1, 200, 161]), (300, 300, False, None, None, [64, 64, 1, 171]),
    (130, 200, True, (30, 0), 20, "sorted"), (1, 500, True, (17, 0), None, None), (129, 129, False, (0, 3), 1, None),
    (1100, 1100, True, None, None, [300, 1, 500, 299]), (700, 700, False, (300, 300), 200, None),
]


@pytest.mark.parametrize("BM,BN", [(128, 128), (192, 128), (128, 176)])
@pytest.mark.parametrize("Tq,Tk,causal,window,prefix,docs", WALK_CASES)
def test_key_tiles_visit_what_the_block_mask_sees(Tq, Tk, causal, window, prefix, docs, BM, BN):
    mask, ids_q, ids_k = case_mask(Tq, Tk, causal, window, prefix, docs)
    cta_kinds, _ = RV.block_mask(mask, BM, BN)
    wg_kinds, _ = RV.block_mask(mask, 64, BN)
    spec = F.variant_spec((1, 1, Tq, 64), (1, 1, Tk, 64), 0.125, causal=causal, window=window, prefix=prefix)
    classes = None if ids_q is None else _doc_classes(ids_q, ids_k, BM, BN)
    for qt in range(cta_kinds.shape[0]):
        row_classes = None if classes is None else classes[qt]
        tiles = _key_tiles(qt * BM, Tq, Tk, spec.left, spec.right, spec.prefix, BM, BN, row_classes)
        assert tiles == sorted(set(tiles)), "tiles out of order or twice"
        needed = [t for t in range(cta_kinds.shape[1]) if cta_kinds[qt, t] != RV.EMPTY]
        assert set(needed) <= set(tiles), f"query tile {qt}: tiles {sorted(set(needed) - set(tiles))} are skipped"
        if ids_q is None:  # the arithmetic is exact: nothing more than the visible tiles, and n counts them
            assert tiles == needed, f"query tile {qt}: visits {tiles}, sees {needed}"
            assert _count(qt * BM, Tq, Tk, spec.left, spec.right, spec.prefix, BM, BN) == len(tiles)
        else:  # no EMPTY class is visited
            assert all(row_classes[t] != RV.EMPTY for t in tiles)
        for cw in range(BM // 64):
            first_row = qt * BM + 64 * cw
            if first_row >= Tq:
                continue  # a warpgroup wholly past Tq: nothing of it is stored
            for t in tiles:
                if _full(t, first_row, Tq, Tk, spec.left, spec.right, spec.prefix, BN, row_classes):
                    assert wg_kinds[first_row // 64, t] == RV.FULL, \
                        f"query tile {qt}, warpgroup {cw}, key tile {t}: run without the mask, but not FULL"
        assert _producer_order(tiles) == _pipelined_order(tiles)
        assert [x for x in _producer_order(tiles) if x[0] == "K"] == [("K", t) for t in tiles]


def test_a_window_touches_only_its_tiles():
    """The issue's shape: a causal window of 1024 at T = 16384 visits (1024 + 128) / 128 + 1 key tiles at most per
    query tile of the variant tiling, of the 128 a full row would."""
    T, t = 16384, A.VARIANT_TILES[128]
    spec = F.variant_spec((1, 1, T, 128), (1, 1, T, 128), 0.125, causal=True, window=(1024, 0))
    counts = [len(_key_tiles(m0, T, T, spec.left, spec.right, spec.prefix, t.block_m, t.block_n))
              for m0 in range(0, T, t.block_m)]
    assert max(counts) <= (1024 + t.block_m) // t.block_n + 1


# ---- the consumers' arithmetic, emulated in float64 on the tiles they visit ------------------------------------------

def _emulate(q, k, v, BM, BN, causal=False, window=None, prefix=None, doc_ids=None, slopes=None, softcap=None,
             scale=None):
    """One (batch entry, query head) of a variant kernel in NumPy: per CTA the key tiles of key_tiles, per warpgroup
    tile_softmax (score_mods on every tile; variant_mask unless the tile is FULL for its 64 rows, where raw scores are
    scaled in the exponent), the online softmax with lazy rescaling (slack 8, log2 units), o = O / l, lse."""
    Tq, d = q.shape
    Tk = k.shape[0]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    spec = F.variant_spec((1, 1, Tq, d), (1, 1, Tk, d), scale, causal=causal, window=window, prefix=prefix,
                          softcap=softcap, docs=doc_ids is not None, alibi=slopes is not None)
    diag, log2e = Tk - Tq, 1.0 / np.log(2.0)
    classes = None if doc_ids is None else _doc_classes(doc_ids[0], doc_ids[1], BM, BN)
    o, lse = np.zeros((Tq, d)), np.full(Tq, -np.inf)
    for m0 in range(0, Tq, BM):
        row_classes = None if classes is None else classes[m0 // BM]
        tiles = _key_tiles(m0, Tq, Tk, spec.left, spec.right, spec.prefix, BM, BN, row_classes)
        for first_row in range(m0, min(m0 + BM, Tq), 64):
            rows = np.arange(first_row, first_row + 64)
            m, l, acc = np.full(64, -np.inf), np.zeros(64), np.zeros((64, d))
            for t in tiles:
                cols = np.arange(t * BN, t * BN + BN)
                s = np.zeros((64, BN))
                ok_r, ok_c = rows < Tq, cols < Tk
                s[np.ix_(ok_r, ok_c)] = q[rows[ok_r]] @ k[cols[ok_c]].T  # TMA zero-fills past the ends
                full = _full(t, first_row, Tq, Tk, spec.left, spec.right, spec.prefix, BN, row_classes)
                modded = softcap is not None or slopes is not None
                if modded:
                    s = spec.cap_out * np.tanh(s * spec.cap_in) if softcap is not None else s * scale * log2e
                    if slopes is not None:
                        s = s - slopes * log2e * np.abs(cols[None, :] - (rows[:, None] + diag))
                if not full:
                    c = rows[:, None] + diag
                    seen = (cols[None, :] < Tk) & (((c - spec.left <= cols) & (cols <= c + spec.right))
                                                   | (cols[None, :] < spec.prefix))
                    if doc_ids is not None:
                        seen &= doc_ids[0][np.minimum(rows, Tq - 1)][:, None] == doc_ids[1][np.minimum(cols, Tk - 1)]
                    s = np.where(seen, s if modded else s * scale * log2e, -np.inf)
                mul = 1.0 if (modded or not full) else scale * log2e
                tile_max = (s * mul).max(axis=1)
                m_new = np.maximum(m, tile_max)
                m_new = np.where(m_new <= m + 8.0, m, m_new)
                ref = np.where(np.isneginf(m_new), 0.0, m_new)
                alpha = np.where(m_new == m, 1.0, np.exp2(m - ref))
                p = np.exp2(s * mul - ref[:, None])
                l = l * alpha + p.sum(axis=1)
                acc = acc * alpha[:, None] + p @ np.where((cols < Tk)[:, None], v[np.minimum(cols, Tk - 1)], 0.0)
                m = m_new
            keep = rows < Tq
            with np.errstate(divide="ignore"):
                o[rows[keep]] = np.where(l[keep, None] > 0, acc[keep] / np.where(l > 0, l, 1.0)[keep, None], 0.0)
                lse[rows[keep]] = np.where(l[keep] > 0, (m[keep] + np.log2(l[keep])) / log2e, -np.inf)
    return o, lse


EMULATED = [  # (Tq, Tk, options): every branch of tile_softmax, with rows that see no key
    (300, 300, dict(causal=True, window=(100, 0), softcap=20.0, alibi=True, docs=[1, 150, 49, 100])),
    (257, 333, dict(window=(50, 50), softcap=30.0, alibi=True)),
    (300, 100, dict(causal=True, window=(10, 0))),  # 200 rows see no key
    (129, 400, dict(causal=True, prefix=100, scale=-0.3)),
    (200, 200, dict(docs=[1, 1, 64, 1, 1, 70, 1, 61], alibi=True)),
    (1, 500, dict(causal=True, window=(17, 0), softcap=5.0)),
]


@pytest.mark.parametrize("BM,BN", [(128, 128), (192, 128), (128, 176)])
@pytest.mark.parametrize("Tq,Tk,options", EMULATED)
def test_emulated_consumers_match_the_oracle(Tq, Tk, options, BM, BN):
    rng = np.random.default_rng(Tq + Tk)
    q, k, v = rng.standard_normal((Tq, 32)) * 3, rng.standard_normal((Tk, 32)) * 3, rng.standard_normal((Tk, 32))
    options = dict(options)
    docs, alibi = options.pop("docs", None), options.pop("alibi", False)
    ids = None if docs is None else np.repeat(np.arange(len(docs)), docs)
    slope = 0.3 if alibi else None
    o, lse = _emulate(q, k, v, BM, BN, doc_ids=None if ids is None else (ids, ids), slopes=slope, **options)
    o_ref, lse_ref = RV.attention_variant(q[None, None], k[None, None], v[None, None], return_lse=True,
                                          doc_ids_q=ids, alibi_slopes=None if slope is None else [slope], **options)
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref[0, 0]))
    np.testing.assert_allclose(o, o_ref[0, 0], atol=1e-9)
    fin = np.isfinite(lse)
    np.testing.assert_allclose(lse[fin], lse_ref[0, 0][fin], atol=1e-9)
