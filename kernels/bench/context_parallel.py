"""Time attention spread over the GPUs of one machine: `python3 -m torch.distributed.run --nproc-per-node N -m
kernels.bench.context_parallel`.

For each T (default 16384 and 65536), B=1 H=32 d=128 bfloat16, causal and not, forward and forward+backward:

    one GPU      our kernels (the torch operator's: hopper_fa3 and the Hopper backward on a Hopper, flash2_mma and
                 flash2_mma_bwd elsewhere) on the whole sequence, on each GPU at once
    ring         kernels/parallel: contiguous chunks, K and V round the ring (the causal imbalance left in)
    zigzag       chunks r and 2N-1-r on rank r: the causal work balanced
    alltoall     two all-to-alls, sequence <-> heads (Ulysses), local attention on H/N heads
    torch_cp     torch.distributed.tensor.experimental.context_parallel around SDPA (its own ring, head-tail load
                 balancing); where it refuses a shape, the reason is recorded

All methods of one shape are timed side by side in ROUNDS rounds, the order turned each round; a round times CALLS
calls between CUDA events after a barrier (after one untimed call in a method's first round), and the time of a round
is the slowest rank's. Reported: the median round.

    ms           time per call (forward, or forward + backward), the slowest rank
    efficiency   one GPU's ms / (N x this ms): 1.0 is perfect scaling; for one GPU the row is the baseline
    TFLOP/s      per GPU: the attention's FLOPs (4 B H T^2 d, halved for causal; x 3.5 for forward + backward) /
                 (N x ms)

Before timing, a correctness check on a small shape (kernels/parallel/selfcheck.py: every schedule against the float64
reference and one GPU's result, bfloat16 tolerance of kernels.check). --trace DIR writes a torch.profiler trace of
one zigzag forward + backward per rank (kernels and NCCL on their streams; notebook 14 draws it).
Rank 0 prints the table and writes the JSON (numbers as numbers).

    python3 -m torch.distributed.run --nproc-per-node 2 -m kernels.bench.context_parallel
    python3 -m torch.distributed.run --nproc-per-node 2 -m kernels.bench.context_parallel --T 16384 65536 131072
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

from .common import ROOT, gpu_missing, save_result
from ..core.timing import BACKWARD_FLOP_FACTOR

B, H, D = 1, 32, 128
TS = (16384, 65536)
ROUNDS = 3
CALLS = 3
METHODS = ("one_gpu", "ring", "zigzag", "alltoall", "torch_cp")
PROG = "python3 -m kernels.bench.context_parallel"


def _flops(T: int, causal: bool, backward: bool) -> float:
    f = 4.0 * B * H * T * T * D * (0.5 if causal else 1.0)
    return f * (1 + BACKWARD_FLOP_FACTOR) if backward else f


def _inputs(T, device, dtype, seed=0):
    import torch

    g = torch.Generator(device).manual_seed(seed)
    return [torch.randn(B, H, T, D, device=device, dtype=dtype, generator=g) for _ in range(4)]


def _ours(schedule, full, causal, backward, world, rank):
    """A zero-argument callable: one forward (+ backward) of our schedule on this rank's part; checked once."""
    from ..parallel import context as C

    T = full[0].shape[2]
    q, k, v, do = (C.shard(x, rank, world, schedule) for x in full)
    P = C.problem_of(q, k, v, seq_len=T, schedule=schedule, causal=causal)

    def run():
        o, lse = C.forward(q, k, v, seq_len=T, check=False, problem=P)
        if backward:
            C.backward(do, q, k, v, o, lse, seq_len=T, check=False, problem=P)
    return run


def _one_gpu(full, causal, backward):
    from ..parallel.local import backend_for

    be = backend_for("cuda")
    q, k, v, do = full
    scale = 1 / math.sqrt(D)

    def run():
        o, lse = be.forward(q, k, v, causal, scale)
        if backward:
            be.backward(do, q, k, v, o, lse, causal, scale)
    return run


def _torch_cp(full, causal, backward, mesh):
    """torch's context_parallel around SDPA: the buffers are sharded in place when the context is entered; the
    callable runs inside it. Returns (callable, context) or raises with torch's reason."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor.experimental import context_parallel

    q, k, v, do = (x.clone() for x in full)
    ctx = context_parallel(mesh, buffers=[q, k, v, do], buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers={q, k, v, do})
    ctx.__enter__()
    try:
        leaves = [x.requires_grad_(backward) for x in (q, k, v)]

        def run():
            o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
            if backward:
                torch.autograd.grad(o, leaves, do)
        run()  # raises here if torch refuses the shape
        torch.cuda.synchronize()
    except BaseException:
        ctx.__exit__(*sys.exc_info())
        raise
    return run, ctx


def _time_round(fn, calls, dist, warm: bool = True):
    import torch

    if warm:  # a method's first round: its first call warms up and allocates its transfers' buffers, untimed
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    ms = torch.tensor([start.elapsed_time(end) / calls], device="cuda")
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return float(ms.item())


def bench_shape(T, causal, backward, world, rank, mesh, rounds, calls, dist, methods):
    import torch

    full = _inputs(T, "cuda", torch.bfloat16)
    fns, notes, ctxs = {}, {}, []
    for m in methods:
        try:
            if m == "one_gpu":
                fns[m] = _one_gpu(full, causal, backward)
            elif m == "torch_cp":
                fns[m], ctx = _torch_cp(full, causal, backward, mesh)
                ctxs.append(ctx)
            else:
                fns[m] = _ours(m, full, causal, backward, world, rank)
        except Exception as e:  # noqa: BLE001 - a method that refuses the shape is recorded with its reason
            notes[m] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}" if str(e) else type(e).__name__
            torch.cuda.synchronize()
    times = {m: [] for m in fns}
    names = list(fns)
    for r in range(rounds):
        for m in names[r % len(names):] + names[:r % len(names)]:
            times[m].append(_time_round(fns[m], calls, dist, warm=r == 0))
    for ctx in ctxs:
        ctx.__exit__(None, None, None)
    rows = []
    base = statistics.median(times["one_gpu"]) if "one_gpu" in times else None
    for m in methods:
        row = {"T": T, "causal": causal, "pass": "fwd+bwd" if backward else "fwd", "method": m, "gpus": world}
        if m in times:
            ms = statistics.median(times[m])
            n = 1 if m == "one_gpu" else world
            row.update(ms=ms, rounds_ms=times[m], tflops_per_gpu=_flops(T, causal, backward) / (n * ms * 1e-3) / 1e12)
            if base is not None:
                row["efficiency"] = base / (n * ms)
        else:
            row["refused"] = notes.get(m, "not run")
        rows.append(row)
    del full, fns
    torch.cuda.empty_cache()
    return rows


def check_small(world, rank):
    """Every schedule, causal and not, on a small shape (a length that does not divide), against the float64
    reference and one GPU's result: bfloat16 tolerances of kernels.check."""
    import torch

    from ..parallel import context as C, selfcheck

    out = []
    for schedule in C.SCHEDULES:
        for causal in (False, True):
            case = dict(schedule=schedule, causal=causal, T=512 * world - 37, B=1, H=2 * world, d=D)
            res = selfcheck.run_case(case, backend="cuda", dtype=torch.bfloat16, device=torch.device("cuda"))
            if rank == 0:
                out.append({"schedule": schedule, "causal": causal, "T": case["T"], "ok": res["ok"],
                            "rel_l2": {n: c["rel_l2"] for n, c in res["check"].items()}})
    return out


def trace(T, world, rank, out_dir: Path):
    """A torch.profiler trace of one zigzag causal forward + backward (after a warm-up), one file per rank."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn = _ours("zigzag", _inputs(T, "cuda", torch.bfloat16), True, True, world, rank)
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"zigzag-T{T}-rank{rank}.json"
    prof.export_chrome_trace(str(path))
    return path


def summary(result: dict) -> str:
    from ..core import format_table

    rows = []
    for r in result["rows"]:
        rows.append({"T": r["T"], "causal": r["causal"], "pass": r["pass"], "method": r["method"],
                     "ms": r.get("ms", float("nan")), "efficiency": r.get("efficiency", float("nan")),
                     "TFLOP/s/GPU": r.get("tflops_per_gpu", float("nan")),
                     "note": r.get("refused", "")[:60]})
    head = (f"{result['gpus']} x {result['gpu']}, B={B} H={H} d={D} bfloat16, torch {result['torch']}; "
            f"median of {result['rounds']} rounds of {result['calls']} calls, the slowest rank")
    checks = "correctness (small shape, every schedule, bfloat16 tolerance): " + \
        ("ok" if all(c["ok"] for c in result["check"]) else "FAILED")
    return "\n".join([head, checks, format_table(rows, floatfmt=".3g")])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=list(TS), help="sequence lengths (default 16384 65536)")
    p.add_argument("--causal", choices=("both", "causal", "full"), default="both")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--passes", nargs="+", default=["fwd", "fwd+bwd"], choices=("fwd", "fwd+bwd"))
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--calls", type=int, default=CALLS)
    p.add_argument("--trace", type=Path, default=None, help="write a torch.profiler trace per rank into this folder")
    p.add_argument("--trace-T", type=int, default=16384)
    p.add_argument("--timeout", type=float, default=600, help="process group timeout, seconds")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench-context-parallel.json")
    args = p.parse_args(argv)
    missing = gpu_missing(PROG)
    if missing is not None:
        return missing
    if "WORLD_SIZE" not in os.environ:
        print(f"{PROG} needs to be started by torchrun, one process per GPU: python3 -m torch.distributed.run "
              f"--nproc-per-node N -m kernels.bench.context_parallel", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from ..core import gpu_name
    from ..parallel import context as C

    rank, world = C.init("nccl", args.timeout)
    mesh = init_device_mesh("cuda", (world,))
    t0 = time.time()
    checks = check_small(world, rank)
    rows = []
    causals = {"both": (False, True), "causal": (True,), "full": (False,)}[args.causal]
    for T in args.T:
        for causal in causals:
            for ps in args.passes:
                rows += bench_shape(T, causal, ps == "fwd+bwd", world, rank, mesh, args.rounds, args.calls, dist,
                                    args.methods)
                if rank == 0:
                    print(f"  T={T} causal={causal} {ps}: done ({time.time() - t0:.0f} s)", flush=True)
    traces = [str(trace(args.trace_T, world, rank, args.trace))] if args.trace else []
    if rank == 0:
        command = " ".join(["python3 -m torch.distributed.run", f"--nproc-per-node {world}", "-m",
                            "kernels.bench.context_parallel", *(sys.argv[1:] if argv is None else argv)])
        result = {"gpu": gpu_name(), "gpus": world, "torch": torch.__version__, "command": command,
                  "B": B, "H": H, "d": D, "dtype": "bfloat16", "rounds": args.rounds, "calls": args.calls,
                  "check": checks, "rows": rows, "traces": traces, "seconds": time.time() - t0}
        save_result(result, args.out)
        print(summary(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
