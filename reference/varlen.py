"""Float64 oracle of variable-length batches: padding removal, cu_seqlens and varlen attention (NumPy only).

A batch of B sequences of different lengths is usually stored padded to the longest, Tmax: a (B, Tmax, ...) array
and a boolean padding mask (B, Tmax), True on real tokens. Everything a transformer layer does per token (the
projections, the MLP, layer norm) wastes the work it spends on padding; attention wastes more (padded queries
against padded keys). The packed ("varlen") layout keeps only the real tokens, one sequence after the other:

    lengths     = mask.sum(1)                                  (B,)     tokens of each sequence
    cu_seqlens  = [0, l0, l0+l1, ..., total]                   (B+1,)   int32, exclusive prefix sum of lengths
    packed[cu_seqlens[b] + t] = padded[b, t]    for t < lengths[b]      (total, ...)

`remove_padding` gathers the real tokens (the mask may have holes: a token's packed index is the number of real
tokens before it, an exclusive prefix sum over the flattened mask); `restore_padding` scatters them back with zeros
in the padding. `varlen_attention` runs attention sequence by sequence on packed q (total_q, H, d) and k, v
(total_k, H, d) with cu_seqlens_q / cu_seqlens_k, causal bottom-right per sequence (query i of a sequence with Tq
queries and Tk keys sees key j when j <= i + Tk - Tq). An empty sequence (length 0) is allowed; a query row that
sees no key gives 0 and lse = -inf. lse has shape (H, total_q), the layout of the GPU kernel.

`bert_layer_padded` and `bert_layer_packed` run one attention block of a BERT-style encoder (one fused QKV
projection, attention, output projection) on the padded batch with a key mask and on the packed tokens; on the
real tokens the two agree (the padded one computes garbage-free but wasted rows for the padding).
"""

from __future__ import annotations

import numpy as np

from .attention import attention

__all__ = [
    "lengths_from_mask", "cu_seqlens_from_lengths", "check_cu_seqlens", "token_offsets",
    "remove_padding", "restore_padding", "varlen_attention", "padded_attention",
    "bert_layer_padded", "bert_layer_packed", "make_bert_weights",
]


def lengths_from_mask(mask) -> np.ndarray:
    """Real tokens per sequence: mask (B, Tmax) of bool (True = real token) -> int32 (B,)."""
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2-D (B, Tmax); got shape {mask.shape}")
    return mask.astype(bool).sum(axis=1).astype(np.int32)


def cu_seqlens_from_lengths(lengths) -> np.ndarray:
    """The exclusive prefix sum [0, l0, l0+l1, ..., sum]: int32, length B+1."""
    lengths = np.asarray(lengths)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be 1-D (B,); got shape {lengths.shape}")
    if lengths.size and lengths.min() < 0:
        raise ValueError(f"lengths must be >= 0; got min {int(lengths.min())}")
    total = int(lengths.astype(np.int64).sum())
    if total > np.iinfo(np.int32).max:
        raise ValueError(f"the lengths add up to {total} tokens; cu_seqlens is int32 (<= {np.iinfo(np.int32).max})")
    out = np.zeros(lengths.size + 1, dtype=np.int32)
    np.cumsum(lengths, out=out[1:])
    return out


def check_cu_seqlens(cu_seqlens, total: int | None = None, name: str = "cu_seqlens") -> np.ndarray:
    """cu_seqlens as an int32 array after checking it: 1-D int32 of length >= 2, starts at 0, never decreases,
    ends at `total` (when given). Raises TypeError / ValueError naming the problem."""
    cu = np.asarray(cu_seqlens)
    if cu.dtype != np.int32:
        raise TypeError(f"{name} must be int32; got {cu.dtype}")
    if cu.ndim != 1 or cu.size < 2:
        raise ValueError(f"{name} must be 1-D with B+1 >= 2 entries; got shape {cu.shape}")
    if cu[0] != 0:
        raise ValueError(f"{name}[0] must be 0; got {int(cu[0])}")
    steps = np.diff(cu.astype(np.int64))
    if steps.size and steps.min() < 0:
        b = int(np.argmin(steps))
        raise ValueError(f"{name} must not decrease; {name}[{b}] = {int(cu[b])} > {name}[{b + 1}] = {int(cu[b + 1])}")
    if total is not None and int(cu[-1]) != total:
        raise ValueError(f"{name}[-1] = {int(cu[-1])} must equal the number of packed tokens, {total}")
    return cu


def token_offsets(mask) -> np.ndarray:
    """For each position of the padded batch, its packed index (an exclusive prefix sum over the flattened mask)
    where the mask is True, -1 where it is padding: int32 (B, Tmax)."""
    mask = np.asarray(mask).astype(bool)
    flat = mask.reshape(-1).astype(np.int64)
    excl = np.cumsum(flat) - flat
    return np.where(mask, excl.reshape(mask.shape), -1).astype(np.int32)


def remove_padding(x, mask) -> np.ndarray:
    """The real tokens of x (B, Tmax, ...) in order: (total, ...) with total = mask.sum()."""
    x = np.asarray(x)
    mask = np.asarray(mask).astype(bool)
    if x.shape[:2] != mask.shape:
        raise ValueError(f"x {x.shape} and mask {mask.shape} must agree on (B, Tmax)")
    return x[mask]


def restore_padding(packed, mask) -> np.ndarray:
    """The inverse of remove_padding: (total, ...) -> (B, Tmax, ...), zeros where the mask is False."""
    packed = np.asarray(packed)
    mask = np.asarray(mask).astype(bool)
    if packed.shape[0] != int(mask.sum()):
        raise ValueError(f"packed has {packed.shape[0]} rows; the mask has {int(mask.sum())} real tokens")
    out = np.zeros(mask.shape + packed.shape[1:], dtype=packed.dtype)
    out[mask] = packed
    return out


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, scale=None, return_lse=False):
    """Attention of each sequence b on its own tokens: q (total_q, H, d), k and v (total_k, H, d), packed.

    Sequence b owns query rows cu_seqlens_q[b] : cu_seqlens_q[b+1] and key rows cu_seqlens_k[b] : cu_seqlens_k[b+1].
    Returns o (total_q, H, d) float64 and, with return_lse, lse (H, total_q) (-inf for a row that sees no key).
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if q.ndim != 3 or k.ndim != 3 or k.shape != v.shape or q.shape[1:] != k.shape[1:]:
        raise ValueError(f"q (total_q, H, d), k and v (total_k, H, d) must agree on H and d; got q {q.shape}, "
                         f"k {k.shape}, v {v.shape}")
    cu_q = check_cu_seqlens(cu_seqlens_q, q.shape[0], "cu_seqlens_q")
    cu_k = check_cu_seqlens(cu_seqlens_k, k.shape[0], "cu_seqlens_k")
    if cu_q.size != cu_k.size:
        raise ValueError(f"cu_seqlens_q has {cu_q.size} entries and cu_seqlens_k {cu_k.size}; both must be B+1")
    H, d = q.shape[1:]
    o = np.zeros(q.shape)
    lse = np.full((H, q.shape[0]), -np.inf)
    for b in range(cu_q.size - 1):
        qs, qe, ks, ke = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if qe == qs:
            continue
        if ke == ks:  # no key at all: every row gives 0 and lse -inf (already there)
            continue
        # (T, H, d) -> (1, H, T, d) for the dense oracle
        ob, lb = attention(q[qs:qe].transpose(1, 0, 2)[None], k[ks:ke].transpose(1, 0, 2)[None],
                           v[ks:ke].transpose(1, 0, 2)[None], causal=causal, scale=scale, return_lse=True)
        o[qs:qe] = ob[0].transpose(1, 0, 2)
        lse[:, qs:qe] = lb[0]
    return (o, lse) if return_lse else o


def padded_attention(q, k, v, key_mask, *, scale=None):
    """Attention on a padded batch with a key mask (what a padded BERT layer runs): q, k, v (B, Tmax, H, d),
    key_mask (B, Tmax) True on real keys. Rows of padded queries are computed too (wasted work); a row whose
    sequence has no key gives 0."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    d = q.shape[-1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    s = np.where(np.asarray(key_mask, bool)[:, None, None, :], s, -np.inf)
    m = s.max(-1, keepdims=True)
    seen = np.isfinite(m)
    p = np.exp(s - np.where(seen, m, 0.0))
    l = p.sum(-1, keepdims=True)
    o = np.where(seen, (p / np.where(seen, l, 1.0)) @ v.transpose(0, 2, 1, 3), 0.0)  # (B, H, Tmax, d)
    return o.transpose(0, 2, 1, 3)


def make_bert_weights(hidden: int, *, seed=0):
    """w_qkv (hidden, 3*hidden), b_qkv (3*hidden,), w_o (hidden, hidden), b_o (hidden,), float64, std 1/sqrt(hidden)."""
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(hidden)
    return (rng.standard_normal((hidden, 3 * hidden)) * s, rng.standard_normal(3 * hidden) * 0.1,
            rng.standard_normal((hidden, hidden)) * s, rng.standard_normal(hidden) * 0.1)


def _qkv(x, w_qkv, b_qkv, heads):
    """One GEMM for q, k and v: x (..., hidden) @ w_qkv (hidden, 3 hidden) -> three (..., heads, d)."""
    hidden = x.shape[-1]
    qkv = (x @ w_qkv + b_qkv).reshape(x.shape[:-1] + (3, heads, hidden // heads))
    return qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]


def bert_layer_padded(x, mask, weights, heads: int, *, scale=None):
    """out = attention(x W_qkv) W_o + b_o on the padded batch x (B, Tmax, hidden) with key mask (B, Tmax).
    Every position is computed; the rows of padding are not meaningful."""
    w_qkv, b_qkv, w_o, b_o = weights
    x = np.asarray(x, dtype=np.float64)
    q, k, v = _qkv(x, w_qkv, b_qkv, heads)
    a = padded_attention(q, k, v, mask, scale=scale).reshape(x.shape)
    return a @ w_o + b_o


def bert_layer_packed(x, mask, weights, heads: int, *, scale=None):
    """The same layer the effective-transformer way: remove padding once, run on the packed tokens (varlen
    attention), restore at the end. Returns (B, Tmax, hidden) with zeros in the padding."""
    w_qkv, b_qkv, w_o, b_o = weights
    mask = np.asarray(mask, bool)
    xp = remove_padding(np.asarray(x, dtype=np.float64), mask)
    q, k, v = _qkv(xp, w_qkv, b_qkv, heads)
    cu = cu_seqlens_from_lengths(lengths_from_mask(mask))
    a = varlen_attention(q, k, v, cu, cu, scale=scale).reshape(xp.shape)
    return restore_padding(a @ w_o + b_o, mask)
