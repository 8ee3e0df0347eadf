"""pytest's summary of skipped tests, one line per reason with a count (for tests/ and notebooks/ alike).

Where no GPU is found, hundreds of GPU tests and notebook cells skip for the same few reasons; pytest's own -rs would
print one line per test location. pyproject.toml asks pytest for failures and errors only (-rfE) and this prints the
skips grouped.
"""

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


def pytest_configure(config):
    config.addinivalue_line("markers", "full_grid: a case of the exhaustive grid, run only with --full-grid")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--full-grid", default=False):
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("full_grid") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
