"""Every kernels/*.cu compiles on its own, without a GPU, for each architecture the course supports.

NVRTC (the compiler CuPy uses at run time) comes from the `cuda-bindings` and `nvidia-cuda-nvrtc`
wheels, and the CUDA headers (cuda_fp16.h, ...) from `nvidia-cuda-runtime`; so this runs on a CPU-only
machine. A launcher module may list the builds it uses as NVRTC_BUILDS = [(name_expressions, defines)];
each is compiled, so template instantiations and -D variants are checked too.

Where nvcc is on the PATH, each file is also built alone with `nvcc -c` (no defines: the #ifndef defaults),
and the object must hold every kernel the file declares: each extern "C" kernel by name, and each kernel
template at least once, through the explicit instantiations a templated file carries for nvcc. Its register
and spill report is printed. A test also ties each -D constant a launcher passes to the #ifndef default in
its .cu file, so that changing one side alone fails.
"""

import importlib
import os
import re
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


def declared_kernels(source: str) -> tuple[list[str], list[str]]:
    """(extern "C" kernel names, kernel template names) declared in a .cu source."""
    extern_c = re.findall(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(', source)
    templates = re.findall(r"template\s*<[^;{]*?>\s*__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(",
                           source)
    return extern_c, sorted(set(templates))


def test_declared_kernels_parser():
    src = ('extern "C" __global__ void a(int x) {}\n'
           "template <int D, bool B>\n__global__ void __launch_bounds__(128, 2)\nk2(const float* p) {}\n"
           "template <typename T>\n__global__ void k3(T* p) {}\n")
    assert declared_kernels(src) == (["a"], ["k2", "k3"])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_nvcc_compiles_standalone(cu, arch, tmp_path, capsys):
    obj = tmp_path / "k.o"
    cmd = ["nvcc", "-c", f"-arch={arch}", "-std=c++17", "--resource-usage", "-o", os.fspath(obj), os.fspath(cu)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    assert "warning" not in res.stderr.lower(), res.stderr
    entries = re.findall(r"Compiling entry function '(\w+)'", res.stderr)
    extern_c, templates = declared_kernels(cu.read_text())
    assert entries, f"nvcc -c {cu.name} produced an object with no kernel in it"
    for name in extern_c:
        assert name in entries, f"{cu.name}: kernel {name} is missing from the object; entries: {entries}"
    for name in templates:  # a mangled template name holds the identifier with its length, e.g. 10flash2_fwdILi64E
        assert any(f"{len(name)}{name}I" in e for e in entries), \
            f"{cu.name}: kernel template {name} has no instantiation in the object (add one under #ifndef __CUDACC_RTC__)"
    with capsys.disabled():
        usage = [line.strip() for line in res.stderr.splitlines() if "registers" in line or "spill" in line]
        print(f"\n{cu.name} {arch}: {len(entries)} kernels: " + " | ".join(usage[:6]))


def _ifndef_defaults(source: str) -> dict:
    return {m.group(1): m.group(2) for m in re.finditer(r"#ifndef (\w+)\s*\n#define \1 (\S+)", source)}


@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_defines_match_the_kernel_defaults(cu):
    """A constant the launcher hands to its kernel with -D must equal the .cu file's own #ifndef default, which is
    what `nvcc -c` alone and a reader of the file see."""
    defaults = _ifndef_defaults(cu.read_text())
    for _, defines in _builds(cu):
        for opt in defines:
            m = re.fullmatch(r"-D(\w+)=(\S+)", opt)
            if m is None:
                continue
            name, value = m.groups()
            assert name in defaults, f"{cu.name}: the launcher passes -D{name}, but the file has no #ifndef {name} default"
            assert defaults[name] == value, f"{cu.name}: #define {name} {defaults[name]}, but the launcher passes {value}"
