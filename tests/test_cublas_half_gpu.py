"""16-bit cuBLAS attention (kernels/cublas/cublas_half.py): llm.c v5/v6, the half softmax, the permutes, bad input.

forward() itself is on the registry grid of tests/test_attention_gpu.py (cublas_fp16, cublas_bf16).
"""

import numpy as np
import pytest

import kernels
import reference as R
from kernels.cublas import cublas_half as CH
from reference import llmc

HALF = ["float16", "bfloat16"]


def _inp(B, T, NH, hs, seed, mag=1.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, T, 3 * NH * hs)) * mag).astype(np.float32)


def _as(x, dtype):
    """x rounded to dtype (round to nearest even, as the GPU's cvt.rn), back in float64."""
    return x.astype(dtype).astype(np.float64)


# ---- llm.c v5 and v6 against reference/llmc.py ------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("B,T,NH,hs", [(2, 64, 4, 64), (1, 100, 3, 12), (2, 1, 2, 8), (1, 257, 2, 128)])
@pytest.mark.parametrize("inp_dtype", ["float32", "half"])
def test_v5_matches_llmc(gpu, poison, dtype, B, T, NH, hs, inp_dtype):
    cp = gpu
    inp = _inp(B, T, NH, hs, seed=T + hs)
    host = inp if inp_dtype == "float32" else inp.astype(dtype)
    out = CH.attention_forward_v5(cp.asarray(host), NH, dtype=dtype)
    assert out.dtype == host.dtype and out.shape == (B, T, NH * hs)
    ref, _, _ = llmc.attention_forward_llmc(_as(inp, dtype), NH)  # the values the GEMMs see
    res = kernels.check(out, ref, dtype)
    assert res.ok, res.detail()


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mag", [1.0, 10.0])
def test_v6_matches_llmc(gpu, poison, dtype, mag):
    cp = gpu
    NH, hs = 12, 64
    inp = _inp(2, 128, NH, hs, seed=3, mag=mag)
    q, k, v = (cp.asarray(np.ascontiguousarray(x).astype(dtype)) for x in llmc.permute_qkv(inp, NH))
    o = CH.attention_forward_v6(q, k, v)
    assert o.dtype == q.dtype and o.shape == q.shape
    ref, _, _ = llmc.attention_forward_llmc(_as(inp, dtype), NH)
    res = kernels.check(llmc.unpermute(o.get().astype(np.float64)), ref, dtype)
    assert res.ok, res.detail()


# ---- the permutes move (and convert) values exactly -----------------------------------------------------

@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("hs", [64, 12, 8, 1])  # 64 and 8: 16-byte accesses; 12 and 1: one element per access
@pytest.mark.parametrize("src", ["float32", "half"])
def test_permute_and_unpermute_are_exact(gpu, poison, dtype, hs, src):
    cp = gpu
    B, T, NH = 2, 33, 3
    inp = _inp(B, T, NH, hs, seed=hs) * 100  # values beyond float16's 1-ulp-per-integer range
    host = inp.astype(dtype) if src == "half" else inp
    q, k, v = CH.permute_qkv(cp.asarray(host), NH, dtype=dtype)
    for got, want in zip((q, k, v), llmc.permute_qkv(inp.astype(dtype), NH)):
        assert got.dtype == np.dtype(dtype) and got.shape == want.shape
        assert np.array_equal(got.get().view(np.uint16), np.ascontiguousarray(want).view(np.uint16))
    for out_dtype in (None, "float32"):
        back = CH.unpermute(q, dtype=out_dtype)
        want = llmc.unpermute(q.get())
        assert back.dtype == np.dtype(out_dtype or dtype)
        assert np.array_equal(back.get().astype(np.float64), want.astype(np.float64))


def test_permute_of_a_misaligned_input_takes_the_scalar_path(gpu, poison):
    cp = gpu
    inp = _inp(1, 5, 2, 8, seed=1).astype("float16")
    base = cp.empty(inp.size + 1, dtype=cp.float16)
    shifted = base[1:].reshape(inp.shape)  # 2 bytes past a 16-byte boundary
    shifted[...] = cp.asarray(inp)
    q, k, v = CH.permute_qkv(shifted, 2)
    for got, want in zip((q, k, v), llmc.permute_qkv(inp, 2)):
        assert np.array_equal(got.get().view(np.uint16), np.ascontiguousarray(want).view(np.uint16))


# ---- the softmax between the GEMMs ------------------------------------------------------------------------

def _softmax_ref(raw, scale, causal):
    Tq, Tk = raw.shape[-2:]
    keep = R.causal_mask(Tq, Tk) if causal else np.ones((Tq, Tk), bool)
    return R.softmax_safe(np.where(keep, raw.astype(np.float64) * scale, -np.inf))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("Tq,Tk", [(1, 1), (7, 7), (33, 33), (1, 100), (100, 7), (64, 1024), (5, 3001), (3, 4096)])
@pytest.mark.parametrize("causal", [False, True])
def test_softmax_half(gpu, poison, dtype, Tq, Tk, causal):
    cp = gpu
    rng = np.random.default_rng(Tq * 7 + Tk)
    raw = (rng.standard_normal((2, 3, Tq, Tk)) * 8).astype(np.float32)
    if causal:  # masked entries are never read: poison them in the input too
        raw[..., ~R.causal_mask(Tq, Tk)] = np.nan
    p = CH.softmax_half(cp.asarray(raw), scale=0.125, causal=causal, dtype=dtype)
    assert p.dtype == np.dtype(dtype) and p.shape == raw.shape
    ref = _softmax_ref(raw, 0.125, causal)
    res = kernels.check(p, ref, dtype)
    assert res.ok, res.detail()
    if causal and Tq > Tk:  # rows i < Tq - Tk see no key: exactly zero, never NaN
        assert bool((p[..., : Tq - Tk, :] == 0).all())


@pytest.mark.parametrize("dtype", HALF)
def test_softmax_half_large_logits(gpu, poison, dtype):
    cp = gpu
    rng = np.random.default_rng(5)
    raw = (rng.standard_normal((4, 37, 260)) * 1000).astype(np.float32)  # exp overflows without the max
    for causal in (False, True):
        p = CH.softmax_half(cp.asarray(raw), scale=1.0, causal=causal, dtype=dtype)
        res = kernels.check(p, _softmax_ref(raw, 1.0, causal), dtype)
        assert res.ok, res.detail()


def test_softmax_half_misaligned_rows(gpu, poison):
    """Tk % 4 == 0 but a base pointer off a 16-byte boundary: the scalar path, same result."""
    cp = gpu
    raw = np.random.default_rng(9).standard_normal((6, 64)).astype(np.float32)
    base = cp.empty(raw.size + 1, dtype=cp.float32)
    s = base[1:].reshape(raw.shape)
    s[...] = cp.asarray(raw)
    p = CH.softmax_half(s, scale=0.5, causal=True, dtype="float16")
    assert kernels.check(p, _softmax_ref(raw, 0.5, True), "float16").ok


# ---- the GEMM path and the cupy.matmul comparison -----------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF)
def test_batched_matmul(gpu, poison, dtype):
    cp = gpu
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 33, 17)).astype(dtype)
    b = rng.standard_normal((3, 17, 40)).astype(dtype)
    c = CH.batched_matmul(cp.asarray(a), cp.asarray(b))
    assert c.dtype == np.dtype(dtype) and c.shape == (3, 33, 40)
    assert kernels.check(c, a.astype(np.float64) @ b.astype(np.float64), dtype).ok


def test_matmul_vs_gemmex_runs(gpu):
    from kernels.bench.attention import matmul_vs_gemmex

    rows = matmul_vs_gemmex(batch=2, shapes=((64, 32, 48),))
    assert [r["path"] for r in rows] == ["cupy.matmul", "cublasGemmStridedBatchedEx"]
    assert all(r["kernel ms"] > 0 and r["call ms"] > 0 and r["rel diff"] < 2e-3 for r in rows)
    rows = matmul_vs_gemmex(batch=2, shapes=((64, 32, 48),), dtype="bfloat16")
    assert rows[-1]["path"] == "cublasGemmStridedBatchedEx" and rows[-1]["kernel ms"] > 0  # cupy.matmul may refuse bf16


# ---- bad input gets a clear error ------------------------------------------------------------------------

def _qkv(cp, dtype="float16", T=16, d=32):
    rng = np.random.default_rng(0)
    return [cp.asarray(rng.standard_normal((1, 2, T, d)).astype(dtype)) for _ in range(3)]


def test_forward_errors(gpu):
    cp = gpu
    q, k, v = _qkv(cp)
    with pytest.raises(TypeError, match=r"q has dtype float32; this kernel takes float16, bfloat16"):
        CH.forward(q.astype(cp.float32), k, v)
    with pytest.raises(TypeError, match=r"q must be a cupy\.ndarray.*numpy\.ndarray"):
        CH.forward(q.get(), k, v)
    with pytest.raises(ValueError, match=r"k must be C-contiguous.*strides"):
        CH.forward(q[:, :, :8].copy(), k[:, :, ::2], v[:, :, :8].copy())
    with pytest.raises(TypeError, match=r"q, k, v must share one dtype"):
        CH.forward(q, k.astype("bfloat16"), v)
    with pytest.raises(ValueError, match=r"d=1032.*d <= 1024"):
        CH.attention_forward_v6(*_qkv(cp, d=1032))


def test_permute_and_softmax_errors(gpu):
    cp = gpu
    inp32 = cp.ones((1, 4, 24), dtype=cp.float32)
    with pytest.raises(ValueError, match=r"inp is float32: pass dtype='float16' or dtype='bfloat16'"):
        CH.permute_qkv(inp32, 2)
    with pytest.raises(ValueError, match=r"last dimension \(24\) must be 3 \* NH \* head_size with NH=5"):
        CH.attention_forward_v5(inp32, 5, dtype="float16")
    with pytest.raises(TypeError, match=r"inp has dtype float16 but dtype=bfloat16"):
        CH.permute_qkv(inp32.astype(cp.float16), 2, dtype="bfloat16")
    with pytest.raises(TypeError, match=r"dtype must be float16 or bfloat16; got float32"):
        CH.permute_qkv(inp32, 2, dtype="float32")
    with pytest.raises(TypeError, match=r"inp has dtype float64"):
        CH.permute_qkv(inp32.astype(cp.float64), 2)
    with pytest.raises(ValueError, match=r"inp must be C-contiguous"):
        CH.permute_qkv(cp.ones((1, 8, 24), dtype=cp.float16)[:, ::2], 2)
    o = cp.ones((1, 2, 4, 8), dtype=cp.float16)
    with pytest.raises(TypeError, match=r"unpermute writes float16 or float32; got dtype=bfloat16"):
        CH.unpermute(o, dtype="bfloat16")
    s = cp.ones((2, 4, 8), dtype=cp.float32)
    with pytest.raises(TypeError, match=r"dtype must be float16 or bfloat16; got float64"):
        CH.softmax_half(s, scale=1.0, dtype="float64")
    with pytest.raises(TypeError, match=r"s has dtype float16; this kernel takes float32"):
        CH.softmax_half(s.astype(cp.float16), scale=1.0)
    with pytest.raises(ValueError, match=r"out has shape"):
        CH.softmax_half(s, scale=1.0, out=cp.empty((2, 4, 9), dtype=cp.float16))
    with pytest.raises(ValueError, match=r"a \(2, 3, 4\) and b \(2, 5, 6\) must be"):
        CH.batched_matmul(cp.ones((2, 3, 4), cp.float16), cp.ones((2, 5, 6), cp.float16))
