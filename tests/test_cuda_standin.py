"""The multi-GPU orchestration run in CI (issue 52 item 6): the real host code of the CUDA
transports (ffi/ffi_cuda.cc's handlers, cuda/cuda_streams.cc's one-process path, cuda/ipc.cc,
cuda/host_staging.cc, cuda/pull_streams.h, peer_access.h's decisions) compiled against a CPU
stand-in for the CUDA runtime (ffi/standin) into the test module ``_native_cuda_standin``, and
called the way XLA's GPU client calls the handlers: one host thread per device, each with its
device's stream, run id and buffers (tests/cuda_standin_worker.py). Results against NumPy.

The stand-in enforces what a GPU would: a kernel storing into a peer's memory its device may not
touch (no peer access enabled, a pool or VMM mapping that does not grant it, pageable memory)
is an illegal address that makes the device's error sticky and is reported here; an event wait
waits for the record enqueued before it; a query of an incomplete event leaves
cudaErrorNotReady in the thread's last error; cudaIpcOpenMemHandle needs peer access between
the devices; a read-only host registration can be refused. Streams run on threads after random
delays, so a missing wait shows as wrong bytes.

Mutations of the real code it catches (each tried once while building it): a pool buffer stored
into directly though its pool does not grant the writer (illegal address, sticky: every call
after fails); the end-of-call stream waits on incoming transfers removed (XLA's next operation,
a copy of the results enqueued as the handler returns, reads wrong bytes); check.h's clear of
the last error removed (launches see a poll's stale cudaErrorNotReady: launch_saw_stale_error).
One it does not: the sender's wait for the receiver's entry event removed, because the counts'
host sync in every handler already orders each receiver's earlier work before any rank joins.

What it cannot catch: the driver's timing (copy-engine concurrency, bandwidth, PCIe contention
and the posted-write trigger, how long a paced hold really takes), a GPU's weaker memory ordering
between streams that an event does not order (the stand-in's mutexes order more than a GPU
does), kernel-level bugs (the kernels run as host twins of their per-thread code, not as PTX),
CUDA-graph capture, the legacy default stream's implicit synchronisation, cudaFree's implicit
device synchronisation, a peer's use of an IPC mapping after its owner freed it, XLA's own GPU
runtime (its allocator, its streams, its collectives beside ours) and NCCL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port

from variopath_jax import _native

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "cuda_standin_worker.py"
FOUND = sorted(Path(_native.__file__).parent.glob("_native_cuda_standin*.so"))
# the module next to _native (`make test` builds it), or one named by $VARIOPATH_CUDA_STANDIN
MODULE = Path(os.environ.get("VARIOPATH_CUDA_STANDIN") or (FOUND[0] if FOUND else "")) or None
MODULE = MODULE if MODULE and MODULE.is_file() else None

pytestmark = pytest.mark.skipif(
    MODULE is None,
    reason="no _native_cuda_standin next to _native: this install was built without "
    "-DVARIOPATH_CUDA_STANDIN=ON (`make test` builds it)",
)

ONE_PROCESS = ("one-process", "no-peers", "wedged", "wedged-after")
# (peers, forced transport, read-only registration) of each two-process run
GROUPS = {
    "ipc": ("all", "", "1"),
    "host": ("none", "", "0"),
    "ipc-without-peers": ("none", "cuda-ipc", "1"),
}
PROCESSES = 2


def _start(case: str, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(MODULE), case, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **env},
    )


@pytest.fixture(scope="module")
def runs() -> dict:
    """Every worker at once (they mostly wait): each case's lines, by case (and process)."""
    procs: dict[str, subprocess.Popen] = {case: _start(case) for case in ONE_PROCESS}
    for group, (peers, transport, readonly) in GROUPS.items():
        port = str(free_port())
        for p in range(PROCESSES):
            procs[f"{group}/{p}"] = _start(
                "processes",
                str(p),
                str(PROCESSES),
                port,
                XLA_FLAGS="--xla_force_host_platform_device_count=1",
                STANDIN_PEERS=peers,
                STANDIN_TRANSPORT=transport,
                STANDIN_READONLY=readonly,
            )
    out, deadline = {}, time.monotonic() + 240
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            lines = [json.loads(s) for s in stdout.splitlines() if s.startswith("{")]
            assert proc.returncode == 0 and lines[-1] == {"done": True}, (name, stderr[-3000:])
            out[name] = {line.get("case", "done"): line for line in lines}
    finally:
        for proc in procs.values():
            proc.kill()
    return out


def test_eight_gpus_of_one_process_exchange_exactly(runs) -> None:
    """all_to_all_v (three demands), the _into variant, ragged_all_to_all (two slices to each
    rank: transfers of several pieces, the batched copy kernel), and the barrier, signal and
    concurrent executions: every byte and count as NumPy says, on streams with random delays."""
    got = runs["one-process"]
    assert got["transport"]["transport"] == "memcpy"
    for case in (
        "a2av-0",
        "a2av-1",
        "a2av-2",
        "a2av-into",
        "ragged",
        "execution-barrier",
        "execution-signal",
        "execution-concurrent",
    ):
        assert got[case]["wrong"] == [], case
    assert got["counters"]["counters"]["batched_copy_kernel"] > 0


def test_a_paced_plan_runs_its_paced_kernels(runs) -> None:
    """rot-paced on 16 GPUs (l20-cx7, about 20 MiB per rank, decided ahead from the site's first
    call): paced_copy launches with their clock stamps and holds (host twins), exact results."""
    got = runs["one-process"]
    assert got["paced"]["wrong"] == []
    assert got["paced"]["plan"] == "rot-paced" and got["paced"]["pace"] > 0
    counters = got["counters"]["counters"]
    assert counters["paced_copy_kernel"] > 0 and counters["stamp_kernel"] > 0
    assert counters["hold_kernel"] > 0


@pytest.mark.parametrize(
    ("kind", "decision"),
    [
        ("plain", "direct stores"),
        ("pool-granted", "direct stores"),
        ("pool-private", "peer copy"),
        ("vmm-granted", "direct stores"),
        ("vmm-private", "peer copy"),
    ],
)
def test_peer_writes_follow_the_memory_xla_hands_over(runs, kind, decision) -> None:
    """peer_access.h's branches on XLA's allocation kinds: cudaMalloc memory with peer access
    enabled, pool and VMM memory that grant the writer read-write are stored into directly;
    those that do not get cudaMemcpyPeerAsync. A direct store the stand-in forbids would be an
    illegal address (test_no_illegal_access)."""
    got = runs["one-process"][kind]
    assert got["wrong"] == []
    assert got["decisions"] == {decision: 8 * 7}


def test_without_peer_access_the_driver_copies(runs) -> None:
    got = runs["no-peers"]
    assert got["a2av"]["wrong"] == [] and got["a2av-into"]["wrong"] == []
    assert got["a2av"]["decisions"] == {"peer copy": 8 * 7}
    assert "peer_access_enabled" not in got["counters"]["counters"]
    assert got["counters"]["counters"]["peer_copy"] > 0


def test_no_illegal_access(runs) -> None:
    for name in ("one-process", "no-peers", *(f"{g}/{p}" for g in GROUPS for p in range(2))):
        assert runs[name]["faults"]["faults"] == [], name


def test_polls_leave_not_ready_behind_and_launches_still_work(runs) -> None:
    """The host waits poll events that are not complete yet (each leaving cudaErrorNotReady as
    the thread's last error, as CUDA does) and the kernels launched after them report no
    failure (check.h clears it): the stale error of issue 52 would fail those launches here."""
    counters = runs["one-process"]["counters"]["counters"]
    assert counters["event_not_ready"] > 0 and counters["batched_copy_kernel"] > 0
    for name in ("one-process", "no-peers", *(f"{g}/{p}" for g in GROUPS for p in range(2))):
        assert "launch_saw_stale_error" not in runs[name]["counters"]["counters"], name


def test_a_wedged_stream_fails_the_call_at_its_deadline(runs) -> None:
    """Device 3's stream never runs again before the call: its counts never reach the host, so
    its handler fails at the configured 2 s naming the stalled stream, every other rank at the
    rendezvous naming rank 3, and no thread hangs."""
    got = runs["wedged"]
    assert got["healthy"]["wrong"] == []
    wrong = got["wedged-before-counts"]["wrong"]
    assert len(wrong) == 8
    assert any("rank 3: variopath all_to_all: reading the counts: timed out" in w for w in wrong)
    assert any("the stream is stalled" in w for w in wrong)
    others = [w for w in wrong if not w.startswith("rank 3:")]
    assert all("waiting for ranks 3 to join" in w for w in others), others
    assert got["wedged-before-counts"]["seconds"] < 15


def test_a_stream_wedged_after_the_counts_stalls_what_follows_the_call(runs) -> None:
    """Device 5's stream stops right after the counts' copy. The call is stream-ordered (one host
    sync, issue 52): every handler returns without an error, and the stall shows where XLA's
    next operation would wait: no rank's stream finishes (each waits on events of device 5's
    stream). The op's deadlines cannot see a stall after its one host sync; the caller's own
    wait (here the stand-in's, with its deadline) does."""
    got = runs["wedged-after"]
    assert got["healthy"]["wrong"] == []
    wrong = got["wedged-after-counts"]["wrong"]
    assert wrong and all("the stand-in: device" in w and "did not finish" in w for w in wrong)
    assert not any("variopath all_to_all" in w for w in wrong)
    assert got["wedged-after-counts"]["seconds"] < 15


def test_cuda_ipc_between_processes_with_peer_access(runs) -> None:
    """configure picks cuda-ipc from the stand-in's peer access (every pair can), and the
    processes exchange over IPC handles of device staging in shared memory."""
    for p in range(PROCESSES):
        got = runs[f"ipc/{p}"]
        assert got["transport"]["transport"] == "cuda-ipc"
        assert all(got[f"a2av-{s}"]["wrong"] == [] for s in range(3))
        assert got["ragged"]["wrong"] == []
        counters = got["counters"]["counters"]
        assert counters["ipc_export"] > 0 and counters["ipc_open"] > 0


def test_cuda_host_between_processes_without_peer_access(runs) -> None:
    """Without peer access configure picks cuda-host: rows bounced through registered shared
    host memory; a driver that refuses read-only registration is a logged fallback, not a
    failure."""
    for p in range(PROCESSES):
        got = runs[f"host/{p}"]
        assert got["transport"]["transport"] == "cuda-host"
        assert "no peer access" in got["transport"]["reason"]
        assert all(got[f"a2av-{s}"]["wrong"] == [] for s in range(3))
        assert got["ragged"]["wrong"] == []
        counters = got["counters"]["counters"]
        assert counters["host_register"] > 0 and counters["host_register_refused"] > 0
        assert any("cudaHostRegisterReadOnly -> pageable" in line for line in got["log"]["log"])


def test_cuda_ipc_without_peer_access_fails_naming_why(runs) -> None:
    for p in range(PROCESSES):
        got = runs[f"ipc-without-peers/{p}"]
        assert got["transport"]["transport"] == "cuda-ipc"
        for case in ("a2av-0", "ragged"):
            (wrong,) = got[case]["wrong"]
            assert "cudaIpcOpenMemHandle" in wrong and "cudaErrorPeerAccessUnsupported" in wrong
            assert "transport='cuda-host'" in wrong
