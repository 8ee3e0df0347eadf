"""The kernels that run on a T4 (compute capability 7.5) build for sm_75 and hold real kernels, without a GPU.

Chapters 01-05 and the CUDA-core kernels of chapters 08-10 run from 7.5: no Ampere-only instruction on
their path, or a fallback below sm_80 (ptx/cp_async.cuh's synchronous copies, ptx/mma_sync.cuh's float16 packing).
Each such file is compiled here with NVRTC for sm_75 exactly as its launcher builds it on a T4 (its SM75_BUILDS, else
its NVRTC_BUILDS), through kernels.core.compile_program (the path COURSE_SIMULATE_CC takes, there to compute_75 PTX),
and the CUBIN must hold every kernel, each with more than a handful of SASS instructions: an arch guard that empties a
kernel for sm_75 fails here. The registry's min_cc, the simulation's settings and the launchers' shared-memory choices
are checked too. tests/test_sm75_gpu.py runs the kernels from compute_75 PTX on a newer GPU.
"""

import os
import re
from pathlib import Path

import pytest
from ahead import Ahead

from test_compile import ROOT, _cuda_include_dir, _kernel_names_in, declared_kernels, launcher_of
from test_hopper_compile import _nvrtc_available, _run, cuobjdump_for

import kernels
from kernels import core

# The files whose kernels run on a T4, and the kernels of each that may be small there: sample_cluster<CS> needs
# thread-block clusters (9.0), so below 9.0 its body is a trap and sampling.py never launches it.
SM75_FILES = {
    "naive.cu": (), "softmax.cu": (), "softmax_bwd.cu": (), "flash1.cu": (), "flash2.cu": (),
    "cublas_attention.cu": (), "cublas_half.cu": (), "decode_ft.cu": (), "decode_append.cu": (),
    "decode_split.cu": (), "varlen.cu": (), "topk_lists.cu": (), "threshold.cu": ("sample_cluster",),
}
MIN_INSTRUCTIONS = 24  # a kernel emptied by an arch guard is an EXIT and a BRA (a trap: a few more)
CU = {p.name: p for p in (ROOT / "kernels").rglob("*.cu") if p.parent.name != "examples"}


def sm75_builds(cu: Path):
    """[(name_expressions, defines)] the launcher compiles on a 7.5 GPU: SM75_BUILDS, else NVRTC_BUILDS."""
    module = launcher_of(cu)
    builds = getattr(module, "SM75_BUILDS", None) or getattr(module, "NVRTC_BUILDS", [((), ())])
    if isinstance(builds, dict):
        builds = builds.get(cu.name, [((), ())])
    return builds


def _options(defines) -> tuple:
    inc = _cuda_include_dir()
    return core.NVRTC_OPTIONS + tuple(defines) + ((f"-I{inc}",) if inc else ()) + core.cuda_header_options()


def sass_instructions(cubin: bytes, tmp_path: Path) -> dict:
    """{kernel symbol: SASS instruction count} of a CUBIN, through the cuobjdump that can read it here (a
    pytest.skip saying what to install where there is none)."""
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    sass = _run(cuobjdump_for(path), "-sass", os.fspath(path))
    counts = {}
    for block in re.split(r"\n\s*Function : ", sass)[1:]:
        name = block.split("\n", 1)[0].strip()
        counts[name] = len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+[A-Z]", block, re.M))
    return counts


def test_the_t4_files_exist():
    assert set(SM75_FILES) <= set(CU), sorted(set(SM75_FILES) - set(CU))


def _bfloat16_build(name):
    """(source, file, "sm_75", options, name expressions) of the bfloat16 build of `name` that must not compile."""
    cu = CU[name]
    exprs, defines = launcher_of(cu).NVRTC_BUILDS[-1 if name == "cublas_half.cu" else 0]
    return cu.read_text(), cu.name, "sm_75", _options(defines), tuple(exprs)


def _plan(item, tmp_path_factory):
    if not _nvrtc_available():
        return
    if item.originalname == "test_sm75_build_holds_real_kernels":
        cu = CU[item.callspec.params["name"]]
        for name_expressions, defines in sm75_builds(cu):
            args = (cu.read_text(), cu.name, "sm_75", _options(defines), tuple(name_expressions))
            yield args, core.compile_program, args
    elif item.originalname == "test_compute_75_ptx_holds_the_kernels":
        cu = CU[item.callspec.params["name"]]
        for name_expressions, defines in sm75_builds(cu):
            args = (core.kernel_text(cu.name), cu.name, "compute_75", _options(defines), tuple(name_expressions))
            yield args, core.compile_program, args
    elif item.originalname == "test_bfloat16_builds_need_sm80":
        args = _bfloat16_build(item.callspec.params["name"])
        yield args, core.compile_program, args


AHEAD = Ahead(_plan)  # tests/ahead.py: this file's builds start together, a thread per core
start_ahead = AHEAD.fixture()


@pytest.mark.parametrize("name", sorted(SM75_FILES))
def test_sm75_build_holds_real_kernels(name, tmp_path):
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
    cu = CU[name]
    source = cu.read_text()
    extern_c, templates = declared_kernels(source)
    for name_expressions, defines in sm75_builds(cu):
        args = (source, cu.name, "sm_75", _options(defines), tuple(name_expressions))
        cubin, log, lowered = AHEAD.result(args, core.compile_program, *args)
        assert "warning" not in log.lower(), f"{cu.name} (sm_75) compiles with warnings:\n{log}"
        symbols = _kernel_names_in(cubin)
        for kernel in extern_c:
            assert kernel.encode() in symbols, f"{cu.name}: kernel {kernel} is not in the sm_75 CUBIN"
        for expr, low in lowered.items():
            assert low.encode() in symbols, f"{cu.name}: {expr} is not in the sm_75 CUBIN"
        counts = sass_instructions(cubin, tmp_path)
        wanted = set(extern_c) | set(lowered.values())
        for symbol, n in counts.items():
            if symbol not in wanted or any(small in symbol for small in SM75_FILES[cu.name]):
                continue
            assert n > MIN_INSTRUCTIONS, f"{cu.name}: {symbol} has {n} SASS instructions for sm_75 (an arch guard?)"
        assert wanted - set(counts) == set(), f"{cu.name}: no SASS for {sorted(wanted - set(counts))}"


@pytest.mark.parametrize("name", ["flash2.cu", "cublas_half.cu", "decode_split.cu"])
def test_compute_75_ptx_holds_the_kernels(name):
    """What COURSE_SIMULATE_CC=7.5 loads: PTX for compute_75, with each name expression's entry point."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
    cu = CU[name]
    for name_expressions, defines in sm75_builds(cu):
        args = (core.kernel_text(cu.name), cu.name, "compute_75", _options(defines), tuple(name_expressions))
        ptx, _, lowered = AHEAD.result(args, core.compile_program, *args)
        text = ptx.decode(errors="replace")
        assert ".target sm_75" in text
        assert "cp.async" not in text and "cvt.rn.f16x2" not in text and "redux" not in text
        for expr, low in lowered.items():
            assert f".entry {low}(" in text, f"{name}: {expr} has no entry in the compute_75 PTX"


@pytest.mark.parametrize("name,reason", [("cublas_half.cu", "cvt.bf16.f32"), ("decode_ft.cu", "cvt.bf16.f32")])
def test_bfloat16_builds_need_sm80(name, reason):
    """Why bfloat16 is refused on 7.5: its builds do not compile for sm_75 (the launchers raise before compiling)."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
    args = _bfloat16_build(name)
    with pytest.raises(core.CompileError, match=re.escape(reason)):
        AHEAD.result(args, core.compile_program, *args)


def test_registry_says_what_runs_on_a_t4():
    runs = {n for n, v in kernels.tested_variants().items() if v.unsupported_reason((7, 5), v.dtypes[0]) is None}
    assert {"naive", "flash1", "flash2_fp32", "cublas_fp32", "cublas_fp16"} <= runs
    assert not runs & {"cublas_tf32", "cublas_bf16", "flash2_mma", "flash2_wmma"}
    ft = core.DECODE_REGISTRY["decode_ft"]
    assert ft.unsupported_reason((7, 5), "float32") is None and ft.unsupported_reason((7, 5), "float16") is None
    assert ft.unsupported_reason((7, 5), "bfloat16") == \
        "decode_ft in bfloat16 needs compute capability >= 8.0; this GPU has 7.5"
    assert core.DECODE_REGISTRY["decode_split"].unsupported_reason((7, 5), "float16") is None
    assert core.DECODE_REGISTRY["decode_split_mma"].unsupported_reason((7, 5), "float16") is not None
    assert ft.unsupported_reason((9, 0), "bfloat16") is None


def test_simulated_cc_is_parsed(monkeypatch):
    monkeypatch.setenv(core.SIMULATE_ENV, "7.5")
    assert core.simulated_cc() == (7, 5) and core.simulated_arch() == "compute_75"
    monkeypatch.setenv(core.SIMULATE_ENV, "")
    assert core.simulated_cc() is None and core.simulated_arch() is None
    monkeypatch.setenv(core.SIMULATE_ENV, "6.1")
    with pytest.raises(ValueError, match=r"COURSE_SIMULATE_CC='6.1': simulated compute capabilities are 7\.5"):
        core.simulated_cc()


def test_simulation_reports_a_t4_and_refuses_a_newer_gpu():
    from kernels.core.device import _simulated

    h100 = core.DeviceInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 132, 227 * 1024, 50 * 2**20)
    t4 = _simulated(h100, (7, 5))
    assert (t4.cc, t4.smem_optin, t4.sm_count) == ((7, 5), 65536, 40) and t4.name.startswith("Tesla T4 (simulated")
    with pytest.raises(core.UnsupportedDeviceError, match=r"cannot be simulated on Tesla T4 .*7\.5"):
        _simulated(core.DeviceInfo(0, "Tesla T4", (7, 5), 40, 65536, 4 * 2**20), (8, 6))


def test_flash2_takes_the_small_tile_where_the_default_does_not_fit():
    from kernels.flash import flash2 as F2

    for D in F2.HEAD_DIMS:
        tile = F2.default_tile(D, 64 * 1024)
        tile.check(D)
        assert tile.smem_bytes(D) <= 64 * 1024 and tile.threads == 128
        assert F2.default_tile(D, 227 * 1024) == F2.TILES[D]
    assert F2.default_tile(64, 64 * 1024) == F2.SMALL_TILES[64]
    with pytest.raises(ValueError, match=r"tile \(BR, BC, TM, TN\) = \(64, 64, 4, 8\) for D=64 needs 70656 bytes.*"
                                         r"at most 65536"):
        F2.build(64, (64, 64, 4, 8), 65536)


def test_t4_launchers_fit_64_kb():
    """Every build a T4 launches needs at most 64 KB of shared memory per block (the rest use static shared memory or
    size theirs from the device: decode_ft, sampling)."""
    from kernels.flash import flash1 as F1
    from kernels.flash import flash2 as F2

    assert F1.smem_bytes(F1.MAX_D) <= 64 * 1024
    assert all(F2.default_tile(D, 64 * 1024).smem_bytes(D) <= 64 * 1024 for D in F2.HEAD_DIMS)
