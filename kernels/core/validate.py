"""Checking a launcher's inputs before anything is launched: the launcher contract's errors (CONTRIBUTING.md, "The
launcher contract"), each naming the argument, its value and the limit.

Everything here runs on the call path, so the common case is a handful of attribute reads and comparisons; the
messages are only built when something is wrong.
"""

from __future__ import annotations

import functools
import math
import operator

import numpy as np

from .device import (_DEVICE_INFO, DEFAULT_MIN_CC, INT32_MAX, MAX_GRID_X, check_compute_capability, cp, current_device,
                     device_info, ml_dtypes)

# The dtypes the launchers name, by NumPy dtype (bfloat16 where ml_dtypes registers it).
DTYPE_NAMES = {np.dtype(n): n for n in ("float16", "float32", "float64", "int32")}
if ml_dtypes is not None:
    DTYPE_NAMES[np.dtype("bfloat16")] = "bfloat16"


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
HAS_C_CONTIGUOUS = cp is not None and hasattr(cp.ndarray, "_c_contiguous")
if HAS_C_CONTIGUOUS:
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
    dev = current_device()
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


def qkv_key(q, k, v, dev: int, align: int):
    """(q.shape, k.shape, v.shape, dtype, dev) when q, k and v pass the checks that belong to the arrays rather than
    to their shapes: CuPy ndarrays, C-contiguous, on device `dev`, of one dtype, each base a multiple of `align`
    bytes. Otherwise None.

    What validate_attention concludes from shapes, dtype and device holds for every call with the same key, so a
    launcher can validate a problem once and keep what its launch needs under this key (attention_launch). A call
    whose arrays fail this quick test takes the full validation, which raises the precise error (or accepts an
    input this test is stricter about, such as a NumPy dtype in another byte order)."""
    if type(q) is _ndarray and type(k) is _ndarray and type(v) is _ndarray and HAS_C_CONTIGUOUS:
        qd, kd, vd = q.data, k.data, v.data
        dtype = q.dtype
        if (q._c_contiguous and k._c_contiguous and v._c_contiguous and qd.device_id == dev and kd.device_id == dev
                and vd.device_id == dev and k.dtype is dtype and v.dtype is dtype
                and not (qd.ptr % align or kd.ptr % align or vd.ptr % align)):
            return q.shape, k.shape, v.shape, dtype, dev
    return None


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
