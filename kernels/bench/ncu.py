"""Profile flash2_mma beside SDPA's flash kernel (FlashAttention-2), or hopper_fa3 beside cuDNN's, with Nsight Compute.

    python3 -m kernels.bench.ncu > results/h100-ncu.txt
    python3 -m kernels.bench.ncu --hopper > results/h100-ncu-hopper.txt
    python3 -m kernels.bench.ncu --hopper-backward > results/h100-ncu-hopper-bwd.txt

fp16, B=4, H=32, T=4096, d in {64, 128}, not causal; one launch of each kernel is profiled and a table of
duration, registers, warps per SM, tensor-pipe activity, issue activity, instructions and stall reasons is
printed. flash2_mma runs twice per d: with the kernel's row-by-row loop on the tile that was the default before the
ILP loop ("row loop", the "before" of notebook 06, section 7) and with the default build ("default": the ILP loop
at d=128, the fused ILP loop at d=64). Notebook 06 shows the table recorded on the H100 (results/h100-ncu.txt).
With --hopper: hopper_fa3 (kernels/hopper/hopper_attn.cu) and SDPA's cuDNN backend, once each per d, with the
Hopper rows added (wgmma's tensor-pipe activity, memory throughput); notebook 13 shows results/h100-ncu-hopper.txt.
With --hopper-backward: the backward of each, the same shapes and metrics: the kernels launched inside an NVTX range
around each backward (ours: preprocess, main, postprocess; cuDNN's, whatever they are named), the longest of each
side's shown as its main kernel, with every kernel's duration summed. Needs `ncu` on the PATH.
"""

import argparse
import csv
import io
import shutil
import subprocess
import sys

from .common import NO_GPU, ROOT, gpu_missing

STALLS = ["wait", "short_scoreboard", "long_scoreboard", "barrier", "math_pipe_throttle", "mio_throttle",
          "not_selected", "dispatch_stall", "no_instruction", "lg_throttle"]
METRICS = {
    "gpu__time_duration.sum": "duration",
    "launch__registers_per_thread": "registers/thread",
    "sm__warps_active.avg.per_cycle_active": "active warps/SM",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe active %",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue slots busy %",
    "smsp__inst_executed.sum": "instructions executed",
    **{f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio": f"stall {s} (cycles/issue)" for s in STALLS},
}
KERNELS = "regex:flash2_mma_forward|flash_fwd_kernel"
# The "before" build per d: the row-by-row loop on the tile that was the default before the ILP loop.
ROW_LOOP_TILES = {64: (64, 4, 2, 3, False), 128: (64, 4, 2, 1, False)}
COLUMNS = [f"{n} d={d}" for d in (64, 128) for n in ("mma row loop", "mma default", "SDPA flash")]


def launch():
    """The profiled process: each kernel once per d (SDPA's backend is tried, then run: keep its first launch)."""
    sys.path.insert(0, str(ROOT))
    import cupy as cp

    import reference as R
    from ..flash import flash2_mma as M
    from .attention import sdpa_peer

    for d in (64, 128):
        q, k, v = (cp.asarray(x.astype("float16")) for x in R.make_qkv(4, 32, 4096, d, seed=1))
        M.forward(q, k, v, causal=False, tile=ROW_LOOP_TILES[d])
        M.forward(q, k, v, causal=False)
        sdpa_peer("sdpa_flash", q, k, v, False)  # launches the flash kernel once, to check that it runs
    cp.cuda.Device().synchronize()


# --hopper: hopper_fa3 against cuDNN's fused attention. On the H100 the tensor pipe's "hmma" cycle counter also counts
# wgmma's cycles (hopper_fa3 has no mma.sync at all, yet reads about 70%); wgmma instructions have a counter of their
# own. The stall reasons of a warp-specialised kernel mix the producer's waits (one thread) with the consumers'.
HOPPER_METRICS = {
    "gpu__time_duration.sum": "duration",
    "launch__registers_per_thread": "registers/thread",
    "launch__block_size": "threads/block",
    "launch__grid_size": "blocks",
    "sm__warps_active.avg.per_cycle_active": "active warps/SM",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe active %",
    "sm__inst_executed_pipe_tensor_op_gmma.sum": "wgmma instructions (per warp)",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue slots busy %",
    "smsp__inst_executed.sum": "instructions executed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM throughput %",
    "lts__t_sector_hit_rate.pct": "L2 hit rate %",
    **{f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio": f"stall {s} (cycles/issue)" for s in STALLS},
}
HOPPER_KERNELS = "regex:hopper_attn|cudnn|sdpa"
HOPPER_KERNELS_ALL = "regex:.*"  # with --hopper-backward the NVTX range picks the kernels


def launch_hopper():
    sys.path.insert(0, str(ROOT))
    import cupy as cp

    import reference as R
    from ..hopper import hopper_attn as A
    from .attention import sdpa_peer

    for d in (64, 128):
        q, k, v = (cp.asarray(x.astype("float16")) for x in R.make_qkv(4, 32, 4096, d, seed=1))
        A.forward(q, k, v, causal=False)
        sdpa_peer("sdpa_cudnn", q, k, v, False)  # launches cuDNN's kernel once, to check that it runs
    cp.cuda.Device().synchronize()


BACKWARD_RANGE = "backward"  # the NVTX range launch_hopper_backward puts around each backward


def launch_hopper_backward():
    """Our Hopper backward and cuDNN's (through SDPA's autograd), once each per d, each inside the NVTX range; the
    forwards that feed them run outside it."""
    sys.path.insert(0, str(ROOT))
    import cupy as cp
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import reference as R
    from ..hopper import hopper_attn as A
    from ..hopper import hopper_attn_bwd as BWD

    class Mark(torch.autograd.Function):
        """The identity, whose backward pushes (push) or pops the range. Autograd runs CUDA backwards on a thread of
        its own, and an NVTX push/pop range holds only the launches of the thread that pushed it: so SDPA's output
        pushes it and its query pops it, on that thread, around cuDNN's backward kernels."""

        @staticmethod
        def forward(ctx, x, push):
            ctx.push = push
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            if ctx.push:
                torch.cuda.nvtx.range_push(BACKWARD_RANGE)
            else:
                torch.cuda.nvtx.range_pop()
            return grad, None

    for d in (64, 128):
        q, k, v = (cp.asarray(x.astype("float16")) for x in R.make_qkv(4, 32, 4096, d, seed=1))
        do = cp.asarray(R.make_qkv(4, 32, 4096, d, seed=2)[0].astype("float16"))
        o, lse = A.forward(q, k, v, causal=False, return_lse=True)
        cp.cuda.Device().synchronize()
        torch.cuda.nvtx.range_push(BACKWARD_RANGE)
        BWD.backward(q, k, v, o, lse, do, causal=False)
        cp.cuda.Device().synchronize()
        torch.cuda.nvtx.range_pop()
        qt, kt, vt = (torch.from_dlpack(x).requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ot = Mark.apply(F.scaled_dot_product_attention(Mark.apply(qt, False), kt, vt), True)
        torch.cuda.synchronize()
        ot.backward(torch.from_dlpack(do))
        torch.cuda.synchronize()


def profile(kernels, metrics, flag, nvtx_range=None):
    """Run this module under ncu with `flag` (the launching side), profiling the kernels matching `kernels` (and, with
    nvtx_range, only those launched inside that push/pop range); return (header, units, one row per kernel)."""
    only = ["--nvtx", "--nvtx-include", f"{nvtx_range}/"] if nvtx_range else []
    cmd = ["ncu", "--clock-control", "none", "--csv", "--page", "raw", *only, "-k", kernels, "--metrics",
           ",".join(metrics), sys.executable, "-m", "kernels.bench.ncu", flag]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    rows = list(csv.reader(io.StringIO(out[out.index('"ID"'):])))
    return rows[0], rows[1], [r for r in rows[2:] if r and r[0].isdigit()]


def print_table(head, units, data, names, metrics):
    print(f"{'metric':46s}" + "".join(f"{n:>19s}" for n in names))
    for key, label in metrics.items():
        if key not in head:  # a metric this GPU or ncu version does not have
            print(f"{label:46s}" + "".join(f"{'n/a':>19s}" for _ in data))
            continue
        i = head.index(key)
        unit = units[i].strip()
        label = f"{label} [{unit}]" if unit and unit != "%" else label
        cells = []
        for r in data:
            try:
                x = float(r[i].replace(",", ""))
                cells.append(f"{x:19.4g}")
            except ValueError:
                cells.append(f"{r[i]:>19s}")
        print(f"{label:46s}" + "".join(cells))
    print("kernels: " + "; ".join(r[head.index("Kernel Name")][:48] for r in data))


def main():
    head, units, data = profile(KERNELS, METRICS, "--launch")
    kinds = ["mma" if "flash2_mma" in r[head.index("Kernel Name")] else "SDPA" for r in data]
    if len(data) != len(COLUMNS) or kinds != [c.split()[0] for c in COLUMNS]:
        raise RuntimeError(f"expected the launches {COLUMNS}, got kernels {kinds}")
    print("Nsight Compute, fp16 B=4 H=32 T=4096 not causal, one launch of each kernel; command:")
    print(f"  ncu --clock-control none --csv --page raw -k '{KERNELS}' --metrics <the metrics below> "
          "python3 -m kernels.bench.ncu --launch")
    print_table(head, units, data, COLUMNS, METRICS)


def main_hopper():
    head, units, data = profile(HOPPER_KERNELS, HOPPER_METRICS, "--launch-hopper")
    kinds = ["ours" if "hopper_attn" in r[head.index("Kernel Name")] else "cuDNN" for r in data]
    if kinds != ["ours", "cuDNN", "ours", "cuDNN"]:  # launch order: ours then cuDNN's, d = 64 first
        raise RuntimeError(f"expected one launch each of hopper_fa3 and cuDNN per d, got kernels {kinds}")
    names = [f"{kind} d={(64, 128)[i // 2]}" for i, kind in enumerate(kinds)]
    print("Nsight Compute, fp16 B=4 H=32 T=4096 not causal, one launch of each kernel; command:")
    print(f"  ncu --clock-control none --csv --page raw -k '{HOPPER_KERNELS}' --metrics <the metrics below> "
          "python3 -m kernels.bench.ncu --launch-hopper")
    print_table(head, units, data, names, HOPPER_METRICS)


def backward_sides(names: list[str]) -> list[tuple[str, int, list[int]]]:
    """The profiled backward kernels, in launch order, grouped as (side, d, row indices): ours (hopper_bwd_*) then
    cuDNN's, for d = 64 then 128. Raises where the launches do not come in that pattern."""
    groups: list[tuple[str, list[int]]] = []
    for i, name in enumerate(names):
        side = "ours" if name.startswith("hopper_bwd") else "cuDNN"
        if groups and groups[-1][0] == side:
            groups[-1][1].append(i)
        else:
            groups.append((side, [i]))
    if [g[0] for g in groups] != ["ours", "cuDNN", "ours", "cuDNN"]:
        raise RuntimeError(f"expected our backward then cuDNN's, for d = 64 and 128; got kernels {names}")
    return [(side, (64, 64, 128, 128)[j], rows) for j, (side, rows) in enumerate(groups)]


def main_hopper_backward():
    head, units, data = profile(HOPPER_KERNELS_ALL, HOPPER_METRICS, "--launch-hopper-backward", BACKWARD_RANGE)
    names = [r[head.index("Kernel Name")] for r in data]
    duration = head.index("gpu__time_duration.sum")
    sides = backward_sides(names)
    main_rows = [max(rows, key=lambda i: float(data[i][duration].replace(",", ""))) for _, _, rows in sides]
    print("Nsight Compute, fp16 B=4 H=32 T=4096 not causal, one backward of each; the main (longest) kernel of each "
          "side below; command:")
    print(f"  ncu --clock-control none --csv --page raw --nvtx --nvtx-include '{BACKWARD_RANGE}/' -k "
          f"'{HOPPER_KERNELS_ALL}' --metrics <the metrics below> python3 -m kernels.bench.ncu --launch-hopper-backward")
    print_table(head, units, [data[i] for i in main_rows], [f"{side} d={d}" for side, d, _ in sides], HOPPER_METRICS)
    print(f"{'all kernels of the backward: duration [' + units[duration].strip() + ']':46s}" +
          "".join(f"{sum(float(data[i][duration].replace(',', '')) for i in rows):19.4g}" for _, _, rows in sides))
    for side, d, rows in sides:
        print(f"  {side} d={d}: " + "; ".join(names[i][:60] for i in rows))


def cli(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m kernels.bench.ncu", description=__doc__.split("\n")[0],
                                epilog="Needs Nsight Compute's ncu on the PATH and a CUDA GPU.")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--hopper", action="store_true", help="profile hopper_fa3 beside cuDNN instead (an H100)")
    what.add_argument("--hopper-backward", action="store_true",
                      help="profile the Hopper backward beside cuDNN's backward instead (an H100)")
    what.add_argument("--launch", action="store_true", help=argparse.SUPPRESS)  # the side that ncu runs
    what.add_argument("--launch-hopper", action="store_true", help=argparse.SUPPRESS)
    what.add_argument("--launch-hopper-backward", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    launchers = {"launch": launch, "launch_hopper": launch_hopper, "launch_hopper_backward": launch_hopper_backward}
    for flag, launcher in launchers.items():
        if getattr(args, flag):
            launcher()
            return 0
    if shutil.which("ncu") is None:
        print("kernels.bench.ncu needs Nsight Compute's `ncu` on the PATH (it comes with the CUDA toolkit)",
              file=sys.stderr)
        return NO_GPU
    missing = gpu_missing("python3 -m kernels.bench.ncu")
    if missing is not None:
        return missing
    (main_hopper if args.hopper else main_hopper_backward if args.hopper_backward else main)()
    return 0


if __name__ == "__main__":
    sys.exit(cli())
