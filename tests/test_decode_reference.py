"""The float64 decoding reference (reference/decode.py) against two independent statements of the contract:
reference.attention on each sequence's gathered dense keys, and a loop-per-row formula. Also paging, the
split/merge identity, the out-of-range semantics the kernels follow, and the cache append. CPU only."""

import numpy as np
import pytest

import reference as R
from reference.decode import key_positions


def _problem(B, Hq, Hkv, Tq, d, lengths, Tmax, *, seed=0, page_size=None, spare_pages=3):
    """q, contiguous caches, and (if page_size) the same caches as a shuffled page pool with its block table."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, Tq, d))
    k = rng.standard_normal((B, Hkv, Tmax, d))
    v = rng.standard_normal((B, Hkv, Tmax, d))
    seqlens = np.asarray(lengths, dtype=np.int32)
    if page_size is None:
        return q, k, v, seqlens, None, None, None
    max_pages = -(-Tmax // page_size)
    n_pages = B * max_pages + spare_pages
    order = rng.permutation(n_pages)[: B * max_pages].reshape(B, max_pages)
    kp = rng.standard_normal((n_pages, Hkv, page_size, d))  # unused pages hold other numbers
    vp = rng.standard_normal((n_pages, Hkv, page_size, d))
    for b in range(B):
        for p in range(max_pages):
            rows = slice(p * page_size, min((p + 1) * page_size, Tmax))
            n = rows.stop - rows.start
            kp[order[b, p], :, :n] = k[b, :, rows]
            vp[order[b, p], :, :n] = v[b, :, rows]
    return q, k, v, seqlens, kp, vp, order.astype(np.int32)


def _dense_expected(q, k, v, seqlens):
    """reference.attention per sequence on its first L_b keys, KV heads repeated for GQA."""
    B, Hq, Tq, d = q.shape
    G = Hq // k.shape[1]
    o = np.zeros((B, Hq, Tq, d))
    lse = np.full((B, Hq, Tq), -np.inf)
    for b in range(B):
        L = int(seqlens[b])
        if L == 0:
            continue
        kb = np.repeat(k[b, :, :L], G, axis=0)[None]
        vb = np.repeat(v[b, :, :L], G, axis=0)[None]
        ob, lb = R.attention(q[b][None], kb, vb, causal=True, return_lse=True)
        o[b], lse[b] = ob[0], lb[0]
    return o, lse


def _close(a, b):
    o1, l1 = a
    o2, l2 = b
    np.testing.assert_allclose(o1, o2, rtol=1e-12, atol=1e-12)
    assert np.array_equal(np.isneginf(l1), np.isneginf(l2))
    fin = np.isfinite(l2)
    np.testing.assert_allclose(l1[fin], l2[fin], rtol=1e-12, atol=1e-12)


CASES = [  # B, Hq, Hkv, Tq, d, lengths, Tmax
    (3, 4, 4, 1, 16, [0, 1, 17], 20),
    (3, 8, 2, 2, 8, [1, 15, 16], 16),
    (4, 4, 1, 4, 8, [2, 0, 5, 33], 40),
    (2, 6, 3, 3, 4, [3, 64], 64),
]


@pytest.mark.parametrize("B,Hq,Hkv,Tq,d,lengths,Tmax", CASES)
def test_matches_attention_on_gathered_slices(B, Hq, Hkv, Tq, d, lengths, Tmax):
    q, k, v, seqlens, *_ = _problem(B, Hq, Hkv, Tq, d, lengths, Tmax, seed=Tq)
    _close(R.decode_attention(q, k, v, seqlens), _dense_expected(q, k, v, seqlens))
    # gather_kv gives the same slices the dense expectation used
    for b, (kb, vb) in enumerate(R.gather_kv(k, v, seqlens)):
        assert np.array_equal(kb, k[b, :, : lengths[b]]) and np.array_equal(vb, v[b, :, : lengths[b]])


@pytest.mark.parametrize("B,Hq,Hkv,Tq,d,lengths,Tmax", CASES)
@pytest.mark.parametrize("page_size", [None, 4, 16])
def test_matches_the_loop_per_row_formula(B, Hq, Hkv, Tq, d, lengths, Tmax, page_size):
    q, k, v, seqlens, kp, vp, bt = _problem(B, Hq, Hkv, Tq, d, lengths, Tmax, seed=B + d, page_size=page_size)
    kc, vc = (k, v) if page_size is None else (kp, vp)
    got = R.decode_attention(q, kc, vc, seqlens, block_table=bt, scale=0.3)
    _close(got, R.decode_attention_rows(q, kc, vc, seqlens, block_table=bt, scale=0.3))


@pytest.mark.parametrize("page_size", [1, 4, 16, 64])
def test_paged_equals_contiguous(page_size):
    q, k, v, seqlens, kp, vp, bt = _problem(3, 8, 2, 2, 16, [0, 37, 64], 64, seed=7, page_size=page_size)
    _close(R.decode_attention(q, kp, vp, seqlens, block_table=bt), R.decode_attention(q, k, v, seqlens))


def test_rows_that_see_no_key():
    """L_b < Tq: the first Tq - L_b rows see nothing (0, -inf); L_b = 0: every row."""
    q, k, v, seqlens, *_ = _problem(2, 2, 1, 4, 8, [2, 0], 8)
    o, lse = R.decode_attention(q, k, v, seqlens)
    assert np.isneginf(lse[0, :, :2]).all() and (o[0, :, :2] == 0).all()
    assert np.isfinite(lse[0, :, 2:]).all()
    assert np.isneginf(lse[1]).all() and (o[1] == 0).all()
    # row 2 of sequence 0 sees key 0 only: o = v_0
    assert np.allclose(o[0, :, 2], np.repeat(v[0, :, 0], 2, axis=0))


def test_gqa_head_mapping():
    """Query head h reads KV head h // (Hq / Hkv): giving each KV head its own values shows which one was read."""
    q, k, v, seqlens, *_ = _problem(1, 8, 2, 1, 4, [5], 5)
    v = np.zeros_like(v)
    v[0, 1] = 1.0
    o, _ = R.decode_attention(q, k, v, seqlens)
    assert np.allclose(o[0, :4], 0.0) and np.allclose(o[0, 4:], 1.0)


@pytest.mark.parametrize("S", [1, 2, 3, 7, 40])
@pytest.mark.parametrize("tile", [1, 16])
@pytest.mark.parametrize("page_size", [None, 16])
def test_split_merge_identity(S, tile, page_size):
    q, k, v, seqlens, kp, vp, bt = _problem(3, 4, 2, 2, 8, [0, 17, 100], 100, seed=S, page_size=page_size)
    kc, vc = (k, v) if page_size is None else (kp, vp)
    o, lse, op, lp = R.decode_attention_split(q, kc, vc, seqlens, block_table=bt, num_splits=S, tile=tile,
                                              return_partials=True)
    _close((o, lse), R.decode_attention(q, kc, vc, seqlens, block_table=bt))
    assert op.shape == (3, 4, 2, S, 8) and lp.shape == (3, 4, 2, S)
    # merging the partials with merge_partials again is the same thing
    mo, ml = R.merge_partials(list(np.moveaxis(op, 3, 0)), list(np.moveaxis(lp, 3, 0)))
    _close((mo, ml), (o, lse))
    # an empty split is (0, -inf)
    for b, L in enumerate(seqlens):
        for s, (a, e) in enumerate(R.decode_split_bounds(int(L), S, tile)):
            if e <= a:
                assert np.isneginf(lp[b, :, :, s]).all() and (op[b, :, :, s] == 0).all()


@pytest.mark.parametrize("L", [0, 1, 15, 16, 17, 255, 4097])
@pytest.mark.parametrize("S", [1, 2, 7, 64])
@pytest.mark.parametrize("tile", [1, 32, 64])
def test_split_bounds_partition_the_keys(L, S, tile):
    bounds = R.decode_split_bounds(L, S, tile)
    assert len(bounds) == S
    covered = [j for a, e in bounds for j in range(a, e)]
    assert covered == list(range(L))
    for a, e in bounds:
        assert a % tile == 0 or a == L
    with pytest.raises(ValueError, match="num_splits and tile must be >= 1"):
        R.decode_split_bounds(L, 0, tile)


def test_out_of_range_lengths_error_or_clamp():
    q, k, v, _, kp, vp, bt = _problem(3, 2, 2, 2, 8, [0, 0, 0], 32, seed=3, page_size=16)
    bad = np.array([-5, 40, 32], np.int32)
    with pytest.raises(ValueError, match=r"seqlens_k\[0\] = -5 must lie in \[0, 32\]"):
        R.decode_attention(q, k, v, bad)
    got = R.decode_attention(q, k, v, bad, out_of_range="clamp")
    _close(got, R.decode_attention(q, k, v, np.array([0, 32, 32], np.int32)))
    got = R.decode_attention(q, kp, vp, bad, block_table=bt, out_of_range="clamp")
    _close(got, R.decode_attention(q, k, v, np.array([0, 32, 32], np.int32)))


def test_out_of_range_pages_error_or_skip():
    """A page index outside [0, num_pages) is skipped: with Tq = 1 that is attention over the other keys."""
    q, k, v, seqlens, kp, vp, bt0 = _problem(2, 4, 2, 1, 8, [40, 48], 48, seed=4, page_size=16)
    bt = bt0.copy()
    bt[0, 1] = kp.shape[0]  # one past the end
    bt[1, 0] = -1
    with pytest.raises(ValueError, match=r"block_table\[0\] holds page"):
        R.decode_attention(q, kp, vp, seqlens, block_table=bt)
    o, lse = R.decode_attention(q, kp, vp, seqlens, block_table=bt, out_of_range="clamp")
    for b, (kb, vb) in enumerate(R.gather_kv(kp, vp, seqlens, bt, out_of_range="clamp")):
        assert kb.shape[1] == int(seqlens[b]) - 16  # one page of 16 keys skipped
        ro, rl = R.attention(q[b][None], np.repeat(kb, 2, axis=0)[None], np.repeat(vb, 2, axis=0)[None],
                             return_lse=True)
        _close((o[b], lse[b]), (ro[0], rl[0]))
    # entries past a sequence's last page are never looked at
    short = np.array([16, 48], np.int32)
    bt2 = np.where(np.arange(bt0.shape[1])[None] * 16 < short[:, None], bt0, -7).astype(np.int32)
    _close(R.decode_attention(q, kp, vp, short, block_table=bt2), R.decode_attention(q, k, v, short))


def test_key_positions_shapes():
    _, k, _, seqlens, kp, _, bt = _problem(2, 2, 1, 1, 4, [3, 20], 20, page_size=8)
    (r0, v0), (r1, v1) = key_positions(kp, seqlens, bt)
    assert len(r0) == 3 and len(r1) == 20 and v0.all() and v1.all()
    assert r1[8] == bt[1, 1] * 8  # key 8 is row 0 of the sequence's second page


@pytest.mark.parametrize("page_size", [None, 8])
def test_append_then_decode(page_size):
    """append_kv writes at each sequence's length; decoding with the lengths + Tn sees the new keys last."""
    B, H, d, Tmax, Tn = 3, 2, 8, 24, 2
    q, k, v, _, kp, vp, bt = _problem(B, H, H, Tn, d, [0, 0, 0], Tmax, seed=5, page_size=page_size)
    seqlens = np.array([0, 10, 22], np.int32)  # the last one has room for exactly Tn rows
    rng = np.random.default_rng(6)
    kn, vn = rng.standard_normal((B, H, Tn, d)), rng.standard_normal((B, H, Tn, d))
    kc, vc = (k, v) if page_size is None else (kp, vp)
    k2, v2 = R.append_kv(kc, vc, kn, vn, seqlens, block_table=bt)
    new_len = seqlens + Tn
    dense_k, dense_v = k.copy(), v.copy()
    for b in range(B):
        dense_k[b, :, seqlens[b]:new_len[b]] = kn[b]
        dense_v[b, :, seqlens[b]:new_len[b]] = vn[b]
    _close(R.decode_attention(q, k2, v2, new_len, block_table=bt), R.decode_attention(q, dense_k, dense_v, new_len))
    # the input caches are untouched
    assert np.array_equal(kc, k if page_size is None else kp)


def test_append_drops_rows_past_the_capacity_and_bad_pages():
    B, H, d, Tmax = 2, 1, 4, 16
    _, k, v, _, kp, vp, bt = _problem(B, H, H, 1, d, [0, 0], Tmax, seed=8, page_size=8)
    kn = np.full((B, H, 3, d), 9.0)
    k2, _ = R.append_kv(k, v, kn, kn, np.array([14, -3], np.int32))
    assert (k2[0, :, 14:] == 9).all() and (k2[0, :, :14] == k[0, :, :14]).all()  # row at 16 dropped
    assert (k2[1, :, :3] == 9).all()  # a negative length counts as 0
    bt = bt.copy()
    bt[0, 1] = 99
    k3, _ = R.append_kv(kp, vp, kn, kn, np.array([7, 0], np.int32), block_table=bt)
    assert (k3[bt[0, 0], :, 7] == 9).all()
    changed = np.argwhere((k3 != kp).any(axis=(1, 2, 3))).ravel()
    assert sorted(changed) == sorted({int(bt[0, 0]), int(bt[1, 0])})  # page 99 does not exist: rows 8, 9 dropped
