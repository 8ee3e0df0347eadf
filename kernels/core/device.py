"""Finding the GPU and what the launchers need to know about it, read once per process and per device.

This module imports without CuPy, so that CPU-only machines can import the launchers, read their constants and
run the compile tests; anything that touches a GPU goes through `current_device()` or `require_gpu()` first,
which raise GPUNotAvailableError with the reason.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass

try:  # CuPy is only needed on a machine with a GPU.
    import cupy as cp
except ImportError:  # pragma: no cover - exercised on CPU-only machines
    cp = None

try:  # registers NumPy's "bfloat16" dtype, which CuPy's bfloat16 arrays use (CuPy >= 14)
    import ml_dtypes  # noqa: F401
except ImportError:  # pragma: no cover - float16/float32 work without it
    ml_dtypes = None

# Every kernel of the course needs at least Ampere (sm_80) unless its registry entry says otherwise: cp.async, bf16
# and mma.m16n8k16. The CUDA-core kernels of chapters 01-05 and 08-10 run from 7.5 (a T4), except in bfloat16.
DEFAULT_MIN_CC = (8, 0)
T4_CC = (7, 5)  # the oldest compute capability CUDA 13 compiles for, and the GPU of Colab, Kaggle and hosted CI
BF16_MIN_CC = (8, 0)  # bfloat16 conversions (cvt.rn.bf16.f32) and arithmetic need sm_80

# COURSE_SIMULATE_CC=7.5 makes this process see a T4 on a newer GPU: device_info() reports the capability, shared
# memory per block and SM count below, and the kernels are compiled to compute_XY PTX, which the real GPU's driver
# JIT-compiles, so that the code paths of the older GPU (its fallbacks included) really run (CONTRIBUTING.md).
SIMULATE_ENV = "COURSE_SIMULATE_CC"
SIMULATED_GPUS = {  # cc -> (name, SM count, shared memory per block after opt-in, L2 bytes)
    (7, 5): ("Tesla T4", 40, 64 * 1024, 4 * 2**20),
    (8, 0): ("NVIDIA A100", 108, 163 * 1024, 40 * 2**20),
    (8, 6): ("NVIDIA GeForce RTX 3090", 82, 99 * 1024, 6 * 2**20),
}

DEFAULT_SHARED_LIMIT = 48 * 1024  # shared memory (static + dynamic) a block may use without opting in
MAX_GRID_X = 2**31 - 1  # the launch limits of every CUDA GPU since compute capability 3.0
MAX_GRID_YZ = 65535
INT32_MAX = 2**31 - 1


class GPUNotAvailableError(RuntimeError):
    """Raised when a GPU launcher is called where no CUDA GPU (or no CuPy) is found."""


class UnsupportedDeviceError(RuntimeError):
    """Raised when the current GPU is older than a kernel's minimum compute capability."""


def simulated_cc() -> tuple[int, int] | None:
    """The compute capability named by $COURSE_SIMULATE_CC ("7.5" -> (7, 5)), or None where it is unset or empty.
    ValueError for a value that is not one of SIMULATED_GPUS."""
    text = os.environ.get(SIMULATE_ENV, "").strip()
    if not text:
        return None
    try:
        major, minor = (int(x) for x in text.split("."))
    except ValueError:
        major = minor = -1
    if (major, minor) not in SIMULATED_GPUS:
        known = ", ".join(f"{a}.{b}" for a, b in SIMULATED_GPUS)
        raise ValueError(f"{SIMULATE_ENV}={text!r}: simulated compute capabilities are {known}")
    return major, minor


def simulated_arch() -> str | None:
    """"compute_75" (the PTX target of every kernel build) while a capability is simulated, else None."""
    cc = simulated_cc()
    return None if cc is None else f"compute_{cc[0]}{cc[1]}"


def _simulated(info: "DeviceInfo", cc: tuple) -> "DeviceInfo":
    """What the launchers see of `info` while $COURSE_SIMULATE_CC names `cc`; UnsupportedDeviceError where the real
    GPU cannot run that capability's PTX (a driver JIT-compiles PTX for its own GPU's capability or an older one)."""
    if cc > info.cc:
        raise UnsupportedDeviceError(
            f"{SIMULATE_ENV}={cc[0]}.{cc[1]} cannot be simulated on {info.name} (compute capability "
            f"{info.cc[0]}.{info.cc[1]}): its driver JIT-compiles compute_{cc[0]}{cc[1]} PTX only on a GPU of that "
            f"capability or newer")
    name, sms, smem, l2 = SIMULATED_GPUS[cc]
    return DeviceInfo(id=info.id, name=f"{name} (simulated on {info.name})", cc=cc, sm_count=sms, smem_optin=smem,
                      l2_bytes=l2)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


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
    # The driver first: without one, installing CuPy would change nothing.
    if not _driver_library_loads():
        return "no NVIDIA driver / no GPU (the driver library libcuda cannot be loaded on this machine)"
    if cp is None:
        return "CuPy is not installed (pip install cupy-cuda13x, or cupy-cuda12x for a CUDA 12 driver)"
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
        cc_sim = simulated_cc()
        if cc_sim is not None:
            info = _simulated(info, cc_sim)
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


def check_dtype_capability(dtype, what: str, dev: int | None = None) -> None:
    """UnsupportedDeviceError naming the dtype, the capability it needs and the device's, where `dtype` (a name or a
    NumPy dtype) needs more than this GPU has: bfloat16 below 8.0. The launchers of kernels that run from 7.5 call it."""
    name = getattr(dtype, "name", str(dtype))
    if name == "bfloat16":
        check_compute_capability(BF16_MIN_CC, f"{what} in bfloat16", dev)


def check_shared_memory(nbytes: int, what: str, dev: int | None = None) -> None:
    """Raise ValueError when `nbytes` of shared memory per block is more than this GPU allows."""
    limit = max_shared_memory_optin() if dev is None else device_info(dev).smem_optin
    if nbytes > limit:
        raise ValueError(f"{what} needs {nbytes} bytes of shared memory per block; this GPU allows at most {limit}")
