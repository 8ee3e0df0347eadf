"""kernels/sampling/sampling.py against the float64 reference (reference/sampling.py), on the GPU.

What "equal" means here. The GPU computes in float32, the reference in float64, so two things can differ, and
only where rounding decides. The kept set: both keep a prefix of the ranking, and its length may differ only
among the lengths whose boundary mass lies within MARGIN * total of p * total (kept_lengths below). The sampled
token: it must be the float64 inverse-CDF draw over the GPU's own kept set, or a token whose CDF interval lies
within MARGIN * total of u * total (token_distance below). Outside those windows every comparison is exact.

The chi-square tests draw many tokens from one distribution (the same row repeated: each row has its own Philox
counter) and compare the counts with the reference probabilities at a false-alarm rate of ALPHA = 1e-3 per test:
a correct sampler fails one seed in a thousand. The seed is fixed, so the outcome is deterministic: it passed for
this seed and will keep passing unless the sampler changes. A negative control (the same counts against a slightly
different distribution) must fail, which shows the test can.

Two kernels run the default method (top_k_method="threshold"): sample_cluster<CS> (a cluster of CS blocks per row, the
row held in shared memory; sm_90, where the row fits) and sample_threshold (one block per row; cluster=0, older GPUs and
rows too long for a cluster). The grid runs every case through both ("auto" and "one-block"), every cluster size on a
few cases, and a row too long for any cluster. By default a covering part of the cases (THRESHOLD_DEFAULT,
LISTS_DEFAULT, _cluster_cases); `pytest --full-grid` runs all of them.
"""

import functools
import math

import numpy as np
import pytest

import kernels
import reference as R
from kernels.sampling import sampling as SM

MARGIN = 1e-5  # relative distance to a boundary below which float32 and float64 may disagree
ALPHA_Z = 3.0902  # the standard normal's 1 - 1e-3 quantile (Wilson-Hilferty for the chi-square critical value)


def make_logits(rows, V, *, std=1.0, seed=0, kind="normal"):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, V)) * std
    if kind == "ties":  # many exact ties
        x = np.round(x * 2) / 2
    elif kind == "equal":
        x[:] = 0.75
    elif kind == "neg_inf":  # most logits -inf, a few finite
        x[rng.random((rows, V)) < 0.9] = -np.inf
        x[:, min(3, V - 1)] = 1.0
    return x.astype(np.float32)


class Plain:
    """The float64 quantities of one array of logits at one temperature that the checks below share: the plain
    probabilities (no top-k or top-p) and the ranking, each computed at its first use. A case makes one and hands it to
    every check of those logits (at a vocabulary of 10^5 to 10^6 each takes a second or so); a check given none makes
    its own."""

    def __init__(self, logits, temperature):
        self.logits, self.temperature = logits, temperature

    @functools.cached_property
    def probs(self):
        return R.sampling_probs(self.logits, self.temperature)[0]  # plain softmax: no top-k or top-p

    @functools.cached_property
    def order(self):
        return R.ranking(self.logits)


def kept_lengths(logits, temperature, top_k, top_p, margin=MARGIN, plain=None):
    """Per row (lo, hi): the lengths of the ranking's prefix that a float32 computation may keep. The reference
    keeps the tokens whose preceding mass (in ranking order, within the top k) is below p * total; a length is
    allowed when its boundary lies within margin * total of p * total. Tokens of zero probability (-inf logits)
    are never counted. plain: a Plain of these logits and temperature."""
    plain = plain or Plain(logits, temperature)
    probs = plain.probs
    V = logits.shape[1]
    kk = top_k if 0 < top_k < V else V
    ranked = np.take_along_axis(probs, plain.order, axis=1)
    ranked[:, kk:] = 0
    positive = (ranked > 0).sum(axis=1)
    if top_p >= 1.0:
        lo = hi = np.full(len(probs), kk)
    else:
        cum = np.cumsum(ranked, axis=1)
        total = cum[:, -1:]
        lo = np.minimum(kk, (cum < (top_p - margin) * total).sum(axis=1) + 1)
        hi = np.minimum(kk, (cum < (top_p + margin) * total).sum(axis=1) + 1)
    return np.minimum(lo, positive), np.minimum(hi, positive)


def check_kept_set(logits, temperature, top_k, top_p, kept, plain=None):
    """kept (rows, V) bool, the GPU's nonzero probabilities: a prefix of the ranking of an allowed length."""
    plain = plain or Plain(logits, temperature)
    n = kept.sum(axis=1)
    ranked = np.take_along_axis(kept, plain.order, axis=1)
    prefix = (ranked == (np.arange(kept.shape[1])[None, :] < n[:, None])).all(axis=1)
    assert prefix.all(), f"rows {np.flatnonzero(~prefix)}: the kept set is not a prefix of the ranking"
    lo, hi = kept_lengths(logits, temperature, top_k, top_p, plain=plain)
    bad = (n < lo) | (n > hi)
    assert not bad.any(), f"rows {np.flatnonzero(bad)} keep {n[bad]} tokens; float32 may keep {lo[bad]}..{hi[bad]}"


def token_distance(probs, u, tokens):
    """Per row: how far (relative to the total) u * total lies from the CDF interval of `tokens` under probs
    (0 when the token is the inverse-CDF draw)."""
    cum = np.cumsum(probs, axis=1)
    edges = np.concatenate([np.zeros((len(probs), 1)), cum], axis=1)
    rows = np.arange(len(probs))
    target = u * cum[:, -1]
    below, above = edges[rows, tokens], edges[rows, tokens + 1]
    return np.maximum(0.0, np.maximum(below - target, target - above)) / cum[:, -1]


def check_tokens(logits, temperature, kept, tokens, seed, offset, plain=None):
    """tokens: the float64 inverse-CDF draw over the kept set for the rows' Philox uniforms, or within MARGIN of it."""
    plain = plain or Plain(logits, temperature)
    probs = np.where(kept, plain.probs, 0.0)
    probs /= probs.sum(axis=1, keepdims=True)
    assert (probs[np.arange(len(probs)), tokens] > 0).all(), "a token outside the kept set"
    u = R.philox_uniform(seed, np.arange(len(probs)), offset)
    far = token_distance(probs, u, tokens) >= MARGIN
    want = R.sample_from(probs, u)
    assert not far.any(), f"tokens {tokens[far]} != inverse-CDF draws {want[far]} away from a CDF boundary"


CASES = [  # V, rows, std, kind, temperature, top_k, top_p
    (50257, 6, 1.0, "normal", 1.0, 0, 0.9),
    (50257, 6, 10.0, "normal", 0.7, 0, 0.5),
    (128256, 4, 1.0, "normal", 1.5, 0, 0.99),
    (128256, 4, 3.0, "normal", 1.0, 0, 1e-6),
    (50257, 4, 1.0, "normal", 1.0, 0, 1.0),
    (1, 3, 1.0, "normal", 1.0, 0, 0.5),
    (1, 3, 1.0, "normal", 0.5, 1, 1.0),
    (50257, 4, 1.0, "ties", 1.0, 0, 0.7),
    (50257, 3, 1.0, "equal", 1.0, 0, 0.3),
    (50257, 3, 1.0, "neg_inf", 0.8, 0, 0.9),
    (50257, 6, 1.0, "normal", 1.0, 1, 1.0),
    (50257, 6, 1.0, "normal", 0.8, 50, 0.95),
    (128256, 4, 10.0, "normal", 1.0, 64, 1.0),
    (128256, 4, 1.0, "ties", 1.2, 40, 0.5),
    (50257, 3, 1.0, "equal", 1.0, 16, 0.3),
    (50257, 3, 1.0, "neg_inf", 1.0, 64, 1.0),
    (1000, 5, 2.0, "normal", 1.0, 17, 1e-6),
    # the benchmark's shapes: batch 1 and 64, vocabularies up to 256000
    (256000, 1, 2.0, "normal", 1.0, 0, 0.9),
    (256000, 2, 1.0, "normal", 1.0, 50, 1.0),
    (128256, 1, 1.0, "normal", 1.0, 0, 1e-6),
    (128256, 1, 2.0, "neg_inf", 1.0, 0, 0.9),
    (128256, 1, 1.0, "equal", 1.0, 1, 1.0),
    (32000, 64, 2.0, "normal", 1.0, 0, 0.9),
    (32000, 64, 2.0, "normal", 0.9, 50, 0.95),
    (32000, 64, 1.0, "normal", 1.0, 0, 1.0),
]

# method: "threshold" (automatic: sample_cluster where it runs), "one-block" (threshold method, cluster=0:
# sample_threshold), "lists" (FasterTransformer's top-k)
METHODS = {"threshold": dict(top_k_method="threshold"), "one-block": dict(top_k_method="threshold", cluster=0),
           "lists": dict(top_k_method="lists"), "cluster-1": dict(top_k_method="threshold", cluster=1),
           "cluster-4": dict(top_k_method="threshold", cluster=4)}
# The default grid (indices into the list above), for both kernels of the threshold method: top-p on each kind of
# logits (normal with std 10, ties, equal, -inf), top-k and top-k with top-p on each kind, plain sampling, k = 1, a
# vanishing p with and without top-k, V = 1, the largest vocabulary and a batch of 64 rows. The lists method (top-k
# only): k = 1, each kind, the smallest list build (k = 16) and the largest (k = 64), V = 256000. --full-grid: all.
# A 25-30 s case in an H100 run with 12 xdist workers is the first sampling case of its worker, compiling
# threshold.cu (NVRTC builds sample_threshold and five sample_cluster instantiations) and topk_lists.cu; a single
# process compiles them once, and the float64 reference takes about a second at most (32000 x 64).
THRESHOLD_DEFAULT = {1, 3, 4, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 18, 22}
LISTS_DEFAULT = {10, 11, 13, 14, 15, 16, 18}
CASES = [pytest.param(c + (method,), id="-".join(map(str, c + (method,))),
                      marks=() if i in (LISTS_DEFAULT if method == "lists" else THRESHOLD_DEFAULT)
                      else (pytest.mark.full_grid,))
         for method in ("threshold", "one-block", "lists") for i, c in enumerate(CASES)
         if method != "lists" or 0 < c[5] < c[0]]


def uses_clusters(gpu) -> bool:
    """True where sample() runs sample_cluster (sm_90 and newer)."""
    return kernels.device_compute_capability() >= SM.CLUSTER_MIN_CC


def run_case(gpu, x, T, k, p, seed, offset, **kw):
    """sample() with and without return_probs, checked against the reference: the kept set, the probabilities and the
    tokens (see the module docstring)."""
    ref_probs = R.sampling_probs(x, T, k, p)[0]
    tokens, probs = SM.sample(gpu.asarray(x), temperature=T, top_k=k, top_p=p, seed=seed, offset=offset,
                              return_probs=True, **kw)
    probs, tokens = probs.get(), tokens.get()
    kept = probs > 0
    shared = Plain(x, T)  # the plain probabilities and the ranking, computed once for the checks below
    check_kept_set(x, T, k, p, kept, plain=shared)
    same = (kept == (ref_probs > 0)).all(axis=1)
    if same.any():
        res = kernels.check(probs[same], ref_probs[same], "float32")
        assert res.ok, res.detail()
    check_tokens(x, T, kept, tokens, seed, offset, plain=shared)
    plain = SM.sample(gpu.asarray(x), temperature=T, top_k=k, top_p=p, seed=seed, offset=offset, **kw).get()
    check_tokens(x, T, kept, plain, seed, offset, plain=shared)


@pytest.mark.parametrize("case", CASES)
def test_probs_and_tokens_match_reference(gpu, poison, case):
    V, rows, std, kind, T, k, p, method = case
    x = make_logits(rows, V, std=std, seed=V + rows, kind=kind)
    ref_probs = R.sampling_probs(x, T, k, p)[0]
    seed, offset = 1234 + V, 7
    if method == "threshold" and uses_clusters(gpu):  # the automatic choice is the cluster kernel for every case here
        used = SM.kernels_used(k, V, rows=rows, top_p=p)
        assert used[0].startswith("sample_cluster"), used
    tokens, probs = SM.sample(gpu.asarray(x), temperature=T, top_k=k, top_p=p, seed=seed, offset=offset,
                              return_probs=True, **METHODS[method])
    probs, tokens = probs.get(), tokens.get()

    # kept sets: a prefix of the ranking, exactly the reference's unless float32 rounding at p can move its end
    kept = probs > 0
    shared = Plain(x, T)  # the plain probabilities and the ranking, computed once for the checks below
    check_kept_set(x, T, k, p, kept, plain=shared)
    same = (kept == (ref_probs > 0)).all(axis=1)
    # probabilities to float32 rounding (rows with the reference's kept set)
    if same.any():
        res = kernels.check(probs[same], ref_probs[same], "float32")
        assert res.ok, res.detail()
    # tokens: the inverse-CDF draw over that kept set for the same seed
    check_tokens(x, T, kept, tokens, seed, offset, plain=shared)
    # without return_probs a top-k draw takes another route (among the gathered survivors): the same rule
    plain = SM.sample(gpu.asarray(x), temperature=T, top_k=k, top_p=p, seed=seed, offset=offset,
                      **METHODS[method]).get()
    check_tokens(x, T, kept, plain, seed, offset, plain=shared)


CLUSTER_CASES = [  # V, std, kind, temperature, top_k, top_p: run through every cluster size on 3 rows
    (30001, 1.0, "normal", 1.0, 0, 0.9),   # odd V: rows start off 16-byte alignment
    (30001, 1.0, "ties", 1.0, 0, 0.7),
    (30001, 1.0, "neg_inf", 0.8, 0, 0.9),
    (30001, 2.0, "normal", 1.0, 0, 1.0),
    (30000, 3.0, "normal", 1.0, 0, 1e-6),
    (30000, 1.0, "normal", 0.8, 50, 0.95),
    (30001, 1.0, "ties", 1.2, 40, 0.5),
    (30001, 1.0, "equal", 1.0, 16, 0.3),
    (30001, 1.0, "equal", 1.0, 0, 0.3),
    (30000, 1.0, "normal", 1.0, 1, 1.0),
    (37, 1.0, "normal", 1.0, 5, 1.0),      # fewer groups than blocks: most blocks of a wide cluster hold nothing
    (1, 1.0, "normal", 1.0, 0, 0.5),
]


def _cluster_cases():
    """By default the rows of fewer than 100 logits (most blocks of a wide cluster hold nothing) at every cluster size,
    and each other case at one size, the sizes rotating so that each meets two cases; --full-grid: every case at
    every size."""
    for i, case in enumerate(CLUSTER_CASES):
        for cs in SM.CLUSTER_SIZES:
            default = case[0] < 100 or cs == SM.CLUSTER_SIZES[i % len(SM.CLUSTER_SIZES)]
            yield pytest.param(case, cs, id=f"{'-'.join(map(str, case))}-{cs}",
                               marks=() if default else (pytest.mark.full_grid,))


@pytest.mark.parametrize("case,cs", list(_cluster_cases()))
def test_every_cluster_size(gpu, poison, case, cs):
    if not uses_clusters(gpu):
        pytest.skip("thread-block clusters need compute capability >= 9.0")
    V, std, kind, T, k, p = case
    x = make_logits(3, V, std=std, seed=V + cs, kind=kind)
    run_case(gpu, x, T, k, p, seed=99 + cs, offset=3, cluster=cs)


def test_row_without_finite_logit(gpu, poison):
    x = make_logits(3, 5000, seed=4)
    x[1] = -np.inf
    x[2, 7] = np.inf
    for kw in ({}, {"cluster": 0}, {"top_k": 5}, {"top_p": 0.5}, {"top_k": 5, "top_k_method": "lists"}):
        tokens, probs = SM.sample(gpu.asarray(x), seed=1, return_probs=True, **kw)
        tokens, probs = tokens.get(), probs.get()
        assert tokens[1] == 0 and not probs[1].any(), kw
        assert tokens[2] == 0 and not probs[2].any(), kw
        check_tokens(x[:1], 1.0, probs[:1] > 0, tokens[:1], 1, 0)


def test_long_rows_fall_back(gpu, poison):
    """A row too long for any cluster's shared memory runs the one-block kernel, with the same results."""
    V = 1_000_003
    assert SM.kernels_used(0, V, rows=2) == ("sample_threshold",)
    x = make_logits(2, V, std=2.0, seed=8)
    for k, p in ((0, 0.9), (50, 1.0)):
        run_case(gpu, x, 1.0, k, p, seed=5, offset=1)
    if uses_clusters(gpu):
        with pytest.raises(ValueError, match="shared memory"):
            SM.sample(gpu.asarray(x), cluster=16)


def test_philox_bits_match_numpy(gpu):
    for seed, offset in ((0, 0), (123456789, 5), (2**64 - 1, 2**40 + 3)):
        u = SM.philox_uniforms(5000, seed, offset).get()
        assert np.array_equal(u.astype(np.float64), R.philox_uniform(seed, np.arange(5000), offset))


@pytest.mark.parametrize("V, k, kind", [(50257, 1, "normal"), (50257, 50, "normal"), (128256, 64, "normal"),
                                        (1000, 33, "ties"), (1000, 20, "equal"), (50257, 64, "neg_inf"),
                                        (5, 5, "normal"), (4097, 64, "normal")])
def test_top_k_values_and_indices(gpu, poison, V, k, kind):
    x = make_logits(5, V, std=2.0, seed=k, kind=kind)
    values, indices = SM.top_k(gpu.asarray(x), k)
    order = R.ranking(x)[:, :k]
    assert np.array_equal(indices.get(), order)
    assert np.array_equal(values.get(), np.take_along_axis(x, order, axis=1))


def test_top_k_one_is_greedy(gpu):
    x = make_logits(64, 128256, seed=3)
    methods = ((0, "threshold"), (1, "threshold"), (0, "one-block"), (0, "lists"))
    for seed, method in methods + (((0, "cluster-4"),) if uses_clusters(gpu) else ()):
        assert np.array_equal(SM.sample(gpu.asarray(x), top_k=1, seed=seed, **METHODS[method]).get(), x.argmax(1))


def chi_square(counts, probs):
    """(statistic, critical value at ALPHA) of counts against probs, bins with expected count < 5 pooled."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    e = np.append(expected[big], expected[~big].sum())
    o = np.append(counts[big], counts[~big].sum())
    if e[-1] < 5:  # fold a small pool into the smallest bin
        i = np.argmin(e[:-1])
        e[i] += e[-1]; o[i] += o[-1]
        e, o = e[:-1], o[:-1]
    stat = float(((o - e) ** 2 / e).sum())
    df = len(e) - 1
    crit = df * (1 - 2 / (9 * df) + ALPHA_Z * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit


@pytest.mark.parametrize("k, p, T, method", [(0, 0.9, 1.0, "threshold"), (50, 0.95, 0.8, "threshold"),
                                             (50, 0.95, 0.8, "lists"), (0, 1.0, 1.3, "threshold"),
                                             (0, 0.9, 1.0, "one-block"), (50, 0.95, 0.8, "one-block"),
                                             (0, 0.9, 1.0, "cluster-1"), (50, 0.95, 0.8, "cluster-1")])
def test_chi_square_goodness_of_fit(gpu, k, p, T, method):
    if method.startswith("cluster") and not uses_clusters(gpu):
        pytest.skip("thread-block clusters need compute capability >= 9.0")
    V, n = 1000, 100_000
    row = make_logits(1, V, std=2.0, seed=42)
    ref, _ = R.sampling_probs(row, T, k, p)
    x = gpu.ascontiguousarray(gpu.broadcast_to(gpu.asarray(row), (n, V)))
    tokens = SM.sample(x, temperature=T, top_k=k, top_p=p, seed=2024, **METHODS[method]).get()
    counts = np.bincount(tokens, minlength=V)
    assert counts[ref[0] == 0].sum() == 0, "tokens outside the kept set"
    stat, crit = chi_square(counts, ref[0])
    assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f} at alpha 1e-3"
    # negative control: the same counts against a distribution with 2% of the mass moved must fail
    q = ref[0].copy()
    top = np.argsort(-q)[:2]
    q[top[0]] += 0.02; q[top[1]] -= 0.02
    assert chi_square(counts, q)[0] > crit


BEAM_CASES = [(3, 4, 50257), (2, 8, 1000), (1, 64, 4096), (2, 1, 128256), (2, 3, 3)]


@pytest.mark.parametrize("B, K, V", BEAM_CASES)
def test_beam_step(gpu, poison, B, K, V):
    rng = np.random.default_rng(B * K + V)
    x = (rng.standard_normal((B * K, V)) * 3).astype(np.float32)
    cum = (rng.standard_normal((B, K)) - 5).astype(np.float32)
    cum[0, 1:] = -np.inf  # the first step of a beam search: one live beam
    ref_s, ref_p, ref_t = R.beam_step(x, cum, K)
    s, par, tok = SM.beam_step(gpu.asarray(x), gpu.asarray(cum), K)
    s, par, tok = s.get(), par.get(), tok.get()
    fin = np.isfinite(ref_s)
    assert np.array_equal(np.isfinite(s), fin)
    assert np.allclose(s[fin], ref_s[fin], rtol=1e-5, atol=1e-4)
    # the survivors: exactly the reference's wherever a survivor's score is apart from its neighbours (and from the
    # first loser) by more than float32 error; elsewhere the GPU's pick must score the same within that error
    scores_all = (cum.astype(float).reshape(B, K, 1) + R.log_softmax(x).reshape(B, K, V)).reshape(B, -1)
    top = -np.sort(-scores_all, axis=1)[:, :K + 1]
    with np.errstate(invalid="ignore"):
        gap = np.abs(np.diff(top, axis=1))
    gap = np.where(np.isnan(gap), np.inf, gap)  # -inf next to -inf: ties broken by index exactly
    clear = np.minimum(gap[:, :K], np.concatenate([np.full((B, 1), np.inf), gap[:, :K - 1]], axis=1)) > 1e-4
    same = (par == ref_p) & (tok == ref_t)
    assert (same | ~clear).all(), f"survivors differ at {np.argwhere(~same & clear).tolist()}"
    picked = np.take_along_axis(scores_all, par * V + tok, axis=1)
    assert np.allclose(picked[fin], ref_s[fin], rtol=0, atol=1e-4)
    assert clear.mean() > 0.8, "almost every survivor should be unambiguous on random logits"


def test_reorder_cache(gpu, poison):
    B, K, Hkv, Tmax, d = 3, 4, 2, 40, 64
    rng = np.random.default_rng(5)
    cache = rng.standard_normal((B * K, Hkv, Tmax, d)).astype(np.float16)
    parent = rng.integers(0, K, (B, K)).astype(np.int32)
    out = SM.reorder_cache(gpu.asarray(cache), gpu.asarray(parent))
    assert np.array_equal(out.get(), R.reorder_cache(cache, parent))
    parent[0, 0] = 99  # out of range: clamped in the kernel, never read out of bounds
    out = SM.reorder_cache(gpu.asarray(cache), gpu.asarray(parent)).get()
    assert np.array_equal(out[0], cache[K - 1])


@pytest.mark.parametrize("k", [1, 29, 30, 31, 50, 64])
def test_top_k_bound_with_ties_at_the_kth(gpu, poison, k):
    """sample_threshold's top-k starts from a lower bound of the k-th logit (kth_max_bound) and gathers every logit at
    or above it. Rows built so that the k-th logit falls inside a run of equal logits: 30 distinct large logits, then
    5000 zeros spread over the row (more than CAND_MAX at the bound: the count search takes over from the bound), or
    1000 zeros (fewer: the gather alone, ties broken by index). The kept set must be exactly the reference's prefix
    and the tokens its inverse-CDF draws."""
    rng = np.random.default_rng(k)
    rows = []
    for zeros in (5000, 1000):
        x = -1.0 - rng.random(12000)
        pos = rng.permutation(12000)
        x[pos[:30]] = 2.0 + rng.random(30)
        x[pos[30:30 + zeros]] = 0.0
        rows.append(x)
    x = np.asarray(rows, np.float32)
    for p in (1.0, 0.9):
        tokens, probs = SM.sample(gpu.asarray(x), top_k=k, top_p=p, seed=k, return_probs=True, cluster=0)
        ref_probs = R.sampling_probs(x, 1.0, k, p)[0]
        kept = probs.get() > 0
        assert np.array_equal(kept, ref_probs > 0)
        check_tokens(x, 1.0, kept, tokens.get(), k, 0)
        plain = SM.sample(gpu.asarray(x), top_k=k, top_p=p, seed=k, cluster=0).get()  # the draw among the gathered
        check_tokens(x, 1.0, kept, plain, k, 0)


@pytest.mark.parametrize("cluster", [None, 0])
def test_small_all_kernels(gpu, poison, cluster):
    """A small slice of every kernel (the compute-sanitizer runs this one); cluster=None: the automatic choice
    (sample_cluster on sm_90), 0: sample_threshold."""
    x = make_logits(3, 3000, std=2.0, seed=9)
    for k, p, method in ((0, 0.8, "threshold"), (0, 1.0, "threshold"), (5, 0.9, "threshold"), (64, 1.0, "lists")):
        tokens, probs = SM.sample(gpu.asarray(x), top_k=k, top_p=p, seed=3, return_probs=True, top_k_method=method,
                                  cluster=cluster)
        ref_probs, _ = R.sampling_probs(x, 1.0, k, p)
        assert kernels.check(probs.get(), ref_probs, "float32").ok
    tokens = SM.sample(gpu.asarray(x), top_k=7, top_p=0.5, seed=3, cluster=cluster).get()  # the draw among the top k
    check_tokens(x, 1.0, R.sampling_probs(x, 1.0, 7, 0.5)[0] > 0, tokens, 3, 0)
    ties = make_logits(2, 3001, kind="ties", seed=2)  # enough candidates for the pivot rounds and the gather
    mixed = np.concatenate([ties, make_logits(1, 3001, kind="equal")])  # V odd: unaligned rows
    for k in (0, 9):
        tokens, probs = SM.sample(gpu.asarray(mixed), top_k=k, top_p=0.6, seed=1, return_probs=True, cluster=cluster)
        kept = probs.get() > 0
        check_kept_set(mixed, 1.0, k, 0.6, kept)
        check_tokens(mixed, 1.0, kept, tokens.get(), 1, 0)
    s, par, tok = SM.beam_step(gpu.asarray(make_logits(4, 500, seed=1)), gpu.zeros((2, 2), gpu.float32), 2)
    assert np.array_equal(tok.get(), R.beam_step(make_logits(4, 500, seed=1), np.zeros((2, 2)), 2)[2])
    cache = np.arange(32, dtype=np.float32).reshape(4, 8)
    parent = np.array([[1, 0], [1, 1]], np.int32)
    out = SM.reorder_cache(gpu.asarray(cache), gpu.asarray(parent))
    assert np.array_equal(out.get(), R.reorder_cache(cache, parent))
    gpu.cuda.get_current_stream().synchronize()


@pytest.mark.parametrize("cs", SM.CLUSTER_SIZES)
def test_small_cluster(gpu, poison, cs):
    """Every path of sample_cluster<cs> on small rows (the compute-sanitizer runs this
    one): the histogram round and its gather (a row of normal logits), the pivot rounds (rows of ties, where the
    histogram's bracket holds too many candidates), the gather across blocks, the top-k draw among the candidates, the
    sampling pass with and without probs, a row of equal logits, a row without a finite logit, and blocks that hold
    no logit at all (V = 5)."""
    if not uses_clusters(gpu):
        pytest.skip("thread-block clusters need compute capability >= 9.0")
    ties = make_logits(2, 3001, kind="ties", seed=cs)
    x = np.concatenate([ties, make_logits(1, 3001, kind="equal"), make_logits(1, 3001, std=2.0, seed=cs),
                        np.full((1, 3001), -np.inf, np.float32)])
    n = len(x) - 1  # the rows with a finite logit
    for k, p in ((0, 0.6), (0, 1.0), (9, 1.0), (9, 0.6)):
        tokens, probs = SM.sample(gpu.asarray(x), top_k=k, top_p=p, seed=cs, return_probs=True, cluster=cs)
        tokens, probs = tokens.get(), probs.get()
        kept = probs[:n] > 0
        check_kept_set(x[:n], 1.0, k, p, kept)
        assert tokens[n] == 0 and not probs[n].any()
        check_tokens(x[:n], 1.0, kept, tokens[:n], cs, 0)
        tokens = SM.sample(gpu.asarray(x), top_k=k, top_p=p, seed=cs, cluster=cs).get()  # no probs
        assert tokens[n] == 0
        check_tokens(x[:n], 1.0, kept, tokens[:n], cs, 0)
    tiny = make_logits(2, 5, seed=cs)
    check_tokens(tiny, 1.0, np.ones((2, 5), bool),
                 SM.sample(gpu.asarray(tiny), seed=2, cluster=cs).get(), 2, 0)
    gpu.cuda.get_current_stream().synchronize()


@pytest.mark.parametrize("shift", [-4, 4])
@pytest.mark.parametrize("cluster", [0, 1, 4])
def test_histogram_bracket_fall_back(gpu, poison, monkeypatch, shift, cluster):
    """Top-p's histogram round brackets the crossing logit in one pass; where its bracket misses the crossing (or
    holds more candidates than fit), the pivot rounds take over. This build moves the bracket HIST_SHIFT bins off
    (-4: below the crossing, so the mass above it already reaches p; +4: above it, so the mass above and in it falls
    short), so every row takes that fall-back, which must give the reference's answers too. cluster=0 is
    sample_threshold, 1 and 4 sample_cluster."""
    if cluster and not uses_clusters(gpu):
        pytest.skip("thread-block clusters need compute capability >= 9.0")
    monkeypatch.setattr(SM, "THRESHOLD_DEFINES", SM.THRESHOLD_DEFINES + (f"-DHIST_SHIFT={shift}",))
    monkeypatch.setattr(SM, "_CLUSTER_KERNELS", {})  # compiled and configured again with the define
    for V, rows, std, T, p in ((50257, 4, 1.0, 1.0, 0.9), (30001, 3, 2.0, 0.7, 0.5), (3001, 3, 1.0, 1.0, 0.99)):
        x = make_logits(rows, V, std=std, seed=V + shift)
        run_case(gpu, x, T, 0, p, seed=5 + cluster, offset=1, cluster=cluster)


def test_errors(gpu):
    cp = gpu
    x = cp.asarray(make_logits(4, 1000))
    with pytest.raises(TypeError, match="logits"):
        SM.sample(x.get())
    with pytest.raises(TypeError, match="float64"):
        SM.sample(x.astype(cp.float64))
    with pytest.raises(ValueError, match="2-D"):
        SM.sample(x[0])
    with pytest.raises(ValueError, match="contiguous"):
        SM.sample(x[:, ::2])
    with pytest.raises(ValueError, match=r"shape \(0, 1000\)"):
        SM.sample(x[:0])
    for t in (0.0, -1.0, float("inf"), float("nan"), 1e-40):
        with pytest.raises(ValueError, match="temperature"):
            SM.sample(x, temperature=t)
    with pytest.raises(TypeError, match="temperature"):
        SM.sample(x, temperature="1")
    for k in (-1, 65, 999, 1.5, True):
        with pytest.raises(ValueError, match="top_k"):
            SM.sample(x, top_k=k)
    assert SM.sample(x, top_k=1000).shape == (4,)  # k >= V: no top-k
    with pytest.raises(ValueError, match="top_k_method"):
        SM.sample(x, top_k=5, top_k_method="sort")
    for c in (3, 32, -1, True, 2.0, "8"):
        with pytest.raises(ValueError, match="cluster"):
            SM.sample(x, cluster=c)
    for p in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match="top_p"):
            SM.sample(x, top_p=p)
    for name, bad in (("seed", -1), ("seed", 2**64), ("offset", -3), ("seed", 1.0)):
        with pytest.raises(ValueError, match=name):
            SM.sample(x, **{name: bad})
    for k in (0, 65, 1001):
        with pytest.raises(ValueError, match="k must be"):
            SM.top_k(x, k)
    cum = cp.zeros((2, 2), cp.float32)
    for beam in (0, 65, 3):
        with pytest.raises(ValueError, match="beam"):
            SM.beam_step(x, cum, beam)
    with pytest.raises(ValueError, match="cum_logprobs"):
        SM.beam_step(x, cp.zeros((4, 1), cp.float32), 2)
    with pytest.raises(TypeError, match="cum_logprobs"):
        SM.beam_step(x, cp.zeros((2, 2), cp.float64), 2)
    cache = cp.zeros((4, 2, 8, 64), cp.float16)
    with pytest.raises(ValueError, match="parent"):
        SM.reorder_cache(cache, cp.zeros((3, 2), cp.int32))
    with pytest.raises(TypeError, match="int32"):
        SM.reorder_cache(cache, cp.zeros((2, 2), cp.int64))
    with pytest.raises(ValueError, match="16"):
        SM.reorder_cache(cp.zeros((4, 3), cp.float16), cp.zeros((2, 2), cp.int32))
    with pytest.raises(ValueError, match="out"):
        SM.reorder_cache(cache, cp.zeros((2, 2), cp.int32), out=cache)
    with pytest.raises(TypeError, match="cache"):
        SM.reorder_cache(np.zeros((4, 8)), cp.zeros((2, 2), cp.int32))
    with pytest.raises(ValueError, match="n must"):
        SM.philox_uniforms(0)
