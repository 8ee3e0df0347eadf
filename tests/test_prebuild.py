"""The list of kernel builds that run_all and the test session compile in parallel first (kernels/core/prebuild.py):
how it is recorded, read and written, and that the committed list names kernel files that exist."""

import json
import multiprocessing.dummy
import threading

import pytest

from kernels.core import compile as C
from kernels.core import prebuild as P

NOTEBOOKS = {p.name[:2] for p in (P.ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}


def test_load_module_records_each_build_where_asked(tmp_path, monkeypatch):
    log = tmp_path / "builds.jsonl"
    monkeypatch.setenv(C.BUILD_LOG_ENV, str(log))
    C._log_build("flash2_mma.cu", ("k<64>",), ("-DX=1",), None)
    C._log_build("hopper_attn.cu", (), (), "sm_90a")
    lines = [json.loads(s) for s in log.read_text().splitlines()]
    assert lines == [C.build_record("flash2_mma.cu", ("k<64>",), ("-DX=1",)),
                     {"file": "hopper_attn.cu", "names": [], "defines": [], "arch": "sm_90a"}]
    monkeypatch.delenv(C.BUILD_LOG_ENV)
    C._log_build("naive.cu", (), (), None)  # no variable: nothing written
    assert len(log.read_text().splitlines()) == 2


def test_machine_paths_stay_out_of_the_records(monkeypatch):
    monkeypatch.setattr(C, "cuda_header_options", lambda: ("-I/this/machine/include",))
    record = C.build_record("flash2_wmma.cu", ("f<1>",), ("-DPAD16=8", "-I/this/machine/include"))
    assert record["defines"] == ["-DPAD16=8", C.CUDA_HEADERS]
    assert C.build_arguments(record) == ("flash2_wmma.cu", ("f<1>",), ("-DPAD16=8", "-I/this/machine/include"), None)


def test_lists_round_trip_without_repeats(tmp_path):
    a, b = C.build_record("softmax.cu"), C.build_record("flash2.cu", ("f<1>",), ("-DB=2",))
    raw = tmp_path / "log.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in (a, b, a)))
    records = P.read_builds(raw)
    assert sorted(map(json.dumps, records)) == sorted(map(json.dumps, (a, b)))
    out = tmp_path / "builds.json"
    P.write_builds(out, records + [b])
    assert json.loads(out.read_text()) == P.read_builds(out) and len(P.read_builds(out)) == 2


def test_a_build_tagged_by_several_notebooks_is_one_build_with_the_earliest_tag(tmp_path):
    build = C.build_record("flash2_mma.cu", ("k<64>",), ("-DX=1",))
    other = C.build_record("naive.cu")
    records = [dict(build, notebook="15"), build, dict(build, notebook="06"), dict(other, notebook="01"), other]
    kept = sorted([dict(build, notebook="06"), dict(other, notebook="01")], key=P.build_key)
    assert P.read_builds(_lines(tmp_path / "log.jsonl", records)) == kept
    out = tmp_path / "builds.json"
    P.write_builds(out, records)
    assert P.read_builds(out) == kept
    assert P.distinct_builds([build, build]) == [build]  # untagged (the tests' list) stays untagged


def test_both_lists_compile_a_build_they_share_once(tmp_path, monkeypatch):
    shared, ours = C.build_record("softmax.cu"), C.build_record("varlen.cu")
    monkeypatch.setattr(P, "DEFAULT_LIST", tmp_path / "builds.json")
    monkeypatch.setattr(P, "TEST_LIST", tmp_path / "test-builds.json")
    P.write_builds(P.DEFAULT_LIST, [dict(shared, notebook="02"), dict(ours, notebook="09")])
    P.write_builds(P.TEST_LIST, [shared])
    assert P.course_builds() == sorted([dict(shared, notebook="02"), dict(ours, notebook="09")], key=P.build_key)


def test_build_arguments_ignore_the_notebook_tag():
    record = C.build_record("flash2.cu", ("f<1>",), ("-DB=2",))
    assert C.build_arguments(dict(record, notebook="04")) == C.build_arguments(record)


def _lines(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("name", ["builds.json", "test-builds.json"])
def test_committed_lists_name_existing_files(name):
    path = {"builds.json": P.DEFAULT_LIST, "test-builds.json": P.TEST_LIST}[name]
    if not path.is_file():
        pytest.skip(f"no results/{name} yet (run_all.py and pytest --record-builds write them on a GPU)")
    records = P.read_builds(path)
    assert records, f"results/{name} is empty"
    for r in records:
        C.kernel_path(r["file"])  # raises for a file that was renamed or removed
        assert all(d.startswith("-D") or d == C.CUDA_HEADERS for d in r["defines"]), r  # no machine paths
        assert r["arch"] in (None, "sm_90a"), r
        if name == "builds.json":  # the first notebook that used it (run_all's logs); the tests' list has no tags
            assert r["notebook"] in NOTEBOOKS, r
        else:
            assert "notebook" not in r, r


def test_prebuild_needs_a_gpu_and_says_so(monkeypatch):
    import kernels.core.device as D

    monkeypatch.setattr(D, "gpu_unavailable_reason", lambda: "no GPU here")
    with pytest.raises(SystemExit, match=r"prebuild needs a CUDA GPU .*: no GPU here"):
        P.prebuild([C.build_record("naive.cu")])


def _on_an_h100(monkeypatch):
    import kernels.core.device as D

    monkeypatch.setattr(D, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(D, "device_compute_capability", lambda: (9, 0))


def test_each_notebook_waits_for_its_own_and_earlier_builds_only(monkeypatch):
    _on_an_h100(monkeypatch)
    tagged = {"a.cu": "01", "b.cu": "06", "c.cu": "06", "d.cu": "13", "tests.cu": None}
    records = [dict(C.build_record(f), **({"notebook": n} if n else {})) for f, n in reversed(tagged.items())]
    release = {f: threading.Event() for f in tagged}
    started, done = [], []

    def build(record):  # one thread (jobs=1): the builds start in the order the compile hands them out
        started.append(record["file"])
        release[record["file"]].wait(5)
        done.append(record["file"])
        return record["file"], None

    compiling = P.start(records, jobs=1, log=print, build=build, context=multiprocessing.dummy)
    release["a.cu"].set()
    compiling.wait("01")
    assert done == ["a.cu"]
    waiting = threading.Thread(target=compiling.wait, args=("06",))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive(), "wait('06') returned before notebook 06's builds were done"
    release["b.cu"].set(), release["c.cu"].set()
    waiting.join(5)
    assert not waiting.is_alive() and sorted(done) == ["a.cu", "b.cu", "c.cu"]  # d.cu (notebook 13) not waited for
    for f in ("d.cu", "tests.cu"):
        release[f].set()
    assert compiling.close()["built"] == 5
    assert [tagged[f] for f in started] == ["01", "06", "06", "13", None]  # the untagged (the tests') last


def test_the_background_compile_ends_with_prebuilds_line(monkeypatch):
    _on_an_h100(monkeypatch)
    records = [dict(C.build_record("naive.cu"), notebook="01"), C.build_record("softmax.cu"),
               C.build_record("hopper_gemm.cu", arch="sm_100a")]  # for another GPU: skipped, not compiled
    lines = []

    def build(record):
        assert record["arch"] is None
        return record["file"], "CompileError: no" if record["file"] == "softmax.cu" else None

    compiling = P.start(records, jobs=4, log=lines.append, build=build, context=multiprocessing.dummy)
    assert compiling.wait("99") >= 0
    result = compiling.close()
    assert (result["built"], result["skipped"]) == (1, 2)
    assert lines[0].startswith("prebuild: 1 kernel builds compiled or found in the cache, on 2 processes, in ")
    assert lines[0].endswith("; 2 skipped (not for this GPU)") and lines[1] == "  skipped softmax.cu: CompileError: no"


def test_a_compile_that_breaks_says_so_instead_of_hanging(monkeypatch):
    _on_an_h100(monkeypatch)

    def build(record):
        raise MemoryError("worker gone")

    compiling = P.start([dict(C.build_record("naive.cu"), notebook="01")], build=build, context=multiprocessing.dummy)
    with pytest.raises(RuntimeError, match="parallel compile stopped: MemoryError"):
        compiling.wait("01")
