"""Check and time every attention variant of the course beside PyTorch: `python3 -m kernels.bench`.

Two suites, each timed in one run with the peers on the same inputs:

  llmc   llm.c's benchmark shape (B=8, H=12, T=1024, d=64, causal), float32 and float16: every registered
         variant that takes the dtype, and torch SDPA's flash / cuDNN / efficient / math backends.
  long   the long-sequence grid: fp16, B=4, H=32, T in {1024, 4096, 16384}, d in {64, 128}, causal and not:
         the fp16 variants against SDPA flash (FlashAttention-2), cuDNN and efficient.

Every row of ours carries a correctness check against the float64 reference, on the very outputs that are
timed: the last 128 query rows of the first and the last head (with bottom-right causal alignment these rows
are an attention problem of their own, so the reference needs only 128 x T scores per head). Every row, ours
and peers, carries:

  ms, ms_min, ms_max   kernel time per call (kernels.core.timing.benchmark: GPU time of back-to-back calls); the kernels
                       of one configuration are timed side by side in ROUNDS rounds (kernels.compare) and each row
                       is its median round, with `rounds` the kernel ms of every round
  call_ms              call time: one Python call on an idle GPU, host overhead included
  cold_ms              kernel time with a cold L2, where q, k, v fit in the L2 cache (else absent)
  tflops, gbps         from the kernel time (GB/s of the compulsory bytes: q, k, v read once, o written once)
  ratio_<peer>         peer kernel time / our kernel time within a round, the median over the rounds (above 1:
                       faster than that peer)

plus, once per run, the copy and read bandwidth of the GPU, and the host overhead of one launcher call on a
tiny input for every variant and for SDPA (`overhead`). Results go to results/bench.json as numbers;
--update-readme rewrites the README's results tables from that file, so they are regenerated, never typed.

    python3 -m kernels.bench                       # both suites (a few minutes on an H100)
    python3 -m kernels.bench --suite llmc          # one suite
    python3 -m kernels.bench --quick               # long suite at T in {1024, 4096} only
    python3 -m kernels.bench --update-readme       # without a GPU: only rewrite the README from --out
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import warnings
from pathlib import Path

import numpy as np

from .common import ROOT, save_result
from ..core import REGISTRY, check, device_compute_capability, format_table, gpu_name, gpu_unavailable_reason
from ..core import cp
from ..core.timing import (attention_bytes, attention_flops, benchmark, compare, copy_bandwidth_gbps, fits_in_l2,
                     host_overhead_us, read_bandwidth_gbps)

LLMC_SHAPE = dict(B=8, H=12, T=1024, d=64)
LLMC_DTYPES = ("float32", "float16")
LONG = dict(B=4, H=32, T=(1024, 4096, 16384), d=(64, 128), causal=(True, False), dtype="float16")
QUICK_T = (1024, 4096)
SDPA_BACKENDS = {  # peer name -> torch.nn.attention.SDPBackend member
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_math": "MATH",
}
LONG_PEERS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient")
CHECK_ROWS = 128  # query rows checked per head
OVERHEAD_SHAPE = dict(B=1, H=1, T=16, d=64)  # a tiny input: the kernel takes a few microseconds
# llm.c's own times at its benchmark shape, measured with llm.c's benchmark (not by this module): data, not code.
LLMC_RESULTS = ROOT / "results" / "llmc.json"


def llmc_published() -> dict:
    """results/llmc.json: llm.c's attention_forward times on an H100, with their source and how they were taken."""
    return json.loads(LLMC_RESULTS.read_text())


# ---------------------------------------------------------------------------------------------------------
# Peers: torch SDPA backends on the same memory (DLPack, no copy); the backend is chosen outside the timed call.
# ---------------------------------------------------------------------------------------------------------

def sdpa_peer(name: str, q, k, v, causal: bool):
    """A zero-argument callable running torch SDPA with backend `name` on q, k, v, or (None, reason)."""
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        return None, f"torch is not installed ({e})"
    backend = getattr(SDPBackend, SDPA_BACKENDS[name])
    qt, kt, vt = (torch.from_dlpack(x) for x in (q, k, v))
    if name == "sdpa_math":  # the math backend materialises S and P: (B, H, Tq, Tk) in float32, twice
        need = 2 * 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
        free = torch.cuda.mem_get_info()[0] + cp.get_default_memory_pool().free_bytes()
        if need > free // 2:
            return None, f"needs {need / 2**30:.0f} GiB for S and P"

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    try:
        with warnings.catch_warnings():  # torch warns at length before it refuses; the reason is recorded below
            warnings.simplefilter("ignore")
            run()
        torch.cuda.synchronize()
    except RuntimeError as e:  # a backend that does not take this dtype/shape says so; record why
        return None, str(e).strip().splitlines()[0][:100]
    return run, None


# ---------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------

def _inputs(B, H, T, d, dtype, seed):
    import reference as R

    return tuple(cp.asarray(x.astype(dtype)) for x in R.make_qkv(B, H, T, d, seed=seed))


def check_last_rows(o, q, k, v, causal, tol_class):
    """check() of the last CHECK_ROWS query rows of heads (0, 0) and (B-1, H-1) against the float64 reference."""
    import reference as R

    B, H, T = q.shape[:3]
    n = min(CHECK_ROWS, T)
    outs, refs = [], []
    for b, h in sorted({(0, 0), (B - 1, H - 1)}):
        host = [x[b, h].get().astype(np.float64)[None, None] for x in (q[:, :, T - n:], k, v)]
        refs.append(R.attention(*host, causal=causal))
        outs.append(o[b, h, T - n:].get()[None, None])
    return check(np.concatenate(outs), np.concatenate(refs), tol_class)


def _row(suite, name, kind, dtype, shape, causal, t=None, res=None, note=""):
    B, H, T, d = shape
    row = dict(suite=suite, name=name, kind=kind, dtype=dtype, B=B, H=H, T=T, d=d, causal=causal, note=note)
    if res is not None:
        row.update(res.as_dict())
    if t is not None:
        itemsize = np.dtype(dtype).itemsize
        row.update(ms=t.ms, ms_min=t.min_ms, ms_max=t.max_ms, call_ms=t.call_ms, host_bound=t.host_bound,
                   tflops=t.tflops(attention_flops(B, H, T, T, d, causal)),
                   gbps=t.gbps(attention_bytes(B, H, T, T, d, itemsize)))
        if t.flushed_ms is not None:
            row["cold_ms"] = t.flushed_ms
        if t.rounds:
            row["rounds"] = list(t.rounds)  # kernel ms of each round of the configuration's compare()
    return row


ROUNDS = 3  # rounds of kernels.compare per configuration: every kernel of it timed once per round, side by side


def _add_ratios(rows):
    """ratio_best_peer (> 1 is faster than every peer) and ratio_<peer> per configuration: the peer's kernel time over
    ours within each round of the configuration's compare(), the median over the rounds (kernels.paired_ratio)."""
    key = lambda r: (r["suite"], r["dtype"], r["B"], r["H"], r["T"], r["d"], r["causal"])  # noqa: E731
    for _, group in itertools.groupby(sorted(rows, key=key), key=key):
        group = list(group)
        peers = {r["name"]: r for r in group if r["kind"] == "peer" and "ms" in r}
        if not peers:
            continue
        best = min(peers, key=lambda p: peers[p]["ms"])
        for r in group:
            if "ms" in r:
                ratios = {p: float(np.median(np.divide(pr["rounds"], r["rounds"]))) for p, pr in peers.items()}
                r["best_peer"] = best
                r["ratio_best_peer"] = ratios[best]
                for p, x in ratios.items():
                    r[f"ratio_{p}"] = x
    return rows


def _time_config(rows, suite, dtype, shape, causal, q, k, v, peers, names, log):
    """One configuration: each peer and each of our variants `names` (checked against the reference first), all timed
    side by side in ROUNDS rounds (kernels.compare), so that their ratios come from the same rounds."""
    B, H, T, d = shape
    fns, kinds, checks = {}, {}, {}
    for p in peers:
        fn, why = sdpa_peer(p, q, k, v, causal)
        if fn is None:
            rows.append(_row(suite, p, "peer", dtype, shape, causal, note=f"not run: {why}"))
            log(f"  {p:16s} not run: {why}")
            continue
        fns[p], kinds[p] = fn, "peer"
    for name in names:
        var = REGISTRY[name]
        why = var.unsupported_reason(device_compute_capability(), dtype)  # e.g. bfloat16 or TF32 on a T4
        if why is not None:
            rows.append(_row(suite, name, "ours", dtype, shape, causal, note=f"not run: {why}"))
            log(f"  {name:16s} not run: {why}")
            continue
        try:
            o = var.forward(q, k, v, causal=causal)
        except ValueError as e:  # e.g. cuBLAS attention's score matrix does not fit in memory
            rows.append(_row(suite, name, "ours", dtype, shape, causal, note=f"not run: {e}"[:160]))
            log(f"  {name:16s} not run: {str(e)[:100]}")
            continue
        checks[name] = check_last_rows(o, q, k, v, causal, var.tolerance_class(dtype))
        del o
        fns[name], kinds[name] = (lambda var=var: var.forward(q, k, v, causal=causal)), "ours"
    if not fns:
        return
    flush = fits_in_l2(3 * B * H * T * d * np.dtype(dtype).itemsize)
    timings = compare(fns, rounds=ROUNDS, flush_l2=flush)
    for name, t in timings.items():
        rows.append(_row(suite, name, kinds[name], dtype, shape, causal, t, checks.get(name)))
        log(f"  {name:16s} kernel {t.ms:8.3f} ms  call {t.call_ms:8.3f} ms  {checks.get(name, '')}")


def run_llmc(dtypes=LLMC_DTYPES, variants=None, log=print) -> list[dict]:
    """Every variant (or `variants`) at llm.c's shape for each dtype, with the SDPA backends of that dtype."""
    shape = tuple(LLMC_SHAPE.values())
    B, H, T, d = shape
    rows = []
    for dtype in dtypes:
        log(f"llm.c shape B={B} H={H} T={T} d={d} causal, {dtype}")
        q, k, v = _inputs(B, H, T, d, dtype, seed=2)
        names = [n for n in variants or sorted(REGISTRY) if dtype in REGISTRY[n].dtypes and REGISTRY[n].accepts_d(d)]
        _time_config(rows, "llmc", dtype, shape, True, q, k, v, SDPA_BACKENDS, names, log)
    return _add_ratios(rows)


def run_long(T_values=LONG["T"], d_values=LONG["d"], causal_values=LONG["causal"], variants=None,
             peers=LONG_PEERS, log=print) -> list[dict]:
    """The long-sequence grid in fp16: our fp16 variants (or `variants`) and `peers`, configuration by configuration."""
    dtype, B, H = LONG["dtype"], LONG["B"], LONG["H"]
    names = variants or [n for n in sorted(REGISTRY) if dtype in REGISTRY[n].dtypes]
    rows = []
    for d, T, causal in itertools.product(d_values, T_values, causal_values):
        shape = (B, H, T, d)
        log(f"B={B} H={H} T={T} d={d} {'causal' if causal else 'full'}, {dtype}")
        q, k, v = _inputs(B, H, T, d, dtype, seed=3)
        _time_config(rows, "long", dtype, shape, causal, q, k, v, peers, [n for n in names if REGISTRY[n].accepts_d(d)],
                     log)
        del q, k, v
        cp.get_default_memory_pool().free_all_blocks()
    return _add_ratios(rows)


def _sdpa_default(q, k, v):
    """torch SDPA as a user calls it, the backend left to torch's dispatcher (what its host overhead is)."""
    import torch
    import torch.nn.functional as F

    qt, kt, vt = (torch.from_dlpack(x) for x in (q, k, v))
    return lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)


# What one call of each launcher does on the host beyond one prepared launch (the overhead table's note).
HOST_PATHS = {
    "naive": "3 kernels, S and P allocated",
    "flash1": "1 kernel; o, l, m, lse allocated; validated on every call",
    "cublas_fp32": "2 cuBLAS GEMMs + softmax kernel; S, P allocated",
    "cublas_tf32": "2 cuBLAS GEMMs + softmax kernel; S, P allocated",
    "cublas_fp16": "2 cuBLAS GEMMs + softmax kernel; S, P allocated",
    "cublas_bf16": "2 cuBLAS GEMMs + softmax kernel; S, P allocated",
    "flash2_triton": "Triton's launcher, through torch (DLPack)",
}
PREPARED = "1 prepared launch (attention_launch)"
OVERHEAD_ROUNDS = 3


def host_path(var) -> str:
    """PREPARED for a variant whose module keeps a launch cache of core.attention_launch, else HOST_PATHS' entry."""
    from ..core import launch as core_launch

    cache = getattr(sys.modules.get(var.module), "_CALLS", None)
    if any(cache is c for c in core_launch._LAUNCH_CACHES):
        return PREPARED
    return HOST_PATHS.get(var.name, "")


def launcher_overhead(variants=None, log=print) -> list[dict]:
    """Host microseconds per call on a tiny input (OVERHEAD_SHAPE), every variant and SDPA, beside its call time.

    The kernel itself takes a few microseconds there, so `host_us` is what Python, the launcher's checks, its
    allocations and the driver's launch cost; `call_us` is what a user waits for one call on an idle GPU.
    SDPA is called plainly, its backend chosen by torch's dispatcher, as a model calls it. The launchers are
    measured in OVERHEAD_ROUNDS rounds, one after another within each round, and each keeps its best round: the host
    of a GPU machine drifts by tens of percent over seconds, and interleaving keeps that drift from favouring
    whichever launcher happened to run in a quiet moment.
    """
    B, H, T, d = OVERHEAD_SHAPE.values()
    rows, fns = [], {}
    cc = device_compute_capability()
    cases = [(n, dt) for n in (variants or sorted(REGISTRY)) for dt in REGISTRY[n].dtypes[:1]
             if REGISTRY[n].unsupported_reason(cc, dt) is None]
    cases += [("torch sdpa", "float16"), ("torch sdpa", "float32")]
    for name, dtype in cases:
        q, k, v = _inputs(B, H, T, d, dtype, seed=4)
        try:
            fns[name, dtype] = _sdpa_default(q, k, v) if name == "torch sdpa" else \
                (lambda var, q, k, v: lambda: var.forward(q, k, v, causal=True))(REGISTRY[name], q, k, v)
        except ImportError as e:
            rows.append(dict(name=name, dtype=dtype, kind="peer", note=f"not run: {e}"))
    host = {}
    for r in range(OVERHEAD_ROUNDS):  # each measurement: the best of 5 medians of 200 calls (host_overhead_us)
        for case, fn in fns.items():
            host[case] = min(host.get(case, float("inf")), host_overhead_us(fn, warmup=1000 if r == 0 else 200))
    for (name, dtype), fn in fns.items():
        t = benchmark(fn)
        ours = name != "torch sdpa"
        note = host_path(REGISTRY[name]) if ours else "torch's dispatcher"
        rows.append(dict(name=name, dtype=dtype, kind="ours" if ours else "peer", host_us=host[name, dtype],
                         call_us=t.call_ms * 1e3, kernel_us=t.ms * 1e3, note=note))
        log(f"  {name:16s} {dtype:8s} host {host[name, dtype]:6.1f} us  call {t.call_ms * 1e3:6.1f} us  "
            f"kernel {t.ms * 1e3:6.1f} us")
    return rows


def launch_parts(log=print) -> dict:
    """Host microseconds of one flash2_mma call on the tiny input, and of its parts, each measured alone with
    host_overhead_us: what the launch path costs, piece by piece, beside what the first call of a problem adds
    (the full validation), the generic Kernel call, CuPy's own launch and torch SDPA's whole call."""
    from .. import core
    from ..flash import flash2_mma

    B, H, T, d = OVERHEAD_SHAPE.values()
    q, k, v = _inputs(B, H, T, d, "float16", seed=4)
    flash2_mma.forward(q, k, v, causal=True)  # prepares this problem's launch
    dev = core.current_device()
    key = (core.qkv_key(q, k, v, dev, flash2_mma.ALIGN), (True, None, None, None))
    launch, o_shape, o_dtype, _ = flash2_mma._CALLS[key]
    o = cp.empty_like(q)
    stream = cp.cuda.get_current_stream().ptr
    b = flash2_mma.build(flash2_mma.BUILD_FOR[d], None, "float16")
    args = (q, k, v, o, core.NULL) + flash2_mma._launch_config(T, T, d, q.dtype, d ** -0.5, True, None, None, B * H)[4]
    fn = b.kernel.raw.kernel  # CuPy's cupy.cuda.Function for the same kernel
    gx, gy, gz = launch.grid
    bx, by, bz = launch.block
    parts = {
        "flash2_mma.forward, the whole call": lambda: flash2_mma.forward(q, k, v, causal=True),
        "  qkv_key + look-up of the prepared launch": lambda: flash2_mma._CALLS.get(
            (core.qkv_key(q, k, v, dev, flash2_mma.ALIGN), (True, None, None, None))),
        "  allocation of the output (cupy.ndarray)": lambda: cp.ndarray(o_shape, o_dtype),
        "  current stream": lambda: cp.cuda.get_current_stream().ptr,
        "  Launch call (pack 5 pointers + cuLaunchKernel)": lambda: launch(stream, q.data.ptr, k.data.ptr, v.data.ptr,
                                                                          o.data.ptr, 0),
        "    cuLaunchKernel alone, arguments packed": lambda: cp.cuda.driver.launchKernel(
            launch.fn_ptr, gx, gy, gz, bx, by, bz, launch.smem, stream, launch.args.params_ptr, 0),
        "first call of a problem only: validate_attention": lambda: core.validate_attention(
            q, k, v, dtypes=flash2_mma.DTYPE_SET, max_d=flash2_mma.MAX_D, d_multiple=flash2_mma.D_MULTIPLE,
            what=flash2_mma.WHAT, align=flash2_mma.ALIGN),
        "generic Kernel call, all 11 arguments packed": lambda: b.kernel(launch.grid, launch.block, args, launch.smem),
        "CuPy's own RawKernel call (for comparison)": lambda: fn(launch.grid, launch.block, args, launch.smem),
    }
    try:
        parts["torch SDPA, the whole call"] = _sdpa_default(q, k, v)
    except ImportError as e:  # pragma: no cover - no torch
        log(f"torch SDPA not measured: {e}")
    out = {}
    for name, f in parts.items():
        out[name] = host_overhead_us(f)
        log(f"{name:50s} {out[name]:6.1f} us")
    return out


def run(suites=("llmc", "long"), quick=False, variants=None, out_path: Path | None = None, log=print) -> dict:
    log("bandwidth: 1 GiB device-to-device copy, and a 1 GiB read-only kernel")
    result = {"gpu": gpu_name(), "llmc_shape": LLMC_SHAPE, "long": {k: LONG[k] for k in ("B", "H", "dtype")},
              "copy_gbps": copy_bandwidth_gbps(), "read_gbps": read_bandwidth_gbps(), "check_rows": CHECK_ROWS,
              "rounds": ROUNDS,
              "timing": "kernel time: median of 5 batches of back-to-back calls queued behind a hold kernel, warm L2; "
                        "call time: median of 10 single calls between events on an idle GPU; cold_ms: single calls "
                        "after an L2 flush, where q, k, v fit in L2; each configuration's kernels timed side by side in "
                        f"{ROUNDS} rounds (kernels.compare), each row the median round, ratio_<peer> the median over "
                        "the rounds of the ratio within a round",
              "rows": []}
    log("launcher host overhead, tiny input")
    result["overhead"] = launcher_overhead(variants, log=log)
    if "llmc" in suites:
        result["rows"] += run_llmc(variants=variants, log=log)
    if "long" in suites:
        result["rows"] += run_long(T_values=QUICK_T if quick else LONG["T"], variants=variants, log=log)
    return save_result(result, out_path)


# ---------------------------------------------------------------------------------------------------------
# The cupy.matmul trap (notebook 06): batched 16-bit products through cupy.matmul and through cuBLAS directly
# ---------------------------------------------------------------------------------------------------------

def matmul_vs_gemmex(batch=96, shapes=((1024, 64, 1024), (1024, 1024, 64)), dtype="float16", seed=0):
    """Time cupy.matmul against cublas_half.batched_matmul (gemmStridedBatchedEx) on the same 16-bit products.

    shapes lists (M, K, N): by default S = Q K^T and O = P V of one attention layer at T = 1024, d = 64,
    B * H = 96 (llm.c's GPT-2 shape). Returns one dict per (shape, path) with kernel and call time, TFLOP/s, the
    relative L2 difference between the two paths' results, and a note where cupy.matmul refuses the dtype.
    """
    from ..cublas.cublas_half import half_dtype, batched_matmul

    dtype = half_dtype(dtype)
    rng = np.random.default_rng(seed)
    rows = []
    for M, K, N in shapes:
        a = cp.asarray(rng.standard_normal((batch, M, K)).astype(np.float32)).astype(dtype)
        b = cp.asarray(rng.standard_normal((batch, K, N)).astype(np.float32)).astype(dtype)
        product = f"{batch} x ({M}x{K}) @ ({K}x{N})"
        flops = 2.0 * batch * M * N * K
        ref = batched_matmul(a, b).astype(cp.float32)
        try:
            got = cp.matmul(a, b).astype(cp.float32)
        except Exception as e:  # CuPy 14.2 has no bfloat16 matmul ("data type 'E' not understood")
            rows.append({"product": product, "dtype": dtype, "path": "cupy.matmul", "kernel ms": float("nan"),
                         "call ms": float("nan"), "TFLOP/s": float("nan"), "rel diff": float("nan"),
                         "note": f"{type(e).__name__}: {e}"})
            paths = (("cublasGemmStridedBatchedEx", lambda: batched_matmul(a, b)),)
            diff = float("nan")
        else:
            diff = float(cp.linalg.norm(got - ref) / cp.linalg.norm(ref))
            paths = (("cupy.matmul", lambda: cp.matmul(a, b)),
                     ("cublasGemmStridedBatchedEx", lambda: batched_matmul(a, b)))
        for path, fn in paths:
            t = benchmark(fn)
            rows.append({"product": product, "dtype": dtype, "path": path, "kernel ms": t.ms, "call ms": t.call_ms,
                         "TFLOP/s": t.tflops(flops), "rel diff": diff, "note": ""})
    return rows


# ---------------------------------------------------------------------------------------------------------
# Tables (the command line's and the README's), from a result dict
# ---------------------------------------------------------------------------------------------------------

def _fmt(x, f):
    return format(x, f) if isinstance(x, (int, float)) and not isinstance(x, bool) else ""


def correct_text(r) -> str:
    """The correctness cell of a row: 'peer' for the yardsticks, else ok and the relative L2 error."""
    if r["kind"] == "peer":
        return "peer"
    if "ok" not in r:
        return ""
    return f"{'yes' if r['ok'] else 'NO'} ({r['rel_l2']:.0e} / {r['tol']:.0e})"


def llmc_table(result: dict) -> list[dict]:
    rows = [r for r in result["rows"] if r["suite"] == "llmc"]
    return [{"variant": r["name"], "dtype": r["dtype"], "correct (rel err / tol)": correct_text(r),
             "kernel ms": _fmt(r.get("ms"), ".3f"), "call ms": _fmt(r.get("call_ms"), ".3f"),
             "cold-L2 ms": _fmt(r.get("cold_ms"), ".3f"), "TFLOP/s": _fmt(r.get("tflops"), ".1f"),
             "vs best peer": (f"{r['ratio_best_peer']:.2f}x ({r['best_peer']})" if "ratio_best_peer" in r
                              else r["note"])}
            for r in rows]


def long_table(result: dict, name: str = "flash2_mma") -> list[dict]:
    rows = [r for r in result["rows"] if r["suite"] == "long"]
    out = []
    key = lambda r: (r["d"], not r["causal"], r["T"])  # noqa: E731
    for (d, full, T), group in itertools.groupby(sorted(rows, key=key), key=key):
        by = {r["name"]: r for r in group}
        ours = by.get(name)
        if ours is None:
            continue
        out.append({"d": d, "causal": "no" if full else "yes", "T": T, "correct": correct_text(ours),
                    "kernel ms": _fmt(ours.get("ms"), ".3f"), "call ms": _fmt(ours.get("call_ms"), ".3f"),
                    "TFLOP/s": _fmt(ours.get("tflops"), ".0f"),
                    **{f"{p} TFLOP/s": _fmt(by[p].get("tflops"), ".0f") for p in ("sdpa_flash", "sdpa_cudnn") if p in by},
                    "vs flash": _fmt(ours.get("ratio_sdpa_flash"), ".2f"),
                    "vs cuDNN": _fmt(ours.get("ratio_sdpa_cudnn"), ".2f")})
    return out


def overhead_table(result: dict) -> list[dict]:
    return [{"launcher": r["name"], "dtype": r["dtype"], "host us/call": _fmt(r.get("host_us"), ".1f"),
             "call us": _fmt(r.get("call_us"), ".1f"), "kernel us": _fmt(r.get("kernel_us"), ".1f"),
             "note": r.get("note", "")}
            for r in result.get("overhead", [])]


def _markdown(rows: list[dict]) -> list[str]:
    if not rows:
        return ["(no rows)"]
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return lines


README_START, README_END = "<!-- results:start -->", "<!-- results:end -->"


def markdown_tables(result: dict) -> str:
    s = result["llmc_shape"]
    lines = [f"Measured on {result['gpu']} by `python3 -m kernels.bench` (peers in the same run; copy bandwidth "
             f"{result['copy_gbps']:.0f} GB/s, read bandwidth {result['read_gbps']:.0f} GB/s). **Kernel time** is the GPU "
             "time per call with calls queued back to back (warm L2); **call time** is one Python call on an idle GPU, "
             "host overhead included; **cold-L2** is the kernel time after an L2 flush, where q, k, v fit in L2. "
             + (f"The kernels of each configuration, ours and the peers, are timed side by side in {result['rounds']} "
                "rounds; each row is its median round, and a ratio is the median over the rounds of peer kernel time / "
                "our kernel time within a round: above 1 is faster. " if result.get("rounds") else
                "Ratios are peer kernel time / our kernel time: above 1 is faster. ")
             + f"Correctness is checked on the last {result['check_rows']} query rows of two heads of the timed outputs. "
             "A peer marked *not run* has no kernel for that input (SDPA's flash and cuDNN backends take 16-bit inputs "
             "only; the message is torch's). A call time can come out below the kernel time: the kernel time is taken "
             "with calls back to back, at the clock the GPU's power limit allows under that load, the call time from "
             "one call on an idle GPU, which starts at its top clock.",
             "", f"**llm.c's shape** (B={s['B']}, H={s['H']}, T={s['T']}, d={s['d']}, causal):", ""]
    lines += _markdown(llmc_table(result))
    L = result["long"]
    lines += ["", f"**Long sequences, flash2_mma** ({L['dtype']}, B={L['B']}, H={L['H']}):", ""]
    lines += _markdown(long_table(result))
    if result.get("overhead"):
        lines += ["", f"**Launcher overhead** (host time per call on a tiny input, B={OVERHEAD_SHAPE['B']}, "
                  f"H={OVERHEAD_SHAPE['H']}, T={OVERHEAD_SHAPE['T']}, d={OVERHEAD_SHAPE['d']}):", ""]
        lines += _markdown(overhead_table(result))
    return "\n".join(lines)


PLOT_PATH = ROOT / "results" / "tflops.png"  # the README's picture of the long suite


def plot_long(result: dict, path: Path = PLOT_PATH) -> Path:
    """TFLOP/s (kernel time) against T for every fp16 row of the long suite, one panel per (d, causal): the README's plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["suite"] == "long" and r.get("tflops")]
    ds = sorted({r["d"] for r in rows})
    fig, axes = plt.subplots(len(ds), 2, figsize=(10, 3.2 * len(ds)), sharex=True, squeeze=False)
    for i, d in enumerate(ds):
        for j, causal in enumerate((True, False)):
            ax = axes[i][j]
            sel = [r for r in rows if r["d"] == d and r["causal"] == causal]
            for name in sorted({r["name"] for r in sel}):
                pts = sorted((r["T"], r["tflops"]) for r in sel if r["name"] == name)
                ours = any(r["kind"] == "ours" for r in sel if r["name"] == name)
                ax.plot(*zip(*pts), marker="o", linestyle="-" if ours else "--", label=name)
            ax.set_xscale("log", base=2)
            ax.set_title(f"d={d}, {'causal' if causal else 'not causal'}")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            if i == len(ds) - 1:
                ax.set_xlabel("T (B=%d, H=%d, %s)" % (result["long"]["B"], result["long"]["H"], result["long"]["dtype"]))
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Kernel time as TFLOP/s on {result['gpu']} (solid: the course's kernels; dashed: torch SDPA)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def update_readme(readme: Path, result: dict) -> None:
    """Rewrite the README's tables between its markers from `result`, and draw the plot they point at."""
    text = readme.read_text()
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    plot = plot_long(result)
    figure = f"\n\n![TFLOP/s against sequence length]({plot.relative_to(ROOT).as_posix()})\n"
    readme.write_text(text[:start] + "\n" + markdown_tables(result) + figure + text[end:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m kernels.bench", description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=("all", "llmc", "long"), default="all")
    p.add_argument("--quick", action="store_true", help=f"long suite at T in {QUICK_T} only")
    p.add_argument("--variants", nargs="*", help=f"variants to run (default: all of {sorted(REGISTRY)})")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench.json")
    p.add_argument("--update-readme", action="store_true", help="rewrite README.md's results tables from --out")
    args = p.parse_args(argv)
    unknown = [n for n in args.variants or () if n not in REGISTRY]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {sorted(REGISTRY)}")
    reason = gpu_unavailable_reason()
    if reason is not None:
        if args.update_readme and args.out.exists():
            update_readme(ROOT / "README.md", json.loads(args.out.read_text()))
            print(f"README.md results tables rewritten from {args.out}")
            return 0
        print(f"kernels.bench needs a CUDA GPU: {reason}")
        return 2
    suites = ("llmc", "long") if args.suite == "all" else (args.suite,)
    result = run(suites, quick=args.quick, variants=args.variants, out_path=args.out)
    print(f"\n{result['gpu']}; copy bandwidth {result['copy_gbps']:.0f} GB/s, read {result['read_gbps']:.0f} GB/s")
    print("\nlauncher host overhead (tiny input):")
    print(format_table(overhead_table(result)))
    if "llmc" in suites:
        print(f"\nllm.c shape {result['llmc_shape']}, causal:")
        print(format_table(llmc_table(result)))
    if "long" in suites:
        print("\nlong sequences, fp16, flash2_mma against SDPA:")
        print(format_table(long_table(result)))
    print(f"\nwritten: {args.out}")
    if args.update_readme:
        update_readme(ROOT / "README.md", result)
        print("README.md results tables rewritten")
    ok = all(r["ok"] for r in result["rows"] if r["kind"] == "ours" and "ok" in r)
    return 0 if ok else 1

