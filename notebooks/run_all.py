"""The course's main job: execute every notebook in order.

    python3 notebooks/run_all.py              # all notebooks
    python3 notebooks/run_all.py 00 02        # only the notebooks whose names start with these
    python3 notebooks/run_all.py --summary    # then check and time every kernel at llm.c's shape
                                              # (python3 -m kernels.bench --suite llmc)

Executed copies go to results/notebooks/ (the committed notebooks are left as they are). On a machine
without a CUDA GPU, the notebooks that need none run, and the rest are listed with the reason.

On a GPU, the kernel builds the notebooks use (results/builds.json) are compiled first, in parallel on every CPU core
(kernels/core/prebuild.py), and the run records the builds it used into results/builds.json again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def skip_reason(path: Path) -> str | None:
    """Why notebook `path` cannot run here, or None: its metadata's course.needs_torch without PyTorch installed,
    course.needs_gpu without a GPU, or a GPU below course.min_cc."""
    try:
        course = json.loads(Path(path).read_text())["metadata"].get("course", {})
    except (OSError, ValueError, KeyError):
        course = {}
    if course.get("needs_torch") and importlib.util.find_spec("torch") is None:
        return ("notebook needs PyTorch (a CPU build is enough: "
                "pip install torch --index-url https://download.pytorch.org/whl/cpu)")
    if not course.get("needs_gpu", True):
        return None
    from kernels import device_compute_capability, gpu_name, gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    if reason is not None:
        return f"notebook needs a CUDA GPU: {reason}"
    need, have = tuple(course.get("min_cc", (7, 5))), device_compute_capability()
    if have < need:
        return (f"notebook needs a GPU of compute capability {need[0]}.{need[1]} or newer; this GPU ({gpu_name()}) "
                f"has {have[0]}.{have[1]}")
    return None


def execute(path: Path, out_dir: Path) -> tuple[bool, str]:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]

    class Progress(NotebookClient):
        async def async_execute_cell(self, cell, cell_index, *args, **kwargs):
            if cell.cell_type == "code":
                done = sum(1 for c in code[: code.index(cell) + 1])
                print(f"\r  {path.stem}: cell {done}/{len(code)}", end="", flush=True)
            return await super().async_execute_cell(cell, cell_index, *args, **kwargs)

    client = Progress(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    t0 = time.time()
    try:
        client.execute()
        ok, msg = True, f"{time.time() - t0:.0f} s"
    except CellExecutionError as e:
        ok, msg = False, str(e).strip().splitlines()[-1]
    out_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out_dir / path.name)
    print()
    return ok, msg


def main(argv: list[str]) -> int:
    from kernels import gpu_unavailable_reason

    summary_too = "--summary" in argv
    argv = [a for a in argv if a != "--summary"]

    reason = gpu_unavailable_reason()
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if argv:
        notebooks = [p for p in notebooks if any(p.name.startswith(a) for a in argv)]
    out_dir = ROOT / "results" / "notebooks"
    summary, failed = [], False
    build_log = None
    if reason is None:
        from kernels.core import prebuild
        from kernels.core.compile import BUILD_LOG_ENV

        if prebuild.DEFAULT_LIST.is_file():
            prebuild.prebuild(prebuild.read_builds(prebuild.DEFAULT_LIST))
        build_log = Path(tempfile.mkstemp(prefix="course-builds-", suffix=".jsonl")[1])
        os.environ[BUILD_LOG_ENV] = str(build_log)  # the notebooks' kernels inherit it
    for path in notebooks:
        why = skip_reason(path)
        if why is not None:
            summary.append((path.stem, "skipped", why))
            continue
        print(f"[{len(summary) + 1}/{len(notebooks)}] executing {path.name}")
        ok, msg = execute(path, out_dir)
        failed |= not ok
        summary.append((path.stem, "ok" if ok else "FAILED", msg))
    print("\nnotebooks (executed copies in results/notebooks/):")
    for name, status, msg in summary:
        print(f"  {name:28s} {status:8s} {msg}")
    if reason is not None:
        print(f"\nEverything that runs without a GPU ran; on a GPU machine the same command runs the rest ({reason}).")
        return 1 if failed else 0
    rc = 0
    if summary_too:
        print("\nkernel summary (python3 -m kernels.bench --suite llmc; the long-sequence grid: python3 -m kernels.bench):")
        from kernels.bench import attention as bench

        rc = bench.main(["--suite", "llmc"])
    else:
        print("\nEvery kernel's correctness and speed at llm.c's shape: python3 notebooks/run_all.py --summary "
              "(or python3 -m kernels.bench --suite llmc).")
    keep_builds(build_log, replace=not argv and not failed)
    return 1 if failed or rc else 0


def keep_builds(build_log: Path, replace: bool) -> None:
    """results/builds.json := the builds this run used (replace), or those added to the ones it lists (a partial run)."""
    from kernels.core import prebuild

    used = prebuild.read_builds(build_log)
    if not replace and prebuild.DEFAULT_LIST.is_file():
        used += prebuild.read_builds(prebuild.DEFAULT_LIST)
    prebuild.write_builds(prebuild.DEFAULT_LIST, used)
    build_log.unlink()
    print(f"kernel builds used: {len(used)} (results/builds.json, compiled in parallel at the start of the next run)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
