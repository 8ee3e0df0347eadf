"""The pinned versions install where the README says the course runs: Python 3.10, 3.11 and 3.12 (CPU; needs the
package index, and is skipped with the reason where pip cannot reach it).

pip evaluates the environment markers of a constraints file against the Python that runs it, not the one named by
--python-version, so the test selects the lines that apply to each version itself (with `packaging`, as pip would on
that Python) and asks pip to resolve requirements-test.txt under them for that version, without installing anything.
"""

import subprocess
import sys
from pathlib import Path

import pytest
from ahead import Ahead

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = ["3.10", "3.11", "3.12"]
NETWORK_TROUBLE = ("Failed to establish", "Network is unreachable", "Temporary failure in name resolution",
                   "Max retries exceeded", "ConnectionError", "Connection refused", "timed out")


def constraints_for(version: str) -> list[str]:
    """The lines of constraints.txt that apply on Python `version`, markers evaluated for that version."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = default_environment()
    env.update(python_version=version, python_full_version=f"{version}.0")
    out = []
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            out.append(f"{req.name}{req.specifier}")
    return out


def test_every_python_gets_one_pin_per_package():
    for version in PYTHONS:
        names = [line.split("==")[0].lower() for line in constraints_for(version)]
        assert len(names) == len(set(names)), f"Python {version}: a package pinned twice: {names}"
        assert "numpy" in names and "pytest" in names


def _resolve(version, tmp_path):
    """pip's dry run of requirements-test.txt under the constraints of `version`: (command, result)."""
    pins = tmp_path / "constraints.txt"
    pins.write_text("\n".join(constraints_for(version)) + "\n")
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--disable-pip-version-check",
           "--python-version", version, "--only-binary=:all:", "--target", str(tmp_path / "target"),
           "-r", str(ROOT / "requirements-test.txt"), "-c", str(pins)]
    return cmd, subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _plan(item, tmp_path_factory):
    """The three dry runs start together (tests/ahead.py): each waits on pip, not on Python."""
    if item.originalname == "test_test_requirements_resolve_with_the_constraints":
        version = item.callspec.params["version"]
        yield version, _resolve, (version, tmp_path_factory.mktemp(f"py{version}"))


AHEAD = Ahead(_plan)
start_ahead = AHEAD.fixture()


@pytest.mark.parametrize("version", PYTHONS)
def test_test_requirements_resolve_with_the_constraints(version, tmp_path):
    _, res = AHEAD.result(version, _resolve, version, tmp_path)
    if res.returncode and any(s in res.stderr for s in NETWORK_TROUBLE):
        pytest.skip(f"pip cannot reach the package index: {res.stderr.strip().splitlines()[-1]}")
    assert res.returncode == 0, f"Python {version}: requirements-test.txt with constraints.txt does not resolve:\n" \
                                f"{res.stderr[-3000:]}"
