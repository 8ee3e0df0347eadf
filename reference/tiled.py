"""The tiled attention algorithms in NumPy, with the tile sizes as parameters and any sequence length.

- flash_attention_1: the loop order of the FlashAttention paper (Dao et al., 2022, Algorithm 1).
  K/V tiles in the OUTER loop, Q tiles in the inner loop. Because a Q tile is visited once per K/V
  tile, its partial output O and statistics l (sum) and m (max) live in "HBM" (full-size arrays here)
  and are read, rescaled and written back on every visit.
- flash_attention_2: the loop order of FlashAttention-2 (Dao, 2023). Q tiles in the OUTER loop; one
  Q tile's accumulator, m and l stay "on chip" (local variables) while all K/V tiles stream past; the
  division by l happens once at the end. Causal: K/V tiles entirely above the diagonal are skipped.
- merge_partials: combine outputs computed over disjoint slices of the keys, using their log-sum-exp.
  This is the combine step of split-KV ("flash-decoding") attention.

Both attention functions return (o, lse) and follow the same conventions as reference.attention.
"""

from __future__ import annotations

import numpy as np

from .attention import _as64, _check_shapes, causal_mask

__all__ = ["flash_attention_1", "flash_attention_2", "merge_partials", "split_kv_attention"]


def _exp_shift(x, m):
    """exp(x - m) where m may be -inf (then the result is 0: nothing has been seen yet)."""
    finite = np.isfinite(m)
    return np.where(finite, np.exp(np.where(finite, x - np.where(finite, m, 0.0), 0.0)), 0.0)


def _scores(qi, kj, scale, causal, rows, cols, Tq, Tk):
    s = np.einsum("bhid,bhjd->bhij", qi, kj) * scale
    if causal:
        allowed = cols[None, :] <= rows[:, None] + (Tk - Tq)
        s = np.where(allowed, s, -np.inf)
    return s


def _finish(o_acc, m, l):
    seen = l > 0
    o = np.where(seen[..., None], o_acc / np.where(seen, l, 1.0)[..., None], 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, m + np.log(np.where(seen, l, 1.0)), -np.inf)
    return o, lse


def flash_attention_1(q, k, v, *, causal=False, scale=None, block_q=16, block_k=16):
    """FlashAttention-1 loop order: for each K/V tile, for each Q tile, update O, l, m in "HBM"."""
    q, k, v = _as64(q, k, v)
    _check_shapes(q, k, v)
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    # The "HBM" state: one O row, one l and one m per query row, rewritten on every K/V tile.
    O = np.zeros((B, H, Tq, d))
    l = np.zeros((B, H, Tq))
    m = np.full((B, H, Tq), -np.inf)
    for k0 in range(0, Tk, block_k):
        cols = np.arange(k0, min(k0 + block_k, Tk))
        kj, vj = k[:, :, cols], v[:, :, cols]
        for q0 in range(0, Tq, block_q):
            rows = np.arange(q0, min(q0 + block_q, Tq))
            s = _scores(q[:, :, rows], kj, scale, causal, rows, cols, Tq, Tk)
            m_tile = s.max(axis=-1)
            p = _exp_shift(s, m_tile[..., None])
            l_tile = p.sum(axis=-1)
            m_old, l_old, o_old = m[:, :, rows], l[:, :, rows], O[:, :, rows]
            m_new = np.maximum(m_old, m_tile)
            a_old = _exp_shift(m_old, m_new)  # rescales what was accumulated before
            a_tile = _exp_shift(m_tile, m_new)  # rescales this tile's contribution
            l_new = a_old * l_old + a_tile * l_tile
            # The paper keeps O normalised after every tile: O = (l_old a_old O + a_tile P V) / l_new.
            num = (l_old * a_old)[..., None] * o_old + a_tile[..., None] * (p @ vj)
            O[:, :, rows] = np.where(l_new[..., None] > 0, num / np.where(l_new > 0, l_new, 1.0)[..., None], 0.0)
            l[:, :, rows] = l_new
            m[:, :, rows] = m_new
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)
    return O, lse


def flash_attention_2(q, k, v, *, causal=False, scale=None, block_q=16, block_k=16):
    """FlashAttention-2 loop order: for each Q tile, stream all K/V tiles; divide by l once at the end."""
    q, k, v = _as64(q, k, v)
    _check_shapes(q, k, v)
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    O = np.empty((B, H, Tq, d))
    LSE = np.empty((B, H, Tq))
    for q0 in range(0, Tq, block_q):
        rows = np.arange(q0, min(q0 + block_q, Tq))
        qi = q[:, :, rows]
        acc = np.zeros((B, H, len(rows), d))  # "registers": never written to HBM until the end
        m = np.full((B, H, len(rows)), -np.inf)
        l = np.zeros((B, H, len(rows)))
        # Causal: the last key any row of this tile may see; later K/V tiles are skipped entirely.
        k_end = min(Tk, rows[-1] + (Tk - Tq) + 1) if causal else Tk
        for k0 in range(0, max(k_end, 0), block_k):
            cols = np.arange(k0, min(k0 + block_k, Tk))
            s = _scores(qi, k[:, :, cols], scale, causal, rows, cols, Tq, Tk)
            m_new = np.maximum(m, s.max(axis=-1))
            alpha = _exp_shift(m, m_new)
            p = _exp_shift(s, m_new[..., None])
            l = alpha * l + p.sum(axis=-1)
            acc = alpha[..., None] * acc + p @ v[:, :, cols]
            m = m_new
        O[:, :, rows], LSE[:, :, rows] = _finish(acc, m, l)
    return O, LSE


def merge_partials(outs, lses):
    """Merge attention computed over disjoint key slices.

    outs[i] is (..., d), each normalised over its own slice; lses[i] is (...,) its log-sum-exp.
    The result is the attention over the union of the slices, and its log-sum-exp:
        lse = log(sum_i exp(lse_i)),   o = sum_i exp(lse_i - lse) * o_i.
    Slices that saw no key (lse_i = -inf) contribute nothing; if none saw a key, o = 0, lse = -inf.
    """
    outs = np.stack([np.asarray(o, dtype=np.float64) for o in outs])
    lses = np.stack([np.asarray(x, dtype=np.float64) for x in lses])
    m = lses.max(axis=0)
    w = _exp_shift(lses, m[None])
    total = w.sum(axis=0)
    seen = total > 0
    o = np.where(seen[..., None], (w[..., None] * outs).sum(axis=0) / np.where(seen, total, 1.0)[..., None], 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, m + np.log(np.where(seen, total, 1.0)), -np.inf)
    return o, lse


def split_kv_attention(q, k, v, *, causal=False, scale=None, num_splits=2):
    """Attention computed as num_splits independent key slices, then merged by LSE (split-KV)."""
    q, k, v = _as64(q, k, v)
    Tq, Tk = q.shape[2], k.shape[2]
    bounds = np.linspace(0, Tk, num_splits + 1).astype(int)
    outs, lses = [], []
    mask = causal_mask(Tq, Tk) if causal else np.ones((Tq, Tk), bool)
    d = q.shape[-1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b == a:
            continue
        s = np.einsum("bhid,bhjd->bhij", q, k[:, :, a:b]) * scale
        s = np.where(mask[:, a:b], s, -np.inf)
        m = s.max(axis=-1)
        p = _exp_shift(s, m[..., None])
        o, lse = _finish(p @ v[:, :, a:b], m, p.sum(axis=-1))
        outs.append(o)
        lses.append(lse)
    return merge_partials(outs, lses)
