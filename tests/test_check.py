"""kernels.check: both bounds, on CPU arrays. A simulated correct kernel passes; local errors fail.

The simulation computes attention the way the course's kernels round it (q, k, v in the kernel's dtype,
scores in float32, P rounded to the input dtype before P V, O rounded once at the end) and compares with
the float64 reference, so it shows how much room a correct kernel leaves under each bound.
"""

import itertools

import numpy as np
import pytest

import reference as R
from kernels.core import check
from kernels.core.check import ELEMENT_FACTOR, TOLERANCES

try:
    import ml_dtypes

    BF16 = ml_dtypes.bfloat16
except ImportError:  # pragma: no cover
    BF16 = None


def _rnd(x, dt):
    return np.asarray(x).astype(dt).astype(np.float64)


def simulated_kernel(q, k, v, causal, dt):
    """Attention rounded like the tensor-core kernels (float32 scores, P and O in dt); float64 elsewhere."""
    Tq, Tk, d = q.shape[2], k.shape[2], q.shape[3]
    s = _rnd(q @ np.swapaxes(k, -1, -2), np.float32) / np.sqrt(d)
    if causal:
        s = np.where(R.causal_mask(Tq, Tk), s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    o = (_rnd(p, dt) @ v) / np.where(l > 0, l, 1.0)
    return _rnd(o, dt)


DTYPES = [("float32", np.float32), ("float16", np.float16)] + ([("bfloat16", BF16)] if BF16 else [])
SHAPES = [(1, 1), (33, 33), (257, 257), (1, 257), (100, 7), (33, 1024)]


@pytest.mark.parametrize("name,dt", DTYPES, ids=[n for n, _ in DTYPES])
def test_a_correctly_rounded_kernel_passes_with_room(name, dt):
    worst_l2 = worst_elem = 0.0
    for (Tq, Tk), d, causal, mag in itertools.product(SHAPES, [16, 64, 128], [False, True], [1.0, 10.0]):
        q, k, v = (_rnd(x, dt) for x in R.make_qkv(2, 2, Tq, d, Tk, magnitude=mag, seed=Tq + 7 * Tk + d))
        res = check(simulated_kernel(q, k, v, causal, dt), R.attention(q, k, v, causal=causal), name)
        assert res.ok, (Tq, Tk, d, causal, mag, res.detail())
        worst_l2, worst_elem = max(worst_l2, res.rel_l2), max(worst_elem, res.max_rel)
    # both bounds leave at least a factor 2 of room for a correct kernel
    assert worst_l2 < TOLERANCES[name] / 2 and worst_elem < ELEMENT_FACTOR * TOLERANCES[name] / 2


def test_one_wrong_tile_fails_although_the_l2_error_is_small():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 8, 1024, 64))
    out = ref.copy()
    out[1, 2, 16:32, 8:16] += 0.2  # one 16 x 8 mma tile off by 0.2
    res = check(out, ref, "float16")
    assert res.rel_l2 < TOLERANCES["float16"], "the premise: L2 alone would pass"
    assert not res.ok and res.max_rel > res.element_tol


def test_a_wrong_diagonal_fails():
    """Causal attention whose mask also hides the diagonal key (an off-by-one): rows differ from the first one on."""
    q, k, v = R.make_qkv(1, 2, 512, 64, seed=3)
    ref = R.attention(q, k, v, causal=True)
    s = R.attention_scores(q, k, causal=True)
    s[..., np.arange(1, 512), np.arange(1, 512)] = -np.inf  # row 0 keeps its only key
    p = np.exp(s - s.max(-1, keepdims=True))
    out = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    assert not check(out, ref, "bfloat16").ok


def test_nan_and_inf_rules():
    ref = np.array([1.0, -np.inf, 2.0])
    assert check(np.array([1.0, -np.inf, 2.0]), ref).ok
    assert not check(np.array([1.0, 0.0, 2.0]), ref).ok  # -inf must be matched exactly
    assert not check(np.array([np.nan, -np.inf, 2.0]), ref).ok
    assert not check(np.zeros(4), np.zeros(3)).ok


def test_printed_line_and_numbers():
    res = check(np.array([1.0, 2.0]), np.array([1.0, 2.0]), "float16")
    assert str(res) == "rel err < 2e-03 (worst element < 2e-02): True"
    d = res.as_dict()
    assert d["ok"] is True and d["rel_l2"] == 0.0 and d["tol"] == TOLERANCES["float16"]
    with pytest.raises(ValueError, match="no tolerance for dtype 'int8'"):
        check(np.zeros(2), np.zeros(2), "int8")
