"""Compile a list of kernel builds in parallel processes, so that a long run finds them in the compile cache.

    python3 -m kernels.core.prebuild                       # the notebooks' and the tests' builds (results/)
    python3 -m kernels.core.prebuild my-builds.json -j 4   # another list, on 4 processes

A kernel build (one kernel file, its template instantiations and -D defines, compiled by NVRTC) takes one to a few
seconds of one CPU core, and the notebooks use about a hundred of them. Compiled one after the other as the cells
reach them, they are most of a first run's time; compiled here on every core, they take a fraction of it, and the
notebooks then load them from CuPy's disk cache ($CUPY_CACHE_DIR, default ~/.cupy/kernel_cache).

prebuild() compiles a list and returns when all of it is done (the test session, the command line). start() runs the
same compile in the background, overlapping the work that needs it: notebooks/run_all.py executes each notebook once
compiling.wait("06") says that the builds of notebooks 00-06 are done, while the later notebooks' builds compile.

The list is what load_module records where $COURSE_BUILD_LOG names a file (kernels/core/compile.py):
notebooks/run_all.py records every run and keeps the list in results/builds.json, each build tagged with the first
notebook that used it ("notebook": "06"); the tests' list (results/test-builds.json) has no tags and compiles last.
A build that does not compile for this GPU (an sm_90a build on an older one, a kernel that needs a newer compute
capability) is counted and skipped: the notebook that needs it says why when it gets there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import threading
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
    """Compile `records` on `jobs` processes (default: every CPU core) and wait for all of them;
    {"built", "skipped", "seconds"}."""
    return start(records, jobs or os.cpu_count() or 1, log).close()


def start(records: list[dict], jobs: int | None = None, log=print, build=_build_one, context=None) -> Compiling:
    """Start compiling `records` in the background, the builds of the earliest notebook first and the untagged last,
    on `jobs` processes (default: every CPU core but one, left for the work the compile overlaps).

    `build(record) -> (file, None or the reason it was skipped)` runs in the pool of `context` (default: spawned
    processes, each with its own CUDA context); a test passes a plain function and multiprocessing.dummy (threads).
    """
    records, foreign = _for_this_gpu(records)
    jobs = max(1, min(jobs or (os.cpu_count() or 2) - 1, len(records) or 1))
    context = context or multiprocessing.get_context("spawn")
    return Compiling(sorted(records, key=notebook_order), len(foreign), jobs, log, build, context)


def _for_this_gpu(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the records this GPU can load, those for another architecture); SystemExit without a GPU."""
    from kernels.core.device import device_compute_capability, gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    if reason is not None:
        raise SystemExit(f"prebuild needs a CUDA GPU (CuPy compiles for the GPU it runs on): {reason}")
    cc = "%d%d" % device_compute_capability()
    foreign = [r for r in records if r["arch"] is not None and not r["arch"].startswith(f"sm_{cc}")]
    return [r for r in records if r not in foreign], foreign  # a CUBIN for another GPU could not be loaded here


class Compiling:
    """A compile started by start(): wait(notebook) blocks until the builds a notebook needs are done, close() until
    all of them are, and logs how it went."""

    def __init__(self, records: list[dict], foreign: int, jobs: int, log, build, context):
        self.records, self.foreign, self.jobs, self.log = records, foreign, jobs, log
        self.done = 0  # records[:done] are compiled or skipped
        self.skipped: list[tuple[str, str]] = []
        self.seconds: float | None = None  # from the start to the last build, once all are done
        self.error: BaseException | None = None
        self._changed = threading.Condition()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, args=(build, context), name="prebuild", daemon=True)
        self._thread.start()

    def _run(self, build, context) -> None:
        try:
            if self.records:
                with context.Pool(self.jobs) as pool:
                    for name, why in pool.imap(build, self.records):  # in order: each result ends a done prefix
                        self._finished_one(name, why)
        except BaseException as e:  # a worker that died, a build function that raised: wait() and close() raise it
            self.error = e
        finally:
            with self._changed:
                self.seconds = time.perf_counter() - self._t0
                self._changed.notify_all()

    def _finished_one(self, name: str, why: str | None) -> None:
        with self._changed:
            if why is not None:
                self.skipped.append((name, why))
            self.done += 1
            self._changed.notify_all()

    def wait(self, notebook: str) -> float:
        """Block until every build tagged `notebook` ("06") or an earlier one is done; the seconds it waited."""
        needed = sum(1 for r in self.records if r.get("notebook") is not None and r["notebook"] <= notebook)
        t0 = time.perf_counter()
        with self._changed:
            self._changed.wait_for(lambda: self.done >= needed or self.seconds is not None)
        self._raise_error()
        return time.perf_counter() - t0

    def close(self) -> dict:
        """Wait for every build, log one line (and the first reasons for skips); {"built", "skipped", "seconds"}."""
        self._thread.join()
        self._raise_error()
        built, skipped = len(self.records) - len(self.skipped), len(self.skipped) + self.foreign
        self.log(f"prebuild: {built} kernel builds compiled or found in the cache, on {self.jobs} processes, "
                 f"in {self.seconds:.0f} s" + (f"; {skipped} skipped (not for this GPU)" if skipped else ""))
        for name, why in self.skipped[:5]:
            self.log(f"  skipped {name}: {why}")
        return {"built": built, "skipped": skipped, "seconds": self.seconds}

    def _raise_error(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the parallel compile stopped: {self.error!r}") from self.error


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
