"""nbval on notebooks/: notebooks whose metadata says course.needs_gpu are skipped, with the reason,
where no CUDA GPU is found; notebook 00 (NumPy only) runs everywhere."""

import json

import pytest


def _needs_gpu(path) -> bool:
    try:
        return bool(json.loads(open(path).read())["metadata"].get("course", {}).get("needs_gpu", True))
    except (OSError, ValueError, KeyError):
        return True


def pytest_collection_modifyitems(config, items):
    from kernels import gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    if reason is None:
        return
    marker = pytest.mark.skip(reason=f"notebook needs a CUDA GPU: {reason}")
    cache = {}
    for item in items:
        path = str(item.fspath)
        if path.endswith(".ipynb"):
            if path not in cache:
                cache[path] = _needs_gpu(path)
            if cache[path]:
                item.add_marker(marker)
