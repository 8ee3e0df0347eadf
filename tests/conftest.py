"""Shared fixtures. GPU tests take the `gpu` fixture, which skips them, with the reason, where no GPU is found."""

import ahead
import pytest

import kernels


@pytest.fixture(scope="session")
def gpu():
    reason = kernels.gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs a CUDA GPU: {reason}")
    import cupy

    return cupy


@pytest.fixture
def poison(gpu):
    """Every allocation made during the test starts as NaN, so unwritten outputs fail the check."""
    with kernels.poisoned_allocations():
        yield


@pytest.fixture(scope="module")
def hopper(gpu):
    """CuPy, on a Hopper GPU (compute capability 9.x: what an sm_90a build runs on); skips elsewhere with the reason."""
    cc = kernels.device_compute_capability()
    if cc[0] != 9:
        pytest.skip(f"needs a Hopper GPU (compute capability 9.x) for the sm_90a build; this GPU "
                    f"({kernels.gpu_name()}) has {cc[0]}.{cc[1]}")
    return gpu


@pytest.fixture(scope="session", autouse=True)
def work_ahead(request, tmp_path_factory):
    """Where a GPU is found, the work every test file plans ahead starts at the session's first test (tests/ahead.py):
    the GPU tests keep one core busy and leave the others to it. Without a GPU the tests themselves are the CPU work,
    and each file starts its own plan at its first test."""
    if kernels.gpu_unavailable_reason() is None:
        ahead.start_session(request.session, tmp_path_factory)
    try:
        yield
    finally:
        ahead.finish()


@pytest.fixture
def monkeypatch(monkeypatch):
    """pytest's monkeypatch, once the work started ahead is done: a build or subprocess started in another thread
    would otherwise read what the test changes (its environment, a module's function or constant, the device
    information). A GPU test that skips for want of a GPU before it asks for monkeypatch does not wait."""
    ahead.drain()
    return monkeypatch
