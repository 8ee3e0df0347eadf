"""The registry of attention variants: every forward(q, k, v, *, causal, scale) of the course.

Tests and benchmarks loop over REGISTRY, so a new kernel is tested on the full grid the moment it is
registered. A launcher module registers its variants at import (Variant.module is the module that defines the forward);
`kernels/__init__.py` imports every launcher module, and tests/test_project.py fails when a launcher module
with a forward() is not imported there or registers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .device import BF16_MIN_CC, DEFAULT_MIN_CC


class _NeedsGPU:
    """What a registered variant needs of the GPU: min_cc (its least demanding dtype) and dtype_min_cc (the dtypes
    that need more), filled in by the dataclasses below."""

    def min_cc_for(self, dtype) -> tuple:
        return _min_cc_for(self, dtype)

    def unsupported_reason(self, cc: tuple, dtype=None) -> str | None:
        """Why a GPU of compute capability `cc` cannot run this variant (in `dtype`), or None where it can."""
        return _unsupported_reason(self, cc, dtype)


@dataclass(frozen=True)
class Variant(_NeedsGPU):
    name: str  # short unique name, e.g. "naive"
    forward: Callable  # forward(q, k, v, *, causal=False, scale=None[, return_lse=False])
    dtypes: tuple  # input dtypes it accepts, e.g. ("float32",)
    notebook: str  # the notebook that teaches it, e.g. "01_naive_cuda"
    max_d: int  # largest head dimension accepted
    head_dims: tuple | None = None  # the head dimensions accepted, where not every d <= max_d is (e.g. (64, 128))
    has_lse: bool = False  # accepts return_lse=True
    min_cc: tuple = DEFAULT_MIN_CC
    precision: str | None = None  # tolerance class if not the dtype's own (e.g. "tf32")
    description: str = ""
    module: str = ""  # the launcher module that registered it; by default the module that defines forward
    dtype_min_cc: tuple = ()  # (dtype, (major, minor)) where a dtype needs more than min_cc (bfloat16: 8.0)

    def __post_init__(self):
        if not self.module:
            object.__setattr__(self, "module", self.forward.__module__)
        _normalise_min_cc(self)

    def tolerance_class(self, dtype) -> str:
        import numpy as np

        return self.precision or np.dtype(dtype).name

    def accepts_d(self, d: int) -> bool:
        """Whether forward() takes head dimension d (tests and benchmarks skip the others)."""
        return d <= self.max_d and (self.head_dims is None or d in self.head_dims)


# ---------------------------------------------------------------------------------------------------------
# What a variant needs of the GPU: min_cc for the variant (its least demanding dtype), dtype_min_cc where one dtype
# needs more. A variant that runs from 7.5 (a T4) says min_cc=T4_CC, and, where it takes bfloat16, bf16_needs_80().
# Tests and benchmarks skip what the GPU cannot run with unsupported_reason(); the launchers raise
# UnsupportedDeviceError naming the dtype and both capabilities.
# ---------------------------------------------------------------------------------------------------------

def bf16_needs_80(dtypes) -> tuple:
    """dtype_min_cc for a variant that runs from 7.5 except in bfloat16 (cvt.rn.bf16.f32 and friends need 8.0)."""
    return (("bfloat16", BF16_MIN_CC),) if "bfloat16" in dtypes else ()


def _normalise_min_cc(variant) -> None:
    pairs = variant.dtype_min_cc.items() if isinstance(variant.dtype_min_cc, dict) else variant.dtype_min_cc
    object.__setattr__(variant, "min_cc", tuple(variant.min_cc))
    object.__setattr__(variant, "dtype_min_cc", tuple((str(d), tuple(cc)) for d, cc in pairs))


def _min_cc_for(variant, dtype) -> tuple:
    import numpy as np

    name = dtype if dtype is None or isinstance(dtype, str) else np.dtype(dtype).name
    return max([variant.min_cc] + [cc for d, cc in variant.dtype_min_cc if d == name])


def _unsupported_reason(variant, cc: tuple, dtype=None) -> str | None:
    need = _min_cc_for(variant, dtype)
    if tuple(cc) >= need:
        return None
    what = variant.name if dtype is None else f"{variant.name} in {getattr(dtype, 'name', dtype)}"
    return f"{what} needs compute capability >= {need[0]}.{need[1]}; this GPU has {cc[0]}.{cc[1]}"


REGISTRY: dict[str, Variant] = {}

# Variants being tuned: tested exactly like the others (the GPU tests loop over tested_variants()), but not yet part
# of the benchmark suite and its tables (kernels.bench and notebook 07 loop over REGISTRY only). A kernel moves to
# REGISTRY when it is done, and notebook 07 is re-run with it.
STAGING: dict[str, Variant] = {}


def register(variant: Variant, *, staging: bool = False) -> Variant:
    if variant.name in REGISTRY or variant.name in STAGING:
        raise ValueError(f"attention variant {variant.name!r} is registered twice")
    (STAGING if staging else REGISTRY)[variant.name] = variant
    return variant


def tested_variants() -> dict[str, Variant]:
    """Every attention variant the tests check: REGISTRY and STAGING."""
    return {**REGISTRY, **STAGING}


# ---------------------------------------------------------------------------------------------------------
# Decoding kernels: decode(q, k_cache, v_cache, seqlens_k, *, scale, block_table, num_splits, return_lse,
# check_indices) over a KV cache of per-sequence lengths (reference/decode.py states the contract). A separate
# registry, because the call is not forward(q, k, v): tests/test_decode_gpu.py runs one grid over all of them.
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DecodeVariant(_NeedsGPU):
    name: str  # short unique name, e.g. "decode_split"
    decode: Callable  # decode(q, k_cache, v_cache, seqlens_k, *, scale=None, block_table=None, num_splits=None,
    #                          return_lse=False, check_indices=False) -> o, or (o, lse)
    dtypes: tuple  # input dtypes it accepts
    notebook: str  # the notebook that teaches it
    head_dims: tuple  # the head dimensions d it accepts
    max_tq: int  # the most query rows per sequence (Tq) it accepts
    paged: bool = False  # accepts block_table (a paged cache)
    page_sizes: tuple = ()  # the page sizes it accepts, where paged
    splits: bool = False  # honours num_splits > 1 (split-KV)
    min_cc: tuple = DEFAULT_MIN_CC
    description: str = ""
    module: str = ""  # the launcher module that registered it; by default the module that defines decode
    dtype_min_cc: tuple = ()  # (dtype, (major, minor)) where a dtype needs more than min_cc (bfloat16: 8.0)

    def __post_init__(self):
        if not self.module:
            object.__setattr__(self, "module", self.decode.__module__)
        _normalise_min_cc(self)

    def tolerance_class(self, dtype) -> str:
        import numpy as np

        return np.dtype(dtype).name


DECODE_REGISTRY: dict[str, DecodeVariant] = {}


def register_decode(variant: DecodeVariant) -> DecodeVariant:
    if variant.name in DECODE_REGISTRY:
        raise ValueError(f"decoding variant {variant.name!r} is registered twice")
    DECODE_REGISTRY[variant.name] = variant
    return variant
