"""Check and time every attention variant of the course beside PyTorch: `python3 -m kernels.bench`.

Two suites, each timed in one run with the peers on the same inputs:

  llmc   llm.c's benchmark shape (B=8, H=12, T=1024, d=64, causal), float32 and float16: every registered
         variant that takes the dtype, torch SDPA's flash / cuDNN / efficient / math backends, and the
         cuBLAS paths (registered variants too).
  long   the long-sequence grid: fp16, B=4, H=32, T in {1024, 4096, 16384}, d in {64, 128}, causal and not:
         the fp16 variants against SDPA flash (FlashAttention-2), cuDNN and efficient.

Every row carries a correctness line against the float64 reference (llmc: a ragged causal shape with
poisoned outputs; long: the last 128 query rows of the first and the last head of the timed inputs), the
median time (CUDA events), TFLOP/s, GB/s (the compulsory bytes: q, k, v read once, o written once) and the
ratio to the best peer of the same run. Results go to results/bench.json; --update-readme rewrites the
README's results tables from that file, so they are regenerated, never typed.

    python3 -m kernels.bench                       # both suites (about two minutes on an H100)
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

from . import REGISTRY, attention_bytes, attention_flops, benchmark, check, format_table, gpu_name, gpu_unavailable_reason
from ._core import cp

ROOT = Path(__file__).resolve().parents[1]
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
CHECK_ROWS = 128  # query rows checked per head in the long suite
# Published llm.c dev/cuda/attention_forward.cu times on the H100 lent to this course (GUIDE.md), B=8 T=1024
# C=768 NH=12 causal, best block size. They are not re-measured here; the progression chart shows them beside ours.
LLMC_PUBLISHED_MS = {"v1 naive": 77.8, "v2 naive flash": 237.0, "v3 cuBLAS + softmax": 1.23,
                     "v4 fused online softmax": 0.606, "v5 fp16 GEMMs": 0.363, "v6 v5 without permutes": 0.279}


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


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy of `nbytes` (read + write counted): the roofline's memory ceiling."""
    src = cp.ones(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = benchmark(lambda: cp.copyto(dst, src))
    del src, dst
    return t.gbps(2 * nbytes)


# ---------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------

def _inputs(B, H, T, d, dtype, seed):
    import reference as R

    return tuple(cp.asarray(x.astype(dtype)) for x in R.make_qkv(B, H, T, d, seed=seed))


def _check_small(variant, dtype) -> str:
    """The correctness line of a variant on a ragged causal shape (Tq=100, Tk=257), outputs poisoned."""
    import reference as R
    from .check import poisoned_allocations

    d = min(64, variant.max_d)
    q, k, v = (cp.asarray(x.astype(dtype)) for x in R.make_qkv(2, 3, 100, d, 257, seed=1))
    with poisoned_allocations():
        o = variant.forward(q, k, v, causal=True)
    host = [x.get().astype(np.float64) for x in (q, k, v)]
    return str(check(o, R.attention(*host, causal=True), variant.tolerance_class(dtype)))


def _check_rows(o, q, k, v, causal, tol_class) -> str:
    """Check the last CHECK_ROWS query rows of heads (0, 0) and (B-1, H-1) against the float64 reference.

    With bottom-right causal alignment the last rows of a head are a problem of their own (Tq' = CHECK_ROWS,
    the same keys), so the reference needs only CHECK_ROWS x Tk scores per head."""
    import reference as R

    B, H, T = q.shape[:3]
    n = min(CHECK_ROWS, T)
    outs, refs = [], []
    for b, h in {(0, 0), (B - 1, H - 1)}:
        host = [x[b, h].get().astype(np.float64)[None, None] for x in (q[:, :, T - n:], k, v)]
        refs.append(R.attention(*host, causal=causal))
        outs.append(o[b, h, T - n:].get()[None, None])
    return str(check(np.concatenate(outs), np.concatenate(refs), tol_class))


def _row(suite, name, kind, dtype, shape, causal, t, correct, note=""):
    B, H, T, d = shape
    row = dict(suite=suite, name=name, kind=kind, dtype=dtype, B=B, H=H, T=T, d=d, causal=causal, correct=correct,
               note=note)
    if t is not None:
        itemsize = np.dtype(dtype).itemsize
        row.update(ms=t.ms, tflops=t.tflops(attention_flops(B, H, T, T, d, causal)),
                   gbps=t.gbps(attention_bytes(B, H, T, T, d, itemsize)))
    return row


def _add_ratios(rows):
    """ratio_best_peer (peer ms / our ms, > 1 is faster than every peer) and ratio_<peer> per configuration."""
    key = lambda r: (r["suite"], r["dtype"], r["B"], r["H"], r["T"], r["d"], r["causal"])  # noqa: E731
    for _, group in itertools.groupby(sorted(rows, key=key), key=key):
        group = list(group)
        peers = {r["name"]: r["ms"] for r in group if r["kind"] == "peer" and "ms" in r}
        if not peers:
            continue
        best = min(peers, key=peers.get)
        for r in group:
            if "ms" in r:
                r["best_peer"] = best
                r["ratio_best_peer"] = peers[best] / r["ms"]
                for p, ms in peers.items():
                    r[f"ratio_{p}"] = ms / r["ms"]
    return rows


def _time_peers(rows, suite, dtype, shape, causal, q, k, v, peers, log):
    for p in peers:
        fn, why = sdpa_peer(p, q, k, v, causal)
        if fn is None:
            rows.append(_row(suite, p, "peer", dtype, shape, causal, None, "", note=f"not run: {why}"))
            log(f"  {p:16s} not run: {why}")
            continue
        t = benchmark(fn)
        rows.append(_row(suite, p, "peer", dtype, shape, causal, t, ""))
        log(f"  {p:16s} {t.ms:8.3f} ms")


def run_llmc(dtypes=LLMC_DTYPES, variants=None, log=print) -> list[dict]:
    """Every variant (or `variants`) at llm.c's shape for each dtype, with the SDPA backends of that dtype."""
    shape = tuple(LLMC_SHAPE.values())
    B, H, T, d = shape
    rows = []
    for dtype in dtypes:
        log(f"llm.c shape B={B} H={H} T={T} d={d} causal, {dtype}")
        q, k, v = _inputs(B, H, T, d, dtype, seed=2)
        _time_peers(rows, "llmc", dtype, shape, True, q, k, v, SDPA_BACKENDS, log)
        for name in variants or sorted(REGISTRY):
            var = REGISTRY[name]
            if dtype not in var.dtypes or d > var.max_d:
                continue
            correct = _check_small(var, dtype)
            t = benchmark(lambda: var.forward(q, k, v, causal=True))
            rows.append(_row("llmc", name, "ours", dtype, shape, True, t, correct))
            log(f"  {name:16s} {t.ms:8.3f} ms  {correct}")
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
        _time_peers(rows, "long", dtype, shape, causal, q, k, v, peers, log)
        for name in names:
            var = REGISTRY[name]
            if d > var.max_d:
                continue
            try:
                o = var.forward(q, k, v, causal=causal)
            except ValueError as e:  # e.g. cuBLAS attention's score matrix does not fit in memory
                rows.append(_row("long", name, "ours", dtype, shape, causal, None, "", note=f"not run: {e}"[:160]))
                log(f"  {name:16s} not run: {str(e)[:100]}")
                continue
            correct = _check_rows(o, q, k, v, causal, var.tolerance_class(dtype))
            del o
            t = benchmark(lambda: var.forward(q, k, v, causal=causal))
            rows.append(_row("long", name, "ours", dtype, shape, causal, t, correct))
            log(f"  {name:16s} {t.ms:8.3f} ms  {correct}")
        del q, k, v
        cp.get_default_memory_pool().free_all_blocks()
    return _add_ratios(rows)


def run(suites=("llmc", "long"), quick=False, variants=None, out_path: Path | None = None, log=print) -> dict:
    result = {"gpu": gpu_name(), "llmc_shape": LLMC_SHAPE, "long": {k: LONG[k] for k in ("B", "H", "dtype")},
              "copy_gbps": copy_bandwidth(), "llmc_published_ms": LLMC_PUBLISHED_MS, "rows": []}
    if "llmc" in suites:
        result["rows"] += run_llmc(variants=variants, log=log)
    if "long" in suites:
        result["rows"] += run_long(T_values=QUICK_T if quick else LONG["T"], variants=variants, log=log)
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1))
    return result


# ---------------------------------------------------------------------------------------------------------
# Tables (the command line's and the README's), from a result dict
# ---------------------------------------------------------------------------------------------------------

def _fmt(x, f):
    return format(x, f) if isinstance(x, (int, float)) else ""


def llmc_table(result: dict) -> list[dict]:
    rows = [r for r in result["rows"] if r["suite"] == "llmc"]
    return [dict(variant=r["name"], dtype=r["dtype"], correct=r["correct"] or ("peer" if r["kind"] == "peer" else ""),
                 ms=_fmt(r.get("ms"), ".3f"), tflops=_fmt(r.get("tflops"), ".1f"), gbps=_fmt(r.get("gbps"), ".0f"),
                 vs_best_peer=(f"{r['ratio_best_peer']:.2f}x ({r['best_peer']})" if "ratio_best_peer" in r else r["note"]))
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
        out.append({"d": d, "causal": "no" if full else "yes", "T": T, "correct": ours["correct"],
                    f"{name} ms": _fmt(ours.get("ms"), ".3f"), "TFLOP/s": _fmt(ours.get("tflops"), ".0f"),
                    **{f"{p} TFLOP/s": _fmt(by[p].get("tflops"), ".0f") for p in ("sdpa_flash", "sdpa_cudnn") if p in by},
                    "vs flash": _fmt(ours.get("ratio_sdpa_flash"), ".2f"), "vs cuDNN": _fmt(ours.get("ratio_sdpa_cudnn"), ".2f")})
    return out


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
    lines = [f"Measured on {result['gpu']} by `python3 -m kernels.bench` (median of 20 runs, CUDA events; peers in the same "
             f"run; copy bandwidth {result['copy_gbps']:.0f} GB/s). Ratios are peer time / our time: above 1 is faster.",
             "", f"**llm.c's shape** (B={s['B']}, H={s['H']}, T={s['T']}, d={s['d']}, causal):", ""]
    lines += _markdown(llmc_table(result))
    L = result["long"]
    lines += ["", f"**Long sequences, flash2_mma** ({L['dtype']}, B={L['B']}, H={L['H']}; correctness on the last "
              f"{CHECK_ROWS} query rows of two heads):", ""]
    lines += _markdown(long_table(result))
    return "\n".join(lines)


def update_readme(readme: Path, result: dict) -> None:
    text = readme.read_text()
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    readme.write_text(text[:start] + "\n" + markdown_tables(result) + "\n" + text[end:])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    print(f"\n{result['gpu']}; copy bandwidth {result['copy_gbps']:.0f} GB/s")
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
    ok = all(r["correct"].endswith("True") for r in result["rows"] if r["kind"] == "ours" and r["correct"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
