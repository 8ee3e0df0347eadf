"""The benchmark entry points on a machine without a GPU (CPU): --help explains and starts nothing; a run says why it
cannot start and exits with status 2, without a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest
from ahead import Ahead

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["kernels.bench", "kernels.bench.decode", "kernels.bench.varlen", "kernels.bench.sampling",
            "kernels.bench.triton", "kernels.bench.torch_ops", "kernels.bench.variants", "kernels.bench.ncu"]


def run(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def _plan(item, tmp_path_factory):
    """Every command's subprocess starts with the session's other work (tests/ahead.py)."""
    import kernels

    if not hasattr(item, "callspec"):  # a test of no command
        return
    module = item.callspec.params["module"]
    if item.originalname == "test_help_starts_nothing":
        yield (module, "--help"), run, (module, "--help")
    elif item.originalname == "test_without_a_gpu_a_run_says_why" and kernels.gpu_unavailable_reason() is not None:
        yield (module,), run, (module,)


AHEAD = Ahead(_plan)
start_ahead = AHEAD.fixture()


@pytest.mark.parametrize("module", COMMANDS)
def test_help_starts_nothing(module):
    res = AHEAD.result((module, "--help"), run, module, "--help")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: python3 -m {module} "), res.stdout[:200]


@pytest.mark.parametrize("module", COMMANDS)
def test_without_a_gpu_a_run_says_why(module):
    import kernels

    if kernels.gpu_unavailable_reason() is None:
        pytest.skip("a GPU is here: the benchmark would run")
    res = AHEAD.result((module,), run, module)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "needs" in (res.stdout + res.stderr), res.stderr


def test_ncu_backward_profile_groups_the_kernels_by_side_and_head_dim():
    """kernels.bench.ncu --hopper-backward: the kernels of the NVTX range, in launch order, ours then cuDNN's per d;
    another order is an error that lists the kernels."""
    from kernels.bench.ncu import backward_sides

    ours = ["hopper_bwd_preprocess_f16", "hopper_bwd_f16_d64", "hopper_bwd_postprocess_f16"]
    cudnn = ["cudnn_generated_sdpa_bprop_dot_do_o", "cudnn_generated_sdpa_bprop_kernel"]
    sides = backward_sides(ours + cudnn + ours + cudnn)
    assert [(side, d, rows) for side, d, rows in sides] == [("ours", 64, [0, 1, 2]), ("cuDNN", 64, [3, 4]),
                                                          ("ours", 128, [5, 6, 7]), ("cuDNN", 128, [8, 9])]
    with pytest.raises(RuntimeError, match="hopper_bwd_f16_d64"):
        backward_sides(ours + ours + cudnn)


def test_torch_ops_launch_part_lists_every_launch():
    """`--parts launch` times the default launch, one CTA per tile (causal), the round robin and the queue (and causal
    at d = 64 the queue with 128-row tiles), with or without the mask, and its table has each row's mask and the
    launch its shape defaults to."""
    from kernels.bench import torch_ops as TO

    assert list(TO.hopper_launches(None, None, None, 64)) == [
        "default launch", "persistent=False", "persistent=True", "persistent='dynamic'",
        "persistent='dynamic' tiles=(128, 128, 4)"]
    assert list(TO.hopper_launches(None, None, None, 128)) == ["default launch", "persistent=False", "persistent=True",
                                                                "persistent='dynamic'"]
    assert list(TO.hopper_launches(None, None, None, 64, causal=False)) == ["default launch", "persistent=True",
                                                                             "persistent='dynamic'"]
    row = {"impl": "persistent='dynamic'", "T": 1024, "d": 64, "causal": False, "default launch": "'dynamic'",
           "kernel ms": 0.065, "TFLOP/s": 265.0, "vs cuDNN": 0.898}
    text = TO.summary({"gpu": "H100", "launch": [row]})
    assert "default launch" in text and "0.898" in text and "'dynamic'" in text and "False" in text
