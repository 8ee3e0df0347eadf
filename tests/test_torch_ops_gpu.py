"""The backward kernels and the PyTorch custom operators of kernels/pytorch/torch_ops.py (notebook 12), on the GPU.

- flash2_mma_bwd (launcher level): dq, dk, dv against the float64 reference (reference/backward.py) for ragged T,
  Tq != Tk both ways, causal and not (rows that see no key: exactly zero gradients), every head-size build
  (d in {32, 64, 96, 128} and a d between builds), fp16 and bf16, std 1 and a larger magnitude; outputs poisoned.
- softmax_bwd (launcher level): the masked softmax's backward against float64, lengths 0, 1, ragged, full and out of
  range (clamped).
- the operators: gradients through torch.autograd against float64 (also through the lse output), torch.library.opcheck
  on each of the four, a side-stream test, torch.compile(fullgraph=True) against eager, clear errors.
- the attention operator's forward through each kernel forward_kernel can pick (flash2_mma; hopper_attn on a Hopper,
  forced by setting HOPPER_FWD_MIN_T): o and lse against float64 for ragged lengths, Tq != Tk both ways, causal rows
  that see no key (o = 0, lse = -inf exactly), d 64 and 128, fp16 and bf16; opcheck and the side-stream test through
  each; forward_kernel's choice by capability, head size and lengths (device_info faked: runs without a GPU).
- fake/meta implementations: no GPU needed (only torch).

By default each case in one dtype (every head-size build in both) and each other backward tile on one shape;
`pytest --full-grid` runs every case in both dtypes and every tile on every shape. Skipped with the reason where torch
or a GPU is missing.
"""

import math
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the custom operators need it)")

import kernels  # noqa: E402
import reference as R  # noqa: E402
from kernels.flash import flash2_mma, flash2_mma_bwd
from kernels.basics import softmax, softmax_bwd
from kernels.pytorch import torch_ops  # noqa: E402

DTYPES = ("float16", "bfloat16")
# (B, H, Tq, Tk, d, causal, magnitude): ragged lengths, Tq < Tk and Tq > Tk (causal: rows that see no key), every
# head-size build and d = 40 (zero-filled columns of the D = 64 build)
CASES = [
    (1, 2, 1, 1, 32, False, 1.0),
    (2, 3, 77, 77, 64, True, 1.0),
    (1, 2, 64, 200, 96, True, 1.0),
    (1, 2, 200, 64, 128, True, 1.0),
    (2, 1, 129, 257, 128, False, 4.0),
    (1, 2, 150, 33, 40, False, 1.0),
    (1, 1, 300, 300, 64, True, 4.0),
    (2, 2, 16, 130, 32, True, 1.0),
]


# The operator's forward, through each kernel forward_kernel can pick: (B, H, Tq, Tk, d, causal, magnitude)
FWD_CASES = [
    (2, 3, 200, 333, 64, True, 1.0),     # ragged, Tq < Tk, causal (diagonal tiles)
    (1, 2, 300, 100, 128, True, 1.0),    # Tq > Tk, causal: 200 rows see no key
    (2, 1, 129, 257, 128, False, 4.0),   # a larger magnitude, ragged tiles
    (1, 2, 150, 33, 64, False, 1.0),     # Tq > Tk without the mask
    (1, 2, 350, 70, 64, True, 1.0),      # Tq > Tk, causal at d = 64: 280 rows see no key
]
FWD_KERNELS = ("flash2_mma", "hopper_attn")


@pytest.fixture(scope="module")
def cuda(gpu):
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return gpu


@pytest.fixture
def force_forward(monkeypatch):
    """force_forward(kernel): HOPPER_FWD_MIN_T set so that the operator's forward runs `kernel` at d = 64 and 128
    (1: hopper_attn at every length, skipped where the GPU is not a Hopper; inf: flash2_mma everywhere)."""
    def force(kernel):
        if kernel == "hopper_attn" and kernels.core.device_info().cc[0] != 9:
            pytest.skip("hopper_attn needs a Hopper GPU (compute capability 9.x)")
        limit = 1 if kernel == "hopper_attn" else math.inf
        monkeypatch.setattr(torch_ops, "HOPPER_FWD_MIN_T", dict.fromkeys(torch_ops.HOPPER_FWD_MIN_T, limit))
    return force


def _problem(cp, B, H, Tq, Tk, d, dtype, mag, seed=0):
    q, k, v = R.make_qkv(B, H, Tq, d, Tk, magnitude=mag, seed=seed, dtype=dtype)
    do = np.random.default_rng(seed + 1).standard_normal((B, H, Tq, d)).astype(dtype)
    dev = [cp.asarray(x) for x in (q, k, v, do)]
    host = [x.astype(np.float64) for x in (q, k, v, do)]  # exactly the values the GPU sees
    return dev, host


def _no_key_rows(Tq, Tk, causal):
    """Query rows that see no key (bottom-right causal with Tq > Tk)."""
    return max(Tq - Tk, 0) if causal else 0


def _dtype_cases(first, last, both=()):
    """CASES[first:last], by default case i in DTYPES[i % 2] (and the cases of `both` in both: D = 96 has one case);
    --full-grid: every case in both dtypes. Each head-size build meets both dtypes either way."""
    for dtype in DTYPES:
        for i, case in enumerate(CASES[first:last], start=first):
            default = dtype == DTYPES[i % 2] or case in both
            yield pytest.param(dtype, *case, id="-".join(map(str, case + (dtype,))),
                               marks=() if default else (pytest.mark.full_grid,))


@pytest.mark.parametrize("dtype,B,H,Tq,Tk,d,causal,mag", list(_dtype_cases(0, len(CASES), both=(CASES[2],))))
def test_backward_kernel_matches_reference(cuda, poison, dtype, B, H, Tq, Tk, d, causal, mag):
    cp = cuda
    (q, k, v, do), (q64, k64, v64, do64) = _problem(cp, B, H, Tq, Tk, d, dtype, mag)
    o, lse = flash2_mma.forward(q, k, v, causal=causal, return_lse=True)
    dq, dk, dv = flash2_mma_bwd.backward(q, k, v, o, lse, do, causal=causal)
    refs = R.attention_backward(q64, k64, v64, do64, causal=causal)
    for name, out, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), refs):
        res = kernels.check(out, ref, dtype)
        assert res.ok, f"{name}: {res.detail()}"
    blind = _no_key_rows(Tq, Tk, causal)
    if blind:
        assert not cp.any(dq[:, :, :blind].view(cp.int16)), "rows that see no key must get exactly zero dq"


def _other_tile_cases():
    """Each tile a build of its own per head size: by default each tile on one shape and each shape with one tile (a
    diagonal); --full-grid: every tile on every shape."""
    shapes = [(150, 133, 64, True), (100, 37, 128, False), (33, 70, 32, True)]
    for t, tile in enumerate([(64, 4, 2), (32, 4, 1), (16, 2, 1)]):
        for k, shape in enumerate(shapes):
            yield pytest.param(tile, *shape, id=f"{'-'.join(map(str, shape))}-tile{t}",
                               marks=() if t == k else (pytest.mark.full_grid,))


@pytest.mark.parametrize("tile,Tq,Tk,d,causal", list(_other_tile_cases()))
def test_backward_kernel_other_tiles(cuda, poison, tile, Tq, Tk, d, causal):
    """Builds other than the default 8-warp ones (tile=): 4 and 2 warps, 16-128 query rows, ragged ends."""
    cp = cuda
    (q, k, v, do), (q64, k64, v64, do64) = _problem(cp, 1, 2, Tq, Tk, d, "float16", 1.0, seed=Tq + d)
    o, lse = flash2_mma.forward(q, k, v, causal=causal, return_lse=True)
    dq, dk, dv = flash2_mma_bwd.backward(q, k, v, o, lse, do, causal=causal, tile=tile)
    refs = R.attention_backward(q64, k64, v64, do64, causal=causal)
    for name, out, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), refs):
        res = kernels.check(out, ref, "float16")
        assert res.ok, f"tile {tile} {name}: {res.detail()}"


def test_backward_kernel_lse_gradient_and_scale(cuda, poison):
    """dlse (the gradient of the lse output) shifts delta; an explicit scale; checked against float64."""
    cp = cuda
    B, H, Tq, Tk, d, scale = 1, 2, 70, 90, 64, 0.3
    (q, k, v, do), (q64, k64, v64, do64) = _problem(cp, B, H, Tq, Tk, d, "float16", 1.0, seed=3)
    dlse64 = np.random.default_rng(7).standard_normal((B, H, Tq)).astype(np.float32)
    o, lse = flash2_mma.forward(q, k, v, causal=True, scale=scale, return_lse=True)
    dq, dk, dv = flash2_mma_bwd.backward(q, k, v, o, lse, do, causal=True, scale=scale, dlse=cp.asarray(dlse64))
    rq, rk, rv = R.attention_backward(q64, k64, v64, do64, causal=True, scale=scale, dlse=dlse64)
    for name, out, ref in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        res = kernels.check(out, ref, "float16")
        assert res.ok, f"{name}: {res.detail()}"


def test_backward_launcher_errors(cuda):
    cp = cuda
    (q, k, v, do), _ = _problem(cp, 1, 1, 8, 8, 32, "float16", 1.0)
    o, lse = flash2_mma.forward(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="lse"):
        flash2_mma_bwd.backward(q, k, v, o, lse[:, :, :4].copy(), do)
    with pytest.raises(TypeError, match="do"):
        flash2_mma_bwd.backward(q, k, v, o, lse, do.astype(cp.float32))
    with pytest.raises(ValueError, match="workspace"):
        flash2_mma_bwd.backward(q, k, v, o, lse, do, workspace=cp.empty(10, dtype=cp.float32))
    need = flash2_mma_bwd.workspace_elements(1, 1, 8, 32)
    with pytest.raises(ValueError, match="workspace starts at .*16-byte aligned"):  # 4 bytes off: float2 reads fault
        flash2_mma_bwd.backward(q, k, v, o, lse, do, workspace=cp.empty(need + 1, dtype=cp.float32)[1:])
    with pytest.raises(ValueError, match="scale"):
        flash2_mma_bwd.backward(q, k, v, o, lse, do, scale=-1.0)


def _softmax_ref(x, lengths, dy):
    """float64 masked softmax and its backward, lengths clamped to [0, cols]."""
    rows, cols = x.shape
    y = np.zeros_like(x)
    dx = np.zeros_like(x)
    for r in range(rows):
        n = min(max(int(lengths[r]), 0), cols)
        if n:
            e = np.exp(x[r, :n] - x[r, :n].max())
            y[r, :n] = e / e.sum()
            dx[r, :n] = y[r, :n] * (dy[r, :n] - (dy[r, :n] * y[r, :n]).sum())
    return y, dx


@pytest.mark.parametrize("cols", [1, 7, 128, 4099, 40000])
def test_softmax_backward_kernel(cuda, poison, cols):
    cp = cuda
    rng = np.random.default_rng(cols)
    rows = 9
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    lengths = np.array([0, 1, cols, cols // 2, cols + 5, -3, max(cols - 1, 0), 3, cols], dtype=np.int32)
    y_ref, dx_ref = _softmax_ref(x.astype(np.float64), lengths, dy.astype(np.float64))
    y = softmax.masked_softmax(cp.asarray(x), cp.asarray(lengths))
    dx = softmax_bwd.backward(y, cp.asarray(dy), cp.asarray(lengths))
    res = kernels.check(dx, dx_ref, "float32")
    assert res.ok, res.detail()
    blank = np.minimum(np.maximum(lengths, 0), cols) == 0
    assert not cp.any(dx[cp.asarray(blank)]), "a row of length 0 must get zero gradient"


# ---------------------------------------------------------------------------------------------------------
# The operators
# ---------------------------------------------------------------------------------------------------------

def _tensors(B, H, Tq, Tk, d, dtype, mag=1.0, seed=0):
    q, k, v = R.make_qkv(B, H, Tq, d, Tk, magnitude=mag, seed=seed)
    do = np.random.default_rng(seed + 1).standard_normal((B, H, Tq, d))
    tdt = getattr(torch, dtype)
    ts = [torch.tensor(x, dtype=tdt, device="cuda") for x in (q, k, v, do)]
    host = [t.double().cpu().numpy() for t in ts]
    return ts, host


def _fwd_cases():
    """Each FWD_CASES case through each kernel; by default case i in DTYPES[i % 2], so that each kernel meets every
    (d, dtype) and rows that see no key in both dtypes; --full-grid: every case in both dtypes."""
    for kernel in FWD_KERNELS:
        for dtype in DTYPES:
            for i, case in enumerate(FWD_CASES):
                yield pytest.param(kernel, dtype, *case, id="-".join(map(str, (kernel,) + case + (dtype,))),
                                   marks=() if dtype == DTYPES[i % 2] else (pytest.mark.full_grid,))


@pytest.mark.parametrize("kernel,dtype,B,H,Tq,Tk,d,causal,mag", list(_fwd_cases()))
def test_attention_op_forward_through_each_kernel(cuda, force_forward, kernel, dtype, B, H, Tq, Tk, d, causal, mag):
    """The operator's o and lse, whichever kernel forward_kernel picks: the same contract (o in q's dtype, lse float32
    natural log (B, H, Tq); a row that sees no key o = 0 and lse = -inf) against float64."""
    force_forward(kernel)
    (q, k, v, _), (q64, k64, v64, _) = _tensors(B, H, Tq, Tk, d, dtype, mag, seed=Tq + Tk + d)
    assert torch_ops.forward_kernel(q, Tk, causal) == kernel
    o, lse = torch.ops.course.flash_attn_fwd(q, k, v, causal, 1 / math.sqrt(d))
    assert o.dtype == q.dtype and o.shape == q.shape and lse.dtype == torch.float32 and lse.shape == (B, H, Tq)
    o_ref, lse_ref = R.attention(q64, k64, v64, causal=causal, return_lse=True)
    for name, got, ref in (("o", o.float(), o_ref), ("lse", lse, lse_ref)):
        res = kernels.check(got.cpu().numpy(), ref, dtype)
        assert res.ok, f"{kernel} {name}: {res.detail()}"
    blind = _no_key_rows(Tq, Tk, causal)
    if blind:
        assert not o[:, :, :blind].any(), "rows that see no key must give o = 0"
        assert bool(torch.isneginf(lse[:, :, :blind]).all()), "rows that see no key must give lse = -inf"


@pytest.mark.parametrize("cc", [(9, 0), (8, 0), (8, 9), (10, 0)])
def test_forward_kernel_choice(monkeypatch, cc):
    """forward_kernel: hopper_attn only on compute capability 9.x, at d = 64 and 128, with Tq and Tk both at least
    HOPPER_FWD_MIN_T[(d, causal)]; the measured facts pinned (d = 64 causal at T = 1024: flash2_mma). device_info is
    faked and q is a meta tensor: no GPU needed."""
    monkeypatch.setattr(torch_ops, "device_info", lambda index=None: types.SimpleNamespace(cc=cc))

    def pick(Tq, Tk, d, causal):
        return torch_ops.forward_kernel(torch.empty(1, 2, Tq, d, dtype=torch.float16, device="meta"), Tk, causal)

    hopper = cc[0] == 9
    for Tq, Tk in ((1, 1), (1, 4096), (4096, 1), (512, 512), (1024, 1024), (1024, 4096), (2048, 2048), (4096, 4096),
                   (16384, 16384)):
        for d in (32, 64, 96, 128):
            for causal in (False, True):
                limit = torch_ops.HOPPER_FWD_MIN_T.get((d, causal))
                want = hopper and limit is not None and min(Tq, Tk) >= limit
                assert pick(Tq, Tk, d, causal) == ("hopper_attn" if want else "flash2_mma"), (Tq, Tk, d, causal)
    pins = {(1024, 64, False): True, (1024, 64, True): False, (2048, 64, True): True, (1024, 128, False): True,
            (1024, 128, True): True, (16384, 128, True): True, (1, 64, False): False}
    for (T, d, causal), faster in pins.items():
        assert pick(T, T, d, causal) == ("hopper_attn" if hopper and faster else "flash2_mma"), (T, d, causal)


@pytest.mark.parametrize("dtype,B,H,Tq,Tk,d,causal,mag", list(_dtype_cases(1, 6)))
def test_attention_op_gradients(cuda, dtype, B, H, Tq, Tk, d, causal, mag):
    (q, k, v, do), (q64, k64, v64, do64) = _tensors(B, H, Tq, Tk, d, dtype, mag)
    for t in (q, k, v):
        t.requires_grad_(True)
    o = torch_ops.attention(q, k, v, causal=causal)
    res = kernels.check(o.detach().float().cpu().numpy(), R.attention(q64, k64, v64, causal=causal), dtype)
    assert res.ok, f"o: {res.detail()}"
    o.backward(do)
    for name, t, ref in zip(("dq", "dk", "dv"), (q, k, v), R.attention_backward(q64, k64, v64, do64, causal=causal)):
        res = kernels.check(t.grad.float().cpu().numpy(), ref, dtype)
        assert res.ok, f"{name}: {res.detail()}"
    blind = _no_key_rows(Tq, Tk, causal)
    if blind:
        assert not q.grad[:, :, :blind].any()


def test_attention_op_through_transposed_views(cuda):
    """In a model, dO arrives as a transposed view (o.transpose(1, 2) downstream): the op makes it contiguous."""
    (q, k, v, do), (q64, k64, v64, do64) = _tensors(2, 4, 96, 96, 64, "float16", seed=5)
    q.requires_grad_(True)
    o = torch_ops.attention(q, k, v, causal=True)
    y = o.transpose(1, 2).reshape(2, 96, 4 * 64)  # (B, T, H d), as a model's output projection sees it
    y.backward(do.transpose(1, 2).reshape(2, 96, 4 * 64))
    ref = R.attention_backward(q64, k64, v64, do64, causal=True)[0]
    res = kernels.check(q.grad.float().cpu().numpy(), ref, "float16")
    assert res.ok, res.detail()


def test_masked_softmax_op_gradients(cuda):
    rng = np.random.default_rng(11)
    rows, cols = 12, 100
    x64 = rng.standard_normal((rows, cols)) * 2
    dy64 = rng.standard_normal((rows, cols))
    lengths = np.array([0, 1, 100, 50, 99, 3, 64, 65, 7, 100, 2, 33], dtype=np.int32)
    x = torch.tensor(x64, dtype=torch.float32, device="cuda", requires_grad=True)
    y = torch_ops.masked_softmax(x, torch.tensor(lengths, device="cuda"))
    y.backward(torch.tensor(dy64, dtype=torch.float32, device="cuda"))
    x32 = x.detach().double().cpu().numpy()
    y_ref, dx_ref = _softmax_ref(x32, lengths, torch.tensor(dy64, dtype=torch.float32).double().numpy())
    assert kernels.check(y.detach().cpu().numpy(), y_ref, "float32").ok
    res = kernels.check(x.grad.cpu().numpy(), dx_ref, "float32")
    assert res.ok, res.detail()


def test_masked_softmax_op_finite_differences(cuda):
    """torch.autograd.gradcheck in float32 (the op takes no float64): central differences of step 1e-3."""
    torch.manual_seed(0)
    x = torch.randn(3, 7, device="cuda", dtype=torch.float32, requires_grad=True)
    lengths = torch.tensor([7, 4, 1], dtype=torch.int32, device="cuda")
    assert torch.autograd.gradcheck(lambda t: torch_ops.masked_softmax(t, lengths), (x,), eps=1e-3, atol=2e-3,
                                    rtol=1e-2, nondet_tol=0.0)


def test_attention_op_lse_gradient(cuda):
    (q, k, v, do), (q64, k64, v64, do64) = _tensors(1, 2, 40, 56, 32, "float16", seed=9)
    dlse = torch.randn(1, 2, 40, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    q.requires_grad_(True)
    k.requires_grad_(True)
    o, lse = torch_ops.attention_with_lse(q, k, v, causal=False)
    ((o.float() * do.float()).sum() + (lse * dlse).sum()).backward()
    rq, rk, _ = R.attention_backward(q64, k64, v64, do64, dlse=dlse.double().cpu().numpy())
    for name, t, ref in (("dq", q, rq), ("dk", k, rk)):
        res = kernels.check(t.grad.float().cpu().numpy(), ref, "float16")
        assert res.ok, f"{name}: {res.detail()}"


def test_backward_kernel_choice(cuda):
    """On a Hopper the operator's backward runs hopper_attn_bwd at d = 64 and 128 and flash2_mma_bwd at the other head
    sizes; elsewhere flash2_mma_bwd always. The gradient and opcheck tests (d = 32 .. 128) cover both kernels there."""
    hopper = kernels.core.device_info().cc[0] == 9
    for d, expected in ((64, hopper), (128, hopper), (96, False), (32, False)):
        q = torch.empty(1, 1, 8, d, dtype=torch.float16, device="cuda")
        assert torch_ops.backward_kernel(q) == ("hopper_attn_bwd" if expected else "flash2_mma_bwd"), d


@pytest.mark.parametrize("kernel,dtype", [
    ("flash2_mma", "float16"), ("flash2_mma", "bfloat16"), ("hopper_attn", "float16"),
    pytest.param("hopper_attn", "bfloat16", marks=pytest.mark.full_grid)])
def test_opcheck_attention_ops(cuda, force_forward, kernel, dtype):
    force_forward(kernel)
    (q, k, v, do), _ = _tensors(2, 2, 48, 80, 64, dtype, seed=2)
    assert torch_ops.forward_kernel(q, 80, True) == kernel
    for t in (q, k, v):
        t.requires_grad_(True)
    torch.library.opcheck(torch.ops.course.flash_attn_fwd.default, (q, k, v, True, 0.125))
    o, lse = torch.ops.course.flash_attn_fwd(q.detach(), k.detach(), v.detach(), True, 0.125)
    torch.library.opcheck(torch.ops.course.flash_attn_bwd.default,
                          (do, q.detach(), k.detach(), v.detach(), o, lse, None, True, 0.125))


def test_opcheck_softmax_ops(cuda):
    x = torch.randn(6, 50, device="cuda", requires_grad=True)
    lengths = torch.tensor([0, 1, 50, 25, 49, 3], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.course.masked_softmax.default, (x, lengths))
    y = torch.ops.course.masked_softmax(x.detach(), lengths)
    torch.library.opcheck(torch.ops.course.masked_softmax_bwd.default, (y, torch.randn_like(y), lengths))


@pytest.mark.parametrize("kernel", FWD_KERNELS)
def test_ops_follow_torch_current_stream(cuda, force_forward, kernel):
    """On a side stream whose inputs are written after a long sleep, an op launched on any other stream would read
    them too early; the ops must give the right answer (the attention forward through each kernel: flash2_mma's
    direct launch, hopper_attn's through the bridge)."""
    force_forward(kernel)
    (q, k, v, do), (q64, k64, v64, do64) = _tensors(1, 4, 256, 256, 64, "float16", seed=4)
    assert torch_ops.forward_kernel(q, 256, True) == kernel
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # about 25 ms of GPU cycles before the inputs exist
        qs = torch.empty_like(q).copy_(q).requires_grad_(True)
        o = torch_ops.attention(qs, k, v, causal=True)
        o.backward(do)
        x = torch.empty(64, 300, device="cuda").copy_(torch.arange(300.0, device="cuda").sin().expand(64, 300))
        y = torch_ops.masked_softmax(x, torch.full((64,), 200, dtype=torch.int32, device="cuda"))
    side.synchronize()
    assert kernels.check(o.detach().float().cpu().numpy(), R.attention(q64, k64, v64, causal=True), "float16").ok
    res = kernels.check(qs.grad.float().cpu().numpy(), R.attention_backward(q64, k64, v64, do64, causal=True)[0],
                        "float16")
    assert res.ok, res.detail()
    x64 = np.sin(np.arange(300.0, dtype=np.float32)).astype(np.float64)
    y_ref, _ = _softmax_ref(np.tile(x64, (64, 1)), np.full(64, 200), np.zeros((64, 300)))
    assert kernels.check(y.cpu().numpy(), y_ref, "float32").ok


class _Block(torch.nn.Module):
    """Attention on projected q, k, v (our op), then a masked softmax over a score row (our op)."""

    def __init__(self, C=128, H=2):
        super().__init__()
        self.H = H
        self.qkv = torch.nn.Linear(C, 3 * C)
        self.proj = torch.nn.Linear(C, C)

    def forward(self, x, lengths):
        B, T, C = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.H, C // self.H).permute(2, 0, 3, 1, 4).half().contiguous()
        y = torch_ops.attention(*qkv.unbind(0), causal=True).transpose(1, 2).reshape(B, T, C)
        y = self.proj(y.float())
        return torch_ops.masked_softmax(y.reshape(B * T, C).contiguous(), lengths)


def test_torch_compile_fullgraph_matches_eager(cuda):
    torch.manual_seed(0)
    model = _Block().cuda()  # float32 projections, attention in float16: eager and compiled differ only there
    x = torch.randn(2, 64, 128, device="cuda")
    lengths = torch.randint(1, 129, (128,), dtype=torch.int32, device="cuda")
    eager = model(x, lengths)
    eager.square().sum().backward()
    g_eager = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x, lengths)
    out.square().sum().backward()
    res = kernels.check(out.detach().cpu().numpy(), eager.detach().double().cpu().numpy(), "float16")
    assert res.ok, res.detail()
    for p, g in zip(model.parameters(), g_eager):
        res = kernels.check(p.grad.float().cpu().numpy(), g.double().cpu().numpy(), "float16")
        assert res.ok, res.detail()


def test_op_errors(cuda):
    (q, k, v, _), _ = _tensors(1, 2, 16, 16, 32, "float16")
    with pytest.raises(ValueError, match="cpu"):
        torch_ops.attention(q.cpu(), k.cpu(), v.cpu())
    with pytest.raises(TypeError, match="dtype"):
        torch_ops.attention(q.float(), k.float(), v.float())
    with pytest.raises(ValueError, match="contiguous"):
        torch_ops.attention(q.transpose(2, 3), k, v)
    with pytest.raises(ValueError, match="multiple of 8"):
        torch_ops.attention(q[..., :20].contiguous(), k[..., :20].contiguous(), v[..., :20].contiguous())
    x = torch.randn(4, 10, device="cuda")
    lengths = torch.full((4,), 5, dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="dtype"):
        torch_ops.masked_softmax(x.half(), lengths)
    with pytest.raises(TypeError, match="lengths"):
        torch_ops.masked_softmax(x, lengths.long())
    with pytest.raises(ValueError, match="cpu"):
        torch_ops.masked_softmax(x.cpu(), lengths.cpu())
    with pytest.raises(ValueError, match="contiguous"):
        torch_ops.masked_softmax(x.t(), lengths)


def test_forward_op_checks_what_its_direct_launch_needs(cuda):
    """The forward operator launches on the tensors' pointers, so it checks alignment and sizes itself."""
    (q, k, v, _), _ = _tensors(1, 2, 16, 16, 32, "float16")
    buf = torch.zeros(q.numel() + 4, dtype=torch.float16, device="cuda")
    q_off = buf[4:].view(q.shape).copy_(q)  # 8 bytes past a 16-byte boundary
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        torch_ops.attention(q_off, k, v)
    with pytest.raises(ValueError, match=">= 1"):
        torch_ops.attention(q[:, :, :0], k, v)
    with pytest.raises(ValueError, match="agree"):
        torch_ops.attention(q, k[:, :1].contiguous(), v[:, :1].contiguous())
    for bad in (0.0, -0.125, float("nan"), float("inf")):  # the operator itself, past attention()'s own check
        with pytest.raises(ValueError, match="scale"):
            torch.ops.course.flash_attn_fwd(q, k, v, False, bad)
    o = torch_ops.attention(q_off.clone(), k, v)  # the clone the message suggests is aligned
    assert torch.equal(o, torch_ops.attention(q, k, v))


@pytest.mark.parametrize("rows,cols,offset", [(1000, 128, 0), (7, 129, 0), (5, 64, 1), (3, 1000, 0), (2, 4099, 0)])
def test_masked_softmax_op_warp_and_block_rows_aligned_or_not(cuda, rows, cols, offset):
    buf = torch.randn(rows * cols + offset, device="cuda", generator=torch.Generator("cuda").manual_seed(rows)) * 5
    x = buf[offset:].view(rows, cols)  # offset 1: 4-byte aligned rows, the scalar path
    lengths = torch.randint(0, cols + 1, (rows,), dtype=torch.int32, device="cuda")
    lengths[0] = cols
    y = torch_ops.masked_softmax(x, lengths)
    ref, _ = _softmax_ref(x.double().cpu().numpy(), lengths.cpu().numpy(), np.zeros((rows, cols)))
    assert kernels.check(y.cpu().numpy(), ref, "float32").ok


def test_fake_implementations_need_no_gpu():
    """Shapes through the meta (fake) implementations: what torch.compile traces with, on any machine."""
    q = torch.empty(2, 3, 17, 64, dtype=torch.float16, device="meta")
    k = torch.empty(2, 3, 33, 64, dtype=torch.float16, device="meta")
    o, lse = torch.ops.course.flash_attn_fwd(q, k, k, True, 0.125)
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (2, 3, 17) and lse.dtype == torch.float32
    dq, dk, dv = torch.ops.course.flash_attn_bwd(o, q, k, k, o, lse, None, True, 0.125)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape
    x = torch.empty(5, 9, device="meta")
    assert torch.ops.course.masked_softmax(x, torch.empty(5, dtype=torch.int32, device="meta")).shape == (5, 9)
