"""The default GPU test grid keeps every class of case the exhaustive one has (a CPU test).

`pytest` runs a covering part of each GPU grid and `pytest --full-grid` all of it (conftest.py, the `full_grid`
marker). This collects the GPU grids both ways in a subprocess (no GPU needed: only the collection) and checks that
the default still has, for every kernel and dtype, the classes of case the grids exist for: ragged lengths, Tq != Tk
both ways, rows that see no key, large magnitudes, every head size, every schedule and build a launcher ships; and
that --full-grid collects strictly more. Moving a case to the full grid fails here when it was the last of its class.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from ahead import Ahead

import kernels

ROOT = Path(__file__).resolve().parents[1]
FILES = ["tests/test_attention_gpu.py", "tests/test_hopper_attn_gpu.py", "tests/test_decode_gpu.py",
         "tests/test_sampling_gpu.py", "tests/test_compile.py", "tests/test_flash2_triton_gpu.py",
         "tests/test_torch_ops_gpu.py"]
TORCH_FILE = "tests/test_torch_ops_gpu.py"  # collects nothing where PyTorch is not installed (importorskip)

# Collects FILES with pytest and writes [node id, the case's parameters] of each collected item as JSON.
COLLECT = r"""
import json, sys
import pytest

class Dump:
    items = []

    def pytest_collection_finish(self, session):
        for item in session.items:
            spec = getattr(item, "callspec", None)
            self.items.append([item.nodeid, dict(spec.params) if spec else {}])

code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[2:]], plugins=[Dump()])
with open(sys.argv[1], "w") as f:
    json.dump(Dump.items, f, default=str)
sys.exit(code)
"""


def _collect(full: bool):
    """[node id, params] of every item the GPU files collect, by default or with --full-grid. --no-prebuild: the
    collection compiles nothing (this session's own start has compiled the builds)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "items.json"
        args = [sys.executable, "-c", COLLECT, str(out), "--no-prebuild", *FILES] + (["--full-grid"] if full else [])
        res = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return json.loads(out.read_text())


def _plan(item, tmp_path_factory):
    """Both collections start with the session's other work (tests/ahead.py), each a subprocess of its own."""
    if "grids" in item.fixturenames:
        yield from ((full, _collect, (full,)) for full in (False, True))


AHEAD = Ahead(_plan)
start_ahead = AHEAD.fixture()


@pytest.fixture(scope="module")
def grids():
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # where nothing started them (xdist): both at once here
        default, full = (pool.submit(AHEAD.result, full, _collect, full) for full in (False, True))
        return {"default": default.result(), "full": full.result()}


def _skip_without_torch(grids):
    if not any(nodeid.startswith(TORCH_FILE) for nodeid, _ in grids["full"]):
        pytest.skip(f"{TORCH_FILE} collected nothing (PyTorch is not installed)")


def cases(items, test):
    """The parameters of the collected cases of `test` ("file.py::function")."""
    return [params for nodeid, params in items if nodeid.split("[")[0].endswith(test)]


def test_full_grid_collects_strictly_more(grids):
    default = {nodeid for nodeid, _ in grids["default"]}
    full = {nodeid for nodeid, _ in grids["full"]}
    assert default < full, "--full-grid must collect every default case and more"
    torch = any(nodeid.startswith(TORCH_FILE) for nodeid in full)
    for f in FILES:
        if f == TORCH_FILE and not torch:
            continue  # skipped as a whole module where PyTorch is not installed
        assert {n for n in full if n.startswith(f)} > {n for n in default if n.startswith(f)}, f


def test_attention_grid_keeps_every_class(grids):
    from test_attention_gpu import D_VALUES

    grid = cases(grids["default"], "test_attention_gpu.py::test_variant_matches_reference")
    for name, v in kernels.tested_variants().items():
        for dtype in v.dtypes:
            mine = [c for c in grid if c["name"] == name and c["dtype"] == dtype]
            where = f"{name} {dtype}"
            assert any(c["Tq"] == c["Tk"] > 1 and c["Tq"] % 16 for c in mine), f"{where}: no ragged T"
            assert any(c["Tq"] > c["Tk"] and c["causal"] for c in mine), f"{where}: no Tq > Tk causal (rows see no key)"
            assert any(c["Tq"] < c["Tk"] and c["causal"] for c in mine), f"{where}: no Tq < Tk causal"
            assert any(c["Tq"] < c["Tk"] and not c["causal"] for c in mine), f"{where}: no Tq < Tk without the mask"
            assert any(c["Tq"] == 1 for c in mine), f"{where}: no single query row"
            for causal in (False, True):
                assert any(c["mag"] >= 10 and c["causal"] == causal for c in mine), \
                    f"{where}: no large-magnitude case with causal={causal}"
            for d in D_VALUES:
                if v.accepts_d(d):
                    assert {c["causal"] for c in mine if c["d"] == d} == {False, True}, \
                        f"{where}: head size {d} is not run both causal and not"


def test_hopper_grid_keeps_every_schedule_and_build(grids):
    from kernels.hopper import hopper_attn as A

    def tiles_of(case):
        B, H, Tq, Tk, d, causal, dtype, scale = case
        return d, tuple(A.default_tiles(d, causal, Tq))

    grid = grids["default"]
    sched = cases(grid, "test_schedule_matches_reference")
    for schedule in A.SCHEDULES:
        mine = [c["case"] for c in sched if tuple(c["schedule"]) == schedule]
        consumers = {tiles_of(c)[1][0] // 64 for c in mine}
        assert consumers == {2, 3}, f"schedule {schedule}: consumer warpgroups {consumers}, want 2 and 3"
        assert {c[5] for c in mine} == {False, True}, f"schedule {schedule}: not run causal and not"
        assert {c[4] for c in mine} >= {64}, f"schedule {schedule}: no d = 64"
    default_schedule = [c["case"] for c in sched if tuple(c["schedule"]) == (True, True)]
    assert {tiles_of(c) for c in default_schedule} == {(d, tuple(A.default_tiles(d, causal, Tq)))
                                                       for d in A.HEAD_DIMS for causal in (False, True)
                                                       for Tq in (1, A.SHORT_CAUSAL_TQ + 1)}, \
        "the default schedule must run every default tiling"
    assert any(c[5] and c[2] > c[3] for c in default_schedule), "no Tq > Tk causal case (rows that see no key)"
    eager = {tiles_of(c["case"]) for c in cases(grid, "test_without_lazy_rescaling_matches_reference")}
    assert eager == {tiles_of(c) for c in default_schedule}, "the build without lazy rescaling misses a tiling"
    climbing = cases(grid, "test_climbing_row_maxima")
    assert {c["lazy"] for c in climbing} == {True, False}
    launches = {c["persistent"] for c in cases(grid, "test_persistent_and_grid_launches_match_reference")}
    assert launches == {True, False, "dynamic"}
    defaults = {A.default_launch(c[4], c[5]) for c in default_schedule}
    assert defaults == {True, False, "dynamic"}, f"the default schedule runs the default launches {defaults}"
    other = {tuple(c["tiles"]) for c in cases(grid, "test_other_tilings_match_reference")}
    block_ns = {t[1] for t in other} | {t[1] for _, t in (tiles_of(c) for c in default_schedule)}
    assert block_ns == set(A.BLOCK_NS), f"key-tile widths {block_ns} of {A.BLOCK_NS}"


def test_decode_grid_keeps_every_build_base_page_and_split(grids):
    from test_decode_gpu import BASES, PAGE_CYCLE, SPLIT_CYCLE

    grid = grids["default"]
    decode = cases(grid, "test_decode_matches_reference")
    for name, var in kernels.DECODE_REGISTRY.items():
        mine = [c for c in decode if c["name"] == name]
        assert {(c["dtype"], c["d"]) for c in mine} == {(dt, d) for dt in var.dtypes for d in var.head_dims}, name
        assert {c["bi"] for c in mine} == set(range(len(BASES))), f"{name}: a base shape is missing"
        if var.paged:
            assert {c["page"] for c in mine} == set(PAGE_CYCLE), f"{name}: a page size is missing"
        if var.splits:
            assert {c["splits"] for c in mine} == set(SPLIT_CYCLE), f"{name}: a split count is missing"
        if name == "decode_ft":
            assert {c["ft_layout"] for c in mine} == {False, True}
    counts = cases(grid, "test_split_counts_agree")
    full_counts = cases(grids["full"], "test_split_counts_agree")
    assert {(c["name"], c["splits"]) for c in counts} == {(c["name"], c["splits"]) for c in full_counts}
    merge = cases(grid, "test_mma_merge_paths")
    for d in (64, 128):
        at_d = [c for c in merge if c["d"] == d]
        assert {c["splits"] for c in at_d} >= {16, 17}, f"d={d}: the split limit is not met from both sides"
    over = {(c["G"] * c["Tq"] * 128 // 4 > 128, c["splits"] > 16) for c in merge if c["d"] == 128}
    assert over == {(a, b) for a in (False, True) for b in (False, True)}, "d=128: a side of the two merge limits"


def test_sampling_grid_keeps_every_path_and_kind(grids):
    from kernels.sampling import sampling as SM

    grid = grids["default"]
    probs = [c["case"] for c in cases(grid, "test_probs_and_tokens_match_reference")]
    largest = max(c[0] for c in cases(grids["full"], "test_probs_and_tokens_match_reference") for c in [c["case"]])
    for method in ("threshold", "one-block"):
        mine = [c for c in probs if c[7] == method]
        for kind in ("normal", "ties", "equal", "neg_inf"):
            assert any(c[3] == kind and c[5] == 0 and c[6] < 1 for c in mine), f"{method}: no top-p on {kind}"
            assert any(c[3] == kind and 0 < c[5] < c[0] for c in mine), f"{method}: no top-k on {kind}"
        assert any(c[5] == 0 and c[6] == 1 for c in mine), f"{method}: no plain sampling"
        assert any(c[5] == 1 for c in mine), f"{method}: no k = 1"
        assert any(c[0] == 1 for c in mine), f"{method}: no V = 1"
        assert any(c[0] == largest for c in mine), f"{method}: not the largest vocabulary"
        assert any(c[1] >= 64 for c in mine), f"{method}: no batch of 64 rows"
    lists = [c for c in probs if c[7] == "lists"]
    assert {c[3] for c in lists} == {"normal", "ties", "equal", "neg_inf"}, "lists: a kind of logits is missing"
    assert {SM.list_build(c[5]) for c in lists} == set(SM.LIST_BUILDS), "lists: a list build is missing"
    assert {c["cs"] for c in cases(grid, "test_every_cluster_size")} == set(SM.CLUSTER_SIZES)
    assert len(cases(grid, "test_histogram_bracket_fall_back")) == len(
        cases(grids["full"], "test_histogram_bracket_fall_back")), "both bracket misses, every kernel"


def test_compile_grid_keeps_sm90_and_sm80(grids):
    from test_compile import CU_FILES, header_build

    grid = grids["default"]
    nvrtc = {(Path(c["cu"]).name, c["arch"]) for c in cases(grid, "test_nvrtc_compiles_standalone")}
    headers_nvcc = {Path(c["cu"]).name for c in cases(grid, "test_header_nvcc_line_builds_every_kernel")}
    headers_nvrtc = {Path(c["cu"]).name for c in cases(grid, "test_header_nvrtc_build_holds_every_kernel")}
    for cu in CU_FILES:
        assert (cu.name, "sm_90") in nvrtc, f"{cu.name}: NVRTC sm_90 must stay in the default grid"
        assert cu.name in headers_nvcc and cu.name in headers_nvrtc, f"{cu.name}: the header's builds"
        header_sm80 = "--gpu-architecture=sm_80" in header_build(cu)[1]
        assert header_sm80 or (cu.name, "sm_80") in nvrtc, f"{cu.name}: nothing builds it for sm_80 by default"


def test_triton_gradients_keep_every_build(grids):
    from kernels.pytorch import flash2_triton as F

    triton = cases(grids["default"], "test_flash2_triton_gpu.py::test_gradients_match_reference")
    assert {(c["d"], c["dtype"], c["causal"]) for c in triton} == {
        (d, dt, causal) for d in F.HEAD_DIMS for dt in F.DTYPES for causal in (False, True)}
    for dtype in F.DTYPES:
        assert any(c["dtype"] == dtype and c["causal"] and c["Tq"] > c["Tk"] for c in triton), \
            f"triton {dtype}: no rows that see no key"


def test_backward_kernel_keeps_every_build(grids):
    from kernels.flash import flash2_mma_bwd

    _skip_without_torch(grids)

    bwd = cases(grids["default"], "test_backward_kernel_matches_reference")
    missing = {(D, dt) for D in flash2_mma_bwd.HEAD_DIMS for dt in flash2_mma_bwd.DTYPES} - {
        (flash2_mma_bwd.BUILD_FOR[c["d"]], c["dtype"]) for c in bwd}
    assert not missing, f"flash2_mma_bwd builds (D, dtype) without a default case: {sorted(missing)}"


def test_operator_forward_keeps_every_kernel_build(grids):
    """The attention operator's forward through each kernel forward_kernel picks: every (kernel, d, dtype) and rows
    that see no key in each dtype, by default (d: those forward_kernel may give to hopper_attn)."""
    from kernels.hopper import hopper_attn

    _skip_without_torch(grids)
    from kernels.pytorch.torch_ops import HOPPER_FWD_MIN_T

    fwd = cases(grids["default"], "test_attention_op_forward_through_each_kernel")
    kernels_ = ("flash2_mma", "hopper_attn")
    dims = sorted({d for d, _ in HOPPER_FWD_MIN_T})
    missing = {(kn, d, dt) for kn in kernels_ for d in dims for dt in hopper_attn.DTYPES} - {
        (c["kernel"], c["d"], c["dtype"]) for c in fwd}
    assert not missing, f"operator forward (kernel, d, dtype) without a default case: {sorted(missing)}"
    for kn in kernels_:
        for dt in hopper_attn.DTYPES:
            assert any(c["kernel"] == kn and c["dtype"] == dt and c["causal"] and c["Tq"] > c["Tk"] for c in fwd), \
                f"operator forward {kn} {dt}: no rows that see no key"
