"""kernels/hopper/hopper_attn.cu built for sm_90a without a GPU: the Hopper instructions are really in the machine code.

The same builds as the launcher's (NVRTC, sm_90a: the non-causal tilings of kernels.hopper.hopper_attn.TILES with each of the
four schedules of kernels.hopper.hopper_attn.SCHEDULES, and the causal tilings with the default schedule), disassembled with
cuobjdump (see tests/test_hopper_compile.py for where the tools come from). Per entry point (dtype x D), N being the
build's key-tile width for that D, with c = 2 copies of each product when the schedule overlaps (the pipelined loop
has a prologue with S = Q K^T and a tail with O += P V) and c = 1 otherwise:

    HGMMA.64xNx16.F32[.BF16]   Rd, gdesc[..], Rc           S = Q K^T, both operands in shared memory (SS): c D/16
    HGMMA.64xDx16.F32[.BF16]   Rd, Ra, gdesc[..].tnspB, Rc  O += P V, A (= P) from registers, B (= V) N-major
                                                            ("transposed", imm-trans-b = 1) (RS): c N/16
    UTMALDG.3D                                              TMA: Q (D/64 boxes), K and V (D/64 boxes each)
    USETMAXREG                                              setmaxnreg in the producer and the consumers
    BAR.ARV                                                 named-barrier arrivals, with ping-pong only

the registers that setmaxnreg's budget assumes (168 with two consumer warpgroups, 128 with three), no local memory
(spills), three 128-byte tensor-map parameters.
tests/test_compile.py compiles the same file for sm_80..sm_90, where the kernels are stubs.
"""

import re
import shutil

import pytest
from ahead import Ahead

from kernels import core
from kernels.hopper import hopper_attn as A
from test_hopper_compile import _nvrtc_available, _per_function, _run, cubin_file, nvcc_sm90a
from test_hopper_compile import cuobjdump, sass  # noqa: F401 (fixtures: disassembly of this module's cubin)

ARCH = "sm_90a"
HGMMA = re.compile(r"\bHGMMA\.64x(\d+)x16\.F32(\.BF16)?\s+R\d+,\s*(R\d+|gdesc\[\w+\])(?:,\s*gdesc\[\w+\](\.tnspB)?)?")


# (causal tilings?, schedule): the launcher's builds
BUILDS = [(False, sched) for sched in sorted(A.SCHEDULES)] + [(True, (True, True))]


def build_tiles(causal):
    return {d: A.TILES[(d, causal)] for d in A.HEAD_DIMS}


@pytest.fixture(scope="module", params=BUILDS,
                ids=lambda b: f"{'causal' if b[0] else 'full'}-overlap{int(b[1][0])}-pingpong{int(b[1][1])}")
def build(request):
    return request.param


@pytest.fixture(scope="module")
def schedule(build):
    return build[1]


def _nvrtc_build(build):
    causal, schedule = build
    source = core.kernel_path(A.KERNEL_FILE).read_text()
    tiles = build_tiles(causal)
    options = core.NVRTC_OPTIONS + sum((A.tiles_defines(d, tiles[d]) for d in A.HEAD_DIMS), ()) + A.SCHEDULES[schedule]
    return core.compile_cubin(source, A.KERNEL_FILE, ARCH, options)


def _plan(item, tmp_path_factory):
    params = item.callspec.params if hasattr(item, "callspec") else {}
    if "build" in params and _nvrtc_available():
        yield params["build"], _nvrtc_build, (params["build"],)
    elif item.originalname == "test_nvcc_builds_sm90a_without_spills" and shutil.which("nvcc"):
        yield "nvcc", nvcc_sm90a, (core.kernel_path(A.KERNEL_FILE), tmp_path_factory.mktemp("nvcc"))


AHEAD = Ahead(_plan)  # tests/ahead.py: this file's builds start together, a thread per core
start_ahead = AHEAD.fixture()


@pytest.fixture(scope="module")
def cubin(tmp_path_factory, build):
    return cubin_file(tmp_path_factory, A.KERNEL_FILE, lambda: AHEAD.result(build, _nvrtc_build, build))


@pytest.mark.parametrize("key", sorted(A.KERNEL_NAMES), ids=lambda k: f"{k[0]}-d{k[1]}")
def test_sass_has_both_wgmma_forms_and_tma(sass, build, key, capsys):
    name = A.KERNEL_NAMES[key]
    dtype, D = key
    causal, (overlap, pingpong) = build
    N = build_tiles(causal)[D].block_n
    copies = 2 if overlap else 1
    code = sass.get(name)
    assert code is not None, f"{name} is not in the CUBIN; functions: {sorted(sass)}"
    found = HGMMA.findall(code)
    assert found, f"{name}: no HGMMA"
    assert all(bool(bf) == (dtype == "bfloat16") for _, bf, _, _ in found), f"{name}: HGMMA types do not match {dtype}"
    ss = [f for f in found if f[2].startswith("gdesc")]
    rs = [f for f in found if f[2].startswith("R")]
    assert len(ss) == copies * D // 16 and all(n == str(N) for n, *_ in ss), \
        f"{name}: expected {copies * D // 16} HGMMA.64x{N}x16 from shared memory (S = Q K^T), found {ss}"
    pv_n = min(D, 128)  # at D = 256 each k-step of O += P V is two m64n128k16, one per 128 columns
    pv = copies * N // 16 * (D // pv_n)
    assert len(rs) == pv and all(n == str(pv_n) and tr == ".tnspB" for n, _, _, tr in rs), \
        f"{name}: expected {pv} HGMMA.64x{pv_n}x16 with A in registers and B transposed (O += P V), found {rs}"
    assert len(ss) + len(rs) == len(re.findall(r"\bHGMMA\b", code)), f"{name}: an HGMMA of neither form"
    utmaldg = len(re.findall(r"\bUTMALDG\.3D\b", code))
    assert utmaldg == 3 * (D // 64), f"{name}: expected {3 * (D // 64)} UTMALDG.3D (Q, K, V per 64 columns)"
    assert len(re.findall(r"\bUSETMAXREG\b", code)) >= 2, f"{name}: expected setmaxnreg (USETMAXREG)"
    assert len(re.findall(r"\bSYNCS\.", code)) >= 4, f"{name}: expected mbarrier operations (SYNCS.*)"
    arrivals = len(re.findall(r"\bBAR\.ARV\b", code))
    assert (arrivals > 0) == pingpong, f"{name}: {arrivals} BAR.ARV (named-barrier arrivals) with pingpong={pingpong}"
    spills = len(re.findall(r"\b(?:LDL|STL)\b", code))
    assert spills == 0, f"{name}: {spills} local-memory loads/stores (register spills)"
    with capsys.disabled():
        print(f"\n{name} ({ARCH}, {'causal' if causal else 'full'} tiles, overlap={int(overlap)} "
              f"pingpong={int(pingpong)}): HGMMA SS {len(ss)}, RS {len(rs)}, "
              f"UTMALDG {utmaldg}, BAR.ARV {arrivals}, "
              f"{len(code.splitlines())} SASS lines")


def test_register_budget_and_no_local_memory(cubin, cuobjdump, build):
    usage = _run(cuobjdump, "-res-usage", str(cubin))
    found = re.findall(r"Function (\w+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    assert {f[0] for f in found} == set(A.KERNEL_NAMES.values()), usage
    d_of = {v: k[1] for k, v in A.KERNEL_NAMES.items()}
    tiles = build_tiles(build[0])
    for name, reg, stack, shared, local in found:
        t = tiles[d_of[name]]
        assert int(reg) == t.launch_regs, f"{name}: {reg} registers; setmaxnreg's budget assumes {t.launch_regs}"
        assert int(stack) == 0 and int(local) == 0, f"{name}: stack {stack}, local {local} bytes (spills)"
        assert int(shared) + A.smem_bytes(d_of[name], t) <= 227 * 1024 + 1024, f"{name}: static {shared} bytes"


def test_tensor_maps_are_128_byte_parameters(cubin, cuobjdump):
    """map_q, map_k, map_v by value (128 bytes each), then o, lse, Tq, Tk, heads, scale_log2, causal, tile_counter,
    group."""
    info = _per_function(_run(cuobjdump, "-elf", str(cubin)), r"^\.nv\.info\.(\w+)")
    for name in A.KERNEL_NAMES.values():
        params = {int(o, 16): int(s, 16) for o, s in
                  re.findall(r"Ordinal : (0x[0-9a-f]+)\s+Offset\s*: 0x[0-9a-f]+\s+Size\s*: (0x[0-9a-f]+)", info[name])}
        assert params == {0: 128, 1: 128, 2: 128, 3: 8, 4: 8, 5: 4, 6: 4, 7: 4, 8: 4, 9: 4, 10: 8, 11: 4}, \
            f"{name}: {params}"


def test_constants_agree_with_the_kernel():
    source = core.kernel_path(A.KERNEL_FILE).read_text()
    assert "Q_BYTES + STAGES * STAGE_BYTES + SMEM_ALIGN" in source
    for (D, causal), t in A.TILES.items():
        assert A.smem_bytes(D, t) == (t.block_m + t.stages * 2 * t.block_n) * D * 2 + 1024 <= 227 * 1024
        assert t.block_n in A.BLOCK_NS and t.launch_regs == {128: 168, 192: 128}[t.block_m]
    # the figures in the .cu header
    figures = [156672, 156672, 214016, 164864, 197632, 197632]
    assert [A.smem_bytes(D, A.TILES[(D, c)]) for D in (64, 128, 256) for c in (False, True)] == figures
    assert set(A.KERNEL_NAMES.values()) == set(re.findall(r'extern "C" __global__ void __launch_bounds__\([^)]*\)\s*'
                                                          r'(\w+)\(', source))
    for D in A.HEAD_DIMS:  # the .cu defaults are the launcher's non-causal tilings
        t = A.TILES[(D, False)]
        for name, value in ((f"BLOCK_M_D{D}", t.block_m), (f"BLOCK_N_D{D}", t.block_n), (f"STAGES_D{D}", t.stages)):
            assert re.search(rf"#define {name} {value}\b", source), f"{name}: the .cu default differs from the launcher"
    for name in ("OVERLAP", "PINGPONG", "LAZY_RESCALE"):
        assert re.search(rf"#define {name} 1\b", source), f"{name}: the .cu default differs from the launcher"
    assert A.DEFINES == sum((A.tiles_defines(d, A.TILES[(d, False)]) for d in (64, 128, 256)), ())


def test_default_launch():
    """Persistent without the mask; under it the dynamic queue at d = 64 and 128 on every length, a CTA per tile at
    d = 256."""
    assert all(A.default_launch(d, False) is True for d in (64, 128, 256))
    assert A.DYNAMIC_CAUSAL_DS == (64, 128)
    assert A.default_launch(64, True) == "dynamic" and A.default_launch(128, True) == "dynamic"
    assert A.default_launch(256, True) is False


def test_registry_entry():
    import kernels

    assert "hopper_fa3" not in kernels.STAGING  # in notebook 07's benchmark, skipped with a reason below 9.0
    v = kernels.REGISTRY["hopper_fa3"]
    assert v.dtypes == ("float16", "bfloat16") and v.has_lse and v.min_cc == (9, 0) and v.max_d == 256
    assert v.notebook == "13_hopper_wgmma_tma"
    assert [d for d in (16, 32, 64, 96, 128, 160, 192, 256) if v.accepts_d(d)] == [64, 128, 256]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_nvcc_builds_sm90a_without_spills(tmp_path):
    cmd, res = AHEAD.result("nvcc", nvcc_sm90a, core.kernel_path(A.KERNEL_FILE), tmp_path)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"  # the .cu defaults: overlap and ping-pong on
    assert "warning" not in res.stderr.lower(), res.stderr  # ptxas warns here when it serializes wgmma
    assert res.stderr.count("0 bytes spill stores, 0 bytes spill loads") == len(A.KERNEL_NAMES), res.stderr
