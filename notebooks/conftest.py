"""nbval on notebooks/: a notebook is skipped, with the reason, where it cannot run: no CUDA GPU for one whose
metadata says course.needs_gpu, or a GPU below its course.min_cc (run_all.skip_reason). Notebook 00 (NumPy only)
runs everywhere."""

import pytest

from run_all import skip_reason


def pytest_collection_modifyitems(config, items):
    reasons = {}
    for item in items:
        path = str(item.fspath)
        if path.endswith(".ipynb"):
            if path not in reasons:
                reasons[path] = skip_reason(path)
            if reasons[path] is not None:
                item.add_marker(pytest.mark.skip(reason=reasons[path]))
