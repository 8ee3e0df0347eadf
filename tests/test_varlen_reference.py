"""reference/varlen.py on the CPU: cu_seqlens, padding removal and restore, varlen attention against the dense
oracle sequence by sequence, the padded and packed BERT-style layer, and malformed cu_seqlens."""

import numpy as np
import pytest

import reference as R


def random_mask(lengths, Tmax, rng=None, holes=False):
    """(B, Tmax) bool: the first lengths[b] positions real, or (holes=True) lengths[b] positions drawn at random."""
    mask = np.zeros((len(lengths), Tmax), bool)
    for b, n in enumerate(lengths):
        if holes:
            mask[b, rng.choice(Tmax, size=n, replace=False)] = True
        else:
            mask[b, :n] = True
    return mask


LENGTH_SETS = [[1], [0, 3, 0], [5, 1, 0, 7], [1] * 9 + [200], [17, 16, 15, 64, 63, 65]]


@pytest.mark.parametrize("lengths", LENGTH_SETS)
def test_cu_seqlens_and_offsets(lengths):
    Tmax = max(max(lengths), 1)
    mask = random_mask(lengths, Tmax)
    assert R.lengths_from_mask(mask).tolist() == lengths
    cu = R.cu_seqlens_from_lengths(lengths)
    assert cu.dtype == np.int32 and cu.shape == (len(lengths) + 1,)
    assert cu[0] == 0 and cu.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    offs = R.token_offsets(mask)
    for b, n in enumerate(lengths):
        assert offs[b, :n].tolist() == list(range(cu[b], cu[b + 1]))
        assert (offs[b, n:] == -1).all()


@pytest.mark.parametrize("holes", [False, True])
def test_remove_restore_round_trip(holes):
    rng = np.random.default_rng(0)
    lengths = [0, 1, 5, 12, 3]
    mask = random_mask(lengths, 12, rng, holes)
    x = rng.standard_normal((5, 12, 3, 4))
    packed = R.remove_padding(x, mask)
    assert packed.shape == (sum(lengths), 3, 4)
    # each packed row is the padded row at the position token_offsets names
    offs = R.token_offsets(mask)
    for b, t in zip(*np.nonzero(mask)):
        np.testing.assert_array_equal(packed[offs[b, t]], x[b, t])
    back = R.restore_padding(packed, mask)
    np.testing.assert_array_equal(back[mask], x[mask])
    assert (back[~mask] == 0).all()


def pack(rng, lengths, H, d):
    total = sum(lengths)
    return rng.standard_normal((total, H, d)), R.cu_seqlens_from_lengths(lengths)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq,lk", [([1, 0, 7, 3], [1, 0, 7, 3]), ([4, 1, 9, 0], [2, 5, 9, 3]),
                                   ([1] * 6 + [130], [1] * 6 + [130]), ([3, 0, 2], [0, 4, 1])])
def test_varlen_matches_dense_per_sequence(lq, lk, causal):
    rng = np.random.default_rng(1)
    H, d = 2, 8
    q, cu_q = pack(rng, lq, H, d)
    k, cu_k = pack(rng, lk, H, d)
    v, _ = pack(rng, lk, H, d)
    o, lse = R.varlen_attention(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
    assert o.shape == q.shape and lse.shape == (H, q.shape[0])
    # Independently of the oracle's slicing: one query row at a time, the keys it may see listed by hand (its own
    # sequence's, and under the causal mask those up to position i + lk - lq of that sequence).
    scale = 1 / np.sqrt(d)
    for b in range(len(lq)):
        for i in range(lq[b]):
            row = cu_q[b] + i
            last = lk[b] - 1 if not causal else min(i + lk[b] - lq[b], lk[b] - 1)
            keys = [cu_k[b] + j for j in range(last + 1)]
            for h in range(H):
                if not keys:
                    assert (o[row, h] == 0).all() and np.isneginf(lse[h, row])
                    continue
                s = np.array([q[row, h] @ k[j, h] for j in keys]) * scale
                w = np.exp(s - s.max())
                want = sum(wj * v[j, h] for wj, j in zip(w, keys)) / w.sum()
                np.testing.assert_allclose(o[row, h], want, rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(lse[h, row], s.max() + np.log(w.sum()), rtol=1e-12)
    assert np.isfinite(o).all()


def test_varlen_equals_padded_dense():
    """Equal lengths: varlen is the dense oracle on the (B, H, T, d) batch."""
    rng = np.random.default_rng(2)
    B, H, T, d = 3, 2, 6, 4
    q, k, v = (rng.standard_normal((B, H, T, d)) for _ in range(3))
    p = lambda x: x.transpose(0, 2, 1, 3).reshape(B * T, H, d)
    cu = R.cu_seqlens_from_lengths([T] * B)
    for causal in (False, True):
        o = R.varlen_attention(p(q), p(k), p(v), cu, cu, causal=causal)
        np.testing.assert_allclose(o, p(R.attention(q, k, v, causal=causal)), rtol=1e-12, atol=1e-12)


def test_causal_bottom_right_row_that_sees_nothing():
    rng = np.random.default_rng(3)
    q, cu_q = pack(rng, [4], 1, 4)
    k, cu_k = pack(rng, [2], 1, 4)
    o, lse = R.varlen_attention(q, k, k, cu_q, cu_k, causal=True, return_lse=True)
    # Tq=4, Tk=2: query i sees keys j <= i - 2, so rows 0 and 1 see nothing
    assert (o[:2] == 0).all() and np.isneginf(lse[0, :2]).all() and np.isfinite(lse[0, 2:]).all()
    np.testing.assert_allclose(o[2], k[0])  # row 2 sees key 0 alone


@pytest.mark.parametrize("holes", [False, True])
def test_bert_layer_packed_equals_padded_on_real_tokens(holes):
    rng = np.random.default_rng(4)
    hidden, heads = 16, 4
    lengths = [1, 0, 9, 4, 30]
    mask = random_mask(lengths, 30, rng, holes)
    x = rng.standard_normal((5, 30, hidden))
    w = R.make_bert_weights(hidden, seed=5)
    padded = R.bert_layer_padded(x, mask, w, heads)
    packed = R.bert_layer_packed(x, mask, w, heads)
    np.testing.assert_allclose(packed[mask], padded[mask], rtol=1e-10, atol=1e-12)
    assert (packed[~mask] == 0).all()
    # and it is not trivially equal: the padding changes nothing only because it is masked
    x2 = x.copy()
    x2[~mask] = 1e3
    np.testing.assert_allclose(R.bert_layer_padded(x2, mask, w, heads)[mask], padded[mask], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cu,total,err,match", [
    (np.array([0, 3, 2], np.int32), 2, ValueError, "must not decrease"),
    (np.array([0, 3, 5], np.int32), 6, ValueError, "must equal"),
    (np.array([1, 3, 5], np.int32), 5, ValueError, r"\[0\] must be 0"),
    (np.array([0, 3, 5], np.int64), 5, TypeError, "int32"),
    (np.array([0.0, 3.0], np.float32), 3, TypeError, "int32"),
    (np.array([0], np.int32), 0, ValueError, "B\\+1 >= 2"),
    (np.zeros((2, 2), np.int32), 0, ValueError, "1-D"),
])
def test_malformed_cu_seqlens(cu, total, err, match):
    with pytest.raises(err, match=match):
        R.check_cu_seqlens(cu, total)
    q = np.ones((total, 1, 4))
    good = R.cu_seqlens_from_lengths([total])
    with pytest.raises(err, match=match):
        R.varlen_attention(q, q, q, cu, good)  # the launcher-side check runs before anything else


def test_mismatched_batch_and_bad_lengths():
    q = np.ones((3, 1, 4))
    with pytest.raises(ValueError, match="B\\+1"):
        R.varlen_attention(q, q, q, np.array([0, 3], np.int32), np.array([0, 1, 3], np.int32))
    with pytest.raises(ValueError, match=">= 0"):
        R.cu_seqlens_from_lengths([2, -1])
    with pytest.raises(ValueError, match="real tokens"):
        R.restore_padding(np.ones((2, 3)), np.ones((1, 3), bool))
