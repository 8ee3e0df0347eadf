"""Launching a kernel: one path from Python to cuLaunchKernel, for CuPy arrays and for raw device pointers.

    kern = get_kernel("flash2.cu", "flash2_forward<64, 64, 64, 4, 8>", name_expressions=(...), shared_mem=70_000)
    kern(grid, block, (q, k, v, o, NULL, np.int32(T), ...), shared_mem=nbytes)          # a one-off launch
    launch = Launch(kern, grid, block, smem, n_ptrs=5, tail=(np.int32(T), ...), dev=dev)  # a prepared launch
    launch(stream_ptr, q_ptr, k_ptr, v_ptr, o_ptr, 0)

Both go through one _ArgBuffer: the kernel's arguments laid out once per tuple of argument types at their C
alignment, an array of pointers into them (what cuLaunchKernel takes), one struct.pack_into per call, and the driver
call. CuPy's own RawKernel call builds that array anew on every call, inspecting each argument: for a launcher of
eleven arguments that took about 7 microseconds, half of the launcher's host time. The driver copies the values at
the launch, so a buffer can be reused right after; a lock keeps two threads from packing into it at once.

A prepared Launch also packs its trailing arguments (sizes, scales, flags: fixed by the problem) once, so a call
packs only the pointers. A launcher keeps one Launch per problem (attention_launch below); a launcher whose buffers
are not CuPy arrays (torch tensors, kernels/pytorch/torch_ops.py) uses the same Launch with their data pointers and
torch's stream.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import threading

import numpy as np

from .compile import load_module
from .device import DEFAULT_SHARED_LIMIT, check_shared_memory, cp, current_device
from .validate import qkv_key


class Kernel:
    """One kernel of a kernel file, ready to launch (see the module's docstring).

    The file is compiled once per process (load_module). On each device the kernel is configured once, the first
    time it is launched there: a kernel that needs more than 48 KB of dynamic shared memory opts in up to
    `shared_mem` (after checking it against the device's limit), and `carveout` (percent of the SM's L1/shared
    storage given to shared memory) is set.
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

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0, stream: int | None = None) -> None:
        """Launch on the current device: `args` are CuPy arrays (passed as their device pointers), NumPy scalars
        (np.int32, np.float32, np.uint64 for a raw device pointer, ...) and NumPy arrays passed by value (their bytes:
        a CUtensorMap, a struct); `stream` is a raw cudaStream_t handle, by default CuPy's current stream."""
        dev = cp.cuda.runtime.getDevice()
        fn = self._fn.get(dev) or self._configure(dev)
        types = tuple(map(type, args))
        if _BLOB in types:  # a NumPy array passed by value: its layout depends on its size
            types = tuple((t, a.nbytes) if t is _BLOB else t for t, a in zip(types, args))
        buf = _BUFFERS.get(types) or _arg_buffer(types)
        buf.launch(fn.ptr, grid, block, shared_mem, cp.cuda.get_current_stream().ptr if stream is None else stream,
                   buf.values(args))

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


@functools.lru_cache(maxsize=None)
def get_kernel(filename: str, name: str, *, name_expressions: tuple = (), defines: tuple = (),
               shared_mem: int = 0, carveout: int | None = None, arch: str | None = None) -> Kernel:
    """The Kernel `name` of the kernel file `filename` (one object per build; see Kernel; arch: see load_module)."""
    return Kernel(filename, name, name_expressions=name_expressions, defines=defines, shared_mem=shared_mem,
                  carveout=carveout, arch=arch)


# ---------------------------------------------------------------------------------------------
# The argument buffer and the driver call
# ---------------------------------------------------------------------------------------------

_ARG_CODES = {np.int32: "i", np.uint32: "I", np.int64: "q", np.uint64: "Q", np.float32: "f", np.float64: "d",
              np.int16: "h", np.uint16: "H", np.int8: "b", np.uint8: "B", np.bool_: "?"}
if np.dtype(np.uintp).itemsize == 8:
    _ARG_CODES[np.uintp] = "Q"
_PTR = "Q" if np.dtype(np.uintp).itemsize == 8 else "I"  # how a device pointer is packed
_BLOB = np.ndarray  # a host array passed by value: the driver copies each parameter's bytes from where its pointer
#                    points, so a blob needs no alignment in this buffer (the kernel's own layout is the driver's job)
_driver = cp.cuda.driver if cp is not None else None


def _layout(codes: list) -> tuple:
    """(struct format, byte offset of each argument) of kernel arguments with these struct codes, each at its C
    alignment: the layout of the kernel's parameters."""
    return "@" + "".join(codes), [struct.calcsize("@" + "".join(codes[: i + 1])) - struct.calcsize(c)
                                  for i, c in enumerate(codes)]


class _ArgBuffer:
    """The kernel parameters of one tuple of argument types: a buffer holding the values at their C offsets, the
    array of pointers into it that cuLaunchKernel takes, and the lock that guards the buffer."""

    __slots__ = ("fmt", "arrays", "blobs", "buf", "params", "params_ptr", "lock")

    def __init__(self, codes: list, arrays: tuple = (), blobs: tuple = ()):
        self.fmt, offsets = _layout(codes)  # native sizes and alignment: the C ABI of the kernel's parameters
        self.arrays = arrays  # positions of the CuPy arrays (passed as their device pointers)
        self.blobs = blobs  # positions of the NumPy arrays passed by value (as their bytes)
        self.buf = ctypes.create_string_buffer(max(struct.calcsize(self.fmt), 8))
        base = ctypes.addressof(self.buf)
        self.params = (ctypes.c_void_p * max(len(codes), 1))(*(base + off for off in offsets))
        self.params_ptr = ctypes.addressof(self.params)
        self.lock = threading.Lock()

    def values(self, args: tuple) -> tuple:
        """The values to pack: args with each CuPy array replaced by its device pointer, each blob by its bytes."""
        if not (self.arrays or self.blobs):
            return args
        values = list(args)
        for i in self.arrays:
            values[i] = values[i].data.ptr
        for i in self.blobs:
            values[i] = values[i].tobytes()
        return values

    def launch(self, fn_ptr: int, grid: tuple, block: tuple, smem: int, stream_ptr: int, values,
               fmt: str | None = None) -> None:
        """Pack `values` (with `fmt`, by default the whole layout) from the buffer's start and launch."""
        ng, nb = len(grid), len(block)
        with self.lock:
            struct.pack_into(fmt or self.fmt, self.buf, 0, *values)
            _driver.launchKernel(fn_ptr, grid[0], grid[1] if ng > 1 else 1, grid[2] if ng > 2 else 1,
                                 block[0], block[1] if nb > 1 else 1, block[2] if nb > 2 else 1,
                                 smem, stream_ptr, self.params_ptr, 0)


_BUFFERS: dict = {}  # tuple of argument types -> its _ArgBuffer


def _arg_buffer(types: tuple) -> _ArgBuffer:
    """The _ArgBuffer for this tuple of argument types (a blob appears as (np.ndarray, its size in bytes)), made once;
    TypeError for a type that is not a CuPy array, a NumPy scalar or a NumPy array (a Python int says nothing of its C
    type)."""
    codes, arrays, blobs = [], [], []
    ndarray = cp.ndarray if cp is not None else None
    for i, t in enumerate(types):
        if t is ndarray:
            codes.append(_PTR)
            arrays.append(i)
        elif t in _ARG_CODES:
            codes.append(_ARG_CODES[t])
        elif isinstance(t, tuple) and t[0] is _BLOB:
            codes.append(f"{t[1]}s")
            blobs.append(i)
        else:
            raise TypeError(f"kernel argument {i} is a {t.__module__}.{t.__name__}; pass CuPy arrays, NumPy scalars "
                            f"(np.int32, np.float32, np.uint64 for a raw device pointer, ...) and NumPy arrays by value")
    buf = _BUFFERS[types] = _ArgBuffer(codes, tuple(arrays), tuple(blobs))
    return buf


class Launch:
    """One kernel launch prepared for one problem on one device; a call supplies the pointers and the stream.

        launch = Launch(kernel, grid, block, smem, n_ptrs=5, tail=(np.int32(T), np.float32(scale), ...), dev=dev)
        launch(stream_ptr, q_ptr, k_ptr, v_ptr, o_ptr, 0)      # kernel(q, k, v, o, NULL, T, scale, ...)

    A kernel's leading arguments are the device pointers, which change from call to call, and its trailing ones are
    sizes, scales and flags, which are fixed by the problem. The grid, block and shared memory are worked out once,
    the trailing arguments packed once into this launch's own _ArgBuffer, and the kernel configured on the device
    once; a call packs the pointers and launches.
    """

    __slots__ = ("grid", "block", "smem", "fn_ptr", "n_ptrs", "ptr_fmt", "args")

    def __init__(self, kernel: Kernel, grid: tuple, block: tuple, smem: int, n_ptrs: int, tail: tuple, dev: int):
        codes = [_PTR] * n_ptrs
        for x in tail:
            if type(x) not in _ARG_CODES:
                raise TypeError(f"Launch takes NumPy scalars after the pointers; got {type(x).__name__}")
            codes.append(_ARG_CODES[type(x)])
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.block = tuple(block) + (1,) * (3 - len(block))
        self.smem = int(smem)
        self.fn_ptr = kernel.function(dev).ptr
        self.n_ptrs = n_ptrs
        self.ptr_fmt = "@" + _PTR * n_ptrs
        self.args = _ArgBuffer(codes)
        struct.pack_into(self.args.fmt, self.args.buf, 0, *((0,) * n_ptrs + tuple(tail)))

    def __call__(self, stream_ptr: int, *ptrs: int) -> None:
        self.args.launch(self.fn_ptr, self.grid, self.block, self.smem, stream_ptr, ptrs, self.ptr_fmt)


# ---------------------------------------------------------------------------------------------
# The call path of the dense attention launchers
# ---------------------------------------------------------------------------------------------

_ndarray = cp.ndarray if cp is not None else None
_FLOAT32 = np.dtype(np.float32)
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
    dev = current_device()
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


# Arguments that launchers pass on every call, made once (a NumPy scalar costs a fraction of a microsecond to build).
NULL = np.uintp(0)  # a null pointer argument
I32 = (np.int32(0), np.int32(1))  # I32[bool(flag)]: a 0/1 flag argument
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
