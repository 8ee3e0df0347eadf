"""Compiling a kernel file: finding it by its bare name, NVRTC through CuPy (once per process), and CUBINs for
architecture-specific targets (sm_90a) or PTX for an older GPU (compute_75, $COURSE_SIMULATE_CC) compiled by NVRTC
directly.

Kernel files live in the chapter folders of kernels/ (kernels/flash/flash2_mma.cu, ...) and are named by their
bare file name everywhere ("flash2_mma.cu"): the names are unique across the folders, and `kernel_path` finds them.
The small PTX headers in kernels/ptx/ are included as "ptx/NAME.cuh", so every build passes -I<kernels/>
(`NVRTC_OPTIONS`); CuPy's compile cache keys on the source text and the options only, so `kernel_text` appends
the hash of every header a file includes, and a change to a header rebuilds the files that include it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from .device import cp, require_gpu, simulated_arch

KERNEL_DIR = Path(__file__).resolve().parents[1]  # kernels/

# The one place where NVRTC options live. No fast-math: the float32 kernels are held to 1e-5. -I<kernels/> finds
# the PTX headers ("ptx/mma_sync.cuh").
NVRTC_OPTIONS = ("--std=c++17", f"-I{KERNEL_DIR}")


@functools.lru_cache(maxsize=None)
def cuda_header_options() -> tuple[str, ...]:
    """("-I<dir>",) for a CUDA include directory that holds crt/mma.h, or () if none is found.

    A kernel that includes <mma.h> (flash2_wmma.cu) needs "crt/mma.h" too. CuPy points NVRTC at the headers
    of the nvidia-cuda-runtime wheel, which hold mma.h but not crt/ (that comes with the compiler, or with the
    nvidia-cuda-crt wheel). So look for crt/mma.h in the wheels, then in the CUDA toolkit; NVRTC searches -I
    directories in order after the including file's own directory. tests/test_compile.py uses this too.
    """
    candidates = []
    try:
        import nvidia.cu13 as wheel  # the CUDA 13 wheels' shared include directory

        candidates += [Path(p) / "include" for p in wheel.__path__]
    except ImportError:
        pass
    for var in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    try:
        candidates.append(Path(cp.cuda.get_cuda_path()) / "include")
    except Exception:  # no CuPy, or CuPy found no toolkit
        pass
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    for inc in candidates:
        if (inc / "crt" / "mma.h").is_file():
            return (f"-I{inc}",)
    return ()


@functools.lru_cache(maxsize=None)
def _kernel_files() -> dict:
    """{bare file name: path} of every .cu and .cuh below kernels/; a name used twice is an error."""
    files: dict = {}
    for path in sorted(KERNEL_DIR.rglob("*.cu*")):
        if path.suffix not in (".cu", ".cuh"):
            continue
        rel = path.relative_to(KERNEL_DIR).as_posix()
        if path.suffix == ".cu" and path.name in files:
            raise RuntimeError(f"two kernel files are named {path.name}: {files[path.name]} and {path}")
        files.setdefault(path.name, path)
        files[rel] = path
    return files


def kernel_path(filename: str) -> Path:
    """The path of a kernel file named by its bare name ("flash2_mma.cu") or by its path below kernels/
    ("flash/flash2_mma.cu", "ptx/mma_sync.cuh")."""
    path = _kernel_files().get(filename)
    if path is None:
        raise FileNotFoundError(f"no kernel file {filename!r} below {KERNEL_DIR}")
    return path


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _included_headers(path: Path, seen: dict) -> dict:
    """{header path: its text} of every quoted #include of `path` found in its own folder or below kernels/,
    followed recursively."""
    for name in _INCLUDE.findall(path.read_text()):
        for base in (path.parent, KERNEL_DIR):
            header = (base / name).resolve()
            if header.is_file():
                if header not in seen:
                    seen[header] = header.read_text()
                    _included_headers(header, seen)
                break
    return seen


def kernel_text(filename: str) -> str:
    """The source of a kernel file as the compilers get it: the file's text, then one comment line holding the hash
    of the headers it includes (so that a compile cache keyed on the source sees a change in a header)."""
    path = kernel_path(filename)
    source = path.read_text()
    headers = _included_headers(path, {})
    if not headers:
        return source
    digest = hashlib.sha256("\0".join(f"{p.name}\0{t}" for p, t in sorted(headers.items())).encode()).hexdigest()
    return f"{source}\n// included headers: {digest[:16]}\n"


def defines_from(**constants) -> tuple[str, ...]:
    """("-DNAME=VALUE", ...): how a launcher hands the sizes it relies on to its .cu file (one source of truth)."""
    return tuple(f"-D{name}={int(value)}" for name, value in constants.items())


@functools.lru_cache(maxsize=None)
def load_module(filename: str, name_expressions: tuple[str, ...] = (), defines: tuple[str, ...] = (),
                arch: str | None = None):
    """Compile the kernel file `filename` with NVRTC through CuPy, once per process, and return the RawModule.

    `defines` are extra "-DNAME=VALUE" (or -I) options; `name_expressions` list template instantiations
    (for example "flash_fwd<64>") that the caller will fetch with module.get_function.
    `arch` (for example "sm_90a") compiles for that architecture instead of CuPy's choice for the current GPU: the
    CUBIN of compile_cubin, cached on disk, loaded with RawModule(path=...). While $COURSE_SIMULATE_CC names an older
    GPU (device.simulated_arch), every other build is compiled to that GPU's PTX (compute_75), which the real GPU's
    driver JIT-compiles when the module loads: CuPy's RawModule would put its own -arch for the real GPU after ours.
    """
    require_gpu()
    source = kernel_text(filename)
    options = NVRTC_OPTIONS + tuple(defines)
    requested_arch = arch  # what the build log keeps: a simulated GPU's PTX target is not part of the build
    if arch is None:
        arch = simulated_arch()
    if arch is not None:
        path, lowered = _cached_binary(filename, source, arch, options, tuple(name_expressions))
        module = _LoadedModule(cp.RawModule(path=os.fspath(path)), lowered)
    else:
        module = cp.RawModule(code=source, options=options, name_expressions=name_expressions or None)
        module.compile()
    _log_build(filename, name_expressions, defines, requested_arch)
    return module


# Where $COURSE_BUILD_LOG names a file, every build this process compiles or loads is appended to it, one JSON line
# each: notebooks/run_all.py keeps the list (results/builds.json) and compiles it in parallel, beside the notebooks,
# in the next run (kernels/core/prebuild.py).
BUILD_LOG_ENV = "COURSE_BUILD_LOG"


CUDA_HEADERS = "@cuda_headers"  # stands for cuda_header_options() in a build record: those are this machine's paths


def build_record(filename: str, name_expressions=(), defines=(), arch: str | None = None) -> dict:
    """One build as load_module's arguments, in the form the build log and results/builds.json hold (the CUDA header
    directories of cuda_header_options(), which differ from machine to machine, as one CUDA_HEADERS entry)."""
    machine = set(cuda_header_options())
    kept = [d for d in defines if d not in machine]
    if len(kept) < len(defines):
        kept.append(CUDA_HEADERS)
    return {"file": filename, "names": list(name_expressions), "defines": kept, "arch": arch}


def build_arguments(record: dict) -> tuple:
    """load_module's arguments for a build record (the inverse of build_record on this machine)."""
    defines = []
    for d in record["defines"]:
        defines += cuda_header_options() if d == CUDA_HEADERS else [d]
    return record["file"], tuple(record["names"]), tuple(defines), record["arch"]


def _log_build(filename, name_expressions, defines, arch) -> None:
    path = os.environ.get(BUILD_LOG_ENV)
    if path:
        with open(path, "a") as f:  # one short line per write: lines from several processes do not interleave
            f.write(json.dumps(build_record(filename, name_expressions, defines, arch)) + "\n")


class _LoadedModule:
    """A RawModule loaded from a file (CUBIN or PTX), whose get_function takes a name expression as well as a lowered
    name, like a RawModule compiled from code with name_expressions."""

    def __init__(self, module, lowered: dict):
        self.module, self.lowered = module, lowered

    def get_function(self, name: str):
        try:
            return self.module.get_function(self.lowered.get(name, name))
        except cp.cuda.driver.CUDADriverError as e:
            if "PTX" not in str(e):
                raise
            raise CompileError(f"the driver cannot load this NVRTC's PTX ({e}): a driver JIT-compiles PTX of its own "
                               f"CUDA version or older, so install the NVRTC of the driver's CUDA version (nvidia-smi "
                               f"shows it), e.g. pip install 'nvidia-cuda-nvrtc==13.0.*'") from e


class CompileError(RuntimeError):
    """NVRTC rejected a kernel file; the message holds NVRTC's log."""


def compile_cubin(source: str, name: str, arch: str, options: tuple = ()) -> tuple[bytes, str]:
    """(CUBIN, NVRTC's log) of CUDA `source` compiled with NVRTC for the one real architecture `arch` ("sm_90a").

    For kernels that need an architecture-specific target, such as Hopper's wgmma and setmaxnreg (sm_90a): CuPy's
    RawModule puts its own -arch for the current GPU after the caller's options, so such a file is compiled here and
    CuPy loads the CUBIN (load_module(..., arch=...)). NVRTC is CuPy's own where CuPy is installed, and otherwise the
    cuda-bindings wheel's (the CPU compile tests): no GPU is needed to compile. Raises CompileError with the log.
    """
    binary, log, _ = compile_program(source, name, arch, options)
    return binary, log


def compile_program(source: str, name: str, arch: str, options: tuple = (),
                    name_expressions: tuple = ()) -> tuple[bytes, str, dict]:
    """(binary, NVRTC's log, {name expression: lowered name}) of CUDA `source` compiled with NVRTC for `arch`: a
    CUBIN for a real architecture ("sm_90a", "sm_75"), PTX for a virtual one ("compute_75", which the driver
    JIT-compiles for the GPU it loads on). Raises CompileError with the log."""
    opts = [f"--gpu-architecture={arch}", *options]
    ptx = arch.startswith("compute_")
    if cp is not None:
        from cupy_backends.cuda.libs import nvrtc

        prog = nvrtc.createProgram(source, name, (), ())
        try:
            for expr in name_expressions:
                nvrtc.addNameExpression(prog, expr)
            try:
                nvrtc.compileProgram(prog, opts)
            except nvrtc.NVRTCError as e:
                raise CompileError(f"{name} ({arch}) does not compile:\n{nvrtc.getProgramLog(prog)}") from e
            binary = nvrtc.getPTX(prog) if ptx else nvrtc.getCUBIN(prog)
            lowered = {expr: _as_bytes(nvrtc.getLoweredName(prog, expr)).rstrip(b"\x00").decode()
                       for expr in name_expressions}
            return _as_bytes(binary), nvrtc.getProgramLog(prog).strip("\x00 \n"), lowered
        finally:
            nvrtc.destroyProgram(prog)
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{name}: nvrtcCreateProgram failed: {err}")
    try:
        for expr in name_expressions:
            nvrtc.nvrtcAddNameExpression(prog, expr.encode())
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        log = log.decode(errors="replace").strip("\x00 \n")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"{name} ({arch}) does not compile:\n{log}")
        get_size, get = (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX) if ptx else (nvrtc.nvrtcGetCUBINSize,
                                                                                nvrtc.nvrtcGetCUBIN)
        _, size = get_size(prog)
        binary = b" " * size
        get(prog, binary)
        lowered = {expr: _as_bytes(nvrtc.nvrtcGetLoweredName(prog, expr.encode())[1]).rstrip(b"\x00").decode()
                   for expr in name_expressions}
        return binary, log, lowered
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _as_bytes(x) -> bytes:
    return x if isinstance(x, bytes) else bytes(x) if not isinstance(x, str) else x.encode()


def _nvrtc_version() -> str:
    if cp is not None:
        from cupy_backends.cuda.libs import nvrtc

        return "cupy-nvrtc-%d.%d" % nvrtc.getVersion()
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return f"cuda-bindings-nvrtc-{major}.{minor}"


def _cached_binary(filename: str, source: str, arch: str, options: tuple, name_expressions: tuple) -> tuple:
    """(path, {name expression: lowered name}) of the CUBIN (sm_XX) or PTX (compute_XX) of the kernel file `filename`
    for `arch`, compiled once and kept in CuPy's kernel cache directory ($CUPY_CACHE_DIR, default
    ~/.cupy/kernel_cache) under a hash of the source, options, name expressions, arch and NVRTC version, beside the
    lowered names (one line per name expression)."""
    key = hashlib.sha256("\0".join((source, arch, *options, "names", *name_expressions,
                                     _nvrtc_version())).encode()).hexdigest()[:20]
    cache = Path(os.environ.get("CUPY_CACHE_DIR", "~/.cupy/kernel_cache")).expanduser()
    path = cache / f"{Path(filename).stem}_{arch}_{key}.{'ptx' if arch.startswith('compute_') else 'cubin'}"
    names = path.with_suffix(".names")
    if not (path.is_file() and names.is_file()):
        binary, _, lowered = compile_program(source, filename, arch, options, name_expressions)
        cache.mkdir(parents=True, exist_ok=True)
        for target, data in ((names, "".join(f"{lowered[e]}\n" for e in name_expressions).encode()), (path, binary)):
            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, target)  # atomic: another process never reads half a file
    lowered = dict(zip(name_expressions, names.read_text().splitlines()))
    return path, lowered
