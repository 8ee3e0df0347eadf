"""kernels/hopper/hopper_gemm.cu built for sm_90a without a GPU: the Hopper instructions are really in the machine code.

The launcher compiles the file with NVRTC for the architecture-specific target sm_90a (kernels.core.compile_cubin;
CuPy's RawModule would compile for the generic sm_90, which has no wgmma). Here the same build runs on a CPU-only
machine (NVRTC from the cuda-bindings wheel) and its CUBIN is disassembled with cuobjdump from the
nvidia-cuda-cuobjdump wheel (or a CUDA toolkit's) to check what the GPU will run:

    HGMMA.64x256x16.F32[.BF16]  wgmma.mma_async, 4 per k-block (K = 64 in steps of 16)
    UTMALDG.3D                  the two TMA tile loads (A and B) of cp.async.bulk.tensor.3d
    SYNCS.*                     the mbarrier operations of the ring
    USETMAXREG                  setmaxnreg (registers moved from the producer to the consumers)

and that the register count is the 168 that setmaxnreg's budget assumes, with no local memory (spills), and that
each tensor map is a 128-byte parameter. tests/test_compile.py compiles the same file for sm_80..sm_90, where the
Hopper code is left out (#if __CUDA_ARCH_FEAT_SM90_ALL) and the kernels are stubs.
"""

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ahead import Ahead

from kernels import core
from kernels.hopper import hopper_gemm as H

ARCH = "sm_90a"


def _tool(name):
    """A CUDA binary utility from the nvidia-cuda-* wheels (nvidia/cu13/bin), else from the PATH, else None."""
    try:
        import nvidia.cu13 as wheel

        for base in wheel.__path__:
            path = Path(base) / "bin" / name
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    except ImportError:
        pass
    return shutil.which(name)


def _nvrtc_available():
    """NVRTC from CuPy (GPU machines) or from the cuda-bindings wheel (what compile_cubin uses)."""
    if core.cp is not None:
        return True
    try:
        return importlib.util.find_spec("cuda.bindings.nvrtc") is not None
    except ImportError:  # no `cuda` package at all
        return False


def cubin_file(tmp_path_factory, kernel_file: str, build) -> Path:
    """The CUBIN of one sm_90a build, written to a temporary file for cuobjdump: build() gives (data, NVRTC's log),
    which must have no warning. Skips where NVRTC is not installed."""
    if not _nvrtc_available():
        pytest.skip("NVRTC is not installed (pip install cuda-bindings nvidia-cuda-nvrtc)")
    data, log = build()
    assert "warning" not in log.lower(), f"{kernel_file} ({ARCH}) compiles with warnings:\n{log}"
    stem = kernel_file.removesuffix(".cu")
    path = tmp_path_factory.mktemp(stem) / f"{stem}_{ARCH}.cubin"
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def cubin(tmp_path_factory):
    source = core.kernel_path(H.KERNEL_FILE).read_text()
    return cubin_file(tmp_path_factory, H.KERNEL_FILE,
                      lambda: core.compile_cubin(source, H.KERNEL_FILE, ARCH, core.NVRTC_OPTIONS + H.DEFINES))


@pytest.fixture(scope="module")
def cuobjdump(cubin):
    return cuobjdump_for(cubin)


def cuobjdump_for(cubin):
    """The cuobjdump that can disassemble `cubin` here, or a pytest.skip that says what to install."""
    tool = _tool("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump is not installed (pip install nvidia-cuda-cuobjdump, or a CUDA toolkit)")
    probe = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, env=_env(tool))
    if probe.returncode != 0 and "does not contain device code" in probe.stderr:  # a toolkit older than the NVRTC
        pytest.skip(f"{tool} cannot read a CUBIN of this NVRTC (an older CUDA's cuobjdump); "
                    f"pip install nvidia-cuda-cuobjdump for one that matches")
    if probe.returncode != 0 and "nvdisasm" in probe.stderr:  # cuobjdump -sass runs nvdisasm
        pytest.skip(f"{tool} needs nvdisasm beside it or on the PATH (pip install nvidia-cuda-nvdisasm)")
    return tool


def _env(tool):
    """The environment for a CUDA binary utility: its own directory first on the PATH, where cuobjdump finds the
    nvdisasm it runs for -sass (the nvidia-cuda-nvdisasm wheel installs both into nvidia/cu13/bin)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(tool).parent), env.get("PATH", "")])
    return env


def _run(*cmd):
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(cmd[0]))
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    return res.stdout


def _per_function(text, header):
    """{function name: its part of the text}, cut at each line matching `header` (a regex with one group)."""
    parts, name = {}, None
    for line in text.splitlines():
        m = re.search(header, line)
        if m:
            name = m.group(1)
            parts[name] = []
        elif name is not None:
            parts[name].append(line)
    return {k: "\n".join(v) for k, v in parts.items()}


@pytest.fixture(scope="module")
def sass(cubin, cuobjdump):
    return _per_function(_run(cuobjdump, "-sass", str(cubin)), r"Function : (\w+)")


def _count(text, pattern):
    return len(re.findall(pattern, text))


@pytest.mark.parametrize("pair", sorted(H.KERNEL_NAMES), ids=lambda p: "-".join(p))
def test_sass_has_wgmma_and_tma(sass, pair, capsys):
    name = H.KERNEL_NAMES[pair]
    code = sass.get(name)
    assert code is not None, f"{name} is not in the CUBIN; functions: {sorted(sass)}"
    bf16 = pair[0] == "bfloat16"
    hgmma = re.findall(r"\bHGMMA\.64x256x16\.F32(\.BF16)?\b", code)
    k_steps = H.BLOCK_K // 16
    assert len(hgmma) == k_steps, f"{name}: expected {k_steps} HGMMA.64x256x16 (one per k-step), found {len(hgmma)}"
    assert all(bool(t) == bf16 for t in hgmma), f"{name}: HGMMA types {hgmma} do not match the input {pair[0]}"
    utmaldg = _count(code, r"\bUTMALDG\.3D\b")
    assert utmaldg == 2, f"{name}: expected 2 UTMALDG.3D (the A and B tiles), found {utmaldg}"
    syncs = _count(code, r"\bSYNCS\.")
    assert syncs >= 4, f"{name}: expected mbarrier operations (SYNCS.*), found {syncs}"
    setmaxreg = _count(code, r"\bUSETMAXREG\b")
    assert setmaxreg >= 2, f"{name}: expected setmaxnreg (USETMAXREG) in the producer and the consumers"
    spills = _count(code, r"\b(?:LDL|STL)\b")
    assert spills == 0, f"{name}: {spills} local-memory loads/stores (register spills)"
    with capsys.disabled():
        print(f"\n{name} ({ARCH}): HGMMA {len(hgmma)}, UTMALDG {utmaldg}, SYNCS {syncs}, USETMAXREG {setmaxreg}, "
              f"{len(code.splitlines())} SASS lines")


def test_register_budget_matches_setmaxnreg(cubin, cuobjdump):
    """setmaxnreg moves registers inside the block's allocation: 384 threads x 168 at launch. The consumers' increase
    blocks until the producer's decrease has freed enough, so a kernel built with fewer registers would hang."""
    usage = _run(cuobjdump, "-res-usage", str(cubin))
    found = re.findall(r"Function (\w+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", usage)
    assert {f[0] for f in found} == set(H.KERNEL_NAMES.values()), usage
    regs = 65536 // H.THREADS // 8 * 8
    for name, reg, stack, shared, local in found:
        assert int(reg) == regs, f"{name}: {reg} registers; setmaxnreg's budget assumes {regs}"
        assert int(stack) == 0 and int(local) == 0, f"{name}: stack {stack}, local {local} bytes (spills)"
        assert int(shared) + H.SMEM_BYTES <= 227 * 1024 + 1024, f"{name}: static {shared} + dynamic {H.SMEM_BYTES}"


def test_tensor_maps_are_128_byte_parameters(cubin, cuobjdump):
    """The kernel takes each CUtensorMap by value: parameters 0 and 1 are 128 bytes, then C and four ints."""
    info = _per_function(_run(cuobjdump, "-elf", str(cubin)), r"^\.nv\.info\.(\w+)")
    for name in H.KERNEL_NAMES.values():
        params = {int(o, 16): int(s, 16) for o, s in
                  re.findall(r"Ordinal : (0x[0-9a-f]+)\s+Offset\s*: 0x[0-9a-f]+\s+Size\s*: (0x[0-9a-f]+)", info[name])}
        assert params == {0: 128, 1: 128, 2: 8, 3: 4, 4: 4, 5: 4, 6: 4}, f"{name}: parameter sizes {params}"


def test_generic_sm90_build_has_no_wgmma(cuobjdump, tmp_path):
    """Why the launcher compiles for sm_90a: for plain sm_90 (what CuPy's RawModule picks on an H100) the Hopper code is
    compiled out, and the kernels are stubs that trap."""
    if not _nvrtc_available():
        pytest.skip("NVRTC is not installed (pip install cuda-bindings nvidia-cuda-nvrtc)")
    source = core.kernel_path(H.KERNEL_FILE).read_text()
    data, _ = core.compile_cubin(source, H.KERNEL_FILE, "sm_90", core.NVRTC_OPTIONS + H.DEFINES)
    path = tmp_path / "generic.cubin"
    path.write_bytes(data)
    text = _run(cuobjdump, "-sass", str(path))
    assert "HGMMA" not in text and "UTMALDG" not in text
    assert _count(text, r"\bBPT\.TRAP\b") >= len(H.KERNEL_NAMES)


def test_constants_agree_with_the_kernel():
    """The launcher's shared-memory request is the .cu file's SMEM_BYTES formula, and the kernel's tile shape."""
    source = core.kernel_path(H.KERNEL_FILE).read_text()
    assert "STAGES * STAGE_BYTES + SMEM_ALIGN" in source
    assert H.SMEM_BYTES == H.STAGES * (H.BLOCK_M + H.BLOCK_N) * H.BLOCK_K * 2 + 1024 <= 227 * 1024
    assert "m64n256k16" in source and H.BLOCK_N == 256 and H.BLOCK_K * 2 == 128
    assert set(H.KERNEL_NAMES.values()) == set(re.findall(r'extern "C" __global__ void __launch_bounds__\([^)]*\)\s*'
                                                          r'(\w+)\(', source))


def test_compile_error_carries_the_log():
    if not _nvrtc_available():
        pytest.skip("NVRTC is not installed (pip install cuda-bindings nvidia-cuda-nvrtc)")
    with pytest.raises(core.CompileError, match=r"broken\.cu \(sm_90a\) does not compile:\n.*undefined"):
        core.compile_cubin('extern "C" __global__ void k() { undefined_name(); }', "broken.cu", ARCH)


def nvcc_sm90a(cu: Path, out_dir: Path):
    """(command, result) of the file alone, as a reader would build it: nvcc -gencode=arch=compute_90a,code=sm_90a,
    with ptxas's register and spill report (the .cu defaults: no -D)."""
    cmd = ["nvcc", "-c", "-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "-I", os.fspath(cu.parents[1]),
           "--resource-usage", "-o", os.fspath(out_dir / "k.o"), os.fspath(cu)]
    return cmd, subprocess.run(cmd, capture_output=True, text=True)


def _plan(item, tmp_path_factory):
    """The nvcc build starts with the session's other work (tests/ahead.py)."""
    if item.originalname == "test_nvcc_builds_sm90a_without_spills" and shutil.which("nvcc"):
        yield "nvcc", nvcc_sm90a, (core.kernel_path(H.KERNEL_FILE), tmp_path_factory.mktemp("nvcc"))


AHEAD = Ahead(_plan)
start_ahead = AHEAD.fixture()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on the PATH")
def test_nvcc_builds_sm90a_without_spills(tmp_path):
    """The file alone, as a reader would build it: nvcc -gencode=arch=compute_90a,code=sm_90a (ptxas's own report)."""
    cmd, res = AHEAD.result("nvcc", nvcc_sm90a, core.kernel_path(H.KERNEL_FILE), tmp_path)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"
    assert "warning" not in res.stderr.lower(), res.stderr  # ptxas warns here when it serializes wgmma
    assert res.stderr.count("0 bytes spill stores, 0 bytes spill loads") == len(H.KERNEL_NAMES), res.stderr
