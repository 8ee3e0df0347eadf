"""Time the sampling kernels beside plain torch on the same logits: `python3 -m kernels.bench.sampling`.

For each batch B in (1, 64, 256) and vocabulary V in (32000, 128256, 256000), float32 logits (std 2), four pairs,
ours and torch's usual way of doing the same thing; all of a shape's callables (ours for each method, and each of
torch's once) timed side by side in ROUNDS rounds (kernels.compare):

    top-p 0.9     ours: sample(x, top_p=0.9) (no sort: the crossing logit bracketed by mass, then the draw)
                  torch: softmax, sort descending, cumsum, mask after the crossing token, multinomial, gather
    top-k 50      ours: sample(x, top_k=50) (the 50th logit bracketed by counts, then the draw among the 50)
                  torch: topk(50), softmax of the 50, multinomial, gather
    top-k 50 lists  ours: sample(x, top_k=50, top_k_method="lists") (FasterTransformer's two stages, then the draw)
                  torch: the same as for top-k 50
    plain         ours: sample(x) (p = 1: max and sum, then one sampling pass)
                  torch: softmax, multinomial

    kernel        which of ours ran: sample_cluster<CS> (sm_90: a cluster of CS blocks per row holds the row in shared
                  memory, read from HBM once) or sample_threshold (one block per row, the logits read from HBM on
                  every pass), as sampling.cluster_plan picks them; --cluster N forces sample_cluster<N>, --cluster 0
                  sample_threshold (for comparing the two on the same shapes)
    kernel us     GPU time per call (kernels.benchmark: calls queued back to back behind a hold kernel), the median
                  round of the ROUNDS (`ours_rounds_us`, `torch_rounds_us`: the kernel us of every round)
    call us       one Python call on an idle GPU, host overhead included
    reads         kernel time / the time of one read of the logits (B * V * 4 bytes) at the read bandwidth measured
                  in the same run (kernels.core.timing.read_bandwidth_gbps): 1.0 would be a single pass at full bandwidth
    speedup       torch's kernel time / ours within a round, the median over the rounds (kernels.paired_ratio; above 1:
                  ours is faster); the targets are judged on it
    correct       ours: the tokens of the first and the last row equal the float64 reference's for the same seed
                  (or the uniform lies within float32 rounding of a CDF boundary)

Targets of the course: top-p >= 10x torch's sort-based top-p at B >= 64 and >= 5x at B = 1; top-k >= 3x torch.
Results go to results/bench-sampling.json, numbers as numbers.

    python3 -m kernels.bench.sampling                     # everything
    python3 -m kernels.bench.sampling --batches 1 64 --vocabs 128256
    python3 -m kernels.bench.sampling --cluster 0         # the one-block kernel for the threshold method
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from .common import ROOT, gpu_missing, save_result
from ..core import format_table, gpu_name
from ..sampling import sampling as SM
from ..core.timing import compare, paired_ratio

BATCHES = (1, 64, 256)
VOCABS = (32000, 128256, 256000)
TOP_P, TOP_K, SEED = 0.9, 50, 1234
PAIRS = (("top-p 0.9", "threshold (no sort)", "torch sort top-p"),
         ("top-k 50", "threshold (by counts)", "torch topk(50) + multinomial"),
         ("top-k 50 lists", "topk_stage1 + topk_sample", "torch topk(50) + multinomial"),
         ("plain", "threshold (p = 1)", "torch multinomial"))
TARGETS = {"top-p 0.9": lambda B: 10.0 if B >= 64 else 5.0, "top-k 50": lambda B: 3.0,
           "top-k 50 lists": lambda B: 3.0, "plain": lambda B: None}
KWARGS = {"top-p 0.9": dict(top_p=TOP_P), "top-k 50": dict(top_k=TOP_K),
          "top-k 50 lists": dict(top_k=TOP_K, top_k_method="lists"), "plain": {}}
ROUNDS = 3  # rounds of kernels.compare per shape: each of ours and of torch's timed once per round, side by side


def make_logits(B: int, V: int, seed: int = 0):
    import cupy as cp

    rng = cp.random.default_rng(seed)
    return (rng.standard_normal((B, V), dtype=cp.float32) * 2).astype(cp.float32)


def _kwargs(method: str, cluster=None) -> dict:
    """sample()'s keywords for a method; cluster (None: automatic) applies to the threshold method only."""
    kw = dict(KWARGS[method])
    if cluster is not None and kw.get("top_k_method", "threshold") == "threshold":
        kw["cluster"] = cluster
    return kw


def kernel_name(B: int, V: int, method: str, cluster=None) -> str:
    """The kernel(s) of ours for this shape and method."""
    kw = _kwargs(method, cluster)
    if "cluster" in kw:
        return "sample_threshold" if kw["cluster"] == 0 else f"sample_cluster<{kw['cluster']}>"
    return " + ".join(SM.kernels_used(kw.get("top_k", 0), V, kw.get("top_k_method", "threshold"), rows=B,
                                      top_p=kw.get("top_p", 1.0)))


def ours(x, cluster=None) -> dict:
    return {method: (lambda kw=_kwargs(method, cluster): SM.sample(x, seed=SEED, **kw)) for method in KWARGS}


def torch_peers(x) -> dict:
    import torch

    xt = torch.from_dlpack(x)

    def top_p():
        probs = torch.softmax(xt, dim=-1)
        sp, si = torch.sort(probs, dim=-1, descending=True)
        cum = torch.cumsum(sp, dim=-1)
        sp = sp.masked_fill(cum - sp > TOP_P, 0.0)  # keep up to and including the crossing token
        return si.gather(-1, torch.multinomial(sp, 1))

    def top_k():
        v, i = torch.topk(xt, TOP_K, dim=-1)
        return i.gather(-1, torch.multinomial(torch.softmax(v, dim=-1), 1))

    def plain():
        return torch.multinomial(torch.softmax(xt, dim=-1), 1)

    return {"top-p 0.9": top_p, "top-k 50": top_k, "top-k 50 lists": top_k, "plain": plain}


def check_tokens(x, method: str, cluster=None) -> bool:
    """Our tokens of the first and the last row against the float64 reference for the same seed."""
    import reference as R

    kw = _kwargs(method, cluster)
    rows = sorted({0, x.shape[0] - 1})
    tokens = SM.sample(x, seed=SEED, **kw).get()[rows]
    host = x[rows].get().astype(np.float64)
    probs, _ = R.sampling_probs(host, top_k=kw.get("top_k", 0), top_p=kw.get("top_p", 1.0))
    u = R.philox_uniform(SEED, np.asarray(rows))
    ref = R.sample_from(probs, u)
    return bool(((tokens == ref) | (R.cdf_margin(probs, u) < 1e-5)).all())


def measure(B: int, V: int, read_gbps: float, log=print, cluster=None) -> list[dict]:
    x = make_logits(B, V)
    read_us = B * V * 4 / (read_gbps * 1e3)
    mine, peers = ours(x, cluster), torch_peers(x)
    fns = {}
    for method, _, torch_name in PAIRS:
        fns[("ours", method)] = mine[method]
        fns.setdefault(("torch", torch_name), peers[method])  # the two top-k rows share their peer: timed once
    timings = compare(fns, rounds=ROUNDS)
    rows = []
    for method, our_name, torch_name in PAIRS:
        t_ours, t_torch = timings[("ours", method)], timings[("torch", torch_name)]
        target = TARGETS[method](B)
        speedup = paired_ratio(t_ours, t_torch)
        row = {"B": B, "V": V, "method": method, "ours": our_name, "kernel": kernel_name(B, V, method, cluster),
               "peer": torch_name,
               "ours_kernel_us": t_ours.ms * 1e3, "ours_call_us": t_ours.call_ms * 1e3,
               "torch_kernel_us": t_torch.ms * 1e3, "torch_call_us": t_torch.call_ms * 1e3,
               "ours_rounds_us": [ms * 1e3 for ms in t_ours.rounds],
               "torch_rounds_us": [ms * 1e3 for ms in t_torch.rounds],
               "read_us": read_us, "ours_reads": t_ours.ms * 1e3 / read_us, "torch_reads": t_torch.ms * 1e3 / read_us,
               "speedup": speedup, "target": target, "target_met": None if target is None else bool(speedup >= target),
               "correct": check_tokens(x, method, cluster)}
        rows.append(row)
        log(f"B={B} V={V} {method} ({row['kernel']}): ours {row['ours_kernel_us']:.1f} us, "
            f"torch {row['torch_kernel_us']:.1f} us, {speedup:.1f}x")
    del x
    return rows


def run(batches=BATCHES, vocabs=VOCABS, out_path: Path | None = None, log=print, cluster=None) -> dict:
    from ..core.timing import read_bandwidth_gbps

    read_gbps = read_bandwidth_gbps()
    log(f"{gpu_name()}: read bandwidth {read_gbps:.0f} GB/s")
    result = {"gpu": gpu_name(), "read_gbps": read_gbps, "dtype": "float32", "top_p": TOP_P, "top_k": TOP_K,
              "seed": SEED, "cluster": cluster, "rounds": ROUNDS, "rows": []}
    try:
        import torch

        result["torch"] = torch.__version__
    except ImportError as e:  # pragma: no cover
        raise SystemExit(f"bench_sampling needs torch for its peers: {e}")
    for B in batches:
        for V in vocabs:
            result["rows"] += measure(B, V, read_gbps, log=log, cluster=cluster)
    return save_result(result, out_path)


def table(result: dict) -> list[dict]:
    return [{"B": r["B"], "V": r["V"], "method": r["method"], "kernel": r.get("kernel", r["ours"]),
             "ours us": r["ours_kernel_us"],
             "ours call us": r["ours_call_us"], "torch us": r["torch_kernel_us"], "torch call us": r["torch_call_us"],
             "ours reads": r["ours_reads"], "torch reads": r["torch_reads"], "speedup": r["speedup"],
             "target": "" if r["target"] is None else f">= {r['target']:.0f}x: {r['target_met']}",
             "correct": r["correct"]} for r in result["rows"]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m kernels.bench.sampling", description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    p.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS))
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench-sampling.json")
    p.add_argument("--cluster", type=int, default=None, choices=(0,) + SM.CLUSTER_SIZES,
                   help="threshold method: 0 runs sample_threshold, a size runs sample_cluster<size> "
                        "(default: sampling.cluster_plan)")
    args = p.parse_args(argv)
    missing = gpu_missing("python3 -m kernels.bench.sampling")
    if missing is not None:
        return missing
    result = run(args.batches, args.vocabs, out_path=args.out, cluster=args.cluster)
    print(f"\n{result['gpu']}, read bandwidth {result['read_gbps']:.0f} GB/s, torch {result['torch']}\n")
    print(format_table(table(result)))
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
