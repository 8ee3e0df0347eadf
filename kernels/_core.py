"""What every launcher shares: compiling a .cu file once, checking the device, validating inputs.

This module imports without CuPy (so that CPU-only machines can import the launchers, read their
constants and run the compile tests); anything that touches a GPU calls `require_gpu()` first.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import re
from pathlib import Path

try:  # CuPy is only needed on a machine with a GPU.
    import cupy as cp
except ImportError:  # pragma: no cover - exercised on CPU-only machines
    cp = None

try:  # registers NumPy's "bfloat16" dtype, which CuPy's bfloat16 arrays use (CuPy >= 14)
    import ml_dtypes  # noqa: F401
except ImportError:  # pragma: no cover - float16/float32 work without it
    ml_dtypes = None

KERNEL_DIR = Path(__file__).resolve().parent

# The one place where NVRTC options live. No fast-math: the float32 kernels are held to 1e-5.
NVRTC_OPTIONS = ("--std=c++17",)

# Every kernel of the course needs at least Ampere (sm_80): cp.async, bf16 and mma.m16n8k16.
DEFAULT_MIN_CC = (8, 0)


class GPUNotAvailableError(RuntimeError):
    """Raised when a GPU launcher is called where no CUDA GPU (or no CuPy) is found."""


class UnsupportedDeviceError(RuntimeError):
    """Raised when the current GPU is older than a kernel's minimum compute capability."""


def gpu_unavailable_reason() -> str | None:
    """None where a CUDA GPU can be used through CuPy, otherwise a sentence saying why not."""
    if cp is None:
        return "CuPy is not installed (pip install cupy-cuda13x, or cupy-cuda12x for a CUDA 12 driver)"
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device node, ...
        return f"no CUDA GPU found ({type(e).__name__}: {e})"
    if n == 0:
        return "no CUDA GPU found (the CUDA runtime reports 0 devices)"
    return None


def require_gpu() -> None:
    reason = gpu_unavailable_reason()
    if reason is not None:
        raise GPUNotAvailableError(reason)


def device_compute_capability() -> tuple[int, int]:
    """(major, minor) of the current device."""
    require_gpu()
    cc = cp.cuda.Device().compute_capability  # e.g. "90"
    return int(cc[:-1]), int(cc[-1])


def gpu_name() -> str:
    require_gpu()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def check_compute_capability(min_cc: tuple[int, int], what: str) -> None:
    """Raise UnsupportedDeviceError naming `what`, the device's capability and the minimum."""
    have = device_compute_capability()
    if have < tuple(min_cc):
        raise UnsupportedDeviceError(
            f"{what} needs a GPU of compute capability >= {min_cc[0]}.{min_cc[1]}; "
            f"this GPU ({gpu_name()}) has {have[0]}.{have[1]}"
        )


def max_shared_memory_optin() -> int:
    """Bytes of shared memory one block may use once it opts in (227 KB on an H100)."""
    require_gpu()
    return int(cp.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])


def set_dynamic_shared_memory(kernel, nbytes: int, what: str) -> None:
    """Allow `kernel` to launch with `nbytes` of dynamic shared memory, or raise naming the limit."""
    limit = max_shared_memory_optin()
    if nbytes > limit:
        raise ValueError(
            f"{what} needs {nbytes} bytes of shared memory per block; this GPU allows at most {limit}"
        )
    if nbytes > 48 * 1024:  # above the default limit a kernel must ask explicitly
        kernel.max_dynamic_shared_size_bytes = nbytes


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


@functools.lru_cache(maxsize=None)
def load_module(filename: str, name_expressions: tuple[str, ...] = (), defines: tuple[str, ...] = ()):
    """Compile kernels/<filename> with NVRTC through CuPy, once per process, and return the RawModule.

    `defines` are extra "-DNAME=VALUE" options; `name_expressions` list template instantiations
    (for example "flash_fwd<64>") that the caller will fetch with module.get_function.
    """
    require_gpu()
    source = kernel_path(filename).read_text()
    options = NVRTC_OPTIONS + tuple(defines)
    module = cp.RawModule(code=source, options=options, name_expressions=name_expressions or None)
    module.compile()
    return module


def get_kernel(filename: str, name: str, name_expressions: tuple[str, ...] = (), defines: tuple[str, ...] = ()):
    return load_module(filename, name_expressions, defines).get_function(name)


def kernel_source(filename: str, name: str | None = None) -> str:
    """The text of kernels/<filename>, or of one function in it (from its signature to its closing brace).

    Notebooks show kernels through this, so the code a learner reads is the code that runs.
    """
    text = kernel_path(filename).read_text()
    if name is None:
        return text
    m = re.search(r"^[^\n;{}]*\b" + re.escape(name) + r"\s*\(", text, re.M)
    if m is None:
        raise ValueError(f"no function {name!r} in {filename}")
    start = m.start()
    # Include the comment block immediately above the function, if any.
    before = text[:start].rstrip("\n").split("\n")
    lead = []
    while before and before[-1].lstrip().startswith(("//", "template", "extern", "__global__")):
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


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------------
# Input validation for the launcher contract (see GUIDE.md).
# ---------------------------------------------------------------------------------------------

INT32_MAX = 2**31 - 1


def _dtype_name(dt) -> str:
    import numpy as np

    return np.dtype(dt).name


def check_array(x, name: str, *, dtypes, ndim: int | None = None) -> None:
    """x must be a C-contiguous CuPy array of one of `dtypes` on the current device."""
    require_gpu()
    if not isinstance(x, cp.ndarray):
        raise TypeError(
            f"{name} must be a cupy.ndarray on the GPU; got {type(x).__module__}.{type(x).__name__} "
            f"(move it with cupy.asarray({name}))"
        )
    allowed = [_dtype_name(d) for d in dtypes]
    if x.dtype.name not in allowed:
        raise TypeError(f"{name} has dtype {x.dtype.name}; this kernel takes {', '.join(allowed)}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D; got shape {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError(
            f"{name} must be C-contiguous; got a strided view with shape {x.shape} and strides "
            f"{x.strides} (use cupy.ascontiguousarray({name}))"
        )
    if x.device.id != cp.cuda.Device().id:
        raise ValueError(f"{name} is on device {x.device.id}, but the current device is {cp.cuda.Device().id}")


def validate_attention(q, k, v, *, dtypes, max_d: int, min_cc=DEFAULT_MIN_CC, what: str,
                       d_multiple: int = 1, scale=None):
    """Validate q, k, v for an attention launcher; return (B, H, Tq, Tk, d, scale).

    Raises TypeError / ValueError naming the argument, its value and the limit, and
    UnsupportedDeviceError when the GPU is too old for the kernel.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_array(x, name, dtypes=dtypes, ndim=4)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {k.shape} and v {v.shape}")
    B, H, Tq, d = q.shape
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != d:
        raise ValueError(f"q {q.shape} and k {k.shape} must agree on B, H and d")
    Tk = k.shape[2]
    if min(B, H, Tq, Tk, d) < 1:
        raise ValueError(f"every dimension must be >= 1; got q {q.shape}, k {k.shape}")
    if d > max_d:
        raise ValueError(f"head dimension d={d} is larger than {what} supports (d <= {max_d})")
    if d % d_multiple:
        raise ValueError(f"head dimension d={d} must be a multiple of {d_multiple} for {what}")
    for name, x in (("q", q), ("k", k)):
        if x.size > INT32_MAX:
            raise ValueError(f"{name} has {x.size} elements; {what} indexes with 32-bit integers (<= {INT32_MAX})")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    else:
        scale = float(scale)
        if not math.isfinite(scale):
            raise ValueError(f"scale must be a finite number; got {scale}")
    check_compute_capability(min_cc, what)
    return B, H, Tq, Tk, d, scale
