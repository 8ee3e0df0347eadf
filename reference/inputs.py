"""Random test inputs, drawn the same way by notebooks, tests and benchmarks."""

from __future__ import annotations

import numpy as np

try:  # gives NumPy the "bfloat16" dtype, so make_qkv(..., dtype="bfloat16") works
    import ml_dtypes  # noqa: F401
except ImportError:  # pragma: no cover
    pass


def make_qkv(B, H, Tq, d, Tk=None, *, magnitude=1.0, seed=0, dtype=np.float32):
    """q (B, H, Tq, d), k and v (B, H, Tk, d): normal with std `magnitude`, never zeros.

    A large magnitude (say 10) makes the logits large enough that a softmax without the max
    subtraction overflows in float32, so it tests the max-subtraction of every kernel.
    """
    Tk = Tq if Tk is None else Tk
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((B, H, Tq, d)) * magnitude).astype(dtype)
    k = (rng.standard_normal((B, H, Tk, d)) * magnitude).astype(dtype)
    v = rng.standard_normal((B, H, Tk, d)).astype(dtype)
    return q, k, v
