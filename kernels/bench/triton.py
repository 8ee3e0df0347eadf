"""Time the Triton FlashAttention-2 beside torch SDPA and the course's CUDA kernel: `python3 -m kernels.bench.triton`.

Float16, B=4, H=32, T in {1024, 4096, 16384}, d in {64, 128}, causal and not (Tq = Tk = T):

  forward   flash2_triton (kernels.pytorch.flash2_triton.forward, the CuPy launcher), flash2_mma (the CUDA kernel of
            notebook 06), torch SDPA with the flash and with the cuDNN backend (each forced with
            torch.nn.attention.sdpa_kernel; a backend that refuses is recorded as "not run: <reason>")
  backward  flash2_triton (through its torch.autograd.Function), SDPA flash, SDPA cuDNN. The backward is timed
            alone: one forward builds the graph, and each timed call is torch.autograd.grad(o, (q, k, v), do,
            retain_graph=True), which runs exactly the backward kernels (and allocates the three gradients),
            the same way for every implementation. FLOPs of the backward = 2.5 x the forward's (five matrix
            products of the forward's size against two), the usual convention.

Every time comes from kernels.benchmark: kernel time (calls queued back to back; ratios use it) and call time
(one Python call on an idle GPU). The implementations of one shape and direction are timed side by side in ROUNDS
rounds (kernels.compare); each row is its median round (`rounds_ms`: the kernel ms of every round), and one that
refuses the shape (on its first call) is recorded as "not run". TFLOP/s from the kernel time; "vs flash"
(`ratio_sdpa_flash`, and `ratio_sdpa_cudnn`) = SDPA flash's (cuDNN's) kernel time / ours within a round, the median over
the rounds (kernels.paired_ratio). A "correct" column checks our forward against reference.attention for the first
(batch, head) where T <= 4096. The --sweep times each kind's candidates side by side the same way.

    python3 -m kernels.bench.triton                   # the whole grid, results/bench-triton.json
    python3 -m kernels.bench.triton --T 4096 --d 128  # part of it
    python3 -m kernels.bench.triton --sweep           # first time the candidate configurations at T=4096 (fp16,
                                                      # B=4, H=32) and use the fastest of each for the grid
    python3 -m kernels.bench.triton --hgmma           # count wgmma/HGMMA in the generated code, and stop

It ends with the instruction counts of the generated code and the host cost of one call on a tiny input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import reference as R

from .common import ROOT, gpu_missing, runnable
from ..core import check, format_table, gpu_name
from ..core.timing import BACKWARD_FLOP_FACTOR
from ..flash import flash2_mma
from ..pytorch import flash2_triton as F
from ..core import cp
from ..core.timing import attention_flops, compare, host_overhead_us, paired_ratio

B, H = 4, 32
T_VALUES = (1024, 4096, 16384)
D_VALUES = (64, 128)
SWEEP_T = 4096
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}
ROUNDS = 3  # rounds of kernels.compare per shape and direction: every implementation timed once per round, side by side


def reps(T: int) -> dict:
    """benchmark() repetitions (per round of kernels.compare): fewer for the long shapes (a T=16384 call takes tens of
    milliseconds)."""
    return dict(batches=3, calls=3, warmup=1) if T >= 16384 else dict(batches=5, calls=5, warmup=2)


def make_inputs(T: int, d: int, seed: int = 0):
    """q, k, v, do as torch float16 tensors (normal, std 1) and CuPy views of q, k, v (DLPack, no copy)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn((B, H, T, d), generator=g, device="cuda", dtype=torch.float16) for _ in range(4))
    return (q, k, v, do), tuple(cp.from_dlpack(x) for x in (q, k, v))


def sdpa_forward(backend: str, causal: bool):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = getattr(SDPBackend, backend)

    def run(q, k, v):
        with sdpa_kernel(be):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def backward_call(forward, q, k, v, do):
    """The backward alone, to time: one forward builds the graph here, and each call is grad of that retained graph."""
    import torch

    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
    o = forward(qg, kg, vg)
    return lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)


def measure(T: int, d: int, causal: bool, *, fwd_cfg=None, bwd_cfgs=(None, None), log=print) -> list[dict]:
    """Rows (dicts of numbers and names) for one shape: every forward, then every backward, each direction's
    implementations timed side by side in ROUNDS rounds (kernels.compare)."""
    import torch

    (q, k, v, do), (qc, kc, vc) = make_inputs(T, d)
    r = reps(T)
    flops = attention_flops(B, H, T, T, d, causal=causal)
    shape = dict(B=B, H=H, T=T, d=d, causal=causal)
    rows = []

    def add(direction, fns, fl, extra, build=None):
        """One row per entry of fns (name -> callable, or what build turns into one), in its order; extra: name ->
        the row's further fields."""
        ok, notes = runnable(fns, build)
        timings = compare(ok, rounds=ROUNDS, **r) if ok else {}
        for name in fns:
            row = dict(shape, name=name, direction=direction, **extra.get(name, {}))
            t = timings.get(name)
            if t is None:
                row["note"] = notes[name]
            else:
                row.update(kernel_ms=t.ms, min_ms=t.min_ms, max_ms=t.max_ms, call_ms=t.call_ms, tflops=t.tflops(fl),
                           call_tflops=t.tflops(fl, "call"), rounds_ms=list(t.rounds))
                for p in SDPA_BACKENDS:
                    row[f"ratio_{p}"] = paired_ratio(t, timings[p]) if p in timings else None
            rows.append(row)
            log(f"  {name:14s} {direction:8s} " + (f"{row['kernel_ms']:9.3f} ms  {row['tflops']:6.1f} TFLOP/s"
                                                      if "kernel_ms" in row else row["note"]))

    cfg = fwd_cfg or F.FWD_CONFIGS[(d, causal)]
    correct = ""
    if T <= 4096:
        o = F.forward(qc, kc, vc, causal=causal, config=cfg)
        host = [x[:1, :1].get().astype(np.float64) for x in (qc, kc, vc)]
        correct = str(check(o[:1, :1], R.attention(*host, causal=causal), "float16"))
    forwards = {"flash2_triton": lambda: F.forward(qc, kc, vc, causal=causal, config=cfg),
                "flash2_mma": lambda: flash2_mma.forward(qc, kc, vc, causal=causal)}
    for name, backend in SDPA_BACKENDS.items():
        forwards[name] = lambda fn=sdpa_forward(backend, causal): fn(q, k, v)
    add("forward", forwards, flops, {"flash2_triton": dict(config=list(cfg), correct=correct)})

    bflops = BACKWARD_FLOP_FACTOR * flops
    kv_cfg, q_cfg = bwd_cfgs
    kv_cfg, q_cfg = kv_cfg or F.BWD_KV_CONFIGS[d], q_cfg or F.BWD_Q_CONFIGS[d]
    graphs = {"flash2_triton": lambda a, b, c: F.attention(a, b, c, causal=causal)}
    graphs.update({name: sdpa_forward(backend, causal) for name, backend in SDPA_BACKENDS.items()})
    old = F.BWD_KV_CONFIGS[d], F.BWD_Q_CONFIGS[d]
    F.BWD_KV_CONFIGS[d], F.BWD_Q_CONFIGS[d] = kv_cfg, q_cfg  # the autograd Function reads the tables
    try:  # every backward of the shape in the same rounds, so the tables hold our configs through all of them
        add("backward", graphs, bflops, {"flash2_triton": dict(config=[list(kv_cfg), list(q_cfg)])},
            build=lambda forward: backward_call(forward, q, k, v, do))
    finally:
        F.BWD_KV_CONFIGS[d], F.BWD_Q_CONFIGS[d] = old
    del q, k, v, do, qc, kc, vc
    torch.cuda.empty_cache()
    return rows


def sweep(d: int, causal: bool, log=print) -> dict:
    """Kernel time of every candidate at T=SWEEP_T: the forward's CANDIDATES, then the dK/dV candidates (with the
    table's dQ config) and the dQ candidates (with the best dK/dV), through the CuPy launchers; the candidates of each
    kind side by side in ROUNDS rounds (kernels.compare), each entry its median round."""
    (q, k, v, do), (qc, kc, vc) = make_inputs(SWEEP_T, d, seed=1)
    doc = cp.from_dlpack(do)
    r = dict(batches=3, calls=2, warmup=1)
    out = {"forward": [], "dkdv": [], "dq": []}

    def timed(kind, fns):  # fns: config -> callable
        ok, notes = runnable(fns)
        timings = compare(ok, rounds=ROUNDS, **r) if ok else {}
        for cfg in fns:
            t = timings.get(cfg)
            if t is None:
                out[kind].append(dict(config=list(cfg), note=notes[cfg]))
                log(f"  sweep d={d} {kind:8s} {tuple(cfg)}: {notes[cfg]}")
                continue
            out[kind].append(dict(config=list(cfg), kernel_ms=t.ms, rounds_ms=list(t.rounds)))
            log(f"  sweep d={d} {'causal' if causal else 'full'} {kind:8s} {tuple(cfg)}: {t.ms:.3f} ms")

    timed("forward", {cfg: (lambda cfg=cfg: F.forward(qc, kc, vc, causal=causal, config=cfg)) for cfg in F.CANDIDATES})
    o, lse = F.forward(qc, kc, vc, causal=causal, return_lse=True)
    timed("dkdv", {cfg: (lambda cfg=cfg: F.backward(qc, kc, vc, o, lse, doc, causal=causal, kv_config=cfg))
                   for cfg in F.BWD_KV_CANDIDATES})
    best_kv = best(out["dkdv"]) or F.BWD_KV_CONFIGS[d]
    timed("dq", {cfg: (lambda cfg=cfg: F.backward(qc, kc, vc, o, lse, doc, causal=causal, kv_config=best_kv,
                                                  q_config=cfg)) for cfg in F.BWD_Q_CANDIDATES})
    out["best"] = {kind: list(best(out[kind]) or ()) for kind in ("forward", "dkdv", "dq")}
    return out


def best(entries: list):
    ok = [e for e in entries if "kernel_ms" in e]
    return F.Config(*min(ok, key=lambda e: e["kernel_ms"])["config"]) if ok else None


def hgmma_counts(log=print) -> dict:
    """Instruction counts of the generated code (fp16, d=128 and 64, causal) for the table's configurations."""
    result = {}
    for d in (64, 128):
        for name, ck in F.compiled_kernels(d=d, causal=True).items():
            counts = F.instruction_counts(ck)
            result[f"{name} d={d}"] = counts
            log(f"  {name:10s} d={d:3d}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return result


def host_costs(log=print) -> dict:
    """Microseconds of host time per call (kernels.host_overhead_us) on a tiny input (1, 1, 64, 64), split into the
    launcher's parts: what separates call time from kernel time for short kernels."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((1, 1, 64, 64), generator=g, device="cuda", dtype=torch.float16) for _ in range(3))
    qc, kc, vc = (cp.from_dlpack(x) for x in (q, k, v))
    o, lse = torch.empty_like(q), torch.empty((1, 1, 64), device="cuda", dtype=torch.float32)
    cfg = F.FWD_CONFIGS[(64, False)]
    flash = sdpa_forward(SDPA_BACKENDS["sdpa_flash"], False)
    fns = {
        "flash2_triton.forward (CuPy in and out)": lambda: F.forward(qc, kc, vc),
        "  DLPack: 5 CuPy arrays to torch": lambda: [F.as_torch(x) for x in (qc, kc, vc, qc, kc)],
        "  Triton's launch alone (torch tensors)": lambda: F.launch_forward(q, k, v, o, lse, False, 0.125, cfg),
        "flash2_triton.attention (torch autograd)": lambda: F.attention(q, k, v),
        "flash2_mma.forward (CuPy)": lambda: flash2_mma.forward(qc, kc, vc),
        "SDPA flash (torch)": lambda: flash(q, k, v),
    }
    result = {}
    for name, fn in fns.items():
        result[name] = host_overhead_us(fn)
        log(f"  {name:42s} {result[name]:7.1f} us")
    return result


def table(rows: list[dict]) -> list[dict]:
    """Printable rows: ours beside the peers, with kernel time, call time and the paired ratio to SDPA flash (measure's
    ratio_sdpa_flash: the ratio within a round, the median over the rounds)."""
    out = []
    for r in rows:
        vs_flash = r.get("ratio_sdpa_flash")
        out.append({"dir": r["direction"][:3], "T": r["T"], "d": r["d"], "causal": "yes" if r["causal"] else "no",
                    "kernel": r["name"], "kernel ms": r.get("kernel_ms", float("nan")),
                    "call ms": r.get("call_ms", float("nan")), "TFLOP/s": r.get("tflops", float("nan")),
                    "vs flash": float("nan") if vs_flash is None else vs_flash,
                    "note": r.get("correct") or r.get("note", "")})
    return out


def run(Ts=T_VALUES, ds=D_VALUES, causals=(False, True), *, do_sweep=False, out_path: Path | None = None,
        log=print) -> dict:
    import torch

    result = {"gpu": gpu_name(), "torch": torch.__version__, "B": B, "H": H, "dtype": "float16", "rounds": ROUNDS,
              "backward_flops_factor": BACKWARD_FLOP_FACTOR, "backward_timing": "torch.autograd.grad with retain_graph",
              "command": "python3 -m kernels.bench.triton " + " ".join(sys.argv[1:]), "rows": [], "sweep": {},
              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:  # pragma: no cover
        pass
    def save():  # after every step, so that an interrupted run keeps what it measured
        if out_path is not None:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(result, indent=1))

    chosen = {}
    if do_sweep:
        for d in ds:
            for causal in causals:
                s = sweep(d, causal, log=log)
                result["sweep"][f"d={d} causal={causal}"] = s
                chosen[(d, causal)] = s["best"]
                save()
    for T in Ts:
        for d in ds:
            for causal in causals:
                log(f"T={T} d={d} causal={causal}")
                picked = chosen.get((d, causal), {})
                fwd = F.Config(*picked["forward"]) if picked.get("forward") else None
                kv = F.Config(*picked["dkdv"]) if picked.get("dkdv") else None
                qq = F.Config(*picked["dq"]) if picked.get("dq") else None
                result["rows"] += measure(T, d, causal, fwd_cfg=fwd, bwd_cfgs=(kv, qq), log=log)
                save()
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m kernels.bench.triton", description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=list(T_VALUES))
    p.add_argument("--d", type=int, nargs="+", default=list(D_VALUES))
    p.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    p.add_argument("--sweep", action="store_true", help="time the candidate configurations first, use the fastest")
    p.add_argument("--hgmma", action="store_true", help="count wgmma/HGMMA in the generated code and stop")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench-triton.json")
    args = p.parse_args(argv)
    missing = gpu_missing("python3 -m kernels.bench.triton")
    if missing is not None:
        return missing
    print(f"GPU: {gpu_name()}")
    if args.hgmma:
        hgmma_counts()
        return 0
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    result = run(args.T, args.d, causals, do_sweep=args.sweep, out_path=args.out)
    result["generated_code"] = hgmma_counts()
    result["host_us"] = host_costs()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(format_table(table(result["rows"])))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
