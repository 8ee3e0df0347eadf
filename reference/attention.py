"""Float64 attention on the CPU: the oracle every GPU kernel in the course is checked against.

Everything here is NumPy only (no CuPy, no torch), runs in float64 and favours clarity over speed.

Tensor layout: q is (B, H, Tq, d); k and v are (B, H, Tk, d).

Causal masking is bottom-right aligned, as in FlashAttention >= 2.1: query i sees key j when
j <= i + Tk - Tq. With Tq == Tk this is the usual lower triangle; with Tq == 1 (decoding) the single
query sees every key. A query row that sees no key (possible when Tq > Tk) gives an output of 0 and a
log-sum-exp of -inf, never NaN.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "causal_mask",
    "attention",
    "attention_scores",
]


def causal_mask(Tq: int, Tk: int) -> np.ndarray:
    """Boolean (Tq, Tk) array, True where query i may attend to key j (bottom-right aligned)."""
    i = np.arange(Tq)[:, None]
    j = np.arange(Tk)[None, :]
    return j <= i + (Tk - Tq)


def _as64(*arrays):
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _check_shapes(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be 4-D (B, H, T, d); got ndim {q.ndim}, {k.ndim}, {v.ndim}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {k.shape} and {v.shape}")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {q.shape} and k {k.shape} disagree on B, H or d")


def attention_scores(q, k, *, causal=False, scale=None):
    """S = scale * q k^T in float64, with masked entries set to -inf. Shape (B, H, Tq, Tk)."""
    q, k = _as64(q, k)
    d = q.shape[-1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    if causal:
        s = np.where(causal_mask(q.shape[2], k.shape[2]), s, -np.inf)
    return s


def attention(q, k, v, *, causal=False, scale=None, return_lse=False):
    """softmax(scale * q k^T [masked]) v in float64.

    Returns o with shape (B, H, Tq, d) and, with return_lse=True, also lse with shape (B, H, Tq):
    lse = log(sum_j exp(s_ij)) over the keys the row sees (-inf for a row that sees none).
    """
    q, k, v = _as64(q, k, v)
    _check_shapes(q, k, v)
    p, lse = softmax_rows(attention_scores(q, k, causal=causal, scale=scale))
    o = p @ v  # rows that see no key have P = 0, so o = 0
    return (o, lse) if return_lse else o


def softmax_rows(s):
    """(P, lse) of score rows s (masked entries -inf): P = the softmax of each row, all 0 for a row that sees no key;
    lse = log(sum_j exp(s_ij)), -inf for such a row. Shapes (..., Tk) and (...)."""
    m = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(m)  # False only for rows that see no key
    m_safe = np.where(seen, m, 0.0)
    p = np.exp(s - m_safe)  # exp(-inf) = 0 for masked entries
    l = p.sum(axis=-1, keepdims=True)
    l_safe = np.where(seen, l, 1.0)
    p = np.where(seen, p / l_safe, 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, m_safe + np.log(l_safe), -np.inf)[..., 0]
    return p, lse
