"""nbval on notebooks/.

A notebook is skipped, with the reason, where it cannot run: no CUDA GPU for one whose metadata says
course.needs_gpu, or a GPU below its course.min_cc (run_all.skip_reason). Notebook 00 (NumPy only) runs everywhere.

Each notebook's Jupyter kernel is started ahead, as run_all.py starts them: the first when collection ends, each
following one while the notebook before it runs, importing NumPy, Matplotlib, CuPy and PyTorch quietly there
(run_all.start_kernel, WARM_UP). nbval would start each kernel, and wait for those imports, at the notebook's first
cell. Under pytest-xdist, whose workers each run the notebooks given to them, nbval starts its own kernels.
"""

import subprocess
from pathlib import Path

import pytest

import run_all
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
    runnable = [Path(path) for path, why in reasons.items() if why is None]
    if runnable and config.pluginmanager.hasplugin("nbval") and not hasattr(config, "workerinput"):
        config._kernels_ahead = KernelsAhead(runnable)
        config._kernels_ahead.install()


def pytest_sessionfinish(session):
    ahead = getattr(session.config, "_kernels_ahead", None)
    if ahead is not None:
        ahead.uninstall()


class KernelsAhead:
    """Gives nbval, for each notebook, the kernel started for it ahead; starts the next notebook's meanwhile."""

    warm_up = run_all.WARM_UP  # what each kernel runs before its notebook's turn

    def __init__(self, notebooks: list[Path]):
        self.notebooks = notebooks  # the notebooks this session runs, in order
        self.started = None  # (notebook, run_all.start_kernel's (km, kc)): the kernel started ahead
        self.current = None  # the notebook nbval is setting up
        self._undo = []

    def start(self, notebook: Path) -> None:
        self.stop()
        self.started = (notebook, run_all.start_kernel(notebook, None, self.warm_up, stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        """Stop the kernel started ahead where nbval did not take it (its notebook was skipped or failed to set up)."""
        if self.started is not None:
            run_all.stop_kernel(self.started[1])
            self.started = None

    def take(self, kernel_name: str):
        """The (km, kc) started for the notebook being set up, or None (then nbval starts one), and the next notebook's
        kernel started."""
        kernel = None
        if self.started is not None and self.started[0] == self.current and kernel_name == run_all.KERNEL_NAME:
            kernel, self.started = self.started[1], None
        following = self.notebooks.index(self.current) + 1 if self.current in self.notebooks else len(self.notebooks)
        if following < len(self.notebooks):
            self.start(self.notebooks[following])
        else:
            self.stop()
        return kernel

    def install(self) -> None:
        """nbval's notebook collector (IPyNbFile) makes its kernel with plugin.RunningKernel(kernel_name, cwd=,
        startup_timeout=) in its setup: both are wrapped here, and restored by uninstall()."""
        from nbval import plugin

        ahead = self

        class KernelStartedAhead(plugin.RunningKernel):
            def __init__(self, kernel_name, cwd=None, startup_timeout=60):
                kernel = ahead.take(kernel_name)
                if kernel is None:
                    super().__init__(kernel_name, cwd=cwd, startup_timeout=startup_timeout)
                    return
                self.km, self.kc = kernel
                self.kc.wait_for_ready(timeout=max(startup_timeout, 300))  # up, and done with WARM_UP
                self._ensure_iopub_up()

        setup = plugin.IPyNbFile.setup

        def setup_naming_the_notebook(collector):
            ahead.current = Path(str(collector.fspath))
            setup(collector)

        self._undo = [(plugin, "RunningKernel", plugin.RunningKernel), (plugin.IPyNbFile, "setup", setup)]
        plugin.RunningKernel = KernelStartedAhead
        plugin.IPyNbFile.setup = setup_naming_the_notebook
        self.start(self.notebooks[0])

    def uninstall(self) -> None:
        self.stop()
        for owner, name, value in self._undo:
            setattr(owner, name, value)
        self._undo = []
