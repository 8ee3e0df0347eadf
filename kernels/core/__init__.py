"""kernels.core: what every chapter's launcher shares, one module per job.

    device.py    is there a GPU, which one, its limits (read once per device)
    compile.py   find a kernel file by its bare name, compile it once (NVRTC through CuPy; CUBINs for sm_90a)
    launch.py    Kernel, Launch and attention_launch: the one path from Python to cuLaunchKernel
    validate.py  the launcher contract's checks and errors
    source.py    kernel_source / kernel_steps: the code a notebook shows is the code that runs
    check.py     the one correctness check against the float64 reference
    timing.py    the one timing helper (kernel time, call time, cold L2, side by side), with timing.cu
    registry.py  every attention and decoding variant, for the tests and benchmarks to loop over

Imports flow one way: the chapter folders (kernels/basics, kernels/flash, ...) import from here, the entry points
(kernels/bench) import from both, and nothing here imports a chapter.
"""

from .check import TOLERANCES, CheckResult, check, poisoned_allocations
from .compile import (KERNEL_DIR, NVRTC_OPTIONS, CompileError, compile_cubin, compile_program, cuda_header_options,
                      defines_from, kernel_path, kernel_text, load_module)
from .device import (BF16_MIN_CC, DEFAULT_MIN_CC, DEFAULT_SHARED_LIMIT, INT32_MAX, MAX_GRID_X, MAX_GRID_YZ,
                     SIMULATE_ENV, T4_CC, DeviceInfo, GPUNotAvailableError, UnsupportedDeviceError, blocks_per_sm,
                     ceil_div, check_compute_capability, check_dtype_capability, check_shared_memory, cp,
                     current_device, device_compute_capability, device_info, gpu_name, gpu_unavailable_reason,
                     max_shared_memory_optin, require_gpu, simulated_arch, simulated_cc)
from .launch import (I32, NULL, Kernel, Launch, attention_launch, clear_launch_caches, get_kernel, launch_cache,
                     scalar)
from .registry import (DECODE_REGISTRY, REGISTRY, STAGING, DecodeVariant, Variant, bf16_needs_80, register,
                       register_decode, tested_variants)
from .source import kernel_source, kernel_steps
from .timing import (Timing, attention_bytes, attention_flops, benchmark, compare, format_table, host_overhead_us,
                     paired_ratio, sustained)
from .validate import (DTYPE_NAMES, HAS_C_CONTIGUOUS, DtypeSet, check_alignment, check_array, check_grid,
                       check_index_range, dtype_set, qkv_key, validate_attention)
