"""Which GPUs run which chapter: each GPU notebook states its minimum compute capability in its first cell and in its
metadata (course.min_cc), and run_all and nbval skip it, with that reason, on an older GPU."""

import json
import sys
from pathlib import Path

import pytest

import kernels

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "notebooks"))
import run_all  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def course(path):
    return json.loads(path.read_text())["metadata"].get("course", {})


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_first_cell_states_the_capability_the_metadata_holds(path):
    meta = course(path)
    first = "".join(json.loads(path.read_text())["cells"][0]["source"])
    if not meta.get("needs_gpu", True):  # 00 runs anywhere; 14's CPU part too, its GPU cells skip below 2 GPUs
        assert "No GPU" in first or "GPU sections need" in first
        return
    major, minor = meta["min_cc"]
    assert f"compute capability {major}.{minor}" in first, f"{path.name}: first cell must state {major}.{minor}"


def test_chapters_one_to_five_run_on_a_t4():
    for path in NOTEBOOKS:
        n = int(path.stem[:2])
        if 1 <= n <= 5:
            assert tuple(course(path)["min_cc"]) == (7, 5), path.name


ALL = {p.stem[:2] for p in NOTEBOOKS}
CPU = {p.stem[:2] for p in NOTEBOOKS if not course(p).get("needs_gpu", True)}


@pytest.fixture(autouse=True)
def torch_found(monkeypatch):
    monkeypatch.setattr(run_all.importlib.util, "find_spec", lambda name: object())


@pytest.mark.parametrize("cc, runs", [((7, 5), CPU | {"01", "02", "03", "04", "05"}), ((8, 6), ALL - {"13", "16"}),
                                      ((9, 0), ALL)])
def test_skip_reason_follows_the_gpu(monkeypatch, cc, runs):
    monkeypatch.setattr(kernels, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(kernels, "device_compute_capability", lambda: cc)
    monkeypatch.setattr(kernels, "gpu_name", lambda: "a test GPU")
    ran = set()
    for path in NOTEBOOKS:
        why = run_all.skip_reason(path)
        if why is None:
            ran.add(path.stem[:2])
        else:
            assert f"has {cc[0]}.{cc[1]}" in why and "compute capability" in why
    assert ran == runs


def test_skip_reason_without_a_gpu(monkeypatch):
    monkeypatch.setattr(kernels, "gpu_unavailable_reason", lambda: "no driver here")
    reasons = {p.stem[:2]: run_all.skip_reason(p) for p in NOTEBOOKS}
    assert CPU >= {"00"} and all(reasons.pop(n) is None for n in CPU)
    assert all(r == "notebook needs a CUDA GPU: no driver here" for r in reasons.values())


def test_a_notebook_that_needs_torch_says_so_without_it(monkeypatch):
    monkeypatch.setattr(run_all.importlib.util, "find_spec", lambda name: None)
    for path in NOTEBOOKS:
        if course(path).get("needs_torch"):
            assert "needs PyTorch" in run_all.skip_reason(path)
