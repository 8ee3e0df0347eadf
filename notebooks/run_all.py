"""The course's main job: execute every notebook in order.

    python3 notebooks/run_all.py              # all notebooks
    python3 notebooks/run_all.py 00 02        # only the notebooks whose names start with these
    python3 notebooks/run_all.py --summary    # then check and time every kernel at llm.c's shape
                                              # (python3 -m kernels.bench --suite llmc)

Executed copies go to results/notebooks/ (the committed notebooks are left as they are). On a machine
without a CUDA GPU, the notebooks that need none run, and the rest are listed with the reason.

On a GPU, the kernel builds the notebooks use (results/builds.json) compile in the background, on every CPU core but
one, while the notebooks execute (kernels/core/prebuild.py): each notebook starts once the builds of it and of the
notebooks before it are in the compile cache. The run records the builds each notebook used into results/builds.json
again, tagged with the first notebook that used them.

Each notebook's Jupyter kernel is started while the notebook before it runs, and imports NumPy, Matplotlib, CuPy and
PyTorch there (quietly: the notebook's outputs and execution counts are its own), so that a notebook starts on a
kernel that is up and has its libraries loaded. The imports touch no GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
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


WARM_UP = """\
import numpy, matplotlib.pyplot
try:
    import cupy, torch
except ImportError:
    pass
"""  # what a kernel imports before its notebook's turn
KERNEL_NAME = "python3"  # the kernelspec every notebook names


def start_kernel(path: Path, log_dir: Path | None, warm_up: str = WARM_UP, **popen):
    """A Jupyter kernel for notebook `path`, started now (in its folder, its build log in log_dir) and running
    `warm_up` while the notebook before it runs. `popen` goes to the kernel's process (stderr=, as nbval passes)."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name=KERNEL_NAME)
    km.start_kernel(cwd=str(path.parent), env=notebook_env(log_dir, path), **popen)
    kc = km.client()
    kc.start_channels()
    kc.execute(warm_up, silent=True, store_history=False)  # queued until the kernel is up; no output, no count
    return km, kc


def stop_kernel(kernel) -> None:
    km, kc = kernel
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def execute(path: Path, out_dir: Path, kernel) -> tuple[bool, str]:
    """Run notebook `path` on `kernel` (start_kernel's) and write the executed copy to out_dir: (ok, seconds or the
    error)."""
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

    kernel[1].wait_for_ready(timeout=300)  # up, and done with WARM_UP (a kernel started just now takes a second)
    client = Progress(nb, km=kernel[0], timeout=1800, kernel_name=KERNEL_NAME,
                      resources={"metadata": {"path": str(path.parent)}})
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
    compiling, log_dir = None, None
    if reason is None:
        compiling = start_compile()
        log_dir = Path(tempfile.mkdtemp(prefix="course-builds-"))
    runnable = []
    for path in notebooks:
        why = skip_reason(path)
        if why is None:
            runnable.append(path)
        else:
            summary.append((path.stem, "skipped", why))
    kernel = start_kernel(runnable[0], log_dir) if runnable else None
    for i, path in enumerate(runnable):
        print(f"[{i + 1}/{len(runnable)}] executing {path.name}")
        if compiling is not None:
            wait_for_builds(compiling, path)
        following = start_kernel(runnable[i + 1], log_dir) if i + 1 < len(runnable) else None
        try:
            ok, msg = execute(path, out_dir, kernel)
        except BaseException:
            if following is not None:
                stop_kernel(following)
            raise
        finally:
            stop_kernel(kernel)
        kernel = following
        failed |= not ok
        summary.append((path.stem, "ok" if ok else "FAILED", msg))
    if compiling is not None:
        compiling.close()
    print("\nnotebooks (executed copies in results/notebooks/):")
    for name, status, msg in sorted(summary):
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
    keep_builds(log_dir, replace=not argv and not failed)
    return 1 if failed or rc else 0


def start_compile():
    """Start compiling the builds results/builds.json lists, in the background; None where there is no list yet."""
    from kernels.core import prebuild

    if not prebuild.DEFAULT_LIST.is_file():
        return None
    compiling = prebuild.start(prebuild.read_builds(prebuild.DEFAULT_LIST))
    print(f"compiling {len(compiling.records)} kernel builds in the background, on {compiling.jobs} processes")
    return compiling


def wait_for_builds(compiling, path: Path) -> None:
    """Block until the builds of notebook `path` and of the notebooks before it are compiled."""
    waited = compiling.wait(path.name[:2])
    if waited >= 1:
        print(f"  waited {waited:.0f} s for its kernel builds")


def notebook_env(log_dir: Path | None, path: Path) -> dict:
    """The environment of notebook `path`'s kernel: this one, with its builds logged to log_dir/NN.jsonl, or (log_dir
    None) not logged: a test session's `--record-builds` list is the tests' builds, not the notebooks'."""
    from kernels.core.compile import BUILD_LOG_ENV

    env = dict(os.environ)
    env.pop(BUILD_LOG_ENV, None)
    if log_dir is not None:
        env[BUILD_LOG_ENV] = str(log_dir / f"{path.name[:2]}.jsonl")
    return env


def notebook_builds(log_dir: Path) -> list[dict]:
    """The builds in the notebooks' logs, each once, tagged with the first notebook that used it."""
    from kernels.core import prebuild

    return prebuild.distinct_builds([dict(r, notebook=log.stem) for log in sorted(log_dir.glob("*.jsonl"))
                                     for r in prebuild.read_builds(log)])


def keep_builds(log_dir: Path, replace: bool) -> None:
    """results/builds.json := the builds this run used (replace), or those and the listed ones (a partial run), each
    tagged with the earliest notebook that uses it: a partial run of a later chapter leaves the order of the compile
    as the full run found it."""
    from kernels.core import prebuild

    used = notebook_builds(log_dir)
    if not replace and prebuild.DEFAULT_LIST.is_file():
        used = prebuild.distinct_builds(used + prebuild.read_builds(prebuild.DEFAULT_LIST))
    prebuild.write_builds(prebuild.DEFAULT_LIST, used)
    shutil.rmtree(log_dir)
    print(f"kernel builds used: {len(used)} (results/builds.json, compiled beside the notebooks in the next run)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
