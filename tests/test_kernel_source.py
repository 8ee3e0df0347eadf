"""kernel_source and kernel_steps (what the notebooks print) on every kernel file: CPU only."""
import re

import pytest

import kernels
from kernels import core

CU_FILES = sorted(p.name for p in core.KERNEL_DIR.rglob("*.cu") if p.parent.name != "examples")
GLOBAL = re.compile(r"__global__\s+(?:void|__launch_bounds__\([^)]*\)\s*void)\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(")


def _globals(filename):
    text = kernels.kernel_source(filename)
    code = "\n".join(l for l in text.split("\n") if not l.lstrip().startswith(("//", "*", "/*")))
    return sorted(set(GLOBAL.findall(code)))


@pytest.mark.parametrize("filename", CU_FILES)
def test_every_kernel_is_shown_from_its_definition(filename):
    names = _globals(filename)
    assert names, f"no __global__ function found in {filename}"
    for name in names:
        src = kernels.kernel_source(filename, name)
        # code lines without their trailing comments: the first is the definition (or its template line), never a
        # comment or a #define whose comment mentions the name
        code = [l.split("//")[0] for l in src.split("\n") if not l.lstrip().startswith("//")]
        assert not code[0].lstrip().startswith("#"), (filename, name, code[0])
        assert re.search(r"\b" + name + r"\s*\(", " ".join(code[:3])), (filename, name, code[:3])
        assert src.count("{") == src.count("}"), (filename, name)
        assert src.rstrip().endswith("}")


def test_a_name_mentioned_in_a_comment_first_is_found_at_its_definition():
    # timing.cu's header comment describes hold_gpu(ns) before the kernel is defined
    header = kernels.kernel_source("timing.cu").split("extern")[0]
    assert "hold_gpu(" in header
    src = kernels.kernel_source("timing.cu", "hold_gpu")
    assert "__global__ void hold_gpu(" in src
    assert "hold the GPU busy, and flush the L2" not in src


def test_unknown_name_is_an_error():
    with pytest.raises(ValueError, match="no function 'no_such_kernel' in softmax.cu"):
        kernels.kernel_source("softmax.cu", "no_such_kernel")
