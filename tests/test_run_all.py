"""What notebooks/run_all.py keeps of a run: the builds each notebook's kernel logged, tagged with the first notebook
that used them, in results/builds.json (the next run compiles them in that order, beside the notebooks)."""

import json
import sys
from pathlib import Path

import pytest

from kernels.core import compile as C
from kernels.core import prebuild as P

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks"))
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
    monkeypatch.setenv(C.BUILD_LOG_ENV, "")  # restored after the test: record_builds sets os.environ itself
    for name in ("01_naive_cuda.ipynb", "06_fp16_tensor_cores.ipynb"):
        run_all.record_builds(tmp_path, Path(name))
        C._log_build(name[:2] + ".cu", (), (), None)  # what load_module does in that notebook's kernel
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01.jsonl", "06.jsonl"]
    assert json.loads((tmp_path / "06.jsonl").read_text())["file"] == "06.cu"


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


def test_each_notebook_waits_for_its_builds_then_runs_and_logs_them(tmp_path, builds_json, monkeypatch):
    import kernels

    events = []

    class Compiling:  # what prebuild.start returns, without processes
        def wait(self, notebook):
            events.append(("wait", notebook))
            return 0.0

        def close(self):
            events.append(("close",))

    def execute(path, out_dir):
        events.append(("execute", path.name[:2]))
        C._log_build("naive.cu" if path.name < "05" else "flash2_mma.cu", (), (), None)  # in the notebook's kernel
        return True, "1 s"

    monkeypatch.setenv(C.BUILD_LOG_ENV, "")
    monkeypatch.setattr(kernels, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(run_all, "skip_reason", lambda path: None)
    monkeypatch.setattr(run_all, "start_compile", Compiling)
    monkeypatch.setattr(run_all, "execute", execute)
    assert run_all.main(["01", "03", "06"]) == 0
    assert events == [("wait", "01"), ("execute", "01"), ("wait", "03"), ("execute", "03"), ("wait", "06"),
                      ("execute", "06"), ("close",)]
    assert P.read_builds(builds_json) == sorted([dict(NAIVE, notebook="01"), dict(MMA, notebook="06")],
                                                key=P.build_key)
