"""Device check for kernels/flash1.py and kernels/flash2.py (a plain script, not collected by pytest).

    export PYTHONPATH=$PWD; python3 tests/devcheck_flash.py            # correctness grid + timings
    compute-sanitizer --tool memcheck python3 tests/devcheck_flash.py --small   # a few small shapes only
    python3 tests/devcheck_flash.py --tiles        # also check every tile of the sweeps on a smaller grid
    python3 tests/devcheck_flash.py --notebook notebooks/04_flash_attention_2.ipynb   # run its code cells

Checks "flash1" and "flash2_fp32" (O and LSE) against the float64 reference over T in {1, 7, 33, 100,
257, 1024}, d in {16, 32, 64, 128} and odd d, causal and not, Tq != Tk, large magnitudes, with every
allocation poisoned; the error messages; then times both at llm.c's shape (B=8, H=12, T=1024, d=64,
causal) next to torch SDPA float32 (efficient backend) and the naive kernel, and sweeps flash2 tiles.
"""

from __future__ import annotations

import sys

import cupy as cp
import numpy as np

import kernels
import kernels.flash1 as f1
import kernels.flash2 as f2
import reference
from kernels import attention_flops, benchmark, check, format_table

VARIANTS = {"flash1": f1.forward, "flash2_fp32": f2.forward}
SWEEP_TILES = {64: [(128, 64, 8, 8), (64, 64, 8, 8), (128, 64, 4, 8), (32, 64, 4, 8), (64, 32, 4, 4), (128, 32, 8, 4)],
               128: [(128, 64, 8, 4), (64, 64, 4, 8), (32, 32, 4, 4)]}


def configs(small=False):
    if small:
        for Tq, Tk, d, causal in ((33, 33, 64, True), (100, 7, 24, True), (7, 100, 128, False), (65, 130, 5, True),
                                  (130, 130, 32, False)):
            yield Tq, Tk, d, causal, 1.0
        return
    for T in (1, 7, 33, 100, 257, 1024):
        for d in (16, 32, 64, 128):
            for causal in (False, True):
                yield T, T, d, causal, 1.0
    for Tq, Tk in ((1, 100), (7, 33), (33, 7), (100, 257), (257, 100), (1, 1024), (1024, 257), (3, 1), (129, 1)):
        for d in (16, 64, 128):
            for causal in (False, True):
                yield Tq, Tk, d, causal, 1.0
    for Tq, Tk, d in ((100, 100, 24), (77, 200, 5), (200, 77, 100), (257, 257, 1), (64, 64, 127)):
        yield Tq, Tk, d, True, 1.0
    for Tq, Tk, d in ((100, 100, 64), (257, 257, 128), (1024, 1024, 64), (33, 100, 32), (100, 33, 16)):
        for causal in (False, True):
            yield Tq, Tk, d, causal, 10.0


def correctness(small=False):
    stats = {name: [0, 0, 0.0, 0.0] for name in VARIANTS}  # passed, total, worst rel err O, worst rel err LSE
    fails = []
    for Tq, Tk, d, causal, mag in configs(small):
        B, H = (1, 2) if max(Tq, Tk) >= 257 else (2, 3)
        qn, kn, vn = reference.make_qkv(B, H, Tq, d, Tk, magnitude=mag, seed=Tq * 7 + Tk + d)
        ref_o, ref_lse = reference.attention(qn, kn, vn, causal=causal, return_lse=True)
        q, k, v = cp.asarray(qn), cp.asarray(kn), cp.asarray(vn)
        for name, fn in VARIANTS.items():
            with kernels.poisoned_allocations():
                o, lse = fn(q, k, v, causal=causal, return_lse=True)
            ro, rl = check(o, ref_o), check(lse, ref_lse)
            s = stats[name]
            s[0] += ro.ok and rl.ok
            s[1] += 1
            s[2] = max(s[2], ro.rel_l2)
            s[3] = max(s[3], rl.rel_l2)
            if not (ro.ok and rl.ok):
                fails.append(f"{name} Tq={Tq} Tk={Tk} d={d} causal={causal} x{mag}: O {ro.detail()}; LSE {rl.detail()}")
    # explicit scale; misaligned (but contiguous) inputs take the scalar-load path of flash2
    qn, kn, vn = reference.make_qkv(2, 2, 45, 32, 45, seed=3)
    big = [cp.asarray(np.concatenate([x.ravel(), np.zeros(1, np.float32)])) for x in (qn, kn, vn)]
    shifted = [b[1:].reshape(x.shape) for b, x in zip(big, (qn, kn, vn))]  # offset by 4 bytes: not 16-aligned
    for b, x, s in zip(big, (qn, kn, vn), shifted):
        s[...] = cp.asarray(x)
    for name, fn in VARIANTS.items():
        ok1 = check(fn(*map(cp.asarray, (qn, kn, vn)), causal=True, scale=0.05),
                    reference.attention(qn, kn, vn, causal=True, scale=0.05)).ok
        ok2 = check(fn(*shifted, causal=True), reference.attention(qn, kn, vn, causal=True)).ok
        stats[name][0] += ok1 + ok2
        stats[name][1] += 2
        if not (ok1 and ok2):
            fails.append(f"{name}: explicit scale ok={ok1}, misaligned inputs ok={ok2}")
    rows = [{"variant": n, "passed": f"{s[0]}/{s[1]}", "worst rel err O": s[2], "worst rel err LSE": s[3]}
            for n, s in stats.items()]
    print(format_table(rows, floatfmt=".2e"))
    for f in fails[:12]:
        print("FAIL", f)
    return not fails


def tile_correctness():
    """Every tile of the sweeps, on a grid that crosses tile edges (so any of them may become a default)."""
    bad, n = [], 0
    for D, tiles in SWEEP_TILES.items():
        for tile in tiles:
            for (Tq, Tk), d, causal in [((Tq, Tk), d, c) for Tq, Tk in ((1, 1), (33, 33), (100, 257), (257, 100), (130, 130))
                                        for d in (D, D - 28) for c in (False, True)]:
                qn, kn, vn = reference.make_qkv(1, 2, Tq, d, Tk, magnitude=3.0, seed=Tq + d)
                ref_o, ref_lse = reference.attention(qn, kn, vn, causal=causal, return_lse=True)
                with kernels.poisoned_allocations():
                    o, lse = f2.forward(*map(cp.asarray, (qn, kn, vn)), causal=causal, return_lse=True, tile=tile)
                n += 1
                if not (check(o, ref_o).ok and check(lse, ref_lse).ok):
                    bad.append(f"tile {tile} Tq={Tq} Tk={Tk} d={d} causal={causal}: {check(o, ref_o).detail()}")
    print(f"sweep tiles: {n - len(bad)}/{n} correct")
    for b in bad[:8]:
        print("FAIL", b)
    return not bad


def run_notebook(path):
    """Execute a notebook's code cells in order in one namespace (no Jupyter needed); stop at the first error."""
    import json
    import traceback

    cells = [c for c in json.load(open(path))["cells"] if c["cell_type"] == "code"]
    ns = {"__name__": "__main__"}
    for i, c in enumerate(cells):
        src = "".join(c["source"])
        print(f"---- cell {i}")
        try:
            exec(compile(src, f"{path}:cell{i}", "exec"), ns)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            print(f"NOTEBOOK FAILED at code cell {i}")
            return False
    print(f"NOTEBOOK OK: {len(cells)} code cells")
    return True


def errors():
    q = cp.zeros((1, 1, 8, 136), cp.float32)
    for name, fn in VARIANTS.items():
        try:
            fn(q, q, q)
            print(f"{name}: d=136 accepted (should raise)")
        except ValueError as e:
            print(f"{name}: ValueError: {e}")


def timings():
    B, H, T, d = 8, 12, 1024, 64
    flops = attention_flops(B, H, T, T, d, causal=True)
    qn, kn, vn = reference.make_qkv(B, H, T, d, seed=1)
    q, k, v = cp.asarray(qn), cp.asarray(kn), cp.asarray(vn)
    rows = []

    def add(name, fn, runs=20):
        t = benchmark(fn, warmup=2 if runs < 20 else 3, runs=runs)
        rows.append({"kernel": name, "ms": t.ms, "TFLOP/s": t.tflops(flops)})
        return t.ms

    ms_f2 = add("flash2_fp32", lambda: f2.forward(q, k, v, causal=True))
    ms_sdpa = None
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = (torch.from_dlpack(x) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            ms_sdpa = add("torch SDPA efficient fp32", lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True))
    except Exception as e:  # noqa: BLE001
        print("torch SDPA unavailable:", type(e).__name__, e)
    for tile in SWEEP_TILES[64]:
        try:
            add(f"flash2 tile {tile}", lambda tile=tile: f2.forward(q, k, v, causal=True, tile=tile))
        except Exception as e:  # noqa: BLE001
            print("tile", tile, type(e).__name__, e)
    add("flash2_fp32 non-causal (x2 FLOPs)", lambda: f2.forward(q, k, v, causal=False))
    rows[-1]["TFLOP/s"] *= 2
    add("flash1", lambda: f1.forward(q, k, v, causal=True), runs=5)
    add("naive", lambda: kernels.REGISTRY["naive"].forward(q, k, v, causal=True), runs=3)
    print(f"B={B} H={H} T={T} d={d} causal float32 on {kernels.gpu_name()}")
    print(format_table(rows))
    if ms_sdpa:
        print(f"flash2_fp32 / SDPA efficient time ratio: {ms_f2 / ms_sdpa:.3f} (< 1 means flash2 is faster)")
    # d = 128
    qn, kn, vn = reference.make_qkv(B, H, T, 128, seed=2)
    q, k, v = cp.asarray(qn), cp.asarray(kn), cp.asarray(vn)
    flops = attention_flops(B, H, T, T, 128, causal=True)
    rows = []
    add("d=128 flash2_fp32", lambda: f2.forward(q, k, v, causal=True))
    for tile in SWEEP_TILES[128]:
        add(f"d=128 tile {tile}", lambda tile=tile: f2.forward(q, k, v, causal=True, tile=tile))
    try:
        qt, kt, vt = (torch.from_dlpack(x) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            add("d=128 SDPA efficient fp32", lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True))
    except Exception:  # noqa: BLE001
        pass
    print(format_table(rows))


def main():
    if "--notebook" in sys.argv:
        return 0 if run_notebook(sys.argv[sys.argv.index("--notebook") + 1]) else 1
    small = "--small" in sys.argv
    print("GPU:", kernels.gpu_name())
    ok = correctness(small)
    if "--tiles" in sys.argv:
        ok = tile_correctness() and ok
    if not small:
        errors()
        timings()
    print("ALL CORRECT" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
