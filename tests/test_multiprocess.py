"""The op across several JAX processes on one host (issue 16): jax.distributed with a local
coordinator, 2-4 processes of 1-2 CPU devices each, the shared-memory transport. Both ops
against NumPy in several execution modes, over several calls of two call sites; a process that
exits, or is killed inside the call, gives the others a clear error naming it within their
timeout; a rank whose lock timed out inside a call leaves its slot; none of the segments the
processes made (they say what their names begin with) is left in /dev/shm, whatever else shares
it. Every process runs tests/multiprocess_worker.py, and every wait for one has a timeout."""

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
        {r["prefix"] for _, lines, _ in out for r in lines if r["result"] == "segments"}
    )
    left = sorted(name for name in ours() if prefixes and name.startswith(prefixes))
    assert not left, f"segments left in /dev/shm: {left}"
    return out


@pytest.mark.parametrize(
    "processes, devices, executions, cross_memory",
    [
        (2, 2, "signal,barrier,concurrent", True),
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


def test_a_process_that_exits_fails_the_others_naming_it() -> None:
    timeout_s = 20.0
    results = finish(start("exit", 3, 1, TIMEOUT_S=str(timeout_s)), timeout_s=120)
    assert results[2][0] == 3, results[2]
    check_survivors(results, victim=2, timeout_s=timeout_s)


def test_a_process_killed_inside_the_call_fails_the_others_naming_it() -> None:
    timeout_s = 20.0
    procs = start("stall", 2, 2, TIMEOUT_S=str(timeout_s))
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


def test_a_lock_held_past_the_timeout_fails_the_calls_naming_its_holder() -> None:
    """The transport's shared lock is bookkeeping only; a holder stopped inside it (here a thread
    of process 1 that keeps it for 3 timeouts) costs every rank at most its timeout per lock
    taken, with an error naming the holder's pid, and the next call after it lets go works."""
    timeout_s = 2.0
    results = finish(start("locked", 2, 1, TIMEOUT_S=str(timeout_s)), timeout_s=150)
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
