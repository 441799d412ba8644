"""Shared test setup. JAX tests force 8 host CPU devices; the flag must be set before jax is
imported anywhere in the test process, so it is set here, at collection time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "cuda_aot: compiles for GPUs without one (tests/test_cuda_aot.py); skipped where JAX's "
        "CUDA plugin is not in .venv/gpu-wheels (`make test` installs it)",
    )


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES
