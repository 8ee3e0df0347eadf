"""Every import of the course's own modules resolves (CPU): in kernels/, in the tests, and in the notebooks' code cells.
A module that moved, or a name that was renamed, fails here rather than in a GPU run or a notebook's output."""

import ast
import importlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "kernels").rglob("*.py")) + sorted((ROOT / "tests").glob("*.py")) + \
    sorted((ROOT / "notebooks").glob("*.py")) + sorted((ROOT / "notebooks").glob("*.ipynb"))


def _code(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        lines = []
        for c in cells:
            if c["cell_type"] == "code":  # IPython's magics and shell escapes are not Python
                lines += [l for l in "".join(c["source"]).split("\n") if not l.lstrip().startswith(("%", "!"))]
        return "\n".join(lines)
    return path.read_text()


def _imports(path: Path):
    """(module, names) of every import of kernels or reference in the file, relative imports made absolute."""
    tree = ast.parse(_code(path))
    package = None
    if path.suffix == ".py" and (ROOT / "kernels") in path.parents:
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([module] if module else []))
            if module.split(".")[0] in ("kernels", "reference"):
                yield module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in ("kernels", "reference"):
                    yield a.name, []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_imports_of_the_course_resolve(path):
    for module, names in _imports(path):
        try:
            mod = importlib.import_module(module)
            for name in names:
                if name != "*" and not hasattr(mod, name):
                    importlib.import_module(f"{module}.{name}")  # a submodule, or ModuleNotFoundError naming it
        except ModuleNotFoundError as e:  # the course's own module missing fails; a third-party one (triton, torch)
            if (e.name or "").split(".")[0] in ("kernels", "reference"):  # is what the machine lacks, not the code
                raise
