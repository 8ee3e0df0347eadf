"""Work started ahead: a test file's kernel builds (or subprocesses) start together, one thread per CPU core, and each
test asks for its own result when it runs.

NVRTC and nvcc run outside Python's lock, and most of the rest is waiting on other processes (the groups of ranks of
tests/test_context_parallel_cpu.py, the simulated T4 runs, pip's dry runs, the grid collections, Triton's builds). In
one pytest process a file of compile tests then becomes about as fast as the machine has cores, and on a GPU machine
all of it overlaps the GPU tests, which keep one core busy. A test file declares what its selected tests will build
and asks for each result by the same key:

    def _plan(item, tmp_path_factory):                 # item: each selected test of this file
        if item.originalname == "test_build_holds_its_kernels":
            build = item.callspec.params["build"]
            yield ("cubin", build), compile_one, (build,)

    AHEAD = Ahead(_plan)
    start_ahead = AHEAD.fixture()                      # module-scoped and autouse: see below

    def test_build_holds_its_kernels(build):
        data = AHEAD.result(("cubin", build), compile_one, build)   # compiled now if nothing started it

Where a GPU is found, tests/conftest.py starts the plans of every file of the session at its first test
(start_session: files in the order they run, those made with first=True before the others: long single jobs that
should not end the session's work last). Otherwise, where the tests themselves are the CPU work, each file starts its
own plan when its first test runs (the module fixture). A test never waits in the queue for its own job: one that no
thread has started yet runs in the test's own thread instead. The module fixture drops the file's results when its
last test is done. A test's monkeypatch (tests/conftest.py) first waits for all the work started ahead (drain), so
that no job reads the state the test changes.

Under pytest-xdist the workers already share the cores, so there each build is made when its test asks for it.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import types

import pytest

_POOL: concurrent.futures.ThreadPoolExecutor | None = None  # the session's threads, shared by every file's plan
_JOBS: set = set()  # the jobs of the files not done yet, for drain()
_LIMITS = None  # threadpoolctl's limits on this process's BLAS and OpenMP threads while start_session's work runs


class _Job:
    """function(*args), run once: by a thread of the pool or, where none has started it yet, by the thread that asks."""

    def __init__(self, function, args):
        self.function, self.args = function, args
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self._claim = threading.Lock()

    def run(self) -> None:
        if not self._claim.acquire(blocking=False):  # another thread has it
            return
        if not self.future.set_running_or_notify_cancel():  # cancelled: its file is done
            return
        try:
            self.future.set_result(self.function(*self.args))
        except BaseException as e:  # noqa: BLE001 - re-raised by result(), pytest's skip and fail included
            self.future.set_exception(e)


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="ahead")
    return _POOL


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")  # a pytest-xdist worker


class Ahead:
    """The builds one test file's selected tests will make, started with every other file's (start_session)."""

    def __init__(self, plan, first: bool = False):
        self.plan = plan  # plan(item, tmp_path_factory) -> iterable of (key, function, args) for one test
        self.first = first  # submitted before the files without it
        self.jobs: dict = {}
        self.started = False

    def start(self, items, tmp_path_factory) -> None:
        """Submit the jobs of `items` (this file's selected tests), once."""
        if self.started:
            return
        self.started = True
        for item in items:
            for key, function, args in self.plan(item, tmp_path_factory):
                if key not in self.jobs:
                    self.jobs[key] = job = _Job(function, args)
                    _JOBS.add(job)
                    _pool().submit(job.run)

    def result(self, key, function, *args):
        """function(*args), from the job started ahead under `key` where there is one (its exception re-raised)."""
        job = self.jobs.get(key)  # kept until the file's last test: several tests may ask for one build
        if job is None:
            return function(*args)
        job.run()  # still queued: run here, now; otherwise this returns at once and the result is waited for
        return job.future.result()

    def close(self) -> None:
        """The file is done: cancel what has not started (tests that were skipped or failed early), wait for what
        has, forget the results."""
        for job in self.jobs.values():
            job.future.cancel()
        concurrent.futures.wait([job.future for job in self.jobs.values()])
        _JOBS.difference_update(self.jobs.values())
        self.jobs.clear()
        self.started = False

    def fixture(self):
        """The module-scoped autouse fixture: starts this file's plan where the session has not, and closes it after
        the file's last test."""

        @pytest.fixture(scope="module", autouse=True)
        def start_ahead(request, tmp_path_factory):
            if _is_worker(request.config):
                yield
                return
            self.start([item for item in request.session.items if getattr(item, "module", None) is request.module],
                       tmp_path_factory)
            try:
                yield
            finally:
                self.close()

        return start_ahead


def start_session(session, tmp_path_factory) -> None:
    """Start the plans of every test file of the session (each module's Ahead instances), in the order the files run,
    those made with first=True before the rest."""
    if _is_worker(session.config):
        return
    by_module: dict = {}
    for item in session.items:
        module = getattr(item, "module", None)
        if isinstance(module, types.ModuleType):  # not nbval's notebook cells
            by_module.setdefault(module, []).append(item)
    plans = [(plan, items) for module, items in by_module.items()
             for plan in vars(module).values() if isinstance(plan, Ahead)]
    _limit_thread_pools()
    for plan, items in sorted(plans, key=lambda p: not p[0].first):  # a stable sort: file order within each
        try:
            plan.start(items, tmp_path_factory)
        except BaseException as e:  # noqa: BLE001 - a plan that fails here fails in its own file instead
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            plan.close()  # the module fixture starts it again, and its file's tests report the error


def _limit_thread_pools() -> None:
    """While the session's work runs ahead on every core, the test thread's BLAS (NumPy's OpenBLAS) and OpenMP (torch's)
    pools use at most a quarter of the cores: their threads spin while they wait for each other, which costs the most
    where they outnumber the free cores. threadpoolctl (requirements-test.txt) sets the limits; without it nothing is
    limited."""
    global _LIMITS
    try:
        import threadpoolctl
    except ImportError:
        return
    if _LIMITS is None:
        _LIMITS = threadpoolctl.threadpool_limits(limits=max(1, (os.cpu_count() or 1) // 4))


def _unlimit_thread_pools() -> None:
    global _LIMITS
    if _LIMITS is not None:
        _LIMITS.restore_original_limits()
        _LIMITS = None


def drain() -> None:
    """Wait until every job started ahead in this session is done (or cancelled); the thread pools get their cores
    back."""
    concurrent.futures.wait([job.future for job in list(_JOBS)])
    _unlimit_thread_pools()


def finish() -> None:
    """The session is over: cancel what has not started and wait for the rest."""
    global _POOL
    for job in _JOBS:
        job.future.cancel()
    drain()
    _JOBS.clear()
    if _POOL is not None:
        _POOL.shutdown(wait=True, cancel_futures=True)
        _POOL = None
    _unlimit_thread_pools()
