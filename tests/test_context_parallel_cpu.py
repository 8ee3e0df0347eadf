"""Context-parallel attention on real processes (CPU, gloo): ring, zigzag and all-to-all, forward and backward, causal
and not, lengths that divide evenly and lengths that are padded, on 2, 3 and 4 ranks (8 under --full-grid), against
the single-process float64 reference; every bad input raises the same ValueError on every rank; a dead or silent
rank ends the call with a message instead of a hang.

One group of processes per world size runs every case (kernels.parallel.selfcheck.run_all); the tests read its
results. The local kernel is the float64 reference itself, so every error is rounding: <= 1e-12 of max |ref|."""

import subprocess
import sys
from pathlib import Path

import pytest
from ahead import Ahead

torch = pytest.importorskip("torch", reason="the multi-process CPU tests need torch (CPU build: pip install torch "
                                            "--index-url https://download.pytorch.org/whl/cpu)")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("this torch build has no torch.distributed with gloo", allow_module_level=True)

from kernels.parallel import context as C, schedule as S, selfcheck  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORLDS = [2, 3, 4, pytest.param(8, marks=pytest.mark.full_grid)]
_RUNS: dict = {}


def _run(world):
    if world not in _RUNS:
        _RUNS[world] = AHEAD.result(("world", world), selfcheck.spawn, world, "all", 60)
    return _RUNS[world]


def _selfcheck_command():
    return subprocess.run([sys.executable, "-m", "kernels.parallel.selfcheck", "--world", "2", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _benchmark_help():
    return subprocess.run([sys.executable, "-m", "kernels.bench.context_parallel", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _plan(item, tmp_path_factory):
    """The groups of processes start together (tests/ahead.py): each waits on its own processes, not on Python."""
    params = item.callspec.params if hasattr(item, "callspec") else {}
    if item.originalname in ("test_every_schedule_matches_the_float64_reference",
                             "test_bad_input_raises_the_same_error_on_every_rank"):
        yield ("world", params["world"]), selfcheck.spawn, (params["world"], "all", 60)
    elif item.originalname == "test_a_dead_or_silent_rank_ends_the_call_with_a_message":
        yield ("fault", params["job"]), selfcheck.spawn, (2, params["job"], 2)
    elif item.originalname == "test_selfcheck_command_prints_its_check":
        yield "command", _selfcheck_command, ()
    elif item.originalname == "test_benchmark_help_starts_nothing":
        yield "help", _benchmark_help, ()


AHEAD = Ahead(_plan)
start_ahead = AHEAD.fixture()


def _case_id(c):
    return f"{c['schedule']}-{'causal' if c['causal'] else 'full'}-T{c['T']}"


@pytest.mark.parametrize("world", WORLDS)
def test_every_schedule_matches_the_float64_reference(world):
    results = _run(world)
    assert sorted(r["rank"] for r in results) == list(range(world))
    got = [c for c in results[0]["cases"] if c is not None]
    expected = {_case_id(c) for c in selfcheck.cases(world)}
    assert expected <= {_case_id(c) for c in got}
    assert any(c["T"] % (2 * world) for c in got), "no case with padding"
    bad = {_case_id(c) + ("-autograd" if c.get("autograd") else ""): c["err"] for c in got if not c["ok"]}
    assert not bad, f"errors above {selfcheck.CPU_BOUND:g} of max |ref|: {bad}"
    assert any(c.get("after_errors") for c in got), "the group was not used again after the bad inputs"
    assert sum(bool(c.get("autograd")) for c in got) == len(C.SCHEDULES)
    assert sum(bool(c.get("solo")) for c in got) == len(C.SCHEDULES), "a group of one rank"


@pytest.mark.parametrize("name", list(selfcheck.bad_inputs(2)))
@pytest.mark.parametrize("world", [2, 3])
def test_bad_input_raises_the_same_error_on_every_rank(world, name):
    results = _run(world)
    seen = {tuple(r["bad"][name]) for r in results}
    assert len(seen) == 1, f"the ranks raised differently: {seen}"
    kind, message = seen.pop()
    assert kind == "ValueError", (kind, message)
    assert selfcheck.bad_inputs(world)[name][1] in message, message


@pytest.mark.parametrize("job, within_s", [("dead", 10), ("hung", 10)])
def test_a_dead_or_silent_rank_ends_the_call_with_a_message(job, within_s):
    """rank 1 exits (dead) or sleeps past the group's 2 s timeout (hung) instead of calling forward: rank 0 raises
    a RuntimeError that says so, within seconds."""
    results = {r["rank"]: r for r in AHEAD.result(("fault", job), selfcheck.spawn, 2, job, 2)}
    r0 = results[0]
    assert r0["raised"] == "RuntimeError", r0
    assert "a rank died or did not call" in r0["message"], r0["message"]
    assert r0["seconds"] < within_s, r0


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", S.LAYOUTS)
def test_the_schedule_covers_every_pair_once(world, layout, causal):
    """Over the N steps each rank sees every rank's chunks once; the calls cover exactly the pairs that are not
    skipped, each pair once, and the diagonal ones causally."""
    for rank in range(world):
        srcs = [S.source(rank, s, world) for s in range(world)]
        assert sorted(srcs) == list(range(world))
        for step in range(world):
            kinds = S.pairs(rank, step, world, layout, causal)
            covered = {}
            for c in S.calls(rank, step, world, layout, causal):
                for i in range(c.q0, c.q1):
                    for j in range(c.k0, c.k1):
                        assert (i, j) not in covered
                        covered[i, j] = "causal" if c.causal and i == j else "skip" if c.causal and j > i else "full"
            assert {p: k for p, k in covered.items() if k != "skip"} == {p: k for p, k in kinds.items() if k != "skip"}


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_zigzag_balances_causal_work_and_the_plain_ring_does_not(world):
    zig = S.work(world, "zigzag", True)
    ring = S.work(world, "contiguous", True)
    assert len({sum(w) for w in zig}) == 1, zig  # every rank the same total ...
    assert all(len(set(w[1:])) <= 1 for w in zig)  # ... and the same work at every step after the first
    assert [sum(w) for w in ring] == [r + 0.5 for r in range(world)]  # rank r: r full blocks and one diagonal
    assert sum(map(sum, zig)) / 4 == sum(map(sum, ring))  # the same FLOPs in all (zigzag counts in half-size chunks)


@pytest.mark.parametrize("T", [1, 5, 16, 37])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("schedule", C.SCHEDULES)
def test_shard_and_unshard_are_inverse(schedule, world, T):
    x = torch.arange(2 * T, dtype=torch.float64).reshape(1, 2, T, 1)
    parts = [C.shard(x, r, world, schedule) for r in range(world)]
    assert all(p.shape[2] == C.shard_len(T, world, schedule) for p in parts)
    assert torch.equal(C.unshard(parts, T, schedule), x)


def test_selfcheck_command_prints_its_check():
    res = AHEAD.result("command", _selfcheck_command)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.rstrip().endswith("all ok"), res.stdout


def test_benchmark_help_starts_nothing():
    res = AHEAD.result("help", _benchmark_help)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: python3 -m kernels.bench.context_parallel "), res.stdout[:200]


def test_benchmark_without_a_gpu_says_why():
    import kernels

    if kernels.gpu_unavailable_reason() is None:
        pytest.skip("a GPU is here: the benchmark would run")
    res = subprocess.run([sys.executable, "-m", "kernels.bench.context_parallel"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr and "needs" in res.stderr, res.stderr
