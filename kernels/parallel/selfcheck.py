"""Run every schedule on real processes and compare with the single-process float64 reference.

    python3 -m kernels.parallel.selfcheck --world 3                  # CPU: 3 gloo ranks (spawned here), float64
    python3 -m torch.distributed.run --nproc-per-node 2 -m kernels.parallel.selfcheck --backend cuda   # 2 GPUs, NCCL

Each rank draws the same whole-sequence q, k, v, dO (reference.make_qkv, one seed), keeps its part (context.shard),
runs forward and backward, and the parts are gathered back; rank 0 compares o, lse, dq, dk, dv with reference.attention
and reference.attention_backward on the whole sequence. On CPU the local kernel is the float64 reference itself, so
the bound is 1e-12 of the largest reference value; on GPU it is kernels.check's tolerance for the dtype, and the same
kernels on one GPU over the whole sequence are checked beside it. Then every bad input (bad_inputs) is tried on every
rank: each rank must raise the same ValueError. tests/test_context_parallel_cpu.py and _gpu.py run these functions;
notebook 14 runs this command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import reference
from . import context as C

CPU_BOUND = 1e-12  # float64 throughout: max |out - ref| / max |ref|


def cases(world: int, quick: bool = False) -> list[dict]:
    """Every schedule x causal x a length that divides evenly (B = 1) and one that does not (padded; B = 2, so that
    batch entries are kept apart too), small shapes."""
    out = []
    for schedule in C.SCHEDULES:
        H = 2 * world if schedule == "alltoall" else 2
        for causal in (False, True):
            for T in ((8 * world, 8 * world - 3) if not quick else (8 * world - 3,)):
                out.append(dict(schedule=schedule, causal=causal, T=T, B=1 if T == 8 * world else 2, H=H, d=8))
    return out


def _inputs(case: dict, dtype, device, seed: int = 0):
    q, k, v = reference.make_qkv(case["B"], case["H"], case["T"], case["d"], seed=seed, dtype=np.float64)
    do = np.random.default_rng(seed + 1).standard_normal(q.shape)
    return [torch.from_numpy(x).to(device=device, dtype=dtype) for x in (q, k, v, do)]


def _rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    fin = np.isfinite(ref)
    if not np.array_equal(np.isfinite(out), fin):
        return float("inf")
    scale = np.abs(ref[fin]).max() if fin.any() else 1.0
    return float(np.abs(out[fin] - ref[fin]).max() / scale) if fin.any() else 0.0


def run_case(case: dict, group=None, backend=None, dtype=torch.float64, device="cpu") -> dict | None:
    """Forward and backward of one case on every rank of group; on rank 0 the errors against the reference."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    T, sched, causal = case["T"], case["schedule"], case["causal"]
    q, k, v, do = _inputs(case, dtype, device)
    parts = [C.shard(x, rank, world, sched) for x in (q, k, v, do)]
    kw = dict(seq_len=T, schedule=sched, causal=causal, group=group, backend=backend)
    o, lse = C.forward(*parts[:3], **kw)
    if case.get("autograd"):  # the differentiable entry point: the same backward, through torch.autograd
        leaves = [x.clone().requires_grad_() for x in parts[:3]]
        C.attention(*leaves, **kw).backward(parts[3])
        grads = [x.grad for x in leaves]
    else:
        grads = C.backward(parts[3], *parts[:3], o, lse, **kw)
    got = [C.gather(x, T, sched, group) for x in (o, grads[0], grads[1], grads[2])]
    got.insert(1, C.gather(lse[..., None], T, sched, group)[..., 0])
    if rank != 0:
        return None
    names = ("o", "lse", "dq", "dk", "dv")
    q64, k64, v64, do64 = (x.double().cpu().numpy() for x in (q, k, v, do))
    ref = list(reference.attention(q64, k64, v64, causal=causal, return_lse=True))
    ref += list(reference.attention_backward(q64, k64, v64, do64, causal=causal))
    res = dict(case, world=world, dtype=str(dtype).removeprefix("torch."))
    res["err"] = {n: _rel(g.double().cpu().numpy(), r) for n, g, r in zip(names, got, ref)}
    if str(device).startswith("cpu"):
        res["ok"] = all(e <= CPU_BOUND for e in res["err"].values())
        return res
    from ..core import check
    from .local import backend_for

    name = res["dtype"]
    res["check"] = {n: check(g.float().cpu().numpy(), r, name).as_dict() for n, g, r in zip(names, got, ref)}
    one = backend_for("cuda")  # the same kernels on one GPU, whole sequence
    o1, lse1 = one.forward(q, k, v, causal, 1 / math.sqrt(case["d"]))
    g1 = one.backward(do, q, k, v, o1, lse1, causal, 1 / math.sqrt(case["d"]))
    res["one_gpu"] = {n: check(g.float().cpu().numpy(), r, name).as_dict()
                      for n, g, r in zip(names, (o1, lse1) + tuple(g1), ref)}
    res["ok"] = all(c["ok"] for c in res["check"].values()) and all(c["ok"] for c in res["one_gpu"].values())
    return res


def bad_inputs(world: int) -> dict:
    """name -> (what this rank passes, keyword arguments; the expected text of the error on every rank)."""
    return {
        "length differs on rank 1": ("len", "disagree on q.shape"),
        "dtype differs on rank 0": ("dtype", "disagree on q.dtype: rank 0 'float32'"),
        "heads differ on rank 1": ("heads", "disagree on q.shape"),
        "heads not divisible (alltoall)": ("a2a_heads", f"not a multiple of the world size {world}"),
        "seq_len does not match the parts": ("seq_len", "q.shape[2] is"),
        "seq_len differs on rank 1": ("seq_len_rank", "disagree on seq_len"),
        "causal differs on rank 1": ("causal_rank", "disagree on causal"),
        "unknown schedule": ("schedule", "schedule must be one of"),
        "k shaped unlike q": ("kshape", "k.shape is"),
        "q not a tensor on rank 1": ("numpy", "rank 1: q must be a torch.Tensor"),
        "float16 on the CPU backend": ("fp16", f"rank{'s' if world > 1 else ''} {','.join(map(str, range(world)))}: q has dtype torch.float16; "
                                       "the reference backend takes float32, float64"),
    }


def try_bad_input(kind: str, group=None) -> tuple[str, str]:
    """Make this rank's bad input of `kind` and call forward; (exception type, message) of what it raised."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    T, H, sched, causal = 4 * world, 2, "zigzag", True
    if kind == "a2a_heads":
        H, sched = world + 1, "alltoall"
    q, k, v, _ = _inputs(dict(B=1, H=H, T=T, d=8), torch.float64, "cpu")
    if kind == "heads" and rank == 1:
        q, k, v, _ = _inputs(dict(B=1, H=H + 1, T=T, d=8), torch.float64, "cpu")
    q, k, v = (C.shard(x, rank, world, "zigzag") for x in (q, k, v))
    seq_len = T
    if kind == "len" and rank == 1:
        q, k, v = (torch.cat([x, x[:, :, :1]], 2) for x in (q, k, v))
    if kind == "dtype" and rank == 0:
        q, k, v = q.float(), k.float(), v.float()
    if kind == "seq_len":
        seq_len = 3 * T
    if kind == "seq_len_rank" and rank == 1:
        seq_len = T - 1
    if kind == "causal_rank" and rank == 1:
        causal = False
    if kind == "schedule":
        sched = "spiral"
    if kind == "kshape":
        k = k[:, :, :-1].contiguous()
    if kind == "numpy" and rank == 1:
        q = q.numpy()
    if kind == "fp16":
        q, k, v = q.half(), k.half(), v.half()
    try:
        C.forward(q, k, v, seq_len=seq_len, schedule=sched, causal=causal, group=group)
    except Exception as e:  # noqa: BLE001 - the test wants to see exactly what was raised
        return type(e).__name__, str(e)
    return "none", ""


def run_all(world_group=None, quick: bool = False, with_world_of_one: bool = True) -> dict:
    """Every case and every bad input on the ranks of the default group (gloo, float64); returns this rank's results
    (the case errors on rank 0)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {"rank": rank, "world": world, "cases": [], "bad": {}}
    for case in cases(world, quick):
        out["cases"].append(run_case(case))
    for name, (kind, _) in bad_inputs(world).items():
        out["bad"][name] = try_bad_input(kind)
    for sched in C.SCHEDULES:
        out["cases"].append(run_case(dict(schedule=sched, causal=True, T=8 * world - 3, B=1, H=2 * world, d=8,
                                          autograd=True)))
    # the group still works after the errors (every rank raised at the same point)
    out["cases"].append(run_case(dict(schedule="zigzag", causal=True, T=5 * world, B=1, H=2, d=8, after_errors=True)))
    if with_world_of_one:  # a group of one rank: allowed, the schedules reduce to one local call
        solo = dist.new_group([0])
        if rank == 0:
            for sched in C.SCHEDULES:
                out["cases"].append(run_case(dict(schedule=sched, causal=True, T=7, B=1, H=2, d=8, solo=True),
                                             group=solo))
    return out


# ---------------------------------------------------------------------------------------------------------
# Processes: spawned here (CPU, gloo) or started by torchrun (GPU, NCCL)
# ---------------------------------------------------------------------------------------------------------

def _worker(rank: int, world: int, store: str, job: str, out_dir: str, timeout_s: float, quick: bool):
    torch.set_num_threads(1)
    C.init("gloo", timeout_s, init_method=f"file://{store}", rank=rank, world_size=world)
    result = {"rank": rank}
    if job == "all":
        result = run_all(quick=quick)
    elif job in ("dead", "hung"):  # rank 1 dies (or stops answering) before the call; the others must not hang
        if rank == 1:
            if job == "dead":
                os._exit(0)
            time.sleep(timeout_s * 3)
            os._exit(0)
        t0 = time.time()
        q = C.shard(_inputs(dict(B=1, H=2, T=4 * world, d=8), torch.float64, "cpu")[0], rank, world, "ring")
        try:
            C.forward(q, q, q, seq_len=4 * world, schedule="ring")
            result.update(raised="none", message="")
        except Exception as e:  # noqa: BLE001
            result.update(raised=type(e).__name__, message=str(e))
        result["seconds"] = time.time() - t0
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    if job == "all":
        dist.destroy_process_group()
    else:
        os._exit(0)  # the group is broken: skip its shutdown handshake


def spawn(world: int, job: str = "all", timeout_s: float = 60, quick: bool = False) -> list[dict]:
    """Run `job` on `world` gloo ranks (torch.multiprocessing, spawn); the per-rank results."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(world, os.path.join(tmp, "store"), job, tmp, timeout_s, quick),
                           nprocs=world, join=True, start_method="spawn")
        return [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank*.json"))]


def report(results: list[dict], verbose: bool = False) -> tuple[bool, str]:
    """The table rank 0 prints (stable text unless verbose: the numbers vary with the machine's rounding)."""
    lines, ok = [], True
    r0 = next(r for r in results if r["rank"] == 0)
    for res in r0["cases"]:
        if res is None:
            continue
        ok &= res["ok"]
        tag = " (after the errors)" if res.get("after_errors") else " (a group of one rank)" if res.get("solo") \
            else " (torch.autograd)" if res.get("autograd") else ""
        nums = "  " + " ".join(f"{n} {e:.0e}" for n, e in res["err"].items()) if verbose else ""
        bound = f"<= {CPU_BOUND:.0e}" if "check" not in res else "within kernels.check"
        lines.append(f"{res['schedule']:9s} causal={str(res['causal']):5s} T={res['T']:3d} ranks={res['world']}: "
                     f"o, lse, dq, dk, dv {bound}: {res['ok']}{tag}{nums}")
    for name in bad_inputs(r0["world"]):
        seen = {tuple(r["bad"][name]) for r in results}
        same = len(seen) == 1
        kind, msg = next(iter(seen))
        good = same and kind == "ValueError" and bad_inputs(r0["world"])[name][1] in msg
        ok &= good
        lines.append(f"bad input: {name:33s} -> the same {kind} on every rank: {good}")
    return ok, "\n".join(lines)


def _torchrun_main(args) -> int:
    """Under torchrun on GPUs: NCCL, the cuda backend, every case in float16 and bfloat16."""
    rank, world = C.init("nccl", args.timeout)
    device = torch.device("cuda", torch.cuda.current_device())
    results = []
    for dtype in (torch.bfloat16, torch.float16):
        for schedule in C.SCHEDULES:
            for causal in (False, True):
                for T in (256 * world, 256 * world - 37):
                    case = dict(schedule=schedule, causal=causal, T=T, B=1, H=2 * world, d=64)
                    results.append(run_case(case, backend="cuda", dtype=dtype, device=device))
    ok = True
    if rank == 0:
        for res in results:
            ok &= res["ok"]
            worst = max(c["rel_l2"] for c in res["check"].values())
            print(f"{res['dtype']:8s} {res['schedule']:9s} causal={str(res['causal']):5s} T={res['T']:5d}: "
                  f"ranks {res['ok']} (worst rel L2 {worst:.1e}); one GPU "
                  f"{all(c['ok'] for c in res['one_gpu'].values())}", flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1))
        print("all ok" if ok else "FAILED", flush=True)
    flag = torch.tensor([int(ok)], device=device)
    dist.broadcast(flag, 0)
    dist.destroy_process_group()
    return 0 if flag.item() else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m kernels.parallel.selfcheck", description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=3, help="CPU: how many gloo ranks to spawn (default 3)")
    p.add_argument("--backend", choices=("reference", "cuda"), default="reference",
                   help="cuda: run under torchrun on GPUs (NCCL)")
    p.add_argument("--quick", action="store_true", help="CPU: only the lengths that do not divide evenly")
    p.add_argument("--verbose", action="store_true", help="print the errors' numbers too")
    p.add_argument("--timeout", type=float, default=60, help="process group timeout, seconds")
    p.add_argument("--out", help="GPU: write the results as JSON here")
    args = p.parse_args(argv)
    if args.backend == "cuda":
        return _torchrun_main(args)
    ok, text = report(spawn(args.world, timeout_s=args.timeout, quick=args.quick), args.verbose)
    print(text)
    print("all ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
