"""Three ways to compute a row softmax, in NumPy, to show why the GPU kernels do what they do.

- softmax_naive:  exp(x) / sum(exp(x)). Overflows to inf/NaN once a logit passes about 709 (float64)
                  or 88 (float32).
- softmax_safe:   subtract the row maximum first. Three passes over the row: max, sum, normalise.
- softmax_online: one pass that keeps a running maximum m and a running sum l, rescaling l whenever
                  m grows (Milakov & Gimelshein, 2018). This is the recurrence FlashAttention is built on.

All three treat -inf as "masked": a row that is entirely -inf gives zeros, never NaN (except the naive
one, which is left naive on purpose).
"""

from __future__ import annotations

import numpy as np

__all__ = ["softmax_naive", "softmax_safe", "softmax_online", "online_update"]


def softmax_naive(x, axis=-1):
    """exp(x) / sum(exp(x)): correct on small logits, inf/NaN on large ones."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)
        return e / e.sum(axis=axis, keepdims=True)


def softmax_safe(x, axis=-1):
    """exp(x - max) / sum(exp(x - max)); all -inf rows give zeros."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    l = e.sum(axis=axis, keepdims=True)
    return e / np.where(l > 0, l, 1.0)


def online_update(m, l, x):
    """One step of the online softmax: fold the new values x into the running (max, sum).

    m, l and x broadcast together; returns the new (m, l). Safe when m or x is -inf.
    """
    m_new = np.maximum(m, x)
    finite = np.isfinite(m_new)
    ref = np.where(finite, m_new, 0.0)
    l_new = l * np.exp(np.where(finite, m - ref, 0.0)) * finite + np.exp(x - ref) * finite
    return m_new, l_new


def softmax_online(x, axis=-1):
    """Softmax with one read of each element to get (max, sum), then one pass to normalise.

    The loop walks the row element by element, exactly as a GPU thread would; rows are vectorised.
    """
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    m = np.full(x.shape[:-1], -np.inf)
    l = np.zeros(x.shape[:-1])
    for j in range(x.shape[-1]):
        m, l = online_update(m, l, x[..., j])
    m_ref = np.where(np.isfinite(m), m, 0.0)[..., None]
    out = np.exp(x - m_ref) / np.where(l > 0, l, 1.0)[..., None]
    return np.moveaxis(out, -1, axis)
