"""The T4 kernels (compute capability 7.5) on a newer GPU: the GPU tests of chapters 01-05 and the CUDA-core inference
kernels under COURSE_SIMULATE_CC=7.5 (the launchers see a T4's capability, 64 KB of shared memory per block and 40 SMs;
the kernels are built from compute_75 PTX, which this GPU's driver JIT-compiles, so the sm_75 paths and their
fallbacks run), and in-process checks of the T4 limits. Skipped without a GPU.

    python3 -m pytest -q tests/test_sm75_gpu.py                  # the whole simulated run, one subprocess per file
    COURSE_SIMULATE_CC=7.5 python3 -m pytest -q -p sm75_plugin tests/test_flash2_gpu.py    # one file by hand
"""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ahead import Ahead

import kernels
import reference as R
from kernels import core

ROOT = Path(__file__).resolve().parents[1]
# The GPU test files of the T4 kernels, with a -k filter where a file is mostly about a kernel that needs 8.0 (the
# plugin turns any remaining UnsupportedDeviceError into a skip), and the fewest tests that must pass.
SIMULATED_RUNS = {
    "test_naive_gpu.py": ("", 5),
    "test_softmax_gpu.py": ("", 20),
    "test_flash2_gpu.py": ("", 10),
    "test_attention_gpu.py": ("naive or flash1 or flash2_fp32 or cublas_fp32 or cublas_fp16", 100),
    "test_cublas_accuracy_gpu.py": ("", 4),
    "test_cublas_half_gpu.py": ("", 10),
    "test_decode_gpu.py": ("not mma", 20),
    "test_varlen_gpu.py": ("scan or remove_restore or from_mask or malformed_indices or misaligned", 20),
    "test_sampling_gpu.py": ("", 20),
    "test_errors_gpu.py": ("", 20),
    "test_sm75_gpu.py": ("not simulated_run", 3),
}


def _passed(output: str) -> int:
    m = re.search(r"(\d+) passed", output)
    return int(m.group(1)) if m else 0


def _simulated_run(test_file):
    """(command, result) of the file's tests in a subprocess that sees a T4."""
    k, _ = SIMULATED_RUNS[test_file]
    env = dict(os.environ, COURSE_SIMULATE_CC="7.5",
               PYTHONPATH=os.pathsep.join([os.fspath(ROOT / "tests"), os.fspath(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "sm75_plugin", "-p", "no:cacheprovider", "--no-prebuild",
           os.fspath(ROOT / "tests" / test_file)] + (["-k", k] if k else [])
    return cmd, subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


def _plan(item, tmp_path_factory):
    """The simulated runs start together (tests/ahead.py), each a subprocess of its own, where they would run."""
    if item.originalname == "test_simulated_run" and kernels.gpu_unavailable_reason() is None \
            and kernels.device_compute_capability() >= core.T4_CC:
        test_file = item.callspec.params["test_file"]
        yield test_file, _simulated_run, (test_file,)


AHEAD = Ahead(_plan, first=True)  # the session's longest jobs (a whole test file each): started before the others
start_ahead = AHEAD.fixture()


@pytest.mark.parametrize("test_file", sorted(SIMULATED_RUNS))
def test_simulated_run(gpu, test_file):
    cc = kernels.device_compute_capability()
    if cc < core.T4_CC:
        pytest.skip(f"simulating 7.5 needs a GPU of compute capability >= 7.5; this one has {cc[0]}.{cc[1]}")
    _, at_least = SIMULATED_RUNS[test_file]
    cmd, res = AHEAD.result(test_file, _simulated_run, test_file)
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, f"{' '.join(cmd)} (COURSE_SIMULATE_CC=7.5) failed:\n{tail}"
    assert _passed(res.stdout) >= at_least, f"fewer than {at_least} tests passed:\n{tail}"


@pytest.fixture
def t4(gpu, monkeypatch):
    """The current GPU, seen by the launchers as a T4 (cc 7.5, 64 KB per block, 40 SMs); the kernels still build for
    the real GPU (the subprocess runs above build compute_75 PTX)."""
    dev = core.current_device()
    info = core.device_info(dev)
    monkeypatch.setitem(core.device._DEVICE_INFO, dev, dataclasses.replace(info, cc=(7, 5), smem_optin=64 * 1024,
                                                                           sm_count=40))
    core.clear_launch_caches()
    yield gpu
    core.clear_launch_caches()


@pytest.mark.parametrize("d", [64, 100, 128])
def test_flash2_small_tile_within_64_kb(t4, poison, d):
    """The default tile of D = 64 and 128 needs 69 and 76 KB; on a T4 the launcher takes SMALL_TILES."""
    from kernels.flash import flash2 as F2

    cp = t4
    q, k, v = R.make_qkv(2, 3, 130, d, 257, magnitude=3.0, seed=d)
    o, lse = F2.forward(*map(cp.asarray, (q, k, v)), causal=True, return_lse=True)
    o_ref, lse_ref = R.attention(q, k, v, causal=True, return_lse=True)
    assert kernels.check(o, o_ref, "float32").ok and kernels.check(lse, lse_ref, "float32").ok
    _, tile, smem = F2.build(F2.BUILD_FOR[d], None, core.max_shared_memory_optin())
    assert tile == F2.SMALL_TILES[F2.BUILD_FOR[d]] and smem <= 64 * 1024


def test_flash2_tile_over_64_kb_is_a_value_error(t4):
    from kernels.flash import flash2 as F2

    q = t4.ones((1, 1, 8, 64), dtype=t4.float32)
    with pytest.raises(ValueError, match=r"tile .* for D=64 needs 70656 bytes of shared memory.*at most 65536"):
        F2.forward(q, q, q, tile=(64, 64, 4, 8))


@pytest.mark.parametrize("name", ["cublas_bf16", "cublas_tf32"])
def test_bf16_and_tf32_name_what_they_need(t4, name):
    v = kernels.tested_variants()[name]
    x = t4.ones((1, 1, 8, 64), dtype=v.dtypes[0])
    with pytest.raises(kernels.UnsupportedDeviceError, match=r"needs a GPU of compute capability >= 8\.0.* has 7\.5"):
        v.forward(x, x, x)


def test_decode_bf16_names_its_dtype(t4):
    from kernels.inference import decode_ft

    q = t4.ones((1, 2, 1, 64), dtype="bfloat16")
    cache = t4.ones((1, 2, 16, 64), dtype="bfloat16")
    lens = t4.asarray(np.array([16], dtype=np.int32))
    with pytest.raises(kernels.UnsupportedDeviceError, match=r"decode_ft in bfloat16 needs .*>= 8\.0.* has 7\.5"):
        decode_ft.decode(q, cache, cache, lens)
