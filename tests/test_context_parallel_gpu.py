"""Context-parallel attention on 2 or more GPUs (NCCL): every schedule (ring, zigzag, all-to-all), forward and backward,
causal and not, a length that divides and one that is padded, float16 and bfloat16, with the course's kernels as the
local attention, against the float64 reference and against the same kernels on one GPU over the whole sequence
(kernels.check's tolerance for the dtype). Runs `python3 -m torch.distributed.run -m kernels.parallel.selfcheck
--backend cuda` in a subprocess, one process per GPU; skipped below 2 GPUs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    n = _gpus()
    if n < 2:
        pytest.skip(f"needs at least 2 CUDA GPUs and torch with CUDA; found {n}")
    out = tmp_path_factory.mktemp("cp") / "selfcheck.json"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={n}", "-m",
                          "kernels.parallel.selfcheck", "--backend", "cuda", "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    return json.loads(out.read_text())


def test_every_case_ran(results):
    schedules = {r["schedule"] for r in results}
    assert schedules == {"ring", "zigzag", "alltoall"}
    assert {r["dtype"] for r in results} == {"float16", "bfloat16"}
    assert {r["causal"] for r in results} == {False, True}
    assert any(r["T"] % (2 * r["world"]) for r in results), "no padded length"


@pytest.mark.parametrize("what", ["check", "one_gpu"])
def test_within_the_dtype_tolerance(results, what):
    bad = [(r["dtype"], r["schedule"], r["causal"], r["T"], n, c["rel_l2"], c["max_rel"])
           for r in results for n, c in r[what].items() if not c["ok"]]
    assert not bad, bad
