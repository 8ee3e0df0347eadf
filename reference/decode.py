"""Decoding attention in float64: a few new query rows per sequence against that sequence's KV cache.

This is the oracle of the decoding kernels (kernels/decode_*.py). The contract:

    o, lse = decode_attention(q, k_cache, v_cache, seqlens_k, block_table=None, scale=None)

    q            (B, Hq, Tq, d)    Tq new query rows of each sequence (1 = plain decoding; a few = a speculative
                                   or chunked append of Tq tokens)
    k_cache      (B, Hkv, Tmax, d) contiguous cache: sequence b's keys are k_cache[b, :, :L_b]
      or         (num_pages, Hkv, page_size, d) with block_table (B, max_pages): sequence b's key j lives in
                                   page block_table[b, j // page_size], row j % page_size
    v_cache      same shape as k_cache
    seqlens_k    (B,) integers: L_b, the number of keys of sequence b (its new rows included)

    Hq must be a multiple of Hkv (grouped-query attention; Hkv = 1 is multi-query attention): query head h
    reads KV head h // (Hq / Hkv), as torch's enable_gqa does.

    Causal masking is bottom-right aligned against each sequence's own length: query i of sequence b sees key j
    when j <= i + L_b - Tq (so the last query row sees all L_b keys). A row that sees no key (L_b = 0, or
    L_b < Tq for the first rows) gives o = 0 and lse = -inf.

    Returns o (B, Hq, Tq, d) and lse (B, Hq, Tq), the natural-log log-sum-exp of each row's scaled scores.

Out-of-range indices. A kernel cannot read seqlens_k or block_table without the GPU, so the launchers check
their values only when asked (check_indices=True) and otherwise clamp inside the kernels. What the kernels
compute then is defined here, as out_of_range="clamp":

    a length below 0 counts as 0, a length above the capacity (Tmax, or max_pages * page_size) as the capacity;
    a key whose page index lies outside [0, num_pages) is skipped: it is masked out, as if it were not there.

With out_of_range="error" (the default) such values raise ValueError instead.

Also here: the split/merge identity that split-KV ("flash-decoding") kernels rely on (decode_attention_split),
the rows a loop-per-row formula gives (decode_attention_rows, the most direct statement of the contract, used by
the tests), and the cache append of a decode loop (append_kv).
"""

from __future__ import annotations

import numpy as np

from .tiled import merge_partials

__all__ = [
    "decode_attention", "decode_attention_split", "decode_attention_rows", "decode_split_bounds",
    "gather_kv", "append_kv", "key_positions",
]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _capacity(k_cache, block_table):
    return k_cache.shape[2] if block_table is None else block_table.shape[1] * k_cache.shape[2]


def _check(q, k_cache, v_cache, seqlens_k, block_table):
    q, k_cache, v_cache = (np.asarray(x) for x in (q, k_cache, v_cache))
    if q.ndim != 4 or k_cache.ndim != 4:
        raise ValueError(f"q and the caches must be 4-D; got q {q.shape}, k_cache {k_cache.shape}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {k_cache.shape} and v_cache {v_cache.shape} must have the same shape")
    B, Hq, Tq, d = q.shape
    Hkv = k_cache.shape[1]
    if k_cache.shape[3] != d:
        raise ValueError(f"q has d={d}; the caches have d={k_cache.shape[3]}")
    if Hq % Hkv:
        raise ValueError(f"Hq={Hq} must be a multiple of Hkv={Hkv}")
    seqlens = np.asarray(seqlens_k).astype(np.int64)
    if seqlens.shape != (B,):
        raise ValueError(f"seqlens_k must have shape ({B},); got {seqlens.shape}")
    if block_table is None:
        if k_cache.shape[0] != B:
            raise ValueError(f"a contiguous cache must have B={B} rows; got k_cache {k_cache.shape}")
    else:
        block_table = np.asarray(block_table).astype(np.int64)
        if block_table.ndim != 2 or block_table.shape[0] != B:
            raise ValueError(f"block_table must have shape ({B}, max_pages); got {block_table.shape}")
    return q, k_cache, v_cache, seqlens, block_table


def _rows_of(k_cache, b, L, block_table):
    """(rows, valid) of sequence b's first L keys: key j sits at row rows[j] of the cache flattened to
    (pages * page_size or B * Tmax, Hkv, d); valid[j] is False where its page index lies outside [0, num_pages)."""
    j = np.arange(L)
    if block_table is None:
        return b * k_cache.shape[2] + j, np.ones(L, bool)
    ps, n_pages = k_cache.shape[2], k_cache.shape[0]
    pages = np.asarray(block_table[b], dtype=np.int64)[j // ps]
    valid = (pages >= 0) & (pages < n_pages)
    return np.where(valid, pages, 0) * ps + j % ps, valid


def key_positions(k_cache, seqlens_k, block_table=None, *, out_of_range="error"):
    """For each sequence b, (rows, valid): key j of b sits at row rows[j] of the cache flattened to
    (pages * page_size or B * Tmax, Hkv, d), and valid[j] says whether its page exists. Lengths outside
    [0, capacity] and page indices outside [0, num_pages) raise ValueError (out_of_range="error") or are
    clamped / skipped (out_of_range="clamp"), as the module docstring says."""
    cap = _capacity(k_cache, block_table)
    out = []
    for b in range(len(seqlens_k)):
        L = int(seqlens_k[b])
        if not 0 <= L <= cap:
            if out_of_range == "error":
                raise ValueError(f"seqlens_k[{b}] = {L} must lie in [0, {cap}]")
            L = min(max(L, 0), cap)
        rows, valid = _rows_of(k_cache, b, L, block_table)
        if not valid.all() and out_of_range == "error":
            bad = int(np.asarray(block_table[b])[np.arange(L)[~valid][0] // k_cache.shape[2]])
            raise ValueError(f"block_table[{b}] holds page {bad}, outside [0, {k_cache.shape[0]})")
        out.append((rows, valid))
    return out


def gather_kv(k_cache, v_cache, seqlens_k, block_table=None, *, out_of_range="error"):
    """The dense keys and values of each sequence: a list of (k_b, v_b), each (Hkv, L_b', d) in float64, where
    L_b' counts the keys that exist (keys on skipped pages are left out under out_of_range="clamp", so the
    positions of the later keys shift: use the result with Tq = 1 there, where positions do not matter)."""
    k_cache, v_cache = np.asarray(k_cache), np.asarray(v_cache)
    Hkv, d = k_cache.shape[1], k_cache.shape[3]
    flat_k = np.moveaxis(k_cache, 1, 2).reshape(-1, Hkv, d)  # (pages * page_size or B * Tmax, Hkv, d)
    flat_v = np.moveaxis(v_cache, 1, 2).reshape(-1, Hkv, d)
    out = []
    for rows, valid in key_positions(k_cache, seqlens_k, block_table, out_of_range=out_of_range):
        r = rows[valid]
        out.append((np.moveaxis(flat_k[r], 0, 1).astype(np.float64), np.moveaxis(flat_v[r], 0, 1).astype(np.float64)))
    return out


def decode_attention(q, k_cache, v_cache, seqlens_k, *, block_table=None, scale=None, out_of_range="error"):
    """(o, lse) of decoding attention (see the module docstring), in float64.

    Vectorised, one sequence at a time: the L_b keys of sequence b are looked up (through the block table if
    there is one), and key j counts for query i when j <= i + L_b - Tq and (paged) its page exists.
    """
    if out_of_range not in ("error", "clamp"):
        raise ValueError(f"out_of_range must be 'error' or 'clamp'; got {out_of_range!r}")
    q, k_cache, v_cache, seqlens, block_table = _check(q, k_cache, v_cache, seqlens_k, block_table)
    B, Hq, Tq, d = q.shape
    o = np.zeros((B, Hq, Tq, d))
    lse = np.full((B, Hq, Tq), -np.inf)
    positions = key_positions(k_cache, seqlens, block_table, out_of_range=out_of_range)
    for b, (rows, valid) in enumerate(positions):
        if len(rows):
            o[b], lse[b] = _masked_rows(q[b], k_cache, v_cache, rows, valid, scale)
    return o, lse


def decode_attention_rows(q, k_cache, v_cache, seqlens_k, *, block_table=None, scale=None):
    """The same (o, lse), one query row at a time, straight from the definition (slow; for tests).

    For row (b, h, i): the keys are those of positions j = 0 .. i + L_b - Tq of sequence b, looked up one by one
    (through the block table if there is one) in KV head h // (Hq / Hkv); o = sum_j p_j v_j with
    p_j = exp(s_j - max s) / sum exp(s - max s), s_j = scale * q . k_j; lse = log sum_j exp(s_j).
    """
    q, k_cache, v_cache, seqlens, block_table = _check(q, k_cache, v_cache, seqlens_k, block_table)
    B, Hq, Tq, d = q.shape
    G = Hq // k_cache.shape[1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    o = np.zeros((B, Hq, Tq, d))
    lse = np.full((B, Hq, Tq), -np.inf)
    for b in range(B):
        L = int(seqlens[b])
        if not 0 <= L <= _capacity(k_cache, block_table):
            raise ValueError(f"seqlens_k[{b}] = {L} is out of range")
        for h in range(Hq):
            hk = h // G
            for i in range(Tq):
                keys, vals = [], []
                for j in range(0, i + L - Tq + 1):
                    if block_table is None:
                        keys.append(k_cache[b, hk, j]), vals.append(v_cache[b, hk, j])
                    else:
                        page, row = int(block_table[b, j // k_cache.shape[2]]), j % k_cache.shape[2]
                        keys.append(k_cache[page, hk, row]), vals.append(v_cache[page, hk, row])
                if not keys:
                    continue
                s = np.array([scale * float(np.dot(q[b, h, i].astype(np.float64), kj.astype(np.float64)))
                              for kj in keys])
                m = s.max()
                w = np.exp(s - m)
                o[b, h, i] = (w[:, None] * np.array(vals, dtype=np.float64)).sum(axis=0) / w.sum()
                lse[b, h, i] = m + np.log(w.sum())
    return o, lse


def decode_split_bounds(L: int, num_splits: int, tile: int = 1):
    """The key ranges [start, end) of the num_splits splits of a sequence of L keys, as the split-KV kernel cuts
    them: chunk = ceil(ceil(L / num_splits) / tile) * tile keys per split (a whole number of the kernel's key
    tiles), split s = [s * chunk, min((s + 1) * chunk, L)). Trailing splits may be empty."""
    if num_splits < 1 or tile < 1:
        raise ValueError(f"num_splits and tile must be >= 1; got {num_splits}, {tile}")
    chunk = _ceil_div(_ceil_div(L, num_splits), tile) * tile if L > 0 else tile
    return [(min(s * chunk, L), min((s + 1) * chunk, L)) for s in range(num_splits)]


def decode_attention_split(q, k_cache, v_cache, seqlens_k, *, block_table=None, scale=None, num_splits=2,
                           tile=1, return_partials=False):
    """Decoding attention computed the split-KV way: each sequence's keys cut into num_splits ranges
    (decode_split_bounds), attention over each range alone (an o normalised over that range and its lse, with
    the causal mask still measured against the whole sequence), then merged by log-sum-exp (merge_partials).
    The identity says this equals decode_attention; an empty range contributes (0, -inf).

    With return_partials=True also returns (o_parts, lse_parts) of shapes (B, Hq, Tq, S, d) and (B, Hq, Tq, S).
    """
    q, k_cache, v_cache, seqlens, block_table = _check(q, k_cache, v_cache, seqlens_k, block_table)
    B, Hq, Tq, d = q.shape
    S = int(num_splits)
    o_parts = np.zeros((B, Hq, Tq, S, d))
    lse_parts = np.full((B, Hq, Tq, S), -np.inf)
    for b, (rows, valid) in enumerate(key_positions(k_cache, seqlens, block_table)):
        for s, (a, e) in enumerate(decode_split_bounds(len(rows), S, tile)):
            if e <= a:
                continue
            keep = np.zeros(len(rows), bool)  # the split's keys; the causal rule still counts from L_b
            keep[a:e] = True
            o_parts[b, :, :, s], lse_parts[b, :, :, s] = _masked_rows(q[b], k_cache, v_cache, rows, valid & keep,
                                                                      scale)
    o = np.zeros((B, Hq, Tq, d))
    lse = np.full((B, Hq, Tq), -np.inf)
    merged_o, merged_lse = merge_partials(list(np.moveaxis(o_parts, 3, 0)), list(np.moveaxis(lse_parts, 3, 0)))
    o[:], lse[:] = merged_o, merged_lse
    if return_partials:
        return o, lse, o_parts, lse_parts
    return o, lse


def _masked_rows(qb, k_cache, v_cache, rows, valid, scale):
    """(o, lse) of one sequence's query rows qb (Hq, Tq, d) over its L = len(rows) keys: key j counts for query i
    when valid[j] and j <= i + L - Tq (bottom-right causal against the sequence's length)."""
    Hq, Tq, d = qb.shape
    Hkv = k_cache.shape[1]
    G = Hq // Hkv
    L = len(rows)
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    flat_k = np.moveaxis(k_cache, 1, 2).reshape(-1, Hkv, d)
    flat_v = np.moveaxis(v_cache, 1, 2).reshape(-1, Hkv, d)
    kb = np.repeat(np.moveaxis(flat_k[rows], 0, 1).astype(np.float64), G, axis=0)  # (Hq, L, d): head h -> h // G
    vb = np.repeat(np.moveaxis(flat_v[rows], 0, 1).astype(np.float64), G, axis=0)
    s = np.einsum("hid,hjd->hij", qb.astype(np.float64), kb) * scale  # (Hq, Tq, L)
    i = np.arange(Tq)[:, None]
    j = np.arange(L)[None, :]
    seen = (j <= i + L - Tq) & valid[None, :]
    s = np.where(seen[None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    any_seen = np.isfinite(m)
    m0 = np.where(any_seen, m, 0.0)
    p = np.exp(s - m0)
    l1 = np.where(any_seen, p.sum(axis=-1, keepdims=True), 1.0)
    o = np.where(any_seen, (p / l1) @ vb, 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(any_seen, m0 + np.log(l1), -np.inf)[..., 0]
    return o, lse


def append_kv(k_cache, v_cache, k_new, v_new, seqlens_k, *, block_table=None):
    """Copies of the caches with k_new, v_new (B, Hkv, Tn, d) written at positions L_b .. L_b + Tn - 1 of each
    sequence (through the block table if there is one). The lengths are not changed: the caller adds Tn.
    A row whose position is at or past the capacity, or whose page index lies outside [0, num_pages), is dropped
    (that is what the append kernel does; the kernel also treats a negative length as 0)."""
    k_cache, v_cache = np.array(k_cache), np.array(v_cache)
    B, Hkv, Tn, d = np.shape(k_new)
    cap = _capacity(k_cache, block_table)
    for b in range(B):
        L = max(int(seqlens_k[b]), 0)
        for i in range(Tn):
            pos = L + i
            if pos >= cap:
                continue
            if block_table is None:
                k_cache[b, :, pos], v_cache[b, :, pos] = k_new[b, :, i], v_new[b, :, i]
            else:
                ps = k_cache.shape[2]
                page = int(block_table[b, pos // ps])
                if 0 <= page < k_cache.shape[0]:
                    k_cache[page, :, pos % ps], v_cache[page, :, pos % ps] = k_new[b, :, i], v_new[b, :, i]
    return k_cache, v_cache
