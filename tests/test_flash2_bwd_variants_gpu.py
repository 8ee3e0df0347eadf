"""flash2_mma_bwd's variant kernel (flash2_bwd_variants) against the float64 oracle
reference.variants.attention_variant_backward, on the GPU: dq, dk, dv over the forward test's configurations
(tests/test_flash2_variants_gpu.py: GQA/MQA, windows that leave rows fully masked, prefix-LM, documents of one token and
query documents without keys, softcap, ALiBi, their mixes, Tq != Tk both ways, ragged lengths), float16 and bfloat16,
d = 64 and 128; the GQA ratios 1/2/4/8; the variant kernel without options against the dense backward, bit for bit
(dq too where one block of keys makes it: past that its float32 atomics add in a varying order); errors.

The tolerance is the dense backward's (kernels.check by dtype, tests/test_torch_ops_gpu.py). Inputs of std 1 or 4 (the
forward test's std-10 cases run at 4, the dense backward's largest magnitude). By default each configuration runs in
one (dtype, d) and the rest are marked full_grid (`pytest --full-grid` runs them all). Outputs poisoned (NaN) first.
"""

import numpy as np
import pytest

import kernels
from reference.variants import attention_variant_backward
from test_flash2_variants_gpu import CASES, _options

COMBOS = [("float16", 64), ("bfloat16", 128), ("float16", 128), ("bfloat16", 64)]  # (dtype, d), the default cycles
BWD_STD = {1.0: 1.0, 10.0: 4.0}  # the forward test's std -> the one used here


def _inputs(cp, dtype, B, Hq, Hkv, Tq, Tk, d, std, seed):
    """q, k, v, do on the GPU and the float64 values the GPU sees."""
    rng = np.random.default_rng(seed)
    host = [rng.standard_normal((B, Hq, Tq, d)) * std, rng.standard_normal((B, Hkv, Tk, d)) * std,
            rng.standard_normal((B, Hkv, Tk, d)), rng.standard_normal((B, Hq, Tq, d))]
    dev = [cp.asarray(x.astype(dtype)) for x in host]
    return dev, [x.get().astype(np.float64) for x in dev]


def _check_gradients(cp, dtype, dev, host, gpu_kw, ref_kw):
    """forward with return_lse, then backward with the same options, against attention_variant_backward."""
    from kernels.flash import flash2_mma, flash2_mma_bwd

    q, k, v, do = dev
    o, lse = flash2_mma.forward(q, k, v, return_lse=True, **gpu_kw)
    dq, dk, dv = flash2_mma_bwd.backward(q, k, v, o, lse, do, **gpu_kw)
    refs = attention_variant_backward(*host, **ref_kw)
    for name, got, want, like in (("dq", dq, refs[0], q), ("dk", dk, refs[1], k), ("dv", dv, refs[2], v)):
        assert got.dtype == like.dtype and got.shape == like.shape == want.shape, name
        res = kernels.check(got, want, dtype)
        assert res.ok, f"{name}: {res.detail()}"
    blind = np.isneginf(lse.get())  # rows that see no key: exactly zero dq
    if blind.any():
        assert not bool(cp.any(dq.view(cp.uint16)[cp.asarray(blind)])), "rows that see no key must get zero dq"


def _variant_cases():
    for i, case in enumerate(CASES):
        for dtype, d in COMBOS:
            default = (dtype, d) == COMBOS[i % len(COMBOS)]
            yield pytest.param(dtype, d, *case[1:], id=f"{case[0]}-{dtype}-d{d}",
                               marks=() if default else (pytest.mark.full_grid,))


@pytest.mark.parametrize("dtype,d,B,Hq,Hkv,Tq,Tk,std,options", list(_variant_cases()))
def test_variant_gradients_match_the_oracle(gpu, poison, dtype, d, B, Hq, Hkv, Tq, Tk, std, options):
    cp = gpu
    dev, host = _inputs(cp, dtype, B, Hq, Hkv, Tq, Tk, d, BWD_STD[std], seed=Tq * 7 + Tk + d + Hq)
    gpu_kw, ref_kw = _options(cp, B, Hq, Tq, Tk, options)
    _check_gradients(cp, dtype, dev, host, gpu_kw, ref_kw)


@pytest.mark.parametrize("Hkv,causal", [pytest.param(Hkv, causal, marks=() if causal == (Hkv in (4, 1)) else
                                                     (pytest.mark.full_grid,)) for Hkv in (8, 4, 2, 1)
                                        for causal in (False, True)])
def test_gqa_ratios(gpu, poison, Hkv, causal):
    """Hq / Hkv = 1, 2, 4, 8 with no other option (Hkv = Hq takes the dense kernel, the others the variant kernel and
    the reduce of the query heads' float32 parts)."""
    cp = gpu
    dtype = "bfloat16" if causal else "float16"
    dev, host = _inputs(cp, dtype, 2, 8, Hkv, 193, 150, 64, 1.0, seed=Hkv)
    _check_gradients(cp, dtype, dev, host, dict(causal=causal), dict(causal=causal))


def _dense_cases():
    for i, (Tq, Tk, d) in enumerate([(300, 300, 64), (129, 1000, 128), (257, 33, 32), (100, 7, 96)]):
        for causal in (False, True):
            for dtype in ("float16", "bfloat16"):
                default = (causal, dtype) == ((False, "float16"), (True, "bfloat16"), (True, "float16"),
                                              (False, "bfloat16"))[i]
                yield pytest.param(dtype, causal, Tq, Tk, d, id=f"{Tq}-{Tk}-{d}-{'causal' if causal else 'full'}-"
                                   f"{dtype}", marks=() if default else (pytest.mark.full_grid,))


@pytest.mark.parametrize("dtype,causal,Tq,Tk,d", list(_dense_cases()))
def test_variant_kernel_without_options_gives_the_dense_bits(gpu, poison, dtype, causal, Tq, Tk, d):
    """backward_variants with no option walks the query tiles the dense kernel walks (query_tiles of the causal band, or
    all), with the same arithmetic: the same bits of dk and dv, and of dq where one block holds every key (one atomic
    add per element); with more blocks dq is checked against the oracle, both kernels' dq."""
    from kernels.flash import flash2_mma, flash2_mma_bwd

    cp = gpu
    dev, host = _inputs(cp, dtype, 2, 3, 3, Tq, Tk, d, 1.0, seed=Tq + Tk)
    q, k, v, do = dev
    o, lse = flash2_mma.forward(q, k, v, causal=causal, return_lse=True)
    a = flash2_mma_bwd.backward(q, k, v, o, lse, do, causal=causal)
    b = flash2_mma_bwd.backward_variants(q, k, v, o, lse, do, causal=causal)
    for name, x, y in zip(("dq", "dk", "dv"), a, b):
        if name == "dq" and Tk > flash2_mma_bwd.TILES[flash2_mma_bwd.BUILD_FOR[d]].keys:
            ref = attention_variant_backward(*host, causal=causal)[0]
            for got in (x, y):
                res = kernels.check(got, ref, dtype)
                assert res.ok, f"dq: {res.detail()}"
        else:
            assert bool((x.view(cp.uint16) == y.view(cp.uint16)).all()), f"{name} differs"


def test_bad_options_on_the_gpu(gpu):
    """The forward's checks and errors, on the backward's call path."""
    from kernels.flash import flash2_mma, flash2_mma_bwd

    cp = gpu
    dev, _ = _inputs(cp, "float16", 2, 4, 2, 64, 64, 64, 1.0, seed=0)
    q, k, v, do = dev
    o, lse = flash2_mma.forward(q, k, v, return_lse=True)
    ids = np.zeros((2, 64), np.int32)
    with pytest.raises(TypeError, match=r"doc_ids_q must be a cupy\.ndarray"):
        flash2_mma_bwd.backward(q, k, v, o, lse, do, doc_ids_q=ids)
    with pytest.raises(TypeError, match=r"doc_ids_q has dtype int64"):
        flash2_mma_bwd.backward(q, k, v, o, lse, do, doc_ids_q=cp.asarray(ids.astype(np.int64)))
    with pytest.raises(ValueError, match=r"alibi_slopes must have shape \(Hq,\)"):
        flash2_mma_bwd.backward(q, k, v, o, lse, do, alibi_slopes=cp.ones(2, dtype=cp.float32))
    with pytest.raises(ValueError, match=r"Hq % Hkv == 0"):
        k3, v3 = (x[:, :1].copy().repeat(3, axis=1) for x in (k, v))
        flash2_mma_bwd.backward(q, k3, v3, o, lse, do)
    with pytest.raises(ValueError, match=r"window left must be >= 0"):
        flash2_mma_bwd.backward(q, k, v, o, lse, do, window=(-1, 0))
    with pytest.raises(ValueError, match=r"softcap must be a finite number > 0"):
        flash2_mma_bwd.backward(q, k, v, o, lse, do, softcap=0.0)
    with pytest.raises(ValueError, match=r"lse"):
        flash2_mma_bwd.backward(q, k, v, o, lse[:, :, :8].copy(), do, causal=True, window=(8, 0))
    with pytest.raises(ValueError, match=r"dk has shape"):
        flash2_mma_bwd.backward(q, k, v, o, lse, do, dk=cp.empty_like(q))
    # the shared checks name the backward, not the forward, on the grouped path too (k, v have 2 heads for q's 4)
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0 for flash2_mma_bwd"):
        flash2_mma_bwd.backward(q, k, v, o, lse, do, scale=float("nan"))
    shifted = cp.empty(k.size + 8, dtype=k.dtype)[1:1 + k.size].reshape(k.shape)  # 2 bytes past a 16-byte boundary
    shifted[...] = k
    with pytest.raises(ValueError, match=r"k starts at address .* flash2_mma_bwd attention backward reads"):
        flash2_mma_bwd.backward(q, shifted, v, o, lse, do)
    # the forward takes d = 256, the backward not (d <= 128), with k and v of fewer heads too
    q256, kv256 = cp.zeros((1, 4, 16, 256), dtype=cp.float16), cp.zeros((1, 2, 16, 256), dtype=cp.float16)
    for kv in (q256, kv256):
        with pytest.raises(ValueError, match=r"d=256 is larger than flash2_mma_bwd attention backward supports "
                                             r"\(d <= 128\)"):
            flash2_mma_bwd.backward(q256, kv, kv, q256, lse[:1, :, :16].copy(), q256)
