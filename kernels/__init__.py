"""kernels: the CUDA kernels of the course (one .cu per family) and the Python launcher beside each.

    from kernels import REGISTRY, check, benchmark
    o = REGISTRY["naive"].forward(q, k, v, causal=True)

Importing this package needs no GPU and no CuPy; launching a kernel does.
"""

from ._core import (
    GPUNotAvailableError,
    UnsupportedDeviceError,
    device_compute_capability,
    device_info,
    get_kernel,
    gpu_name,
    gpu_unavailable_reason,
    kernel_source,
    kernel_steps,
    load_module,
)
from .check import TOLERANCES, CheckResult, check, poisoned_allocations
from .registry import (DECODE_REGISTRY, REGISTRY, STAGING, DecodeVariant, Variant, register, register_decode,
                       tested_variants)
from .timing import (Timing, attention_bytes, attention_flops, benchmark, compare, format_table, host_overhead_us,
                     paired_ratio, sustained)

# Every launcher module: importing one registers its attention variants. tests/test_project.py fails when a
# kernels/<name>.cu has no launcher imported here, or a launcher with a forward() registers nothing.
from . import naive, softmax  # noqa: E402,F401
from . import cublas_attention, flash1, flash2  # noqa: E402,F401
from . import cublas_half  # noqa: E402,F401
from . import flash2_mma  # noqa: E402,F401
from . import flash2_mma_bwd, softmax_bwd  # noqa: E402,F401  (backward kernels; kernels/torch_ops.py uses them)
from . import flash2_wmma  # noqa: E402,F401
from . import flash2_triton  # noqa: E402,F401  (Triton; imports torch and Triton only when it launches)
from . import decode_ft  # noqa: E402,F401
from . import decode_split  # noqa: E402,F401
from . import decode_append  # noqa: E402,F401
from . import sampling  # noqa: E402,F401
from . import varlen  # noqa: E402,F401
from . import hopper_gemm  # noqa: E402,F401  (Hopper: TMA + wgmma, built for sm_90a; a GEMM)
from . import hopper_attn  # noqa: E402,F401  (Hopper: FlashAttention-3-style forward on TMA + wgmma)
from . import timing  # noqa: E402,F401  (timing.cu: the hold and L2-flush kernels of the timing helper)

__all__ = [
    "REGISTRY", "STAGING", "tested_variants", "Variant", "register",
    "DECODE_REGISTRY", "DecodeVariant", "register_decode",
    "check", "CheckResult", "TOLERANCES", "poisoned_allocations",
    "benchmark", "compare", "paired_ratio", "sustained", "host_overhead_us", "Timing", "attention_flops", "attention_bytes", "format_table",
    "kernel_source", "kernel_steps", "load_module", "get_kernel", "gpu_name", "gpu_unavailable_reason", "device_compute_capability",
    "device_info", "GPUNotAvailableError", "UnsupportedDeviceError",
]
