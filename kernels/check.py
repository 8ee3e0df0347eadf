"""The one correctness check of the course: relative L2 error and max abs error against the reference.

    result = check(out, ref, "float32")
    print(result)          # "rel err < 1e-05: True"   (stable text: nbval compares it)
    result.ok              # the boolean a test asserts
    result.detail()        # the numbers, which vary from run to run

The tolerance is chosen by the precision of the kernel's inputs and math (GUIDE.md):
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

TOLERANCES = {
    "float32": 1e-5,  # float32 on CUDA cores
    "tf32": 2e-3,  # float32 with TF32 tensor cores (cuBLAS)
    "float16": 2e-3,  # float16 inputs, float32 accumulation
    "bfloat16": 1e-2,  # bfloat16 inputs, float32 accumulation
}


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "get") and not isinstance(x, np.ndarray):  # a CuPy array
        x = x.get()
    return np.asarray(x, dtype=np.float64)


@dataclass(frozen=True)
class CheckResult:
    rel_l2: float
    max_abs: float
    tol: float
    finite: bool
    shape_ok: bool

    @property
    def ok(self) -> bool:
        return self.shape_ok and self.finite and self.rel_l2 <= self.tol

    def __str__(self) -> str:
        return f"rel err < {self.tol:.0e}: {self.ok}"

    def __bool__(self) -> bool:
        return self.ok

    def detail(self) -> str:
        return f"rel L2 err {self.rel_l2:.2e}, max abs err {self.max_abs:.2e} (tolerance {self.tol:.0e})"


def check(out, ref, dtype="float32", *, tol: float | None = None) -> CheckResult:
    """Compare `out` (CuPy or NumPy, any float dtype) with the float64 reference `ref`.

    `dtype` names the precision class: "float32", "tf32", "float16" or "bfloat16" (or a NumPy dtype).
    Any NaN or inf where the reference is finite fails, so outputs poisoned with NaN before a launch
    fail wherever the kernel did not write.
    """
    key = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if tol is None:
        if key not in TOLERANCES:
            raise ValueError(f"no tolerance for dtype {key!r}; known: {', '.join(TOLERANCES)}")
        tol = TOLERANCES[key]
    out64, ref64 = _to_numpy(out), _to_numpy(ref)
    if out64.shape != ref64.shape:
        return CheckResult(np.inf, np.inf, tol, False, False)
    # -inf in the reference (an LSE of a row that sees no key) must be matched exactly.
    ref_inf = ~np.isfinite(ref64)
    same_inf = np.array_equal(out64[ref_inf], ref64[ref_inf])
    o, r = out64[~ref_inf], ref64[~ref_inf]
    finite = bool(np.isfinite(o).all()) and same_inf
    if not finite:
        return CheckResult(np.inf, np.inf, tol, False, True)
    diff = o - r
    norm = np.linalg.norm(r)
    rel = float(np.linalg.norm(diff) / norm) if norm > 0 else float(np.linalg.norm(diff))
    max_abs = float(np.abs(diff).max()) if diff.size else 0.0
    return CheckResult(rel, max_abs, tol, True, True)


@contextlib.contextmanager
def poisoned_allocations():
    """Inside this block every new CuPy allocation is filled with 0xFF bytes (NaN in every float dtype).

    Launchers allocate their outputs with cupy.empty, which may hand back memory that still holds an
    earlier, correct result; poisoning it means an element the kernel forgot to write fails `check`.
    """
    from ._core import cp, require_gpu

    require_gpu()
    pool = cp.get_default_memory_pool()

    def malloc(nbytes):
        mem = pool.malloc(nbytes)
        if nbytes:
            cp.cuda.runtime.memsetAsync(mem.ptr, 0xFF, nbytes, cp.cuda.get_current_stream().ptr)
        return mem

    cp.cuda.set_allocator(malloc)
    try:
        yield
    finally:
        cp.cuda.set_allocator(pool.malloc)
