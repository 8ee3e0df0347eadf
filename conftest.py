"""pytest's summary of skipped tests, one line per reason with a count (for tests/ and notebooks/ alike).

Where no GPU is found, hundreds of GPU tests and notebook cells skip for the same few reasons; pytest's own -rs would
print one line per test location. pyproject.toml asks pytest for failures and errors only (-rfE) and this prints the
skips grouped.
"""

import os
from collections import Counter


def pytest_terminal_summary(terminalreporter):
    reasons = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.section("skipped, by reason")
        for reason, n in reasons.most_common():
            terminalreporter.line(f"{n:5d}  {reason}")


# ---------------------------------------------------------------------------------------------------------
# The GPU test grids: the default covers every kernel x dtype x boundary class (ragged lengths, Tq != Tk, rows that
# see no key, large magnitudes, every head size, every schedule and build a launcher ships, every error path) in
# minutes; `--full-grid` adds the exhaustive sweeps (the rest of each grid's product), which the GPU CI workflow runs
# on a schedule. tests/test_grid_coverage.py checks that the default keeps those classes.
# ---------------------------------------------------------------------------------------------------------

def pytest_addoption(parser):
    parser.addoption("--full-grid", action="store_true", default=False,
                     help="also run the cases marked full_grid: the exhaustive GPU grids (minutes more on a GPU)")
    parser.addoption("--no-prebuild", action="store_true", default=False,
                     help="on a GPU, do not compile the kernel builds the tests and notebooks use in parallel first")
    parser.addoption("--record-builds", action="store_true", default=False,
                     help="write the kernel builds this session compiles to results/test-builds.json")


# ---------------------------------------------------------------------------------------------------------
# Compiling first, in parallel: one process compiling each kernel build as the tests reach it spends most of its time
# in NVRTC. On a GPU the session starts by compiling the builds the notebooks (results/builds.json) and the tests
# (results/test-builds.json) use, on every CPU core (kernels/core/prebuild.py); later compiles hit the cache.
# ---------------------------------------------------------------------------------------------------------

def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")  # a pytest-xdist worker: its controller prebuilds and records


def pytest_sessionstart(session):
    config = session.config
    if config.getoption("--no-prebuild", default=True) or _is_worker(config):
        return
    from kernels.core import gpu_unavailable_reason, prebuild

    records = prebuild.course_builds()
    from kernels.core.device import SIMULATE_ENV

    simulated = os.environ.get(SIMULATE_ENV)  # the lists are the real GPU's builds, not an older GPU's PTX
    if gpu_unavailable_reason() is None and records and not simulated:
        prebuild.prebuild(records, log=lambda s: print("\n" + s))


def _start_recording(config) -> None:
    import tempfile

    from kernels.core.compile import BUILD_LOG_ENV

    config._build_log = tempfile.mkstemp(prefix="course-test-builds-", suffix=".jsonl")[1]
    os.environ[BUILD_LOG_ENV] = config._build_log  # set before xdist starts its workers, which inherit it


def pytest_sessionfinish(session):
    log = getattr(session.config, "_build_log", None)
    if log is not None:
        from kernels.core import prebuild

        records = prebuild.read_builds(log)
        if records:  # nothing compiled (no GPU): keep the list as it is
            prebuild.write_builds(prebuild.TEST_LIST, records)
        os.unlink(log)


def pytest_configure(config):
    config.addinivalue_line("markers", "full_grid: a case of the exhaustive grid, run only with --full-grid")
    if config.getoption("--record-builds", default=False) and not _is_worker(config):
        _start_recording(config)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--full-grid", default=False):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("full_grid") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
