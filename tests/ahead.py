"""Work started ahead: a test file's kernel builds (or subprocesses) start together, one thread per CPU core, when
its first test runs.

NVRTC and nvcc run outside Python's lock, so in one pytest process a file of compile tests becomes about as fast as
the machine has cores; each test then waits for its own build. The same holds for work that waits on other processes:
the groups of ranks of tests/test_context_parallel_cpu.py, the simulated T4 runs, pip's dry runs. A test file
declares what its selected tests will build and asks for each result by the same key:

    def _plan(item, tmp_path_factory):                 # item: each selected test of this file
        if item.originalname == "test_build_holds_its_kernels":
            build = item.callspec.params["build"]
            yield ("cubin", build), compile_one, (build,)

    AHEAD = Ahead(_plan)
    start_ahead = AHEAD.fixture()                      # module-scoped and autouse: starts the builds

    def test_build_holds_its_kernels(build):
        data = AHEAD.result(("cubin", build), compile_one, build)   # compiled now if nothing started it

Under pytest-xdist the workers already share the cores, so there each build is made when its test asks for it.
"""

from __future__ import annotations

import concurrent.futures
import os

import pytest


class Ahead:
    """The builds one test file's selected tests will make, started together by its autouse fixture."""

    def __init__(self, plan):
        self.plan = plan  # plan(item, tmp_path_factory) -> iterable of (key, function, args) for one test
        self.futures: dict = {}

    def result(self, key, function, *args):
        """function(*args), from the build started ahead under `key` where there is one (its exception re-raised)."""
        future = self.futures.get(key)  # kept until the file's last test: several tests may ask for one build
        return future.result() if future is not None else function(*args)

    def fixture(self):
        """The module-scoped autouse fixture that starts the builds of this file's selected tests."""

        @pytest.fixture(scope="module", autouse=True)
        def start_ahead(request, tmp_path_factory):
            if hasattr(request.config, "workerinput"):  # a pytest-xdist worker
                yield
                return
            jobs = {}
            for item in request.session.items:
                if getattr(item, "module", None) is request.module:  # not nbval cells or other files' tests
                    for key, function, args in self.plan(item, tmp_path_factory):
                        jobs.setdefault(key, (function, *args))
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1)
            try:
                self.futures.update({key: pool.submit(*job) for key, job in jobs.items()})
                yield
            finally:
                for future in self.futures.values():  # builds of tests that were skipped or failed early
                    future.cancel()
                self.futures.clear()
                pool.shutdown(wait=True)

        return start_ahead
