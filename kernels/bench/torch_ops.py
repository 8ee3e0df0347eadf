"""Time the backward kernels and the PyTorch custom operators beside torch's own: `python3 -m kernels.bench.torch_ops`.

1. Attention backward, float16 (or --dtype bfloat16), B=4 H=32, T in TS, d in {64, 128}, causal and not: our
   flash2_mma_bwd (its three launches, outputs and workspace preallocated) and, on a Hopper, hopper_attn_bwd
   (`hopper`: its three launches with their allocations; with --dq-atomics also `hopper atomics`, its build that
   adds dQ by atomics; with --bwd-schedules also one row per mix of its schedule switches, `hopper early_p`,
   `hopper early_kv+dq_first`, ...: hopper_attn_bwd.SCHEDULE_SWITCHES) against torch SDPA's flash and cuDNN
   backends, each timed
   as torch.autograd.grad of an SDPA output computed under that backend (so only the backward runs), ours and the
   backends of one shape side by side in ROUNDS rounds (kernels.compare). TFLOP/s use the backward convention: 2.5 x
   the forward's 4 B H Tq Tk d (halved for causal). A backend that refuses is recorded with its reason.
2. The masked softmax by lengths, float32, forward and backward: our operators against torch's masked_fill + softmax
   (the mask made once, outside the timing) and torch's softmax backward followed by the masked_fill of the gradient,
   at a BERT-like shape (12 heads x 16 sequences x 128 queries, rows of 128) and a long-row shape (2048 rows of 16384);
   every case of one shape side by side in ROUNDS rounds (kernels.compare).
3. The attention operator's forward (`--parts forward`, not in the default run), the grid above: its body
   (flash_attn_fwd_impl) through each kernel forward_kernel can pick (`op flash2_mma`; on a Hopper at d = 64 and 128
   `op hopper_attn`, HOPPER_FWD_MIN_T set for the call) and SDPA's cuDNN forward, side by side; `vs flash2_mma` is
   op flash2_mma's kernel time / this row's (above 1: faster than flash2_mma). What HOPPER_FWD_MIN_T is set from.
4. One training step of chapter 12's model (`--parts train`, not in the default run): kernels.pytorch.tiny_gpt's
   TinyGPT with TRAIN_HEADS heads of width d (C = TRAIN_HEADS d), TRAIN_LAYERS layers, causal, B = TRAIN_TOKENS / T
   sequences of T tokens, its forward under bfloat16 autocast, AdamW; the whole step (forward, loss, backward,
   optimizer) with our operator (`ours`: whatever forward_kernel and backward_kernel pick) and with SDPA forced to
   its cuDNN and flash backends, the three models built from one seed and timed side by side. `kernel ms` is the
   GPU time of one step, `vs cuDNN` and `vs flash` as above.
5. Host overhead (kernels.host_overhead_us) on a tiny problem: our attention operator, the flash2_mma launcher called
   directly, and torch's own SDPA call.
6. The Hopper forward's launches (`--parts launch`, not in the default run; on a Hopper), under the causal mask or
   (--launch-masks full) without it: hopper_attn.forward with its default launch (hopper_attn.default_launch), with
   persistent=False (one CTA per work tile; under the mask only), persistent=True (one CTA per SM, the work tiles in
   a fixed round robin), persistent="dynamic" (one CTA per SM taking tiles from a queue, longest first) and, causal
   at d = 64, the queue with 128-row tiles, beside SDPA's cuDNN forward; `vs cuDNN` as above. What
   hopper_attn.default_launch is set from.

    kernel ms        GPU time per call (kernels.benchmark: calls queued back to back behind a hold kernel), the
                     median round of the comparison's ROUNDS rounds (`rounds ms`: the kernel ms of every round)
    call ms          one call on an idle GPU, host time included
    TFLOP/s          backward FLOPs per second of kernel time
    vs flash, vs cuDNN   SDPA flash's (cuDNN's) kernel time / ours within a round, the median over the rounds
                     (kernels.paired_ratio; above 1: ours is faster)
    ours faster by   the softmax's: this row's kernel time / ours within a round, the median over the rounds

Results go to results/bench-torch.json, numbers as numbers.

    python3 -m kernels.bench.torch_ops                   # T = 1024, 4096, 16384 (T = 16384 dominates the run)
    python3 -m kernels.bench.torch_ops --T 1024 4096     # a shorter run
    python3 -m kernels.bench.torch_ops --parts backward --T 4096 16384 --bwd-schedules   # the schedules' A/B
    python3 -m kernels.bench.torch_ops --parts forward --T 1024 2048 4096 16384 --out results/bench-torch-fwd.json
    python3 -m kernels.bench.torch_ops --parts train --T 4096 16384 --out results/bench-torch-train.json
    python3 -m kernels.bench.torch_ops --parts launch --T 1024 2048 4096 8192 16384 --out results/bench-launch.json
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path


from .common import ROOT, gpu_missing, runnable, save_result
from ..core import format_table, gpu_name
from ..core import cp
from ..core.timing import compare, host_overhead_us, paired_ratio

B, H = 4, 32
TS = (1024, 4096, 16384)
DS = (64, 128)
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}
TRAIN_HEADS, TRAIN_LAYERS, TRAIN_TOKENS = 16, 4, 16384  # the training step's model: C = 16 d, 4 layers, 16k tokens
SOFTMAX_SHAPES = {"bert": (12 * 16 * 128, 128), "long_rows": (2048, 16384)}
HOST_SHAPE = (1, 2, 16, 64)
ROUNDS = 3  # rounds of kernels.compare per comparison: ours and torch's timed once per round, side by side


def backward_flops(T: int, d: int, causal: bool) -> float:
    from ..flash.flash2_mma_bwd import backward_flops as f

    return f(B, H, T, T, d, causal)


def hopper_impls(dq_atomics: bool = False, bwd_schedules: bool = False) -> dict[str, dict]:
    """{row name: the hopper_attn_bwd module constants that row's build sets}: `hopper` the default build, `hopper
    atomics` (DQ_BULK = 0), and one row per other mix of the schedule switches, named after the switches on
    (`hopper no switches` for none)."""
    from ..hopper import hopper_attn_bwd

    impls = {"hopper": {}}
    if dq_atomics:
        impls["hopper atomics"] = {"DQ_BULK": 0}
    if bwd_schedules:
        names = hopper_attn_bwd.SCHEDULE_SWITCHES
        default = tuple(hopper_attn_bwd.schedule()[n] for n in names)
        for mix in itertools.product((0, 1), repeat=len(names)):
            if mix != default:
                label = "+".join(n.lower() for n, on in zip(names, mix) if on) or "no switches"
                impls[f"hopper {label}"] = dict(zip(names, mix))
    return impls


def _hopper_backward(args: tuple, causal: bool, settings: dict) -> None:
    """hopper_attn_bwd.backward with the module constants in `settings` (DQ_BULK, the schedule switches) set for the
    call: its kernels() reads them per call and picks that build."""
    from ..hopper import hopper_attn_bwd

    defaults = {name: getattr(hopper_attn_bwd, name) for name in settings}
    try:
        for name, value in settings.items():
            setattr(hopper_attn_bwd, name, value)
        hopper_attn_bwd.backward(*args, causal=causal)
    finally:
        for name, value in defaults.items():
            setattr(hopper_attn_bwd, name, value)


def bench_backward(Ts, Ds, bench_kw, dtype: str = "float16", dq_atomics: bool = False,
                   bwd_schedules: bool = False, causal_values=(False, True)) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..core.device import device_compute_capability
    from ..flash import flash2_mma, flash2_mma_bwd

    hopper = device_compute_capability()[0] == 9  # the sm_90a backward runs on a Hopper only
    hoppers = hopper_impls(dq_atomics, bwd_schedules) if hopper else {}
    impls = ("ours", *hoppers, *SDPA_BACKENDS)
    rows = []
    for T in Ts:
        for d in Ds:
            gen = torch.Generator("cuda").manual_seed(T + d)
            q, k, v, do = (torch.randn(B, H, T, d, device="cuda", dtype=getattr(torch, dtype), generator=gen)
                           for _ in range(4))
            for causal in causal_values:
                flops = backward_flops(T, d, causal)
                fns, notes = {}, {}
                # ours: the launcher on CuPy views of the same tensors, outputs and workspace preallocated
                cq, ck, cv, cdo = (cp.from_dlpack(t) for t in (q, k, v, do))
                o, lse = flash2_mma.forward(cq, ck, cv, causal=causal, return_lse=True)
                dq, dk, dv = cp.empty_like(cq), cp.empty_like(ck), cp.empty_like(cv)
                ws = cp.empty(flash2_mma_bwd.workspace_elements(B, H, T, d), dtype=cp.float32)

                def ours():
                    flash2_mma_bwd.backward(cq, ck, cv, o, lse, cdo, causal=causal, dq=dq, dk=dk, dv=dv, workspace=ws)

                fns["ours"] = ours
                for impl, settings in hoppers.items():
                    fns[impl] = (lambda settings=settings:
                                 _hopper_backward((cq, ck, cv, o, lse, cdo), causal, settings))
                for name, backend in SDPA_BACKENDS.items():
                    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
                    try:
                        with sdpa_kernel(getattr(SDPBackend, backend)):
                            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

                        def peer(out=out, qg=qg, kg=kg, vg=vg):
                            torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)

                        peer()  # a backend may refuse the backward too: before the timing, not in it
                        fns[name] = peer
                    except RuntimeError as e:
                        notes[name] = f"not run: {str(e).splitlines()[0][:120]}"
                    finally:
                        del qg, kg, vg
                        out = None
                times = compare(fns, rounds=ROUNDS, **bench_kw)
                del o, lse, dq, dk, dv, ws, fns
                for impl in impls:
                    row = {"impl": impl, "T": T, "d": d, "causal": causal}
                    t = times.get(impl)
                    if t is None:
                        row["note"] = notes[impl]
                    else:
                        row.update({"kernel ms": t.ms, "spread %": 100 * (t.max_ms - t.min_ms) / t.ms,
                                    "call ms": t.call_ms, "TFLOP/s": t.tflops(flops)})
                        for col, p in (("vs flash", "sdpa_flash"), ("vs cuDNN", "sdpa_cudnn")):
                            row[col] = paired_ratio(t, times[p]) if p in times else None
                        row["rounds ms"] = list(t.rounds)
                    rows.append(row)
                torch.cuda.synchronize()
            del q, k, v, do
            torch.cuda.empty_cache()
    return rows


def _op_forward(kernel: str, q, k, v, causal: bool):
    """The operator's body with HOPPER_FWD_MIN_T set for the call so that forward_kernel picks `kernel`."""
    from ..pytorch import torch_ops

    saved = torch_ops.HOPPER_FWD_MIN_T
    torch_ops.HOPPER_FWD_MIN_T = dict.fromkeys(saved, 1 if kernel == "hopper_attn" else math.inf)
    try:
        return torch_ops.flash_attn_fwd_impl(q, k, v, causal, 1 / math.sqrt(q.shape[-1]))
    finally:
        torch_ops.HOPPER_FWD_MIN_T = saved


def bench_forward(Ts, Ds, bench_kw, dtype: str = "float16") -> list[dict]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..core.device import device_compute_capability
    from ..core.timing import attention_flops
    from ..hopper import hopper_attn

    rows = []
    for T, d, causal in itertools.product(Ts, Ds, (False, True)):
        gen = torch.Generator("cuda").manual_seed(T + d)
        q, k, v = (torch.randn(B, H, T, d, device="cuda", dtype=getattr(torch, dtype), generator=gen) for _ in range(3))
        kerns = ["flash2_mma"] + (["hopper_attn"] if device_compute_capability()[0] == 9
                                  and d in hopper_attn.HEAD_DIMS else [])
        fns = {f"op {kern}": (lambda kern=kern: _op_forward(kern, q, k, v, causal)) for kern in kerns}

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        try:
            cudnn()
            fns["sdpa_cudnn"] = cudnn
        except RuntimeError as e:
            rows.append({"impl": "sdpa_cudnn", "T": T, "d": d, "causal": causal, "note": f"not run: {e}"[:120]})
        times = compare(fns, rounds=ROUNDS, **bench_kw)
        for impl, t in times.items():
            rows.append({"impl": impl, "T": T, "d": d, "causal": causal, "kernel ms": t.ms, "call ms": t.call_ms,
                         "TFLOP/s": t.tflops(attention_flops(B, H, T, T, d, causal)),
                         "vs flash2_mma": paired_ratio(t, times["op flash2_mma"]),
                         "vs cuDNN": paired_ratio(t, times["sdpa_cudnn"]) if "sdpa_cudnn" in times else None,
                         "rounds ms": list(t.rounds)})
        del fns, times  # (q, k, v go with the next shape: the closures above read them)
        torch.cuda.empty_cache()
    return rows


def hopper_launches(q, k, v, d: int, causal: bool = True) -> dict:
    """{launch: zero-argument callable}: hopper_attn.forward with each launch (part 6), with or without the causal
    mask; the round robin (persistent=True) and, under the mask, one CTA per work tile (persistent=False)."""
    from ..hopper import hopper_attn

    fns = {"default launch": lambda: hopper_attn.forward(q, k, v, causal=causal)}
    for persistent in ((False, True, "dynamic") if causal else (True, "dynamic")):
        fns[f"persistent={persistent!r}"] = (lambda p=persistent: hopper_attn.forward(q, k, v, causal=causal,
                                                                                        persistent=p))
    if d == 64 and causal:
        fns["persistent='dynamic' tiles=(128, 128, 4)"] = (
            lambda: hopper_attn.forward(q, k, v, causal=True, persistent="dynamic", tiles=(128, 128, 4)))
    return fns


def bench_launch(Ts, Ds, bench_kw, dtype: str = "float16", masks=("causal",)) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..core.device import device_compute_capability
    from ..core.timing import attention_flops
    from ..hopper import hopper_attn

    if device_compute_capability()[0] != 9:
        return [{"impl": "hopper_attn", "note": "not run: the Hopper forward needs compute capability 9.x"}]
    rows = []
    for T, d, mask in itertools.product(Ts, Ds, masks):
        causal = mask == "causal"
        gen = torch.Generator("cuda").manual_seed(T + d)
        q, k, v = (torch.randn(B, H, T, d, device="cuda", dtype=getattr(torch, dtype), generator=gen) for _ in range(3))
        fns = hopper_launches(*(cp.from_dlpack(x) for x in (q, k, v)), d, causal)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns["sdpa_cudnn"] = cudnn
        times = compare(fns, rounds=ROUNDS, **bench_kw)
        for impl, t in sorted(times.items(), key=lambda x: x[1].ms):
            rows.append({"impl": impl, "T": T, "d": d, "causal": causal,
                         "default launch": repr(hopper_attn.default_launch(d, causal)), "kernel ms": t.ms,
                         "TFLOP/s": t.tflops(attention_flops(B, H, T, T, d, causal)),
                         "vs cuDNN": paired_ratio(t, times["sdpa_cudnn"]), "rounds ms": list(t.rounds)})
        del fns, times
        torch.cuda.empty_cache()
    return rows


def bench_train(Ts, Ds, bench_kw) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..pytorch import torch_ops
    from ..pytorch.tiny_gpt import TinyGPT, train_step

    def sdpa(backend):
        def attn(q, k, v):
            with sdpa_kernel(getattr(SDPBackend, backend)):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return attn

    attns = {"ours": lambda q, k, v: torch_ops.attention(q, k, v, causal=True),
             **{impl: sdpa(backend) for impl, backend in SDPA_BACKENDS.items()}}
    rows = []
    for T, d in itertools.product(Ts, Ds):
        shape = {"T": T, "d": d, "B": max(1, TRAIN_TOKENS // T), "C": TRAIN_HEADS * d, "layers": TRAIN_LAYERS}
        batch = torch.randint(0, 256, (shape["B"], T + 1), device="cuda",
                              generator=torch.Generator("cuda").manual_seed(T + d))
        steps = {}
        for impl, attn in attns.items():
            torch.manual_seed(0)  # the same weights for every implementation
            model = TinyGPT(attn, C=shape["C"], H=TRAIN_HEADS, L=TRAIN_LAYERS, T=T).cuda()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            steps[impl] = lambda model=model, opt=opt: train_step(model, opt, batch, autocast_dtype=torch.bfloat16)
        fns, notes = runnable(steps, errors=RuntimeError)  # one that refuses the shape is recorded, not timed
        times = compare(fns, rounds=ROUNDS, **bench_kw) if fns else {}
        for impl in attns:
            row = {"impl": impl, **shape}
            t = times.get(impl)
            if t is None:
                row["note"] = notes[impl]
            else:
                row.update({"kernel ms": t.ms, "call ms": t.call_ms, "rounds ms": list(t.rounds)})
                for col, p in (("vs cuDNN", "sdpa_cudnn"), ("vs flash", "sdpa_flash")):
                    row[col] = paired_ratio(t, times[p]) if p in times else None
            rows.append(row)
        del fns, times, batch
        torch.cuda.empty_cache()
    return rows


def bench_softmax(bench_kw) -> list[dict]:
    import torch

    from ..pytorch import torch_ops

    rows = []
    for label, (R, C) in SOFTMAX_SHAPES.items():
        gen = torch.Generator("cuda").manual_seed(R + C)
        x = torch.randn(R, C, device="cuda", generator=gen)
        dy = torch.randn(R, C, device="cuda", generator=gen)
        lengths = torch.randint(1, C + 1, (R,), device="cuda", generator=gen, dtype=torch.int32)
        mask = torch.arange(C, device="cuda")[None, :] >= lengths[:, None]  # True: padding
        y = torch_ops.masked_softmax(x, lengths)
        nbytes = {"forward": 2 * R * C * 4, "backward": 3 * R * C * 4}
        cases = {
            ("forward", "ours"): lambda: torch.ops.course.masked_softmax(x, lengths),
            ("forward", "torch masked_fill+softmax"): lambda: torch.softmax(x.masked_fill(mask, -math.inf), -1),
            ("backward", "ours"): lambda: torch.ops.course.masked_softmax_bwd(y, dy, lengths),
            ("backward", "torch softmax_backward+masked_fill"):
                lambda: torch._softmax_backward_data(dy, y, -1, torch.float32).masked_fill_(mask, 0.0),
        }
        if hasattr(torch, "_masked_softmax"):
            cases[("forward", "torch._masked_softmax (fused)")] = lambda: torch._masked_softmax(x, mask, 1, 2)
        fns, notes = runnable(cases, errors=RuntimeError)  # one that this torch refuses is recorded, not timed
        times = compare(fns, rounds=ROUNDS, **bench_kw) if fns else {}
        for direction, impl in cases:
            row = {"shape": label, "rows": R, "cols": C, "direction": direction, "impl": impl}
            t, ours = times.get((direction, impl)), times.get((direction, "ours"))
            if t is None:
                row["note"] = notes[(direction, impl)]
            else:
                row.update({"kernel ms": t.ms, "call ms": t.call_ms, "GB/s": nbytes[direction] / (t.ms * 1e-3) / 1e9,
                            "ours faster by": paired_ratio(ours, t) if ours is not None else None,
                            "rounds ms": list(t.rounds)})
            rows.append(row)
        del x, dy, y, mask, cases, fns
        torch.cuda.empty_cache()
    return rows


def bench_host() -> dict:
    import torch
    import torch.nn.functional as F

    from ..flash import flash2_mma
    from ..pytorch import torch_ops

    q, k, v = (torch.randn(*HOST_SHAPE, device="cuda", dtype=torch.float16) for _ in range(3))
    cq, ck, cv = (cp.from_dlpack(t) for t in (q, k, v))
    x = torch.randn(8, 64, device="cuda")
    lengths = torch.full((8,), 40, dtype=torch.int32, device="cuda")
    from ..basics import softmax

    cx, cl = cp.from_dlpack(x), cp.from_dlpack(lengths)
    scale = 1 / math.sqrt(HOST_SHAPE[-1])
    return {
        "attention op (torch_ops.attention)": host_overhead_us(lambda: torch_ops.attention(q, k, v)),
        "the op's body, no dispatcher (flash_attn_fwd_impl)":
            host_overhead_us(lambda: torch_ops.flash_attn_fwd_impl(q, k, v, False, scale)),
        "flash2_mma.forward launcher (CuPy arrays)": host_overhead_us(lambda: flash2_mma.forward(cq, ck, cv)),
        "tensor -> CuPy: cupy.from_dlpack(tensor)": host_overhead_us(lambda: cp.from_dlpack(q)),
        "tensor -> CuPy: torch_ops.to_cupy (no handshake)": host_overhead_us(lambda: torch_ops.to_cupy(q)),
        "torch SDPA call": host_overhead_us(lambda: F.scaled_dot_product_attention(q, k, v)),
        "masked_softmax op": host_overhead_us(lambda: torch_ops.masked_softmax(x, lengths)),
        "softmax.masked_softmax launcher (CuPy arrays)": host_overhead_us(lambda: softmax.masked_softmax(cx, cl)),
    }


def run(Ts=TS, Ds=DS, bench_kw=None, out_path: Path | None = None, parts=("backward", "softmax", "host"),
        command: str | None = None, dtype: str = "float16", dq_atomics: bool = False,
        bwd_schedules: bool = False, launch_masks=("causal",)) -> dict:
    bench_kw = bench_kw or {}
    result = {"gpu": gpu_name(), "B": B, "H": H, "dtype": dtype, "backward_flops": "2.5 x forward",
              "T": list(Ts), "d": list(Ds), "rounds": ROUNDS, "command": command,
              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if "backward" in parts:
        result["backward"] = bench_backward(Ts, Ds, bench_kw, dtype, dq_atomics, bwd_schedules)
    if "forward" in parts:
        result["forward"] = bench_forward(Ts, Ds, bench_kw, dtype)
    if "train" in parts:
        result["train"] = bench_train(Ts, Ds, bench_kw)
    if "launch" in parts:
        result["launch"] = bench_launch(Ts, Ds, bench_kw, dtype, launch_masks)
    if "softmax" in parts:
        result["softmax"] = bench_softmax(bench_kw)
    if "host" in parts:
        result["host_overhead_us"] = bench_host()
    return save_result(result, out_path)


def summary(result: dict) -> str:
    """The tables as text."""
    parts = [f"GPU: {result['gpu']}"]
    if "backward" in result:
        parts.append(format_table(result["backward"], ["impl", "T", "d", "causal", "kernel ms", "call ms", "TFLOP/s",
                                                       "vs flash", "vs cuDNN", "note"]))
    if "forward" in result:
        parts.append(format_table(result["forward"], ["impl", "T", "d", "causal", "kernel ms", "call ms", "TFLOP/s",
                                                      "vs flash2_mma", "vs cuDNN", "note"]))
    if "train" in result:
        parts.append(format_table(result["train"], ["impl", "T", "d", "B", "C", "layers", "kernel ms", "call ms",
                                                    "vs cuDNN", "vs flash", "note"]))
    if "launch" in result:
        parts.append(format_table(result["launch"], ["impl", "T", "d", "causal", "default launch", "kernel ms",
                                                     "TFLOP/s", "vs cuDNN", "note"]))
    if "softmax" in result:
        parts.append(format_table(result["softmax"], ["shape", "direction", "impl", "kernel ms", "call ms", "GB/s",
                                                      "ours faster by", "note"]))
    if "host_overhead_us" in result:
        parts.append("\n".join(f"{k:52s} {v:7.1f} us" for k, v in result["host_overhead_us"].items()))
    return "\n\n".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m kernels.bench.torch_ops", description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=list(TS))
    p.add_argument("--d", type=int, nargs="+", default=list(DS))
    p.add_argument("--parts", nargs="+", default=["backward", "softmax", "host"],
                   choices=("backward", "forward", "train", "softmax", "host", "launch"))
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16",
                   help="of the backward, forward and launch parts")
    p.add_argument("--dq-atomics", action="store_true",
                   help="on a Hopper, also the backward's build that adds dQ by atomics (-D DQ_BULK=0)")
    p.add_argument("--bwd-schedules", action="store_true",
                   help="on a Hopper, also the backward's builds of every mix of its schedule switches "
                        "(-D EARLY_P, EARLY_KV, DQ_FIRST)")
    p.add_argument("--launch-masks", nargs="+", choices=("causal", "full"), default=["causal"],
                   help="of the launch part: with the causal mask, without it (full), or both")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench-torch.json")
    args = p.parse_args(argv)
    missing = gpu_missing("python3 -m kernels.bench.torch_ops")
    if missing is not None:
        return missing
    command = " ".join(["python3 -m kernels.bench.torch_ops", *(sys.argv[1:] if argv is None else argv)])
    result = run(args.T, args.d, dict(batches=args.batches, calls=args.calls, warmup=1), args.out, args.parts, command,
                 args.dtype, args.dq_atomics, args.bwd_schedules, args.launch_masks)
    print(summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
