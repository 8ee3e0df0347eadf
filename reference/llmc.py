"""llm.c's packed attention layout, and the permutes that bridge it to the (B, H, T, d) layout.

In karpathy/llm.c the attention layer takes inp of shape (B, T, 3C): for each token, the C query
values, then the C key values, then the C value values, each split into NH heads of hs = C / NH.
Viewed as (B, T, 3, NH, hs), permuting to (3, B, NH, T, hs) gives the q, k, v used everywhere else
in this course. The output comes back as (B, NH, T, hs) and is "unpermuted" to (B, T, C).

attention_forward_llmc reproduces what llm.c's CPU attention forward returns (out, preatt, att),
written here from the definition, in float64: causal (standard lower triangle, T queries and T keys),
preatt = scale * q.k with -inf above the diagonal, att = softmax(preatt) with zeros above it.
"""

from __future__ import annotations

import numpy as np

from .attention import attention_scores
from .softmax import softmax_safe

__all__ = ["permute_qkv", "unpermute", "attention_forward_llmc"]


def permute_qkv(inp, NH):
    """(B, T, 3C) -> q, k, v each (B, NH, T, hs)."""
    inp = np.asarray(inp)
    B, T, C3 = inp.shape
    if C3 % 3 or (C3 // 3) % NH:
        raise ValueError(f"inp last dimension {C3} must be 3 * NH * hs with NH={NH}")
    hs = C3 // 3 // NH
    qkv = inp.reshape(B, T, 3, NH, hs).transpose(2, 0, 3, 1, 4)
    return qkv[0], qkv[1], qkv[2]


def unpermute(o):
    """(B, NH, T, hs) -> (B, T, NH * hs)."""
    o = np.asarray(o)
    B, NH, T, hs = o.shape
    return o.transpose(0, 2, 1, 3).reshape(B, T, NH * hs)


def attention_forward_llmc(inp, NH):
    """Return (out (B, T, C), preatt (B, NH, T, T), att (B, NH, T, T)) as llm.c's CPU forward does."""
    q, k, v = permute_qkv(np.asarray(inp, dtype=np.float64), NH)
    preatt = attention_scores(q, k, causal=True)
    att = softmax_safe(preatt)
    out = unpermute(att @ v)
    return out, preatt, att
