"""Compile a list of kernel builds in parallel processes, so that a long run finds them in the compile cache.

    python3 -m kernels.core.prebuild                       # the notebooks' and the tests' builds (results/)
    python3 -m kernels.core.prebuild my-builds.json -j 4   # another list, on 4 processes

A kernel build (one kernel file, its template instantiations and -D defines, compiled by NVRTC) takes one to a few
seconds of one CPU core, and the notebooks use about a hundred of them. Compiled one after the other as the cells
reach them, they are most of a first run's time; compiled here first, on every core, they take a fraction of it,
and the notebooks then load them from CuPy's disk cache ($CUPY_CACHE_DIR, default ~/.cupy/kernel_cache).

The list is what load_module records where $COURSE_BUILD_LOG names a file (kernels/core/compile.py):
notebooks/run_all.py records every run and keeps the list in results/builds.json. A build that does not compile for
this GPU (an sm_90a build on an older one, a kernel that needs a newer compute capability) is counted and skipped: the
notebook that needs it says why when it gets there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LIST = ROOT / "results" / "builds.json"  # the notebooks' builds (notebooks/run_all.py writes it)
TEST_LIST = ROOT / "results" / "test-builds.json"  # the default test grid's (pytest --record-builds writes it)


def course_builds() -> list[dict]:
    """The builds of both lists that exist, each once: what a run of the notebooks and the tests compiles."""
    return distinct_builds([r for path in (DEFAULT_LIST, TEST_LIST) if path.is_file() for r in read_builds(path)])


def build_key(record: dict) -> str:
    """What makes a build: its record without the notebook tag (the same build used by two notebooks is one build)."""
    return json.dumps({k: v for k, v in record.items() if k != "notebook"}, sort_keys=True)


def notebook_order(record: dict) -> tuple:
    """Sorts records by the notebook that first used them ("01" before "06"), the untagged (the tests') last."""
    return record.get("notebook") is None, record.get("notebook") or ""


def distinct_builds(records: list[dict]) -> list[dict]:
    """records without repeats, sorted by build; a build listed more than once keeps its earliest notebook tag."""
    unique: dict = {}
    for r in records:
        key = build_key(r)
        if key not in unique or notebook_order(r) < notebook_order(unique[key]):
            unique[key] = r
    return [unique[k] for k in sorted(unique)]


def read_builds(path: Path) -> list[dict]:
    """The distinct builds of a list file: a JSON array of build records, or JSON lines (the raw build log)."""
    text = Path(path).read_text()
    records = json.loads(text) if text.lstrip().startswith("[") else [json.loads(s) for s in text.splitlines() if s]
    return distinct_builds(records)


def write_builds(path: Path, records: list[dict]) -> None:
    """Save records as a sorted JSON array without repeats (the form results/builds.json is committed in)."""
    rows = ",\n".join(" " + json.dumps(r) for r in distinct_builds(records))
    Path(path).write_text("[\n" + rows + "\n]\n")


def _build_one(record: dict) -> tuple[str, str | None]:
    """(file, None) once the build is compiled and in the cache, or (file, the reason it could not be)."""
    from kernels.core.compile import build_arguments, load_module

    try:
        load_module(*build_arguments(record))
        return record["file"], None
    except Exception as e:  # a build for another GPU, a file renamed since the list was made, ...
        return record["file"], f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"


def prebuild(records: list[dict], jobs: int | None = None, log=print) -> dict:
    """Compile `records` on `jobs` processes (default: every CPU core); {"built", "skipped", "seconds"}."""
    from kernels.core.device import gpu_unavailable_reason

    from kernels.core.device import device_compute_capability

    reason = gpu_unavailable_reason()
    if reason is not None:
        raise SystemExit(f"prebuild needs a CUDA GPU (CuPy compiles for the GPU it runs on): {reason}")
    cc = "%d%d" % device_compute_capability()
    foreign = [r for r in records if r["arch"] is not None and not r["arch"].startswith(f"sm_{cc}")]
    records = [r for r in records if r not in foreign]  # a CUBIN for another GPU could not be loaded here
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(records) or 1))
    t0 = time.perf_counter()
    skipped = []
    # spawn, not fork: each process starts its own CUDA context
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        for name, why in pool.imap_unordered(_build_one, records):
            if why is not None:
                skipped.append((name, why))
    seconds = time.perf_counter() - t0
    log(f"prebuild: {len(records) - len(skipped)} kernel builds compiled or found in the cache, on {jobs} processes, "
        f"in {seconds:.0f} s" + (f"; {len(skipped) + len(foreign)} skipped (not for this GPU)"
                                   if skipped or foreign else ""))
    for name, why in skipped[:5]:
        log(f"  skipped {name}: {why}")
    return {"built": len(records) - len(skipped), "skipped": len(skipped) + len(foreign), "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m kernels.core.prebuild", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("builds", nargs="?", type=Path, default=None,
                   help="a list of builds (default: results/builds.json and results/test-builds.json)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="processes (default: one per CPU core)")
    args = p.parse_args(argv)
    if args.builds is not None and not args.builds.is_file():
        print(f"no list of builds at {args.builds}", file=sys.stderr)
        return 2
    records = read_builds(args.builds) if args.builds is not None else course_builds()
    if not records:
        print("no builds listed: run notebooks/run_all.py or pytest --record-builds on a GPU first", file=sys.stderr)
        return 2
    prebuild(records, args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
