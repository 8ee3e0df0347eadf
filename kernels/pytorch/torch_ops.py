"""The course's kernels as PyTorch custom operators, with autograd (notebook 12).

    from kernels.pytorch import torch_ops
    o = torch_ops.attention(q, k, v, causal=True)         # q, k, v: CUDA tensors (B, H, T, d), float16/bfloat16
    y = torch_ops.masked_softmax(x, lengths)              # x: CUDA float32 (..., cols), lengths int32 (rows,)
    o.sum().backward()                                    # flash2_mma_bwd / softmax_bwd kernels

What runs where: the attention operators run the mma.sync kernels of kernels/flash/ (compute capability 8.0 and up)
except on a Hopper (9.x) at d = 64 and 128, where the backward always runs kernels/hopper/hopper_attn_bwd.cu and the
forward runs kernels/hopper/hopper_attn.cu (hopper_fa3) at the lengths where the stored H100 measurements found it
faster than flash2_mma (HOPPER_FWD_MIN_T); forward_kernel(q, Tk, causal) and backward_kernel(q) say which.

The operators (namespace "course", each registered with torch.library.custom_op, a fake implementation for
torch.compile and meta tensors, and an autograd formula; each passes torch.library.opcheck):

    course::flash_attn_fwd(q, k, v, causal, scale) -> (o, lse)     kernels/flash/flash2_mma.cu, lse float32 (B, H, Tq);
        on a Hopper at d = 64 and 128 and long enough sequences kernels/hopper/hopper_attn.cu (forward_kernel)
    course::flash_attn_bwd(do, q, k, v, o, lse, dlse, causal, scale) -> (dq, dk, dv)   kernels/flash/flash2_mma_bwd.cu;
        on a Hopper at d = 64 and 128 kernels/hopper/hopper_attn_bwd.cu (backward_kernel(q) says which)
    course::masked_softmax(x, lengths) -> y                        kernels/basics/softmax.cu (softmax_masked_lengths[_warp])
    course::masked_softmax_bwd(y, dy, lengths) -> dx               kernels/basics/softmax_bwd.cu

The bridge (one place, `_on_torch_stream`): tensors cross to CuPy and back through DLPack (no copy: the CuPy array
and the tensor share memory); every launch goes on torch's current stream, because the launchers launch on CuPy's
current stream and we enter cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream) around them; and
every allocation, ours or a launcher's, comes from torch's caching allocator (outputs are torch.empty; inside the
bridge CuPy's allocator is pointed at torch.empty too), so memory is reused the way the rest of the model's is and
is freed in torch's stream order.

The two forward operators, which a model calls at every step, take a shorter road with the same three properties:
torch allocates their outputs, and the kernel is launched directly on the tensors' device pointers and on torch's
current stream (the attention operator through the same prepared kernels.core.Launch as flash2_mma.forward, the
softmax through a kernels.core.Kernel call with torch's stream), after torch-side checks that mirror the launcher's. No DLPack crossing,
no stream or allocator context: on the H100 the attention operator's body went from about 110 us of host time through
the bridge to 27-52 us (kernels/bench/torch_ops.py measures it). Where forward_kernel picks hopper_attn, the forward
takes the bridge instead (hopper_attn.forward builds its TMA descriptors from CuPy arrays), as the backward does.

Importing this module needs neither torch nor a GPU: without torch, `AVAILABLE` is False and nothing is registered
(kernels/pytorch/__init__.py does not import it; import it yourself).
"""

import math
import warnings
from typing import Optional

import numpy as np

from ..flash import flash2_mma, flash2_mma_bwd
from ..basics import softmax, softmax_bwd
from ..core import DEFAULT_MIN_CC, INT32_MAX, Launch, check_compute_capability, cp, device_info
from ..hopper import hopper_attn, hopper_attn_bwd

try:
    import torch
except ImportError:  # pragma: no cover - a machine without torch
    torch = None

AVAILABLE = torch is not None
NAMESPACE = "course"
ATTN_DTYPES = ("float16", "bfloat16")
MAX_D = flash2_mma_bwd.MAX_D
D_MULTIPLE = flash2_mma_bwd.D_MULTIPLE
ALIGN = flash2_mma.ALIGN

__all__ = ["AVAILABLE", "attention", "attention_with_lse", "backward_kernel", "forward_kernel", "masked_softmax",
           "to_cupy", "to_torch"]


# ---------------------------------------------------------------------------------------------------------
# The bridge
# ---------------------------------------------------------------------------------------------------------

_TORCH_SETS: dict = {}  # tuple of dtype names -> frozenset of torch dtypes


def _torch_set(dtypes: tuple) -> frozenset:
    out = _TORCH_SETS[dtypes] = frozenset(getattr(torch, n) for n in dtypes)
    return out


def _check_tensor(t, name: str, dtypes: tuple, ndim: int | None = None) -> None:
    """A clear TypeError / ValueError for what the kernels cannot take: not a tensor, not on a CUDA device, another
    dtype, another rank, a non-contiguous layout."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} is on device {t.device}; these operators run on CUDA tensors (move it with "
                         f"{name}.cuda())")
    if t.dtype not in (_TORCH_SETS.get(dtypes) or _torch_set(dtypes)):
        raise TypeError(f"{name} has dtype {t.dtype}; this operator takes {', '.join(dtypes)}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D; got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous; got shape {tuple(t.shape)} with strides {t.stride()} "
                         f"(call {name}.contiguous())")


_BF16 = None


class _Export:
    """What cupy.from_dlpack is handed for a tensor: the tensor's own DLPack export, asked for with stream=-1 ("the
    consumer orders the work itself"). Without it, the DLPack handshake makes torch build a stream object and an event
    and make one stream wait on the other at every crossing; inside the bridge both sides already use one stream.
    A tensor that requires grad is detached first (DLPack refuses it; no data moves either way)."""
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t.detach() if t.requires_grad else t

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return self.t.__dlpack__(stream=-1, max_version=max_version)


def to_cupy(t):
    """The CuPy array sharing t's memory (DLPack; no copy). bfloat16 crosses as int16 bits and is viewed back as
    NumPy's bfloat16 (ml_dtypes), which the launchers take. Call inside _on_torch_stream (stream order)."""
    global _BF16
    if t.dtype == torch.bfloat16:
        if _BF16 is None:
            import numpy as np

            _BF16 = np.dtype("bfloat16")
        return cp.from_dlpack(_Export(t.view(torch.int16))).view(_BF16)
    return cp.from_dlpack(_Export(t))


_TORCH_DTYPES = {}  # CuPy dtype name -> torch dtype
_ALLOCATED: dict = {}  # device pointer -> the uint8 tensor a launcher's allocation came from (inside the bridge)


def to_torch(x):
    """The tensor sharing the CuPy array x's memory, no copy: for an array a launcher allocated inside the bridge, a
    typed tensor on the storage of the torch tensor it was allocated from; otherwise torch.from_dlpack."""
    t = _ALLOCATED.get(x.data.ptr)
    if t is not None and x.flags.c_contiguous:
        if not _TORCH_DTYPES:
            _TORCH_DTYPES.update(float16=torch.float16, bfloat16=torch.bfloat16, float32=torch.float32,
                                 int32=torch.int32)
        out = torch.empty(0, dtype=_TORCH_DTYPES[x.dtype.name], device=t.device)
        return out.set_(t.untyped_storage(), 0, x.shape)  # a tensor of its own (not a view) on t's memory
    if x.dtype.name == "bfloat16":
        return torch.from_dlpack(x.view(cp.int16)).view(torch.bfloat16)
    return torch.from_dlpack(x)


def _torch_malloc(nbytes: int):
    """CuPy allocator that takes its memory from torch's caching allocator (on torch's current stream): the
    CuPy memory object keeps the uint8 tensor alive, and the tensor goes back to torch's cache when it dies."""
    t = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=_ALLOC_DEVICE[0])
    _ALLOCATED[t.data_ptr()] = t
    return cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(t.data_ptr(), nbytes, t, t.device.index), 0)


_ALLOC_DEVICE = ["cuda"]
_STREAMS: dict = {}  # torch stream handle -> cupy.cuda.ExternalStream


class _on_torch_stream:
    """with _on_torch_stream(device_index): launches go on torch's current stream of that device, and CuPy
    allocations come from torch's caching allocator."""
    __slots__ = ("dev", "stream", "alloc")

    def __init__(self, device_index: int):
        s = torch.cuda.current_stream(device_index)
        key = (device_index, s.cuda_stream)
        ext = _STREAMS.get(key)
        if ext is None:
            if len(_STREAMS) > 256:
                _STREAMS.clear()
            with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream for Stream.from_external; same effect
                warnings.simplefilter("ignore", DeprecationWarning)
                ext = _STREAMS[key] = cp.cuda.ExternalStream(s.cuda_stream, device_index)
        self.dev = cp.cuda.Device(device_index)
        self.stream = ext
        self.alloc = cp.cuda.using_allocator(_torch_malloc)

    def __enter__(self):
        _ALLOC_DEVICE[0] = f"cuda:{self.dev.id}"
        self.dev.__enter__()
        self.stream.__enter__()
        self.alloc.__enter__()
        return self

    def __exit__(self, *exc):
        _ALLOCATED.clear()  # the tensors live on in the arrays (and the views) that use them
        self.alloc.__exit__(*exc)
        self.stream.__exit__(*exc)
        self.dev.__exit__(*exc)
        return False


# The short road, for the forward operators a model calls at every step: torch allocates the outputs, the launch
# takes the tensors' device pointers and torch's current stream directly, and nothing crosses through DLPack.
# (The backward operators and anything that needs CuPy arrays take the bridge above.)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) if AVAILABLE else None
_NP_DTYPES: dict = {}  # torch dtype -> the NumPy dtype the launchers key their builds by
_CC_CHECKED: set = set()  # devices whose compute capability was checked


def _stream_of(t) -> int:
    """torch's current stream on t's device, as a raw cudaStream_t handle."""
    i = t.device.index
    return _raw_stream(i) if _raw_stream is not None else torch.cuda.current_stream(i).cuda_stream


def _np_dtype(dtype):
    out = _NP_DTYPES.get(dtype)
    if out is None:  # (NumPy knows "bfloat16" through ml_dtypes, which kernels.core imports)
        out = _NP_DTYPES[dtype] = np.dtype(str(dtype).removeprefix("torch."))
    return out


def _check_cc(i: int) -> None:
    """The tensor-core attention kernels need compute capability 8.0 (mma.sync with bfloat16); checked once a device."""
    if i not in _CC_CHECKED:
        check_compute_capability(DEFAULT_MIN_CC, flash2_mma.WHAT, i)
        _CC_CHECKED.add(i)


# The forward on a Hopper: hopper_attn (hopper_fa3) only where it measured faster than flash2_mma through this operator
# (`python3 -m kernels.bench.torch_ops --parts forward`): per (d, causal), the shortest length from which it was; Tq
# and Tk must both reach it. Shorter lengths were not measured and keep flash2_mma. The figures:
# kernels/pytorch/README.md, "The operator's forward on a Hopper".
HOPPER_FWD_MIN_T = {(64, False): 1024, (64, True): 2048, (128, False): 1024, (128, True): 1024}


def forward_kernel(q, Tk: int, causal: bool) -> str:
    """The kernel the attention operator's forward runs for q (a CUDA tensor (B, H, Tq, d)) against Tk keys:
    "hopper_attn" (hopper_fa3: TMA and wgmma) on compute capability 9.x with d = 64 or 128 when Tq and Tk both reach
    HOPPER_FWD_MIN_T[(d, causal)], where it measured faster; "flash2_mma" elsewhere. Both
    give o in q's dtype and lse float32, natural log, (B, H, Tq); a row that sees no key o = 0 and lse = -inf."""
    d, Tq = q.shape[-1], q.shape[-2]
    if (d, bool(causal)) not in HOPPER_FWD_MIN_T or device_info(q.device.index).cc[0] != 9:
        return "flash2_mma"
    return "hopper_attn" if min(Tq, Tk) >= HOPPER_FWD_MIN_T[(d, bool(causal))] else "flash2_mma"


def backward_kernel(q) -> str:
    """The kernel the attention operator's backward runs for q (a CUDA tensor (B, H, Tq, d)): "hopper_attn_bwd" (TMA
    and wgmma) on compute capability 9.x with d = 64 or 128, where it was faster on every measured shape (the table in
    kernels/hopper/README.md, "Speed"); "flash2_mma_bwd" elsewhere. It takes the lse of either forward (forward_kernel:
    both natural log), so a flash2_mma forward can meet a hopper_attn_bwd backward."""
    major = device_info(q.device.index).cc[0]
    return "hopper_attn_bwd" if major == 9 and q.shape[-1] in hopper_attn_bwd.HEAD_DIMS else "flash2_mma_bwd"


def _launch(t, kernel, grid, block, args, smem=0) -> None:
    """kernel on t's device and torch's current stream there; args hold tensors' pointers as np.uint64."""
    i = t.device.index
    if cp.cuda.runtime.getDevice() == i:
        kernel(grid, block, args, smem, stream=_stream_of(t))
    else:
        with cp.cuda.Device(i):
            kernel(grid, block, args, smem, stream=_stream_of(t))


_FWD_LAUNCHES: dict = {}  # (Tq, Tk, d, dtype, scale, causal, B*H, device) -> the prepared kernels.core.Launch


def _forward_launch(q, Tk: int, scale: float, causal: bool):
    """The prepared Launch of flash2_mma's dense kernel for this problem on q's device (made once per problem, as
    forward() makes it for CuPy arrays); a call supplies (q, k, v, o, lse) pointers and torch's stream."""
    B, H, Tq, d = q.shape
    i = q.device.index
    key = (Tq, Tk, d, q.dtype, scale, causal, B * H, i)
    launch = _FWD_LAUNCHES.get(key)
    if launch is None:
        kernel, grid, block, smem, tail = flash2_mma.launch_config(Tq, Tk, d, _np_dtype(q.dtype), scale, causal, B * H)
        with cp.cuda.Device(i):
            launch = Launch(kernel, grid, block, smem, 5, tail, i)
        if len(_FWD_LAUNCHES) >= 1024:
            _FWD_LAUNCHES.clear()
        _FWD_LAUNCHES[key] = launch
    return launch


def _check_qkv(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(t, name, ATTN_DTYPES, 4)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: q (B, H, Tq, d) and k, v "
                         f"(B, H, Tk, d) must agree on B, H and d")
    d = q.shape[3]
    if d > MAX_D or d % D_MULTIPLE:
        raise ValueError(f"head dimension d={d} must be a multiple of {D_MULTIPLE} and <= {MAX_D}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    if min(q.shape[:3]) < 1 or k.shape[2] < 1:
        raise ValueError(f"every dimension must be >= 1; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if max(q.numel(), k.numel()) > INT32_MAX:
        raise ValueError(f"q and k must have at most {INT32_MAX} elements each (the kernels index with 32-bit "
                         f"integers); got {q.numel()} and {k.numel()}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.data_ptr() % ALIGN:
            raise ValueError(f"{name} starts at address {t.data_ptr():#x}, not a multiple of {ALIGN} bytes (a view "
                             f"with a storage offset?); the kernels copy 16-byte chunks: pass {name}.clone()")


def _scale(scale, d: int) -> float:
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0; got {scale}")
    return scale


# ---------------------------------------------------------------------------------------------------------
# The operators (registered only where torch imports)
# ---------------------------------------------------------------------------------------------------------

if AVAILABLE:
    from torch import Tensor

    def flash_attn_fwd_impl(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
        """o = softmax(scale q k^T [causal]) v and lse (float32 (B, H, Tq), natural log), by forward_kernel's choice:
        flash2_mma, launched directly on the tensors, or on a Hopper hopper_attn, through the bridge.
        (The operator's body; called directly it skips torch's dispatcher: kernels/bench/torch_ops.py times both.)"""
        _check_qkv(q, k, v)
        _check_cc(q.device.index)
        if forward_kernel(q, k.shape[2], causal) == "hopper_attn":
            scale = _scale(scale, q.shape[3])  # the operator's contract: hopper_attn itself would take a scale <= 0
            with _on_torch_stream(q.device.index):  # its o and lse from torch's allocator, on torch's stream
                o, lse = hopper_attn.forward(to_cupy(q), to_cupy(k), to_cupy(v), causal=causal, scale=scale,
                                             return_lse=True)
                return to_torch(o), to_torch(lse)
        B, H, Tq, d = q.shape
        o = torch.empty_like(q)
        lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
        launch = _forward_launch(q, k.shape[2], scale, causal)
        launch(_stream_of(q), q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr())
        return o, lse

    flash_attn_fwd = torch.library.custom_op(f"{NAMESPACE}::flash_attn_fwd", mutates_args=())(flash_attn_fwd_impl)

    @flash_attn_fwd.register_fake
    def _(q, k, v, causal, scale):
        return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)

    @torch.library.custom_op(f"{NAMESPACE}::flash_attn_bwd", mutates_args=())
    def flash_attn_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, dlse: Optional[Tensor],
                       causal: bool, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        """(dq, dk, dv) by backward_kernel(q); dlse (optional) is the gradient of the lse output."""
        _check_qkv(q, k, v)
        _check_tensor(o, "o", ATTN_DTYPES, 4)
        _check_tensor(do, "do", ATTN_DTYPES, 4)
        _check_tensor(lse, "lse", ("float32",), 3)
        if dlse is not None:
            _check_tensor(dlse, "dlse", ("float32",), 3)
        B, H, Tq, d = q.shape
        if backward_kernel(q) == "hopper_attn_bwd":
            with _on_torch_stream(q.device.index):  # its outputs and workspace from torch's allocator
                grads = hopper_attn_bwd.backward(to_cupy(q), to_cupy(k), to_cupy(v), to_cupy(o), to_cupy(lse),
                                                 to_cupy(do), causal=causal, scale=scale,
                                                 dlse=None if dlse is None else to_cupy(dlse))
                return tuple(to_torch(g) for g in grads)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ws = torch.empty(flash2_mma_bwd.workspace_elements(B, H, Tq, d), dtype=torch.float32, device=q.device)
        with _on_torch_stream(q.device.index):
            flash2_mma_bwd.backward(to_cupy(q), to_cupy(k), to_cupy(v), to_cupy(o), to_cupy(lse), to_cupy(do),
                                    causal=causal, scale=scale, dlse=None if dlse is None else to_cupy(dlse),
                                    dq=to_cupy(dq), dk=to_cupy(dk), dv=to_cupy(dv), workspace=to_cupy(ws))
        return dq, dk, dv

    @flash_attn_bwd.register_fake
    def _(do, q, k, v, o, lse, dlse, causal, scale):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def _attn_setup(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        o, lse = output
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale

    def _attn_backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        # do arrives in whatever layout autograd made (a transposed view, after o.transpose(1, 2) in a model)
        dq, dk, dv = flash_attn_bwd(do.contiguous(), q, k, v, o, lse, None if dlse is None else dlse.contiguous(),
                                    ctx.causal, ctx.scale)
        return dq, dk, dv, None, None

    flash_attn_fwd.register_autograd(_attn_backward, setup_context=_attn_setup)

    @torch.library.custom_op(f"{NAMESPACE}::masked_softmax", mutates_args=())
    def masked_softmax_op(x: Tensor, lengths: Tensor) -> Tensor:
        """softmax(x[r, :lengths[r]]) per row r (zeros beyond), float32, by softmax.cu's softmax_masked_lengths."""
        _check_softmax(x, lengths)
        y = torch.empty_like(x)
        cols = x.shape[-1]
        rows = x.numel() // cols
        kernel, grid, block = softmax.masked_launch(rows, cols)
        xp, yp = x.data_ptr(), y.data_ptr()
        vec = cols % 4 == 0 and xp % 16 == 0 and yp % 16 == 0
        _launch(x, kernel, grid, block, (np.uint64(yp), np.uint64(xp), np.uint64(lengths.data_ptr()), np.int64(rows),
                                         np.int32(cols), np.int32(vec)))
        return y

    @masked_softmax_op.register_fake
    def _(x, lengths):
        return torch.empty_like(x)

    @torch.library.custom_op(f"{NAMESPACE}::masked_softmax_bwd", mutates_args=())
    def masked_softmax_bwd(y: Tensor, dy: Tensor, lengths: Tensor) -> Tensor:
        """dx = y (dy - sum_{j < n} dy y) per row, 0 past the row's length, by softmax_bwd.cu."""
        _check_softmax(y, lengths, "y")
        _check_tensor(dy, "dy", ("float32",))
        if dy.shape != y.shape:
            raise ValueError(f"dy has shape {tuple(dy.shape)}; it must match y's {tuple(y.shape)}")
        dx = torch.empty_like(y)
        with _on_torch_stream(y.device.index):
            softmax_bwd.backward(to_cupy(y), to_cupy(dy), to_cupy(lengths), out=to_cupy(dx))
        return dx

    @masked_softmax_bwd.register_fake
    def _(y, dy, lengths):
        return torch.empty_like(y)

    def _softmax_setup(ctx, inputs, output):
        _, lengths = inputs
        ctx.save_for_backward(output, lengths)

    def _softmax_backward(ctx, dy):
        y, lengths = ctx.saved_tensors
        return masked_softmax_bwd(y, dy.contiguous(), lengths), None

    masked_softmax_op.register_autograd(_softmax_backward, setup_context=_softmax_setup)


def _check_softmax(x, lengths, name: str = "x") -> None:
    _check_tensor(x, name, ("float32",))
    _check_tensor(lengths, "lengths", ("int32",), 1)
    if x.dim() < 1 or x.numel() == 0:
        raise ValueError(f"{name} must be a non-empty tensor of at least 1 dimension; got shape {tuple(x.shape)}")
    rows = x.numel() // x.shape[-1]
    if lengths.shape[0] != rows:
        raise ValueError(f"lengths has {lengths.shape[0]} entries; {name} has {rows} rows")
    if lengths.device != x.device:
        raise ValueError(f"lengths is on {lengths.device}, {name} on {x.device}")


# ---------------------------------------------------------------------------------------------------------
# What a model calls
# ---------------------------------------------------------------------------------------------------------

def _require_torch() -> None:
    if not AVAILABLE:
        raise RuntimeError("kernels.pytorch.torch_ops needs PyTorch (pip install torch)")


def attention_with_lse(q, k, v, *, causal: bool = False, scale: float | None = None):
    """(o, lse) of attention on CUDA tensors q (B, H, Tq, d), k, v (B, H, Tk, d), float16 or bfloat16, contiguous,
    d % 8 == 0 and d <= 128; causal bottom-right aligned; scale defaults to 1/sqrt(d). Differentiable in q, k, v
    (and through lse too)."""
    _require_torch()
    return torch.ops.course.flash_attn_fwd(q, k, v, bool(causal), _scale(scale, q.shape[-1]))


def attention(q, k, v, *, causal: bool = False, scale: float | None = None):
    """o = softmax(scale q k^T [causal]) v (see attention_with_lse); the FlashAttention-2 forward and backward, or on a
    Hopper the FlashAttention-3-style ones where forward_kernel / backward_kernel pick them."""
    return attention_with_lse(q, k, v, causal=causal, scale=scale)[0]


def masked_softmax(x, lengths):
    """Row softmax of a float32 CUDA tensor over each row's first lengths[r] entries (int32, one per row of
    x.reshape(-1, cols)); zeros beyond. Lengths are clamped to [0, cols] by the kernels. Differentiable in x."""
    _require_torch()
    return torch.ops.course.masked_softmax(x, lengths)
