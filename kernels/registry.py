"""The registry of attention variants: every forward(q, k, v, *, causal, scale) of the course.

Tests and benchmarks loop over REGISTRY, so a new kernel is tested on the full grid the moment it is
registered. A launcher module registers its variants at import, naming itself (module=__name__);
`kernels/__init__.py` imports every launcher module, and tests/test_project.py fails when a launcher module
with a forward() is not imported there or registers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ._core import DEFAULT_MIN_CC


@dataclass(frozen=True)
class Variant:
    name: str  # short unique name, e.g. "naive"
    forward: Callable  # forward(q, k, v, *, causal=False, scale=None[, return_lse=False])
    dtypes: tuple  # input dtypes it accepts, e.g. ("float32",)
    notebook: str  # the notebook that teaches it, e.g. "01_naive_cuda"
    max_d: int  # largest head dimension accepted
    has_lse: bool = False  # accepts return_lse=True
    min_cc: tuple = DEFAULT_MIN_CC
    precision: str | None = None  # tolerance class if not the dtype's own (e.g. "tf32")
    description: str = ""
    module: str = ""  # the launcher module that registered it (kernels.<name>)

    def tolerance_class(self, dtype) -> str:
        import numpy as np

        return self.precision or np.dtype(dtype).name


REGISTRY: dict[str, Variant] = {}


def register(variant: Variant) -> Variant:
    if variant.name in REGISTRY:
        raise ValueError(f"attention variant {variant.name!r} is registered twice")
    REGISTRY[variant.name] = variant
    return variant
