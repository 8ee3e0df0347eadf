"""The float64 sampling semantics (reference/sampling.py) on rows small enough to check by hand, and Philox4x32-10
against the known-answer vectors published with the generator (Random123's kat_vectors). CPU only."""

import numpy as np
import pytest

import reference as R
from reference import sampling as S

INF = np.inf


def kept(logits, **kw):
    return np.flatnonzero(R.sampling_probs(np.asarray(logits, float)[None], **kw)[1][0]).tolist()


@pytest.mark.parametrize("ctr, key, out", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(ctr, key, out):
    assert R.philox4x32(ctr, key).tolist() == list(out)


def test_philox_uniforms_are_24_bit_and_depend_on_every_input():
    u = R.philox_uniform(7, np.arange(1000))
    assert u.min() >= 0 and u.max() < 1
    assert np.array_equal(u * 2**24, np.floor(u * 2**24))  # exact in float32
    assert np.array_equal(u.astype(np.float32).astype(np.float64), u)
    assert not np.array_equal(u, R.philox_uniform(8, np.arange(1000)))
    assert not np.array_equal(u, R.philox_uniform(7, np.arange(1000), offset=1))
    assert not np.array_equal(u, R.philox_uniform(7, np.arange(1000), offset=2**32))
    assert len(np.unique(u)) == 1000
    assert abs(u.mean() - 0.5) < 0.05
    with pytest.raises(ValueError, match="seed"):
        R.philox_uniform(-1, 0)


def test_softmax_temperature_and_minus_inf():
    x = np.array([[1.0, 2.0, -INF, 0.0]])
    p = S.softmax(x, temperature=0.5)
    e = np.exp(np.array([2.0, 4.0, 0.0]) - 4.0)
    assert np.allclose(p[0, [0, 1, 3]], e / e.sum()) and p[0, 2] == 0
    assert np.allclose(R.log_softmax(x)[0, [0, 1, 3]], np.log(S.softmax(x)[0, [0, 1, 3]]))


def test_top_k_by_hand_and_ties_by_lower_index():
    assert kept([0.5, 3.0, 1.0, 3.0, 2.0], top_k=2) == [1, 3]
    assert kept([1.0, 3.0, 2.0, 2.0, 2.0], top_k=3) == [1, 2, 3]  # one of the three 2.0s: the lower indices
    assert kept([1.0, 1.0, 1.0, 1.0], top_k=2) == [0, 1]  # all equal
    assert kept([-INF, 5.0, -INF], top_k=1) == [1]
    assert kept([-INF, 5.0, -INF], top_k=2) == [0, 1]  # -inf tokens rank last, by index; probability 0
    assert kept([0.1, 0.3, 0.2], top_k=0) == [0, 1, 2] == kept([0.1, 0.3, 0.2], top_k=7)


def test_top_p_keeps_the_crossing_token():
    x = np.log(np.array([0.1, 0.4, 0.2, 0.3]))
    assert kept(x, top_p=0.4) == [1]  # 0.4 reaches 0.4 exactly: kept alone
    assert kept(x, top_p=0.41) == [1, 3]  # 0.4 < 0.41 <= 0.7
    assert kept(x, top_p=0.7) == [1, 3]
    assert kept(x, top_p=0.71) == [1, 2, 3]
    assert kept(x, top_p=1.0) == [0, 1, 2, 3]
    assert kept(x, top_p=1e-9) == [1]  # p near 0: the top token
    assert kept([2.0, 2.0, 2.0, 2.0], top_p=0.3) == [0, 1]  # ties by index: 0.25 < 0.3 <= 0.5
    assert kept([2.0, 2.0, 2.0, 2.0], top_p=1e-9) == [0]


def test_top_k_then_top_p_measures_mass_within_top_k():
    x = np.log(np.array([0.05, 0.45, 0.25, 0.25]))
    # top-k 2 keeps {1, 2} (2 before 3 by index); renormalised 0.643, 0.357; p = 0.6 keeps token 1 only
    assert kept(x, top_k=2, top_p=0.6) == [1]
    assert kept(x, top_k=2, top_p=0.65) == [1, 2]
    probs, _ = R.sampling_probs(x[None], top_k=2, top_p=0.65)
    assert np.allclose(probs[0], [0, 0.45 / 0.7, 0.25 / 0.7, 0])


def test_k1_is_greedy_and_vocab_1():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 50))
    for seed in range(3):
        assert np.array_equal(R.sample(x, top_k=1, seed=seed), x.argmax(1))
    assert R.sample(np.array([[3.0]]), top_p=0.5, seed=3).tolist() == [0]
    probs, mask = R.sampling_probs(np.array([[-1.0]]), temperature=0.1, top_k=1, top_p=0.2)
    assert probs.tolist() == [[1.0]] and mask.tolist() == [[True]]


def test_sample_from_is_an_inverse_cdf_in_vocabulary_order():
    w = np.array([[0.0, 0.5, 0.0, 0.25, 0.25]])
    assert [R.sample_from(w, u)[0] for u in (0.0, 0.49, 0.5, 0.74, 0.75, 0.999)] == [1, 1, 3, 3, 4, 4]
    assert R.cdf_margin(w, 0.5)[0] == 0.0 and np.isclose(R.cdf_margin(w, 0.6)[0], 0.1)
    # the empirical distribution of many uniforms follows the probabilities
    u = R.philox_uniform(5, np.arange(20000))
    counts = np.bincount(R.sample_from(np.repeat(w, 20000, 0), u), minlength=5)
    assert counts[0] == counts[2] == 0 and abs(counts[1] / 20000 - 0.5) < 0.02


def test_sample_uses_the_row_uniforms():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 30))
    probs, _ = R.sampling_probs(x, temperature=0.7, top_k=10, top_p=0.9)
    u = R.philox_uniform(11, np.arange(8), offset=4)
    assert np.array_equal(R.sample(x, temperature=0.7, top_k=10, top_p=0.9, seed=11, offset=4), R.sample_from(probs, u))
    assert np.allclose(probs.sum(1), 1) and ((probs > 0).sum(1) <= 10).all()


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=-1.0), dict(temperature=np.inf),
                                dict(top_k=-1), dict(top_k=1.5), dict(top_p=0.0), dict(top_p=1.5), dict(top_p=-0.1)])
def test_bad_parameters_raise(kw):
    with pytest.raises(ValueError):
        R.sampling_probs(np.zeros((1, 3)) + np.arange(3), **kw)


def test_beam_step_by_hand():
    lp = np.log(np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]))  # two beams of one sequence, V = 3
    scores, parent, token = R.beam_step(lp, np.log([[0.6, 0.4]]), beam=2)
    # candidates: beam 0: .30 .18 .12; beam 1: .04 .04 .32 -> .32 (1, 2), .30 (0, 0)
    assert parent.tolist() == [[1, 0]] and token.tolist() == [[2, 0]]
    assert np.allclose(np.exp(scores), [[0.32, 0.30]])
    # ties by the lower flat index; a dead beam (-inf) never survives while live candidates remain
    s, p, t = R.beam_step(np.zeros((2, 3)), np.array([[0.0, -INF]]), beam=2)
    assert p.tolist() == [[0, 0]] and t.tolist() == [[0, 1]]
    with pytest.raises(ValueError, match="beam"):
        R.beam_step(np.zeros((3, 3)), np.zeros(3), beam=2)


def test_reorder_cache():
    cache = np.arange(2 * 3 * 4).reshape(6, 4)
    out = R.reorder_cache(cache, np.array([[2, 2, 0], [1, 0, 0]]))
    assert out[:, 0].tolist() == [8, 8, 0, 16, 12, 12]


def test_ranking_and_top_p_mask():
    x = np.array([[1.0, 3.0, 3.0, -INF, 2.0]])
    assert R.ranking(x).tolist() == [[1, 2, 4, 0, 3]]
    assert R.top_k_mask(x, 3).tolist() == [[False, True, True, False, True]]
    assert R.top_p_mask(np.array([[0.1, 0.6, 0.3]]), 0.65).tolist() == [[False, True, True]]
    assert S.check_params(1.0, 0, 1.0) is None
