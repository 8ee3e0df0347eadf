"""Time the attention variants real models use beside FlexAttention and SDPA: `python3 -m kernels.bench.variants`.

The grid (forward kernel time; B=4, H=32, d=128, Tq = Tk = T in {4096, 16384} unless a case says otherwise):

    causal       the bottom-right causal mask                         SDPA too
    window1024   a sliding window of 1024 keys before each query, causal (window=(1024, 0)): Mistral, Gemma 2/3
    docs8        document masking, 8 documents of equal length (ids (i * 8) // T), not causal: packed batches
    softcap30    tanh soft-capping of the scaled scores at 30, causal: Gemma 2
    alibi        ALiBi, slopes 2^(-8 (h + 1) / H), causal: BLOOM, MPT
    gqa8         grouped-query attention, Hkv = 8 kv heads for the 32 query heads, causal: Llama, Mistral, Qwen
                                                                      SDPA with enable_gqa=True
    d256         head dimension 256, causal: Gemma                     SDPA too

Implementations (one compare() per T: every (case, implementation) of that T timed side by side in ROUNDS rounds):

    flash2_mma   kernels.flash.flash2_mma.forward with the case's options (every GPU of compute capability >= 8.0)
    hopper_attn  kernels.hopper.hopper_attn.forward (a Hopper only; elsewhere a row saying why)
    flex         torch.nn.attention.flex_attention.flex_attention under torch.compile(dynamic=False): the mask as a
                 mask_mod made into a block mask by create_block_mask (128 x 128 blocks), softcap and ALiBi as a
                 score_mod, GQA through enable_gqa=True (a row saying why where this torch lacks it); compiled and
                 run once per case and T before the timing
    sdpa_cudnn, sdpa_flash   torch SDPA forced to that backend (torch.nn.attention.sdpa_kernel), where SDPA has the
                 variant (causal, gqa8 with enable_gqa=True, d256); a backend that refuses is recorded with its reason

--pass fwd+bwd times the forward and the backward together (one call: o and lse, then dq, dk, dv for a random dO):
ours are the forward above, then flash2_mma_bwd (its variant kernel for a mask or modifier), or on a Hopper at d = 64
and 128 hopper_attn_bwd (our_backward); FlexAttention and SDPA through torch.autograd.grad. Its FLOPs are 3.5 times
the forward's (the backward's five products against the forward's two), and our rows are checked on their gradients
(the worst of dq, dk, dv against torch.autograd on torch_attention in float32).

Before anything is timed, each of our implementations is checked against a float32 torch computation of the same
variant (`torch_attention`: the scores, score_mod, mask_mod and softmax written out) at one small shape (CHECK: B=2,
H=8, T=1500, the case's d and group size); a row that fails is recorded with the check and not timed, and a launcher
that refuses a case is recorded as "not supported: <its ValueError>".

Columns:
    ms              kernel time (kernels.benchmark), the median round of the T's compare()
    TFLOP/s         4 B Hq d x (visible pairs) per second: the FLOPs of the visible area only. The visible pairs are
                    counted exactly (`visible_pairs`: each query row's keys form one interval, cut by its document's;
                    tests/test_bench_variants_cpu.py checks the count against reference.variants.variant_mask)
    vs flex         FlexAttention's kernel time / this row's within a round, the median over the rounds (above 1:
                    faster; kernels.paired_ratio), and `vs cuDNN` the same against SDPA cuDNN where it ran
    vs causal       softcap30, alibi: this row's time / the same implementation's causal time (target: <= 1.3)
    vs causal x area  window1024: this row's time / (the same implementation's causal time x the window's visible
                    pairs / the causal mask's) (target: <= 1.3)

Results go to results/bench-variants.json, numbers as numbers, with the command that made them.

    python3 -m kernels.bench.variants                                  # T = 4096 and 16384, float16
    python3 -m kernels.bench.variants --dtype bfloat16 --out results/bench-variants-bf16.json
    python3 -m kernels.bench.variants --T 4096 --cases causal softcap30 # part of the grid
    python3 -m kernels.bench.variants --pass fwd+bwd --out results/bench-variants-train.json
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .common import ROOT, gpu_missing, save_result
from ..core import check, device_compute_capability, format_table, gpu_name
from ..core.timing import BACKWARD_FLOP_FACTOR, compare, paired_ratio

B, H, D = 4, 32, 128
TS = (4096, 16384)
ROUNDS = 3  # rounds of kernels.compare per T
FLEX_BLOCK = 128  # create_block_mask's block size (its default)
CHECK = dict(B=2, H=8, T=1500)  # the correctness check's shape (ragged: not a multiple of any tile)
OURS = ("flash2_mma", "hopper_attn")
SDPA_BACKENDS = {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_flash": "FLASH_ATTENTION"}
IMPLS = OURS + ("flex",) + tuple(SDPA_BACKENDS)
PASSES = ("fwd", "fwd+bwd")


@dataclass(frozen=True)
class Case:
    """One row of the grid: the mask (causal, window, docs), the score modifiers (softcap, alibi), the shape changes
    (Hkv: kv heads, None for H; d), whether SDPA has the variant, and which target ratio the row reports ("causal":
    time / the causal time; "area": time / (causal time x visible fraction))."""
    name: str
    causal: bool = True
    window: tuple | None = None
    docs: int = 0
    softcap: float | None = None
    alibi: bool = False
    Hkv: int | None = None
    d: int = D
    sdpa: bool = False
    target: str | None = None

    def group(self) -> int:
        """Query heads per kv head (of the grid's H)."""
        return 1 if self.Hkv is None else H // self.Hkv

    def kv_heads(self, heads: int) -> int:
        """kv heads for `heads` query heads, the case's group size kept."""
        return heads // self.group()


CASES = (
    Case("causal", sdpa=True),
    Case("window1024", window=(1024, 0), target="area"),
    Case("docs8", causal=False, docs=8),
    Case("softcap30", softcap=30.0, target="causal"),
    Case("alibi", alibi=True, target="causal"),
    Case("gqa8", Hkv=8, sdpa=True),
    Case("d256", d=256, sdpa=True),
)
CASE = {c.name: c for c in CASES}


# ---- the variant's definition, as arrays and as FlexAttention's functions (all CPU-testable) -------------------------

def doc_ids(T: int, n_docs: int) -> np.ndarray:
    """(T,) int32: n_docs documents of equal length (lengths differ by at most one when n_docs does not divide T)."""
    return (np.arange(T, dtype=np.int64) * n_docs // T).astype(np.int32)


def alibi_slopes(heads: int) -> np.ndarray:
    """(heads,) float32: ALiBi's geometric slopes 2^(-8 (h + 1) / heads) (BLOOM's, for a power-of-two head count)."""
    return (2.0 ** (-8.0 * (np.arange(heads) + 1) / heads)).astype(np.float32)


def variant_options(case: Case, batch: int, heads: int, T: int) -> dict:
    """The case's options as flash2_mma.forward (and reference.variants.attention_variant) take them, with NumPy
    arrays: doc_ids_q (batch, T) int32, alibi_slopes (heads,) float32; causal always present."""
    opts = {"causal": case.causal}
    if case.window is not None:
        opts["window"] = case.window
    if case.docs:
        opts["doc_ids_q"] = np.ascontiguousarray(np.broadcast_to(doc_ids(T, case.docs), (batch, T)))
    if case.softcap is not None:
        opts["softcap"] = case.softcap
    if case.alibi:
        opts["alibi_slopes"] = alibi_slopes(heads)
    return opts


def visible_pairs(case: Case, T: int) -> int:
    """The (query, key) pairs the case's mask leaves visible at Tq = Tk = T, exactly: row i sees the keys
    [max(0, i - left, its document's start), min(T - 1, i (causal), i + right, its document's end)]."""
    i = np.arange(T, dtype=np.int64)
    lo, hi = np.zeros(T, dtype=np.int64), np.full(T, T - 1, dtype=np.int64)
    if case.causal:
        hi = np.minimum(hi, i)
    if case.window is not None:
        left, right = case.window
        if left is not None:
            lo = np.maximum(lo, i - left)
        if right is not None:
            hi = np.minimum(hi, i + right)
    if case.docs:
        ids = doc_ids(T, case.docs)
        starts = np.searchsorted(ids, ids, side="left")
        ends = np.searchsorted(ids, ids, side="right") - 1
        lo, hi = np.maximum(lo, starts), np.minimum(hi, ends)
    return int(np.maximum(hi - lo + 1, 0).sum())


def flops(case: Case, T: int, batch: int = B, heads: int = H, backward: bool = False) -> float:
    """Forward FLOPs of the visible area: 4 batch heads d per visible pair (two matrix products); with backward,
    the forward's and the backward's together (1 + BACKWARD_FLOP_FACTOR times as many)."""
    return 4.0 * batch * heads * case.d * visible_pairs(case, T) * ((1.0 + BACKWARD_FLOP_FACTOR) if backward else 1.0)


def mask_mod(case: Case, Tq: int, Tk: int, ids=None):
    """FlexAttention's mask_mod(b, h, q_idx, kv_idx) -> bool for the case (None: no mask), bottom-right aligned as
    reference.variants is (query i sits at c = i + Tk - Tq). ids: the (T,) document ids as a torch tensor on the
    device the mod runs on (case.docs only). Plain torch: it runs on index grids on the CPU as well."""
    diag = Tk - Tq
    conds = []
    if case.causal:
        conds.append(lambda q, kv: kv <= q + diag)
    if case.window is not None:
        left, right = case.window
        if left is not None:
            conds.append(lambda q, kv: kv >= q + diag - left)
        if right is not None:
            conds.append(lambda q, kv: kv <= q + diag + right)
    if case.docs:
        if ids is None:
            raise ValueError(f"case {case.name} masks documents: mask_mod needs their ids")
        conds.append(lambda q, kv: ids[q] == ids[kv])
    if not conds:
        return None

    def mod(b, h, q_idx, kv_idx):
        seen = conds[0](q_idx, kv_idx)
        for cond in conds[1:]:
            seen = seen & cond(q_idx, kv_idx)
        return seen

    return mod


def score_mod(case: Case, Tq: int, Tk: int, slopes=None):
    """FlexAttention's score_mod(score, b, h, q_idx, kv_idx) for the case (None: none), on the scaled score, in the
    reference's order: softcap tanh(s / softcap), then minus slope_h |j - c_i|. slopes: (H,) torch tensor (alibi)."""
    if case.softcap is None and not case.alibi:
        return None
    if case.alibi and slopes is None:
        raise ValueError(f"case {case.name} adds ALiBi: score_mod needs the slopes")
    cap, diag = case.softcap, Tk - Tq

    def mod(score, b, h, q_idx, kv_idx):
        if cap is not None:
            score = cap * (score / cap).tanh()
        if case.alibi:
            score = score - slopes[h] * (kv_idx - (q_idx + diag)).abs()
        return score

    return mod


def torch_attention(q, k, v, case: Case, ids=None, slopes=None):
    """The case's attention in torch, written out in q's dtype (float32 for the check, float64 in the CPU tests):
    S = scale q k^T, score_mod, mask_mod, softmax (a row that sees nothing gives 0), P V. q (B, Hq, T, d), k and v
    (B, Hkv, T, d), query head h reading kv head h // (Hq // Hkv)."""
    import torch

    Bq, Hq, Tq, d = q.shape
    Tk = k.shape[2]
    group = Hq // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    dev = q.device
    b_idx = torch.arange(Bq, device=dev)[:, None, None, None]
    h_idx = torch.arange(Hq, device=dev)[None, :, None, None]
    q_idx = torch.arange(Tq, device=dev)[:, None]
    kv_idx = torch.arange(Tk, device=dev)[None, :]
    smod = score_mod(case, Tq, Tk, slopes)
    if smod is not None:
        s = smod(s, b_idx, h_idx, q_idx, kv_idx)
    mmod = mask_mod(case, Tq, Tk, ids)
    if mmod is not None:
        s = s.masked_fill(~mmod(b_idx, h_idx, q_idx, kv_idx), -math.inf)
    m = s.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(s.dtype).min)  # a fully masked row: exp(-inf) = 0
    p = (s - m).exp()
    p = p / p.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    return p @ v


# ---- the rows, from the timings (CPU-testable with made-up Timings) ------------------------------------------------

def rows_from_timings(T: int, cases, times: dict, notes: dict, checks: dict, batch: int = B, heads: int = H,
                      impls=IMPLS, backward: bool = False) -> list[dict]:
    """One row per (case, implementation of impls): times {(case name, impl): Timing} of one compare(), notes
    {(case, impl): why it has no time}, checks {(case, impl): the CheckResult of the correctness check}; backward:
    the times are of the forward and the backward together."""
    causal_pairs = visible_pairs(CASE["causal"], T)
    rows = []
    for case in cases:
        pairs = visible_pairs(case, T)
        for impl in impls:
            key = (case.name, impl)
            row = {"T": T, "case": case.name, "impl": impl, "pass": PASSES[backward], "B": batch, "H": heads,
                   "Hkv": case.kv_heads(heads), "d": case.d, "visible pairs": pairs,
                   "visible fraction": pairs / (T * T)}
            if key in checks:
                row["check"] = str(checks[key])
            t = times.get(key)
            if t is None:
                row["note"] = notes.get(key, "not run")
                rows.append(row)
                continue
            row.update({"ms": t.ms, "call ms": t.call_ms,
                        "TFLOP/s": t.tflops(flops(case, T, batch, heads, backward))})
            for col, peer in (("vs flex", "flex"), ("vs cuDNN", "sdpa_cudnn")):
                p = times.get((case.name, peer))
                row[col] = paired_ratio(t, p) if p is not None and peer != impl else None
            base = times.get(("causal", impl))
            if case.target is not None and base is not None:
                slower = 1.0 / paired_ratio(t, base)  # this time / the causal time, the median over the rounds
                if case.target == "causal":
                    row["vs causal"] = slower
                else:
                    row["vs causal x area"] = slower / (pairs / causal_pairs)
            row["rounds ms"] = list(t.rounds)
            rows.append(row)
    return rows


# ---- on the GPU ------------------------------------------------------------------------------------------------------

def _torch_dtype(dtype: str):
    import torch

    return getattr(torch, dtype)


def _inputs(case: Case, batch: int, heads: int, T: int, dtype: str, seed: int):
    """q (batch, heads, T, d), k and v (batch, Hkv, T, d) torch tensors on the GPU, normal std 1."""
    import torch

    gen = torch.Generator("cuda").manual_seed(seed)
    shape_kv = (batch, case.kv_heads(heads), T, case.d)
    q = torch.randn(batch, heads, T, case.d, device="cuda", dtype=_torch_dtype(dtype), generator=gen)
    k, v = (torch.randn(*shape_kv, device="cuda", dtype=_torch_dtype(dtype), generator=gen) for _ in range(2))
    return q, k, v


def our_forward(impl: str):
    """The launcher of one of ours: flash2_mma.forward, or hopper_attn.forward."""
    if impl == "flash2_mma":
        from ..flash import flash2_mma

        return flash2_mma.forward
    from ..hopper import hopper_attn

    return hopper_attn.forward


def unsupported(impl: str, cc: tuple, case: Case) -> str | None:
    """Why `impl` cannot run `case` on a GPU of compute capability cc, or None (what the launchers and torch refuse
    on the shape itself comes from their first call)."""
    if impl == "flash2_mma" and cc < (8, 0):
        return f"flash2_mma needs compute capability 8.0 or newer; this GPU has {cc[0]}.{cc[1]}"
    if impl == "hopper_attn" and cc[0] != 9:
        return f"hopper_attn needs a Hopper (compute capability 9.0, sm_90a); this GPU has {cc[0]}.{cc[1]}"
    if impl in SDPA_BACKENDS and not case.sdpa:
        return "SDPA has no such variant"
    if impl == "flex":
        import inspect

        try:
            from torch.nn.attention.flex_attention import flex_attention
        except ImportError as e:
            return f"this torch has no FlexAttention ({e})"
        if case.Hkv is not None and "enable_gqa" not in inspect.signature(flex_attention).parameters:
            return "this torch's flex_attention has no enable_gqa"
    return None


def our_backward(impl: str, case: Case):
    """The backward after `impl`'s forward: on a Hopper (impl hopper_attn) at d = 64 and 128 hopper_attn_bwd.backward
    (every case this bench has: masks, ALiBi, soft-capping, documents, grouped-query heads), otherwise
    flash2_mma_bwd.backward (its variant kernel for the modifiers); both take the lse of either forward."""
    if impl == "hopper_attn":
        from ..hopper import hopper_attn_bwd

        if case.d in hopper_attn_bwd.HEAD_DIMS:
            return hopper_attn_bwd.backward
    from ..flash import flash2_mma_bwd

    return flash2_mma_bwd.backward


def _our_call(impl: str, case: Case, q, k, v, T: int, do=None):
    """A zero-argument callable running our `impl` on torch tensors q, k, v (as CuPy views) with the case's options:
    the forward, or with do (dO, like q) the forward with its lse and then the backward (our_backward), returning
    (dq, dk, dv). The launcher's ValueError (a case it does not support) comes from the first call, made here."""
    from ..core import cp

    fwd = our_forward(impl)
    cq, ck, cv = (cp.from_dlpack(x.detach()) for x in (q, k, v))  # views, also where the peers set requires_grad
    opts = {n: cp.asarray(x) if isinstance(x, np.ndarray) else x
            for n, x in variant_options(case, q.shape[0], q.shape[1], T).items()}
    if do is None:
        fn = (lambda: fwd(cq, ck, cv, **opts))
        return fn, fn()
    bwd, cdo = our_backward(impl, case), cp.from_dlpack(do.detach())

    def fn():
        o, lse = fwd(cq, ck, cv, return_lse=True, **opts)
        return bwd(cq, ck, cv, o, lse, cdo, **opts)
    return fn, fn()


def check_ours(impl: str, case: Case, dtype: str, backward: bool = False):
    """(CheckResult, None) of `impl` on the case at the CHECK shape against torch_attention in float32 (backward:
    the worst of dq, dk, dv against torch.autograd's), or (None, "not supported: <the launcher's ValueError>")."""
    import torch

    batch, heads, T = CHECK["B"], CHECK["H"], CHECK["T"]
    q, k, v = _inputs(case, batch, heads, T, dtype, seed=7)
    do = torch.randn_like(q) if backward else None
    try:
        _, out = _our_call(impl, case, q, k, v, T, do)
    except ValueError as e:
        return None, f"not supported: {e}"
    ids = torch.from_numpy(doc_ids(T, case.docs)).cuda() if case.docs else None
    slopes = torch.from_numpy(alibi_slopes(heads)).cuda() if case.alibi else None
    leaves = [x.float().requires_grad_(backward) for x in (q, k, v)]
    ref = torch_attention(*leaves, case, ids, slopes)
    if not backward:
        return check(out, ref.detach().cpu().numpy(), dtype), None
    grads = torch.autograd.grad(ref, leaves, do.float())
    results = [check(got, want.cpu().numpy(), dtype) for got, want in zip(out, grads)]
    return max(results, key=lambda r: (not r.ok, r.rel_l2 / r.tol)), None


_FLEX = {}


def _flex_compiled():
    """flex_attention under torch.compile(dynamic=False), made once. Every (case, T) is a compilation of its own, so
    dynamo's limit on recompilations is raised, and where torch has the switch a hit limit fails loudly instead of
    falling back to the eager flex_attention (which materialises the scores) inside the timing."""
    if "fn" not in _FLEX:
        import torch
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
        if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
            torch._dynamo.config.fail_on_recompile_limit_hit = True
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


def flex_call(case: Case, q, k, v, do=None):
    """A zero-argument callable running compiled FlexAttention on the case (its block mask made here, its kernel
    compiled by the first call, made here too); with do, forward and torch.autograd.grad for dO = do."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    T = q.shape[2]
    ids = torch.from_numpy(doc_ids(T, case.docs)).cuda() if case.docs else None
    slopes = torch.from_numpy(alibi_slopes(q.shape[1])).cuda() if case.alibi else None
    mmod, smod = mask_mod(case, T, T, ids), score_mod(case, T, T, slopes)
    block_mask = None if mmod is None else create_block_mask(mmod, None, None, T, T, device="cuda",
                                                             BLOCK_SIZE=FLEX_BLOCK)
    flex = _flex_compiled()
    kw = {"enable_gqa": True} if case.Hkv is not None else {}

    def fn():
        return flex(q, k, v, score_mod=smod, block_mask=block_mask, **kw)

    fn = fn if do is None else _with_backward(fn, (q, k, v), do)
    fn()
    torch.cuda.synchronize()
    return fn


def sdpa_call(backend: str, case: Case, q, k, v, do=None):
    """A zero-argument callable running SDPA with `backend` forced (causal; enable_gqa where k has fewer heads); its
    first call, made here, raises where the backend refuses. With do: forward and backward (_with_backward)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    member = getattr(SDPBackend, SDPA_BACKENDS[backend])
    kw = {"enable_gqa": True} if case.Hkv is not None else {}

    def forward():
        with sdpa_kernel(member):
            return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, **kw)

    def fn():
        with sdpa_kernel(member):  # the backward too runs the forced backend's kernel
            return forward() if do is None else backward()

    backward = None if do is None else _with_backward(forward, (q, k, v), do)
    with warnings.catch_warnings():  # torch warns at length before it refuses; the reason is recorded
        warnings.simplefilter("ignore")
        fn()
    torch.cuda.synchronize()
    return fn


def _with_backward(forward, leaves, do):
    """forward() and then torch.autograd.grad of its output for dO = do, with respect to leaves (q, k, v: used as
    leaves that require grad, not accumulated into .grad)."""
    import torch

    for x in leaves:
        x.requires_grad_(True)

    def fn():
        return torch.autograd.grad(forward(), leaves, do)
    return fn


def _why(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:140] if text else ''}"


def bench_T(T: int, cases, dtype: str, bench_kw: dict, impls=IMPLS, log=print, backward: bool = False) -> list[dict]:
    """Every (case, implementation) at T: ours checked first, then everything timed in one compare() (backward:
    forward and backward together)."""
    import torch

    cc = device_compute_capability()
    fns, notes, checks, held = {}, {}, {}, []
    for n, case in enumerate(cases):
        q, k, v = _inputs(case, B, H, T, dtype, seed=T + n)
        do = torch.randn_like(q) if backward else None
        held.append((q, k, v, do))
        for impl in impls:
            key = (case.name, impl)
            why = unsupported(impl, cc, case)
            if why is not None:
                notes[key] = f"not run: {why}"
                continue
            try:
                if impl in OURS:
                    res, why = check_ours(impl, case, dtype, backward)
                    if res is not None:
                        checks[key] = res
                        if not res:
                            why = f"wrong, not timed: {res.detail()}"
                    if why is None:
                        fns[key] = _our_call(impl, case, q, k, v, T, do)[0]
                elif impl == "flex":
                    fns[key] = flex_call(case, q, k, v, do)
                else:
                    fns[key] = sdpa_call(impl, case, q, k, v, do)
            except ValueError as e:  # our launcher refuses the timed shape
                why = f"not supported: {e}"
            except Exception as e:  # a peer that refuses (RuntimeError, a compile error) is recorded, not timed
                why = f"not run: {_why(e)}"
            if why is not None:
                notes[key] = why
                fns.pop(key, None)
            log(f"  T={T} {case.name:10s} {impl:12s} {why or checks.get(key, 'ready')}")
        torch.cuda.synchronize()
    times = compare(fns, rounds=ROUNDS, **bench_kw) if fns else {}
    del fns, held
    torch.cuda.empty_cache()
    return rows_from_timings(T, cases, times, notes, checks, impls=impls, backward=backward)


def run(Ts=TS, cases=CASES, dtype: str = "float16", bench_kw=None, out_path: Path | None = None,
        command: str | None = None, impls=IMPLS, log=print, backward: bool = False) -> dict:
    import torch

    bench_kw = bench_kw or {}
    result = {"gpu": gpu_name(), "torch": torch.__version__, "B": B, "H": H, "d": D, "dtype": dtype, "T": list(Ts),
              "cases": [c.name for c in cases], "rounds": ROUNDS, "check": CHECK, "command": command,
              "pass": PASSES[backward],
              "flops": "4 B Hq d x visible pairs (counted exactly)" + (
                  f", x {1 + BACKWARD_FLOP_FACTOR} for forward and backward" if backward else ""),
              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "rows": []}
    for T in Ts:
        result["rows"] += bench_T(T, cases, dtype, bench_kw, impls, log, backward)
    return save_result(result, out_path)


COLUMNS = ["T", "case", "impl", "ms", "TFLOP/s", "vs flex", "vs cuDNN", "vs causal", "vs causal x area", "note"]


def summary(result: dict) -> str:
    """The table as text."""
    return f"GPU: {result['gpu']}, torch {result['torch']}, {result['dtype']}, {result.get('pass', 'fwd')}\n\n" + \
        format_table(result["rows"], COLUMNS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m kernels.bench.variants", description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=list(TS))
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    p.add_argument("--cases", nargs="+", choices=list(CASE), default=list(CASE))
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--pass", dest="passes", choices=PASSES, default="fwd",
                   help="fwd: the forward; fwd+bwd: forward and backward in one call")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench-variants.json")
    args = p.parse_args(argv)
    missing = gpu_missing("python3 -m kernels.bench.variants")
    if missing is not None:
        return missing
    command = " ".join(["python3 -m kernels.bench.variants", *(sys.argv[1:] if argv is None else argv)])
    result = run(args.T, [CASE[n] for n in args.cases], args.dtype,
                 dict(batches=args.batches, calls=args.calls, warmup=1), args.out, command,
                 backward=args.passes == "fwd+bwd")
    print(summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
