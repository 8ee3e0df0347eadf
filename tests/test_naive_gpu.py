"""The llm.c layout on the GPU: permute, attention_forward and unpermute against llm.c's CPU forward."""

import numpy as np
import pytest

import kernels
import reference as R
from kernels.basics import naive


@pytest.mark.parametrize("B,T,NH,hs", [(1, 1, 1, 8), (2, 7, 3, 16), (2, 64, 4, 32), (1, 100, 2, 64)])
@pytest.mark.parametrize("block", [32, 256, 1024])
def test_forward_packed_matches_llmc_cpu(gpu, poison, B, T, NH, hs, block):
    cp = gpu
    rng = np.random.default_rng(T)
    inp = rng.standard_normal((B, T, 3 * NH * hs)).astype(np.float32)
    out, preatt, att = naive.forward_packed(cp.asarray(inp), NH, block_size=block)
    out_ref, preatt_ref, att_ref = R.attention_forward_llmc(inp, NH)
    assert kernels.check(out, out_ref).ok
    assert kernels.check(preatt, preatt_ref).ok  # -inf above the diagonal must match exactly
    assert kernels.check(att, att_ref).ok


def test_permute_roundtrip(gpu, poison):
    cp = gpu
    inp = np.random.default_rng(0).standard_normal((2, 5, 3 * 4 * 8)).astype(np.float32)
    q, k, v = naive.permute_qkv(cp.asarray(inp), 4)
    for a, b in zip((q, k, v), R.permute_qkv(inp, 4)):
        np.testing.assert_array_equal(a.get(), b)
    np.testing.assert_array_equal(naive.unpermute(q).get(), inp[:, :, :32])
