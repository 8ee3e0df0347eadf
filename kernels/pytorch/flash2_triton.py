"""Launcher for the Triton FlashAttention-2 (kernels/pytorch/flash2_triton_kernels.py): forward and backward, fp16/bf16.

    o = forward(q, k, v, causal=True)                          # (B, H, T, d) float16 or bfloat16 CuPy arrays
    o, lse = forward(q, k, v, causal=True, return_lse=True)    # lse: (B, H, Tq) float32, natural log
    dq, dk, dv = backward(q, k, v, o, lse, do, causal=True)    # CuPy arrays, the gradients of sum(o * do)

    o = attention(q, k, v, causal=True)                        # torch tensors; o.backward(...) runs our backward

d must be one of 16, 32, 64, 128 (a Triton tile is a power of two, and the whole head is one tile row); any
Tq, Tk >= 1, with bottom-right causal masking; scale > 0 (it is folded into exp2 after the row max).

CuPy in, CuPy out: the arrays reach Triton as torch tensors through DLPack (no copy), and the kernels run on
CuPy's current stream. This module imports neither torch nor Triton until a kernel is launched, so that
`import kernels` works where neither is installed.

Configurations. A Triton program's shape is four numbers (Config): BLOCK_M query rows (forward, dQ) or
BLOCK_M query rows per step (dK/dV), BLOCK_N keys, num_warps warps, num_stages pipelined loads. The tables
below hold one configuration per head size and mask, measured on an H100 80GB HBM3 (fp16, B=4, H=32, T=4096,
`python3 -m kernels.bench.triton --sweep` times every candidate); a launch looks the table up, so tests and
first calls never autotune. `autotune(q, k, v, causal=...)` is the opt-in: it times the CANDIDATES on the
given shape with kernels.benchmark and remembers the fastest for (d, causal, dtype, T bucket), T rounded up to
a power of two, so that shapes of one bucket share one search.

Backward. A preprocess kernel computes delta = rowsum(dO * O); one kernel computes dK and dV (a program per
BLOCK_N keys, looping over query blocks), and a separate kernel computes dQ (a program per BLOCK_M queries,
looping over key blocks). Keeping dQ apart costs recomputing Q K^T and dO V^T once more (7 matrix products
per tile pair instead of 5), but every program writes only its own rows: no float32 atomics, no dQ buffer to
zero and convert, the same bits from run to run, and each kernel gets the tile shape that suits it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import subprocess
import tempfile
from typing import NamedTuple

from ..core import (DTYPE_NAMES, MAX_GRID_X, ceil_div, check_array, check_grid, cp, dtype_set,
                    validate_attention)
from ..core.registry import Variant, register

WHAT = "flash2_triton attention"
HEAD_DIMS = (16, 32, 64, 128)
MAX_D = 128
DTYPES = ("float16", "bfloat16")
DTYPE_SET = dtype_set(DTYPES)
LOG2E = 1.0 / math.log(2.0)
PRE_BLOCK = 64  # rows per program of the delta = rowsum(dO * O) preprocess


class Config(NamedTuple):
    """One Triton launch shape: BLOCK_M query rows, BLOCK_N keys, num_warps warps, num_stages load stages."""
    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int


# Forward, per (d, causal). From the sweep on an H100 80GB HBM3 (fp16, B=4, H=32, T=4096; results/h100-triton.json):
# (128, 64, 8, 3) was the fastest for d=64 and d=128 not causal (1.25 and 2.13 ms) and within 1.2% of the fastest
# causal ones ((64, 64, 4, 3) at d=64, (128, 128, 8, 3) at d=128). 128 rows over two warpgroups give each warpgroup
# m64 wgmma tiles; 64 keys a step keep S and P in registers without spilling (190 registers at d=128).
# d=16 and d=32 (not swept: short heads are rare and cheap) use one warpgroup.
FWD_CONFIGS = {
    (16, False): Config(128, 64, 4, 3), (16, True): Config(128, 64, 4, 3),
    (32, False): Config(128, 64, 4, 3), (32, True): Config(128, 64, 4, 3),
    (64, False): Config(128, 64, 8, 3), (64, True): Config(128, 64, 8, 3),
    (128, False): Config(128, 64, 8, 3), (128, True): Config(128, 64, 8, 3),
}
# dK/dV, per d: BLOCK_N keys per program (their dK and dV accumulators live in registers), BLOCK_M rows a step.
# Swept as above: (32, 128, 4, 3) was the fastest at d=64 (causal and not; 4.15 ms against 5.19 for (64, 128, 8, 3)
# for the whole backward), though it spills 16 bytes there. At d=128 the same shape took 15.5 ms (its dK and dV
# accumulators alone are 2 * 128 * 128 floats over 128 threads: 256 registers each); (32, 64, 4, 3) was the fastest
# causal and within 0.4% of the fastest not causal. d=16 and 32 take d=64's.
BWD_KV_CONFIGS = {16: Config(32, 128, 4, 3), 32: Config(32, 128, 4, 3), 64: Config(32, 128, 4, 3),
                  128: Config(32, 64, 4, 3)}
# dQ, per d: BLOCK_M query rows per program, BLOCK_N keys a step. (128, 64, 8, 3) was the fastest in three of the four
# sweeps and within 3% in the fourth (d=64 causal).
BWD_Q_CONFIGS = {16: Config(128, 64, 8, 3), 32: Config(128, 64, 8, 3), 64: Config(128, 64, 8, 3),
                 128: Config(128, 64, 8, 3)}

# The small space that `autotune` and the --sweep of kernels.bench.triton search (the forward).
# BLOCK_M in {64, 128}: 128 rows give each warpgroup wgmma tiles of m64 with fewer programs;
# BLOCK_N in {32, 64, 128}: more keys per step mean fewer rescales but more registers for S and P;
# num_warps 4 or 8 (one or two warpgroups); num_stages 2 to 4 (K/V blocks in flight, shared memory permitting).
CANDIDATES = (
    Config(128, 64, 4, 3), Config(128, 64, 4, 4), Config(128, 64, 8, 3), Config(128, 128, 8, 2),
    Config(128, 128, 8, 3), Config(128, 32, 4, 4), Config(64, 64, 4, 3), Config(64, 128, 4, 3),
)
BWD_KV_CANDIDATES = (
    Config(64, 128, 8, 2), Config(64, 128, 8, 3), Config(32, 128, 8, 3), Config(32, 128, 4, 3),
    Config(64, 64, 4, 3), Config(32, 64, 4, 3),
)
BWD_Q_CANDIDATES = (
    Config(128, 64, 8, 2), Config(128, 64, 8, 3), Config(128, 32, 4, 3), Config(64, 64, 4, 3),
    Config(128, 128, 8, 2),
)

_TUNED: dict = {}  # (d, causal, dtype, Tq bucket, Tk bucket) -> Config found by autotune()


def t_bucket(T: int) -> int:
    """T rounded up to a power of two, at least 128 and at most 16384: the autotune cache key's length."""
    return min(max(128, 1 << (int(T) - 1).bit_length()), 16384)


# ---------------------------------------------------------------------------------------------------------
# Lazy imports: torch and Triton are loaded at the first launch, never at `import kernels`.
# ---------------------------------------------------------------------------------------------------------

def _torch():
    import torch

    return torch


@functools.lru_cache(maxsize=None)
def programs():
    """The module of Triton programs (kernels/pytorch/flash2_triton_kernels.py), imported on first use."""
    try:
        from . import flash2_triton_kernels
    except ImportError as e:  # pragma: no cover - a machine without Triton
        raise RuntimeError(f"flash2_triton needs Triton and torch (pip install torch triton): {e}") from e
    return flash2_triton_kernels


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_head_dim(d: int) -> None:
    if d not in HEAD_DIMS:
        raise ValueError(f"head dimension d={d} must be one of {HEAD_DIMS} for {WHAT} (a Triton tile is a power "
                         f"of two and the whole head is one tile row)")


def check_scale(scale: float) -> float:
    if not scale > 0:
        raise ValueError(f"scale must be > 0 for {WHAT} (the kernel folds it into exp2 after the row max); "
                         f"got {scale}")
    return scale


def check_config(cfg, what: str) -> Config:
    cfg = Config(*cfg)
    pow2 = lambda x: x >= 16 and x & (x - 1) == 0  # noqa: E731
    if not (pow2(cfg.BLOCK_M) and pow2(cfg.BLOCK_N) and cfg.num_warps in (1, 2, 4, 8, 16) and cfg.num_stages >= 1):
        raise ValueError(f"{what} config {tuple(cfg)}: BLOCK_M and BLOCK_N must be powers of two >= 16, num_warps "
                         f"one of 1, 2, 4, 8, 16 and num_stages >= 1")
    return cfg


def forward_config(d: int, causal: bool, dtype: str, Tq: int, Tk: int) -> Config:
    """The forward's Config: what autotune() found for this bucket, else the table's."""
    if _TUNED:
        tuned = _TUNED.get((d, causal, dtype, t_bucket(Tq), t_bucket(Tk)))
        if tuned is not None:
            return tuned
    return FWD_CONFIGS[(d, causal)]


def grid_1d(heads: int, per_head: int) -> tuple:
    blocks = heads * per_head
    if blocks > MAX_GRID_X:
        check_grid(blocks, WHAT, MAX_GRID_X)
    return (blocks,)


# ---------------------------------------------------------------------------------------------------------
# Launches on torch tensors (the CuPy launchers and the autograd Function both end here)
# ---------------------------------------------------------------------------------------------------------

def launch_forward(q, k, v, o, lse, causal: bool, scale: float, cfg: Config):
    """Run the forward kernel on contiguous torch tensors; returns Triton's compiled kernel."""
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    num_m = ceil_div(Tq, cfg.BLOCK_M)
    return programs().flash2_fwd_kernel[grid_1d(B * H, num_m)](
        q, k, v, o, lse, Tq, Tk, num_m, scale * LOG2E,
        D=d, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, CAUSAL=bool(causal),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def launch_backward(q, k, v, o, lse, do, dq, dk, dv, delta, causal: bool, scale: float,
                    kv_cfg: Config | None = None, q_cfg: Config | None = None):
    """delta = rowsum(dO * O), then dK/dV and dQ, on contiguous torch tensors; returns the 3 compiled kernels."""
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    kv_cfg = kv_cfg or BWD_KV_CONFIGS[d]
    q_cfg = q_cfg or BWD_Q_CONFIGS[d]
    jit = programs()
    n_rows = B * H * Tq
    pre = jit.flash2_bwd_preprocess[(ceil_div(n_rows, PRE_BLOCK),)](o, do, delta, n_rows, D=d, BLOCK=PRE_BLOCK,
                                                                     num_warps=4)
    num_n = ceil_div(Tk, kv_cfg.BLOCK_N)
    kv = jit.flash2_bwd_dkdv_kernel[grid_1d(B * H, num_n)](
        q, k, v, do, lse, delta, dk, dv, Tq, Tk, num_n, scale * LOG2E, scale,
        D=d, BLOCK_M=kv_cfg.BLOCK_M, BLOCK_N=kv_cfg.BLOCK_N, CAUSAL=bool(causal),
        num_warps=kv_cfg.num_warps, num_stages=kv_cfg.num_stages)
    num_m = ceil_div(Tq, q_cfg.BLOCK_M)
    qk = jit.flash2_bwd_dq_kernel[grid_1d(B * H, num_m)](
        q, k, v, do, lse, delta, dq, Tq, Tk, num_m, scale * LOG2E, scale,
        D=d, BLOCK_M=q_cfg.BLOCK_M, BLOCK_N=q_cfg.BLOCK_N, CAUSAL=bool(causal),
        num_warps=q_cfg.num_warps, num_stages=q_cfg.num_stages)
    return pre, kv, qk


# ---------------------------------------------------------------------------------------------------------
# The CuPy launchers (the course's launcher contract)
# ---------------------------------------------------------------------------------------------------------

def as_torch(x):
    """A torch view of the CuPy array x, through DLPack (no copy). bfloat16 travels as uint16 and is viewed back."""
    torch = _torch()
    if x.dtype.itemsize == 2 and x.dtype.name == "bfloat16":
        return torch.from_dlpack(x.view(cp.uint16)).view(torch.bfloat16)
    return torch.from_dlpack(x)


def on_cupy_stream():
    """A context in which torch (and so Triton) launches on CuPy's current stream."""
    torch = _torch()
    ptr = cp.cuda.get_current_stream().ptr
    if torch.cuda.current_stream().cuda_stream == ptr:
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.ExternalStream(ptr))


def forward(q, k, v, *, causal=False, scale=None, return_lse=False, config=None):
    """softmax(scale q k^T) v with the Triton FlashAttention-2 forward; optionally the LSE (float32, natural log).

    config: a Config (or a 4-tuple) instead of the table's (the benchmark's sweep uses it).
    """
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=MAX_D, what=WHAT, scale=scale)
    check_head_dim(d)
    check_scale(scale)
    causal = bool(causal)
    cfg = forward_config(d, causal, DTYPE_NAMES[q.dtype], Tq, Tk) if config is None else check_config(config, "forward")
    o = cp.empty((B, H, Tq, d), dtype=q.dtype)
    lse = cp.empty((B, H, Tq), dtype=cp.float32)
    with on_cupy_stream():
        launch_forward(as_torch(q), as_torch(k), as_torch(v), as_torch(o), as_torch(lse), causal, scale, cfg)
    return (o, lse) if return_lse else o


def backward(q, k, v, o, lse, do, *, causal=False, scale=None, kv_config=None, q_config=None):
    """dq, dk, dv: the gradients of sum(o * do) with respect to q, k, v, from the forward's o and lse.

    o and do are like q; lse is float32 (B, H, Tq) as forward(..., return_lse=True) returns it.
    kv_config / q_config: Configs for the dK/dV and the dQ kernels instead of the tables' (the sweep uses them).
    """
    B, H, Tq, Tk, d, scale = validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=MAX_D, what=WHAT, scale=scale)
    check_head_dim(d)
    check_scale(scale)
    for name, x in (("o", o), ("do", do)):
        check_array(x, name, dtypes=(q.dtype.name,), ndim=4)
        if x.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {q.shape}; got {x.shape}")
    check_array(lse, "lse", dtypes=("float32",), ndim=3)
    if lse.shape != (B, H, Tq):
        raise ValueError(f"lse must have shape {(B, H, Tq)}; got {lse.shape}")
    kv_cfg = None if kv_config is None else check_config(kv_config, "dK/dV")
    q_cfg = None if q_config is None else check_config(q_config, "dQ")
    dq, dk, dv = cp.empty_like(q), cp.empty_like(k), cp.empty_like(v)
    delta = cp.empty((B, H, Tq), dtype=cp.float32)
    t = as_torch
    with on_cupy_stream():
        launch_backward(t(q), t(k), t(v), t(o), t(lse), t(do), t(dq), t(dk), t(dv), t(delta), bool(causal), scale,
                        kv_cfg, q_cfg)
    return dq, dk, dv


def autotune(q, k, v, *, causal=False, scale=None, candidates=CANDIDATES, log=None) -> Config:
    """Opt-in: time the forward CANDIDATES on these inputs (kernels.benchmark, kernel time) and use the fastest for
    every later call of the same (d, causal, dtype, T bucket). Returns the Config chosen."""
    from ..core.timing import benchmark

    B, H, Tq, Tk, d, _ = validate_attention(q, k, v, dtypes=DTYPE_SET, max_d=MAX_D, what=WHAT, scale=scale)
    best = None
    for cfg in candidates:
        try:
            t = benchmark(lambda cfg=cfg: forward(q, k, v, causal=causal, scale=scale, config=cfg), batches=3, calls=3)
        except Exception as e:  # a config that needs more shared memory than the GPU has: skip it
            if log:
                log(f"{tuple(cfg)}: not run ({type(e).__name__}: {str(e).splitlines()[0][:100]})")
            continue
        if log:
            log(f"{tuple(cfg)}: {t.ms:.3f} ms")
        if best is None or t.ms < best[0]:
            best = (t.ms, Config(*cfg))
    if best is None:
        raise RuntimeError("no candidate configuration ran")
    _TUNED[(d, bool(causal), DTYPE_NAMES[q.dtype], t_bucket(Tq), t_bucket(Tk))] = best[1]
    return best[1]


# ---------------------------------------------------------------------------------------------------------
# torch autograd: attention(q, k, v) on torch tensors, with our backward
# ---------------------------------------------------------------------------------------------------------

def check_tensors(q, k, v) -> tuple:
    """TypeError / ValueError for torch inputs the kernels cannot take; returns (B, H, Tq, Tk, d)."""
    torch = _torch()
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(x).__module__}.{type(x).__name__}")
        if x.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"{name} has dtype {x.dtype}; {WHAT} takes torch.float16, torch.bfloat16")
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, T, d); got shape {tuple(x.shape)}")
        if x.device.type != "cuda" and not _interpreting():
            raise ValueError(f"{name} must be on a CUDA device; got {x.device}")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {tuple(k.shape)} and v {tuple(v.shape)}")
    B, H, Tq, d = q.shape
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != d:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on B, H and d")
    if min(B, H, Tq, k.shape[2], d) < 1:
        raise ValueError(f"every dimension must be >= 1; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if d > MAX_D:
        raise ValueError(f"head dimension d={d} is larger than {WHAT} supports (d <= {MAX_D})")
    check_head_dim(d)
    if q.numel() > 2**31 - 1 or k.numel() > 2**31 - 1:
        raise ValueError(f"q and k must have at most 2**31 - 1 elements; got {q.numel()} and {k.numel()}")
    return B, H, Tq, k.shape[2], d


@functools.lru_cache(maxsize=None)
def autograd_function():
    """The torch.autograd.Function (built on first use, so that torch is imported only then)."""
    torch = _torch()

    class Flash2Triton(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale):
            B, H, Tq, Tk, d = check_tensors(q, k, v)
            scale = check_scale(1.0 / math.sqrt(d) if scale is None else float(scale))
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            o = torch.empty_like(q)
            lse = torch.empty((B, H, Tq), dtype=torch.float32, device=q.device)
            launch_forward(q, k, v, o, lse, causal, scale, forward_config(d, causal, str(q.dtype)[6:], Tq, Tk))
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.causal, ctx.scale = causal, scale
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            do = do.contiguous()
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            delta = torch.empty_like(lse)
            launch_backward(q, k, v, o, lse, do, dq, dk, dv, delta, ctx.causal, ctx.scale)
            return dq, dk, dv, None, None

    return Flash2Triton


def attention(q, k, v, causal=False, scale=None):
    """softmax(scale q k^T) v on torch tensors (B, H, T, d), float16 or bfloat16, differentiable in q, k, v.

    Strided inputs are made contiguous (a copy). Causal masking is bottom-right aligned, as in forward().
    """
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number; got {scale}")
    return autograd_function().apply(q, k, v, bool(causal), scale)


# ---------------------------------------------------------------------------------------------------------
# What the compiler made: the generated code of each kernel
# ---------------------------------------------------------------------------------------------------------

def compiled_kernels(d: int = 128, causal: bool = True, dtype: str = "float16", T: int = 1024) -> dict:
    """{"forward", "preprocess", "dkdv", "dq"}: Triton's compiled kernels (their .asm holds 'ptx', 'cubin', ...)
    for the table's configurations, from one launch of each on a small input (B = H = 1)."""
    torch = _torch()
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn((1, 1, T, d), generator=g, device="cuda", dtype=dt) for _ in range(4))
    o, lse = torch.empty_like(q), torch.empty((1, 1, T), dtype=torch.float32, device="cuda")
    scale = 1.0 / math.sqrt(d)
    fwd = launch_forward(q, k, v, o, lse, causal, scale, FWD_CONFIGS[(d, causal)])
    grads = [torch.empty_like(x) for x in (q, k, v)]
    pre, kv, qk = launch_backward(q, k, v, o, lse, do, *grads, torch.empty_like(lse), causal, scale)
    torch.cuda.synchronize()
    return {"forward": fwd, "preprocess": pre, "dkdv": kv, "dq": qk}


def sass_of(compiled) -> str:
    """The SASS of a compiled Triton kernel: Triton's own disassembly where it has one, else cuobjdump's."""
    try:
        sass = compiled.asm["sass"]
        if sass:
            return sass
    except Exception:  # noqa: BLE001 - an older Triton, or no disassembler bundled
        pass
    tool = shutil.which("cuobjdump")
    if tool is None:
        raise RuntimeError("no SASS: Triton has no disassembler here and cuobjdump is not on the PATH")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout


def instruction_counts(compiled) -> dict:
    """How many tensor-core and copy instructions the kernel's PTX and SASS hold."""
    ptx, sass = compiled.asm["ptx"], sass_of(compiled)
    return {
        "ptx wgmma.mma_async": ptx.count("wgmma.mma_async"),
        "ptx mma.sync": ptx.count("mma.sync"),
        "ptx cp.async": ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
        "ptx cp.async.bulk.tensor (TMA)": ptx.count("cp.async.bulk.tensor"),
        "sass HGMMA": sum(1 for line in sass.splitlines() if "HGMMA" in line),
        "sass HMMA": sum(1 for line in sass.splitlines() if "HMMA" in line),
        "sass LDGSTS": sum(1 for line in sass.splitlines() if "LDGSTS" in line),
        "sass UTMALDG": sum(1 for line in sass.splitlines() if "UTMALDG" in line),
        "registers": getattr(compiled, "n_regs", None),
        "spills": getattr(compiled, "n_spills", None),
        "shared bytes": compiled.metadata.shared if hasattr(compiled, "metadata") else None,
    }


register(Variant("flash2_triton", forward, DTYPES, "11_triton_flash_attention", MAX_D, has_lse=True,
                 description="FlashAttention-2 in Triton: one program per 128-row block, exp2 with log2(e) in the scale, "
                             "off-band/on-band causal loops; wgmma on Hopper; backward with a separate dQ kernel"))
