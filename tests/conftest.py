"""Shared fixtures. GPU tests take the `gpu` fixture, which skips them, with the reason, where no GPU is found."""

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
