"""Project hygiene that needs no GPU: notebooks stored executed, dependencies consistent, registry sane."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_notebooks_exist_in_order():
    names = [p.stem for p in NOTEBOOKS]
    assert names[:3] == ["00_cpu_reference", "01_naive_cuda", "02_softmax_kernels"], names
    numbers = [int(n[:2]) for n in names]
    assert numbers == list(range(len(numbers))), f"notebook numbers must run 00, 01, ... without gaps: {names}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_executed(path):
    nb = json.loads(path.read_text())
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", "nbval starts the kernel by this name"
    assert "needs_gpu" in nb["metadata"].get("course", {}), "metadata.course.needs_gpu tells CI what it can run"
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    assert code, "a notebook without code"
    unrun = [i for i, c in enumerate(code) if c.get("execution_count") is None]
    assert not unrun, f"code cells {unrun} were never executed: nbval compares stored outputs"
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), f"cells were not run top to bottom in one kernel: {counts}"
    errors = [o.get("ename") for c in code for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors, f"stored error outputs: {errors}"


KERNEL_FILES = sorted(p for p in (ROOT / "kernels").rglob("*.cu") if p.parent.name != "examples")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_kernel_files_exist(path):
    names = {p.name for p in (ROOT / "kernels").rglob("*.cu*")}
    text = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
    for name in re.findall(r"[\"']([A-Za-z0-9_]+\.cuh?)[\"']", text):
        assert name in names, f"{path.name} loads the kernel file {name}, which does not exist below kernels/"


# Kernel files that no notebook shows yet, each with the reason: a kernel waiting for its first GPU verification
# before a chapter teaches it. The exemption must go once a notebook shows the file.
NOT_YET_TAUGHT: dict[str, str] = {}


def test_every_kernel_is_taught():
    text = " ".join(p.read_text() for p in NOTEBOOKS)
    for cu in KERNEL_FILES:
        if cu.name in NOT_YET_TAUGHT:
            assert cu.name not in text, f"{cu.name} is shown in a notebook now: remove it from NOT_YET_TAUGHT"
            continue
        assert cu.name in text, f"{cu.relative_to(ROOT)} is not shown in any notebook"
    assert set(NOT_YET_TAUGHT) <= {cu.name for cu in KERNEL_FILES}, "NOT_YET_TAUGHT names a file that does not exist"


def test_registry_variants_point_at_notebooks():
    import kernels

    assert kernels.REGISTRY, "no attention variant is registered"
    stems = {p.stem for p in NOTEBOOKS}
    for v in kernels.tested_variants().values():
        assert v.notebook in stems, f"variant {v.name} names notebook {v.notebook}, which does not exist"
        assert v.dtypes and v.max_d >= 16


def test_every_launcher_module_is_imported_and_registered():
    """Each kernel file kernels/<folder>/NAME.cu is claimed by one launcher of its folder (KERNEL_FILE = "NAME.cu", or
    NAME.cu in KERNEL_FILES), the folder's __init__.py imports that launcher (so its variants exist whenever the
    package is imported), and a launcher with a forward() registers at least one variant."""
    import kernels

    for cu in KERNEL_FILES:
        folder = cu.parent.relative_to(ROOT / "kernels").as_posix().replace("/", ".")
        claimed = [name for name, module in sys.modules.items()
                   if name.startswith(f"kernels.{folder}.") and (getattr(module, "KERNEL_FILE", None) == cu.name
                                                                or cu.name in getattr(module, "KERNEL_FILES", ()))]
        assert len(claimed) == 1, f"{cu.relative_to(ROOT)} must be claimed by one imported launcher of its folder " \
                                  f"(KERNEL_FILE or KERNEL_FILES); found {claimed}"
    for v in kernels.tested_variants().values():
        assert v.module in sys.modules and v.forward.__module__ == v.module, \
            f"variant {v.name} says module={v.module!r}; its forward lives in {v.forward.__module__}"
    for name, module in list(sys.modules.items()):
        if name.startswith("kernels.") and callable(getattr(module, "forward", None)) and \
                getattr(module, "KERNEL_FILE", None):
            assert any(v.module == name for v in kernels.tested_variants().values()), \
                f"{name} has a forward() but registers no variant (register(Variant(name, forward, ...)))"


def test_the_repository_stands_alone():
    """No tracked file points a reader at files outside the clone, or calls the GPU a borrowed one."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    pattern = re.compile(r"GUIDE\.md|\.\./shared|\blent\b", re.I)
    bad = []
    for f in files:
        path = ROOT / f
        if path.suffix in (".png", ".whl") or not path.is_file():
            continue
        text = path.read_text(errors="ignore")
        bad += [f"{f}: {m.group(0)!r}" for m in pattern.finditer(text)]
    assert not bad, "files that cite something outside the repository: " + "; ".join(bad[:10])


def _pip_names(path):
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            names.add(re.split(r"[<>=!~\[; ]", line)[0].lower())
    return names


# conda-forge name -> PyPI name, where they differ
CONDA_TO_PIP = {"pytorch-gpu": "torch", "pytorch": "torch", "cupy": "cupy-cuda13x"}
CONDA_ONLY = {"python", "pip", "cuda-version"}


def test_environment_yml_matches_requirements():
    yaml = pytest.importorskip("yaml")
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = set()
    for dep in env["dependencies"]:
        if isinstance(dep, str):
            name = re.split(r"[<>=! ]", dep)[0].lower()
            if name not in CONDA_ONLY:
                conda.add(CONDA_TO_PIP.get(name, name))
    pip = _pip_names(ROOT / "requirements.txt")
    assert conda == pip, f"only in environment.yml: {sorted(conda - pip)}; only in requirements.txt: {sorted(pip - conda)}"


def test_test_requirements_cover_the_test_imports():
    names = _pip_names(ROOT / "requirements-test.txt")
    for needed in ("numpy", "pytest", "nbval", "nbclient", "ipykernel", "matplotlib", "cuda-bindings", "nvidia-cuda-nvrtc"):
        assert needed in names, f"requirements-test.txt lacks {needed}"


def test_readme_states_the_test_command_that_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"<!-- test-command -->\s*```(?:bash|sh)?\n(.+?)\n```", readme, re.S)
    assert m, "README.md must show the test command in a block after <!-- test-command -->"
    command = m.group(1).strip()
    assert command in ci, f".ci/run does not run the README's test command: {command!r}"


def test_cuda12_requirements_differ_only_in_the_cuda_builds():
    main = _pip_names(ROOT / "requirements.txt")
    cuda12 = _pip_names(ROOT / "requirements-cuda12.txt")
    assert main - {"cupy-cuda13x"} == cuda12 - {"cupy-cuda12x"}, (sorted(main), sorted(cuda12))


def test_constraints_pin_only_what_the_course_installs():
    pinned = _pip_names(ROOT / "constraints.txt")
    known = _pip_names(ROOT / "requirements.txt") | _pip_names(ROOT / "requirements-test.txt") | {
        "nbformat", "nbconvert", "jupyter_client", "jupyter_core"}  # what nbval and nbclient bring
    assert pinned <= known, f"constraints.txt pins packages the course does not install: {sorted(pinned - known)}"
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        assert not line or "==" in line, f"constraints.txt must pin exact versions: {line!r}"
