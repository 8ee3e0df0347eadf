"""The Triton programs of FlashAttention-2 (forward and backward); launched by kernels/pytorch/flash2_triton.py.

This module imports Triton at the top, so only kernels/pytorch/flash2_triton.py imports it, lazily, the first time a
kernel is launched: `import kernels` stays free of torch and Triton on a machine that has neither.

Layouts: q, o, dq, do are (B, H, Tq, D) and k, v, dk, dv are (B, H, Tk, D), C-contiguous, float16 or bfloat16;
lse and delta are (B, H, Tq) float32. D (the head size) is a power of two in {16, 32, 64, 128}, so one row of
a tile is the whole head and no mask is needed along D.

One program (a thread block of num_warps warps) owns a block of BLOCK_M query rows (forward, dq) or of BLOCK_N
keys (dk, dv) of one (batch, head). The grid is one-dimensional, pid = bh * blocks_per_head + block, so that the
programs running at the same time belong to few heads and share those heads' K and V in L2.

Scores live in the log2 domain: s2 = (q . k) * scale * log2(e), so that the softmax uses exp2 (one MUFU.EX2
instruction) and the running max m is in the same units. The natural-log LSE is (m + log2 l) * ln 2.

Causal masking is bottom-right aligned: query i sees key j when j <= i + (Tk - Tq) (`diag` = Tk - Tq below).
Each loop over blocks is split in two calls of one inner function:
    off-band   blocks that every row of the program sees whole: no score mask, no bound check on loads
    on-band    blocks that cross the diagonal or the end of the keys: score mask and masked loads
(In the dK/dV kernel the loop runs over query blocks: the q, dO and lse loads are always masked by the query bound,
the on-band stage adds the causal mask only, and rows of a key block past Tk are computed but never stored.)
A row that sees no key keeps m = -inf and l = 0: its output is 0 and its LSE -inf (never NaN), and in the
backward its LSE is read as +inf, so that every p = exp2(s - lse) of that row is 0 and so are its gradients.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): log(x) = log2(x) * LN2


@triton.jit
def _load_kv(k_base, v_base, cols, Tk, D: tl.constexpr, MASKED: tl.constexpr):
    """The K and V rows `cols` ([BLOCK_N, D] tiles); MASKED zero-fills the rows at and past Tk."""
    kv = cols[:, None] * D + tl.arange(0, D)[None, :]
    if MASKED:
        k = tl.load(k_base + kv, mask=(cols < Tk)[:, None], other=0.0)
        v = tl.load(v_base + kv, mask=(cols < Tk)[:, None], other=0.0)
    else:  # every row exists: no mask, so no predicate on the copies
        k = tl.load(k_base + kv)
        v = tl.load(v_base + kv)
    return k, v


@triton.jit
def _visible(rows, cols, Tk, diag, CAUSAL: tl.constexpr):
    """[BLOCK_M, BLOCK_N] booleans: key j exists (j < Tk) and, causal, query i sees it (j <= i + diag)."""
    keep = cols[None, :] < Tk
    if CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None] + diag)
    return keep


@triton.jit
def _fwd_blocks(acc, l_i, m_i, q, k_base, v_base, rows, lo, hi, Tk, diag, qk_scale,
                D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Key blocks [lo, hi) of one program: the online softmax of FlashAttention-2 (no division in the loop)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        start = tl.multiple_of(start, BLOCK_N)
        cols = start + offs_n
        # ---- load one K/V block (Triton pipelines these loads num_stages deep) ----
        k, v = _load_kv(k_base, v_base, cols, Tk, D, MASKED)
        # ---- S = Q K^T on tensor cores, float32 accumulation ----
        s = tl.dot(q, tl.trans(k))
        # ---- score mask (on-band only): keys past Tk, keys right of the diagonal ----
        if MASKED:
            s = tl.where(_visible(rows, cols, Tk, diag, CAUSAL), s, float("-inf"))
        # ---- online softmax in the log2 domain: new max, rescale factor, probabilities ----
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # scale > 0, so max(s) * scale = max(s * scale)
        if MASKED:  # a row that has seen no key yet keeps m = -inf; subtract 0 instead (no -inf - -inf)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_ref = m_new
        p = tl.math.exp2(s * qk_scale - m_ref[:, None])
        alpha = tl.math.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        # ---- O += P V: P is rounded to the input type, the product accumulates in float32 ----
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["Tq", "Tk", "num_m"])  # one compile for every length, not one per T % 16
def flash2_fwd_kernel(Q, K, V, O, LSE, Tq, Tk, num_m, qk_scale,
                      D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """O and LSE of BLOCK_M query rows of one (batch, head). Grid: (B * H * num_m,), num_m = cdiv(Tq, BLOCK_M)."""
    # ---- which rows: one program per (batch*head, query block); causal runs the longest blocks first ----
    pid = tl.program_id(0)
    bh = pid // num_m
    m_block = pid % num_m
    if CAUSAL:
        m_block = num_m - 1 - m_block
    q_base = Q + bh.to(tl.int64) * Tq * D
    k_base = K + bh.to(tl.int64) * Tk * D
    v_base = V + bh.to(tl.int64) * Tk * D
    m0 = m_block * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    row_ok = rows < Tq
    # ---- the Q block stays in registers/shared memory for the whole loop ----
    q = tl.load(q_base + rows[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    # ---- split the keys: [0, band) seen whole by every row, [band, hi) needs the mask ----
    diag = Tk - Tq
    if CAUSAL:
        band = tl.maximum(m0 + diag + 1, 0) // BLOCK_N * BLOCK_N  # row m0 sees keys j <= m0 + diag
        hi = tl.minimum(m0 + BLOCK_M + diag, Tk)  # the last row sees keys j < m0 + BLOCK_M + diag
    else:
        band = Tk // BLOCK_N * BLOCK_N
        hi = Tk
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_base, v_base, rows, 0, band, Tk, diag, qk_scale,
                                D, BLOCK_N, False, CAUSAL)
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, k_base, v_base, rows, band, hi, Tk, diag, qk_scale,
                                D, BLOCK_N, True, CAUSAL)
    # ---- epilogue: one division per row; a row that saw no key gives 0 and LSE = -inf ----
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) * LN2, float("-inf"))
    tl.store(O + bh.to(tl.int64) * Tq * D + rows[:, None] * D + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(LSE + bh.to(tl.int64) * Tq + rows, lse, mask=row_ok)


@triton.jit(do_not_specialize=["n_rows"])
def flash2_bwd_preprocess(O, DO, DELTA, n_rows, D: tl.constexpr, BLOCK: tl.constexpr):
    """delta_i = sum_c dO_ic * O_ic, one float32 per query row (rows of all heads in one flat range)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < n_rows
    idx = rows.to(tl.int64)[:, None] * D + tl.arange(0, D)[None, :]
    o = tl.load(O + idx, mask=ok[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + idx, mask=ok[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + rows, tl.sum(o * do, 1), mask=ok)


@triton.jit
def _load_row_stats(LSE, DELTA, rows, row_ok):
    """The LSE of each row in log2 units (+inf for a row that saw no key, so that its p is 0), and its delta."""
    lse = tl.load(LSE + rows, mask=row_ok, other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)
    return lse2, delta


@triton.jit
def _dkdv_blocks(dk, dv, k, v, q_base, do_base, LSE, DELTA, cols, lo, hi, Tq, diag, qk_scale,
                 D: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr):
    """Query blocks [lo, hi) for one K/V block, computed transposed (keys along the rows):
    P^T = exp2(K Q^T * scale2 - lse2), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    for start in range(lo, hi, BLOCK_M):
        start = tl.multiple_of(start, BLOCK_M)
        rows = start + offs_m
        row_ok = rows < Tq
        idx = rows[:, None] * D + offs_d[None, :]
        q = tl.load(q_base + idx, mask=row_ok[:, None], other=0.0)
        do = tl.load(do_base + idx, mask=row_ok[:, None], other=0.0)
        lse2, delta = _load_row_stats(LSE, DELTA, rows, row_ok)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse2[None, :])
        if MASKED:  # the causal diagonal crosses this block
            p_t = tl.where(cols[:, None] <= rows[None, :] + diag, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit(do_not_specialize=["Tq", "Tk", "num_n"])
def flash2_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, Tq, Tk, num_n, qk_scale, scale,
                           D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """dK and dV of BLOCK_N keys of one (batch, head), over every query block that sees them.
    Grid: (B * H * num_n,), num_n = cdiv(Tk, BLOCK_N). No atomics: each program writes its own rows."""
    pid = tl.program_id(0)
    bh = pid // num_n
    n0 = (pid % num_n) * BLOCK_N
    q_off = bh.to(tl.int64) * Tq * D
    kv_off = bh.to(tl.int64) * Tk * D
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    col_ok = cols < Tk
    kv = cols[:, None] * D + offs_d[None, :]
    k = tl.load(K + kv_off + kv, mask=col_ok[:, None], other=0.0)
    v = tl.load(V + kv_off + kv, mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    LSE_bh = LSE + bh.to(tl.int64) * Tq
    DELTA_bh = DELTA + bh.to(tl.int64) * Tq
    end = tl.cdiv(Tq, BLOCK_M) * BLOCK_M
    diag = Tk - Tq
    if CAUSAL:
        # rows i >= n0 - diag see some key of the block; rows i >= n0 + BLOCK_N - 1 - diag see all of them
        lo = tl.maximum(n0 - diag, 0) // BLOCK_M * BLOCK_M
        band = tl.minimum(tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - diag, 0), BLOCK_M) * BLOCK_M, end)
        dk, dv = _dkdv_blocks(dk, dv, k, v, Q + q_off, DO + q_off, LSE_bh, DELTA_bh, cols, lo, band, Tq, diag,
                              qk_scale, D, BLOCK_M, True)
    else:
        band = 0
    dk, dv = _dkdv_blocks(dk, dv, k, v, Q + q_off, DO + q_off, LSE_bh, DELTA_bh, cols, band, end, Tq, diag,
                          qk_scale, D, BLOCK_M, False)
    tl.store(DK + kv_off + kv, (dk * scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + kv_off + kv, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _dq_blocks(dq, q, do, lse2, delta, k_base, v_base, rows, lo, hi, Tk, diag, qk_scale,
               D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Key blocks [lo, hi) for one query block: P = exp2(Q K^T * scale2 - lse2), dP = dO V^T,
    dS = P (dP - delta), dQ += dS K."""
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        start = tl.multiple_of(start, BLOCK_N)
        cols = start + offs_n
        k, v = _load_kv(k_base, v_base, cols, Tk, D, MASKED)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])
        if MASKED:
            p = tl.where(_visible(rows, cols, Tk, diag, CAUSAL), p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit(do_not_specialize=["Tq", "Tk", "num_m"])
def flash2_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, Tq, Tk, num_m, qk_scale, scale,
                         D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """dQ of BLOCK_M query rows of one (batch, head), over the key blocks they see (the forward's loop bounds).
    Grid: (B * H * num_m,), num_m = cdiv(Tq, BLOCK_M)."""
    pid = tl.program_id(0)
    bh = pid // num_m
    m_block = pid % num_m
    if CAUSAL:
        m_block = num_m - 1 - m_block
    q_off = bh.to(tl.int64) * Tq * D
    kv_off = bh.to(tl.int64) * Tk * D
    m0 = m_block * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    row_ok = rows < Tq
    idx = rows[:, None] * D + offs_d[None, :]
    q = tl.load(Q + q_off + idx, mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + q_off + idx, mask=row_ok[:, None], other=0.0)
    lse2, delta = _load_row_stats(LSE + bh.to(tl.int64) * Tq, DELTA + bh.to(tl.int64) * Tq, rows, row_ok)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    diag = Tk - Tq
    if CAUSAL:
        band = tl.maximum(m0 + diag + 1, 0) // BLOCK_N * BLOCK_N
        hi = tl.minimum(m0 + BLOCK_M + diag, Tk)
    else:
        band = Tk // BLOCK_N * BLOCK_N
        hi = Tk
    dq = _dq_blocks(dq, q, do, lse2, delta, K + kv_off, V + kv_off, rows, 0, band, Tk, diag, qk_scale,
                    D, BLOCK_N, False, CAUSAL)
    dq = _dq_blocks(dq, q, do, lse2, delta, K + kv_off, V + kv_off, rows, band, hi, Tk, diag, qk_scale,
                    D, BLOCK_N, True, CAUSAL)
    tl.store(DQ + q_off + idx, (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])
