"""The CUDA IPC transport where no GPU is (issue 16, "Several processes"): which transport
``configure`` picks for several processes and what it refuses, with a clear error, on CPU
devices or in a build without CUDA; the build names it. Its data path needs a GPU: the
``cuda-ipc`` checks of benchmarks/gpu_check.py (``make gpu-check``)."""

from __future__ import annotations

import numpy as np
import pytest

from variopath_jax import _native
from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import configure
from variopath_jax.jax_ops.config import TRANSPORTS, choose_transport

WITH_CUDA = ["cpu", "shm", "cuda", "cuda-ipc"]
WITHOUT_CUDA = ["cpu", "shm"]


@pytest.mark.parametrize(
    "transport, processes, platform, chosen",
    [
        (None, 1, "cpu", "memcpy"),
        ("emulated", 1, "cpu", "emulated"),
        (None, 2, "cpu", "shm"),
        ("shm", 4, "cpu", "shm"),
        (None, 2, "gpu", "cuda-ipc"),
        ("cuda-ipc", 3, "gpu", "cuda-ipc"),
        ("cuda-ipc", 1, "gpu", "cuda-ipc"),  # the ranks of one process read each other's staging
        (None, 1, "gpu", "memcpy"),
    ],
)
def test_the_transport_for_processes_and_devices(transport, processes, platform, chosen) -> None:
    assert choose_transport(transport, 0, processes, platform, WITH_CUDA) == chosen


@pytest.mark.parametrize(
    "transport, processes, platform, built, message",
    [
        (None, 2, "gpu", WITHOUT_CUDA, "built without CUDA"),
        ("cuda-ipc", 1, "gpu", WITHOUT_CUDA, "built without CUDA"),
        (
            "cuda-ipc",
            2,
            "cpu",
            WITH_CUDA,
            "this process's devices are cpu; between CPU processes use transport='shm'",
        ),
        ("cuda-ipc", 1, "cpu", WITH_CUDA, "this process's devices are cpu"),
        ("shm", 2, "gpu", WITH_CUDA, "use transport='cuda-ipc' (the default there)"),
        ("memcpy", 2, "gpu", WITH_CUDA, "use transport='cuda-ipc'"),
        ("memcpy", 2, "cpu", WITH_CUDA, "use transport='shm' (the default there)"),
    ],
)
def test_a_transport_that_cannot_work_is_refused_naming_the_one_that_does(
    transport, processes, platform, built, message
) -> None:
    with pytest.raises(VarioPathError, match="transport") as err:
        choose_transport(transport, 1, processes, platform, built)
    assert message in str(err.value)


def test_configure_refuses_cuda_ipc_on_cpu_devices() -> None:
    """This process's JAX devices are CPUs: cuda-ipc has no GPU rows to move."""
    with pytest.raises(VarioPathError, match="'cuda-ipc'") as err:
        configure(devices=2, transport="cuda-ipc")
    assert "devices are cpu" in str(err.value)
    with pytest.raises(VarioPathError, match=r"transport must be one of .*cuda-ipc"):
        configure(devices=2, transport="cuda_ipc")


def test_the_build_and_the_binding_name_cuda_ipc() -> None:
    info = _native.build_info()
    assert ("cuda-ipc" in info["transports"]) == info["cuda"]
    assert "cuda-ipc" in TRANSPORTS
    assert _native.Transport.CUDA_IPC.value == 4  # ffi/collective.h Transport::kCudaIpc
    assert hasattr(_native, "cuda_ipc_exchange") == info["cuda"]


def test_cpu_devices_under_a_cuda_ipc_configuration_get_an_error() -> None:
    """A configuration registered for cuda-ipc (past configure's check) and a CPU rank: the
    collective refuses it with an error naming the transport, it does not touch the rows."""
    from variopath_jax.planner import PlannerParams
    from variopath_jax.planner.native import native_params

    deployment = _native.Deployment()
    deployment.ranks = 1
    config = 0x1C0DA1  # an id of this test's own
    _native.register_op_config(
        config,
        b"",
        "",
        deployment,
        [0],
        native_params(PlannerParams()),
        _native.Execution.SIGNAL,
        None,
        _native.Transport.CUDA_IPC,
        0,
        0.0,
        5.0,
        False,
    )
    try:
        data = np.arange(8, dtype=np.uint8)
        out = np.full(8, 7, np.uint8)
        errors = _native.exchange_on_threads(config, 1, [data], [out], [[2]], 4, -1)
    finally:
        _native.unregister_op_config(config)
    assert "cuda-ipc transport moves GPU devices' rows only" in errors[0]
    assert (out == 7).all()
