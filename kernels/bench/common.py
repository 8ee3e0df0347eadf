"""What every benchmark entry point does the same way: refuse to start without a GPU, leave out what does not run,
and keep its result."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..core import cp, gpu_unavailable_reason

ROOT = Path(__file__).resolve().parents[2]  # the repository: results/ and README.md live here
NO_GPU = 2  # the exit status of a benchmark started where no GPU can be used


def gpu_missing(command: str) -> int | None:
    """None where a GPU can be used; otherwise print why `command` cannot run (on stderr) and return NO_GPU."""
    reason = gpu_unavailable_reason()
    if reason is None:
        return None
    print(f"{command} needs a CUDA GPU: {reason}", file=sys.stderr)
    return NO_GPU


def save_result(result: dict, out_path: Path | None) -> dict:
    """Write `result` to out_path as JSON (nothing when out_path is None) and return it."""
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1))
    return result


def not_run(e: Exception) -> str:
    return f"not run: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


def runnable(fns: dict, build=None, errors=Exception) -> tuple[dict, dict]:
    """The entries of fns that run once without an error, to time ({name: callable}; where build is given, the callable
    is build(fns[name])), and not_run(error) for the others ({name: str}): a backend that refuses the shape, a
    configuration out of shared memory or registers. Recorded, not fatal; an error not of `errors` is raised."""
    ok, notes = {}, {}
    for name, fn in fns.items():
        try:
            fn = build(fn) if build is not None else fn
            fn()
            cp.cuda.Device().synchronize()
            ok[name] = fn
        except errors as e:
            notes[name] = not_run(e)
    return ok, notes
