"""flash2_mma's variant kernel (flash2_mma_variants) against the float64 oracle reference.variants.attention_variant,
on the GPU: GQA/MQA (Hq / Hkv = 1, 2, 4, 8), sliding windows with and without causal (some leaving rows that see no
key: o = 0, lse = -inf), prefix-LM, document ids (documents of one token, Tq != Tk, query documents no key belongs
to), tanh soft-capping, ALiBi and their mixes; float16 and bfloat16, d = 64 and 128 (and d = 256, Gemma's head size,
on a subset: GQA, causal, window, documents, softcap, all of them at once), ragged lengths, std-10 inputs; the limits of
the head size. Outputs are poisoned (NaN) before each launch. About 130 cases, a few seconds once the builds are
compiled."""

import numpy as np
import pytest

import kernels
from reference.variants import attention_variant

DTYPES = ["float16", "bfloat16"]
HEAD_DIMS = [64, 128]


def _docs(B, lengths):
    """(B, sum(lengths)) int32 document ids: batch entry b holds the documents in `lengths` rotated by b."""
    return np.stack([np.repeat(np.arange(len(lengths)), np.roll(lengths, b)) for b in range(B)]).astype(np.int32)


def _slopes(Hq):
    return (2.0 ** (-8.0 * np.arange(1, Hq + 1) / Hq)).astype(np.float32)


CROSS_Q = np.repeat([0, 1, 2, 3], [30, 1, 40, 29])  # 100 queries; document 1 has no key
CROSS_K = np.repeat([0, 2, 3], [100, 50, 100])  # 250 keys

# (id, B, Hq, Hkv, Tq, Tk, std, options); options may name "docs" (lengths, or "cross"), "alibi" (True), the rest as
# forward() takes them.
CASES = [
    ("gqa2-causal", 2, 4, 2, 257, 257, 1.0, dict(causal=True)),
    ("gqa4-full-x10", 1, 8, 2, 100, 300, 10.0, dict()),
    ("mqa8-causal-Tq>Tk", 1, 8, 1, 300, 100, 1.0, dict(causal=True)),  # rows before the diagonal see no key
    ("gqa1-window-causal", 2, 2, 2, 300, 300, 1.0, dict(causal=True, window=(32, 0))),
    ("window-both-sides-x10", 1, 2, 2, 257, 257, 10.0, dict(window=(16, 8))),
    ("window-left-only-Tq<Tk", 1, 2, 2, 100, 400, 1.0, dict(causal=True, window=(64, None))),
    ("window-diagonal-Tq>Tk", 1, 2, 2, 300, 100, 1.0, dict(window=(0, 0))),  # 200 rows see no key
    ("window-causal-Tq>Tk", 1, 2, 2, 300, 100, 10.0, dict(causal=True, window=(10, 0))),
    ("prefix-lm", 2, 2, 2, 300, 300, 1.0, dict(causal=True, prefix=70)),
    ("prefix-sinks-window", 1, 4, 2, 257, 257, 1.0, dict(causal=True, window=(20, 0), prefix=33)),
    ("prefix-Tq<Tk", 1, 2, 2, 129, 400, 10.0, dict(causal=True, prefix=100)),
    ("docs-causal", 2, 2, 2, 257, 257, 1.0, dict(causal=True, docs=[1, 100, 37, 1, 118])),
    ("docs-ones-full", 2, 2, 1, 200, 200, 10.0, dict(docs=[1, 1, 64, 1, 1, 70, 1, 61])),
    ("docs-cross", 2, 2, 2, 100, 250, 1.0, dict(docs="cross")),  # a query document without keys
    ("docs-cross-causal", 1, 4, 4, 100, 250, 1.0, dict(causal=True, docs="cross")),
    ("docs-prefix", 1, 2, 2, 300, 300, 1.0, dict(causal=True, prefix=50, docs=[120, 1, 179])),
    ("softcap30-causal-x10", 2, 2, 2, 257, 257, 10.0, dict(causal=True, softcap=30.0)),
    ("softcap5-full", 1, 4, 2, 100, 300, 1.0, dict(softcap=5.0)),
    ("alibi-causal", 2, 4, 4, 257, 257, 1.0, dict(causal=True, alibi=True)),
    ("alibi-full-Tq>Tk-x10", 1, 4, 2, 300, 100, 10.0, dict(alibi=True)),
    ("all-mods-gqa4", 2, 8, 2, 300, 300, 1.0,
     dict(causal=True, window=(100, 0), docs=[1, 150, 49, 100], softcap=20.0, alibi=True)),
    ("softcap-alibi-window-x10", 1, 4, 2, 257, 333, 10.0, dict(window=(50, 50), softcap=30.0, alibi=True)),
]


def _inputs(cp, dtype, B, Hq, Hkv, Tq, Tk, d, std, seed):
    rng = np.random.default_rng(seed)
    host = [rng.standard_normal((B, Hq, Tq, d)) * std, rng.standard_normal((B, Hkv, Tk, d)) * std,
            rng.standard_normal((B, Hkv, Tk, d))]
    dev = [cp.asarray(x.astype(dtype)) for x in host]
    return dev, [x.get().astype(np.float64) for x in dev]  # the reference sees the values the GPU sees


def _options(cp, B, Hq, Tq, Tk, options):
    """(kwargs for forward, kwargs for attention_variant)."""
    options = dict(options)
    gpu, ref = {}, {}
    docs = options.pop("docs", None)
    if docs is not None:
        if docs == "cross":
            ids_q, ids_k = np.tile(CROSS_Q, (B, 1)).astype(np.int32), np.tile(CROSS_K, (B, 1)).astype(np.int32)
            assert ids_q.shape == (B, Tq) and ids_k.shape == (B, Tk)
            gpu.update(doc_ids_q=cp.asarray(ids_q), doc_ids_k=cp.asarray(ids_k))
            ref.update(doc_ids_q=ids_q, doc_ids_k=ids_k)
        else:
            ids = _docs(B, docs)
            assert Tq == Tk == ids.shape[1]
            gpu.update(doc_ids_q=cp.asarray(ids))  # doc_ids_k defaults to doc_ids_q
            ref.update(doc_ids_q=ids)
    if options.pop("alibi", False):
        gpu["alibi_slopes"] = cp.asarray(_slopes(Hq))
        ref["alibi_slopes"] = _slopes(Hq).astype(np.float64)
    gpu.update(options)
    ref.update(options)
    return gpu, ref


# The cases that also run at d = 256 (the D = 256 build, BR = 64 query rows and BC = 32 keys per tile): GQA 4 with
# Tq < Tk and std-10 inputs, MQA causal with rows that see no key, a causal window, a window that leaves rows without
# a key, documents with a query document no key belongs to, softcap, and every option at once.
D256_CASES = {"gqa4-full-x10", "mqa8-causal-Tq>Tk", "gqa1-window-causal", "window-diagonal-Tq>Tk", "docs-cross",
              "softcap30-causal-x10", "all-mods-gqa4"}


def _variant_cases():
    for case in CASES:
        for dtype in DTYPES:
            for d in HEAD_DIMS + ([256] if case[0] in D256_CASES else []):
                yield pytest.param(dtype, d, *case[1:], id=f"{case[0]}-{dtype}-d{d}")


@pytest.mark.parametrize("dtype,d,B,Hq,Hkv,Tq,Tk,std,options", list(_variant_cases()))
def test_variant_matches_the_oracle(gpu, poison, dtype, d, B, Hq, Hkv, Tq, Tk, std, options):
    from kernels.flash import flash2_mma

    cp = gpu
    dev, host = _inputs(cp, dtype, B, Hq, Hkv, Tq, Tk, d, std, seed=Tq * 7 + Tk + d + Hq)
    gpu_kw, ref_kw = _options(cp, B, Hq, Tq, Tk, options)
    o, lse = flash2_mma.forward(*dev, return_lse=True, **gpu_kw)
    o_ref, lse_ref = attention_variant(*host, return_lse=True, **ref_kw)
    assert o.dtype == dev[0].dtype and o.shape == o_ref.shape and lse.shape == lse_ref.shape
    tol = kernels.tested_variants()["flash2_mma"].tolerance_class(dtype)
    for name, got, want in (("lse", lse, lse_ref), ("o", o, o_ref)):
        res = kernels.check(got, want, tol)
        assert res.ok, f"{name}: {res.detail()}"
    empty = np.isneginf(lse_ref)
    if empty.any():  # rows that see no key: exactly 0 and -inf
        assert bool((o.get()[empty] == 0).all()) and bool(np.isneginf(lse.get()[empty]).all())


@pytest.mark.parametrize("Hkv", [8, 4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_ratios(gpu, poison, Hkv, causal):
    """Hq / Hkv = 1, 2, 4, 8 with no other option (Hkv = Hq takes the dense kernel, the others the variant kernel)."""
    from kernels.flash import flash2_mma

    cp = gpu
    dev, host = _inputs(cp, "float16", 2, 8, Hkv, 193, 150, 64, 1.0, seed=Hkv)
    o, lse = flash2_mma.forward(*dev, causal=causal, return_lse=True)
    o_ref, lse_ref = attention_variant(*host, causal=causal, return_lse=True)
    for name, got, want in (("lse", lse, lse_ref), ("o", o, o_ref)):
        res = kernels.check(got, want, "float16")
        assert res.ok, f"{name}: {res.detail()}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Tq,Tk,d", [(300, 300, 64), (129, 1000, 128), (257, 33, 32), (100, 7, 96), (200, 333, 256)])
def test_variant_kernel_without_options_gives_the_dense_bits(gpu, poison, dtype, causal, Tq, Tk, d):
    """forward_variants with no option runs the band of the causal mask (or none) through key_tiles: the same tiles,
    the same FULL / masked split and the same arithmetic as the dense kernel, so the same bits of o and lse."""
    from kernels.flash import flash2_mma

    cp = gpu
    dev, _ = _inputs(cp, dtype, 2, 3, 3, Tq, Tk, d, 1.0, seed=Tq + Tk)
    a = flash2_mma.forward(*dev, causal=causal, return_lse=True)
    b = flash2_mma.forward_variants(*dev, causal=causal, return_lse=True)
    assert bool((a[0].view(cp.uint16) == b[0].view(cp.uint16)).all()), "o differs"
    assert bool((a[1].view(cp.uint32) == b[1].view(cp.uint32)).all()), "lse differs"


def assert_bad_variant_arrays_raise(cp, forward):
    """forward (a variant launcher) raises the clear error for ids given as NumPy or int64, slopes of the wrong
    length, Hq % Hkv != 0 and a negative window (the checks both variant kernels share)."""
    dev, _ = _inputs(cp, "float16", 2, 4, 2, 64, 64, 64, 1.0, seed=0)
    ids = _docs(2, [32, 32])
    with pytest.raises(TypeError, match=r"doc_ids_q must be a cupy\.ndarray"):
        forward(*dev, doc_ids_q=ids)
    with pytest.raises(TypeError, match=r"doc_ids_q has dtype int64"):
        forward(*dev, doc_ids_q=cp.asarray(ids.astype(np.int64)))
    with pytest.raises(ValueError, match=r"alibi_slopes must have shape \(Hq,\)"):
        forward(*dev, alibi_slopes=cp.ones(2, dtype=cp.float32))
    with pytest.raises(ValueError, match=r"Hq % Hkv == 0"):
        forward(dev[0], dev[1][:, :1].copy().repeat(3, axis=1), dev[2][:, :1].copy().repeat(3, axis=1))
    with pytest.raises(ValueError, match=r"window left must be >= 0"):
        forward(*dev, window=(-1, 0))


def test_bad_arrays_on_the_gpu(gpu):
    """The arrays are checked on the call path too: NumPy ids, ids of the wrong dtype, slopes of the wrong length."""
    from kernels.flash import flash2_mma

    cp = gpu
    assert_bad_variant_arrays_raise(cp, flash2_mma.forward)
    with pytest.raises(ValueError, match=r"d=264.*d <= 256"):
        big = cp.zeros((1, 2, 16, 264), dtype=cp.float16)
        flash2_mma.forward(big, big, big, softcap=30.0)


@pytest.mark.parametrize("d,error", [
    pytest.param(257, r"head dimension d=257 is larger than flash2_mma attention supports \(d <= 256\)", id="d257"),
    pytest.param(264, r"head dimension d=264 is larger .*\(d <= 256\)", id="d264"),
    pytest.param(252, r"head dimension d=252 must be a multiple of 8 for flash2_mma attention", id="d252"),
])
def test_head_size_limits(gpu, d, error):
    """d past the largest build (256) or not a multiple of 8: the same ValueError from the dense kernel's launcher and
    the variant kernel's (an option; k and v with fewer heads than q)."""
    from kernels.flash import flash2_mma

    cp = gpu
    q = cp.zeros((1, 4, 16, d), dtype=cp.float16)
    kv = cp.zeros((1, 2, 16, d), dtype=cp.float16)
    for call in (lambda: flash2_mma.forward(q, q, q, causal=True), lambda: flash2_mma.forward(q, q, q, window=(8, 0)),
                 lambda: flash2_mma.forward(q, kv, kv)):
        with pytest.raises(ValueError, match=error):
            call()
