"""The launch path of kernels.core (Kernel calls and prepared Launches): arguments packed into one buffer laid out
once per signature and handed to cuLaunchKernel.

The layout of the packed buffer must be the C ABI's layout of the kernel's parameters (each at its natural
alignment), or the kernel reads garbage. The CPU test checks the offsets against ctypes' own struct layout (the
C compiler's rules); the GPU tests check that a kernel launched through the packed path writes exactly what it
writes when CuPy launches it, for arguments whose alignment leaves gaps (a 4-byte value between 8-byte ones).
"""

import ctypes
import struct

import numpy as np
import pytest

from kernels import core
from kernels.core import launch

CTYPES = {"i": ctypes.c_int32, "I": ctypes.c_uint32, "q": ctypes.c_int64, "Q": ctypes.c_uint64,
          "f": ctypes.c_float, "d": ctypes.c_double, "h": ctypes.c_int16, "H": ctypes.c_uint16,
          "b": ctypes.c_int8, "B": ctypes.c_uint8, "?": ctypes.c_bool}


@pytest.mark.parametrize("codes", ["QQQQQiiifii", "iQ", "fdi", "bQhq", "?iQ", "Qq", "i", "HBdQ"])
def test_packed_offsets_follow_the_c_abi(codes):
    plan = launch._ArgBuffer(list(codes))
    fields = [(f"a{i}", CTYPES[c]) for i, c in enumerate(codes)]
    layout = type("Params", (ctypes.Structure,), {"_fields_": fields})
    base = ctypes.addressof(plan.buf)
    offsets = [plan.params[i] - base for i in range(len(codes))]
    assert offsets == [getattr(layout, name).offset for name, _ in fields]
    # and the values land where the pointers point
    values = [1 if c not in "fd?" else (True if c == "?" else 1.5) for c in codes]
    struct.pack_into(plan.fmt, plan.buf, 0, *values)
    for i, (c, v) in enumerate(zip(codes, values)):
        assert CTYPES[c].from_address(plan.params[i]).value == v


def test_argument_types_without_a_c_type_are_refused():
    with pytest.raises(TypeError, match=r"kernel argument 0 is a builtins.int; pass CuPy arrays, NumPy scalars"):
        launch._arg_buffer((int, np.int32))  # a Python int says nothing of its C type (int32? int64?)
    assert launch._arg_buffer((np.int32, np.float32)).fmt == "@if"


def test_numpy_arrays_go_by_value():
    """A NumPy array (a 128-byte CUtensorMap, say) is packed as its bytes where its parameter pointer points."""
    blob = np.arange(128, dtype=np.uint8)
    buf = launch._arg_buffer((np.int32, (np.ndarray, 128), np.int64))
    assert buf.blobs == (1,) and buf.fmt == "@i128sq"
    values = buf.values((np.int32(7), blob, np.int64(-1)))
    struct.pack_into(buf.fmt, buf.buf, 0, *values)
    assert ctypes.string_at(buf.params[1], 128) == blob.tobytes()
    assert ctypes.c_int64.from_address(buf.params[2]).value == -1


def test_fast_and_cupy_launch_write_the_same(gpu):
    cp = gpu
    kern = core.get_kernel("timing.cu", "flush_l2")
    fn = kern.raw.kernel  # CuPy's own launch of the same function
    for n, value in ((1, 7), (1000, 0xDEADBEEF), (4097, 3)):
        a = cp.zeros(5000, dtype=cp.uint32)
        b = cp.zeros(5000, dtype=cp.uint32)
        args_a = (a, np.int64(n), np.uint32(value))  # pointer, 8-byte int, 4-byte int
        kern((2,), (256,), args_a)
        fn((2,), (256,), (b, np.int64(n), np.uint32(value)))
        assert launch._BUFFERS[tuple(map(type, args_a))] is not None  # the packed path was taken
        assert bool((a == b).all()) and int(a[n - 1]) == value and int(a[n]) == 0


def test_fast_path_launches_on_the_current_stream(gpu, monkeypatch):
    cp = gpu
    kern = core.get_kernel("timing.cu", "flush_l2")
    x = cp.zeros(1 << 16, dtype=cp.uint32)
    streams = []

    class Recorder:  # cupy.cuda.driver, with launchKernel noting the stream it is given
        def __getattr__(self, name):
            return getattr(cp.cuda.driver, name)

        def launchKernel(self, *args):
            streams.append(args[8])
            return cp.cuda.driver.launchKernel(*args)

    monkeypatch.setattr(launch, "_driver", Recorder())
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        kern((64,), (256,), (x, np.int64(x.size), np.uint32(5)))
    s.synchronize()  # a non-blocking stream is not ordered with the default stream: the 5s land before the 6s
    kern((64,), (256,), (x, np.int64(x.size), np.uint32(6)))  # outside the block: the default stream again
    cp.cuda.Device().synchronize()
    assert streams == [s.ptr, cp.cuda.get_current_stream().ptr] and streams[0] != streams[1]
    assert int(x.min()) == 6
    kern((64,), (256,), (x, np.int64(x.size), np.uint32(7)), stream=s.ptr)  # an explicit stream (torch's, say)
    s.synchronize()
    assert streams[-1] == s.ptr and int(x.min()) == 7


def test_flash2_mma_grid_order_rule():
    """flash2_mma.grid_order: head-major without a mask, for large K+V and for grids of many waves; heads fastest under a
    causal mask while K and V of all heads fit in HEADS_FASTEST_MAX_KV_L2 times the L2 and the grid is at most
    HEADS_FASTEST_MAX_WAVES waves (both boundaries included)."""
    from kernels.flash import flash2_mma as M

    l2 = 50 * 2**20
    assert M.grid_order(False, 96, 1024, 64, 2, l2, 2.9)  # no mask: head-major whatever the size
    assert not M.grid_order(True, 96, 1024, 64, 2, l2, 2.9)  # llm.c's shape, 24 MiB of K and V: heads fastest
    assert not M.grid_order(True, 128, 2048, 128, 2, l2, 7.75)  # 128 MiB in 7.75 waves: heads fastest
    assert M.grid_order(True, 128, 4096, 64, 2, l2, 15.5)  # 128 MiB again, but 15.5 waves: head-major
    assert M.grid_order(True, 128, 8192, 64, 2, l2, 3.0)  # 256 MiB: head-major
    tk = M.HEADS_FASTEST_MAX_KV_L2 * l2 // (2 * 64 * 2)  # one head, d=64, 16-bit: K+V exactly at the limit
    assert not M.grid_order(True, 1, tk, 64, 2, l2, 1.0)
    assert M.grid_order(True, 1, tk + 1, 64, 2, l2, 1.0)
    assert not M.grid_order(True, 1, 1024, 64, 2, l2, M.HEADS_FASTEST_MAX_WAVES)
    assert M.grid_order(True, 1, 1024, 64, 2, l2, M.HEADS_FASTEST_MAX_WAVES + 0.01)


def test_flash2_mma_loop_rule():
    """MmaTile.loop mirrors the kernel's IlpBuild: the ILP loop where the register cap 65536 / (threads MIN_BLOCKS)
    reaches ILP_MIN_REGS, unless the tile's ILP forces one; a forced loop reaches the compiler as -DILP_MODE."""
    from kernels.flash import flash2_mma as M

    assert all(t.loop == "ILP" for t in (*M.TILES.values(), *M.VARLEN_TILES.values()))
    assert M.MmaTile(64, 4, 2, 3).loop == "row by row"  # 170 registers a thread: below the threshold
    assert M.MmaTile(64, 4, 2, 2).loop == "ILP"  # 256
    assert M.MmaTile(64, 8, 2, 1).loop == "ILP" and M.MmaTile(64, 8, 2, 2).loop == "row by row"  # 256, 128
    assert M.MmaTile(64, 4, 2, 2, False).loop == "row by row" and M.MmaTile(64, 4, 2, 3, True).loop == "ILP"
    assert M.MmaTile(64, 4, 2, 2).defines == M.DEFINES
    assert "-DILP_MIN_REGS=%d" % M.ILP_MIN_REGS in M.DEFINES
    assert M.MmaTile(64, 4, 2, 2, False).defines == M.DEFINES + ("-DILP_MODE=0",)
    assert M.MmaTile(64, 4, 2, 2, True).defines == M.DEFINES + ("-DILP_MODE=1",)
    with pytest.raises(ValueError, match=r"ILP='yes' must be None, True or False"):
        M.MmaTile(64, 4, 2, 2, "yes").check(64)


def test_flash2_mma_fused_rule():
    """MmaTile.loop_for mirrors the kernel's FusedBuild: an ILP build with D <= FUSED_MAX_D runs the fused loop, which
    reaches the compiler as -DFUSED_MAX_D; a row-by-row build stays row by row at any D."""
    from kernels.flash import flash2_mma as M

    assert "-DFUSED_MAX_D=%d" % M.FUSED_MAX_D in M.DEFINES
    assert [M.TILES[D].loop_for(D) for D in M.HEAD_DIMS] == ["fused ILP", "fused ILP", "ILP", "ILP", "ILP"]
    assert M.MmaTile(64, 4, 2, 3).loop_for(64) == "row by row"
    assert M.MmaTile(64, 4, 2, 2, False).loop_for(32) == "row by row"
    assert M.MmaTile(64, 4, 2, 1, True).loop_for(128) == "ILP"


def test_prepared_launch_matches_kernel_call(gpu):
    """core.Launch (pointers packed per call, constants packed once) writes what a Kernel call writes."""
    cp = gpu
    kern = core.get_kernel("timing.cu", "flush_l2")
    dev = core.current_device()
    for n, value in ((1, 7), (1000, 0xDEADBEEF), (4097, 3)):
        prepared = core.Launch(kern, (2,), (256,), 0, 1, (np.int64(n), np.uint32(value)), dev)
        a = cp.zeros(5000, dtype=cp.uint32)
        b = cp.zeros(5000, dtype=cp.uint32)
        prepared(cp.cuda.get_current_stream().ptr, a.data.ptr)
        kern((2,), (256,), (b, np.int64(n), np.uint32(value)))
        assert bool((a == b).all()) and int(a[n - 1]) == value and int(a[n]) == 0
    with pytest.raises(TypeError, match="Launch takes NumPy scalars after the pointers; got int"):
        core.Launch(kern, (1,), (32,), 0, 1, (5,), dev)


FAST = ("flash2_fp32", "flash2_wmma", "flash2_mma")  # the launchers that go through core.attention_launch


@pytest.mark.parametrize("name", FAST)
def test_prepared_calls_still_check_every_call(gpu, name):
    """Once a problem's launch is prepared, a call with arrays of the same shapes is still checked for what differs
    between such arrays (contiguity, dtype, alignment, being a CuPy array), and new data gives new results."""
    import kernels
    from reference import attention

    cp = gpu
    var = kernels.REGISTRY[name]
    dtype = var.dtypes[0]
    tol = "float32" if dtype == "float32" else dtype
    rng = np.random.default_rng(1)
    shape = (2, 3, 40, 64)
    for seed in range(3):  # the first call prepares the launch, the others reuse it on new arrays
        qkv = [rng.standard_normal(shape).astype(dtype) for _ in range(3)]
        o, lse = var.forward(*map(cp.asarray, qkv), causal=bool(seed % 2), return_lse=True)
        ref, ref_lse = attention(*(x.astype(np.float64) for x in qkv), causal=bool(seed % 2), return_lse=True)
        assert kernels.check(o, ref, tol).ok and kernels.check(lse, ref_lse, tol).ok
    q, k, v = (cp.asarray(x) for x in qkv)
    with pytest.raises(ValueError, match=r"k must be C-contiguous"):
        var.forward(q, cp.empty((2, 3, 80, 64), dtype=dtype)[:, :, ::2], v)
    with pytest.raises(TypeError, match=r"v must be a cupy\.ndarray"):
        var.forward(q, k, v.get())
    with pytest.raises(TypeError, match=r"q, k, v must share one dtype|has dtype"):
        var.forward(q, k, v.astype(np.float64))
    # the same shape at a base address 2 bytes past a 16-byte boundary
    buf = cp.empty(q.size + 8, dtype=dtype)
    shifted = buf[1:1 + q.size].reshape(shape)
    shifted[...] = q
    if var.name == "flash2_fp32":  # any address: the kernel reads scalars instead of float4 vectors there
        assert kernels.check(var.forward(shifted, k, v, causal=True), var.forward(q, k, v, causal=True),
                             "float32").ok
    else:
        with pytest.raises(ValueError, match=r"q starts at address .* not 16-byte aligned"):
            var.forward(shifted, k, v)


def test_blocks_per_sm_is_the_most_that_fit(gpu):
    """core.blocks_per_sm of flash2_mma's default builds: that many blocks fit an SM's registers, shared memory and
    threads, one more does not (or 32 is reached); grid_waves of exactly that many blocks per SM is one wave."""
    import kernels
    from kernels import core
    from kernels.flash import flash2_mma as M

    info = kernels.device_info()
    for D in (64, 128):
        b = M.build(D, None, "float16")
        n = core.blocks_per_sm(b.kernel, b.threads, b.smem)
        attrs = b.kernel.raw.attributes
        regs = core.ceil_div(attrs["num_regs"] * 32, 256) * 256 * (b.threads // 32)  # per block
        smem = attrs["shared_size_bytes"] + b.smem + 1024
        fits = lambda m: m * regs <= 65536 and m * smem <= info.smem_optin + 1024 and m * b.threads <= 2048  # noqa
        assert 1 <= n <= 32 and fits(n) and (n == 32 or not fits(n + 1))
        assert M.grid_waves(b, info.sm_count * n) == 1.0
