"""The Hopper forward's variant kernels (kernels/hopper/hopper_attn.cu, -D VARIANT_MODS) against the float64 oracle
reference.variants.attention_variant, on a Hopper GPU (compute capability 9.x; skipped elsewhere with the reason).

The cases are flash2_mma's (tests/test_flash2_variants_gpu.py: GQA/MQA, sliding windows with and without causal,
some leaving rows that see no key, prefix-LM, document ids with documents of one token and query documents no key
belongs to, Tq != Tk, tanh soft-capping, ALiBi, their mixes, std-10 inputs), float16 and bfloat16 at d = 64 and 128,
plus what the Hopper kernel does differently: persistent CTAs walking several work tiles, EMPTY document tiles
skipped while the two-slot rings wrap and along rows of classes it reads four at a time, a negative scale on unmasked
raw-score tiles, decoding (Tq = 1) under a window, the other schedules and launches, and GQA ratios 1/2/4/8. Outputs
are poisoned (NaN) before each launch; rows that see no key must be exactly 0 with lse = -inf.
"""

import numpy as np
import pytest

import kernels
from reference.variants import attention_variant
from test_flash2_variants_gpu import CASES as FLASH2_CASES
from test_flash2_variants_gpu import D256_CASES
from test_flash2_variants_gpu import _inputs, _options, assert_bad_variant_arrays_raise

DTYPES = ["float16", "bfloat16"]
HEAD_DIMS = [64, 128]

# (id, B, Hq, Hkv, Tq, Tk, std, options) as in FLASH2_CASES; each runs at float16 d = 64 and bfloat16 d = 128
HOPPER_CASES = [
    ("gqa4-persistent-192-work-tiles", 2, 32, 8, 300, 300, 1.0, dict(softcap=30.0)),  # > 132 CTAs' worth of tiles
    ("docs-empty-tiles-rings-wrap", 1, 4, 2, 1100, 1100, 1.0, dict(causal=True, docs=[300, 1, 500, 299])),
    ("docs-long-rows-of-classes", 1, 2, 2, 2100, 2100, 1.0, dict(docs=[700, 1, 130, 1269])),  # 17 tiles a row
    ("window-negative-scale", 1, 4, 4, 500, 700, 1.0, dict(window=(200, 100), scale=-0.1)),
    ("decode-window-mqa", 2, 8, 1, 1, 700, 1.0, dict(causal=True, window=(300, 0))),
    ("all-mods-long-x10", 1, 2, 1, 900, 1300, 10.0,
     dict(causal=True, window=(256, 0), prefix=130, softcap=50.0, alibi=True)),
]


def _cases():
    for case in FLASH2_CASES:
        for dtype in DTYPES:
            for d in HEAD_DIMS + ([256] if case[0] in D256_CASES else []):  # flash2_mma's d = 256 cases too
                yield pytest.param(dtype, d, *case[1:], id=f"{case[0]}-{dtype}-d{d}")
    for case in HOPPER_CASES:
        for dtype, d in (("float16", 64), ("bfloat16", 128)):
            yield pytest.param(dtype, d, *case[1:], id=f"{case[0]}-{dtype}-d{d}")


def _check(cp, dtype, d, B, Hq, Hkv, Tq, Tk, std, options, **launch):
    from kernels.hopper import hopper_attn as A

    dev, host = _inputs(cp, dtype, B, Hq, Hkv, Tq, Tk, d, std, seed=Tq * 7 + Tk + d + Hq)
    gpu_kw, ref_kw = _options(cp, B, Hq, Tq, Tk, options)
    o, lse = A.forward(*dev, return_lse=True, **gpu_kw, **launch)
    o_ref, lse_ref = attention_variant(*host, return_lse=True, **ref_kw)
    assert o.dtype == dev[0].dtype and o.shape == o_ref.shape and lse.shape == lse_ref.shape
    for name, got, want in (("lse", lse, lse_ref), ("o", o, o_ref)):
        res = kernels.check(got, want, dtype)
        assert res.ok, f"{name}: {res.detail()}"
    empty = np.isneginf(lse_ref)
    if empty.any():  # rows that see no key: exactly 0 and -inf
        assert bool((o.get()[empty] == 0).all()) and bool(np.isneginf(lse.get()[empty]).all())


@pytest.mark.parametrize("dtype,d,B,Hq,Hkv,Tq,Tk,std,options", list(_cases()))
def test_variant_matches_the_oracle(hopper, poison, dtype, d, B, Hq, Hkv, Tq, Tk, std, options):
    _check(hopper, dtype, d, B, Hq, Hkv, Tq, Tk, std, options)


ALL_MODS = ("float16", 64, 2, 8, 2, 300, 300, 1.0,
            dict(causal=True, window=(100, 0), docs=[1, 150, 49, 100], softcap=20.0, alibi=True))


@pytest.mark.parametrize("launch", [dict(overlap=False), dict(pingpong=False), dict(overlap=False, pingpong=False),
                                    dict(lazy_rescale=False), dict(persistent=True)],
                         ids=lambda x: "-".join(f"{k}{int(v)}" for k, v in x.items()))
def test_other_schedules_and_launches(hopper, poison, launch):
    """The plain loop, no ping-pong, eager rescaling and persistent CTAs (whose work tiles walk different key tiles)
    with every switch on: each its own build or launch."""
    _check(hopper, *ALL_MODS, **launch)


# Without documents, at d = 64 and 128, the variant kernels have the dynamic schedule too (the default under a mask):
# every modifier but documents, a window with the prefix, GQA, more work tiles than SMs.
NO_DOCS = ("float16", 64, 2, 16, 4, 600, 600, 1.0,  # 5 query tiles x 32 heads: 160 work tiles
           dict(causal=True, window=(300, 0), prefix=70, softcap=20.0, alibi=True))


@pytest.mark.parametrize("launch", ["dynamic", False, True])
@pytest.mark.parametrize("dtype,d", [("float16", 64), ("bfloat16", 128)])
def test_launches_without_documents(hopper, poison, launch, dtype, d):
    _check(hopper, dtype, d, *NO_DOCS[2:], persistent=launch)
    _check(hopper, dtype, d, 1, 32, 32, 600, 600, 1.0, dict(causal=True, softcap=30.0), persistent=launch)


def test_tanh_error(hopper, poison):
    """The soft-capping forward's tanh (ptx/common.cuh's tanh_approx): with one key, lse is the one logit, so with
    softcap = 1, scale = 1 and k = e_0, lse_i = tanh(q_i0) to float32 rounding; its absolute error stays within
    1e-5 over [-12, 12] (7.8e-6 measured on the H100)."""
    from kernels.hopper import hopper_attn as A

    cp = hopper
    x = np.linspace(-12.0, 12.0, 8192).astype(np.float16)
    q = np.zeros((1, 1, x.size, 64), np.float16)
    q[0, 0, :, 0] = x
    k = np.zeros((1, 1, 1, 64), np.float16)
    k[0, 0, 0, 0] = 1.0
    _, lse = A.forward(cp.asarray(q), cp.asarray(k), cp.asarray(k), scale=1.0, softcap=1.0, return_lse=True)
    err = np.abs(lse.get()[0, 0].astype(np.float64) - np.tanh(x.astype(np.float64)))
    assert err.max() <= 1e-5, f"max |lse - tanh(x)| = {err.max():.3g} at x = {x[err.argmax()]}"


@pytest.mark.parametrize("Hkv", [8, 4, 2, 1])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_ratios(hopper, poison, Hkv, causal):
    """Hq / Hkv = 1, 2, 4, 8 with no other option: the dense kernel, its tensor maps of k and v over B Hkv heads."""
    _check(hopper, "float16", 128, 2, 8, Hkv, 193, 150, 1.0, dict(causal=causal))


@pytest.mark.parametrize("launch", [False, True, "dynamic"])
@pytest.mark.parametrize("dtype,d", [("bfloat16", 64), ("float16", 128), ("bfloat16", 256)])
def test_gqa_in_the_dense_kernel_every_launch(hopper, poison, dtype, d, launch):
    """Grouped heads in the dense kernel with each launch, more work tiles than SMs (a CTA walks several heads, each
    reading its group's K and V); Tq < Tk and std 10 under the causal mask."""
    _check(hopper, dtype, d, 2, 16, 4, 600, 600, 1.0, dict(causal=True), persistent=launch)
    _check(hopper, dtype, d, 1, 8, 2, 300, 457, 10.0, dict(causal=True), persistent=launch)


def test_bad_inputs_are_clear_errors(hopper):
    """The same checks and messages as flash2_mma's, on the call path: ids as NumPy or int64, slopes of the wrong
    length, Hq % Hkv != 0, a negative window, a head dimension the tiles do not have."""
    from kernels.hopper import hopper_attn as A

    cp = hopper
    assert_bad_variant_arrays_raise(cp, A.forward)
    with pytest.raises(ValueError, match=r"head dimension d=96 is not supported"):
        x = cp.zeros((1, 2, 16, 96), dtype=cp.float16)
        A.forward(x, x[:, :1].copy(), x[:, :1].copy(), softcap=30.0)
