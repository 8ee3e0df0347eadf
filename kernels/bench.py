"""Check and time every registered attention variant: `python3 -m kernels.bench` from the repository root.

For each variant: the correctness line against the float64 reference (a ragged causal shape), then the
median time, TFLOP/s and the ratio to torch SDPA (same dtype, same run) at llm.c's benchmark shape
(B=8, H=12, T=1024, d=64, causal). Results also go to results/bench.json for the README's table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from . import REGISTRY, attention_flops, benchmark, check, format_table, gpu_name, gpu_unavailable_reason
from ._core import cp

LLMC_SHAPE = dict(B=8, H=12, T=1024, d=64)


def _torch_sdpa(dtype):
    """(label, fn(q, k, v)) for torch SDPA's efficient backend, or None without torch."""
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None

    def run(q, k, v):
        qt, kt, vt = (torch.from_dlpack(x) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

    return f"torch SDPA efficient ({np.dtype(dtype).name})", run


def run(variants=None, out_path: Path | None = None) -> list[dict]:
    import reference as R

    names = variants or sorted(REGISTRY)
    B, H, T, d = LLMC_SHAPE.values()
    flops = attention_flops(B, H, T, T, d, causal=True)
    rows, peers = [], {}
    for name in names:
        v = REGISTRY[name]
        for dtype in v.dtypes:
            # correctness on a ragged shape, outputs poisoned
            q, k, val = (cp.asarray(x.astype(dtype)) for x in R.make_qkv(2, 3, 100, min(64, v.max_d), 257, seed=1))
            from .check import poisoned_allocations

            with poisoned_allocations():
                o = v.forward(q, k, val, causal=True)
            ref = R.attention(q.get().astype(np.float64), k.get().astype(np.float64), val.get().astype(np.float64), causal=True)
            res = check(o, ref, v.tolerance_class(dtype))
            row = {"variant": name, "dtype": np.dtype(dtype).name, "correct": str(res)}
            if d <= v.max_d:
                q, k, val = (cp.asarray(x.astype(dtype)) for x in R.make_qkv(B, H, T, d, seed=2))
                t = benchmark(lambda: v.forward(q, k, val, causal=True))
                if dtype not in peers and _torch_sdpa(dtype) is not None:
                    label, fn = _torch_sdpa(dtype)
                    peers[dtype] = (label, benchmark(lambda: fn(q, k, val)).ms)
                row.update(ms=t.ms, tflops=t.tflops(flops))
                if dtype in peers:
                    row.update(peer=peers[dtype][0], peer_ms=peers[dtype][1], speedup_vs_peer=peers[dtype][1] / t.ms)
            rows.append(row)
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps({"gpu": gpu_name(), "shape": LLMC_SHAPE, "causal": True, "rows": rows}, indent=2))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("variants", nargs="*", help=f"variants to run (default: all of {sorted(REGISTRY)})")
    p.add_argument("--out", type=Path, default=Path("results/bench.json"))
    args = p.parse_args(argv)
    reason = gpu_unavailable_reason()
    if reason is not None:
        print(f"kernels.bench needs a CUDA GPU: {reason}")
        return 2
    unknown = [n for n in args.variants if n not in REGISTRY]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {sorted(REGISTRY)}")
    rows = run(args.variants or None, args.out)
    print(f"{gpu_name()}: B={LLMC_SHAPE['B']} H={LLMC_SHAPE['H']} T={LLMC_SHAPE['T']} d={LLMC_SHAPE['d']}, causal")
    cols = ["variant", "dtype", "correct", "ms", "tflops", "peer", "peer_ms", "speedup_vs_peer"]
    print(format_table(rows, cols))
    print(f"written: {args.out}")
    return 0 if all(r["correct"].endswith("True") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
