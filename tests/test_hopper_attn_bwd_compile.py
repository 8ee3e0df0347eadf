"""kernels/hopper/hopper_attn_bwd.cu built for sm_90a without a GPU: the Hopper instructions are in the machine code.

Each NVRTC build of kernels.hopper.hopper_attn_bwd (NVRTC_BUILDS; the deterministic build, -D DETERMINISTIC=1; the
build that adds dQ by atomics, -D DQ_BULK=0), each of them also under every mix of the schedule switches (EARLY_P,
EARLY_KV, DQ_FIRST), compiled for sm_90a and disassembled with cuobjdump (tests/test_hopper_compile.py says where the
tools come from).
Per main kernel (dtype x D; BLOCK_M = 128 at D = 64, 64 at D = 128; the CTA's 128 keys, 64 per consumer warpgroup):

    HGMMA.64xBLOCK_Mx16.F32[.BF16]  Rd, gdesc       S^T = K Q^T and dP^T = V dO^T (SS, both K-major): 2 x D/16
    HGMMA.64xDx16 ...  Rd, Ra, gdesc.tnspB           dV += P^T dO, dK += dS^T Q (RS, B N-major): 2 x BLOCK_M/16
    HGMMA.64x64x16 ... Rd, gdesc.tnspA.tnspB        dQ_part = dS K (SS, both MN-major): 128/16 = 8
    UTMALDG.3D   K, V (D/64 boxes each, once) and Q, dO (D/64 boxes each, per query tile)
    (no UBLKCP: the consumers load the lse2 and delta rows themselves, with plain loads)
    UBLKRED      the bulk reduce-add of each tile's dQ part (DQ_BULK = 1); REDG float32 atomics instead (DQ_BULK = 0),
                 never both; NANOSLEEP only in the deterministic build (its turn)

(each product once: the masked and unmasked paths of step b meet before the products), the 168 registers that
setmaxnreg's budget assumes (24 + 2 x 240 = 3 x 168), no local memory (spills), four 128-byte tensor-map parameters,
and the shared-memory formula of the launcher. Per schedule, where the waits and the dS barrier fall:

    WARPGROUP.DEPBAR.LE gsb0, 0x1   a wait that leaves the last commit group running: one for EARLY_P (S^T alone),
                                    one for DQ_FIRST (dQ_part alone); none otherwise
    BAR.SYNC 0x1 (the dS barrier)   EARLY_KV: after the first dV/dK HGMMA and before dQ_part's; else before both
    dQ_part's HGMMAs                DQ_FIRST: before some dV/dK HGMMA (before all of them without EARLY_KV)
"""

import os
import re
import shutil
import subprocess
from collections import Counter

import pytest
from ahead import Ahead

from kernels import core
from kernels.hopper import hopper_attn_bwd as B
from test_hopper_compile import _nvrtc_available, _per_function, _run, cubin_file
from test_hopper_compile import cuobjdump, sass  # noqa: F401 (fixtures: disassembly of this module's cubin)

ARCH = "sm_90a"
# HGMMA.64xNx16.F32[.BF16] Rd, [Ra,] gdesc[URx][.tnspA][.tnspB], ...: one descriptor register pair holds both
# shared-memory operands (SS) or B alone (RS, A from registers Ra)
HGMMA = re.compile(r"\bHGMMA\.64x(\d+)x16\.F32(\.BF16)?\s+R\d+,\s*(R\d+,\s*)?gdesc\[\w+\]((?:\.tnspA)?(?:\.tnspB)?)")
# every mix of the schedule switches: (EARLY_P, EARLY_KV, DQ_FIRST)
SCHEDULES = [(p, kv, first) for p in (0, 1) for kv in (0, 1) for first in (0, 1)]


def schedule_defines(sched):
    return core.defines_from(**dict(zip(B.SCHEDULE_SWITCHES, sched)))


# (deterministic, DQ_BULK, schedule) -> the -D defines of that build
BUILDS = {(det, bulk, sched):
          B.DEFINES + B.ORDER_DEFINES[det] + core.defines_from(DQ_BULK=bulk) + schedule_defines(sched)
          for det, bulk in ((False, 1), (True, 1), (False, 0)) for sched in SCHEDULES}
assert B.DQ_BULK == 1 and BUILDS[(False, 1, (1, 0, 1))] == B.NVRTC_BUILDS[0][1]
assert B.SCHEDULE_SWITCHES == ("EARLY_P", "EARLY_KV", "DQ_FIRST")
assert B.schedule() == {"EARLY_P": 1, "EARLY_KV": 0, "DQ_FIRST": 1}  # the launcher's default schedule


def build_id(b):
    det, bulk, sched = b
    name = {(False, 1): "bulk", (True, 1): "deterministic", (False, 0): "atomic"}[(det, bulk)]
    return "-".join([name] + [n.lower() for n, on in zip(B.SCHEDULE_SWITCHES, sched) if on])


@pytest.fixture(scope="module", params=sorted(BUILDS), ids=build_id)
def build(request):
    return request.param


@pytest.fixture(scope="module")
def deterministic(build):
    return build[0]


def _nvrtc_build(build):
    source = core.kernel_path(B.KERNEL_FILE).read_text()
    return core.compile_cubin(source, B.KERNEL_FILE, ARCH, core.NVRTC_OPTIONS + BUILDS[build])


def _nvcc_build(det, bulk, sched, out_dir):
    cu = core.kernel_path(B.KERNEL_FILE)
    cmd = ["nvcc", "-c", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-I", os.fspath(cu.parents[1]),
           f"-DDETERMINISTIC={det}", f"-DDQ_BULK={bulk}", *schedule_defines(sched), "--resource-usage", "-o",
           os.fspath(out_dir / "k.o"), os.fspath(cu)]
    return cmd, subprocess.run(cmd, capture_output=True, text=True)


def _plan(item, tmp_path_factory):
    params = item.callspec.params if hasattr(item, "callspec") else {}
    if "build" in params and _nvrtc_available():
        yield ("nvrtc", params["build"]), _nvrtc_build, (params["build"],)
    if item.originalname == "test_nvcc_builds_sm90a_without_spills" and shutil.which("nvcc"):
        key = (params["det"], params["bulk"], params["sched"])
        yield ("nvcc", key), _nvcc_build, (*key, tmp_path_factory.mktemp("nvcc"))


AHEAD = Ahead(_plan)  # tests/ahead.py: this file's builds start together, a thread per core
start_ahead = AHEAD.fixture()


@pytest.fixture(scope="module")
def cubin(tmp_path_factory, build):
    return cubin_file(tmp_path_factory, B.KERNEL_FILE, lambda: AHEAD.result(("nvrtc", build), _nvrtc_build, build))


def test_nvrtc_builds_hold_every_kernel(sass):
    names = set().union(*(x.values() for x in (B.MAIN_NAMES, B.PRE_NAMES, B.POST_NAMES, B.REDUCE_NAMES)))
    assert names <= set(sass), f"missing: {sorted(names - set(sass))}"


@pytest.mark.parametrize("key", sorted(B.MAIN_NAMES), ids=lambda k: f"{k[0]}-d{k[1]}")
def test_sass_has_the_five_products_and_tma(sass, build, key, capsys):
    deterministic, bulk, sched = build
    dtype, D = key
    name = B.MAIN_NAMES[key]
    code = sass[name]
    found = HGMMA.findall(code)
    assert found and all(bool(bf) == (dtype == "bfloat16") for _, bf, _, _ in found), f"{name}: HGMMA types"
    forms = Counter()
    for n, _, ra, tr in found:
        form = "rs" if ra else ("ss_t" if ".tnspA" in tr else "ss")
        forms[(form, int(n), ".tnspB" in tr)] += 1
    bm = B.BLOCK_M[D]
    scores, grads, dq = forms[("ss", bm, False)], forms[("rs", D, True)], forms[("ss_t", 64, True)]
    assert scores == 2 * D // 16, f"{name}: S^T, dP^T: {forms}"
    assert grads == 2 * bm // 16, f"{name}: dV, dK: {forms}"
    assert dq == B.BLOCK_N // 16, f"{name}: dQ: {forms}"
    assert sum(forms.values()) == len(re.findall(r"\bHGMMA\b", code)), f"{name}: an HGMMA of another form: {forms}"
    utmaldg = len(re.findall(r"\bUTMALDG\.3D\b", code))
    assert utmaldg == 4 * (D // 64), f"{name}: expected {4 * (D // 64)} UTMALDG.3D (K, V, Q, dO per 64 columns)"
    assert not re.search(r"\bUBLKCP\b", code), f"{name}: a plain bulk copy (the rows are loaded by the consumers)"
    atomics = len(re.findall(r"\b(?:REDG|ATOMG)\.E\.ADD\.F32", code))
    bulk_reductions = len(re.findall(r"\bUBLKRED\.G\.S\.ADD\.F32", code))
    reductions = bulk_reductions if bulk else atomics
    assert reductions >= 1 and (atomics if bulk else bulk_reductions) == 0, \
        f"{name}: dQ's reductions: {bulk_reductions} bulk, {atomics} atomic (DQ_BULK={bulk})"
    assert (len(re.findall(r"\bNANOSLEEP\b", code)) > 0) == deterministic, f"{name}: the turn's spin loop"
    assert len(re.findall(r"\bUSETMAXREG\b", code)) >= 2, f"{name}: expected setmaxnreg (USETMAXREG)"
    spills = len(re.findall(r"\b(?:LDL|STL)\b", code))
    assert spills == 0, f"{name}: {spills} local-memory loads/stores (register spills)"
    with capsys.disabled():
        print(f"\n{name} ({ARCH}, {build_id(build)}): HGMMA {dict(forms)}, UTMALDG {utmaldg}, "
              f"reductions {reductions}, {len(code.splitlines())} SASS lines")


def _schedule_tokens(code):
    """The main loop's landmarks in SASS order: "rs" (dV, dK), "dq" (dQ_part), "bar" (named barrier 1: the dS
    barrier)."""
    tokens = []
    for line in code.splitlines():
        m = HGMMA.search(line)
        if m:
            tokens.append("rs" if m.group(3) else ("dq" if ".tnspA" in m.group(4) else "scores"))
        elif re.search(r"\bBAR\.SYNC(?:\.DEFER_BLOCKING)? 0x1,", line):
            tokens.append("bar")
    return tokens


@pytest.mark.parametrize("key", sorted(B.MAIN_NAMES), ids=lambda k: f"{k[0]}-d{k[1]}")
def test_sass_follows_the_schedule(sass, build, key):
    early_p, early_kv, dq_first = build[2]
    name = B.MAIN_NAMES[key]
    code = sass[name]
    partial = len(re.findall(r"\bWARPGROUP\.DEPBAR\.LE gsb0, 0x1\b", code))
    assert partial == early_p + dq_first, f"{name}: {partial} waits that leave one commit group running"
    tokens = _schedule_tokens(code)
    first_dq = tokens.index("dq")
    rs = [i for i, tok in enumerate(tokens) if tok == "rs"]
    bar = max(i for i, tok in enumerate(tokens[:first_dq]) if tok == "bar")  # the dS barrier dQ_part waits for
    assert (rs[0] < bar) == bool(early_kv), f"{name}: dV/dK against the dS barrier: {tokens}"
    assert (rs[-1] > first_dq) == bool(dq_first), f"{name}: dQ_part against dV/dK: {tokens}"
    if dq_first and not early_kv:
        assert rs[0] > first_dq, f"{name}: dQ_part before every dV/dK product: {tokens}"


def test_register_budget_and_no_local_memory(cubin, cuobjdump):
    usage = _run(cuobjdump, "-res-usage", str(cubin))
    found = re.findall(r"Function (\w+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    mains = {v: k[1] for k, v in B.MAIN_NAMES.items()}
    assert set(mains) <= {f[0] for f in found}, usage
    for name, reg, stack, shared, local in found:
        assert int(stack) == 0 and int(local) == 0, f"{name}: stack {stack}, local {local} bytes (spills)"
        if name in mains:
            assert int(reg) == B.LAUNCH_REGS, f"{name}: {reg} registers; setmaxnreg's budget assumes {B.LAUNCH_REGS}"
            assert int(shared) + B.smem_bytes(mains[name]) <= 227 * 1024 + 1024, f"{name}: static {shared} bytes"


def test_tensor_maps_are_128_byte_parameters(cubin, cuobjdump):
    """map_q, map_k, map_v, map_do by value, then lse2, delta, dq_acc, turns, dk, dv, Tq, Tk, scale_log2, scale,
    left, right, group, alibi_log2, doc_q, doc_k, classes, heads, cap_in, cap_out, prefix."""
    info = _per_function(_run(cuobjdump, "-elf", str(cubin)), r"^\.nv\.info\.(\w+)")
    for name in B.MAIN_NAMES.values():
        params = {int(o, 16): int(s, 16) for o, s in
                  re.findall(r"Ordinal : (0x[0-9a-f]+)\s+Offset\s*: 0x[0-9a-f]+\s+Size\s*: (0x[0-9a-f]+)", info[name])}
        assert params == {0: 128, 1: 128, 2: 128, 3: 128, 4: 8, 5: 8, 6: 8, 7: 8, 8: 8, 9: 8, 10: 4, 11: 4, 12: 4,
                          13: 4, 14: 4, 15: 4, 16: 4, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4,
                          23: 4, 24: 4}, f"{name}: {params}"


def test_constants_agree_with_the_kernel():
    source = core.kernel_path(B.KERNEL_FILE).read_text()
    assert "SMEM_BYTES = DQ + (DQ_BULK ? DQ_BYTES : 0) + SMEM_ALIGN" in source
    assert [B.smem_bytes(d) for d in B.HEAD_DIMS] == [199680, 198656]  # the figures in the .cu header
    assert "199680 (D = 64) and 198656 bytes (D = 128)" in source
    assert [B.smem_bytes(d, dq_bulk=0) for d in B.HEAD_DIMS] == [166912, 165888]
    assert [B.smem_bytes(d, docs=True) for d in B.HEAD_DIMS] == [201216, 199680]  # + 2 BLOCK_M + 128 doc ids
    for name, value in (("BLOCK_M_D64", B.BLOCK_M[64]), ("BLOCK_M_D128", B.BLOCK_M[128]), ("STAGES", B.STAGES),
                        ("PRE_WARPS", B.PRE_WARPS), ("DETERMINISTIC", 0), ("DQ_BULK", B.DQ_BULK),
                        *((n, getattr(B, n)) for n in B.SCHEDULE_SWITCHES)):
        assert re.search(rf"#define {name} {value}\b", source), f"{name}: the .cu default differs from the launcher"
    assert "constexpr int BLOCK_N = 128;" in source and B.BLOCK_N == 128
    assert B.LAUNCH_REGS == 168 and B.THREADS == 384
    names = set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)|MAIN_BOUNDS)?\s*(\w+)\(', source))
    assert names == set().union(*(x.values() for x in (B.MAIN_NAMES, B.PRE_NAMES, B.POST_NAMES, B.REDUCE_NAMES))), names
    # the workspace: dq_acc, lse2 and delta padded to whole tiles, the turn counters
    assert B.workspace_elements(2, 3, 100, 64) == 6 * 128 * 64 + 2 * 6 * 128 + 6 * 1
    assert B.workspace_elements(1, 1, 130, 128) == 192 * 128 + 2 * 192 + 3


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def _nvcc_cases():
    """nvcc builds: the launcher's schedule in the bulk, deterministic and atomics builds, and all switches off; the
    other mixes (which the NVRTC builds above check in full) under --full-grid."""
    default = tuple(B.schedule()[n] for n in B.SCHEDULE_SWITCHES)
    cases = [(0, 1, s) for s in SCHEDULES] + [(1, 1, (0, 0, 0)), (0, 0, (0, 0, 0)), (1, 1, (1, 1, 1)), (0, 0, (1, 1, 1)),
                                               (1, 1, default), (0, 0, default)]
    for det, bulk, sched in dict.fromkeys(cases):
        main = sched == default or (det, bulk, sched) == (0, 1, (0, 0, 0))
        yield pytest.param(det, bulk, sched, marks=() if main else (pytest.mark.full_grid,))


@pytest.mark.parametrize("det,bulk,sched", list(_nvcc_cases()))
def test_nvcc_builds_sm90a_without_spills(tmp_path, det, bulk, sched):
    cmd, res = AHEAD.result(("nvcc", (det, bulk, sched)), _nvcc_build, det, bulk, sched, tmp_path)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    assert "warning" not in res.stderr.lower(), res.stderr  # ptxas warns here when it serializes wgmma
    kernels = len(B.MAIN_NAMES) + len(B.PRE_NAMES) + len(B.POST_NAMES) + len(B.REDUCE_NAMES)
    assert res.stderr.count("0 bytes spill stores, 0 bytes spill loads") == kernels, res.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("det,alibi,docs,softcap,prefix",
                         [(0, 1, 0, 0, 0), (0, 0, 1, 0, 0), (0, 1, 1, 0, 0), (0, 0, 0, 1, 0), (0, 1, 1, 1, 0),
                          (1, 0, 0, 1, 0), (0, 0, 0, 0, 1), (1, 0, 0, 0, 1), (0, 1, 1, 1, 1)],
                         ids=["alibi", "docs", "both", "softcap", "all", "softcap-det", "prefix", "prefix-det", "every"])
def test_variant_builds_sm90a_without_spills(tmp_path, det, alibi, docs, softcap, prefix):
    """The ALiBi, document, soft-capping and prefix-LM builds (-D ALIBI=1, DOCS=1, SOFTCAP=1, PREFIX=1: the
    launcher's build_defines(deterministic, alibi, docs, softcap, prefix)): every kernel without spills, the main ones
    at the 168 registers setmaxnreg's budget assumes; the soft-capping builds with EARLY_P = 0."""
    cu = core.kernel_path(B.KERNEL_FILE)
    defines = [x for x in B.build_defines(det, alibi, docs, softcap, prefix) if x.startswith("-D")]
    assert ("-DALIBI=1" in defines) == alibi and ("-DDOCS=1" in defines) == docs
    assert ("-DSOFTCAP=1" in defines) == softcap and ("-DEARLY_P=0" in defines or not softcap)
    assert ("-DPREFIX=1" in defines) == prefix
    assert not {"-DALIBI=1", "-DDOCS=1", "-DSOFTCAP=1", "-DPREFIX=1"} & set(B.build_defines(False))
    cmd = ["nvcc", "-c", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-I", os.fspath(cu.parents[1]),
           *defines, "--resource-usage", "-o", os.fspath(tmp_path / "k.o"), os.fspath(cu)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    kernels = len(B.MAIN_NAMES) + len(B.PRE_NAMES) + len(B.POST_NAMES) + len(B.REDUCE_NAMES)
    assert res.stderr.count("0 bytes spill stores, 0 bytes spill loads") == kernels, res.stderr
    assert res.stderr.count("Used 168 registers") == len(B.MAIN_NAMES), res.stderr
