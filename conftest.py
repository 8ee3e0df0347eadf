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
