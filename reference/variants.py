"""Float64 oracle of the attention variants real models use: GQA/MQA, sliding windows, prefix-LM,
document masking, ALiBi and tanh soft-capping, forward and backward. NumPy only, clarity over speed.

Layout: q is (B, Hq, Tq, d); k and v are (B, Hkv, Tk, d) with Hq a multiple of Hkv (grouped-query attention:
query head h reads kv head h // (Hq // Hkv); Hkv = 1 is multi-query attention, Hkv = Hq plain multi-head). Any d.

The scores, in this order (the order FlashAttention applies them in):

    s_ij = scale * q_i . k_j                                (scale defaults to 1/sqrt(d))
    s_ij = softcap * tanh(s_ij / softcap)                   softcap: Gemma 2's logit soft-capping
    s_ij = s_ij - slope_h * |j - c_i|                       alibi_slopes: ALiBi (BLOOM, MPT), one slope per query head
    s_ij = -inf where the mask hides key j from query i
    o_i = sum_j softmax_j(s_ij) v_j,    lse_i = log sum_j exp(s_ij)   (natural log, over the keys the row sees)

The mask. c_i = i + Tk - Tq is query i's position on the diagonal, bottom-right aligned as in reference.attention
(with Tq == Tk it is i; with Tq == 1 the one query sits on the last key). Query i sees key j when

    ( [causal]  j <= c_i
      and [window = (left, right)]  c_i - left <= j <= c_i + right      (a side given as None is unbounded)
      or  [prefix]  j < prefix )                                         the prefix keys are seen by every query
    and [doc_ids_q, doc_ids_k]  doc_ids_q[i] == doc_ids_k[j]             documents never see each other

Causal with window (left, 0) or (left, None) is Mistral's sliding window: the query and the `left` keys before it.
prefix with causal is prefix-LM (the prefix is bidirectional, the rest causal); prefix with a window keeps the
first keys in view of every query ("attention sinks"). Document ids are per token, 1-D (the same for every batch
entry) or 2-D (B, T); doc_ids_k defaults to doc_ids_q when Tq == Tk (a packed self-attention batch). The causal
mask and the window use positions in the whole packed sequence; with the same number of queries and keys in every
document that is the same as each document's own causal mask. A row that sees no key gives o = 0 and lse = -inf,
never NaN, as reference.attention does.

The backward (derived by hand as in reference/backward.py), with t = tanh(scale q k^T / softcap):

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - delta),   delta_i = sum_c dO_ic O_ic
    dS_raw = dS * (1 - t^2)                              (dS without softcap: tanh's derivative)
    dQ = scale * dS_raw K,   dK = scale * dS_raw^T Q     (ALiBi's bias does not depend on q or k)

computed per query head, then dK and dV summed over the Hq // Hkv query heads that share a kv head.

`variant_mask` gives the boolean visibility for drawing and for kernels; `block_mask` classifies each
(query tile, key tile) as EMPTY (0: skip), FULL (1: no mask code) or PARTIAL (2: apply the mask), as FlexAttention's
block mask does.
"""

from __future__ import annotations

import operator

import numpy as np

from .attention import softmax_rows

__all__ = [
    "EMPTY", "FULL", "PARTIAL",
    "variant_mask", "block_mask", "attention_variant", "attention_variant_backward",
]

EMPTY, FULL, PARTIAL = 0, 1, 2


# ---- checking the options --------------------------------------------------------------------------------------------

def _check_window(window):
    """(left, right) with each side an int >= 0 or None (unbounded); None for no window."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"window must be a pair (left, right) of ints >= 0 or None; got {window!r}")
    sides = []
    for name, side in zip(("left", "right"), window):
        if side is None:
            sides.append(None)
            continue
        try:
            side = operator.index(side)
        except TypeError:
            raise TypeError(f"window {name} must be an int >= 0 or None; got {side!r}") from None
        if side < 0:
            raise ValueError(f"window {name} must be >= 0 (None for unbounded); got {side}")
        sides.append(side)
    return tuple(sides)


def _check_prefix(prefix, Tk):
    if prefix is None:
        return None
    try:
        prefix = operator.index(prefix)
    except TypeError:
        raise TypeError(f"prefix must be an int in [0, Tk={Tk}] or None; got {prefix!r}") from None
    if not 0 <= prefix <= Tk:
        raise ValueError(f"prefix must be in [0, Tk={Tk}]; got {prefix}")
    return prefix


def _check_doc_ids(doc_ids_q, doc_ids_k, Tq, Tk, B=None):
    """The two id arrays, each (T,) or (B, T); doc_ids_k defaults to doc_ids_q when Tq == Tk."""
    if doc_ids_q is None and doc_ids_k is None:
        return None, None
    if doc_ids_q is None:
        raise ValueError("doc_ids_k was given without doc_ids_q; document masking needs both (or doc_ids_q alone "
                         "when Tq == Tk)")
    if doc_ids_k is None:
        if Tq != Tk:
            raise ValueError(f"doc_ids_k is needed when Tq != Tk (Tq={Tq}, Tk={Tk}); only doc_ids_q was given")
        doc_ids_k = doc_ids_q
    out = []
    for name, ids, T, tname in (("doc_ids_q", doc_ids_q, Tq, "Tq"), ("doc_ids_k", doc_ids_k, Tk, "Tk")):
        ids = np.asarray(ids)
        if ids.ndim not in (1, 2) or ids.shape[-1] != T:
            raise ValueError(f"{name} must have shape ({tname},) or (B, {tname}) with {tname}={T}; got {ids.shape}")
        if ids.ndim == 2 and B is not None and ids.shape[0] != B:
            raise ValueError(f"{name} has {ids.shape[0]} rows; q has batch B={B}")
        out.append(ids)
    if out[0].ndim == 2 and out[1].ndim == 2 and out[0].shape[0] != out[1].shape[0]:
        raise ValueError(f"doc_ids_q {out[0].shape} and doc_ids_k {out[1].shape} disagree on B")
    return out


def _check_qkv(q, k, v):
    """(B, Hq, Tq, d, Hkv, Tk) after checking q (B, Hq, Tq, d), k and v (B, Hkv, Tk, d) with Hq % Hkv == 0."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be 4-D (B, H, T, d); got ndim {q.ndim}, {k.ndim}, {v.ndim}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {k.shape} and {v.shape}")
    B, Hq, Tq, d = q.shape
    Bk, Hkv, Tk, dk = k.shape
    if Bk != B or dk != d:
        raise ValueError(f"q {q.shape} and k {k.shape} disagree on B or d")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"Hq must be a multiple of Hkv (Hq % Hkv == 0); got Hq={Hq}, Hkv={Hkv}")
    return B, Hq, Tq, d, Hkv, Tk


def _check_slopes(alibi_slopes, B, Hq):
    if alibi_slopes is None:
        return None
    slopes = np.asarray(alibi_slopes, dtype=np.float64)
    if slopes.shape not in ((Hq,), (B, Hq)):
        raise ValueError(f"alibi_slopes must have Hq={Hq} entries, one per query head (shape ({Hq},) or "
                         f"({B}, {Hq})); got shape {slopes.shape}")
    return slopes


def _check_softcap(softcap):
    if softcap is None:
        return None
    softcap = float(softcap)
    if not softcap > 0:  # also catches NaN
        raise ValueError(f"softcap must be > 0 (None for no soft-capping); got {softcap}")
    return softcap


# ---- the mask --------------------------------------------------------------------------------------------------------

def variant_mask(Tq, Tk, *, causal=False, window=None, prefix=None, doc_ids_q=None, doc_ids_k=None):
    """Boolean visibility, True where query i sees key j: (Tq, Tk), or (B, Tq, Tk) when document ids are (B, T)."""
    window = _check_window(window)
    prefix = _check_prefix(prefix, Tk)
    doc_q, doc_k = _check_doc_ids(doc_ids_q, doc_ids_k, Tq, Tk)
    i = np.arange(Tq)[:, None]
    j = np.arange(Tk)[None, :]
    diag = i + (Tk - Tq)  # c_i, query i's position among the keys
    mask = np.ones((Tq, Tk), dtype=bool)
    if causal:
        mask &= j <= diag
    if window is not None:
        left, right = window
        if left is not None:
            mask &= j >= diag - left
        if right is not None:
            mask &= j <= diag + right
    if prefix is not None:
        mask |= j < prefix
    if doc_q is not None:
        mask = mask & (doc_q[..., :, None] == doc_k[..., None, :])
    return mask


def block_mask(mask, block_m, block_n):
    """Classify each (query tile, key tile) of a (Tq, Tk) or (B, Tq, Tk) boolean mask.

    Returns (kinds, counts): kinds is int8 (..., ceil(Tq / block_m), ceil(Tk / block_n)) holding EMPTY (0) where
    the tile sees nothing, FULL (1) where it sees every one of its in-range elements and PARTIAL (2) otherwise;
    counts is {"empty": n, "full": n, "partial": n} over all tiles. The last tiles of ragged sizes are judged on
    the elements inside (Tq, Tk); a kernel still bounds-checks them as it would without a mask.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim not in (2, 3):
        raise ValueError(f"mask must be (Tq, Tk) or (B, Tq, Tk); got shape {mask.shape}")
    for name, size in (("block_m", block_m), ("block_n", block_n)):
        if operator.index(size) < 1:
            raise ValueError(f"{name} must be >= 1; got {size}")
    Tq, Tk = mask.shape[-2:]
    nm, nn = -(-Tq // block_m), -(-Tk // block_n)
    pad = [(0, 0)] * (mask.ndim - 2) + [(0, nm * block_m - Tq), (0, nn * block_n - Tk)]
    visible = np.pad(mask, pad).astype(np.int64)
    inside = np.pad(np.ones(mask.shape, dtype=np.int64), pad)
    tiles = mask.shape[:-2] + (nm, block_m, nn, block_n)
    visible = visible.reshape(tiles).sum(axis=(-3, -1))  # visible elements per tile
    inside = inside.reshape(tiles).sum(axis=(-3, -1))  # in-range elements per tile
    kinds = np.where(visible == 0, EMPTY, np.where(visible == inside, FULL, PARTIAL)).astype(np.int8)
    counts = {"empty": int((kinds == EMPTY).sum()), "full": int((kinds == FULL).sum()),
              "partial": int((kinds == PARTIAL).sum())}
    return kinds, counts


# ---- forward and backward --------------------------------------------------------------------------------------------

def _forward_parts(q, k, v, causal, window, prefix, doc_ids_q, doc_ids_k, alibi_slopes, softcap, scale):
    """Everything the forward and the backward share: q, k, v in float64 with k, v repeated to Hq heads, the
    probabilities P (B, Hq, Tq, Tk; rows that see no key all 0), tanh of the capped scores (or None), the scale
    and the group size Hq // Hkv."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    B, Hq, Tq, d, Hkv, Tk = _check_qkv(q, k, v)
    slopes = _check_slopes(alibi_slopes, B, Hq)
    softcap = _check_softcap(softcap)
    _check_doc_ids(doc_ids_q, doc_ids_k, Tq, Tk, B)  # the batch size, which variant_mask cannot see
    mask = variant_mask(Tq, Tk, causal=causal, window=window, prefix=prefix, doc_ids_q=doc_ids_q,
                        doc_ids_k=doc_ids_k)
    if mask.ndim == 3:  # (B, Tq, Tk): one mask per batch entry, the same for every head
        mask = mask[:, None]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    group = Hq // Hkv
    k = np.repeat(k, group, axis=1)  # query head h reads kv head h // group
    v = np.repeat(v, group, axis=1)

    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    t = None
    if softcap is not None:
        t = np.tanh(s / softcap)
        s = softcap * t
    if slopes is not None:
        distance = np.abs(np.arange(Tk)[None, :] - (np.arange(Tq)[:, None] + Tk - Tq))  # |j - c_i|, (Tq, Tk)
        s = s - slopes[..., :, None, None] * distance
    p, lse = softmax_rows(np.where(mask, s, -np.inf))
    return q, k, v, p, lse, t, scale, group


def attention_variant(q, k, v, *, causal=False, window=None, prefix=None, doc_ids_q=None, doc_ids_k=None,
                      alibi_slopes=None, softcap=None, scale=None, return_lse=False):
    """Attention with any mix of the variants (see the module's docstring) in float64.

    q (B, Hq, Tq, d), k and v (B, Hkv, Tk, d) with Hq % Hkv == 0. Returns o (B, Hq, Tq, d) and, with
    return_lse=True, also lse (B, Hq, Tq) (-inf for a row that sees no key). With every option left at its
    default and Hq == Hkv it is reference.attention.
    """
    q, k, v, p, lse, _, _, _ = _forward_parts(q, k, v, causal, window, prefix, doc_ids_q, doc_ids_k,
                                              alibi_slopes, softcap, scale)
    o = p @ v  # rows that see no key have P = 0, so o = 0
    return (o, lse) if return_lse else o


def attention_variant_backward(q, k, v, do, *, causal=False, window=None, prefix=None, doc_ids_q=None,
                               doc_ids_k=None, alibi_slopes=None, softcap=None, scale=None):
    """(dq, dk, dv) in float64: the gradients of sum(attention_variant(q, k, v, ...) * do) with respect to q, k, v.

    dq has q's shape (B, Hq, Tq, d); dk and dv have k's (B, Hkv, Tk, d), each summed over the Hq // Hkv query
    heads that read that kv head. No gradient to the ALiBi slopes.
    """
    q, k_rep, v_rep, p, _, t, scale, group = _forward_parts(q, k, v, causal, window, prefix, doc_ids_q, doc_ids_k,
                                                            alibi_slopes, softcap, scale)
    do = np.asarray(do, dtype=np.float64)
    if do.shape != q.shape:
        raise ValueError(f"do must have q's shape {q.shape}; got {do.shape}")
    o = p @ v_rep
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v_rep, -1, -2)
    delta = (do * o).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    if t is not None:
        ds = ds * (1.0 - t * t)  # d(softcap * tanh(x / softcap)) / dx
    dq = scale * (ds @ k_rep)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q)
    B, Hq, Tk, d = dk.shape
    dk = dk.reshape(B, Hq // group, group, Tk, d).sum(axis=2)  # the query heads h = g * group + r share kv head g
    dv = dv.reshape(B, Hq // group, group, Tk, d).sum(axis=2)
    return dq, dk, dv
