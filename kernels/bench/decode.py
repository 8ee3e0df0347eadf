"""Time the decoding kernels beside torch SDPA on the same KV caches: `python3 -m kernels.bench.decode`.

Five shapes, all float16, d = 128, one new token per sequence (Tq = 1), every sequence at its full length L so that
SDPA (which has no per-sequence lengths) computes the same thing:

    B=1  Hq=32 Hkv=32 L=4096      batch 1, multi-head
    B=1  Hq=32 Hkv=8  L=32768     batch 1, GQA, long
    B=16 Hq=32 Hkv=8  L=4096      GQA
    B=64 Hq=32 Hkv=8  L=2048      GQA, large batch
    B=16 Hq=32 Hkv=32 L=8192      multi-head, 2 GiB of cache

For each shape and each of our kernels (decode_ft in the plain and in FasterTransformer's key layout; decode_split's
CUDA-core kernel and its tensor-core kernel decode_split_mma, each on a contiguous and on a paged cache) and each SDPA backend (flash, cuDNN, efficient; F.scaled_dot_product_attention(q, k,
v, enable_gqa=True) where Hq != Hkv; a backend that refuses is recorded as "not run: <its reason>"):

    kernel us        GPU time per call (kernels.core.timing.benchmark: calls queued back to back behind a hold kernel); all
                     the kernels of a shape are timed side by side in ROUNDS rounds (kernels.compare) and each row
                     is its median round (`rounds_us`: every round)
    call us          one Python call on an idle GPU, host overhead included
    cold-L2 us       kernel time after an L2 flush, where the cache fits in L2 (none of the shapes above does)
    GB/s             KV-cache bytes (2 * B * Hkv * L * d * 2) per second of kernel time
    % of read bw     that, as a fraction of kernels.core.timing.read_bandwidth_gbps() measured in the same run
    vs flash, vs cuDNN   SDPA's kernel time / ours within a round, the median over the rounds (above 1: ours is faster)
    correct          our output for the first and the last sequence (every head) against reference.decode_attention

and one more row per shape, "pure read (same bytes)": kernels.core.timing.read_call, a kernel that only reads as many bytes as
the cache holds, timed the same way. It is the ceiling at that size: launching, ramping up and draining cost a few
microseconds whatever the size, so where the cache is read in tens of microseconds this row sits below the read bandwidth
(measured on 1 GiB).

And, on a tiny cache, each launcher's call time and its host overhead (kernels.core.timing.host_overhead_us; the best
of three interleaved rounds; the target is a call time below 20 us). Results go to results/decode.json, numbers as numbers.

    python3 -m kernels.bench.decode                    # everything (a few minutes on an H100)
    python3 -m kernels.bench.decode --shapes 0 2       # some of the shapes
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

from .common import ROOT, gpu_missing, save_result
from ..core import benchmark, check, format_table, gpu_name
from ..core import cp
from .attention import OVERHEAD_ROUNDS
from ..core.timing import compare, fits_in_l2, host_overhead_us, paired_ratio, read_bandwidth_gbps, read_call

SHAPES = [dict(B=1, Hq=32, Hkv=32, L=4096), dict(B=1, Hq=32, Hkv=8, L=32768), dict(B=16, Hq=32, Hkv=8, L=4096),
          dict(B=64, Hq=32, Hkv=8, L=2048), dict(B=16, Hq=32, Hkv=32, L=8192)]
D = 128
DTYPE = "float16"
PAGE_SIZE = 64  # the paged rows of decode_split
FT_LAYOUT_TPK = 1  # FasterTransformer's threads per key for long caches, with its key layout
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_efficient": "EFFICIENT_ATTENTION"}
CALL_TARGET_US = 20.0
HOST_SHAPE = dict(B=1, Hq=8, Hkv=8, L=64)  # tiny: the call time is the launcher's own cost
READ_ROW = "pure read (same bytes)"  # the ceiling row of each shape (kernels.core.timing.read_call)
ROUNDS = 3  # rounds of kernels.compare per shape: every kernel of the shape timed once per round, side by side


def kv_bytes(B: int, Hkv: int, L: int, d: int = D, itemsize: int = 2) -> int:
    """Bytes of K and V a decoding step must read: 2 * B * Hkv * L * d * itemsize."""
    return 2 * B * Hkv * L * d * itemsize


def make_inputs(B: int, Hq: int, Hkv: int, L: int, *, d: int = D, dtype: str = DTYPE, seed: int = 0,
                page_size: int | None = PAGE_SIZE) -> dict:
    """q (B, Hq, 1, d), contiguous caches (B, Hkv, L, d) full to L, seqlens = L; with page_size also the same cache as a
    shuffled page pool and its block table. Drawn on the GPU (the largest shape has 2 GiB of cache)."""
    rng = cp.random.default_rng(seed)
    draw = lambda *shape: rng.standard_normal(shape, dtype=cp.float32).astype(dtype)  # noqa: E731
    x = dict(q=draw(B, Hq, 1, d), k=draw(B, Hkv, L, d), v=draw(B, Hkv, L, d),
             seqlens=cp.full(B, L, dtype=cp.int32), B=B, Hq=Hq, Hkv=Hkv, L=L, d=d)
    if page_size is not None and L % page_size == 0:
        n = L // page_size
        perm = cp.asarray(np.random.default_rng(seed).permutation(B * n).astype(np.int32))

        def pool(c):
            pages = c.reshape(B, Hkv, n, page_size, d).transpose(0, 2, 1, 3, 4).reshape(B * n, Hkv, page_size, d)
            out = cp.empty(pages.shape, dtype=pages.dtype)  # C-contiguous (empty_like would keep the strides)
            out[perm] = pages  # logical page j of sequence b -> physical page perm[b * n + j]
            return out

        x.update(k_pages=pool(x["k"]), v_pages=pool(x["v"]), table=perm.reshape(B, n))
    return x


def our_kernels(x: dict) -> dict:
    """name -> zero-argument callable, for each of our decoding paths on the inputs x."""
    from ..inference import decode_ft, decode_split

    runs = {"decode_ft": lambda: decode_ft.decode(x["q"], x["k"], x["v"], x["seqlens"])}
    if "k_ft" not in x:
        x["k_ft"] = decode_ft.to_ft_layout(x["k"])
    runs["decode_ft (FT layout, 1 thread/key)"] = lambda: decode_ft.decode(
        x["q"], x["k_ft"], x["v"], x["seqlens"], threads_per_key=FT_LAYOUT_TPK)
    for name, tc in (("decode_split", False), ("decode_split_mma", True)):
        runs[name] = lambda tc=tc: decode_split.decode(x["q"], x["k"], x["v"], x["seqlens"], tensor_cores=tc)
        if "table" in x:
            runs[f"{name} (paged, {PAGE_SIZE})"] = lambda tc=tc: decode_split.decode(
                x["q"], x["k_pages"], x["v_pages"], x["seqlens"], block_table=x["table"], tensor_cores=tc)
    return runs


def sdpa_peers(x: dict) -> dict:
    """name -> (callable, None) or (None, reason) for each SDPA backend on the same memory (DLPack, no copy)."""
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        return {name: (None, f"torch is not installed ({e})") for name in SDPA_BACKENDS}
    qt, kt, vt = (torch.from_dlpack(x[n]) for n in ("q", "k", "v"))
    gqa = x["Hq"] != x["Hkv"]
    out = {}
    for name, member in SDPA_BACKENDS.items():
        backend = getattr(SDPBackend, member)

        def run(backend=backend):
            with sdpa_kernel(backend):
                if gqa:
                    return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
                return F.scaled_dot_product_attention(qt, kt, vt)

        with warnings.catch_warnings(record=True) as said:  # torch explains a refusal in warnings, then raises
            warnings.simplefilter("always")
            try:
                run()
                torch.cuda.synchronize()
                out[name] = (run, None)
            except RuntimeError as e:
                why = [(str(e).strip().splitlines() or ["RuntimeError"])[0]]
                why += [str(w.message).strip().splitlines()[0] for w in said if "because" in str(w.message)][:2]
                out[name] = (None, "; ".join(why)[:240])
    return out


def check_rows(o, x: dict) -> str:
    """Our o for the first and the last sequence, every head, against reference.decode_attention (float64)."""
    import reference as R

    idx = sorted({0, x["B"] - 1})
    host = [x[n][idx].get().astype(np.float64) for n in ("q", "k", "v")]
    ro, _ = R.decode_attention(*host, x["seqlens"][idx].get())
    return str(check(o[idx], ro, DTYPE))


def measure(x: dict, *, peers: bool = True, correctness: bool = True, read_gbps: float | None = None,
            log=print) -> list[dict]:
    """One row per kernel and peer on the inputs x (see the module docstring for the columns)."""
    shape = {k: x[k] for k in ("B", "Hq", "Hkv", "L", "d")}
    nbytes = kv_bytes(x["B"], x["Hkv"], x["L"], x["d"])
    flush = fits_in_l2(nbytes)
    rows = []

    def row(name, kind, t, correct="", note=""):
        r = dict(shape, name=name, kind=kind, kv_bytes=nbytes, correct=correct, note=note)
        if t is not None:
            r.update(kernel_us=t.ms * 1e3, kernel_min_us=t.min_ms * 1e3, kernel_max_us=t.max_ms * 1e3,
                     call_us=t.call_ms * 1e3, cold_l2_us=None if t.flushed_ms is None else t.flushed_ms * 1e3,
                     gbps=t.gbps(nbytes))
            if read_gbps:
                r["frac_read_bw"] = r["gbps"] / read_gbps
        rows.append(r)
        return r

    # Every kernel of this shape, ours, the peers and the pure read, timed side by side in ROUNDS rounds (kernels.compare),
    # so that the ratios come from the same rounds. The pure read is the ceiling at this size: launching, ramping up and
    # draining cost it time too, so on a small cache it stays below read_gbps.
    entries = []  # (name, kind, callable or None, correct, note), in table order
    for name, fn in our_kernels(x).items():
        entries.append((name, "ours", fn, check_rows(fn(), x) if correctness else "", ""))
    if peers:
        for name, (fn, why) in sdpa_peers(x).items():
            entries.append((name, "peer", fn, "", "" if fn is not None else f"not run: {why}"))
    read = read_call(nbytes)
    entries.append((READ_ROW, "ceiling", read, "", ""))
    timings = compare({name: fn for name, _, fn, _, _ in entries if fn is not None}, rounds=ROUNDS, flush_l2=flush)
    del read
    for name, kind, fn, correct, note in entries:
        if fn is None:
            row(name, kind, None, note=note)
            log(f"  {name:38s} {note}")
            continue
        r = row(name, kind, timings[name], correct)
        r["rounds_us"] = [ms * 1e3 for ms in timings[name].rounds]
        for p in ("sdpa_flash", "sdpa_cudnn"):
            r[f"ratio_{p}"] = paired_ratio(timings[name], timings[p]) if p in timings else None
        log(f"  {name:38s} {r['kernel_us']:9.1f} us  call {r['call_us']:7.1f} us  {r['gbps']:6.0f} GB/s  {correct}")
    return rows


def host_costs(log=print) -> list[dict]:
    """Each launcher's call time and host overhead on a tiny cache (HOST_SHAPE). The launchers are measured in
    OVERHEAD_ROUNDS rounds, one after another within each round, and each keeps its best round (as
    kernels.bench.launcher_overhead does): the host drifts by tens of percent over seconds, and interleaving keeps that
    drift from favouring whichever launcher ran in a quiet moment."""
    x = make_inputs(**HOST_SHAPE, page_size=16)
    fns = our_kernels(x)
    best = {}
    for r in range(OVERHEAD_ROUNDS):
        for name, fn in fns.items():
            host = host_overhead_us(fn, warmup=1000 if r == 0 else 200)
            t = benchmark(fn)
            call, kern, old_host = best.get(name, (float("inf"), float("inf"), float("inf")))
            best[name] = (min(call, t.call_ms * 1e3), min(kern, t.ms * 1e3), min(old_host, host))
    out = []
    for name, (call, kern, host) in best.items():
        out.append(dict(name=name, **HOST_SHAPE, call_us=call, kernel_us=kern, host_overhead_us=host,
                        target_us=CALL_TARGET_US, call_below_target=bool(call < CALL_TARGET_US)))
        log(f"  {name:38s} call {call:6.1f} us, host {host:6.1f} us, kernel {kern:6.1f} us")
    return out


def run(shapes=range(len(SHAPES)), out_path: Path | None = None, log=print) -> dict:
    read_gbps = read_bandwidth_gbps()
    log(f"{gpu_name()}: read bandwidth {read_gbps:.0f} GB/s")
    result = {"gpu": gpu_name(), "dtype": DTYPE, "d": D, "Tq": 1, "read_gbps": read_gbps, "page_size": PAGE_SIZE,
              "shapes": [SHAPES[i] for i in shapes], "rows": []}
    for i in shapes:
        s = SHAPES[i]
        log(f"B={s['B']} Hq={s['Hq']} Hkv={s['Hkv']} L={s['L']} d={D} {DTYPE}, KV {kv_bytes(s['B'], s['Hkv'], s['L']) / 2**20:.0f} MiB")
        x = make_inputs(**s, seed=i)
        result["rows"] += measure(x, read_gbps=read_gbps, log=log)
        del x
        cp.get_default_memory_pool().free_all_blocks()
    log("launch cost on a tiny cache:")
    result["host"] = host_costs(log=log)
    return save_result(result, out_path)


def table(result: dict) -> list[dict]:
    """The results table (one row per shape and kernel), for the command line and notebooks/08."""
    out = []
    for r in result["rows"]:
        shape = f"B={r['B']} Hq={r['Hq']} Hkv={r['Hkv']} L={r['L']}"
        if "kernel_us" not in r:
            out.append({"shape": shape, "kernel": r["name"], "kernel us": "", "call us": "", "GB/s": "",
                        "% read bw": "", "vs flash": "", "vs cuDNN": "", "correct": r["note"][:60]})
            continue
        fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
        out.append({"shape": shape, "kernel": r["name"], "kernel us": fmt(r["kernel_us"], ".1f"),
                    "call us": fmt(r["call_us"], ".1f"), "GB/s": fmt(r["gbps"], ".0f"),
                    "% read bw": fmt(100 * r["frac_read_bw"] if "frac_read_bw" in r else None, ".0f"),
                    "vs flash": fmt(r.get("ratio_sdpa_flash"), ".2f"), "vs cuDNN": fmt(r.get("ratio_sdpa_cudnn"), ".2f"),
                    "correct": r["correct"] or r["kind"]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m kernels.bench.decode", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="*", type=int, default=list(range(len(SHAPES))),
                   help=f"indices into SHAPES (0..{len(SHAPES) - 1})")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "decode.json")
    args = p.parse_args(argv)
    if any(not 0 <= i < len(SHAPES) for i in args.shapes):
        p.error(f"shape indices must lie in [0, {len(SHAPES) - 1}]; got {args.shapes}")
    missing = gpu_missing("python3 -m kernels.bench.decode")
    if missing is not None:
        return missing
    result = run(args.shapes, out_path=args.out)
    print()
    print(format_table(table(result)))
    print()
    print(format_table([{k: v for k, v in h.items() if k not in ("B", "Hq", "Hkv", "L")} for h in result["host"]]))
    print(f"\nwritten: {args.out}")
    ok = all(r["correct"].endswith("True") for r in result["rows"] if r["kind"] == "ours")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
