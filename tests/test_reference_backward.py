"""The float64 attention backward (reference/backward.py) against central finite differences of reference.attention."""

import numpy as np
import pytest

import reference as R

SHAPES = [  # (Tq, Tk): square, more keys than queries, more queries than keys (rows that see no key when causal)
    (5, 5), (3, 7), (6, 2),
]


def numeric_grads(f, q, k, v, do, eps=1e-6):
    """d sum(f(q, k, v) * do) / d x for x in q, k, v, by central differences, one entry at a time."""
    return numeric_grads_of(lambda *a: (f(*a) * do).sum(), q, k, v, eps)


def numeric_grads_of(loss, q, k, v, eps=1e-6):
    """d loss(q, k, v) / d x for x in q, k, v, by central differences, one entry at a time."""
    grads = []
    for which in range(3):
        args = [q.copy(), k.copy(), v.copy()]
        x = args[which]
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + eps
            up = loss(*args)
            x[idx] = old - eps
            down = loss(*args)
            x[idx] = old
            g[idx] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize("Tq,Tk", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_backward_matches_finite_differences(Tq, Tk, causal, scale):
    rng = np.random.default_rng(Tq * 10 + Tk)
    q, k, v = (rng.standard_normal((1, 2, T, 4)) for T in (Tq, Tk, Tk))
    do = rng.standard_normal(q.shape)
    got = R.attention_backward(q, k, v, do, causal=causal, scale=scale)
    want = numeric_grads(lambda *a: R.attention(*a, causal=causal, scale=scale), q, k, v, do)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-8, err_msg=name)


@pytest.mark.parametrize("Tq,Tk", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_lse_gradient_matches_finite_differences(Tq, Tk, causal):
    """With dlse, the gradients of sum(o * do) + sum(lse * dlse), the sum over the rows that see a key."""
    rng = np.random.default_rng(Tq * 10 + Tk + 1)
    q, k, v = (rng.standard_normal((1, 2, T, 4)) for T in (Tq, Tk, Tk))
    do, dlse = rng.standard_normal(q.shape), rng.standard_normal(q.shape[:3])

    def loss(q, k, v):
        o, lse = R.attention(q, k, v, causal=causal, scale=0.3, return_lse=True)
        return (o * do).sum() + np.where(np.isfinite(lse), lse * dlse, 0.0).sum()

    got = R.attention_backward(q, k, v, do, causal=causal, scale=0.3, dlse=dlse)
    for name, g, w in zip(("dq", "dk", "dv"), got, numeric_grads_of(loss, q, k, v)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-8, err_msg=name)
    with pytest.raises(ValueError, match="dlse must have shape"):
        R.attention_backward(q, k, v, do, dlse=dlse[:, :1])


def test_rows_that_see_no_key_have_zero_gradients():
    """Tq > Tk with causal masking: the first Tq - Tk rows see nothing, so their dq is 0 and they add nothing to dk, dv."""
    rng = np.random.default_rng(1)
    Tq, Tk = 9, 4
    q, k, v = (rng.standard_normal((2, 1, T, 8)) for T in (Tq, Tk, Tk))
    do = rng.standard_normal(q.shape)
    dq, dk, dv = R.attention_backward(q, k, v, do, causal=True)
    blind = Tq - Tk
    assert np.all(dq[:, :, :blind] == 0.0)
    assert np.all(np.isfinite(dq)) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))
    # the blind rows' q and do do not change dk, dv
    q2, do2 = q.copy(), do.copy()
    q2[:, :, :blind] = rng.standard_normal(q2[:, :, :blind].shape)
    do2[:, :, :blind] = rng.standard_normal(do2[:, :, :blind].shape)
    _, dk2, dv2 = R.attention_backward(q2, k, v, do2, causal=True)
    np.testing.assert_allclose(dk2, dk, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dv2, dv, rtol=1e-12, atol=1e-12)
    assert np.abs(dq[:, :, blind:]).max() > 0  # the others do get gradients


def test_probabilities_rows_sum_to_one_or_zero():
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((1, 1, 6, 4)), rng.standard_normal((1, 1, 3, 4))
    p = R.attention_probabilities(q, k, causal=True)
    np.testing.assert_allclose(p.sum(-1), [[[0, 0, 0, 1, 1, 1]]], atol=1e-12)


def test_backward_shape_errors():
    q = np.zeros((1, 1, 3, 4))
    with pytest.raises(ValueError, match=r"do must have q's shape"):
        R.attention_backward(q + 1, q + 1, q + 1, np.ones((1, 1, 2, 4)))
    with pytest.raises(ValueError, match=r"must be 4-D"):
        R.attention_backward(q[0], q, q, q)
