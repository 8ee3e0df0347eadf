"""The float64 oracle: each function against a direct formula, and the algorithms against each other."""

import numpy as np
import pytest

import reference as R

SHAPES = [  # (B, H, Tq, Tk, d): square, ragged, decode, more queries than keys
    (1, 1, 1, 1, 4),
    (2, 3, 7, 7, 16),
    (2, 2, 33, 33, 8),
    (1, 2, 37, 53, 16),
    (2, 1, 53, 37, 16),
    (1, 2, 1, 100, 32),
    (1, 1, 100, 1, 8),
]


def direct_attention(q, k, v, causal, scale):
    """Loop-per-row attention straight from the definition, as independent of attention() as possible."""
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    o = np.zeros((B, H, Tq, d))
    lse = np.full((B, H, Tq), -np.inf)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                keys = [j for j in range(Tk) if not causal or j <= i + Tk - Tq]
                if not keys:
                    continue
                s = np.array([scale * float(np.dot(q[b, h, i], k[b, h, j])) for j in keys])
                w = np.exp(s - s.max())
                o[b, h, i] = (w[:, None] * v[b, h, keys]).sum(0) / w.sum()
                lse[b, h, i] = s.max() + np.log(w.sum())
    return o, lse


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_definition(shape, causal):
    B, H, Tq, Tk, d = shape
    q, k, v = R.make_qkv(B, H, Tq, d, Tk, seed=Tq * 31 + Tk, dtype=np.float64)
    o, lse = R.attention(q, k, v, causal=causal, return_lse=True)
    o_ref, lse_ref = direct_attention(q, k, v, causal, 1 / np.sqrt(d))
    np.testing.assert_allclose(o, o_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-12)


def test_causal_alignment_is_bottom_right():
    m = R.causal_mask(2, 5)  # 2 queries, 5 keys: the last query sees all keys, the first all but one
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    m = R.causal_mask(5, 2)  # more queries than keys: the first three see nothing
    assert m.sum(axis=1).tolist() == [0, 0, 0, 1, 2]


def test_rows_that_see_no_key_are_zero_not_nan():
    q, k, v = R.make_qkv(1, 2, 6, 8, 3)
    o, lse = R.attention(q, k, v, causal=True, return_lse=True)
    assert not np.isnan(o).any()
    assert (o[:, :, :3] == 0).all() and np.isneginf(lse[:, :, :3]).all()
    assert np.isfinite(lse[:, :, 3:]).all()


def test_explicit_scale():
    q, k, v = R.make_qkv(1, 1, 5, 4)
    a = R.attention(q, k, v, scale=0.3)
    b, _ = direct_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), False, 0.3)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_softmax_three_ways_agree_and_naive_overflows():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 37)) * 3
    ref = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    for f in (R.softmax_naive, R.softmax_safe, R.softmax_online):
        np.testing.assert_allclose(f(x), ref, rtol=1e-12)
    big = x * 400  # logits in the thousands
    assert np.isnan(R.softmax_naive(big)).any()
    np.testing.assert_allclose(R.softmax_online(big), R.softmax_safe(big), rtol=1e-12, atol=1e-300)
    assert np.isfinite(R.softmax_safe(big)).all()


def test_softmax_masked_rows():
    x = np.array([[1.0, -np.inf, 2.0], [-np.inf, -np.inf, -np.inf]])
    for f in (R.softmax_safe, R.softmax_online):
        y = f(x)
        assert y[1].tolist() == [0, 0, 0]
        np.testing.assert_allclose(y[0], [1 / (1 + np.e), 0, np.e / (1 + np.e)])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("blocks", [(1, 1), (4, 4), (5, 3), (16, 64)])
def test_tiled_algorithms_agree_with_attention(shape, causal, blocks):
    B, H, Tq, Tk, d = shape
    q, k, v = R.make_qkv(B, H, Tq, d, Tk, magnitude=4.0, seed=7)
    o, lse = R.attention(q, k, v, causal=causal, return_lse=True)
    for algo in (R.flash_attention_1, R.flash_attention_2):
        o2, lse2 = algo(q, k, v, causal=causal, block_q=blocks[0], block_k=blocks[1])
        np.testing.assert_allclose(o2, o, rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(lse2), np.isneginf(lse))
        fin = np.isfinite(lse)
        np.testing.assert_allclose(lse2[fin], lse[fin], rtol=1e-12)


@pytest.mark.parametrize("splits", [1, 2, 3, 7])
@pytest.mark.parametrize("causal", [False, True])
def test_split_kv_merge(splits, causal):
    q, k, v = R.make_qkv(2, 2, 9, 16, 29, seed=3)
    o, lse = R.attention(q, k, v, causal=causal, return_lse=True)
    o2, lse2 = R.split_kv_attention(q, k, v, causal=causal, num_splits=splits)
    np.testing.assert_allclose(o2, o, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lse2, lse, rtol=1e-12)


def test_merge_ignores_empty_partials():
    o = np.ones((2, 3))
    o_m, lse_m = R.merge_partials([o, np.full((2, 3), 5.0)], [np.zeros(2), np.full(2, -np.inf)])
    np.testing.assert_array_equal(o_m, o)
    np.testing.assert_array_equal(lse_m, np.zeros(2))
    o_m, lse_m = R.merge_partials([np.zeros((1, 3))], [np.full(1, -np.inf)])
    assert (o_m == 0).all() and np.isneginf(lse_m).all()


def test_llmc_layout_roundtrip_and_forward():
    B, T, NH, hs = 2, 9, 3, 4
    C = NH * hs
    rng = np.random.default_rng(5)
    inp = rng.standard_normal((B, T, 3 * C))
    q, k, v = R.permute_qkv(inp, NH)
    assert q.shape == (B, NH, T, hs)
    # q of head h at time t is inp[b, t, h*hs:(h+1)*hs]; k follows after C, v after 2C
    np.testing.assert_array_equal(q[1, 2, 5], inp[1, 5, 2 * hs:3 * hs])
    np.testing.assert_array_equal(k[0, 1, 3], inp[0, 3, C + hs:C + 2 * hs])
    np.testing.assert_array_equal(v[1, 0, 8], inp[1, 8, 2 * C:2 * C + hs])
    np.testing.assert_array_equal(R.unpermute(q), inp[:, :, :C])
    out, preatt, att = R.attention_forward_llmc(inp, NH)
    assert out.shape == (B, T, C) and preatt.shape == att.shape == (B, NH, T, T)
    np.testing.assert_allclose(out, R.unpermute(R.attention(q, k, v, causal=True)), rtol=1e-12)
    upper = np.triu(np.ones((T, T), bool), 1)
    assert np.isneginf(preatt[..., upper]).all() and (att[..., upper] == 0).all()
    np.testing.assert_allclose(att.sum(-1), 1.0, rtol=1e-12)
    with pytest.raises(ValueError, match="NH=5"):
        R.permute_qkv(inp, 5)


def test_shape_errors():
    q, k, v = R.make_qkv(1, 1, 4, 8)
    with pytest.raises(ValueError, match="same shape"):
        R.attention(q, k, v[..., :4])
    with pytest.raises(ValueError, match="4-D"):
        R.attention(q[0], k, v)


def test_inputs_are_never_zero():
    q, k, v = R.make_qkv(1, 2, 8, 16, magnitude=10)
    assert all(np.count_nonzero(x) == x.size for x in (q, k, v))
    assert np.abs(q).max() > 10
