"""A BERT-style attention layer run padded and packed: `python3 -m kernels.bench.varlen`.

The layer (float16, hidden 1024, 16 heads of d = 64, no causal mask, as in an encoder):

    qkv = x W_qkv + b_qkv          one GEMM for q, k and v: (tokens, hidden) x (hidden, 3 hidden)
    a   = attention(q, k, v)       per sequence
    out = a W_o + b_o              (tokens, hidden) x (hidden, hidden)

on batches whose lengths are drawn so that the mean is 1/2 and 1/4 of the longest (one sequence has the longest
length, Tmax). Every variant does its GEMMs with torch (cuBLAS), so the GEMMs cost the same per token everywhere:

    padded sdpa+mask     the padded batch (B * Tmax tokens); SDPA with a boolean key mask (B, 1, 1, Tmax), the
                         backend torch picks for a mask. Correct on the real tokens; computes every padded row.
    padded sdpa (cost)   the same without the mask (SDPA picks FlashAttention): what padded attention costs at
                         best; NOT the right answer on real tokens (it attends to padding). A time, not a layer.
    padded ours (cost)   the same with our dense flash2_mma over (B, H, Tmax, d), after the transposes it needs;
                         also a cost, not a layer.
    packed ours          the real tokens only: GEMMs on (total, hidden), our varlen attention on views into the
                         fused QKV output (token stride 3 H d), no transposes.
    packed sdpa nested   the same packed GEMMs; SDPA on torch.nested jagged tensors built on the packed q, k, v
                         (offsets = cu_seqlens, max_seqlen given so that nothing syncs); "not run" where refused.
    unpad+packed+pad     packed ours plus remove_padding before and restore_padding after: the whole cost for a
                         model of ONE layer (a model of L layers pays the two copies once, not L times).

For each: kernel time and call time (kernels.benchmark), every variant of a batch timed side by side in ROUNDS rounds
(kernels.compare), each row its median round (`rounds_ms`: the kernel ms of every round); and the speedup of each over
"padded sdpa+mask" and of "packed ours" over "padded ours (cost)": the other's kernel time / this one's within a round,
the median over the rounds (kernels.paired_ratio). Against the ideal: padded tokens / real tokens (what the GEMMs can
gain) and padded attention FLOPs / real attention FLOPs (B Tmax^2 / sum l^2: what attention can gain). The
padding-removal kernels (cu_seqlens from a mask, gather, scatter) are timed apart from the layer (the four of a batch
side by side in ROUNDS rounds, each row its median round), in GB/s against the copy bandwidth of the same run.
Correctness: "packed ours" (restored) against the float64 reference (reference.bert_layer_packed) on the shortest
sequence and the longest of at most 512 tokens, with kernels.check at float16's tolerance.
Results go to results/bench-varlen.json, numbers as numbers.

    python3 -m kernels.bench.varlen                    # everything (about half a minute a round on an H100)
    python3 -m kernels.bench.varlen --batches 0        # one batch
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from .common import ROOT, gpu_missing, save_result
from ..core import check, format_table, gpu_name
from ..flash import flash2_mma
from ..inference import varlen
from ..core import cp
from ..core.timing import compare, copy_bandwidth_gbps, paired_ratio

HIDDEN, HEADS = 1024, 16
DTYPE = "float16"
BATCHES = [dict(B=32, Tmax=512, mean=1 / 2), dict(B=32, Tmax=512, mean=1 / 4),
           dict(B=8, Tmax=2048, mean=1 / 2), dict(B=8, Tmax=2048, mean=1 / 4)]
BASELINE = "padded sdpa+mask"
CHECK_MAX_LEN = 512
ROUNDS = 3  # rounds of kernels.compare per batch: every variant timed once per round, side by side


def draw_lengths(B: int, Tmax: int, mean: float, seed: int = 0) -> np.ndarray:
    """B lengths whose mean is mean * Tmax (to within rounding): the first is Tmax (the longest), the others drawn
    uniform and then scaled so that the total is round(mean * Tmax * B), each kept in [1, Tmax]."""
    rng = np.random.default_rng(seed)
    others = rng.uniform(0.05, 1.0, B - 1)
    target = round(mean * Tmax * B) - Tmax
    lengths = np.concatenate(([Tmax], np.clip(np.round(others * target / others.sum()), 1, Tmax)))
    return lengths.astype(np.int32)


def make_layer(B: int, Tmax: int, mean: float, *, hidden: int = HIDDEN, heads: int = HEADS, seed: int = 0) -> dict:
    """Inputs and weights of one batch (torch tensors and CuPy views of the same memory), and its index arrays."""
    import torch

    lengths = draw_lengths(B, Tmax, mean, seed)
    mask = np.arange(Tmax)[None, :] < lengths[:, None]
    rng = np.random.default_rng(seed + 1)
    w = [torch.from_numpy(a.astype(np.float16)).cuda() for a in
         (rng.standard_normal((hidden, 3 * hidden)) / math.sqrt(hidden), rng.standard_normal(3 * hidden) * 0.1,
          rng.standard_normal((hidden, hidden)) / math.sqrt(hidden), rng.standard_normal(hidden) * 0.1)]
    x = torch.from_numpy(rng.standard_normal((B, Tmax, hidden)).astype(np.float16)).cuda()
    mask_t = torch.from_numpy(mask).cuda()
    cu = varlen.cu_seqlens_from_lengths(cp.asarray(lengths), max_len=Tmax)
    return dict(B=B, Tmax=Tmax, hidden=hidden, heads=heads, d=hidden // heads, lengths=lengths, mask=mask,
                total=int(lengths.sum()), max_len=int(lengths.max()), w=w, x=x, x_cp=cp.from_dlpack(x),
                mask_t=mask_t, key_mask=mask_t[:, None, None, :], mask_cp=cp.asarray(mask), cu=cu,
                offsets=torch.from_dlpack(cu).to(torch.int64), seed=seed)


def _gemm(x2d, w, b):
    import torch

    return torch.addmm(b, x2d, w)


def layer_padded_sdpa(p: dict, *, masked: bool = True):
    """The padded layer with SDPA (with the key mask: correct on real tokens; without: a cost only)."""
    import torch.nn.functional as F

    B, T, hid, H, d = p["B"], p["Tmax"], p["hidden"], p["heads"], p["d"]
    w_qkv, b_qkv, w_o, b_o = p["w"]
    qkv = _gemm(p["x"].view(B * T, hid), w_qkv, b_qkv).view(B, T, 3, H, d)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, T, d) views
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=p["key_mask"] if masked else None)
    return _gemm(a.transpose(1, 2).reshape(B * T, hid), w_o, b_o).view(B, T, hid)


def layer_padded_ours(p: dict):
    """The padded layer with our dense kernel (no key mask: a cost only): (B, H, T, d) copies in and out."""
    import torch

    B, T, hid, H, d = p["B"], p["Tmax"], p["hidden"], p["heads"], p["d"]
    w_qkv, b_qkv, w_o, b_o = p["w"]
    qkv = _gemm(p["x"].view(B * T, hid), w_qkv, b_qkv).view(B, T, 3, H, d).permute(2, 0, 3, 1, 4).contiguous()
    q, k, v = (cp.from_dlpack(qkv[i]) for i in range(3))
    a = torch.from_dlpack(flash2_mma.forward(q, k, v))
    return _gemm(a.transpose(1, 2).reshape(B * T, hid), w_o, b_o).view(B, T, hid)


def layer_packed(p: dict, packed_x):
    """The layer on packed tokens (total, hidden) with our varlen attention; returns (total, hidden)."""
    import torch

    total, hid, H, d = p["total"], p["hidden"], p["heads"], p["d"]
    w_qkv, b_qkv, w_o, b_o = p["w"]
    qkv = cp.from_dlpack(_gemm(packed_x, w_qkv, b_qkv)).reshape(total, 3, H, d)
    a = flash2_mma.forward_varlen(qkv[:, 0], qkv[:, 1], qkv[:, 2], p["cu"], p["cu"], p["max_len"], p["max_len"])
    return _gemm(torch.from_dlpack(a).view(total, hid), w_o, b_o)


def layer_packed_nested(p: dict, packed_x, contiguous: bool = False):
    """The layer on packed tokens with SDPA on nested (jagged) tensors; returns (total, hidden). contiguous=True
    copies q, k, v out of the fused QKV output first (for a torch that refuses the strided views)."""
    import torch
    import torch.nn.functional as F

    total, hid, H, d = p["total"], p["hidden"], p["heads"], p["d"]
    w_qkv, b_qkv, w_o, b_o = p["w"]
    qkv = _gemm(packed_x, w_qkv, b_qkv).view(total, 3, H, d)
    parts = [qkv[:, i].contiguous() if contiguous else qkv[:, i] for i in range(3)]
    q, k, v = (torch.nested.nested_tensor_from_jagged(parts[i], p["offsets"], min_seqlen=int(p["lengths"].min()),
                                                      max_seqlen=p["max_len"]).transpose(1, 2) for i in range(3))
    a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).values()
    return _gemm(a.reshape(total, hid), w_o, b_o)


def layer_unpad_packed_pad(p: dict):
    """remove padding, the packed layer, restore padding: (B, Tmax, hidden) in and out."""
    import torch

    packed = torch.from_dlpack(varlen.remove_padding(p["x_cp"], p["cu"], p["total"]))
    out = cp.from_dlpack(layer_packed(p, packed))
    return varlen.restore_padding(out, p["cu"], p["Tmax"])


def check_layer(p: dict, out_padded) -> dict:
    """Our layer's output (B, Tmax, hidden) against the float64 reference on two sequences: the shortest and the
    longest of at most CHECK_MAX_LEN tokens (the float64 oracle's einsum is slow beyond that)."""
    import reference as R

    lengths = p["lengths"]
    short = np.where(lengths <= CHECK_MAX_LEN, lengths, -1)
    rows = [int(np.argmin(lengths)), int(np.argmax(short))]
    x = p["x"][rows].float().cpu().numpy().astype(np.float64)
    w = [t.float().cpu().numpy().astype(np.float64) for t in p["w"]]
    ref = R.bert_layer_packed(x, p["mask"][rows], w, p["heads"])
    out = cp.asnumpy(out_padded[rows]).astype(np.float64)
    m = p["mask"][rows]
    res = check(out[m], ref[m], DTYPE)
    padding_zero = bool((out[~m] == 0).all())
    return dict(res.as_dict(), ok=bool(res.ok and padding_zero), padding_zero=padding_zero, line=str(res))


def measure(p: dict) -> dict:
    """Every variant of one batch, side by side in ROUNDS rounds (kernels.compare): each runs once first, and one that
    this torch refuses is recorded as not run; the speedups are paired ratios (kernels.paired_ratio)."""
    import torch

    packed_x = torch.from_dlpack(varlen.remove_padding(p["x_cp"], p["cu"], p["total"]))
    variants = {
        BASELINE: lambda: layer_padded_sdpa(p),
        "padded sdpa (cost)": lambda: layer_padded_sdpa(p, masked=False),
        "padded ours (cost)": lambda: layer_padded_ours(p),
        "packed ours": lambda: layer_packed(p, packed_x),
        "packed sdpa nested": lambda: layer_packed_nested(p, packed_x),
        "unpad+packed+pad": lambda: layer_unpad_packed_pad(p),
    }
    fallbacks = {"packed sdpa nested": ("q, k, v copied out of the fused QKV (strided views refused)",
                                        lambda: layer_packed_nested(p, packed_x, contiguous=True))}
    rows, fns, notes = {}, {}, {}
    for name, fn in variants.items():
        note = ""
        for attempt in range(2):
            try:
                fn()
                torch.cuda.synchronize()
                error = None
                break
            except Exception as e:  # a torch feature this build refuses: recorded, not hidden
                error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
                if attempt or name not in fallbacks:
                    break
                note, fn = fallbacks[name]
        if error is not None:
            rows[name] = dict(not_run=error)
            continue
        rows[name], fns[name], notes[name] = {}, fn, note  # filled below, in the variants' order
    timings = compare(fns, rounds=ROUNDS) if fns else {}
    for name, t in timings.items():
        rows[name].update(kernel_ms=t.ms, call_ms=t.call_ms, note=notes[name], rounds_ms=list(t.rounds))
        if BASELINE in timings:
            rows[name]["speedup_vs_padded_sdpa_mask"] = paired_ratio(t, timings[BASELINE])
    if "packed ours" in timings and "padded ours (cost)" in timings:
        rows["packed ours"]["speedup_vs_padded_ours"] = paired_ratio(timings["packed ours"],
                                                                     timings["padded ours (cost)"])
    B, T = p["B"], p["Tmax"]
    ideal_tokens = B * T / p["total"]
    ideal_attention = B * T * T / float((p["lengths"].astype(np.float64) ** 2).sum())
    return dict(B=B, Tmax=T, hidden=p["hidden"], heads=p["heads"], d=p["d"], total=p["total"],
                mean_len=p["total"] / B, mean_over_max=p["total"] / B / T, ideal_tokens=ideal_tokens,
                ideal_attention=ideal_attention, variants=rows, correct=check_layer(p, layer_unpad_packed_pad(p)))


def padding_kernels(p: dict, copy_gbps: float) -> list[dict]:
    """cu_seqlens from the mask, gather and scatter of one batch, apart from the layer (the four side by side in ROUNDS
    rounds, each row its median round): kernel time, call time, GB/s."""
    packed = varlen.remove_padding(p["x_cp"], p["cu"], p["total"])
    row = p["hidden"] * 2
    moved = 2 * p["total"] * row  # gather: read and write each real row
    restored = p["total"] * row + p["B"] * p["Tmax"] * row  # scatter: read real rows, write every padded row
    steps = {"from_mask (2 kernels)": (lambda: varlen.from_mask(p["mask_cp"]), None),
             "cu_seqlens from lengths": (lambda: varlen.cu_seqlens_from_lengths(cp.asarray(p["lengths"]),
                                                                                max_len=p["Tmax"]), None),
             "remove_padding": (lambda: varlen.remove_padding(p["x_cp"], p["cu"], p["total"]), moved),
             "restore_padding": (lambda: varlen.restore_padding(packed, p["cu"], p["Tmax"]), restored)}
    timings = compare({name: fn for name, (fn, _) in steps.items()}, rounds=ROUNDS)
    out = []
    for name, (_, nbytes) in steps.items():
        t = timings[name]
        r = dict(step=name, B=p["B"], Tmax=p["Tmax"], kernel_us=t.ms * 1e3, call_us=t.call_ms * 1e3)
        if nbytes:
            r["GB/s"] = nbytes / t.ms / 1e6
            r["% of copy bw"] = 100 * r["GB/s"] / copy_gbps
        out.append(r)
    return out


def run(batches=range(len(BATCHES)), out_path: Path | None = None, log=print) -> dict:
    import torch

    copy_gbps = copy_bandwidth_gbps()
    log(f"{gpu_name()}: copy bandwidth {copy_gbps:.0f} GB/s; torch {torch.__version__}")
    result = dict(gpu=gpu_name(), torch=torch.__version__, dtype=DTYPE, hidden=HIDDEN, heads=HEADS,
                  copy_gbps=copy_gbps, rounds=ROUNDS, batches=[], padding_kernels=[])
    for i in batches:
        p = make_layer(**BATCHES[i], seed=i)
        result["batches"].append(measure(p))
        if BATCHES[i]["mean"] == 0.5:
            result["padding_kernels"] += padding_kernels(p, copy_gbps)
        log(format_table(table(dict(batches=result["batches"][-1:]))))
    return save_result(result, out_path)


def table(result: dict) -> list[dict]:
    """One row per batch and variant (for the command line and notebook 09)."""
    rows = []
    for b in result["batches"]:
        for name, r in b["variants"].items():
            row = {"batch": f"B={b['B']} Tmax={b['Tmax']} mean={b['mean_over_max']:.2f}", "variant": name}
            row["kernel ms"], row["call ms"] = r.get("kernel_ms", float("nan")), r.get("call_ms", float("nan"))
            row["vs padded sdpa+mask"] = r.get("speedup_vs_padded_sdpa_mask", float("nan"))
            row["vs padded ours"] = r.get("speedup_vs_padded_ours", "")
            row["ideal (tokens)"] = b["ideal_tokens"] if name == "packed ours" else ""
            row["ideal (attn)"] = b["ideal_attention"] if name == "packed ours" else ""
            row["note"] = ("not run: " + r["not_run"]) if "not_run" in r else r.get("note", "")
            rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m kernels.bench.varlen", description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="*", default=list(range(len(BATCHES))))
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench-varlen.json")
    args = p.parse_args(argv)
    missing = gpu_missing("python3 -m kernels.bench.varlen")
    if missing is not None:
        return missing
    result = run(args.batches, args.out)
    print(format_table(result["padding_kernels"]))
    for b in result["batches"]:
        print(f"B={b['B']} Tmax={b['Tmax']}: packed layer vs float64 reference: {b['correct']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
