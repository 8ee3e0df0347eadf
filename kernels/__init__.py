"""kernels: the CUDA kernels of the course, one folder per family of chapters, each .cu beside its Python launcher.

    from kernels import REGISTRY, check, benchmark
    from kernels.flash import flash2_mma
    o = REGISTRY["naive"].forward(q, k, v, causal=True)

    core/       what every launcher shares: device, compile, launch, validate, source display, check, timing, registry
    ptx/        the PTX wrappers (cp.async, mma.sync, ldmatrix, mbarrier, TMA, wgmma) the kernels include
    basics/     chapters 01-02: naive attention, softmax kernels (and the softmax backward of chapter 12)
    flash/      chapters 03, 04, 06, 12, 15: FlashAttention-1, -2 on CUDA cores, WMMA and mma.sync (its variants: 15),
                and its backward
    cublas/     chapters 05-06: attention as cuBLAS GEMMs around a softmax (llm.c v3-v6)
    inference/  chapters 08-09: decoding over a KV cache, varlen batches
    sampling/   chapter 10: from logits to tokens
    pytorch/    chapters 11-12: FlashAttention-2 in Triton, the PyTorch custom operators
    hopper/     chapters 13, 16: TMA, mbarriers and wgmma on sm_90a, the forward on them (13), the backward (16)
    parallel/   chapter 14: attention across GPUs (ring, zigzag, all-to-all) over torch.distributed
    bench/      the command-line benchmarks (python3 -m kernels.bench[.decode|.varlen|...]) and the profiler

Importing this package needs no GPU and no CuPy; launching a kernel does. Importing it imports every chapter
folder, so every variant is registered (tests/test_project.py checks that each launcher is reached).
"""

from .core import (DECODE_REGISTRY, REGISTRY, STAGING, TOLERANCES, CheckResult, DecodeVariant, GPUNotAvailableError,
                   Timing, UnsupportedDeviceError, Variant, attention_bytes, attention_flops, benchmark, check, compare,
                   device_compute_capability, device_info, format_table, get_kernel, gpu_name, gpu_unavailable_reason,
                   host_overhead_us, kernel_source, kernel_steps, load_module, paired_ratio, poisoned_allocations,
                   register, register_decode, sustained, tested_variants)

# Every chapter folder: importing one imports its launchers, which register their variants.
from . import basics, flash, cublas, inference, sampling, pytorch, hopper, parallel  # noqa: E402,F401

__all__ = [
    "REGISTRY", "STAGING", "tested_variants", "Variant", "register",
    "DECODE_REGISTRY", "DecodeVariant", "register_decode",
    "check", "CheckResult", "TOLERANCES", "poisoned_allocations",
    "benchmark", "compare", "paired_ratio", "sustained", "host_overhead_us", "Timing", "attention_flops",
    "attention_bytes", "format_table",
    "kernel_source", "kernel_steps", "load_module", "get_kernel", "gpu_name", "gpu_unavailable_reason",
    "device_compute_capability", "device_info", "GPUNotAvailableError", "UnsupportedDeviceError",
]
