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
