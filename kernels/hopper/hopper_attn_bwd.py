"""Launcher for kernels/hopper/hopper_attn_bwd.cu: a FlashAttention-3-style backward on Hopper (TMA + wgmma, fp16/bf16).

    o, lse = hopper_attn.forward(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = backward(q, k, v, o, lse, do, causal=True)                 # same layouts and dtype as q, k, v
    dq, dk, dv = backward(q, k, v, o, lse, do, causal=True, deterministic=True)   # dq the same bit for bit each run

Three launches on CuPy's current stream: preprocess (delta = rowsum(dO * O), lse in log2 units, the float32 dQ
accumulator and the turn counters zeroed), the main kernel (one CTA per 128-key tile of one (batch, head), K and V
resident, the query tiles streamed in by TMA; dK, dV in registers, each tile's dQ part added into a float32
accumulator by one TMA bulk reduce-add) and a postprocess kernel (dq = scale * accumulator in 16 bits). The .cu
header has the algorithm; kernels/hopper/README.md ("The backward") the design and what is not done yet.

Same contract as flash2_mma_bwd.backward, for d = 64 or 128 only, and any finite scale (negative too, as the
forward). deterministic=True uses the build compiled with -D DETERMINISTIC=1: the key tiles add their parts of dQ in
a fixed order, one after the other per query tile, so dq is bitwise repeatable (dk and dv always are).
k and v may have fewer heads than q (grouped-query attention, Hq a multiple of Hkv): the main kernel reads kv head
h / group for query head h and writes each query head's dK, dV part; dk and dv (k's shape) are their sums over each
kv head's group (hopper_bwd_reduce_heads, in float32).
On a Hopper, the PyTorch attention operator's backward runs this kernel at d = 64 and 128
(kernels/pytorch/torch_ops.py).
"""

from __future__ import annotations

import numpy as np

from . import hopper_attn, hopper_gemm
from .hopper_attn import ARCH, LOG2E, MIN_CC  # sm_90a, (9, 0): the forward's
from ..core import (INT32_MAX, NULL, ceil_div, check_array, check_grid, cp, current_device, defines_from,
                    dtype_set, get_kernel, validate_attention)
from ..flash.flash2_mma import (check_variant_arrays, doc_classes,  # the forward's variant checks and doc classes
                                validate_variant_problem, variant_spec)

KERNEL_FILE = "hopper_attn_bwd.cu"
HEAD_DIMS = (64, 128)  # the forward also runs d = 256; this backward does not
MAX_D = max(HEAD_DIMS)
WHAT = "hopper_fa3 attention backward (wgmma + TMA)"
BLOCK_M = {64: 128, 128: 64}  # query rows per tile (-D BLOCK_M_D64, BLOCK_M_D128): 128 + d <= 192 registers
BLOCK_N = 128  # keys per CTA: two consumer warpgroups of 64 (fixed in the .cu)
STAGES = 2  # Q/dO ring slots
PRE_WARPS = 4  # rows per preprocess block
THREADS = 384  # a producer warpgroup and two consumer warpgroups
LAUNCH_REGS = 65536 // THREADS // 8 * 8  # 168: what setmaxnreg's budget (24 + 2 x 240) assumes
ELEM_BYTES = 2
SMEM_ALIGN = 1024
SMEM_LIMIT = 227 * 1024
ALIGN = 16  # bytes: TMA base addresses, the float4 reads of the accumulator
CARVEOUT_MAX_SHARED = 100
POST_BLOCK = 256
POST_MAX_BLOCKS = 8192  # grid-stride loop beyond this
DQ_BULK = 1  # dQ into its accumulator: 1 one bulk reduce-add per tile (-D DQ_BULK), 0 float4 atomics per thread
# The schedule's switches (-D of the same names, 0 or 1 each, any mix; the gradients are the same bits): EARLY_P starts
# P^T's exponentials once S^T alone has completed, EARLY_KV issues dV and dK before the dS barrier, DQ_FIRST waits for
# dQ_part first and adds it while dK, dV still run. Read per call, like DQ_BULK. EARLY_P with DQ_FIRST measured the
# fastest of the eight mixes on an H100 (kernels/hopper/README.md, "The schedule"), so it is the default.
EARLY_P = 1
EARLY_KV = 0
DQ_FIRST = 1
SCHEDULE_SWITCHES = ("EARLY_P", "EARLY_KV", "DQ_FIRST")

DEFINES = defines_from(BLOCK_M_D64=BLOCK_M[64], BLOCK_M_D128=BLOCK_M[128], STAGES=STAGES, PRE_WARPS=PRE_WARPS)
ORDER_DEFINES = {False: defines_from(DETERMINISTIC=0), True: defines_from(DETERMINISTIC=1)}
# What tests/test_compile.py builds (for sm_80 .. sm_90, where the main kernels are stubs): the .cu defaults. The
# deterministic, atomics and schedule builds are compiled for sm_90a by tests/test_hopper_attn_bwd_compile.py.
NVRTC_BUILDS = [((), DEFINES + ORDER_DEFINES[False] + defines_from(DQ_BULK=DQ_BULK, EARLY_P=EARLY_P, EARLY_KV=EARLY_KV,
                                                                    DQ_FIRST=DQ_FIRST))]

DTYPES = ("float16", "bfloat16")
DTYPE_SET = dtype_set(DTYPES)
F32 = dtype_set(("float32",))
_TAG = {"float16": "f16", "bfloat16": "bf16"}
MAIN_NAMES = {(dt, d): f"hopper_bwd_{_TAG[dt]}_d{d}" for dt in DTYPES for d in HEAD_DIMS}
PRE_NAMES = {dt: f"hopper_bwd_preprocess_{_TAG[dt]}" for dt in DTYPES}
POST_NAMES = {dt: f"hopper_bwd_postprocess_{_TAG[dt]}" for dt in DTYPES}
REDUCE_NAMES = {dt: f"hopper_bwd_reduce_heads_{_TAG[dt]}" for dt in DTYPES}


def smem_bytes(d: int, dq_bulk: int | None = None, docs: bool = False) -> int:
    """Dynamic shared memory of the main kernel (Shape<D>::SMEM_BYTES): K and V, STAGES x (Q, dO), two dS^T buffers,
    two buffers of lse2 and delta rows (and, in the DOCS build, two of query document ids and the key tile's ids),
    the float32 dQ staging tile (dq_bulk), alignment slack."""
    bm = BLOCK_M[d]
    dq_bulk = DQ_BULK if dq_bulk is None else dq_bulk
    return (2 * BLOCK_N * d * ELEM_BYTES + STAGES * 2 * bm * d * ELEM_BYTES + 2 * 2 * 4 * bm
            + (2 * 4 * bm + 4 * BLOCK_N if docs else 0) + 2 * BLOCK_N * bm * ELEM_BYTES + (bm * d * 4 if dq_bulk else 0) + SMEM_ALIGN)


def padded_rows(Tq: int, d: int) -> int:
    """Tq_pad: the query rows per head of the lse2 and delta workspace, a whole number of tiles (the kernel copies
    one tile's rows at a time, with no zero fill)."""
    return ceil_div(Tq, BLOCK_M[d]) * BLOCK_M[d]


def workspace_elements(B: int, H: int, Tq: int, d: int) -> int:
    """float32 elements of the workspace: dq_acc (B H Tq_pad d: whole tiles, in the kernel's fragment order), lse2 and
    delta (B H Tq_pad each), the turn counters (B H m_count int32)."""
    BH = B * H
    return BH * padded_rows(Tq, d) * (d + 2) + BH * ceil_div(Tq, BLOCK_M[d])


_CHECKED: set = set()


def schedule(softcap: bool = False) -> dict:
    """The schedule switches as this call's build takes them: {"EARLY_P": 0 or 1, "EARLY_KV": ..., "DQ_FIRST": ...};
    the soft-capping build always has EARLY_P = 0 (its dS^T needs 1 - tanh^2, which is not kept across the wait)."""
    switches = {name: int(bool(globals()[name])) for name in SCHEDULE_SWITCHES}
    return {**switches, "EARLY_P": 0} if softcap else switches


def build_defines(deterministic: bool, alibi: bool = False, docs: bool = False, softcap: bool = False,
                  prefix: bool = False) -> tuple:
    """The -D list of this call's build: the tile sizes, DETERMINISTIC, DQ_BULK, the schedule switches and, for the
    ALiBi, document, soft-capping and prefix-LM builds only, ALIBI=1, DOCS=1, SOFTCAP=1 and PREFIX=1 (the other builds
    keep the defines, and so the machine code, they had before them)."""
    extra = ((defines_from(ALIBI=1) if alibi else ()) + (defines_from(DOCS=1) if docs else ())
             + (defines_from(SOFTCAP=1) if softcap else ()) + (defines_from(PREFIX=1) if prefix else ()))
    return DEFINES + ORDER_DEFINES[bool(deterministic)] + defines_from(DQ_BULK=DQ_BULK, **schedule(softcap)) + extra


def kernels(dtype: str, d: int, deterministic: bool, dev: int, alibi: bool = False, docs: bool = False,
            softcap: bool = False, prefix: bool = False):
    """(preprocess, main, postprocess) of one build, compiled for sm_90a on first use; the main kernel's register
    count checked once per device (its consumers' setmaxnreg.inc would wait forever with fewer than LAUNCH_REGS).
    DQ_BULK and the schedule switches are read per call."""
    switches = schedule(softcap)
    defines = build_defines(deterministic, alibi, docs, softcap, prefix)
    main = get_kernel(KERNEL_FILE, MAIN_NAMES[(dtype, d)], defines=defines, shared_mem=smem_bytes(d, docs=docs),
                      carveout=CARVEOUT_MAX_SHARED, arch=ARCH)
    key = (dtype, d, bool(deterministic), bool(alibi), bool(docs), bool(softcap), bool(prefix), DQ_BULK,
           *switches.values(), dev)
    if key not in _CHECKED:
        if main.num_regs != LAUNCH_REGS:
            raise RuntimeError(f"{KERNEL_FILE}:{MAIN_NAMES[(dtype, d)]} was built with {main.num_regs} registers per "
                               f"thread; its setmaxnreg budget needs exactly {LAUNCH_REGS} (launching it could hang)")
        _CHECKED.add(key)
    pre = get_kernel(KERNEL_FILE, PRE_NAMES[dtype], defines=defines, arch=ARCH)
    post = get_kernel(KERNEL_FILE, POST_NAMES[dtype], defines=defines, arch=ARCH)
    return pre, main, post


def _check_like(x, name: str, shape: tuple, dtypes, dev: int) -> None:
    check_array(x, name, dtypes=dtypes, ndim=len(shape), dev=dev)
    if x.shape != shape:
        raise ValueError(f"{name} has shape {x.shape}; it must be {shape}")
    if x.data.ptr % ALIGN:
        raise ValueError(f"{name} starts at {x.data.ptr:#x}, not {ALIGN}-byte aligned ({WHAT} reads it by TMA or "
                         f"in 16-byte vectors)")


def backward(q, k, v, o, lse, do, *, causal=False, scale=None, deterministic=False, dlse=None, window=None,
             alibi_slopes=None, doc_ids_q=None, doc_ids_k=None, softcap=None, prefix=None):
    """(dq, dk, dv) of o = attention(q, k, v) for the upstream gradient do, on Hopper's TMA and wgmma.

    q, o, do (B, H, Tq, d) and k, v (B, H, Tk, d), or (B, Hkv, Tk, d) with H a multiple of Hkv: C-contiguous float16
    or bfloat16 CuPy arrays of one dtype, 16-byte aligned, d = 64 or 128; lse (B, H, Tq) float32, natural log, as
    hopper_attn.forward(..., return_lse=True) gives it (-inf for a row that sees no key). causal, scale: as in the
    forward (scale defaults to 1/sqrt(d); any finite value, > 0 with grouped heads as in the forward).
    deterministic: dq bitwise repeatable (a build of its own; the key tiles take turns at each query tile's dQ).
    dlse: optional float32 (B, H, Tq) gradient of the lse output (it shifts delta by -dlse). window: (left, right),
    each an int >= 0 or None, the sliding window of hopper_attn.forward (reference.variants' band; not with
    deterministic=True when left is bounded: a query tile's key tiles then do not start at 0). alibi_slopes: (H,)
    float32, as the forward takes them (a build of its own, -D ALIBI=1). doc_ids_q (B, Tq), doc_ids_k (B, Tk) int32
    (doc_ids_k defaults to doc_ids_q when Tq == Tk): document masking as the forward's (a build of its own, -D DOCS=1;
    flash2_mma's class kernel classifies the (query tile, key tile) pairs first, and a key tile skips the EMPTY ones;
    not with deterministic=True, whose turns need every key tile at every query tile). softcap: a float > 0, the
    forward's tanh soft-capping of the scaled scores (a build of its own, -D SOFTCAP=1, with EARLY_P = 0; dS is
    multiplied by the cap's derivative 1 - tanh^2). prefix: an int >= 0, prefix-LM as in the forward, the first
    prefix keys seen by every query besides the band (a build of its own, -D PREFIX=1, for prefix > 0). Raises
    TypeError / ValueError naming the argument and the limit, UnsupportedDeviceError on a GPU that is not a Hopper
    (compute capability 9.x).
    """
    B, H, Hkv, Tq, Tk, d, scale = _validate_problem(q, k, v, scale)
    docs = doc_ids_q is not None or doc_ids_k is not None
    # the band (Tq + Tk where a side is unbounded) and softcap's cap_in, cap_out, checked as the forward checks them
    band = variant_spec(q.shape, k.shape, scale, causal=causal, window=window, prefix=prefix, docs=docs,
                        softcap=softcap)
    if deterministic and band.left < Tq + Tk:
        raise ValueError(f"window={window!r}: deterministic=True needs the window's left side unbounded (None), as "
                         f"its key tiles take turns from tile 0 at every query tile")
    if deterministic and docs:
        raise ValueError("doc_ids_q: deterministic=True does not take document masking, as its key tiles take turns "
                         "at every query tile and a key tile skips the query tiles of other documents")
    dev = current_device()
    same = dtype_set((q.dtype.name,))
    _check_like(o, "o", q.shape, same, dev)
    _check_like(do, "do", q.shape, same, dev)
    _check_like(lse, "lse", (B, H, Tq), F32, dev)
    if dlse is not None:
        _check_like(dlse, "dlse", (B, H, Tq), F32, dev)
    limit = (INT32_MAX - 2 * max(BLOCK_M[d], BLOCK_N)) // 3  # the band's bounds (i + lo, i + hi) in 32 bits
    if max(Tq, Tk) > limit:
        raise ValueError(f"Tq={Tq} and Tk={Tk} must be <= {limit} for {WHAT} (32-bit row indices)")
    BH, group = B * H, H // Hkv
    n_count = ceil_div(Tk, BLOCK_N)
    check_grid(n_count * BH, WHAT)
    hopper_gemm.check_hopper()  # compute capability 9.x exactly: an sm_90a CUBIN runs nowhere else
    dtype = q.dtype.name
    alibi = alibi_slopes is not None
    doc_ids_q, doc_ids_k = check_variant_arrays(doc_ids_q, doc_ids_k, alibi_slopes, B, H, Tq, Tk, dev)
    if alibi:  # (H,) float32 on this device, as the forward takes them; then slope log2 e per (batch, head)
        alibi_log2 = cp.tile(alibi_slopes * np.float32(LOG2E), B)
    capped, prefixed = softcap is not None, band.prefix > 0
    pre, main, post = kernels(dtype, d, deterministic, dev, alibi, docs, capped, prefixed)

    Tq_pad = padded_rows(Tq, d)
    m_count = Tq_pad // BLOCK_M[d]
    workspace = cp.empty(workspace_elements(B, H, Tq, d), dtype=cp.float32)
    acc_end = BH * Tq_pad * d  # dq_acc first: the allocation's aligned start, for the bulk reduce and float4 adds
    dq_acc = workspace[:acc_end]
    lse2 = workspace[acc_end:acc_end + BH * Tq_pad]
    delta = workspace[acc_end + BH * Tq_pad:acc_end + 2 * BH * Tq_pad]
    turns = workspace[acc_end + 2 * BH * Tq_pad:].view(cp.int32)
    dq, dk, dv = cp.empty_like(q), cp.empty_like(k), cp.empty_like(v)
    parts = (B, H, Tk, d)  # with grouped heads each query head's dK and dV part, summed by reduce_heads
    dk_out, dv_out = (dk, dv) if group == 1 else (cp.empty(parts, dtype=k.dtype), cp.empty(parts, dtype=v.dtype))

    rows = BH * Tq_pad
    pre((check_grid(ceil_div(rows, PRE_WARPS), WHAT),), (32 * PRE_WARPS,),
        (o, do, lse, NULL if dlse is None else dlse, lse2, delta, dq_acc, turns, np.int32(d), np.int32(Tq),
         np.int32(Tq_pad), np.int64(rows), np.int32(BH * m_count)))
    map_q = hopper_gemm.tensor_map(q, BH, Tq, d, BLOCK_M[d])  # boxes of 64 columns x rows, 128-byte swizzle
    map_do = hopper_gemm.tensor_map(do, BH, Tq, d, BLOCK_M[d])
    map_k = hopper_gemm.tensor_map(k, B * Hkv, Tk, d, BLOCK_N)  # query head h reads kv head h / group
    map_v = hopper_gemm.tensor_map(v, B * Hkv, Tk, d, BLOCK_N)
    # (B, m_count, n_count) int8 classes at this kernel's tiles: EMPTY pairs skipped, PARTIAL ones tested per entry
    classes = doc_classes(doc_ids_q, doc_ids_k, B, Tq, Tk, BLOCK_M[d], BLOCK_N) if docs else None
    main((n_count * BH,), (THREADS,),
         (map_q, map_k, map_v, map_do, lse2, delta, dq_acc, turns, dk_out, dv_out, np.int32(Tq), np.int32(Tk),
          np.float32(scale * LOG2E), np.float32(scale), np.int32(band.left), np.int32(band.right), np.int32(group),
          alibi_log2 if alibi else NULL, NULL if classes is None else doc_ids_q,
          NULL if classes is None else doc_ids_k, NULL if classes is None else classes, np.int32(H),
          np.float32(band.cap_in), np.float32(band.cap_out), np.int32(band.prefix)),
         shared_mem=smem_bytes(d, docs=docs))
    quads = BH * Tq * d // 4
    post((min(ceil_div(quads, POST_BLOCK), POST_MAX_BLOCKS),), (POST_BLOCK,),
         (dq_acc, dq, np.int64(quads), np.int32(d), np.int32(Tq), np.float32(scale)))
    if group > 1:
        reduce = get_kernel(KERNEL_FILE, REDUCE_NAMES[dtype],
                            defines=build_defines(deterministic, alibi, docs, capped, prefixed), arch=ARCH)
        pairs = k.size // 2
        for part, out in ((dk_out, dk), (dv_out, dv)):
            reduce((min(ceil_div(pairs, POST_BLOCK), POST_MAX_BLOCKS),), (POST_BLOCK,),
                   (part, out, np.int64(pairs), np.int64(Tk * d // 2), np.int32(group)))
    return dq, dk, dv


def _validate_problem(q, k, v, scale):
    """(B, H, Hkv, Tq, Tk, d, scale) of q, k, v: validate_attention's checks, or with k, v of fewer heads the
    forward's grouped-query checks (scale > 0 there) and H a multiple of Hkv; d one of HEAD_DIMS."""
    if hopper_attn._fewer_kv_heads(q, k):
        B, H, Tq, Tk, d, scale = validate_variant_problem(q, k, v, current_device(), scale, WHAT, MAX_D)
        Hkv = k.shape[1]
        if H % Hkv:
            raise ValueError(f"q has {H} heads and k, v have {Hkv}: {WHAT} needs Hq to be a multiple of Hkv")
    else:
        B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=MAX_D, min_cc=MIN_CC,
                                                    what=WHAT, scale=scale, align=ALIGN)
        Hkv = H
    if d not in HEAD_DIMS:
        raise ValueError(f"head dimension d={d} is not supported by {WHAT}: d must be one of {HEAD_DIMS}")
    return B, H, Hkv, Tq, Tk, d, scale


assert hopper_gemm.BLOCK_K * ELEM_BYTES == 128  # tensor_map's box is one 128-byte swizzle row wide
assert all(smem_bytes(d, docs=True) + 8 * (1 + 2 * STAGES) <= SMEM_LIMIT for d in HEAD_DIMS)
