"""Float64 attention backward on the CPU: dQ, dK, dV of o = attention(q, k, v) given dO = dL/do.

With S = scale * Q K^T (masked entries -inf), P = softmax(S) row by row and O = P V:

    dV = P^T dO
    dP = dO V^T
    dS = P * (dP - delta),   delta_i = sum_j P_ij dP_ij = sum_c dO_ic O_ic     (the softmax's Jacobian)
    dQ = scale * dS K
    dK = scale * dS^T Q

Causal masking is bottom-right aligned as in reference.attention (query i sees key j when j <= i + Tk - Tq).
A row that sees no key has P = 0, so its dQ row is 0 and it adds nothing to dK and dV.
NumPy only; layouts as in reference.attention: q, dO (B, H, Tq, d), k, v (B, H, Tk, d).
"""

from __future__ import annotations

import numpy as np

from .attention import _as64, _check_shapes, attention_scores

__all__ = ["attention_backward", "attention_probabilities"]


def attention_probabilities(q, k, *, causal=False, scale=None):
    """P = softmax(scale q k^T [masked]) in float64, shape (B, H, Tq, Tk); rows that see no key are all 0."""
    s = attention_scores(q, k, causal=causal, scale=scale)
    m = s.max(axis=-1, keepdims=True)
    seen = np.isfinite(m)
    p = np.exp(s - np.where(seen, m, 0.0))
    l = p.sum(axis=-1, keepdims=True)
    return np.where(seen, p / np.where(seen, l, 1.0), 0.0)


def attention_backward(q, k, v, do, *, causal=False, scale=None, dlse=None):
    """(dq, dk, dv) in float64: the gradients of sum(attention(q, k, v) * do) with respect to q, k and v; with dlse
    (B, H, Tq), of sum(attention(...) * do) + sum(lse * dlse) over the rows that see a key (d lse_i / d s_ij = P_ij,
    which is dS += P dlse, or delta - dlse in place of delta)."""
    q, k, v, do = _as64(q, k, v, do)
    _check_shapes(q, k, v)
    if do.shape != q.shape:
        raise ValueError(f"do must have q's shape {q.shape}; got {do.shape}")
    if dlse is not None and np.shape(dlse) != q.shape[:3]:
        raise ValueError(f"dlse must have shape {q.shape[:3]}; got {np.shape(dlse)}")
    d = q.shape[-1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    p = attention_probabilities(q, k, causal=causal, scale=scale)
    o = p @ v
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    delta = (do * o).sum(axis=-1, keepdims=True)
    if dlse is not None:
        delta = delta - np.asarray(dlse, dtype=np.float64)[..., None]
    ds = p * (dp - delta)
    dq = scale * (ds @ k)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q)
    return dq, dk, dv
