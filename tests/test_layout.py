"""The shape of kernels/ (CPU only): folders a reader can take in, imports that flow one way, no private names
borrowed across chapter folders.

    kernels/core/       what every launcher shares; imports no chapter folder and no entry point
    kernels/<chapter>/  a family of chapters (basics, flash, cublas, inference, sampling, pytorch, hopper, parallel)
    kernels/bench/      the entry points; nothing imports them but their own package
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
MAX_FILES = 12
CHAPTERS = ("basics", "flash", "cublas", "inference", "sampling", "pytorch", "hopper", "parallel")


def _folders():
    return [KERNELS] + sorted(p for p in KERNELS.rglob("*") if p.is_dir() and "__pycache__" not in p.parts)


@pytest.mark.parametrize("folder", _folders(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_folder_holds_more_than_a_dozen_files(folder):
    files = sorted(f.name for f in folder.iterdir() if f.is_file() and not f.name.endswith(".pyc"))
    assert len(files) <= MAX_FILES, f"{folder.relative_to(ROOT)} holds {len(files)} files: {files}"


def _relative_imports(py: Path):
    """(target module path below kernels/ as a tuple, imported names) of each relative import in py."""
    tree = ast.parse(py.read_text())
    package = py.parent.relative_to(KERNELS).parts
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            module = tuple(node.module.split(".")) if node.module else ()
            for alias in node.names:
                yield base + module, alias.name


PY_FILES = sorted(KERNELS.rglob("*.py"))


@pytest.mark.parametrize("py", PY_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_imports_flow_one_way(py):
    """entry points (bench) -> chapter folders -> core: core imports no chapter folder or entry point, and no chapter
    folder imports an entry point."""
    here = py.relative_to(KERNELS).parts[0] if len(py.relative_to(KERNELS).parts) > 1 else ""
    for target, name in _relative_imports(py):
        folder = target[0] if target else name
        if here == "core":
            assert folder not in CHAPTERS + ("bench",), f"{py.relative_to(ROOT)} (core) imports {'.'.join(target)}"
        if here in CHAPTERS:
            assert folder != "bench", f"{py.relative_to(ROOT)} imports the entry point {'.'.join(target) or name}"


@pytest.mark.parametrize("py", PY_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_private_name_crosses_a_chapter_folder(py):
    """A name starting with _ stays in its folder: what two folders share is public, or lives in core."""
    here = py.parent.relative_to(KERNELS).parts
    for target, name in _relative_imports(py):
        if name.startswith("_") and not name.startswith("__"):
            folder = target[:1]
            assert folder in (here[:1], ("core",)), \
                f"{py.relative_to(ROOT)} imports the private {name} from {'.'.join(target)}"
