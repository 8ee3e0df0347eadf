"""reference/variants.py against independent constructions: reference.attention on repeated heads or on each
document alone, a loop per row straight from the definition, the ALiBi bias built by hand, central finite
differences for the backward, and tile-by-tile loops for the block mask."""

import math

import numpy as np
import pytest

import reference as R
from test_reference_backward import numeric_grads  # the one finite-difference helper of the reference tests


def qkv(B, Hq, Hkv, Tq, Tk, d, *, seed=0, magnitude=1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, Tq, d)) * magnitude
    k = rng.standard_normal((B, Hkv, Tk, d)) * magnitude
    v = rng.standard_normal((B, Hkv, Tk, d))
    return q, k, v


def direct(q, k, v, sees, *, scale=None, softcap=None, bias=None):
    """Loop-per-row attention from the definition. sees(b, i, j) says whether query i sees key j; bias(b, h, i, j)
    is added to the (capped) score. Query head h reads kv head floor(h * Hkv / Hq)."""
    B, Hq, Tq, d = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    o = np.zeros(q.shape)
    lse = np.full((B, Hq, Tq), -np.inf)
    for b in range(B):
        for h in range(Hq):
            g = h * Hkv // Hq
            for i in range(Tq):
                keys = [j for j in range(Tk) if sees(b, i, j)]
                if not keys:
                    continue
                s = []
                for j in keys:
                    x = scale * float(np.dot(q[b, h, i], k[b, g, j]))
                    if softcap is not None:
                        x = softcap * math.tanh(x / softcap)
                    if bias is not None:
                        x += bias(b, h, i, j)
                    s.append(x)
                s = np.array(s)
                w = np.exp(s - s.max())
                o[b, h, i] = (w[:, None] * v[b, g, keys]).sum(0) / w.sum()
                lse[b, h, i] = s.max() + math.log(w.sum())
    return o, lse


def assert_same(got, want, rtol=1e-12, atol=1e-12):
    (o, lse), (o_ref, lse_ref) = got, want
    np.testing.assert_allclose(o, o_ref, rtol=rtol, atol=atol)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_ref))
    fin = np.isfinite(lse_ref)
    np.testing.assert_allclose(lse[fin], lse_ref[fin], rtol=rtol, atol=atol)


SHAPES = [(9, 9), (5, 12), (12, 5), (1, 10)]  # (Tq, Tk): square, more keys, more queries (blind rows), decoding


# ---- defaults, GQA, head size -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("Tq,Tk", SHAPES + [(1, 1), (37, 53)])
@pytest.mark.parametrize("causal", [False, True])
def test_defaults_equal_reference_attention(Tq, Tk, causal):
    q, k, v = qkv(2, 3, 3, Tq, Tk, 8, seed=Tq + Tk, magnitude=3.0)
    got = R.attention_variant(q, k, v, causal=causal, window=None, prefix=None, return_lse=True)
    assert_same(got, R.attention(q, k, v, causal=causal, return_lse=True))


@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (4, 2), (8, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("Tq,Tk", [(7, 7), (4, 9), (9, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_equals_repeating_kv_heads(Hq, Hkv, Tq, Tk, causal):
    q, k, v = qkv(2, Hq, Hkv, Tq, Tk, 8, seed=Hq * 10 + Hkv)
    group = Hq // Hkv
    k_rep, v_rep = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    got = R.attention_variant(q, k, v, causal=causal, return_lse=True)
    assert_same(got, R.attention(q, k_rep, v_rep, causal=causal, return_lse=True))
    # the backward: dk, dv of the shared head are the sums of the repeated heads' gradients
    do = np.random.default_rng(1).standard_normal(q.shape)
    dq, dk, dv = R.attention_variant_backward(q, k, v, do, causal=causal)
    dq_ref, dk_ref, dv_ref = R.attention_backward(q, k_rep, v_rep, do, causal=causal)
    assert dk.shape == dv.shape == k.shape
    np.testing.assert_allclose(dq, dq_ref, rtol=1e-12, atol=1e-12)
    for h in range(Hkv):
        np.testing.assert_allclose(dk[:, h], dk_ref[:, h * group:(h + 1) * group].sum(1), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dv[:, h], dv_ref[:, h * group:(h + 1) * group].sum(1), rtol=1e-12, atol=1e-12)


def test_head_dim_256():
    q, k, v = qkv(1, 4, 2, 6, 11, 256, seed=3)
    got = R.attention_variant(q, k, v, causal=True, return_lse=True)
    assert_same(got, R.attention(q, np.repeat(k, 2, 1), np.repeat(v, 2, 1), causal=True, return_lse=True))
    got = R.attention_variant(q, k, v, causal=True, window=(3, 0), softcap=5.0, return_lse=True)
    want = direct(q, k, v, lambda b, i, j: i + 5 - 3 <= j <= i + 5, softcap=5.0)
    assert_same(got, want)


# ---- windows ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("Tq,Tk", SHAPES)
@pytest.mark.parametrize("window", [(None, None), (None, 0), (1000, 0), (1000, None)])
def test_causal_window_wider_than_the_keys_is_causal(Tq, Tk, window):
    q, k, v = qkv(1, 2, 2, Tq, Tk, 8, seed=5)
    if window[0] == 1000:
        window = (Tk, window[1])
    got = R.attention_variant(q, k, v, causal=True, window=window, return_lse=True)
    assert_same(got, R.attention(q, k, v, causal=True, return_lse=True))


@pytest.mark.parametrize("Tq,Tk", SHAPES)
@pytest.mark.parametrize("window", [(0, 0), (2, 0), (0, 3), (3, 2), (None, 1), (1, None)])
@pytest.mark.parametrize("causal", [False, True])
def test_window_matches_the_definition(Tq, Tk, window, causal):
    q, k, v = qkv(1, 2, 1, Tq, Tk, 4, seed=7, magnitude=2.0)
    left, right = window

    def sees(b, i, j):
        c = i + Tk - Tq  # the query's position among the keys
        if causal and j > c:
            return False
        if left is not None and j < c - left:
            return False
        return right is None or j <= c + right

    got = R.attention_variant(q, k, v, causal=causal, window=window, return_lse=True)
    assert_same(got, direct(q, k, v, sees))


def test_sliding_window_in_decoding_sees_the_last_keys():
    q, k, v = qkv(2, 4, 2, 1, 20, 8, seed=11)
    got = R.attention_variant(q, k, v, causal=True, window=(3, 0), return_lse=True)
    last = slice(20 - 4, 20)
    want = R.attention(q, np.repeat(k[:, :, last], 2, 1), np.repeat(v[:, :, last], 2, 1), return_lse=True)
    assert_same(got, want)


def test_mask_drawn_by_hand():
    # 6 x 6, causal, window of 2 keys back, key 0 a prefix (a sink) seen by everyone
    want = np.array([[1, 0, 0, 0, 0, 0],
                     [1, 1, 0, 0, 0, 0],
                     [1, 1, 1, 0, 0, 0],
                     [1, 1, 1, 1, 0, 0],
                     [1, 0, 1, 1, 1, 0],
                     [1, 0, 0, 1, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(R.variant_mask(6, 6, causal=True, window=(2, 0), prefix=1), want)
    # 2 queries on 5 keys, window (1, 1) around the bottom-right diagonal (query 0 sits on key 3, query 1 on key 4)
    np.testing.assert_array_equal(R.variant_mask(2, 5, window=(1, 1)),
                                  [[0, 0, 1, 1, 1], [0, 0, 0, 1, 1]])
    # documents [0 0 1 1 1] causal: two blocks on the diagonal
    m = R.variant_mask(5, 5, causal=True, doc_ids_q=[0, 0, 1, 1, 1])
    np.testing.assert_array_equal(m, [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0],
                                      [0, 0, 1, 1, 1]])
    # a prefix stays inside its document: documents [0 0 1 1], causal, prefix 1 (key 0, of document 0)
    m = R.variant_mask(4, 4, causal=True, prefix=1, doc_ids_q=[0, 0, 1, 1])
    np.testing.assert_array_equal(m, [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]])
    assert R.variant_mask(4, 4, doc_ids_q=np.zeros((3, 4), int)).shape == (3, 4, 4)


# ---- documents and prefix-LM -----------------------------------------------------------------------------------------

def _doc_ids(lengths):
    return np.repeat(np.arange(len(lengths)), lengths)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [[3, 1, 5, 2], [1, 1, 1], [10]])
def test_documents_packed_equal_each_document_alone(lengths, causal):
    T = sum(lengths)
    q, k, v = qkv(2, 4, 2, T, T, 8, seed=T)
    ids = _doc_ids(lengths)
    o, lse = R.attention_variant(q, k, v, causal=causal, doc_ids_q=ids, doc_ids_k=ids, return_lse=True)
    k_rep, v_rep = np.repeat(k, 2, 1), np.repeat(v, 2, 1)
    start = 0
    for n in lengths:
        part = slice(start, start + n)
        assert_same((o[:, :, part], lse[:, :, part]),
                    R.attention(q[:, :, part], k_rep[:, :, part], v_rep[:, :, part], causal=causal, return_lse=True))
        start += n
    # doc_ids_k defaults to doc_ids_q
    assert_same(R.attention_variant(q, k, v, causal=causal, doc_ids_q=ids, return_lse=True), (o, lse), 0, 0)


def test_documents_per_batch_entry_and_cross_attention():
    """(B, T) ids that differ per batch entry; queries and keys split differently (cross-attention, not causal);
    a query document with no key gives 0 and lse = -inf."""
    q_lengths = [[2, 3, 1], [1, 4, 1]]
    k_lengths = [[4, 1, 3], [2, 2, 4]]
    ids_q = np.stack([_doc_ids(n) for n in q_lengths])
    ids_k = np.stack([_doc_ids(n) for n in k_lengths])
    ids_k[1, ids_k[1] == 2] = 7  # batch 1: document 2 has queries but no keys
    q, k, v = qkv(2, 2, 2, 6, 8, 4, seed=2)
    o, lse = R.attention_variant(q, k, v, doc_ids_q=ids_q, doc_ids_k=ids_k, return_lse=True)
    for b in range(2):
        qs = np.concatenate([[0], np.cumsum(q_lengths[b])])
        ks = np.concatenate([[0], np.cumsum(k_lengths[b])])
        for doc in range(3):
            pq, pk = slice(qs[doc], qs[doc + 1]), slice(ks[doc], ks[doc + 1])
            if b == 1 and doc == 2:
                assert (o[b, :, pq] == 0).all() and np.isneginf(lse[b, :, pq]).all()
                continue
            want = R.attention(q[b:b + 1, :, pq], k[b:b + 1, :, pk], v[b:b + 1, :, pk], return_lse=True)
            assert_same((o[b:b + 1, :, pq], lse[b:b + 1, :, pq]), want)


@pytest.mark.parametrize("Tq,Tk", SHAPES)
@pytest.mark.parametrize("prefix", [0, 1, 3])
@pytest.mark.parametrize("window", [None, (1, 0)])
def test_prefix_lm_matches_the_definition(Tq, Tk, prefix, window):
    q, k, v = qkv(1, 2, 2, Tq, Tk, 4, seed=13, magnitude=2.0)

    def sees(b, i, j):
        if j < prefix:
            return True
        c = i + Tk - Tq
        return j <= c and (window is None or j >= c - window[0])

    got = R.attention_variant(q, k, v, causal=True, prefix=prefix, window=window, return_lse=True)
    assert_same(got, direct(q, k, v, sees))


# ---- score modifiers -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("Tq,Tk", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_alibi(Tq, Tk, causal):
    Hq = 4
    q, k, v = qkv(2, Hq, 2, Tq, Tk, 8, seed=17)
    k_rep, v_rep = np.repeat(k, 2, 1), np.repeat(v, 2, 1)
    plain = R.attention(q, k_rep, v_rep, causal=causal, return_lse=True)
    assert_same(R.attention_variant(q, k, v, causal=causal, alibi_slopes=np.zeros(Hq), return_lse=True), plain)
    for slopes in (np.array([0.5, 0.25, 0.125, 0.0625]), np.array([[0.5, 0.1, 1.0, 2.0], [0.3, 0.0, 0.7, 0.01]])):
        # the bias matrix by hand: bias[b, h, i, j] = -slope * |j - (i + Tk - Tq)|, added to the scores
        bias = np.zeros((2, Hq, Tq, Tk))
        for b in range(2):
            for h in range(Hq):
                for i in range(Tq):
                    for j in range(Tk):
                        slope = slopes[h] if slopes.ndim == 1 else slopes[b, h]
                        bias[b, h, i, j] = -slope * abs(j - (i + Tk - Tq))
        s = R.attention_scores(q, k_rep, causal=causal) + bias
        p = R.softmax_safe(s)
        with np.errstate(divide="ignore"):
            lse = np.log(np.exp(s).sum(-1))
        got = R.attention_variant(q, k, v, causal=causal, alibi_slopes=slopes, return_lse=True)
        assert_same(got, (p @ v_rep, lse))


def test_softcap_large_is_plain():
    q, k, v = qkv(2, 4, 1, 9, 13, 16, seed=19, magnitude=3.0)
    for causal in (False, True):
        got = R.attention_variant(q, k, v, causal=causal, softcap=1e6, return_lse=True)
        assert_same(got, R.attention(q, np.repeat(k, 4, 1), np.repeat(v, 4, 1), causal=causal, return_lse=True),
                    rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("softcap", [0.5, 2.0, 30.0])
@pytest.mark.parametrize("Tq,Tk", SHAPES)
def test_softcap_matches_the_definition(softcap, Tq, Tk):
    q, k, v = qkv(1, 2, 1, Tq, Tk, 8, seed=23, magnitude=4.0)  # scores of tens: the cap matters
    Tk_minus_Tq = Tk - Tq
    got = R.attention_variant(q, k, v, causal=True, softcap=softcap, scale=0.7, return_lse=True)
    want = direct(q, k, v, lambda b, i, j: j <= i + Tk_minus_Tq, softcap=softcap, scale=0.7)
    assert_same(got, want)
    assert (np.abs(got[1][np.isfinite(got[1])]) <= softcap + np.log(Tk) + 1e-12).all()


def test_every_option_at_once():
    q, k, v = qkv(2, 4, 2, 10, 12, 8, seed=29, magnitude=2.0)
    ids = np.array([[0] * 4 + [1] * 6, [0] * 10])
    ids_k = np.array([[0] * 5 + [1] * 7, [0] * 12])
    slopes = np.array([0.3, 0.1, 0.05, 0.0])

    def sees(b, i, j):
        c = i + 2
        return ids[b, i] == ids_k[b, j] and (j < 2 or (c - 3 <= j <= c))

    got = R.attention_variant(q, k, v, causal=True, window=(3, 5), prefix=2, doc_ids_q=ids, doc_ids_k=ids_k,
                              alibi_slopes=slopes, softcap=3.0, return_lse=True)
    want = direct(q, k, v, sees, softcap=3.0, bias=lambda b, h, i, j: -slopes[h] * abs(j - (i + 2)))
    assert_same(got, want)


# ---- rows that see no key --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("Tq,Tk,options,blind", [
    (9, 4, dict(causal=True), [0, 1, 2, 3, 4]),                       # more queries than keys
    (6, 6, dict(window=(0, 0), doc_ids_q=[0, 0, 1, 1, 2, 2], doc_ids_k=[0, 0, 0, 2, 2, 2]), [2, 3]),
    (8, 4, dict(window=(0, 0)), [0, 1, 2, 3]),                         # the diagonal passes left of key 0
    (4, 8, dict(window=(None, 2), causal=True, prefix=0), []),
    (5, 3, dict(causal=True, window=(1, 0), alibi_slopes=[0.5, 1.0], softcap=2.0), [0, 1]),
])
def test_rows_that_see_no_key_give_zero_and_minus_inf(Tq, Tk, options, blind):
    q, k, v = qkv(1, 2, 1, Tq, Tk, 4, seed=31)
    o, lse = R.attention_variant(q, k, v, return_lse=True, **options)
    assert np.isfinite(o).all()
    seen = np.array([i not in blind for i in range(Tq)])
    assert (o[:, :, ~seen] == 0).all() and np.isneginf(lse[:, :, ~seen]).all()
    assert np.isfinite(lse[:, :, seen]).all() and (np.abs(o[:, :, seen]).sum(-1) > 0).all()
    do = np.random.default_rng(0).standard_normal(q.shape)
    dq, dk, dv = R.attention_variant_backward(q, k, v, do, **options)
    assert all(np.isfinite(g).all() for g in (dq, dk, dv))
    assert (dq[:, :, ~seen] == 0).all()


# ---- gradients -------------------------------------------------------------------------------------------------------

GRAD_CASES = {  # name: (Hq, Hkv, Tq, Tk, options)
    "plain_gqa": (4, 2, 5, 6, {}),
    "mqa_causal": (3, 1, 5, 6, dict(causal=True)),
    "causal_window_blind_rows": (2, 2, 6, 4, dict(causal=True, window=(1, 0))),
    "window_both_sides": (4, 2, 5, 7, dict(window=(1, 2))),
    "prefix_lm": (2, 1, 6, 6, dict(causal=True, prefix=2)),
    "documents": (2, 2, 6, 6, dict(causal=True, doc_ids_q=[[0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 1, 1]])),
    "alibi": (4, 2, 5, 6, dict(causal=True, alibi_slopes=[0.5, 0.25, 1.0, 0.1])),
    "softcap": (2, 1, 5, 6, dict(softcap=1.0, scale=0.9)),
    "softcap_causal_gqa": (4, 2, 6, 5, dict(causal=True, softcap=0.7)),
    "everything": (4, 2, 6, 6, dict(causal=True, window=(2, 0), prefix=1, doc_ids_q=[0, 0, 0, 1, 1, 1],
                                    alibi_slopes=[0.3, 0.2, 0.1, 0.4], softcap=1.5, scale=0.8)),
}


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_backward_matches_finite_differences(case):
    Hq, Hkv, Tq, Tk, options = GRAD_CASES[case]
    q, k, v = qkv(2, Hq, Hkv, Tq, Tk, 3, seed=len(case), magnitude=1.5)
    do = np.random.default_rng(len(case) + 1).standard_normal(q.shape)
    got = R.attention_variant_backward(q, k, v, do, **options)
    want = numeric_grads(lambda *a: R.attention_variant(*a, **options), q, k, v, do)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == w.shape, name
        assert np.abs(w).max() > 1e-3, name  # the case has gradients to check
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-8, err_msg=f"{case}: {name}")


# ---- block mask ------------------------------------------------------------------------------------------------------

def _tiles_by_loop(mask, bm, bn):
    Tq, Tk = mask.shape
    kinds = []
    for r in range(0, Tq, bm):
        row = []
        for c in range(0, Tk, bn):
            tile = mask[r:r + bm, c:c + bn]
            row.append(R.EMPTY if not tile.any() else R.FULL if tile.all() else R.PARTIAL)
        kinds.append(row)
    return np.array(kinds)


@pytest.mark.parametrize("Tq,Tk", [(16, 16), (13, 29), (29, 13), (1, 40), (64, 64)])
@pytest.mark.parametrize("bm,bn", [(1, 1), (4, 4), (5, 3), (16, 8), (64, 64)])
def test_block_mask_against_tile_loops(Tq, Tk, bm, bn):
    rng = np.random.default_rng(Tq * Tk + bm)
    ids = np.sort(rng.integers(0, 3, size=(2, max(Tq, Tk))), axis=1)
    masks = [R.variant_mask(Tq, Tk, causal=True), R.variant_mask(Tq, Tk, causal=True, window=(5, 0), prefix=2),
             R.variant_mask(Tq, Tk, window=(3, 3)), rng.random((Tq, Tk)) < 0.5, np.ones((Tq, Tk), bool),
             R.variant_mask(Tq, Tk, causal=True, doc_ids_q=ids[:, :Tq], doc_ids_k=ids[:, :Tk])]
    for mask in masks:
        kinds, counts = R.block_mask(mask, bm, bn)
        want = np.stack([_tiles_by_loop(m, bm, bn) for m in mask]) if mask.ndim == 3 else _tiles_by_loop(mask, bm, bn)
        np.testing.assert_array_equal(kinds, want)
        assert counts == {"empty": int((want == 0).sum()), "full": int((want == 1).sum()),
                          "partial": int((want == 2).sum())}
        assert sum(counts.values()) == want.size


def test_block_mask_by_hand():
    kinds, counts = R.block_mask(R.causal_mask(8, 8), 4, 4)
    np.testing.assert_array_equal(kinds, [[R.PARTIAL, R.EMPTY], [R.FULL, R.PARTIAL]])
    # causal 16 x 16 in 4 x 4 tiles: 4 on the diagonal, 6 below it, 6 above
    assert R.block_mask(R.causal_mask(16, 16), 4, 4)[1] == {"empty": 6, "full": 6, "partial": 4}
    # a sliding window of 4 keys back over 16 x 16 in 4 x 4 tiles: diagonal and sub-diagonal tiles partial
    _, counts = R.block_mask(R.variant_mask(16, 16, causal=True, window=(4, 0)), 4, 4)
    assert counts == {"empty": 16 - 7, "full": 0, "partial": 7}


# ---- bad input -------------------------------------------------------------------------------------------------------

def _bad_calls():
    q, k, v = qkv(1, 4, 2, 5, 6, 8)
    f = R.attention_variant
    return [
        (lambda: f(q, k, v, window=(-1, 0)), "window left must be >= 0"),
        (lambda: f(q, k, v, window=(2, -3)), "window right must be >= 0"),
        (lambda: f(q, k, v, window=(2,)), "window must be a pair"),
        (lambda: f(q, k, v, alibi_slopes=np.ones(2)), r"alibi_slopes must have Hq=4 entries"),
        (lambda: f(q, k, v, alibi_slopes=np.ones((3, 4))), r"alibi_slopes must have Hq=4 entries"),
        (lambda: f(q, k[:, :1].repeat(3, 1), v[:, :1].repeat(3, 1)), r"Hq must be a multiple of Hkv.*Hq=4, Hkv=3"),
        (lambda: f(q, k, v, doc_ids_q=np.zeros(4), doc_ids_k=np.zeros(6)), r"doc_ids_q must have shape.*Tq=5"),
        (lambda: f(q, k, v, doc_ids_q=np.zeros(5), doc_ids_k=np.zeros(5)), r"doc_ids_k must have shape.*Tk=6"),
        (lambda: f(q, k, v, doc_ids_q=np.zeros((3, 5)), doc_ids_k=np.zeros(6)), r"doc_ids_q has 3 rows.*B=1"),
        (lambda: f(q, k, v, doc_ids_q=np.zeros(5)), r"doc_ids_k is needed when Tq != Tk"),
        (lambda: f(q, k, v, doc_ids_k=np.zeros(6)), r"doc_ids_k was given without doc_ids_q"),
        (lambda: f(q, k, v, softcap=0.0), "softcap must be > 0"),
        (lambda: f(q, k, v, softcap=-30), "softcap must be > 0"),
        (lambda: f(q, k, v, prefix=-1), r"prefix must be in \[0, Tk=6\]"),
        (lambda: f(q, k, v, prefix=7), r"prefix must be in \[0, Tk=6\]"),
        (lambda: f(q, k, v[..., :4]), "k and v must have the same shape"),
        (lambda: f(q, k[..., :4], v[..., :4]), "disagree on B or d"),
        (lambda: f(q[0], k, v), "must be 4-D"),
        (lambda: R.attention_variant_backward(q, k, v, np.ones((1, 4, 5, 4))), "do must have q's shape"),
        (lambda: R.attention_variant_backward(q, k, v, q, window=(0, -1)), "window right must be >= 0"),
        (lambda: R.variant_mask(3, 3, window=(-2, None)), "window left must be >= 0"),
        (lambda: R.block_mask(np.ones((4, 4), bool), 0, 4), "block_m must be >= 1"),
        (lambda: R.block_mask(np.ones((4, 4), bool), 4, -1), "block_n must be >= 1"),
        (lambda: R.block_mask(np.ones(4, bool), 4, 4), r"mask must be \(Tq, Tk\)"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_calls())))
def test_bad_input_raises_naming_the_argument(index):
    call, message = _bad_calls()[index]
    with pytest.raises(ValueError, match=message):
        call()


def test_non_integer_window_is_a_type_error():
    q, k, v = qkv(1, 1, 1, 3, 3, 4)
    with pytest.raises(TypeError, match="window left must be an int"):
        R.attention_variant(q, k, v, window=(1.5, 0))
