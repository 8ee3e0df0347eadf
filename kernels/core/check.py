"""The one correctness check of the course: relative L2 error and worst element against the float64 reference.

    result = check(out, ref, "float32")
    print(result)          # "rel err < 1e-05 (worst element < 1e-04): True"   (stable text: nbval compares it)
    result.ok              # the boolean a test asserts
    result.detail()        # the numbers, which vary from run to run

Two bounds, both must hold:

    relative L2 error     ||out - ref|| / ||ref||          <= tol
    worst element         max |out - ref| / max |ref|      <= ELEMENT_FACTOR * tol

The tolerance `tol` is chosen by the precision of the kernel's inputs and math (TOLERANCES below, and
CONTRIBUTING.md for why). The L2 bound is the accuracy a kernel of that precision reaches on the whole
tensor; but averaged over millions of elements it would let one wrong tile, or a wrong diagonal of the
causal mask, pass unnoticed. The worst-element bound catches that: any element off by more than
ELEMENT_FACTOR * tol of the tensor's own scale (its largest reference value) fails. A correct kernel stays
well inside it: simulated with the course kernels' rounding (q, k, v, P and O rounded as the kernels round them;
tests/test_check.py), the worst element over the test grid is 7e-6 (float32), 5e-4 (float16) and 4e-3
(bfloat16) of max |ref|, against bounds of 1e-4, 2e-2 and 1e-1.
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
ELEMENT_FACTOR = 10  # the worst element may be off by ELEMENT_FACTOR * tol of max |ref|


def _to_numpy(x) -> np.ndarray:
    if hasattr(x, "get") and not isinstance(x, np.ndarray):  # a CuPy array
        x = x.get()
    return np.asarray(x, dtype=np.float64)


@dataclass(frozen=True)
class CheckResult:
    rel_l2: float  # ||out - ref|| / ||ref|| over the finite reference entries
    max_abs: float  # max |out - ref|
    max_rel: float  # max |out - ref| / max |ref|
    tol: float  # bound on rel_l2
    finite: bool  # no NaN/inf where the reference is finite, and -inf exactly where it is -inf
    shape_ok: bool

    @property
    def element_tol(self) -> float:
        return ELEMENT_FACTOR * self.tol

    @property
    def ok(self) -> bool:
        return self.shape_ok and self.finite and self.rel_l2 <= self.tol and self.max_rel <= self.element_tol

    def __str__(self) -> str:
        return f"rel err < {self.tol:.0e} (worst element < {self.element_tol:.0e}): {self.ok}"

    def __bool__(self) -> bool:
        return self.ok

    def detail(self) -> str:
        return (f"rel L2 err {self.rel_l2:.2e} (tolerance {self.tol:.0e}), worst element {self.max_abs:.2e} = "
                f"{self.max_rel:.2e} of max |ref| (tolerance {self.element_tol:.0e})")

    def as_dict(self) -> dict:
        """Numbers and booleans only (for JSON)."""
        return {"ok": bool(self.ok), "rel_l2": self.rel_l2, "max_abs": self.max_abs, "max_rel": self.max_rel,
                "tol": self.tol, "element_tol": self.element_tol}


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
        return CheckResult(np.inf, np.inf, np.inf, tol, False, False)
    # -inf in the reference (an LSE of a row that sees no key) must be matched exactly.
    ref_inf = ~np.isfinite(ref64)
    same_inf = np.array_equal(out64[ref_inf], ref64[ref_inf])
    o, r = out64[~ref_inf], ref64[~ref_inf]
    finite = bool(np.isfinite(o).all()) and same_inf
    if not finite:
        return CheckResult(np.inf, np.inf, np.inf, tol, False, True)
    diff = o - r
    norm = np.linalg.norm(r)
    rel = float(np.linalg.norm(diff) / norm) if norm > 0 else float(np.linalg.norm(diff))
    max_abs = float(np.abs(diff).max()) if diff.size else 0.0
    scale = float(np.abs(r).max()) if r.size else 0.0
    max_rel = max_abs / scale if scale > 0 else max_abs
    return CheckResult(rel, max_abs, max_rel, tol, True, True)


@contextlib.contextmanager
def poisoned_allocations():
    """Inside this block every new CuPy allocation is filled with 0xFF bytes (NaN in every float dtype).

    Launchers allocate their outputs with cupy.empty, which may hand back memory that still holds an
    earlier, correct result; poisoning it means an element the kernel forgot to write fails `check`.
    """
    from .device import cp, require_gpu

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
