"""What notebooks/run_all.py keeps of a run: the builds each notebook's kernel logged, tagged with the first notebook
that used them, in results/builds.json (the next run compiles them in that order, beside the notebooks); the kernels it
starts ahead, and nbval's (notebooks/conftest.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.core import compile as C
from kernels.core import prebuild as P

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "notebooks"))
import run_all  # noqa: E402

NAIVE, SOFTMAX, MMA = C.build_record("naive.cu"), C.build_record("softmax.cu"), C.build_record("flash2_mma.cu")


@pytest.fixture
def builds_json(tmp_path, monkeypatch):
    monkeypatch.setattr(P, "DEFAULT_LIST", tmp_path / "builds.json")
    return P.DEFAULT_LIST


def _logs(tmp_path, **notebooks):
    """A run's log folder: one NN.jsonl per notebook, as the notebooks' kernels append to them."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    for notebook, records in notebooks.items():
        (log_dir / f"{notebook[1:]}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return log_dir


def test_each_notebook_logs_to_its_own_file(tmp_path, monkeypatch):
    for name in ("01_naive_cuda.ipynb", "06_fp16_tensor_cores.ipynb"):
        monkeypatch.setenv(C.BUILD_LOG_ENV, run_all.notebook_env(tmp_path, Path(name))[C.BUILD_LOG_ENV])
        C._log_build(name[:2] + ".cu", (), (), None)  # what load_module does in that notebook's kernel
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01.jsonl", "06.jsonl"]
    assert json.loads((tmp_path / "06.jsonl").read_text())["file"] == "06.cu"


def test_a_kernel_without_a_log_folder_logs_nothing(monkeypatch):
    """nbval's kernels (log_dir None) do not append to a test session's --record-builds log, which it inherits."""
    monkeypatch.setenv(C.BUILD_LOG_ENV, "/tmp/a-test-session-list.jsonl")
    assert C.BUILD_LOG_ENV not in run_all.notebook_env(None, Path("01_naive_cuda.ipynb"))


def test_a_full_run_tags_each_build_with_the_first_notebook_that_used_it(tmp_path, builds_json, capsys):
    P.write_builds(builds_json, [dict(NAIVE, notebook="01"), dict(MMA, notebook="06")])  # the run replaces these
    log_dir = _logs(tmp_path, n06=[MMA, SOFTMAX], n02=[SOFTMAX, SOFTMAX], n15=[MMA])
    run_all.keep_builds(log_dir, replace=True)
    assert P.read_builds(builds_json) == sorted([dict(SOFTMAX, notebook="02"), dict(MMA, notebook="06")],
                                                 key=P.build_key)
    assert not log_dir.exists()
    assert "kernel builds used: 2 " in capsys.readouterr().out


def test_a_partial_run_keeps_the_earliest_tag_of_each_build(tmp_path, builds_json, capsys):
    P.write_builds(builds_json, [dict(NAIVE, notebook="01"), dict(MMA, notebook="06"), SOFTMAX])
    run_all.keep_builds(_logs(tmp_path, n15=[MMA, SOFTMAX]), replace=False)
    assert P.read_builds(builds_json) == sorted([dict(NAIVE, notebook="01"), dict(MMA, notebook="06"),
                                                 dict(SOFTMAX, notebook="15")], key=P.build_key)
    assert "kernel builds used: 3 " in capsys.readouterr().out


def test_each_notebook_waits_for_its_builds_then_runs_on_a_kernel_started_ahead(tmp_path, builds_json, monkeypatch):
    import kernels

    events = []

    class Compiling:  # what prebuild.start returns, without processes
        def wait(self, notebook):
            events.append(("wait", notebook))
            return 0.0

        def close(self):
            events.append(("close",))

    def start_kernel(path, log_dir):  # a "kernel" is the environment it was started with
        events.append(("start", path.name[:2]))
        return run_all.notebook_env(log_dir, path)

    def execute(path, out_dir, kernel):
        events.append(("execute", path.name[:2]))
        monkeypatch.setenv(C.BUILD_LOG_ENV, kernel[C.BUILD_LOG_ENV])  # as in the notebook's kernel process
        C._log_build("naive.cu" if path.name < "05" else "flash2_mma.cu", (), (), None)
        return True, "1 s"

    monkeypatch.setattr(kernels, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(run_all, "skip_reason", lambda path: None)
    monkeypatch.setattr(run_all, "start_compile", Compiling)
    monkeypatch.setattr(run_all, "start_kernel", start_kernel)
    monkeypatch.setattr(run_all, "execute", execute)
    monkeypatch.setattr(run_all, "stop_kernel", lambda kernel: events.append(("stop", kernel[C.BUILD_LOG_ENV][-8:-6])))
    assert run_all.main(["01", "03", "06"]) == 0
    # each notebook's kernel starts while the notebook before it runs, and stops when its own notebook is done
    assert events == [("start", "01"), ("wait", "01"), ("start", "03"), ("execute", "01"), ("stop", "01"),
                      ("wait", "03"), ("start", "06"), ("execute", "03"), ("stop", "03"),
                      ("wait", "06"), ("execute", "06"), ("stop", "06"), ("close",)]
    assert P.read_builds(builds_json) == sorted([dict(NAIVE, notebook="01"), dict(MMA, notebook="06")],
                                                key=P.build_key)


def test_a_kernel_started_ahead_runs_the_notebook_with_counts_of_its_own(tmp_path):
    """A real kernel (no GPU needed): the warm-up imports leave no output and no execution count in the notebook."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import numpy\nprint(numpy.__name__)"),
                                         nbformat.v4.new_code_cell("1 + 1")])
    path = tmp_path / "nb" / "00_tiny.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    kernel = run_all.start_kernel(path, None, warm_up="import json\nprint(json.__name__)")  # not WARM_UP: seconds
    try:
        ok, msg = run_all.execute(path, tmp_path / "out", kernel)
    finally:
        run_all.stop_kernel(kernel)
    assert ok, msg
    done = nbformat.read(tmp_path / "out" / "00_tiny.ipynb", as_version=4)
    assert [c.execution_count for c in done.cells] == [1, 2]
    assert [o.get("text") for o in done.cells[0].outputs] == ["numpy\n"]
    assert done.cells[1].outputs[0]["data"]["text/plain"] == "2"


NBVAL_CONFTEST = """\\
import importlib.util

spec = importlib.util.spec_from_file_location("notebooks_conftest", {path!r})
notebooks_conftest = importlib.util.module_from_spec(spec)
spec.loader.exec_module(notebooks_conftest)
notebooks_conftest.KernelsAhead.warm_up = "import colorsys"  # a module no kernel imports by itself; not WARM_UP
pytest_collection_modifyitems = notebooks_conftest.pytest_collection_modifyitems
pytest_sessionfinish = notebooks_conftest.pytest_sessionfinish
"""


def test_nbval_runs_each_notebook_on_a_fresh_kernel_started_ahead(tmp_path):
    """notebooks/conftest.py under nbval (real kernels, no GPU needed): every notebook finds its kernel's warm-up
    done before its first cell, and no name left by the notebook before it; a skipped notebook in between is passed
    over."""
    import nbformat

    folder = tmp_path / "nb"
    folder.mkdir()
    (folder / "conftest.py").write_text(NBVAL_CONFTEST.format(path=str(ROOT / "notebooks" / "conftest.py")))
    first = "import sys\nassert 'colorsys' in sys.modules, 'the warm-up did not run first'"
    fresh = "assert 'seen' not in globals(), 'a kernel was used twice'\nseen = 1"
    for i, needs_gpu in enumerate((False, True, False, False)):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(first), nbformat.v4.new_code_cell(fresh)])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.metadata["course"] = {"needs_gpu": needs_gpu, "min_cc": [99, 0]}  # 01 is skipped on every machine
        nbformat.write(nb, folder / f"0{i}_tiny.ipynb")
    paths = [str(ROOT / "notebooks"), str(ROOT), os.environ.get("PYTHONPATH", "")]  # the last: where nbval may be
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--rootdir",
                          str(folder), str(folder)], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "6 passed, 2 skipped" in res.stdout, res.stdout[-3000:]
