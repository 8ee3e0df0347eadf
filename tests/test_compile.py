"""Every kernels/*.cu compiles on its own, without a GPU, for each architecture the course supports.

NVRTC (the compiler CuPy uses at run time) comes from the `cuda-bindings` and `nvidia-cuda-nvrtc`
wheels, and the CUDA headers (cuda_fp16.h, ...) from `nvidia-cuda-runtime`; so this runs on a CPU-only
machine. A launcher module may list the builds it uses as NVRTC_BUILDS = [(name_expressions, defines)];
each is compiled, so template instantiations and -D variants are checked too. Where nvcc is on the
PATH, each file is also built with `nvcc -c` and its register and spill report is printed.
"""

import importlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CU_FILES = sorted((ROOT / "kernels").glob("*.cu"))
ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90"]


def _builds(cu: Path):
    try:
        module = importlib.import_module(f"kernels.{cu.stem}")
    except ModuleNotFoundError:
        return [((), ())]
    return getattr(module, "NVRTC_BUILDS", [((), ())])


def _cuda_include_dir():
    try:
        import nvidia.cu13  # the nvidia-cuda-runtime wheel's headers
    except ImportError:
        return None
    for base in nvidia.cu13.__path__:
        inc = Path(base) / "include"
        if (inc / "cuda_fp16.h").exists():
            return inc
    return None


def nvrtc_compile(source: str, name: str, arch: str, options=(), name_expressions=()):
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
    inc = _cuda_include_dir()
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", *(o.encode() for o in options)]
    if inc is not None:
        opts.append(f"-I{inc}".encode())
    from kernels._core import cuda_header_options  # crt/mma.h for <mma.h>, where the runtime wheel lacks it

    opts += [o.encode() for o in cuda_header_options()]
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    try:
        for expr in name_expressions:
            (err,) = nvrtc.nvrtcAddNameExpression(prog, expr.encode())
            assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, (expr, err)
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        return err == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.decode(errors="replace").strip("\x00 \n")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def test_there_are_kernels():
    assert CU_FILES, "no .cu files found in kernels/"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_nvrtc_compiles_standalone(cu, arch):
    from kernels._core import NVRTC_OPTIONS

    source = cu.read_text()
    assert '#include "' not in source, f"{cu.name} includes a project header; kernel files must stand alone"
    for name_expressions, defines in _builds(cu):
        ok, log = nvrtc_compile(source, cu.name, arch, NVRTC_OPTIONS[1:] + tuple(defines), name_expressions)
        assert ok, f"{cu.name} ({arch}, {defines}, {name_expressions}) failed to compile:\n{log}"
        assert "warning" not in log.lower(), f"{cu.name} ({arch}) compiles with warnings:\n{log}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_nvcc_compiles_standalone(cu, arch, tmp_path, capsys):
    for i, (_, defines) in enumerate(_builds(cu)):
        cmd = ["nvcc", "-c", f"-arch={arch}", "-std=c++17", "--resource-usage", *defines,
               "-o", os.fspath(tmp_path / f"k{i}.o"), os.fspath(cu)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
        assert "warning" not in res.stderr.lower(), res.stderr
        with capsys.disabled():
            usage = [line.strip() for line in res.stderr.splitlines() if "registers" in line or "spill" in line]
            print(f"\n{cu.name} {arch} {' '.join(defines)}: " + " | ".join(usage[:6]))
