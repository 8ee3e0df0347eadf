"""The last step of decoding, in float64 NumPy: logits (batch, vocab) -> one token per row; and one beam-search step.

The semantics every sampling kernel of the course follows (kernels/sampling/sampling.py is checked against these functions):

    temperature  z = logits / T, T > 0 (finite).
    softmax      p = exp(z - max z) / sum exp(z - max z); a logit of -inf has probability 0.
    order        tokens are ranked by logit, larger first; equal logits rank by the LOWER index first. Every
                 rule below is a prefix of this ranking, so ties never make a set ambiguous.
    top-k        keep the first k tokens of the ranking (k = 0 or k >= vocab: keep all).
    top-p        keep the shortest prefix of the ranking whose probability mass reaches p: the token whose
                 mass crosses p is kept. p >= 1 keeps all; p must be > 0 (p close to 0 keeps the top token).
    combination  temperature -> top-k -> top-p, where top-p measures mass in the distribution renormalised over
                 the top-k set (the order of Hugging Face's and vLLM's samplers) -> renormalise over what is kept.
    sampling     inverse CDF in VOCABULARY order (not ranking order): with the kept probabilities
                 w_0, ..., w_{V-1} (0 outside the set) and a uniform u in [0, 1), the token is the first i with
                 w_0 + ... + w_i > u * (w_0 + ... + w_{V-1}). The GPU scans the row in index order, so the
                 reference does too, and the same u gives the same token up to rounding at a CDF boundary.
    uniforms     Philox4x32-10 (philox4x32 below), the counter-based generator of Salmon et al. (2011): key =
                 (seed mod 2^32, seed div 2^32), counter = (row, 0, offset mod 2^32, offset div 2^32); u is the
                 first output word's top 24 bits times 2^-24, a number that float32 and float64 hold exactly.
                 The GPU computes the same bits, so a seed reproduces the same uniforms on CPU and GPU.

Beam search (beam_step): with cumulative log-probabilities c (B, K) and logits (B*K, V), the candidates are
c[b, j] + log_softmax(logits[b*K + j]) over the K*V (beam, token) pairs of sequence b; the K best survive,
ranked by score then by the lower flat index j*V + token. Each survivor reports its parent beam j and token.
"""

from __future__ import annotations

import numpy as np

MASK32 = 0xFFFFFFFF
PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # the two round multipliers
PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # the key schedule's Weyl increments
PHILOX_ROUNDS = 10
UNIFORM_BITS = 24  # u = (word >> 8) * 2^-24


def philox4x32(counter, key, rounds: int = PHILOX_ROUNDS) -> np.ndarray:
    """Philox4x32-`rounds` of counters (..., 4) under keys (..., 2) (uint32, broadcast): the four output words.

    Each round multiplies two words by the constants PHILOX_M as 64-bit products, swaps the halves, XORs in the
    other two words and the key, and bumps the key by PHILOX_W (between rounds)."""
    c = np.asarray(counter, dtype=np.uint64) & MASK32
    k = np.asarray(key, dtype=np.uint64) & MASK32
    shape = np.broadcast_shapes(c.shape[:-1], k.shape[:-1])
    c0, c1, c2, c3 = (np.broadcast_to(c[..., i], shape).copy() for i in range(4))
    k0, k1 = (np.broadcast_to(k[..., i], shape).copy() for i in range(2))
    for r in range(rounds):
        if r:
            k0 = (k0 + PHILOX_W[0]) & MASK32
            k1 = (k1 + PHILOX_W[1]) & MASK32
        p0 = np.uint64(PHILOX_M[0]) * c0  # < 2^64: exact in uint64
        p1 = np.uint64(PHILOX_M[1]) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def philox_uniform(seed: int, rows, offset: int = 0) -> np.ndarray:
    """The uniform in [0, 1) that row `rows` (an int or an array of ints) draws at step `offset` for `seed`."""
    seed, offset = int(seed), int(offset)
    if not 0 <= seed < 2**64 or not 0 <= offset < 2**64:
        raise ValueError(f"seed and offset must lie in [0, 2^64); got {seed}, {offset}")
    rows = np.asarray(rows, dtype=np.uint64)
    ctr = np.zeros(rows.shape + (4,), dtype=np.uint64)
    ctr[..., 0] = rows & MASK32
    ctr[..., 2], ctr[..., 3] = offset & MASK32, offset >> 32
    key = np.array([seed & MASK32, seed >> 32], dtype=np.uint64)
    word = philox4x32(ctr, key)[..., 0].astype(np.float64)
    return np.floor(word / 2.0 ** (32 - UNIFORM_BITS)) * 2.0 ** -UNIFORM_BITS


def _rows(logits) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"logits must be (batch, vocab) with vocab >= 1; got shape {np.shape(logits)}")
    return x


def check_params(temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> None:
    """ValueError for a temperature that is not a finite number > 0, a negative k, or p outside (0, 1]."""
    t = float(temperature)
    if not np.isfinite(t) or t <= 0:
        raise ValueError(f"temperature must be a finite number > 0; got {temperature} (use top_k=1 for greedy)")
    if isinstance(top_k, bool) or int(top_k) != top_k or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0: no top-k); got {top_k!r}")
    p = float(top_p)
    if not (0.0 < p <= 1.0):
        raise ValueError(f"top_p must lie in (0, 1]; got {top_p}")


def softmax(logits, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of logits / temperature in float64 (-inf logits give 0)."""
    check_params(temperature)
    z = _rows(logits) / float(temperature)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def log_softmax(logits) -> np.ndarray:
    """Row-wise log-softmax in float64."""
    z = _rows(logits)
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def ranking(logits) -> np.ndarray:
    """(batch, vocab) token indices in ranking order: larger logit first, ties by the lower index."""
    x = _rows(logits)
    return np.lexsort((np.broadcast_to(np.arange(x.shape[1]), x.shape), -x), axis=1)


def top_k_mask(logits, k: int) -> np.ndarray:
    """Boolean (batch, vocab): the first k tokens of the ranking (all for k = 0 or k >= vocab)."""
    x = _rows(logits)
    check_params(top_k=k)
    V = x.shape[1]
    if k == 0 or k >= V:
        return np.ones(x.shape, dtype=bool)
    order = ranking(x)
    mask = np.zeros(x.shape, dtype=bool)
    np.put_along_axis(mask, order[:, :k], True, axis=1)
    return mask


def top_p_mask(probs, p: float, within=None) -> np.ndarray:
    """Boolean (batch, vocab): the shortest prefix of the ranking (by probs, ties by lower index) whose mass,
    measured in probs renormalised over `within` (a mask; default all), reaches p. The crossing token is kept."""
    check_params(top_p=p)
    w = _rows(probs)
    if within is not None:
        w = np.where(within, w, 0.0)
    B, V = w.shape
    if p >= 1.0:
        return np.ones(w.shape, dtype=bool) if within is None else np.asarray(within, dtype=bool).copy()
    order = ranking(np.where(w > 0, w, -1.0) if within is None else np.where(within, w, -1.0))
    sorted_w = np.take_along_axis(w, order, axis=1)
    cum = np.cumsum(sorted_w, axis=1)
    total = cum[:, -1:]
    # the number kept: 1 + the number of prefixes whose mass is still below p (at most V)
    n_keep = np.minimum((cum < p * total).sum(axis=1) + 1, V)
    mask = np.zeros(w.shape, dtype=bool)
    keep_sorted = np.arange(V)[None, :] < n_keep[:, None]
    np.put_along_axis(mask, order, keep_sorted, axis=1)
    return mask


def sampling_probs(logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
    """(probs, mask): the renormalised probabilities (batch, vocab) after temperature -> top-k -> top-p, and the
    boolean mask of the kept tokens. Rows keep their vocabulary order."""
    check_params(temperature, top_k, top_p)
    x = _rows(logits)
    B, V = x.shape
    probs = softmax(x, temperature)
    order = ranking(x)  # one ranking (by logit) for both rules: each keeps a prefix of it
    n_keep = np.full(B, V)
    if 0 < top_k < V:
        n_keep[:] = top_k
    if top_p < 1.0:
        ranked = np.take_along_axis(probs, order, axis=1)
        ranked = np.where(np.arange(V)[None, :] < n_keep[:, None], ranked, 0.0)  # the top-k set only
        cum = np.cumsum(ranked, axis=1)
        n_keep = np.minimum(n_keep, (cum < top_p * cum[:, -1:]).sum(axis=1) + 1)
    mask = np.zeros(x.shape, dtype=bool)
    np.put_along_axis(mask, order, np.arange(V)[None, :] < n_keep[:, None], axis=1)
    kept = np.where(mask, probs, 0.0)
    return kept / kept.sum(axis=1, keepdims=True), mask


def sample_from(probs, u) -> np.ndarray:
    """Inverse-CDF sampling in vocabulary order: for each row the first i with cumsum(w)[i] > u * sum(w).

    A row whose cumulative sum never passes u * total (rounding with u close to 1) takes its last token of
    nonzero weight. Returns int64 (batch,)."""
    w = _rows(probs)
    u = np.broadcast_to(np.asarray(u, dtype=np.float64), (w.shape[0],))
    cum = np.cumsum(w, axis=1)
    target = u * cum[:, -1]
    idx = (cum <= target[:, None]).sum(axis=1)
    last = w.shape[1] - 1 - np.argmax((w > 0)[:, ::-1], axis=1)
    return np.where(idx < w.shape[1], idx, last).astype(np.int64)


def cdf_margin(probs, u) -> np.ndarray:
    """How far each row's u * total lies from the nearest CDF boundary, relative to the total: the sampled token
    of a float32 computation may differ from the float64 one only where this is about 1e-6 or less."""
    w = _rows(probs)
    u = np.broadcast_to(np.asarray(u, dtype=np.float64), (w.shape[0],))
    cum = np.cumsum(w, axis=1)
    total = cum[:, -1]
    edges = np.concatenate([np.zeros((w.shape[0], 1)), cum], axis=1)
    return np.abs(edges - (u * total)[:, None]).min(axis=1) / total


def sample(logits, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
           offset: int = 0) -> np.ndarray:
    """One token per row: temperature -> top-k -> top-p -> renormalise -> inverse CDF with the row's Philox
    uniform philox_uniform(seed, row, offset). Returns int64 (batch,)."""
    probs, _ = sampling_probs(logits, temperature, top_k, top_p)
    return sample_from(probs, philox_uniform(seed, np.arange(probs.shape[0]), offset))


def beam_step(logits, cum_logprobs, beam: int):
    """One beam-search step. logits (B * beam, V), cum_logprobs (B, beam) or (B * beam,).

    Returns (scores (B, beam) float64, parent (B, beam) int64, token (B, beam) int64): the `beam` best of
    cum_logprobs[b, j] + log_softmax(logits[b * beam + j]) over j < beam and all tokens, ranked by score, ties by
    the lower flat index j * V + token."""
    x = _rows(logits)
    if beam < 1 or x.shape[0] % beam:
        raise ValueError(f"beam must be >= 1 and divide the {x.shape[0]} rows of logits; got {beam}")
    B, V = x.shape[0] // beam, x.shape[1]
    if beam > beam * V:
        raise ValueError(f"beam={beam} is larger than the {beam * V} candidates")
    c = np.asarray(cum_logprobs, dtype=np.float64).reshape(B, beam)
    scores = (c[:, :, None] + log_softmax(x).reshape(B, beam, V)).reshape(B, beam * V)
    order = ranking(scores)[:, :beam]
    return np.take_along_axis(scores, order, axis=1), order // V, order % V


def reorder_cache(cache, parent) -> np.ndarray:
    """cache (B * beam, ...) reordered so that row b * beam + j holds the old row b * beam + parent[b, j]."""
    parent = np.asarray(parent)
    B, beam = parent.shape
    src = (np.arange(B)[:, None] * beam + parent).reshape(-1)
    return np.asarray(cache)[src]
