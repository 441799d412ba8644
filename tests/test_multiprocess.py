"""The op across several JAX processes on one host (issue 16): jax.distributed with a local
coordinator, 2-4 processes of 1-2 CPU devices each, the shared-memory transport and the CPU twin
of the host-staged GPU transport (issue 29: ``cuda-host``, its copies on the stream emulator with
random delays, or memcpy streams). Both ops against NumPy in every execution mode, over several
calls of two call sites; a process that exits, is killed inside the call or stalls there gives
the others a clear error naming it within their timeout; a staging budget too small for a call
fails it naming the budget; a rank whose lock timed out inside a call leaves its slot; none of
the segments the processes made (they say what their names begin with) is left in /dev/shm,
whatever else shares it. Every process runs
tests/multiprocess_worker.py, and every wait for one has a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port

WORKER = Path(__file__).with_name("multiprocess_worker.py")
SHM = Path("/dev/shm")


def ours() -> set[str]:
    return {p.name for p in SHM.glob("vpjax-*")} if SHM.is_dir() else set()


def start(case: str, processes: int, devices: int, **env) -> list[subprocess.Popen]:
    port = free_port()
    environ = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
        **env,
    }
    return [
        subprocess.Popen(
            [sys.executable, str(WORKER), case, str(p), str(processes), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environ,
        )
        for p in range(processes)
    ]


def finish(procs: list[subprocess.Popen], timeout_s: float) -> list[tuple[int, list[dict], str]]:
    """Each process's exit code, result lines and stderr tail; all killed past the timeout. Then
    none of the segments they made may be left in /dev/shm."""
    deadline = time.monotonic() + timeout_s
    out = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            lines = [json.loads(s) for s in stdout.splitlines() if s.startswith("{")]
            out.append((proc.returncode, lines, stderr[-3000:]))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.communicate(timeout=10)
        pytest.fail(f"the processes did not finish within {timeout_s:g} s (a hang)")
    prefixes = tuple(
        {r["prefix"] for _, lines, _ in out for r in lines if r.get("result") == "segments"}
    )
    left = sorted(name for name in ours() if prefixes and name.startswith(prefixes))
    assert not left, f"segments left in /dev/shm: {left}"
    return out


@pytest.mark.parametrize(
    "processes, devices, executions, cross_memory",
    [
        (2, 2, "signal,barrier,concurrent,planned", True),
        (4, 1, "signal", True),
        (3, 1, "barrier", False),
        (2, 2, "signal,concurrent", False),
    ],
)
def test_both_ops_across_processes(
    processes: int, devices: int, executions: str, cross_memory: bool
) -> None:
    """Receivers read the senders' rows by cross-memory attach (this machine allows it between
    processes of one user) or, with VARIOPATH_SHM_CMA=0, from the senders' staging."""
    env = {"EXECUTIONS": executions, "VARIOPATH_SHM_CMA": "1" if cross_memory else "0"}
    results = finish(start("ops", processes, devices, **env), timeout_s=150)
    for p, (code, lines, err) in enumerate(results):
        copies = {r["staged_because"] for r in lines if r.get("result") == "copy"}
        assert copies == ({""} if cross_memory else {"VARIOPATH_SHM_CMA=0 in process 0"}), lines
        done = [r["execution"] for r in lines if r.get("result") == "ok"]
        refused = [r["error"] for r in lines if r.get("result") == "refused"]
        assert len(refused) == 2 and all("use transport='shm'" in r for r in refused), lines
        assert code == 0 and done == executions.split(","), (
            f"process {p} (exit {code}): {lines}\n{err}"
        )


@pytest.mark.parametrize(
    "processes, devices, executions, delay",
    [
        (2, 2, "signal,barrier,concurrent,model-aware,planned", "50e-6"),
        (3, 1, "planned,signal,barrier,concurrent", "0"),
    ],
)
def test_host_staged_twin_across_processes(
    processes: int, devices: int, executions: str, delay: str
) -> None:
    """cuda-host on CPU devices: the rows bounced through the host staging by the copies of the
    emulator (random delays, so a missing wait shows as a wrong result) or of memcpy streams,
    in every execution mode; configure names the transport and why."""
    env = {"EXECUTIONS": executions, "TRANSPORT": "cuda-host", "EMULATOR_DELAY_S": delay}
    results = finish(start("ops", processes, devices, **env), timeout_s=240)
    for p, (code, lines, err) in enumerate(results):
        assert code == 0, f"process {p} (exit {code}): {lines}\n{err}"
        copies = [r for r in lines if r.get("result") == "copy"]
        assert {r["transport"] for r in copies} == {"cuda-host"}, lines
        assert all("CPU twin" in r["reason"] and r["staging_budget"] > 0 for r in copies), lines
        done = [r["execution"] for r in lines if r.get("result") == "ok"]
        assert done == executions.split(","), f"process {p}: {lines}\n{err}"


def test_a_call_past_the_staging_budget_fails_naming_it() -> None:
    """A budget of 256 bytes cannot hold a call's staging: every rank's call fails with an error
    naming the budget and the process; 16 KiB holds it (generations are not rounded up past the
    budget), and the call works."""
    results = finish(start("budget", 2, 2, TRANSPORT="cuda-host", TIMEOUT_S="10"), timeout_s=150)
    for p, (code, lines, err) in enumerate(results):
        assert code == 0, f"process {p} (exit {code}): {lines}\n{err}"
        failed = [r for r in lines if r["result"] == "error"]
        assert failed, f"process {p}: the call did not fail: {lines}"
        assert "more than its staging budget of 256 bytes" in failed[0]["error"], failed[0]
        assert "host staging (shared memory) of process" in failed[0]["error"], failed[0]
        ok = [r for r in lines if r["result"] == "ok"]
        assert ok and ok[0]["staging_budget"] == 16384, lines


@pytest.mark.parametrize("transport", ["shm", "cuda-host"])
def test_retired_generations_are_not_kept_mapped(transport: str) -> None:
    """Staged rows ever wider (VARIOPATH_SHM_CMA=0 stages them for shm too): each new generation
    retires the last, and once a call has read a peer's new one, nobody keeps the old mapped."""
    env = {"TRANSPORT": transport, "VARIOPATH_SHM_CMA": "0"}
    results = finish(start("generations", 2, 1, **env), timeout_s=150)
    for p, (code, lines, err) in enumerate(results):
        assert code == 0, f"process {p} (exit {code}): {lines}\n{err}"
        mapped = [r for r in lines if r["result"] == "mapped"]
        assert len(mapped) == 4 and all(r["retired"] == [] for r in mapped), mapped


def test_the_peer_probe_round_gives_every_process_the_same_choice() -> None:
    """configure's round between GPU processes (jax_ops/peers.py) through the key-value store,
    here where no GPU is: every process gets every report, and the same choice and reason."""
    results = finish(start("probe", 3, 1), timeout_s=120)
    said = []
    for p, (code, lines, err) in enumerate(results):
        assert code == 0, f"process {p} (exit {code}): {lines}\n{err}"
        said += [
            (r["processes"], r["transport"], r["reason"]) for r in lines if r["result"] == "probe"
        ]
    assert len(said) == 3 and len(set(said)) == 1, said
    assert said[0][:2] == (3, "cuda-host") and "process 0 could not probe its GPUs" in said[0][2]


def check_survivors(results, victim: int, timeout_s: float) -> None:
    for p, (code, lines, err) in enumerate(results):
        if p == victim:
            continue
        assert code == 0, f"process {p} exited with {code}: {lines}\n{err}"
        failed = [r for r in lines if r["result"] == "error"]
        assert failed, f"process {p}: the call did not fail: {lines}"
        assert f"process {victim} (pid" in failed[0]["error"] and "died" in failed[0]["error"], (
            failed[0]
        )
        assert failed[0]["elapsed"] < timeout_s, failed[0]
        assert any(r["result"] == "usable" and r["value"] == 8.0 for r in lines), lines


TRANSPORTS = pytest.mark.parametrize("transport", ["shm", "cuda-host"])


@TRANSPORTS
def test_a_process_that_exits_fails_the_others_naming_it(transport: str) -> None:
    timeout_s = 20.0
    results = finish(
        start("exit", 3, 1, TIMEOUT_S=str(timeout_s), TRANSPORT=transport), timeout_s=120
    )
    assert results[2][0] == 3, results[2]
    check_survivors(results, victim=2, timeout_s=timeout_s)


@TRANSPORTS
def test_a_process_killed_inside_the_call_fails_the_others_naming_it(transport) -> None:
    timeout_s = 20.0
    procs = start("stall", 2, 2, TIMEOUT_S=str(timeout_s), TRANSPORT=transport)
    victim = procs[1]
    before = ours()
    deadline = time.monotonic() + 120
    staged = set()
    while time.monotonic() < deadline and victim.poll() is None and not staged:
        time.sleep(0.05)  # until the victim has staged its rows: it is inside the call
        staged = {name for name in ours() - before if "-p1-" in name}
    assert staged, "the victim never entered the call"
    time.sleep(1.0)  # it stalls before its first copy; the others wait on it
    victim.send_signal(signal.SIGKILL)
    results = finish(procs, timeout_s=120)
    assert results[1][0] == -signal.SIGKILL
    check_survivors(results, victim=1, timeout_s=timeout_s)


@TRANSPORTS
@pytest.mark.parametrize(
    "execution",
    [
        "signal",  # Algorithm 2's three steps
        # the one-step staged plan the default picks for this demand: its two ops' calls may run
        # in either order on a device, so the ranks skip different ones of the failed program
        "planned",
    ],
)
def test_a_process_stalled_inside_the_call_fails_every_call_and_all_stay_usable(
    transport: str, execution: str
) -> None:
    """The last process stalls before its first copy for three timeouts: the others' calls fail
    naming the stall before it ends, its own fails once it goes on, and the next call works
    everywhere (nothing was left half-done, and the next run's calls meet whatever each rank
    skipped of the failed one: slots are keyed by XLA's run id, shm::Slot)."""
    timeout_s = 4.0
    results = finish(
        start("stalled", 2, 2, TIMEOUT_S=str(timeout_s), TRANSPORT=transport, EXECUTION=execution),
        timeout_s=150,
    )
    stall_s = next(r["seconds"] for r in results[1][1] if r["result"] == "stalling")
    for p, (code, lines, err) in enumerate(results):
        assert code == 0, f"process {p} exited with {code}: {lines}\n{err}"
        failed = [r for r in lines if r["result"] == "error"]
        assert failed, f"process {p}: the call did not fail: {lines}"
        error = failed[0]["error"]
        # the stall, or (the two ops' calls may run in either order on a device) the ranks held
        # in the other op that never came to this one, as the device JAX reports saw it
        assert "timed out after" in error, failed[0]
        assert "a rank stalled" in error or "to join the collective" in error, failed[0]
        if p == 0:  # failed before the stall ends
            assert failed[0]["elapsed"] < stall_s, failed[0]
        assert any(r["result"] == "ok" for r in lines), lines


@TRANSPORTS
def test_a_rank_that_succeeded_where_its_peers_failed_meets_them_at_the_next_call(
    transport: str,
) -> None:
    """One op in the program, the last process's first rank stalled, rank 0 exchanging nothing
    with it: rank 0's call succeeds while its peers' fail (its process still reports the failure
    of its other rank), and the next call works everywhere: calls meet by the program's run id,
    so that a rank which made a different number of calls is not left behind."""
    timeout_s = 4.0
    results = finish(
        start("stalled-apart", 2, 2, TIMEOUT_S=str(timeout_s), TRANSPORT=transport),
        timeout_s=150,
    )
    for p, (code, lines, err) in enumerate(results):
        assert code == 0, f"process {p} exited with {code}: {lines}\n{err}"
        assert any(r["result"] == "error" for r in lines), f"process {p}: no failure: {lines}"
        assert any(r["result"] == "ok" for r in lines), lines


@TRANSPORTS
def test_a_lock_held_past_the_timeout_fails_the_calls_naming_its_holder(transport: str) -> None:
    """The transport's shared lock is bookkeeping only; a holder stopped inside it (here a thread
    of process 1 that keeps it for 3 timeouts) costs every rank at most its timeout per lock
    taken, with an error naming the holder's pid, and the next call after it lets go works."""
    timeout_s = 2.0
    results = finish(
        start("locked", 2, 1, TIMEOUT_S=str(timeout_s), TRANSPORT=transport), timeout_s=150
    )
    pid = next(r["pid"] for r in results[1][1] if r["result"] == "holding")
    for p, (code, lines, err) in enumerate(results):
        assert code == 0, f"process {p} exited with {code}: {lines}\n{err}"
        failed = [r for r in lines if r["result"] == "error"]
        assert failed, f"process {p}: the call did not fail: {lines}"
        assert f"lock was held for more than 2 s by pid {pid}" in failed[0]["error"], failed[0]
        assert failed[0]["elapsed"] < 4 * timeout_s, failed[0]
        assert any(r["result"] == "ok" for r in lines), lines


def test_a_rank_whose_lock_timed_out_in_a_call_leaves_its_slot() -> None:
    """Process 1 takes the shared lock while process 0's rank waits in a call's slot for it: that
    rank's lock times out inside the call (an error naming the holder) and it leaves the slot at
    its process's next call, which works; else 64 such calls would exhaust the control segment."""
    timeout_s = 2.0
    results = finish(start("slot", 2, 1, TIMEOUT_S=str(timeout_s)), timeout_s=150)
    for p, (code, lines, err) in enumerate(results):
        assert code == 0, f"process {p} exited with {code}: {lines}\n{err}"
        failed = [r for r in lines if r["result"] == "error"]
        assert failed and "lock was held for more than 2 s" in failed[0]["error"], lines
        slots = {r["when"]: r["value"] for r in lines if r["result"] == "slots"}
        assert slots == {"after the failed call": 1, "after the next call": 0}, lines
