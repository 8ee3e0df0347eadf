"""The Triton FlashAttention-2 (kernels/pytorch/flash2_triton.py): gradients against the float64 reference, the autograd
Function, the opt-in autotune, streams and bad input. Its forward is also in tests/test_attention_gpu.py's grid.

Needs a GPU, torch and Triton; where one of them is missing these tests skip with the reason;
the float64 backward they compare with is tested on the CPU in tests/test_reference_backward.py.
"""

import importlib.util
import itertools
import math
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from ahead import Ahead

import kernels
import reference as R
from kernels.pytorch import flash2_triton as F

ROOT = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------------------
# Compiling ahead (tests/ahead.py): each (d, dtype) of the grid is four Triton builds (the forward and the backward's
# dK/dV and dQ kernels, causal and not) and Triton compiles one at a time in this process, about a second each. A
# subprocess per (d, dtype) runs the launchers once on a small input at the session's start, which compiles the same
# builds into Triton's cache on disk; a test then loads them from there (or compiles what is not there yet).
# tests/test_attention_gpu.py starts the same warm-ups for its flash2_triton cases.
# ---------------------------------------------------------------------------------------------------------

WARM = r"""
import sys
import cupy as cp
import reference as R
from kernels.pytorch import flash2_triton as F
d, dtype = int(sys.argv[1]), sys.argv[2]
q, k, v = (cp.asarray(x.astype(dtype)) for x in R.make_qkv(1, 1, 40, d, 40, seed=0))
for causal in (False, True):
    o, lse = F.forward(q, k, v, causal=causal, return_lse=True)
    F.backward(q, k, v, o, lse, q, causal=causal)
cp.cuda.Device().synchronize()
"""


_WARMED: set = set()  # the (d, dtype) warm-ups started in this session
_WARMED_LOCK = threading.Lock()


def warm_triton(d: int, dtype: str) -> subprocess.CompletedProcess | None:
    """flash2_triton's builds of (d, dtype), compiled in a subprocess into Triton's disk cache, once a session (None
    where another file's plan has started it already). No test reads the result: a test's own launch compiles
    whatever is not in the cache, and fails or passes on its own."""
    with _WARMED_LOCK:
        if (d, dtype) in _WARMED:
            return None
        _WARMED.add((d, dtype))
    return subprocess.run([sys.executable, "-c", WARM, str(d), dtype], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


WARM_MIN = 3  # fewer (d, dtype) than this (a -k slice, e.g. compute-sanitizer's) compile here as soon
_PAIRS: dict = {}  # (session, module) -> the (d, dtype) its selected tests need


def triton_warm_ups(item, pair_of):
    """The plan entry (key, function, args) that warms the (d, dtype) pair_of(item) names (None: no Triton build),
    where a GPU, torch and Triton are here and the file's selected tests need at least WARM_MIN pairs."""
    pair = pair_of(item)
    if pair is None:
        return
    key = (id(item.session), item.module.__name__)
    if key not in _PAIRS:
        _PAIRS[key] = {pair_of(i) for i in item.session.items if getattr(i, "module", None) is item.module} - {None}
    if len(_PAIRS[key]) >= WARM_MIN and importlib.util.find_spec("torch") and importlib.util.find_spec("triton") \
            and kernels.gpu_unavailable_reason() is None:
        yield ("triton", *pair), warm_triton, pair


def _gradient_pair(item):
    if item.originalname == "test_gradients_match_reference":
        return item.callspec.params["d"], item.callspec.params["dtype"]
    return None


def _plan(item, tmp_path_factory):
    yield from triton_warm_ups(item, _gradient_pair)


AHEAD = Ahead(_plan, first=True)
start_ahead = AHEAD.fixture()


@pytest.fixture(scope="session")  # session, like `gpu`: so that it is set up (and skips) before `gpu`
def tr():
    """(cupy, torch): skips, with the reason, where torch, Triton or a GPU is missing. torch is asked first, so that
    a machine without torch, Triton or a GPU says that it has no torch."""
    torch = pytest.importorskip("torch", reason="flash2_triton needs torch (not installed; requirements.txt installs it)")
    pytest.importorskip("triton", reason="flash2_triton needs Triton (not installed; it comes with torch on Linux)")
    reason = kernels.gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs a CUDA GPU: {reason}")
    if not torch.cuda.is_available():
        pytest.skip("flash2_triton needs torch with CUDA (torch.cuda.is_available() is False)")
    import cupy

    return cupy, torch


def _inputs(cp, dtype, Tq, Tk, d, mag=1.0, seed=0, B=1, H=2):
    q, k, v = R.make_qkv(B, H, Tq, d, Tk, magnitude=mag, seed=seed)
    do = np.random.default_rng(seed + 1).standard_normal(q.shape)
    dev = [cp.asarray(x.astype(dtype)) for x in (q, k, v, do)]
    host = [x.get().astype(np.float64) for x in dev]  # exactly what the GPU sees
    return dev, host


def _grad_cases():
    """Every (d, dtype, causal) at T = 257: each is a Triton build of its own. The other shapes by default in each dtype
    once and with and without the mask once each (and Tq > Tk under the mask, rows that see no key, in both dtypes);
    --full-grid: every shape in both dtypes, causal and not."""
    full = (pytest.mark.full_grid,)
    for d, dtype, causal in itertools.product(F.HEAD_DIMS, F.DTYPES, [False, True]):  # each d, a ragged T
        yield pytest.param(dtype, 257, 257, d, causal, 1.0, id=f"{dtype}-T257-d{d}-{'causal' if causal else 'full'}")
    for (j, (Tq, Tk)), (i, dtype), causal in itertools.product(
            enumerate([(1, 257), (7, 100), (100, 7), (33, 1024), (128, 128)]), enumerate(F.DTYPES), [False, True]):
        default = (i + causal + j) % 2 == 0 or (causal and Tq > Tk)
        yield pytest.param(dtype, Tq, Tk, 64, causal, 1.0, marks=() if default else full,
                           id=f"{dtype}-Tq{Tq}-Tk{Tk}-d64-{'causal' if causal else 'full'}")
    for (i, dtype), causal in itertools.product(enumerate(F.DTYPES), [False, True]):  # logits that overflow an unguarded exp
        yield pytest.param(dtype, 100, 100, 64, causal, 10.0, marks=() if (i + causal) % 2 == 0 else full,
                           id=f"{dtype}-T100-d64-{'causal' if causal else 'full'}-x10")


@pytest.mark.parametrize("dtype,Tq,Tk,d,causal,mag", list(_grad_cases()))
def test_gradients_match_reference(tr, poison, dtype, Tq, Tk, d, causal, mag):
    cp, _ = tr
    (q, k, v, do), host = _inputs(cp, dtype, Tq, Tk, d, mag, seed=Tq * 7 + Tk + d)
    o, lse = F.forward(q, k, v, causal=causal, return_lse=True)
    dq, dk, dv = F.backward(q, k, v, o, lse, do, causal=causal)
    want = R.attention_backward(*host, causal=causal)
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), want):
        assert got.dtype == q.dtype and got.shape == ref.shape
        res = kernels.check(got, ref, dtype)
        assert res.ok, f"{name}: {res.detail()}"
    if causal and Tq > Tk:  # rows that see no key: output 0, lse -inf, gradient exactly 0
        blind = Tq - Tk
        assert bool((dq[:, :, :blind] == 0).all()) and bool((o[:, :, :blind] == 0).all())
        assert bool(cp.isneginf(lse[:, :, :blind]).all())


def test_backward_is_deterministic(tr):
    """No atomics: two backward passes give the same bits."""
    cp, _ = tr
    (q, k, v, do), _ = _inputs(cp, "float16", 300, 300, 64, seed=3)
    o, lse = F.forward(q, k, v, causal=True, return_lse=True)
    a = F.backward(q, k, v, o, lse, do, causal=True)
    b = F.backward(q, k, v, o, lse, do, causal=True)
    assert all(bool((x == y).all()) for x, y in zip(a, b))


@pytest.mark.parametrize("dtype", F.DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_autograd_function(tr, dtype, causal):
    """attention() on torch tensors: o and the grads of o.backward(do) against the float64 reference."""
    cp, torch = tr
    (q, k, v, do), host = _inputs(cp, dtype, 65, 130, 64, seed=9)
    qt, kt, vt = (F.as_torch(x).clone().requires_grad_(True) for x in (q, k, v))
    o = F.attention(qt, kt, vt, causal=causal, scale=0.2)
    o.backward(F.as_torch(do))
    o_ref = R.attention(*host[:3], causal=causal, scale=0.2)
    want = R.attention_backward(*host, causal=causal, scale=0.2)
    to_np = lambda t: t.detach().float().cpu().numpy()  # noqa: E731
    assert kernels.check(to_np(o), o_ref, dtype).ok
    for name, t, ref in zip(("dq", "dk", "dv"), (qt, kt, vt), want):
        res = kernels.check(to_np(t.grad), ref, dtype)
        assert res.ok, f"{name}: {res.detail()}"


def test_autograd_accepts_strided_inputs(tr):
    """A transposed view (B, T, H, d) -> (B, H, T, d) is made contiguous, not rejected or misread."""
    cp, torch = tr
    x = torch.randn((1, 40, 2, 32), device="cuda", dtype=torch.float16)
    q = x.transpose(1, 2)
    o = F.attention(q, q, q, causal=True)
    ref = R.attention(*(q.double().cpu().numpy(),) * 3, causal=True)
    assert kernels.check(o.float().cpu().numpy(), ref, "float16").ok


def test_explicit_config_and_autotune(tr):
    """Every candidate of the opt-in search computes the same thing; autotune() records the winner for the bucket."""
    cp, _ = tr
    (q, k, v, _), host = _inputs(cp, "float16", 100, 100, 64, seed=4)
    ref = R.attention(*host[:3], causal=True)
    cands = (F.FWD_CONFIGS[(64, True)], F.Config(64, 64, 4, 3))
    for cfg in cands:
        assert kernels.check(F.forward(q, k, v, causal=True, config=cfg), ref, "float16").ok
    try:
        chosen = F.autotune(q, k, v, causal=True, candidates=cands)
        assert chosen in cands
        assert F.forward_config(64, True, "float16", 100, 120) == chosen  # same bucket (128)
        assert F.forward_config(64, True, "float16", 1000, 1000) == F.FWD_CONFIGS[(64, True)]  # another bucket
        assert kernels.check(F.forward(q, k, v, causal=True), ref, "float16").ok
    finally:
        F._TUNED.clear()


def test_runs_on_cupy_current_stream(tr):
    cp, _ = tr
    (q, k, v, _), host = _inputs(cp, "bfloat16", 77, 77, 32, seed=5)
    with cp.cuda.Stream(non_blocking=True) as s:
        o = F.forward(q, k, v, causal=True)
        s.synchronize()
    assert kernels.check(o, R.attention(*host[:3], causal=True), "bfloat16").ok


def test_bad_input(tr):
    cp, torch = tr
    (q, k, v, do), _ = _inputs(cp, "float16", 16, 16, 48)
    with pytest.raises(ValueError, match=r"head dimension d=48 must be one of \(16, 32, 64, 128\)"):
        F.forward(q, k, v)
    (q, k, v, do), _ = _inputs(cp, "float16", 16, 16, 32)
    with pytest.raises(ValueError, match=r"scale must be > 0 .* got -1.0"):
        F.forward(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match=r"config \(100, 64, 4, 3\): BLOCK_M and BLOCK_N must be powers of two"):
        F.forward(q, k, v, config=(100, 64, 4, 3))
    o, lse = F.forward(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"lse must have shape \(1, 2, 16\); got \(1, 2, 15\)"):
        F.backward(q, k, v, o, lse[:, :, :15].copy(), do)
    with pytest.raises(TypeError, match=r"lse has dtype float16"):
        F.backward(q, k, v, o, lse.astype(cp.float16), do)
    with pytest.raises(ValueError, match=r"do must have q's shape"):
        F.backward(q, k, v, o, lse, do[:, :1].copy())
    with pytest.raises(TypeError, match=r"q must be a torch.Tensor; got numpy.ndarray"):
        F.attention(q.get(), k, v)
    t = torch.zeros((1, 2, 16, 32), device="cuda")
    with pytest.raises(TypeError, match=r"q has dtype torch.float32; .* takes torch.float16, torch.bfloat16"):
        F.attention(t, t, t)
    t = torch.zeros((1, 2, 16, 256), device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match=r"d=256 is larger than .*d <= 128"):
        F.attention(t, t, t)
    with pytest.raises(ValueError, match=r"scale must be a finite number; got nan"):
        F.attention(t, t, t, scale=math.nan)
