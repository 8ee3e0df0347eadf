"""What every launcher shares: finding the GPU, compiling a .cu file once, launching, validating inputs.

This module imports without CuPy (so that CPU-only machines can import the launchers, read their
constants and run the compile tests); anything that touches a GPU goes through `current_device()` or
`require_gpu()` first, which raise GPUNotAvailableError with the reason.

The launch path is kept thin on purpose: a launcher's Python call should cost a few microseconds, not
tens, so that short kernels (decoding, small batches) are not dominated by Python. Everything that can be
looked up once is looked up once:

    device facts (name, compute capability, shared-memory limit, L2 size)   once per device: device_info()
    compiling a .cu file                                                     once per process: load_module()
    kernel handle, shared-memory opt-in, carveout                            once per device: Kernel
    a call                                                                   dtype/shape/stride checks on the
                                                                             arrays, no device query, no sync
"""

from __future__ import annotations

import ctypes
import functools
import math
import operator
import os
import re
import shutil
import struct
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

try:  # CuPy is only needed on a machine with a GPU.
    import cupy as cp
except ImportError:  # pragma: no cover - exercised on CPU-only machines
    cp = None

try:  # registers NumPy's "bfloat16" dtype, which CuPy's bfloat16 arrays use (CuPy >= 14)
    import ml_dtypes  # noqa: F401
except ImportError:  # pragma: no cover - float16/float32 work without it
    ml_dtypes = None

import numpy as np

KERNEL_DIR = Path(__file__).resolve().parent

# The one place where NVRTC options live. No fast-math: the float32 kernels are held to 1e-5.
NVRTC_OPTIONS = ("--std=c++17",)

# Every kernel of the course needs at least Ampere (sm_80): cp.async, bf16 and mma.m16n8k16.
DEFAULT_MIN_CC = (8, 0)

DEFAULT_SHARED_LIMIT = 48 * 1024  # shared memory (static + dynamic) a block may use without opting in
MAX_GRID_X = 2**31 - 1  # the launch limits of every CUDA GPU since compute capability 3.0
MAX_GRID_YZ = 65535
INT32_MAX = 2**31 - 1


class GPUNotAvailableError(RuntimeError):
    """Raised when a GPU launcher is called where no CUDA GPU (or no CuPy) is found."""


class UnsupportedDeviceError(RuntimeError):
    """Raised when the current GPU is older than a kernel's minimum compute capability."""


# ---------------------------------------------------------------------------------------------
# Is there a GPU? Which one? (asked once per process / per device)
# ---------------------------------------------------------------------------------------------

def _driver_library_loads() -> bool:
    """True where the NVIDIA driver's user-space library (libcuda) can be loaded."""
    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
    for name in names:
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


_GPU_OK = False  # set once a GPU has been found; a GPU does not disappear while a process runs


def gpu_unavailable_reason() -> str | None:
    """None where a CUDA GPU can be used through CuPy, otherwise a sentence saying why not."""
    global _GPU_OK
    if _GPU_OK:
        return None
    if cp is None:
        return "CuPy is not installed (pip install cupy-cuda13x, or cupy-cuda12x for a CUDA 12 driver)"
    if not _driver_library_loads():
        return "no NVIDIA driver / no GPU (the driver library libcuda cannot be loaded on this machine)"
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # a driver without a device, a driver older than CuPy's CUDA, ...
        return f"no usable CUDA GPU ({type(e).__name__}: {e})"
    if n == 0:
        return "no NVIDIA GPU (the driver reports 0 devices)"
    _GPU_OK = True
    return None


def require_gpu() -> None:
    if not _GPU_OK:
        reason = gpu_unavailable_reason()
        if reason is not None:
            raise GPUNotAvailableError(reason)


def current_device() -> int:
    """The id of the current CUDA device (one cudaGetDevice call once a GPU has been found)."""
    if not _GPU_OK:
        require_gpu()
    return cp.cuda.runtime.getDevice()


@dataclass(frozen=True)
class DeviceInfo:
    """What the launchers need to know about one GPU, read once."""
    id: int
    name: str
    cc: tuple  # (major, minor)
    sm_count: int
    smem_optin: int  # bytes of shared memory one block may use after opting in (227 KB on an H100)
    l2_bytes: int


_DEVICE_INFO: dict[int, DeviceInfo] = {}


def device_info(dev: int | None = None) -> DeviceInfo:
    """The DeviceInfo of device `dev` (default: the current one), read from the driver on first use."""
    if dev is None:
        dev = current_device()
    info = _DEVICE_INFO.get(dev)
    if info is None:
        d = cp.cuda.Device(dev)
        attrs = d.attributes
        props = cp.cuda.runtime.getDeviceProperties(dev)
        name = props["name"]
        cc = d.compute_capability  # e.g. "90"
        info = DeviceInfo(id=dev, name=name.decode() if isinstance(name, bytes) else str(name),
                          cc=(int(cc[:-1]), int(cc[-1])), sm_count=int(attrs["MultiProcessorCount"]),
                          smem_optin=int(attrs["MaxSharedMemoryPerBlockOptin"]), l2_bytes=int(attrs["L2CacheSize"]))
        _DEVICE_INFO[dev] = info
    return info


def device_compute_capability() -> tuple[int, int]:
    """(major, minor) of the current device."""
    return device_info().cc


def gpu_name() -> str:
    return device_info().name


def max_shared_memory_optin() -> int:
    """Bytes of shared memory one block may use once it opts in (227 KB on an H100)."""
    return device_info().smem_optin


def blocks_per_sm(kernel, threads: int, dynamic_smem: int = 0, dev: int | None = None) -> int | None:
    """How many blocks of a compiled Kernel (`threads` threads, `dynamic_smem` bytes of dynamic shared memory each) an
    SM holds at once, limited by registers, shared memory and threads, from the kernel's attributes; None where CuPy
    does not report them. Registers go to a warp 256 at a time; the driver keeps 1 KB of shared memory per block, and
    an SM has the per-block opt-in limit plus that 1 KB (228 KB on an H100)."""
    try:
        attrs = kernel.raw.attributes
        regs, smem = int(attrs["num_regs"]), int(attrs["shared_size_bytes"]) + int(dynamic_smem)
    except (AttributeError, KeyError, TypeError):  # pragma: no cover - a CuPy without these attributes
        return None
    warps = ceil_div(threads, 32)
    regs_per_warp = ceil_div(max(regs, 1) * 32, 256) * 256
    by_regs = 65536 // (regs_per_warp * warps)
    by_smem = (device_info(dev).smem_optin + 1024) // (smem + 1024)
    by_threads = 2048 // (warps * 32)
    return max(1, min(by_regs, by_smem, by_threads, 32))


def check_compute_capability(min_cc: tuple[int, int], what: str, dev: int | None = None) -> None:
    """Raise UnsupportedDeviceError naming `what`, the device's capability and the minimum."""
    info = device_info(dev)
    if info.cc < tuple(min_cc):
        raise UnsupportedDeviceError(
            f"{what} needs a GPU of compute capability >= {min_cc[0]}.{min_cc[1]}; "
            f"this GPU ({info.name}) has {info.cc[0]}.{info.cc[1]}"
        )


def check_shared_memory(nbytes: int, what: str, dev: int | None = None) -> None:
    """Raise ValueError when `nbytes` of shared memory per block is more than this GPU allows."""
    limit = max_shared_memory_optin() if dev is None else device_info(dev).smem_optin
    if nbytes > limit:
        raise ValueError(f"{what} needs {nbytes} bytes of shared memory per block; this GPU allows at most {limit}")


# ---------------------------------------------------------------------------------------------
# Compiling and launching
# ---------------------------------------------------------------------------------------------

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


def kernel_path(filename: str) -> Path:
    path = KERNEL_DIR / filename
    if not path.is_file():
        raise FileNotFoundError(f"no kernel file {filename!r} in {KERNEL_DIR}")
    return path


def defines_from(**constants) -> tuple[str, ...]:
    """("-DNAME=VALUE", ...): how a launcher hands the sizes it relies on to its .cu file (one source of truth)."""
    return tuple(f"-D{name}={int(value)}" for name, value in constants.items())


@functools.lru_cache(maxsize=None)
def load_module(filename: str, name_expressions: tuple[str, ...] = (), defines: tuple[str, ...] = (),
                arch: str | None = None):
    """Compile kernels/<filename> with NVRTC through CuPy, once per process, and return the RawModule.

    `defines` are extra "-DNAME=VALUE" (or -I) options; `name_expressions` list template instantiations
    (for example "flash_fwd<64>") that the caller will fetch with module.get_function.
    `arch` (for example "sm_90a") compiles for that architecture instead of CuPy's choice for the current GPU: the
    CUBIN of compile_cubin, cached on disk, loaded with RawModule(path=...); extern "C" kernels only.
    """
    require_gpu()
    source = kernel_path(filename).read_text()
    options = NVRTC_OPTIONS + tuple(defines)
    if arch is not None:
        if name_expressions:
            raise ValueError(f"{filename}: a build for arch={arch!r} loads extern \"C\" kernels only "
                             f"(no name_expressions)")
        return cp.RawModule(path=os.fspath(_cached_cubin(filename, source, arch, options)))
    module = cp.RawModule(code=source, options=options, name_expressions=name_expressions or None)
    module.compile()
    return module


class CompileError(RuntimeError):
    """NVRTC rejected a kernel file; the message holds NVRTC's log."""


def compile_cubin(source: str, name: str, arch: str, options: tuple = ()) -> tuple[bytes, str]:
    """(CUBIN, NVRTC's log) of CUDA `source` compiled with NVRTC for the one real architecture `arch` ("sm_90a").

    For kernels that need an architecture-specific target, such as Hopper's wgmma and setmaxnreg (sm_90a): CuPy's
    RawModule puts its own -arch for the current GPU after the caller's options, so such a file is compiled here and
    CuPy loads the CUBIN (load_module(..., arch=...)). NVRTC is CuPy's own where CuPy is installed, and otherwise the
    cuda-bindings wheel's (the CPU compile tests): no GPU is needed to compile. Raises CompileError with the log.
    """
    opts = [f"--gpu-architecture={arch}", *options]
    if cp is not None:
        from cupy_backends.cuda.libs import nvrtc

        prog = nvrtc.createProgram(source, name, (), ())
        try:
            try:
                nvrtc.compileProgram(prog, opts)
            except nvrtc.NVRTCError as e:
                raise CompileError(f"{name} ({arch}) does not compile:\n{nvrtc.getProgramLog(prog)}") from e
            return nvrtc.getCUBIN(prog), nvrtc.getProgramLog(prog).strip("\x00 \n")
        finally:
            nvrtc.destroyProgram(prog)
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{name}: nvrtcCreateProgram failed: {err}")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        log = log.decode(errors="replace").strip("\x00 \n")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"{name} ({arch}) does not compile:\n{log}")
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        return cubin, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_version() -> str:
    if cp is not None:
        from cupy_backends.cuda.libs import nvrtc

        return "cupy-nvrtc-%d.%d" % nvrtc.getVersion()
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return f"cuda-bindings-nvrtc-{major}.{minor}"


def _cached_cubin(filename: str, source: str, arch: str, options: tuple) -> Path:
    """The CUBIN of kernels/<filename> for `arch`, compiled once and kept in CuPy's kernel cache directory
    ($CUPY_CACHE_DIR, default ~/.cupy/kernel_cache) under a hash of the source, options, arch and NVRTC version."""
    import hashlib

    key = hashlib.sha256("\0".join((source, arch, *options, _nvrtc_version())).encode()).hexdigest()[:20]
    cache = Path(os.environ.get("CUPY_CACHE_DIR", "~/.cupy/kernel_cache")).expanduser()
    path = cache / f"{Path(filename).stem}_{arch}_{key}.cubin"
    if not path.is_file():
        cubin, _ = compile_cubin(source, filename, arch, options)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(cubin)
        os.replace(tmp, path)  # atomic: another process never reads half a file
    return path


class Kernel:
    """One kernel of a kernels/*.cu file, ready to launch.

        kern = get_kernel("flash2.cu", "flash2_forward<64, 64, 64, 4, 8>", name_expressions=(...),
                          shared_mem=70_000, carveout=100)
        kern(grid, block, args, shared_mem=nbytes)

    The file is compiled once per process (load_module). On each device the kernel is configured once,
    the first time it is launched there: a kernel that needs more than 48 KB of dynamic shared memory
    opts in up to `shared_mem` (after checking it against the device's limit), and `carveout` (percent of
    the SM's L1/shared storage given to shared memory) is set. A launch after that costs a dictionary look-up,
    one struct.pack_into of the arguments (see _ParamPlan) and cuLaunchKernel; a Launch (below) also skips the packing
    of the constant arguments.
    """

    __slots__ = ("filename", "name", "name_expressions", "defines", "shared_mem", "carveout", "arch", "_fn", "_raw")

    def __init__(self, filename: str, name: str, *, name_expressions: tuple = (), defines: tuple = (),
                 shared_mem: int = 0, carveout: int | None = None, arch: str | None = None):
        self.filename, self.name, self.arch = filename, name, arch  # arch: see load_module
        self.name_expressions, self.defines = tuple(name_expressions), tuple(defines)
        self.shared_mem, self.carveout = int(shared_mem), carveout
        self._fn: dict = {}  # device id -> cupy.cuda.Function
        self._raw: dict = {}  # device id -> cupy.RawKernel (its attributes: num_regs, ...)

    def _configure(self, dev: int):
        check_shared_memory(self.shared_mem, f"{self.filename}:{self.name}", dev)  # before compiling anything
        module = load_module(self.filename, self.name_expressions, self.defines) if self.arch is None else \
            load_module(self.filename, self.name_expressions, self.defines, self.arch)
        raw = module.get_function(self.name)
        # Past the default limit a block must opt in, and the limit counts static shared memory too: a kernel with
        # 48 KB of dynamic and any static shared memory needs the attribute. So set it whenever the static part plus
        # the dynamic part passes the limit.
        if self.shared_mem and self.shared_mem + int(raw.attributes["shared_size_bytes"]) > DEFAULT_SHARED_LIMIT:
            raw.max_dynamic_shared_size_bytes = self.shared_mem
        if self.carveout is not None:
            raw.preferred_shared_memory_carveout = int(self.carveout)
        self._raw[dev] = raw
        fn = self._fn[dev] = raw.kernel
        return fn

    def function(self, dev: int):
        """The cupy.cuda.Function of this kernel on device `dev`, configured there on first use."""
        return self._fn.get(dev) or self._configure(dev)

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        dev = cp.cuda.runtime.getDevice()
        fn = self._fn.get(dev) or self._configure(dev)
        types = tuple(map(type, args))
        plan = _PLANS.get(types) or _param_plan(types)
        if plan is None:  # an argument type the fast path does not pack: CuPy's own launch
            fn(grid, block, args, shared_mem)
        else:
            plan.launch(fn.ptr, grid, block, args, shared_mem, cp.cuda.get_current_stream().ptr)

    def launch(self, grid: tuple, block: tuple, args: tuple, shared_mem: int, stream_ptr: int) -> None:
        """The same launch on an explicit stream (a raw cudaStream_t handle) of the current device, for callers whose
        buffers are not CuPy arrays: device pointers go in `args` as np.uint64 (kernels/torch_ops.py passes torch
        tensors' data_ptr() and torch's current stream this way)."""
        dev = cp.cuda.runtime.getDevice()
        fn = self._fn.get(dev) or self._configure(dev)
        types = tuple(map(type, args))
        plan = _PLANS.get(types) or _param_plan(types)
        if plan is None:
            raise TypeError(f"Kernel.launch takes NumPy scalars and CuPy arrays only; got {[t.__name__ for t in types]}")
        plan.launch(fn.ptr, grid, block, args, shared_mem, stream_ptr)

    @property
    def raw(self):
        """The cupy.RawKernel on the current device: .num_regs, .local_size_bytes, .attributes, ..."""
        dev = current_device()
        if dev not in self._raw:
            self._configure(dev)
        return self._raw[dev]

    @property
    def num_regs(self) -> int:
        return self.raw.num_regs

    @property
    def local_size_bytes(self) -> int:
        return self.raw.local_size_bytes

    def __repr__(self) -> str:
        return f"Kernel({self.filename}:{self.name}, shared_mem={self.shared_mem}, carveout={self.carveout})"


# ---------------------------------------------------------------------------------------------
# The launch itself: cuLaunchKernel with the arguments packed by `struct`
# ---------------------------------------------------------------------------------------------
# cuLaunchKernel takes the kernel's arguments as an array of pointers, one per argument, each pointing at the
# argument's bytes. CuPy's RawKernel builds that array anew on every call, inspecting each argument; for a
# launcher of eleven arguments that took about 7 microseconds, half of the launcher's whole host time. Here the
# layout is worked out once per tuple of argument types (a "plan"): one buffer holds the argument values at
# their natural alignment, and a fixed array of pointers points into it. A call then packs the values with one
# struct.pack_into and calls the driver. The driver copies the values at the launch, so the buffer can be
# reused right after; a lock keeps two threads from packing into it at once.

_ARG_CODES = {np.int32: "i", np.uint32: "I", np.int64: "q", np.uint64: "Q", np.float32: "f", np.float64: "d",
              np.int16: "h", np.uint16: "H", np.int8: "b", np.uint8: "B", np.bool_: "?"}
if np.dtype(np.uintp).itemsize == 8:
    _ARG_CODES[np.uintp] = "Q"


class _ParamPlan:
    """How to pack one tuple of argument types into cuLaunchKernel's kernelParams (see above)."""

    __slots__ = ("fmt", "arrays", "buf", "params", "params_ptr", "lock")

    def __init__(self, codes: list, arrays: tuple):
        self.fmt, offsets = _layout(codes)  # native sizes and alignment: the C ABI of the kernel's parameters
        self.arrays = arrays  # positions of the CuPy arrays (passed as their device pointers)
        self.buf = ctypes.create_string_buffer(max(struct.calcsize(self.fmt), 8))
        base = ctypes.addressof(self.buf)
        self.params = (ctypes.c_void_p * max(len(codes), 1))(*(base + off for off in offsets))
        self.params_ptr = ctypes.addressof(self.params)
        self.lock = threading.Lock()

    def launch(self, fn_ptr: int, grid: tuple, block: tuple, args: tuple, shared_mem: int, stream_ptr: int):
        values = list(args)
        for i in self.arrays:
            values[i] = values[i].data.ptr
        ng, nb = len(grid), len(block)
        with self.lock:
            struct.pack_into(self.fmt, self.buf, 0, *values)
            _driver.launchKernel(fn_ptr, grid[0], grid[1] if ng > 1 else 1, grid[2] if ng > 2 else 1,
                                 block[0], block[1] if nb > 1 else 1, block[2] if nb > 2 else 1,
                                 shared_mem, stream_ptr, self.params_ptr, 0)


_driver = cp.cuda.driver if cp is not None else None
_PTR = "Q" if np.dtype(np.uintp).itemsize == 8 else "I"  # how a device pointer is packed


def _layout(codes: list) -> tuple:
    """(struct format, byte offset of each argument) of kernel arguments with these struct codes, each at its C
    alignment: the layout of the kernel's parameters."""
    return "@" + "".join(codes), [struct.calcsize("@" + "".join(codes[: i + 1])) - struct.calcsize(c)
                                  for i, c in enumerate(codes)]
_PLANS: dict = {}  # tuple of argument types -> _ParamPlan (or None: not packable, use CuPy's launch)


def _param_plan(types: tuple):
    """The _ParamPlan for this tuple of argument types, made once; None when a type is not one the plan packs."""
    if types in _PLANS:
        return _PLANS[types]
    codes, arrays = [], []
    ndarray = cp.ndarray if cp is not None else None
    for i, t in enumerate(types):
        if t is ndarray:
            codes.append(_PTR)
            arrays.append(i)
        elif t in _ARG_CODES:
            codes.append(_ARG_CODES[t])
        else:
            _PLANS[types] = None
            return None
    plan = _PLANS[types] = _ParamPlan(codes, tuple(arrays))
    return plan


class Launch:
    """One kernel launch prepared for one problem on one device; a call supplies the pointers and the stream.

        launch = Launch(kernel, grid, block, smem, n_ptrs=5, tail=(np.int32(T), np.float32(scale), ...), dev=dev)
        launch(stream_ptr, q_ptr, k_ptr, v_ptr, o_ptr, 0)      # kernel(q, k, v, o, NULL, T, scale, ...)

    A kernel's leading arguments are the device pointers, which change from call to call, and its trailing ones
    are sizes, scales and flags, which are fixed by the problem. A launcher that keeps one Launch per problem
    (shapes, dtype, options; see the dense attention launchers) works out the grid, block and shared memory once,
    packs the trailing arguments once into this launch's own parameter buffer, and configures the kernel on the
    device once. A call then packs the pointers with one struct.pack_into and calls cuLaunchKernel, which copies
    the parameters before it returns; the lock keeps two threads from packing into the buffer at once.
    """

    __slots__ = ("grid", "block", "smem", "fn_ptr", "n_ptrs", "ptr_fmt", "buf", "params", "params_ptr", "lock")

    def __init__(self, kernel: "Kernel", grid: tuple, block: tuple, smem: int, n_ptrs: int, tail: tuple, dev: int):
        codes = [_PTR] * n_ptrs
        for x in tail:
            if type(x) not in _ARG_CODES:
                raise TypeError(f"Launch takes NumPy scalars after the pointers; got {type(x).__name__}")
            codes.append(_ARG_CODES[type(x)])
        fmt, offsets = _layout(codes)
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.block = tuple(block) + (1,) * (3 - len(block))
        self.smem = int(smem)
        self.fn_ptr = kernel.function(dev).ptr
        self.n_ptrs = n_ptrs
        self.ptr_fmt = "@" + _PTR * n_ptrs
        self.buf = ctypes.create_string_buffer(max(struct.calcsize(fmt), 8))
        struct.pack_into(fmt, self.buf, 0, *((0,) * n_ptrs + tuple(tail)))
        base = ctypes.addressof(self.buf)
        self.params = (ctypes.c_void_p * max(len(codes), 1))(*(base + off for off in offsets))
        self.params_ptr = ctypes.addressof(self.params)
        self.lock = threading.Lock()

    def __call__(self, stream_ptr: int, *ptrs: int) -> None:
        (gx, gy, gz), (bx, by, bz) = self.grid, self.block
        with self.lock:
            struct.pack_into(self.ptr_fmt, self.buf, 0, *ptrs)
            _driver.launchKernel(self.fn_ptr, gx, gy, gz, bx, by, bz, self.smem, stream_ptr, self.params_ptr, 0)


@functools.lru_cache(maxsize=None)
def get_kernel(filename: str, name: str, *, name_expressions: tuple = (), defines: tuple = (),
               shared_mem: int = 0, carveout: int | None = None, arch: str | None = None) -> Kernel:
    """The Kernel `name` of kernels/<filename> (one object per build; see Kernel; arch: see load_module)."""
    return Kernel(filename, name, name_expressions=name_expressions, defines=defines, shared_mem=shared_mem,
                  carveout=carveout, arch=arch)


def kernel_source(filename: str, name: str | None = None) -> str:
    """The text of kernels/<filename>, or of one function in it (from its signature to its closing brace).

    Notebooks show kernels through this, so the code a learner reads is the code that runs. The comment
    block right above the function comes with it.
    """
    text = kernel_path(filename).read_text()
    if name is None:
        return text
    # the first line that calls or declares name( outside a comment and a preprocessor line (a #define whose comment
    # mentions "name (" is neither)
    m = re.search(r"^(?![ \t]*(?://|/\*|\*|#))[^\n;{}/]*\b" + re.escape(name) + r"\s*\(", text, re.M)
    if m is None:
        raise ValueError(f"no function {name!r} in {filename}")
    start = m.start()
    before = text[:start].rstrip("\n").split("\n")
    lead = []
    while before and before[-1].lstrip().startswith(("//", "template", "extern", "__global__", "__device__")):
        lead.insert(0, before.pop())
    brace = text.index("{", m.end())
    depth, i = 0, brace
    while True:
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                break
        i += 1
    return "\n".join(lead + [text[start : i + 1]])


STEP_MARK = re.compile(r"^\s*// ---- (.+?)\s*-*\s*$")


def kernel_steps(filename: str, name: str) -> list[tuple[str, str]]:
    """One function of kernels/<filename>, cut into its steps: [(title, code), ...].

    A step starts at a comment line of the form `// ---- title -----`; what comes before the first one is the
    signature and set-up. Notebooks show a long kernel this way, a step at a time with the explanation between.
    """
    steps, title, lines = [], "signature and set-up", []
    for line in kernel_source(filename, name).split("\n"):
        m = STEP_MARK.match(line)
        if m and lines:
            steps.append((title, "\n".join(lines)))
            title, lines = m.group(1), []
        lines.append(line)
    steps.append((title, "\n".join(lines)))
    return steps


# Arguments that launchers pass on every call, made once (a NumPy scalar costs a fraction of a microsecond to build).
NULL = np.uintp(0)  # a null pointer argument
I32 = (np.int32(0), np.int32(1))  # I32[bool(flag)]: a 0/1 flag argument
DTYPE_NAMES = {np.dtype(n): n for n in ("float16", "float32", "float64", "int32")}
_SCALARS: dict = {}  # (numpy type, value) -> the NumPy scalar; sizes and scales repeat from call to call


def scalar(kind, value):
    """kind(value) as a NumPy scalar (np.int32, np.float32, ...), made once per value and reused."""
    key = (kind, value)
    x = _SCALARS.get(key)
    if x is None:
        if len(_SCALARS) > 4096:
            _SCALARS.clear()
        x = _SCALARS[key] = kind(value)
    return x
if ml_dtypes is not None:
    DTYPE_NAMES[np.dtype("bfloat16")] = "bfloat16"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_grid(blocks: int, what: str, limit: int = MAX_GRID_X, axis: str = "x") -> int:
    """`blocks`, or a ValueError naming the launch's grid limit along `axis`."""
    if blocks > limit:
        raise ValueError(f"{what} needs {blocks} blocks along grid {axis}; the grid allows at most {limit}")
    return blocks


def check_alignment(what: str, align: int, **arrays) -> None:
    """Every array's base address must be a multiple of `align` bytes (vector loads, cp.async)."""
    for name, x in arrays.items():
        if x.data.ptr % align:
            raise ValueError(f"{name} starts at address {x.data.ptr:#x}, which is not {align}-byte aligned; "
                             f"{what} reads {align}-byte vectors (pass a fresh array: cupy.array({name}))")


# ---------------------------------------------------------------------------------------------
# Input validation for the launcher contract (CONTRIBUTING.md, "The launcher contract").
# ---------------------------------------------------------------------------------------------

class DtypeSet(frozenset):
    """The NumPy dtypes a kernel takes, for a fast `x.dtype in ...`, remembering the order they were named in."""
    names: tuple = ()


@functools.lru_cache(maxsize=None)
def dtype_set(names: tuple) -> DtypeSet:
    """The DtypeSet of the dtypes named (what validate_attention and check_array compare a dtype against)."""
    result = DtypeSet(np.dtype(n) for n in names)
    result.names = tuple(np.dtype(n).name for n in names)
    return result


def _dtype_list(dtypes) -> str:
    return ", ".join(getattr(dtypes, "names", ()) or sorted(np.dtype(n).name for n in dtypes))


# A CuPy array knows whether it is C-contiguous; `_c_contiguous` reads that flag without building the
# `flags` object (about half a microsecond per array on the launch path). Fall back where a CuPy lacks it.
_HAS_C_CONTIGUOUS = cp is not None and hasattr(cp.ndarray, "_c_contiguous")
if _HAS_C_CONTIGUOUS:
    _c_contiguous = operator.attrgetter("_c_contiguous")
else:  # pragma: no cover
    def _c_contiguous(x):
        return x.flags.c_contiguous


def _array_problem(x, name: str, dtypes, ndim, dev: int):
    """The exception for an argument that is not a C-contiguous CuPy array of `dtypes` on device `dev`, or None."""
    if not isinstance(x, cp.ndarray):
        return TypeError(f"{name} must be a cupy.ndarray on the GPU; got {type(x).__module__}.{type(x).__name__} "
                         f"(move it with cupy.asarray({name}))")
    if x.dtype not in dtypes:
        return TypeError(f"{name} has dtype {x.dtype.name}; this kernel takes {_dtype_list(dtypes)}")
    if ndim is not None and x.ndim != ndim:
        return ValueError(f"{name} must be {ndim}-D; got shape {x.shape}")
    if not _c_contiguous(x):
        return ValueError(f"{name} must be C-contiguous; got a strided view with shape {x.shape} and strides "
                          f"{x.strides} (use cupy.ascontiguousarray({name}))")
    if x.data.device_id != dev:
        return ValueError(f"{name} is on device {x.data.device_id}, but the current device is {dev}")
    return None


def check_array(x, name: str, *, dtypes, ndim: int | None = None, dev: int | None = None) -> None:
    """x must be a C-contiguous CuPy array of one of `dtypes` (names or a dtype_set) on the current device."""
    if dev is None:
        dev = current_device()
    if not isinstance(dtypes, frozenset):
        dtypes = dtype_set(tuple(dtypes))
    problem = _array_problem(x, name, dtypes, ndim, dev)
    if problem is not None:
        raise problem


def validate_attention(q, k, v, *, dtypes, max_d: int, min_cc=DEFAULT_MIN_CC, what: str,
                       d_multiple: int = 1, scale=None, align: int = 0):
    """Validate q, k, v for an attention launcher; return (B, H, Tq, Tk, d, scale).

    Raises TypeError / ValueError naming the argument, its value and the limit, and
    UnsupportedDeviceError when the GPU is too old for the kernel. `align` > 0 also requires each base
    address to be a multiple of `align` bytes. `dtypes` may be names or a dtype_set (faster).

    This runs on every call, so the common case is a handful of attribute reads and comparisons; the
    messages are only built when something is wrong.
    """
    dev = cp.cuda.runtime.getDevice() if _GPU_OK else current_device()
    if not isinstance(dtypes, frozenset):
        dtypes = dtype_set(tuple(dtypes))
    ndarray = cp.ndarray
    for x in (q, k, v):
        if (not isinstance(x, ndarray) or x.dtype not in dtypes or x.ndim != 4 or not _c_contiguous(x)
                or x.data.device_id != dev):
            for name, y in (("q", q), ("k", k), ("v", v)):
                problem = _array_problem(y, name, dtypes, 4, dev)
                if problem is not None:
                    raise problem
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {k.shape} and v {v.shape}")
    B, H, Tq, d = q.shape
    kB, kH, Tk, kd = k.shape
    if kB != B or kH != H or kd != d:
        raise ValueError(f"q {q.shape} and k {k.shape} must agree on B, H and d")
    if min(B, H, Tq, Tk, d) < 1:
        raise ValueError(f"every dimension must be >= 1; got q {q.shape}, k {k.shape}")
    if d > max_d:
        raise ValueError(f"head dimension d={d} is larger than {what} supports (d <= {max_d})")
    if d % d_multiple:
        raise ValueError(f"head dimension d={d} must be a multiple of {d_multiple} for {what}")
    if q.size > INT32_MAX or k.size > INT32_MAX:
        name = "q" if q.size > INT32_MAX else "k"
        raise ValueError(f"{name} has {max(q.size, k.size)} elements; {what} indexes with 32-bit integers "
                         f"(<= {INT32_MAX})")
    if align and (q.data.ptr % align or k.data.ptr % align or v.data.ptr % align):
        check_alignment(what, align, q=q, k=k, v=v)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    else:
        scale = float(scale)
        if not math.isfinite(scale):
            raise ValueError(f"scale must be a finite number; got {scale}")
    info = _DEVICE_INFO.get(dev) or device_info(dev)
    if info.cc < min_cc:
        check_compute_capability(min_cc, what, dev)
    return B, H, Tq, Tk, d, scale


_ndarray = cp.ndarray if cp is not None else None
_FLOAT32 = np.dtype(np.float32)


def qkv_key(q, k, v, dev: int, align: int):
    """(q.shape, k.shape, v.shape, dtype, dev) when q, k and v pass the checks that belong to the arrays rather than
    to their shapes: CuPy ndarrays, C-contiguous, on device `dev`, of one dtype, each base a multiple of `align`
    bytes. Otherwise None.

    What validate_attention concludes from shapes, dtype and device holds for every call with the same key, so a
    launcher can validate a problem once and keep what its launch needs under this key (attention_launch). A call
    whose arrays fail this quick test takes the full validation, which raises the precise error (or accepts an
    input this test is stricter about, such as a NumPy dtype in another byte order)."""
    if type(q) is _ndarray and type(k) is _ndarray and type(v) is _ndarray and _HAS_C_CONTIGUOUS:
        qd, kd, vd = q.data, k.data, v.data
        dtype = q.dtype
        if (q._c_contiguous and k._c_contiguous and v._c_contiguous and qd.device_id == dev and kd.device_id == dev
                and vd.device_id == dev and k.dtype is dtype and v.dtype is dtype
                and not (qd.ptr % align or kd.ptr % align or vd.ptr % align)):
            return q.shape, k.shape, v.shape, dtype, dev
    return None


_LAUNCH_CACHES: list = []


def launch_cache() -> dict:
    """A new dict for a launcher's prepared launches (attention_launch), known to clear_launch_caches."""
    cache: dict = {}
    _LAUNCH_CACHES.append(cache)
    return cache


def clear_launch_caches() -> None:
    """Forget every prepared launch, so that the next call of each problem is validated and prepared again (tests
    that pretend the GPU is another one use this; a real GPU does not change while a process runs)."""
    for cache in _LAUNCH_CACHES:
        cache.clear()


def attention_launch(cache: dict, prepare, q, k, v, align: int, options: tuple, return_lse: bool):
    """The call path of the dense attention launchers: allocate o (B, H, Tq, d), and lse (B, H, Tq) float32 when
    return_lse, launch the kernel on (q, k, v, o, lse or NULL) and return o, or (o, lse).

    prepare(q, k, v, dev, *options) validates the inputs, raising the error that names what is wrong, and returns
    (Launch, shape of o, dtype of o, shape of lse) for this problem. It runs on the first call of a problem; its
    result is kept in `cache` (made by launch_cache()) under (qkv_key(...), options), so a later call with the same
    shapes, dtype, device and options checks only what differs between arrays of equal shapes (qkv_key), allocates
    and launches. o and lse come from CuPy's allocator (aligned to 256 bytes or more), so kernels may store vectors.
    """
    dev = cp.cuda.runtime.getDevice() if _GPU_OK else current_device()
    key = qkv_key(q, k, v, dev, align)
    entry = None
    if key is not None:
        key = (key, options)
        try:
            entry = cache.get(key)
        except TypeError:  # an option that cannot be hashed (a tile given as a list): prepared on every call
            key = None
    if entry is None:
        entry = prepare(q, k, v, dev, *options)
        if key is not None:
            if len(cache) >= 1024:
                cache.clear()
            cache[key] = entry
    launch, o_shape, o_dtype, lse_shape = entry
    o = _ndarray(o_shape, o_dtype)
    if return_lse:
        lse = _ndarray(lse_shape, _FLOAT32)
        launch(cp.cuda.get_current_stream().ptr, q.data.ptr, k.data.ptr, v.data.ptr, o.data.ptr, lse.data.ptr)
        return o, lse
    launch(cp.cuda.get_current_stream().ptr, q.data.ptr, k.data.ptr, v.data.ptr, o.data.ptr, 0)
    return o


def check_index_range(x, name: str, lo: int, hi: int) -> None:
    """Raise ValueError unless every entry of the integer CuPy array x lies in [lo, hi].

    This reads two numbers back from the GPU, so it waits for the GPU (a synchronisation): launchers make it
    an opt-in check (check_lengths=True) and clamp indices inside the kernel, so that a bad value can never
    make a kernel read or write out of bounds even when the check is off.
    """
    if x.size == 0:
        return
    lo_hi = cp.stack((x.min(), x.max())).get()  # one device -> host copy
    if int(lo_hi[0]) < lo or int(lo_hi[1]) > hi:
        raise ValueError(f"{name} must lie in [{lo}, {hi}]; got values in [{int(lo_hi[0])}, {int(lo_hi[1])}]")
