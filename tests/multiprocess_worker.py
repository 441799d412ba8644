"""One process of a multi-process run of the op (tests/test_multiprocess.py and
benchmarks/bench_multiprocess.py start several): ``python multiprocess_worker.py CASE PROCESS
PROCESSES PORT``, with XLA_FLAGS giving its CPU device count. Prints one JSON line (``"result"``)
per outcome; never waits without a timeout.

Cases: ``ops`` (both ops, several execution modes, several calls of two call sites, checked
against NumPy; on CPU devices over shm, on GPUs over cuda-ipc or cuda-host: gpu_check.py),
``exit`` (the last process os._exit()s after configure: the others must fail naming it),
``stall`` (the last process stalls inside the call; the test SIGKILLs it there), ``stalled``
(the last process stalls inside the call for three timeouts: every process's call fails, the
others' within the stall, and all stay usable), ``stalled-apart`` (the same with one op, where
rank 0 exchanges nothing with the stalled rank and succeeds), ``locked`` (a thread of the last process keeps
the transport's lock: every call fails naming it within the timeout, and once it lets go the
next call works), ``generations`` (the staging grows by generations and no retired one stays
mapped), ``probe`` (configure's peer-access round: every process gets the same choice),
``budget`` (a staging budget too small for the call fails it naming the budget in every process;
one that fits works), ``slot`` (process 1 takes the lock while process 0's rank waits in a call's
slot: that rank's lock times out there, and it leaves the slot at its next call). Each process
says what its segments' names begin with once it configured (``"segments"``), so the test looks
for leaks among its own segments only.

``TRANSPORT`` picks the transport (default: configure's; ``cuda-host`` on CPU devices is its CPU
twin, whose copies run on the emulator with delays of up to ``EMULATOR_DELAY_S``);
``EXECUTION`` the execution the failure cases configure (default: configure's, ``planned``).
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

CASE, ME, COUNT, PORT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
jax.distributed.initialize(
    f"127.0.0.1:{PORT}", num_processes=COUNT, process_id=ME, initialization_timeout=60
)
print(json.dumps({"process": ME, "result": "initialized"}), flush=True)  # JAX took the processes

from variopath_jax import _native  # noqa: E402
from variopath_jax.errors import VarioPathError  # noqa: E402
from variopath_jax.jax_ops import (  # noqa: E402
    _compat,
    all_to_all_v,
    configure,
    ragged_all_to_all,
    release,
)

N = jax.device_count()
CPU = jax.local_devices()[0].platform == "cpu"  # else GPUs: the cuda-ipc transport (gpu_check.py)
MESH = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
ROWS, CAP = 12, 40  # all_to_all_v rows per rank; ragged output rows per rank
TRANSPORT = os.environ.get("TRANSPORT") or None
EMULATOR_DELAY_S = float(os.environ.get("EMULATOR_DELAY_S", "50e-6"))


def say(**fields) -> None:
    print(json.dumps({"process": ME, **fields}), flush=True)


def put(a: np.ndarray):
    """The global array `a` sharded over the mesh by its leading axis (each process gives its own shards)."""
    return jax.make_array_from_callback(a.shape, NamedSharding(MESH, P("x")), lambda idx: a[idx])


def local(y) -> dict[int, np.ndarray]:
    """This process's shards of a result, by mesh position."""
    per = y.shape[0] // N
    return {s.index[0].start // per: np.asarray(s.data) for s in y.addressable_shards}


def exchange():
    def body(x, c, o, out, io, ss, oo, rs):
        y, rc = all_to_all_v(x, c[0], axis_name="x")
        z = ragged_all_to_all(o, out, io[0], ss[0], oo[0], rs[0], axis_name="x")
        return y, rc[None], z

    return jax.jit(jax.shard_map(body, mesh=MESH, in_specs=(P("x"),) * 8, out_specs=(P("x"),) * 3))


def demand(seed: int, apart: tuple[int, int] | None = None):
    """Global inputs of one call of both ops and what NumPy says each rank gets (``apart``: two
    ranks that send each other no row of ``all_to_all_v``)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 4, size=(N, N))
    counts[:, 0] = np.minimum(counts[:, 0], 1)  # rank 0 receives at most N rows: never over ROWS
    if apart:
        counts[apart[0], apart[1]] = counts[apart[1], apart[0]] = 0
    x = rng.standard_normal((N, ROWS, 2)).astype(np.float32)
    want_y = np.zeros((N, ROWS, 2), np.float32)
    for j in range(N):
        rows = [x[i, counts[i, :j].sum() : counts[i, : j + 1].sum()] for i in range(N)]
        got = np.concatenate(rows)[:ROWS]
        want_y[j, : len(got)] = got
    send = rng.integers(0, 3, size=(N, N))
    in_off = np.concatenate([np.zeros((N, 1), int), np.cumsum(send, 1)[:, :-1]], 1)
    out_off = np.zeros_like(send)
    recv = send.T.copy()
    for j in range(N):  # receiver j: slices in source order, a gap of one row after each
        pos = 1
        for i in range(N):
            out_off[i, j] = pos
            pos += send[i, j] + 1
    operand = rng.standard_normal((N, ROWS, 2)).astype(np.float32)
    output = rng.standard_normal((N, CAP, 2)).astype(np.float32)
    want_z = output.copy()
    for i in range(N):
        for j in range(N):
            want_z[j, out_off[i, j] : out_off[i, j] + send[i, j]] = operand[
                i, in_off[i, j] : in_off[i, j] + send[i, j]
            ]
    flat = lambda a: a.reshape(N * a.shape[1], *a.shape[2:])  # noqa: E731
    args = [flat(x), counts.astype(np.int32), flat(operand), flat(output)]
    args += [a.astype(np.int32) for a in (in_off, send, out_off, recv)]
    return [put(a) for a in args], (want_y, counts.T.astype(np.int32), want_z)


def case_ops() -> None:
    for transport in ("memcpy", "cuda-ipc" if CPU else "shm"):  # what cannot work here is refused
        try:
            configure(devices=N, transport=transport)
            say(result=f"{transport} accepted")
        except VarioPathError as err:
            say(result="refused", error=str(err))
    for execution in os.environ.get("EXECUTIONS", "signal,barrier,concurrent").split(","):
        cfg = configure(
            devices=N,
            execution=execution,
            timeout_s=30.0,
            transport=TRANSPORT,
            emulator_delay_s=EMULATOR_DELAY_S,
        )
        say(result="segments", prefix=_native.shm_segment_prefix(cfg.id))
        say(
            result="copy",
            staged_because=_native.shm_staged_because(cfg.id),
            **_native.op_config_transport(cfg.id),
        )
        f = exchange()
        for call in range(3):
            args, (want_y, want_rc, want_z) = demand(100 * call + 7)
            y, rc, z = f(*args)
            for name, got, want in (
                ("y", y, want_y),
                ("recv_counts", rc, want_rc),
                ("z", z, want_z),
            ):
                for r, block in local(got).items():
                    np.testing.assert_array_equal(
                        block.reshape(want[r].shape),
                        want[r],
                        err_msg=f"{execution} call {call} {name} rank {r}",
                    )
        release(cfg)
        say(result="ok", execution=execution)


def call_expecting_an_error(f, args) -> None:
    """Say how the call failed (its error and how long it took), or that it did not."""
    start = time.monotonic()
    try:
        jax.block_until_ready(f(*args))
        say(result="no error")
    except Exception as err:  # XlaRuntimeError carrying the op's message
        say(result="error", error=str(err)[-600:], elapsed=time.monotonic() - start)


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie its parent has not reaped yet has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def zero_exits_last() -> None:
    """Process 0 runs the key-value store, whose end aborts the processes still attached to it:
    it exits once the others have (waiting at most 60 s)."""
    client = _compat.distributed_client()[0]
    try:
        client.key_value_set(f"leaving/{ME}", str(os.getpid()))
    except Exception:  # its answer lost as process 0 leaves: the key is there
        return
    if ME == 0:
        deadline = time.monotonic() + 60
        for p in range(1, COUNT):
            pid = int(client.blocking_key_value_get(f"leaving/{p}", 60_000))
            while not gone(pid) and time.monotonic() < deadline:
                time.sleep(0.01)


def leave(cfg, everyone: bool = False) -> None:
    """Release the configuration and exit at once (jax.distributed's shutdown barrier would wait
    for a dead process). With ``everyone`` alive, process 0, which runs the key-value store,
    exits last (the others' pending requests to it would abort them)."""
    if everyone:
        zero_exits_last()
    release(cfg)
    _native.shm_release_all()
    sys.stdout.flush()
    os._exit(0)


def failing_call(cfg, victim: int) -> None:
    """The survivors' side: the call must fail, naming the victim, within the timeout."""
    f = exchange()
    args, _ = demand(1)
    call_expecting_an_error(f, args)
    # still usable: a computation of its own, and the release of the configuration
    say(result="usable", value=float(jax.jit(lambda a: (a * 2).sum())(np.ones(4, np.float32))))
    leave(cfg)


def barrier(name: str) -> None:
    """Wait until every process got here (through the key-value store, at most 60 s)."""
    client = _compat.distributed_client()[0]
    client.key_value_set(f"{name}/{ME}", "1")
    for p in range(COUNT):
        client.blocking_key_value_get(f"{name}/{p}", 60_000)


def configured(**kwargs):
    """Configure, then wait until every process has (so that the victim dies after that)."""
    cfg = configure(
        devices=N,
        timeout_s=float(os.environ.get("TIMEOUT_S", "10")),
        transport=TRANSPORT,
        execution=os.environ.get("EXECUTION", "planned"),
        emulator_delay_s=EMULATOR_DELAY_S,
        **kwargs,
    )
    say(result="segments", prefix=_native.shm_segment_prefix(cfg.id))
    barrier("configured")
    return cfg


def case_exit() -> None:
    cfg = configured()
    victim = COUNT - 1
    if victim == ME:
        say(result="exiting", pid=os.getpid())
        os._exit(3)
    time.sleep(0.5)  # let it go first
    failing_call(cfg, victim)


def case_stall() -> None:
    cfg = configured()
    victim = COUNT - 1
    if victim == ME:
        position = list(MESH.devices.flat).index(jax.local_devices()[0])
        _native.inject_stall(position, 0, 60.0)  # before the first transfer it pulls
        say(result="stalling", pid=os.getpid())
        f = exchange()
        args, _ = demand(1)
        jax.block_until_ready(f(*args))  # killed in here by the test
        say(result="not killed")
        os._exit(0)
    failing_call(cfg, victim)


def case_stalled() -> None:
    cfg = configured()
    victim, stall_s = COUNT - 1, 3 * cfg.timeout_s
    if victim == ME:
        position = list(MESH.devices.flat).index(jax.local_devices()[0])
        _native.inject_stall(position, 0, stall_s)  # before the first transfer it pulls
        say(result="stalling", pid=os.getpid(), seconds=stall_s)
    f = exchange()
    args, (want_y, _, _) = demand(5)
    call_expecting_an_error(f, args)
    if victim == ME:
        _native.inject_stall(-1, 0, 0.0)
    barrier("failed")  # every process may go on: the next call works
    y, _, _ = f(*args)
    for r, block in local(y).items():
        np.testing.assert_array_equal(block.reshape(want_y[r].shape), want_y[r])
    say(result="ok")
    leave(cfg, everyone=True)


def case_stalled_apart() -> None:
    """As ``stalled``, with ``all_to_all_v`` alone in the program and rank 0 exchanging nothing
    with the stalled rank: rank 0's call succeeds where its peers' fail, and the next call still
    works everywhere (calls meet by XLA's run id, not by how many each rank made)."""
    cfg = configured()
    victim, stall_s = COUNT - 1, 3 * cfg.timeout_s
    stalled = victim * (N // COUNT)  # the victim's first device
    if victim == ME:
        assert list(MESH.devices.flat).index(jax.local_devices()[0]) == stalled
        _native.inject_stall(stalled, 0, stall_s)  # before the first transfer it pulls
        say(result="stalling", pid=os.getpid(), seconds=stall_s)
    f = jax.jit(
        jax.shard_map(
            lambda x, c: all_to_all_v(x, c[0], axis_name="x"),
            mesh=MESH,
            in_specs=(P("x"),) * 2,
            out_specs=(P("x"),) * 2,
        )
    )
    args, (want_y, _, _) = demand(5, apart=(0, stalled))
    call_expecting_an_error(f, args[:2])
    if victim == ME:
        _native.inject_stall(-1, 0, 0.0)
    barrier("failed")
    y, _ = f(*args[:2])
    for r, block in local(y).items():
        np.testing.assert_array_equal(block.reshape(want_y[r].shape), want_y[r])
    say(result="ok")
    leave(cfg, everyone=True)


def case_budget() -> None:
    """Too small a budget fails the call naming it in every process; one that fits works."""
    small = configured(staging_budget=256)
    f = exchange()
    args, (want_y, _, want_z) = demand(9)
    call_expecting_an_error(f, args)
    release(small)
    cfg = configure(
        devices=N,
        timeout_s=small.timeout_s,
        transport=TRANSPORT,
        emulator_delay_s=EMULATOR_DELAY_S,
        staging_budget=16384,
    )
    say(result="segments", prefix=_native.shm_segment_prefix(cfg.id))
    y, _, z = exchange()(*args)
    for r, block in local(y).items():
        np.testing.assert_array_equal(block.reshape(want_y[r].shape), want_y[r])
    for r, block in local(z).items():
        np.testing.assert_array_equal(block.reshape(want_z[r].shape), want_z[r])
    say(result="ok", **_native.op_config_transport(cfg.id))
    leave(cfg, everyone=True)


def retired_mappings() -> list[str]:
    """The staging segments mapped in this process whose owner removed them (retired)."""
    with open("/proc/self/maps") as maps:
        return sorted(
            {ln.split()[-2] for ln in maps if "/vpjax-" in ln and "-p" in ln and "(deleted)" in ln}
        )


def case_generations() -> None:
    """Rows ever wider make the staging grow by generations (64 KiB, 128 KiB, ..., 2 MiB); after
    each call no process keeps a retired generation mapped (pinned, for cuda-host)."""
    cfg = configured()
    f = jax.jit(
        jax.shard_map(
            lambda x, c: all_to_all_v(x, c[0], axis_name="x")[0],
            mesh=MESH,
            in_specs=(P("x"), P("x")),
            out_specs=P("x"),
        )
    )
    counts = np.full((N, N), ROWS // N, np.int32)
    for width in (16, 4096, 16384, 65536):
        x = np.arange(N * ROWS * width, dtype=np.float32).reshape(N * ROWS, width)
        y = local(f(put(x), put(counts)))
        for r, block in y.items():
            want = np.concatenate([x[i * ROWS + r * (ROWS // N) :][: ROWS // N] for i in range(N)])
            np.testing.assert_array_equal(block, want, err_msg=f"width {width} rank {r}")
        barrier(f"called/{width}")  # no peer has left (removing its live segments)
        say(result="mapped", width=width, retired=retired_mappings())
        barrier(f"checked/{width}")
    say(result="ok")
    leave(cfg, everyone=True)


def case_probe() -> None:
    """configure's peer-access round between these processes: the same reports, hence the same
    choice and reason, in every process (here without GPUs: cuda-host, naming the probe's error)."""
    from variopath_jax.jax_ops import peers

    reports = peers.gather([0], 30.0)
    transport, reason = peers.choose(reports)
    say(result="probe", processes=len(reports), transport=transport, reason=reason)
    zero_exits_last()
    sys.stdout.flush()
    os._exit(0)


def leave_after_hold(cfg) -> None:
    """Release and exit once this process's segments are gone: the thread that held the lock
    (shm_hold_lock) keeps the transport until it has let go, and removes them then."""
    prefix = _native.shm_segment_prefix(cfg.id) + f"p{ME}-"
    release(cfg)
    _native.shm_release_all()
    deadline = time.monotonic() + 30
    while any(n.startswith(prefix) for n in os.listdir("/dev/shm")) and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.stdout.flush()
    os._exit(0)


def case_locked() -> None:
    cfg = configured()
    client = _compat.distributed_client()[0]
    victim, hold_s = COUNT - 1, 3 * cfg.timeout_s
    if victim == ME:
        _native.shm_hold_lock(cfg.id, hold_s)
        released = time.monotonic() + hold_s
        say(result="holding", pid=os.getpid())
        client.key_value_set("held", "1")
    client.blocking_key_value_get("held", 60_000)
    f = exchange()
    args, (want_y, _, want_z) = demand(3)
    call_expecting_an_error(f, args)
    if victim == ME:
        time.sleep(max(0.0, released - time.monotonic()) + 0.5)
        client.key_value_set("released", "1")
    client.blocking_key_value_get("released", 120_000)
    y, _, z = f(*args)
    for r, block in local(y).items():
        np.testing.assert_array_equal(block.reshape(want_y[r].shape), want_y[r])
    for r, block in local(z).items():
        np.testing.assert_array_equal(block.reshape(want_z[r].shape), want_z[r])
    say(result="ok")
    leave_after_hold(cfg)


def case_slot() -> None:
    cfg = configured()
    client = _compat.distributed_client()[0]
    f = exchange()
    args, (want_y, _, want_z) = demand(3)
    jax.block_until_ready(f(*args))  # compiled, and a first call made and left by both
    barrier("warm")
    if ME == 0:
        client.key_value_set("calling", "1")
    else:
        client.blocking_key_value_get("calling", 60_000)
        deadline = time.monotonic() + 60
        while _native.shm_slots_in_use(cfg.id) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # until process 0's rank has joined the call and waits for this one
        _native.shm_hold_lock(cfg.id, 2 * cfg.timeout_s)
        released = time.monotonic() + 2 * cfg.timeout_s
    call_expecting_an_error(f, args)
    if ME == 1:
        time.sleep(max(0.0, released - time.monotonic()) + 0.5)
        client.key_value_set("released", "1")
    client.blocking_key_value_get("released", 120_000)
    barrier("failed")
    say(result="slots", when="after the failed call", value=_native.shm_slots_in_use(cfg.id))
    barrier("counted")
    y, _, z = f(*args)  # the next call: process 0's rank leaves the old slot first
    for r, block in local(y).items():
        np.testing.assert_array_equal(block.reshape(want_y[r].shape), want_y[r])
    for r, block in local(z).items():
        np.testing.assert_array_equal(block.reshape(want_z[r].shape), want_z[r])
    barrier("done")
    say(result="slots", when="after the next call", value=_native.shm_slots_in_use(cfg.id))
    zero_exits_last()  # the coordinator's process leaves last: the others still talk to it
    leave_after_hold(cfg)


if __name__ == "__main__":
    try:
        cases = {
            "ops": case_ops,
            "exit": case_exit,
            "stall": case_stall,
            "stalled": case_stalled,
            "stalled-apart": case_stalled_apart,
            "locked": case_locked,
            "budget": case_budget,
            "generations": case_generations,
            "probe": case_probe,
            "slot": case_slot,
        }
        cases[CASE]()
    except BaseException:  # report it; a normal exit would wait at jax.distributed's shutdown
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        _native.shm_release_all()
        os._exit(1)
