"""Every kernel file (kernels/<chapter folder>/*.cu) compiles on its own, without a GPU, for the architectures the
course supports: NVRTC for sm_90, the header's own build, and sm_80 where that build is not sm_80 already
(--full-grid: sm_80, sm_86, sm_89 and sm_90 for every file).

NVRTC (the compiler CuPy uses at run time) comes from the `cuda-bindings` and `nvidia-cuda-nvrtc`
wheels, and the CUDA headers (cuda_fp16.h, ...) from `nvidia-cuda-runtime`; so this runs on a CPU-only
machine. A launcher module may list the builds it uses as NVRTC_BUILDS = [(name_expressions, defines)] (or, for a
launcher of several files, {file name: [...]}); each is compiled, so template instantiations and -D variants are
checked too. A kernel file includes nothing but the PTX headers of kernels/ptx/ (and CUDA's own headers).

Where nvcc is on the PATH, each file is built alone with its header's nvcc line, and under --full-grid also with
`nvcc -c` for sm_80 and sm_90 (no defines: the #ifndef defaults); the object must hold every kernel the file
declares: each extern "C" kernel by name, and each kernel template at least once, through the explicit
instantiations a templated file carries for nvcc. Its register and spill report is printed. A test also ties each -D constant a launcher passes to the #ifndef default in
its .cu file, so that changing one side alone fails.
"""

import importlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ahead import Ahead

ROOT = Path(__file__).resolve().parents[1]
CU_FILES = sorted(p for p in (ROOT / "kernels").rglob("*.cu") if p.parent.name != "examples")
ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90"]


def launcher_of(cu: Path):
    """The launcher module of a kernel file: the module of its folder whose KERNEL_FILE names it or whose KERNEL_FILES
    lists it (None if there is none)."""
    folder = cu.parent
    for py in sorted(folder.glob("*.py")):
        if py.stem == "__init__":
            continue
        module = importlib.import_module(f"kernels.{folder.relative_to(ROOT / 'kernels').as_posix().replace('/', '.')}."
                                         f"{py.stem}")
        if getattr(module, "KERNEL_FILE", None) == cu.name or cu.name in getattr(module, "KERNEL_FILES", ()):
            return module
    return None


def _builds(cu: Path):
    builds = getattr(launcher_of(cu), "NVRTC_BUILDS", [((), ())])
    if isinstance(builds, dict):
        builds = builds.get(cu.name, [((), ())])
    return builds


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


def _nvrtc_compile(source: str, name: str, arch: str, options=(), name_expressions=()):
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
    inc = _cuda_include_dir()
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", *(o.encode() for o in options)]
    if inc is not None:
        opts.append(f"-I{inc}".encode())
    from kernels.core import cuda_header_options  # crt/mma.h for <mma.h>, where the runtime wheel lacks it

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


def _run_header_nvcc(cu: Path, out_dir: Path) -> subprocess.CompletedProcess:
    """The header's nvcc line, run from the repository root with the object in out_dir and the register report on."""
    import shlex

    cmd = shlex.split(header_build(cu)[0])
    if "-o" in cmd:
        i = cmd.index("-o")
        del cmd[i:i + 2]
    cmd += ["-o", os.fspath(Path(out_dir) / "k.o"), "--resource-usage"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


# ---------------------------------------------------------------------------------------------------------
# Compiling ahead (tests/ahead.py): the NVRTC and nvcc builds of this file's selected tests start together, a thread
# per CPU core, and each test waits for its own.
# ---------------------------------------------------------------------------------------------------------

def _plan(item, tmp_path_factory):
    from kernels.core import NVRTC_OPTIONS

    params = getattr(item, "callspec", None) and item.callspec.params
    if item.originalname == "test_nvrtc_compiles_standalone":
        cu, arch = params["cu"], params["arch"]
        for name_expressions, defines in _builds(cu):
            args = (cu.read_text(), cu.name, arch, NVRTC_OPTIONS[1:] + tuple(defines), tuple(name_expressions))
            yield ("nvrtc", *args), _nvrtc_compile, args
    elif item.originalname == "test_header_nvrtc_build_holds_every_kernel":
        yield ("header-nvrtc", params["cu"]), _header_nvrtc_build, (params["cu"],)
    elif item.originalname == "test_header_nvcc_line_builds_every_kernel" and shutil.which("nvcc"):
        cu = params["cu"]
        if header_build(cu)[0] is not None:
            yield ("nvcc", cu), _run_header_nvcc, (cu, tmp_path_factory.mktemp(cu.stem))


AHEAD = Ahead(_plan)
start_ahead = AHEAD.fixture()


def test_there_are_kernels():
    assert CU_FILES, "no .cu files found in kernels/"


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
# Under --full-grid only: what this checks (nvcc -c alone holds every kernel) is what each header's own nvcc line checks
# by default (test_header_nvcc_line_builds_every_kernel below, sm_80, and sm_90a for the Hopper files), and the sm_90
# code is compiled by NVRTC (test_nvrtc_compiles_standalone, at the end of this file).
@pytest.mark.full_grid
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_nvcc_compiles_standalone(cu, arch, tmp_path, capsys):
    obj = tmp_path / "k.o"
    cmd = ["nvcc", "-c", f"-arch={arch}", "-std=c++17", "-I", os.fspath(ROOT / "kernels"), "--resource-usage", "-o",
           os.fspath(obj), os.fspath(cu)]
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


# ---------------------------------------------------------------------------------------------------------
# Each file builds alone exactly as its header says. A kernel file's header documents its build in this form
# (CONTRIBUTING.md, "A kernel file"):
#
#   // Build it alone, from the repository root:
#   //   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/flash/flash2_mma.cu -o flash2_mma.o
#   //   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80, name expressions:
#   //     "flash2_mma_forward<64, 64, 4, 2, 2, false>" "flash2_mma_forward<64, 64, 4, 2, 2, true>"
#
# and the test runs that nvcc line and that NVRTC build, and looks for every kernel in what they produce, so that a
# build which "succeeds" with an empty module (an arch guard that removes everything, a template never instantiated)
# fails here.
# ---------------------------------------------------------------------------------------------------------

def header_build(cu: Path) -> tuple[str | None, list[str], list[str]]:
    """(the nvcc command, the NVRTC options, the NVRTC name expressions) documented in a kernel file's header."""
    lines = cu.read_text().splitlines()
    header = []
    for line in lines:
        if not line.strip().startswith("//"):
            break
        header.append(line.strip()[2:].strip())
    nvcc = next((h for h in header if h.startswith("nvcc ")), None)
    options, names, in_nvrtc = [], [], False
    for h in header:
        if h.startswith("NVRTC:"):
            in_nvrtc = True
            options = [t.rstrip(",;") for t in h.split(":", 1)[1].split() if t.startswith("-")]
        elif in_nvrtc and not h.startswith('"'):
            in_nvrtc = False
        elif in_nvrtc:  # a continuation line: the name expressions, each in double quotes
            names += re.findall(r'"([^"]+)"', h)
    return nvcc, options, names


def test_header_build_parser(tmp_path):
    cu = tmp_path / "k.cu"
    cu.write_text('// k.cu -- a test\n//\n// Build it alone, from the repository root:\n'
                  '//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/k.cu -o k.o\n'
                  '//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80, name expressions:\n'
                  '//     "f<1, true>" "f<2, false>"\n//     "g<3>"\n// Limits\n//   "not a name"\n\n#include <x>\n')
    assert header_build(cu)[2] == ["f<1, true>", "f<2, false>", "g<3>"]
    cu.write_text('//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80 (extern "C" kernels: no name expressions)\n'
                  '// Limits\n')
    assert header_build(cu)[2] == []
    cu.write_text('// k.cu -- a test\n//\n// Build it alone, from the repository root:\n'
                  '//   nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/k.cu -o k.o\n'
                  '//   NVRTC: --std=c++17 -I kernels --gpu-architecture=sm_80, name expressions:\n'
                  '//     "f<1, true>" "f<2, false>"\n//     "g<3>"\n// Limits\n//   "not a name"\n\n#include <x>\n')
    assert header_build(cu) == ("nvcc -std=c++17 -arch=sm_80 -I kernels -c kernels/k.cu -o k.o",
                                ["--std=c++17", "-I", "--gpu-architecture=sm_80"], ["f<1, true>", "f<2, false>", "g<3>"])


@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_header_documents_its_build(cu):
    nvcc, options, _ = header_build(cu)
    assert nvcc is not None, f"{cu.name}: the header has no `//   nvcc ...` line saying how to build the file alone"
    assert re.search(r"-arch=sm_\d+|-gencode=arch=compute_\d+a?,code=sm_\d+a?", nvcc), \
        f"{cu.name}: the nvcc line names no architecture (nvcc's default is too old for cp.async): {nvcc}"
    assert f"kernels/{cu.relative_to(ROOT / 'kernels').as_posix()}" in nvcc, f"{cu.name}: the nvcc line builds another path"
    assert any(o.startswith("--gpu-architecture=") for o in options), \
        f"{cu.name}: the header has no `//   NVRTC: ... --gpu-architecture=sm_XX` line"


def _kernel_names_in(data: bytes) -> set:
    return set(re.findall(rb"[A-Za-z_][A-Za-z0-9_]{2,}", data))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_header_nvcc_line_builds_every_kernel(cu, tmp_path):
    nvcc, _, _ = header_build(cu)
    if nvcc is None:
        pytest.fail(f"{cu.name}: no nvcc line in the header")
    res = AHEAD.result(("nvcc", cu), _run_header_nvcc, cu, tmp_path)
    assert res.returncode == 0, f"{nvcc}\n{res.stderr}"
    entries = re.findall(r"Compiling entry function '(\w+)'", res.stderr)
    extern_c, templates = declared_kernels(cu.read_text())
    assert entries, f"`{nvcc}` produced an object with no kernel in it"
    for name in extern_c:
        assert name in entries, f"{cu.name}: kernel {name} is missing from `{nvcc}`'s object; entries: {entries}"
    for name in templates:
        assert any(f"{len(name)}{name}I" in e for e in entries), \
            f"{cu.name}: kernel template {name} has no instantiation in `{nvcc}`'s object"


def _header_nvrtc_build(cu: Path):
    """(arch, ok, NVRTC's log, CUBIN, lowered names) of the header's own NVRTC line for `cu`."""
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
    from kernels.core import cuda_header_options

    _, options, names = header_build(cu)
    arch = next((o.split("=", 1)[1] for o in options if o.startswith("--gpu-architecture=")), None)
    assert arch, f"{cu.name}: the header's NVRTC line names no --gpu-architecture"
    opts = ["--std=c++17", f"--gpu-architecture={arch}", f"-I{ROOT / 'kernels'}"]
    inc = _cuda_include_dir()
    if inc is not None:
        opts.append(f"-I{inc}")
    opts += list(cuda_header_options())
    err, prog = nvrtc.nvrtcCreateProgram(cu.read_text().encode(), cu.name.encode(), 0, [], [])
    try:
        for expr in names:
            (err,) = nvrtc.nvrtcAddNameExpression(prog, expr.encode())
            assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, (expr, err)
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return arch, False, log.decode(errors="replace"), b"", []
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        lowered = []
        for expr in names:
            err, name = nvrtc.nvrtcGetLoweredName(prog, expr.encode())
            assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, (expr, err)
            lowered.append(name if isinstance(name, bytes) else name.encode())
        return arch, True, log.decode(errors="replace"), cubin, lowered
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_header_nvrtc_build_holds_every_kernel(cu):
    arch, ok, log, cubin, lowered = AHEAD.result(("header-nvrtc", cu), _header_nvrtc_build, cu)
    assert ok, f"{cu.name} ({arch}) failed:\n{log}"
    symbols = _kernel_names_in(cubin)
    names = header_build(cu)[2]
    extern_c, templates = declared_kernels(cu.read_text())
    for name in extern_c:
        assert name.encode() in symbols, f"{cu.name}: kernel {name} is not in the {arch} CUBIN (an arch guard?)"
    for expr, name in zip(names, lowered):
        assert name.rstrip(b"\x00") in symbols, f"{cu.name}: {expr} is not in the {arch} CUBIN"
    for name in templates:
        assert any(f"{len(name)}{name}I".encode() in low for low in lowered), \
            f"{cu.name}: the header's NVRTC name expressions instantiate no {name}"


# ---------------------------------------------------------------------------------------------------------
# NVRTC builds of every launcher build (NVRTC_BUILDS), per architecture
# ---------------------------------------------------------------------------------------------------------

def _nvrtc_cases():
    """(cu, arch) for every file and architecture. By default: sm_90 for every file (what the GPU tests' H100 runs,
    and the CPU CI's only check of the sm_90 builds), and sm_80 where the header's own NVRTC build (run above by
    test_header_nvrtc_build_holds_every_kernel) is not already an sm_80 build of the file. --full-grid adds sm_86 and
    sm_89 (they have compiled whenever the outer two did) and sm_80 of every file. Where the header's build is sm_80
    it compiles each kernel template at sm_80, so the code behind an arch guard (#if __CUDA_ARCH__ ...) is built for
    sm_80 there; the launcher's other instantiations differ from those only in their template arguments, which the
    sm_90 build here compiles."""
    for cu in CU_FILES:
        header_arch = next((o.split("=", 1)[1] for o in header_build(cu)[1] if o.startswith("--gpu-architecture=")), None)
        for arch in ARCHS:
            default = arch == "sm_90" or (arch == "sm_80" and header_arch != "sm_80")
            yield pytest.param(cu, arch, id=f"{cu.name}-{arch}", marks=() if default else (pytest.mark.full_grid,))


@pytest.mark.parametrize("cu,arch", list(_nvrtc_cases()))
def test_nvrtc_compiles_standalone(cu, arch):
    from kernels.core import NVRTC_OPTIONS

    source = cu.read_text()
    for header in re.findall(r'#include\s+"([^"]+)"', source):
        assert header.startswith("ptx/") and (ROOT / "kernels" / header).is_file(), \
            f"{cu.name} includes {header!r}; a kernel file includes only the PTX headers of kernels/ptx/"
    for name_expressions, defines in _builds(cu):
        args = (source, cu.name, arch, NVRTC_OPTIONS[1:] + tuple(defines), tuple(name_expressions))
        ok, log = AHEAD.result(("nvrtc", *args), _nvrtc_compile, *args)
        assert ok, f"{cu.name} ({arch}, {defines}, {name_expressions}) failed to compile:\n{log}"
        assert "warning" not in log.lower(), f"{cu.name} ({arch}) compiles with warnings:\n{log}"
