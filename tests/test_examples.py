"""The host-side examples in kernels/examples/: one small C++ program per family that calls a course kernel the way an
engineer's own code would (allocate, fill, launch with the documented grid, block and shared memory, copy back, check
a few rows against a CPU loop). Each example's header gives its nvcc line; the CPU test builds it with that line where
nvcc is installed (once per session), and on a GPU that program runs and must print its `ok` line and exit 0."""

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from ahead import Ahead

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "kernels" / "examples").glob("*.cu"))


def nvcc_line(example: Path) -> list[str]:
    for line in example.read_text().splitlines():
        if not line.startswith("//"):
            break
        m = re.match(r"//\s+(nvcc\s.+)$", line)
        if m:
            return shlex.split(m.group(1))
    pytest.fail(f"{example.name}: no `//   nvcc ...` line in the header")


def build(example: Path, out: Path) -> Path:
    cmd = nvcc_line(example)
    if "-o" in cmd:
        i = cmd.index("-o")
        del cmd[i:i + 2]
    cmd += ["-o", os.fspath(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    assert "warning" not in res.stderr.lower(), res.stderr
    return out


def _build_or_error(example: Path, out: Path):
    try:
        return build(example, out)
    except AssertionError as e:
        return e


def _arch_skip_reason(example: Path) -> str | None:
    """Why this GPU cannot run the example as its documented line builds it, or None."""
    import kernels

    major, minor = kernels.device_compute_capability()
    line = " ".join(nvcc_line(example))
    arch = re.search(r"(?:-arch=sm_|code=sm_)(\d+)(a?)", line)
    if arch and (int(arch.group(1)) > 10 * major + minor or (arch.group(2) and int(arch.group(1)) != 10 * major + minor)):
        return f"{example.name} is built for sm_{arch.group(1)}{arch.group(2)}; this GPU is sm_{major}{minor}"
    return None


def _run(exe: Path) -> subprocess.CompletedProcess:
    return subprocess.run([os.fspath(exe)], capture_output=True, text=True, timeout=120)


def _build_then_run(example: Path, out: Path):
    """The example's run (or its build's error), once its build (started ahead under the same example) is done."""
    exe = AHEAD.result(("build", example), _build_or_error, example, out)
    return exe if isinstance(exe, AssertionError) else _run(exe)


def _plan(item, tmp_path_factory):
    """Every example builds at once, and where this GPU can run one, it runs as soon as it is built (the programs are
    small; running them side by side on one GPU changes nothing they check)."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    if "example" not in params or not shutil.which("nvcc"):
        return
    import kernels

    example = params["example"]
    out = tmp_path_factory.mktemp("examples") / example.stem
    if item.originalname == "test_example_builds_with_its_documented_line":
        yield ("build", example), _build_or_error, (example, out)
    elif kernels.gpu_unavailable_reason() is None and _arch_skip_reason(example) is None:
        yield ("run", example), _build_then_run, (example, out)


AHEAD = Ahead(_plan)  # tests/ahead.py
start_ahead = AHEAD.fixture()


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """built(example): the program built with its documented line, once per session (the build test and the run test
    share it; a failed build fails both with the same message)."""
    results = {}

    def get(example: Path) -> Path:
        if example not in results:
            results[example] = AHEAD.result(("build", example), _build_or_error, example,
                                             tmp_path_factory.mktemp("examples") / example.stem)
        if isinstance(results[example], AssertionError):
            raise results[example]
        return results[example]

    return get


def test_there_are_examples():
    assert EXAMPLES, "no host-side examples in kernels/examples/"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_builds_with_its_documented_line(example, built):
    built(example)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_on_the_gpu(example, built, gpu):
    reason = _arch_skip_reason(example)
    if reason is not None:
        pytest.skip(reason)
    exe = built(example)
    res = AHEAD.result(("run", example), _run, exe)
    assert res.returncode == 0, f"{example.name} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    assert re.search(r"\bok\b", res.stdout), res.stdout
