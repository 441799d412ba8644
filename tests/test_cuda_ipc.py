"""The CUDA IPC and host-staged transports where no GPU is (issues 16 and 29): which transport
``configure`` picks for several processes and why (cuda-ipc only where every pair of processes
has peer access to the other's GPUs, else cuda-host), what it refuses, with a clear error, on
CPU devices or in a build without CUDA; the build names them. Their data paths need a GPU: the
``cuda-ipc`` and ``cuda-host`` checks of benchmarks/gpu_check.py (``make gpu-check``); the CPU
twin of cuda-host runs in tests/test_multiprocess.py."""

from __future__ import annotations

import numpy as np
import pytest

from variopath_jax import _native
from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import configure, peers, release
from variopath_jax.jax_ops.config import TRANSPORTS, choose_transport

WITH_CUDA = ["cpu", "shm", "cuda", "nccl", "cuda-ipc", "cuda-host"]
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
        ("cuda-host", 2, "gpu", "cuda-host"),
        ("cuda-host", 2, "cpu", "cuda-host"),  # its CPU twin
        ("cuda-host", 1, "cpu", "cuda-host"),
    ],
)
def test_the_transport_for_processes_and_devices(transport, processes, platform, chosen) -> None:
    assert choose_transport(transport, 0, processes, platform, WITH_CUDA)[0] == chosen


def test_the_default_between_gpu_processes_follows_the_peer_probe() -> None:
    """One host: what the probe says (with its reason); several hosts: nccl, without a probe."""
    no_p2p = ("cuda-host", "process 0's GPU a has no peer access to process 1's GPU b")
    got = choose_transport(None, 0, 2, "gpu", WITH_CUDA, peers=lambda: no_p2p)
    assert got == no_p2p
    got = choose_transport(None, 0, 2, "gpu", WITH_CUDA, peers=lambda: ("cuda-ipc", "p2p"))
    assert got == ("cuda-ipc", "p2p")

    def never():
        raise AssertionError("probed peers across hosts")

    assert choose_transport(None, 0, 2, "gpu", WITH_CUDA, hosts=lambda: 2, peers=never)[0] == "nccl"
    assert "asked for" in choose_transport("cuda-ipc", 0, 2, "gpu", WITH_CUDA, peers=never)[1]


def _report(local: list[str], visible: list[str], access: dict[str, list[str]]) -> dict:
    bus = {u: f"0000:{k:02x}:00.0" for k, u in enumerate(sorted({*local, *visible}))}
    return {"local": local, "visible": visible, "bus_ids": bus, "access": access, "error": ""}


def test_peer_choice_needs_every_pair_to_see_and_access_the_other() -> None:
    both = ["GPU-a", "GPU-b"]
    p2p = {"GPU-a": both, "GPU-b": both}
    ok = [_report(["GPU-a"], both, p2p), _report(["GPU-b"], both, p2p)]
    assert peers.choose(ok)[0] == "cuda-ipc"
    one_gpu = [_report(["GPU-a"], ["GPU-a"], {"GPU-a": ["GPU-a"]})] * 2  # two processes, one GPU
    assert peers.choose(one_gpu)[0] == "cuda-ipc"
    # consumer cards: both visible, no P2P between them
    no_p2p = {"GPU-a": ["GPU-a"], "GPU-b": ["GPU-b"]}
    chosen, why = peers.choose([_report(["GPU-a"], both, no_p2p), _report(["GPU-b"], both, no_p2p)])
    assert chosen == "cuda-host"
    assert "process 0's GPU GPU-a" in why and "no peer access to process 1's GPU GPU-b" in why
    # one direction only
    half = [_report(["GPU-a"], both, p2p), _report(["GPU-b"], both, no_p2p)]
    chosen, why = peers.choose(half)
    assert chosen == "cuda-host" and "process 1's GPU GPU-b" in why
    # per-process CUDA_VISIBLE_DEVICES: each sees only its own
    hidden = [
        _report(["GPU-a"], ["GPU-a"], {"GPU-a": ["GPU-a"]}),
        _report(["GPU-b"], ["GPU-b"], {"GPU-b": ["GPU-b"]}),
    ]
    chosen, why = peers.choose(hidden)
    assert chosen == "cuda-host" and "process 0 does not see process 1's GPU GPU-b" in why
    broken = [dict(ok[0], error="cudaErrorNoDevice"), ok[1]]
    assert peers.choose(broken) == (
        "cuda-host",
        "process 0 could not probe its GPUs (cudaErrorNoDevice)",
    )


def test_the_probe_here_reports_why_it_found_no_gpus() -> None:
    report = peers.report([0])
    if not _native.build_info()["cuda"] or _native.cuda_peers()["error"]:
        assert report["error"] and report["local"] == []
    machine = peers.machine()
    if len(machine["devices"]) < 2:
        assert machine["transport"] is None and machine["reason"]


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
        ("shm", 2, "gpu", WITH_CUDA, "use transport='cuda-ipc' or 'cuda-host' (the default there)"),
        ("cuda-host", 2, "gpu", WITHOUT_CUDA, "built without CUDA"),
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
    assert hasattr(_native, "cuda_process_exchange") == info["cuda"]
    assert ("cuda-host" in info["transports"]) == info["cuda"]
    assert _native.Transport.CUDA_HOST.value == 5  # ffi/collective.h Transport::kCudaHost


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
        _native.ChoiceDeployment(),
        [],
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


def test_the_cuda_host_twin_in_one_process_names_its_choice_and_budget() -> None:
    """On CPU devices cuda-host is its CPU twin; the configuration keeps why and its budget (the
    default: a sixteenth of the host's memory), and a bad budget is refused naming it."""
    cfg = configure(devices=2, transport="cuda-host", timeout_s=5.0)
    try:
        got = _native.op_config_transport(cfg.id)
        assert got["transport"] == cfg.transport == "cuda-host"
        assert got["reason"] == cfg.transport_reason and "CPU twin" in got["reason"]
        assert got["staging_budget"] == cfg.staging_budget == peers.default_budget("cpu") > 0
        small = configure(devices=2, transport="cuda-host", timeout_s=5.0, staging_budget=4096)
        assert small.id != cfg.id
        assert _native.op_config_transport(small.id)["staging_budget"] == 4096
        release(small)
    finally:
        release(cfg)
        configure(devices=8)
    with pytest.raises(VarioPathError, match="staging_budget must be >= 0"):
        configure(devices=2, transport="cuda-host", staging_budget=-1)
