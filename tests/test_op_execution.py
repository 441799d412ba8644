"""How the JAX op executes what it plans (ffi/collective.cc), on 8 forced CPU host devices: each
execution mode gives the right rows and executes exactly the schedule the planner makes for it;
the rendezvous survives a rank stalling mid-exchange without anybody writing into a returned
rank's buffers; configurations are identified by their content."""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np
import pytest
from helpers import tiny4
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from variopath_jax import _native
from variopath_jax.catalog import get_catalog
from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import all_to_all_v, configure, last_schedule
from variopath_jax.jax_ops import config as op_config
from variopath_jax.jax_ops.config import EXECUTIONS, op_plan, release
from variopath_jax.planner import PlannerParams
from variopath_jax.planner.native import NativePlanner
from variopath_jax.planner.schedulers import chooser_for
from variopath_jax.schedule import Schedule, signal_driven
from variopath_jax.schedulers import PlanRequest, get_scheduler, unprofiled_networks
from variopath_jax.sim import PCIE
from variopath_jax.sim.network import load_network
from variopath_jax.solver.phases import phased
from variopath_jax.topology import PathModel

N = 8
pytestmark = pytest.mark.skipif(jax.device_count() < N, reason="needs 8 host devices (XLA_FLAGS)")


def exchanger(config=None):
    """all_to_all_v of x (N, rows, ...) with counts[i, j] rows from i to j, on an 8-device mesh,
    compiled once."""
    mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))

    def body(xb, cb):
        return all_to_all_v(xb, cb[0], axis_name="x", config=config)[0]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))  # noqa: E731

    def run(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
        y = f(put(x.reshape(N * x.shape[1], *x.shape[2:])), put(counts.astype(np.int32)))
        return np.asarray(y).reshape(x.shape)

    return run


def exchange(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    return exchanger()(x, counts)


def expected_rows(x: np.ndarray, counts: np.ndarray) -> np.ndarray:
    y = np.zeros_like(x)
    for j in range(N):
        got = np.concatenate(
            [x[i, counts[i, :j].sum() : counts[i, :j].sum() + counts[i, j]] for i in range(N)]
        )
        y[j, : len(got)] = got
    return y


def executed(log: dict) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """The logged transfers as (src, dst, bytes, transfers waited for), in execution order."""
    ptr, after = log["after_ptr"], log["after"]
    return [
        (int(s), int(d), int(b), tuple(int(a) for a in after[ptr[t] : ptr[t + 1]]))
        for t, (s, d, b) in enumerate(zip(log["src"], log["dst"], log["bytes"], strict=True))
    ]


def planned(schedule, barrier: bool) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """A schedule's transfers in the same form: dependencies as indices into the flat order
    (barrier: every transfer of the previous step)."""
    first, at = [], 0
    for st in schedule.steps:
        first.append(at)
        at += len(st.transfers)
    out = []
    for s, st in enumerate(schedule.steps):
        for t in st.transfers:
            if barrier:
                deps = tuple(range(first[s - 1], first[s])) if s else ()
            else:
                deps = tuple(sorted(first[a] + k for a, k in t.after))
            out.append((t.src, t.dst, t.nbytes, deps))
    return out


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_each_execution_runs_the_planned_schedule(execution: str) -> None:
    cfg = configure("r5080-bf3", execution=execution, debug=True)
    try:
        rng = np.random.default_rng(11)
        counts = rng.integers(0, 5, size=(N, N))
        x = rng.standard_normal((N, 32, 8)).astype(np.float32)
        np.testing.assert_array_equal(exchange(x, counts), expected_rows(x, counts))
        log = last_schedule()
        assert log["execution"] == getattr(_native.Execution, execution.upper().replace("-", "_"))
        demand = counts * 8 * 4
        np.fill_diagonal(demand, 0)
        assert np.array_equal(log["demand"].reshape(N, N), demand)
        model = PathModel(cfg.topology)
        paper = NativePlanner(get_catalog(cfg.topology), model, PlannerParams()).plan(demand)
        if execution in ("planned", "model-aware"):
            # the op's default: robust, the C++ choice either way
            request = PlanRequest(demand, model, PCIE.barrier_s)
            schedule = get_scheduler("variopath").plan(request)
            plan = op_plan(schedule)
            want = executed({**plan, **{k: np.asarray(v) for k, v in plan.items()}})
            paced = schedule.meta.get("paced", False)
            assert log["pace_gbs"].tolist() == plan["pace_gbs"] and paced == (
                plan["pace_gbs"][0] > 0
            )
        else:
            want = {
                "barrier": lambda: planned(paper, barrier=True),
                "signal": lambda: planned(signal_driven(paper), barrier=False),
                "concurrent": lambda: planned(
                    chooser_for(model, PlannerParams()).apply(
                        _native.Decision("concurrent"), demand, (PCIE,)
                    ),
                    barrier=False,
                ),
            }[execution]()
            assert not log["pace_gbs"].any()
        assert executed(log) == want
        if execution == "signal":  # the planner's activations overlap: not everything waits
            assert any(len(d) < 4 for *_, d in want[N:])
    finally:
        configure(devices=N)


# every family the op runs (rot-paced is built where an uplink writes toward two root complexes:
# direct-8, not r5080-bf3), and phased, the hybrid MILP's warm start
FAMILIES = (*_native.FAMILIES, "phased")


def family_plan(family: str, model: PathModel, demand: np.ndarray) -> Schedule:
    """The plan of ``family`` for a demand: the C++ core's (``NativeChooser.apply``, every
    family the ``variopath`` scheduler chooses among), or ``phased`` (solver/phases.py, the
    hybrid MILP's warm start, emitted as the MILP emits its plans)."""
    if family == "phased":
        return phased(model, demand, PCIE.barrier_s)
    chooser = chooser_for(model, PlannerParams(lambda_s=PCIE.barrier_s))
    schedule = chooser.apply(_native.Decision(family), demand, (PCIE,))
    assert schedule.meta["plan"] == family  # built, not the fallback
    return schedule


@pytest.mark.parametrize(
    ("family", "transport", "topology"),  # direct-8: chains in a step
    [
        (family, transport, topology)
        for topology in ("r5080-bf3", "direct-8")
        for transport in ("memcpy", "emulated")
        for family in FAMILIES
        if family != "rot-paced" or topology == "direct-8"
    ],
)
def test_planned_executes_every_family_as_planned(
    family: str, transport: str, topology: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever family a plan is of, the op executes it as planned (the executor is the same for
    every producer: here the callback of ``execution="model-aware"``, made to return the family):
    the same transfers in the same order, each waiting for exactly its planned dependencies
    (begun only after they ended), at its planned cap; a sender's paced transfers of one step
    that wait for none of that step are in flight together (each begun before any ended)."""
    monkeypatch.setattr(
        op_config,
        "_model_aware_planner",
        lambda model, *_: lambda demand: op_plan(family_plan(family, model, np.asarray(demand))),
    )
    cfg = configure(topology, execution="model-aware", transport=transport, debug=True)
    try:
        rng = np.random.default_rng(5)
        counts = rng.integers(64, 512, size=(N, N))
        x = rng.standard_normal((N, 4096, 64)).astype(np.float32)
        np.testing.assert_array_equal(exchange(x, counts), expected_rows(x, counts))
        log = last_schedule()
        assert log["execution"] == _native.Execution.MODEL_AWARE
        demand = counts * 64 * 4
        np.fill_diagonal(demand, 0)
        plan = op_plan(family_plan(family, PathModel(cfg.topology), demand))
        assert executed(log) == executed({k: np.asarray(v) for k, v in plan.items()})
        assert log["pace_gbs"].tolist() == plan["pace_gbs"]
        assert np.array_equal(log["step_ptr"], plan["step_ptr"])
        began, ended, ptr = log["began"], log["ended"], log["after_ptr"]
        for t in range(len(began)):
            for d in log["after"][ptr[t] : ptr[t + 1]]:
                assert began[t] > ended[d], (t, d)
        steps = np.searchsorted(log["step_ptr"], np.arange(len(began)), side="right") - 1
        for src in range(N):  # its batches: runs of one step's sends; a chained one alone
            batches: list[list[int]] = []
            alone = False  # the last one waited for a transfer of its own step
            for t in np.flatnonzero(log["src"] == src):
                chained = any(steps[d] == steps[t] for d in log["after"][ptr[t] : ptr[t + 1]])
                if not batches or chained or alone or steps[batches[-1][0]] != steps[t]:
                    batches.append([])
                batches[-1].append(t)
                alone = chained
            for batch in batches:
                paced_ones = [t for t in batch if log["pace_gbs"][t] > 0]
                if len(paced_ones) > 1:
                    assert max(began[paced_ones]) < min(ended[paced_ones]), (src, batch)
    finally:
        configure(devices=N)


@pytest.mark.parametrize(
    "network,per_pair,plan",
    [("pcie-fair", 32768, "paced"), (None, 64, None), ("pcie", 16384, None)],
)
def test_planned_executes_the_cpp_choice(network: str | None, per_pair: int, plan) -> None:
    """The default execution runs the C++ core's choice (no Python on the call path), decided
    ahead: a call site's first call runs the safe plan (staged), the next one the decision made
    from the first one's demand, applied to its own: the same transfers, dependencies and caps as
    ``NativeChooser.apply`` of ``NativeChooser.decide`` for the configured models, with every row
    where NumPy puts it."""
    cfg = configure("r5080-bf3", network=network, debug=True)
    try:
        counts = np.random.default_rng(9).integers(per_pair // 2, per_pair, size=(N, N))
        x = np.random.default_rng(3).standard_normal((N, int(counts.sum(1).max()), 8))
        x = x.astype(np.float32)
        demand = counts * 8 * 4
        np.fill_diagonal(demand, 0)
        model = PathModel(cfg.topology)
        chooser = chooser_for(model, PlannerParams())
        networks = (load_network(network),) if network else unprofiled_networks(PCIE.barrier_s)
        decision, _ = chooser.decide(demand, networks)
        for call, want_plan in enumerate(("staged", decision.plan)):
            np.testing.assert_array_equal(exchange(x, counts), expected_rows(x, counts))
            log = last_schedule()
            assert log["execution"] == _native.Execution.PLANNED
            assert log["plan"] == want_plan, call
            applied = chooser.apply(decision if call else _native.safe_decision(), demand, networks)
            want = op_plan(applied)
            assert executed(log) == executed({k: np.asarray(v) for k, v in want.items()})
            assert log["pace_gbs"].tolist() == want["pace_gbs"]
        assert decision.plan == (plan or decision.plan)
    finally:
        configure(devices=N)


def test_configuration_ids_come_from_content() -> None:
    a = configure("r5080-bf3", execution="barrier")
    b = configure("r5080-bf3", execution="barrier")
    c = configure("r5080-bf3", execution="barrier", params=PlannerParams(seed=1))
    d = configure("r5080-bf3", execution="signal")
    try:
        assert a.id == b.id and len({a.id, c.id, d.id}) == 3
        run = exchanger(a)
        x, counts = np.ones((N, 8, 2), np.float32), np.ones((N, N), np.int64)
        np.testing.assert_array_equal(run(x, counts), x)
        release(a)
        with pytest.raises(Exception, match=r"configuration .* is not registered"):
            run(x, counts)
        with pytest.raises(VarioPathError, match="execution must be one of"):
            configure("r5080-bf3", execution="eager")
        # the models model-aware plans for: default the unprofiled two, any list the same
        robust = configure("r5080-bf3", execution="model-aware")
        listed = configure("r5080-bf3", execution="model-aware", network=["pcie", "pcie-fair"])
        joined = configure("r5080-bf3", execution="model-aware", network="pcie,pcie-fair")
        one = configure("r5080-bf3", execution="model-aware", network="pcie")
        assert robust.id == listed.id == joined.id != one.id
        with pytest.raises(VarioPathError, match="unknown network model 'pcie2'"):
            configure("r5080-bf3", execution="model-aware", network="pcie,pcie2")
    finally:
        configure(devices=N)


# ----- the rendezvous under faults (outside XLA: exchange_on_threads) -------------------------
ROW = 16  # bytes per row
PAD = 64  # canary bytes before and after every buffer
CANARY, POISON = 0xA5, 0xEE


def buffers(rows: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Per rank: an input and an output of `rows` rows inside canary-filled arenas."""
    rng = np.random.default_rng(seed)
    arenas, inputs, outputs = [], [], []
    for _ in range(N):
        for views in (inputs, outputs):
            arena = np.full(rows * ROW + 2 * PAD, CANARY, dtype=np.uint8)
            arena[PAD:-PAD] = rng.integers(0, 255, rows * ROW, dtype=np.uint8)
            arenas.append(arena)
            views.append(arena[PAD:-PAD])
    return arenas, inputs, outputs


@pytest.mark.parametrize("transport", ["memcpy", "shm", "cuda-host"])
def test_exchange_on_threads_moves_the_rows(transport: str) -> None:
    cfg = configure("r5080-bf3", transport=transport, timeout_s=10.0)
    try:
        rng = np.random.default_rng(2)
        counts = rng.integers(0, 4, size=(N, N))
        rows = int(max(counts.sum(axis=0).max(), counts.sum(axis=1).max()))
        arenas, inputs, outputs = buffers(rows, 3)
        sent = [a.copy().reshape(rows, ROW) for a in inputs]
        errors = _native.exchange_on_threads(cfg.id, 1, inputs, outputs, counts.tolist(), ROW, -1)
        assert errors == [""] * N
        starts = np.cumsum(counts, axis=1) - counts  # where i's rows for j begin
        for j in range(N):
            start = starts[:, j]
            got = np.concatenate([sent[i][start[i] : start[i] + counts[i, j]] for i in range(N)])
            np.testing.assert_array_equal(outputs[j].reshape(rows, ROW)[: len(got)], got)
            assert not outputs[j].reshape(rows, ROW)[len(got) :].any()  # zero past the rows
        for arena in arenas:
            assert (arena[:PAD] == CANARY).all() and (arena[-PAD:] == CANARY).all()
    finally:
        configure(devices=N)


def asymmetric_tiny4():
    """helpers.tiny4 with every GPU's link to its switch half as fast down as up (as a measured
    topology may have it; every GPU alike, so the rank groups stay equal)."""
    topo = tiny4()
    devices = tuple(
        dataclasses.replace(d, down_gbs=d.up_gbs / 2) if d.kind == "gpu" else d
        for d in topo.node.devices
    )
    node = dataclasses.replace(topo.node, devices=devices)
    return dataclasses.replace(topo, node=node, name="tiny-4-asymmetric", _graph_cache={})


@pytest.mark.parametrize("symmetric", [True, False])
def test_a_chosen_plan_is_reversed_for_the_transposed_demand_only_on_symmetric_links(
    symmetric: bool,
) -> None:
    """The op serves the transposed demand (a combine after its dispatch) with the cached plan
    reversed, pacing caps kept: only where every link is the same both ways; on links that
    differ by direction it plans the transposed demand anew. The rows arrive either way."""
    topo = tiny4() if symmetric else asymmetric_tiny4()
    assert topo.graph.symmetric == symmetric
    n = topo.num_ranks
    cfg = configure(topo, execution="planned", transport="memcpy", timeout_s=10.0)
    try:
        counts = np.array([[0, 9, 3, 5], [2, 0, 7, 1], [4, 6, 0, 8], [1, 3, 2, 0]])
        for k, sent_counts in enumerate((counts, counts.T.copy())):
            rows = int(max(sent_counts.sum(axis=0).max(), sent_counts.sum(axis=1).max()))
            rng = np.random.default_rng(k)
            inputs = [rng.integers(0, 255, rows * ROW, dtype=np.uint8) for _ in range(n)]
            outputs = [np.zeros(rows * ROW, np.uint8) for _ in range(n)]
            before = np.asarray(_native.plan_counts())
            errors = _native.exchange_on_threads(  # two sites' first calls: one decision
                cfg.id, 1 + k, inputs, outputs, sent_counts.tolist(), ROW, -1
            )
            planned, _, reversed_ = np.asarray(_native.plan_counts()) - before
            assert errors == [""] * n
            # the second call's demand is the first's transposed
            assert (planned, reversed_) == ((1, 0) if k == 0 or not symmetric else (0, 1))
            starts = np.cumsum(sent_counts, axis=1) - sent_counts
            for j in range(n):
                got = np.concatenate(
                    [
                        inputs[i].reshape(rows, ROW)[
                            starts[i, j] : starts[i, j] + sent_counts[i, j]
                        ]
                        for i in range(n)
                    ]
                )
                np.testing.assert_array_equal(outputs[j].reshape(rows, ROW)[: len(got)], got)
    finally:
        configure(devices=N)


@pytest.mark.parametrize("transport", ["memcpy", "emulated", "shm", "cuda-host"])
@pytest.mark.parametrize("execution", EXECUTIONS)
def test_a_stalled_rank_fails_the_call_and_nobody_writes_after_returning(
    execution: str, transport: str
) -> None:
    """A rank stalls before one of its transfers, past the timeout, many times over: every rank
    returns an error naming the stall (or finishes, if it needed nothing from the staller), and
    once a rank has returned (its buffers then poisoned, as XLA would reuse them) nothing writes
    into them; nothing writes outside any buffer."""
    cfg = configure("r5080-bf3", execution=execution, transport=transport, timeout_s=0.15)
    rng = np.random.default_rng(5)
    try:
        for trial in range(6):
            counts = rng.integers(1, 4, size=(N, N))
            rows = int(max(counts.sum(axis=0).max(), counts.sum(axis=1).max()))
            arenas, inputs, outputs = buffers(rows, trial)
            staller = int(rng.integers(N))
            _native.inject_stall(staller, int(rng.integers(3)), 0.4)
            errors = _native.exchange_on_threads(
                cfg.id, 100 + trial, inputs, outputs, counts.tolist(), ROW, POISON
            )
            _native.inject_stall(-1, 0, 0.0)
            assert any("stalled" in e or "timed out" in e for e in errors), errors
            for r in range(N):
                assert (inputs[r] == POISON).all() and (outputs[r] == POISON).all(), (trial, r)
            for arena in arenas:
                assert (arena[:PAD] == CANARY).all() and (arena[-PAD:] == CANARY).all()
    finally:
        _native.inject_stall(-1, 0, 0.0)
        configure(devices=N)


STALLED_STREAM = """
import json, os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import numpy as np
from variopath_jax import _native
from variopath_jax.jax_ops import configure
execution, staller = sys.argv[1], int(sys.argv[2])
cfg = configure("r5080-bf3", execution=execution, transport="emulated", timeout_s=0.5,
                emulator_delay_s=0.0)
_native.stall_emulated_stream(staller)
n, row, rows = 8, 16, 16
inputs = [np.full(rows * row, 1 + r, np.uint8) for r in range(n)]
outputs = [np.zeros(rows * row, np.uint8) for _ in range(n)]
counts = np.full((n, n), 2).tolist()
errors = _native.exchange_on_threads(cfg.id, 7, inputs, outputs, counts, row, 0xEE)
poisoned = all((o == 0xEE).all() for o in outputs)  # nothing arrived after its rank returned
print(json.dumps({"errors": errors, "poisoned": poisoned}))
"""


@pytest.mark.parametrize("execution", ["signal", "concurrent"])
def test_a_wedged_stream_fails_the_call_instead_of_hanging(execution: str) -> None:
    """Rank 3's (emulated) stream never runs its copies, as a wedged device would not: the ranks
    waiting for them give up at the timeout, and so does rank 3 itself, which waits before it
    returns for its sends to complete (that wait had no deadline and hung); the call's error names
    a rank and the transfer it waited for, and nothing of the wedged streams runs after the call.
    In a subprocess, so that a hang fails the test instead of the run."""
    import json
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", STALLED_STREAM, execution, "3"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    errors = out["errors"]
    waited = r"timed out after 0\.50* s.*: rank \d waited for rank (\d)'s transfer to rank \d \("
    for e in errors:
        found = re.search(waited, e)
        assert found, errors
        if execution == "concurrent":  # no transfer waits for another: only rank 3's stall
            assert found.group(1) == "3", errors
    assert out["poisoned"], out


EXIT_IN_FLIGHT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from variopath_jax import _native
from variopath_jax.jax_ops import all_to_all_v, configure
configure("r5080-bf3", timeout_s=30.0)
mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
body = lambda x, c: all_to_all_v(x, c[0], axis_name="x")[0]
f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))
put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))
x, c = put(np.ones((64, 4), np.float32)), put(np.ones((8, 8), np.int32))
jax.block_until_ready(f(x, c))
_native.inject_stall(5, 0, 2.0)  # rank 5 sleeps before its first transfer, the others wait
y = f(x, c)  # in flight on the handlers' threads when the interpreter exits
print("exiting", flush=True)
"""


def test_the_interpreter_exits_cleanly_with_a_call_in_flight() -> None:
    """The CPU handlers run collectives on detached threads: at interpreter exit the calls in
    flight fail and their threads end before JAX's runtime goes (an atexit hook), so the process
    exits normally, neither crashing nor waiting out the call's timeout."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", EXIT_IN_FLIGHT], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "exiting" in proc.stdout, proc.stderr[-3000:]


def test_planned_op_executes_a_paced_plan_at_its_caps() -> None:
    """At 3.5 MiB per rank on r5080-bf3 the op's choice under `pcie-fair` (its planning on the
    call path counted) is the paced plan; the op executes it, decided ahead from the first call,
    at the second call with every transfer's cap (and still moves the right rows)."""
    configure("r5080-bf3", network="pcie-fair", debug=True)
    try:
        counts = np.full((N, N), 4096)
        x = np.random.default_rng(3).standard_normal((N, 8 * 4096, 32)).astype(np.float32)
        for _ in range(2):
            np.testing.assert_array_equal(exchange(x, counts), expected_rows(x, counts))
        log = last_schedule()
        assert log["plan"] == "paced"
        assert (log["pace_gbs"] > 0).all() and len(log["step_ptr"]) == 2
        assert (log["pace_gbs"] <= 64.0).all()  # never above a GPU link
    finally:
        configure(devices=N)


CACHE_SCRIPT = r"""
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
cache, order = sys.argv[1], sys.argv[2].split(",")
jax.config.update("jax_compilation_cache_dir", cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
hits = []
jax.monitoring.register_event_listener(lambda e, **kw: hits.append(e) if "cache_hits" in e else None)
import variopath_jax as vp
from variopath_jax.jax_ops import last_schedule
configs = {e: vp.configure("r5080-bf3", execution=e, debug=True) for e in order}
mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))
def program(config):
    body = lambda x, c: vp.all_to_all_v(x, c[0], axis_name="x", config=config)[0]
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))
if order[0] == "barrier":  # lower an unrelated call first: a counter would shift every site
    program(configs["barrier"]).lower(put(np.ones((64, 3), np.float32)), put(np.ones((8, 8), np.int32)))
x = np.arange(8 * 16 * 2, dtype=np.float32).reshape(128, 2)
counts = np.full((8, 8), 2, np.int32)
y = np.asarray(program(configs["signal"])(put(x), put(counts)))
want = x.reshape(8, 8, 2, 2).transpose(1, 0, 2, 3).reshape(128, 2)
assert np.array_equal(y, want), "wrong rows"
log = last_schedule()
assert log is not None and log["execution"].name == "SIGNAL", log and log["execution"]
print("hits", len(hits))
"""


def test_persistent_compilation_cache_across_processes(tmp_path) -> None:
    """Two processes configure the same two configurations in opposite orders (the second also
    lowers an unrelated call first); the second runs the first's cached executable, which plans
    with the configuration it was compiled for and meets its peers under the same site ids."""
    import subprocess
    import sys

    cache = tmp_path / "cache"
    runs = []
    for order in ("signal,barrier", "barrier,signal"):
        proc = subprocess.run(
            [sys.executable, "-c", CACHE_SCRIPT, str(cache), order],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(int(proc.stdout.split("hits")[-1]))
    assert runs[0] == 0 and runs[1] >= 1, runs


# ----- the executor on the stream emulator (a thread per stream, random delays) ---------------
def expected_bytes(inputs: list[np.ndarray], counts: np.ndarray, rows: int) -> list[np.ndarray]:
    sent = [a.reshape(rows, ROW) for a in inputs]
    starts = np.cumsum(counts, axis=1) - counts
    out = []
    for j in range(N):
        got = np.concatenate(
            [sent[i][starts[i, j] : starts[i, j] + counts[i, j]] for i in range(N)]
        )
        y = np.zeros((rows, ROW), np.uint8)
        y[: len(got)] = got
        out.append(y.reshape(-1))
    return out


@pytest.mark.parametrize("execution", ["barrier", "signal", "concurrent"])
def test_emulated_streams_keep_every_dependency_and_deliver_before_returning(
    execution: str,
) -> None:
    """Many seeds of random per-op delays: every transfer's first copy begins after each
    transfer it waits for has completed, and what each rank holds the moment it returns is
    exactly its rows (nothing arrives later: the buffers, poisoned at return, stay poisoned)."""
    rng = np.random.default_rng(8)
    try:
        for seed in range(8):
            cfg = configure(
                "r5080-bf3",
                execution=execution,
                transport="emulated",
                emulator_seed=seed,
                emulator_delay_s=200e-6,
                debug=True,
                timeout_s=20.0,
            )
            counts = rng.integers(0, 4, size=(N, N))
            rows = int(max(counts.sum(axis=0).max(), counts.sum(axis=1).max(), 1))
            _, inputs, outputs = buffers(rows, seed)
            want = expected_bytes([a.copy() for a in inputs], counts, rows)
            snaps = [np.zeros_like(o) for o in outputs]
            site = 500 + seed
            errors = _native.exchange_on_threads(
                cfg.id, site, inputs, outputs, counts.tolist(), ROW, POISON, snaps
            )
            assert errors == [""] * N, errors
            for j in range(N):
                np.testing.assert_array_equal(snaps[j], want[j])
                assert (outputs[j] == POISON).all()
            log = _native.debug_schedule(site)
            began, ended = log["began"], log["ended"]
            assert (began >= 0).all() and (ended >= 0).all()
            ptr, after = log["after_ptr"], log["after"]
            for t in range(len(began)):
                for d in after[ptr[t] : ptr[t + 1]]:
                    assert began[t] > ended[d], (seed, t, int(d))
    finally:
        configure(devices=N)


def test_the_op_runs_on_the_emulated_streams() -> None:
    configure("r5080-bf3", transport="emulated", emulator_seed=3, emulator_delay_s=100e-6)
    try:
        rng = np.random.default_rng(12)
        counts = rng.integers(0, 5, size=(N, N))
        x = rng.standard_normal((N, 40, 4)).astype(np.float32)
        np.testing.assert_array_equal(exchange(x, counts), expected_rows(x, counts))
        with pytest.raises(VarioPathError, match="transport must be one of"):
            configure("r5080-bf3", transport="rdma")
    finally:
        configure(devices=N)


@pytest.mark.parametrize("op", ["all_to_all_v", "ragged_all_to_all"])
def test_both_ops_lower_for_cuda(op: str) -> None:
    """On this CPU-only jaxlib the op still lowers for the `cuda` platform, to our custom call
    (what a GPU process would compile; the CUDA handler itself needs a GPU)."""
    from variopath_jax.jax_ops import ragged_all_to_all

    mesh = jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    sharded = lambda shape, dtype: jax.ShapeDtypeStruct(  # noqa: E731
        shape, dtype, sharding=NamedSharding(mesh, P("x"))
    )
    if op == "all_to_all_v":
        body = lambda x, c: all_to_all_v(x, c[0], axis_name="x")[0]  # noqa: E731
        args = (sharded((N * 8, 4), np.float32), sharded((N, N), np.int32))
    else:

        def body(x, out, a, b, c, d):
            return ragged_all_to_all(x, out, a[0], b[0], c[0], d[0], axis_name="x")

        ints = sharded((N, N), np.int32)
        args = (
            sharded((N * 8, 4), np.float32),
            sharded((N * 8, 4), np.float32),
            ints,
            ints,
            ints,
            ints,
        )
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    text = f.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert f"@variopath_{op}" in text


BUSY_PROGRAM = r"""
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import variopath_jax as vp
vp.configure("r5080-bf3", timeout_s=30)
N, E, K, T, D, H = 8, 2, 2, 48, 64, 128
mesh = jax.make_mesh((N,), ("ep",), axis_types=(jax.sharding.AxisType.Explicit,))
put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))
def layer(x, wr, w1, w2):
    logits, ids = jax.lax.top_k(x @ wr, K)
    flat = ids.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    counts = jnp.bincount(flat, length=N * E).reshape(N, E)
    d = vp.moe_dispatch(x[order // K], counts, axis_name="ep", out_capacity=N * T * K)
    h = jax.nn.gelu(jax.lax.ragged_dot(d.rows, w1, d.group_sizes))
    y = vp.moe_combine(jax.lax.ragged_dot(h, w2, d.group_sizes), d)
    y = jnp.zeros_like(y).at[order].set(y)
    return (y.reshape(T, K, D) * jax.nn.softmax(logits, axis=-1)[..., None]).sum(axis=1)
rng = np.random.default_rng(0)
specs = (P("ep"), P(), P("ep"), P("ep"))
shapes = ((N * T, D), (D, N * E), (N * E, D, H), (N * E, H, D))
args = [put(rng.standard_normal(s).astype(np.float32) * 0.1, p) for s, p in zip(shapes, specs)]
f = jax.shard_map(layer, mesh=mesh, in_specs=specs, out_specs=P("ep"))
grad = jax.jit(jax.grad(lambda *a: (f(*a) ** 2).sum(), argnums=(0, 1, 2, 3)))
for _ in range(4):
    jax.block_until_ready(jax.jit(f)(*args))
    jax.block_until_ready(grad(*args))
print("done")
"""


def test_a_busy_program_with_xla_collectives_beside_ours_runs() -> None:
    """An MoE layer, forward and gradient in one jitted program (XLA's all_to_all of the counts
    beside our exchanges, much parallel work): once deadlocked on this 2-core machine while the
    handlers blocked XLA's threads; the handlers are asynchronous now. In a subprocess: a
    regression would abort the process (XLA's collective timeout), not the test run."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", BUSY_PROGRAM], capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-3000:]


def test_each_transport_says_whether_it_pushes_or_pulls() -> None:
    """ffi/collective.h direction_of, asked from Python: the senders write (push) or the receivers
    read (pull); an unknown transport is refused."""
    directions = {t: op_config.transport_direction(t) for t in op_config.TRANSPORTS}
    assert directions == {
        "memcpy": "push",  # each rank's thread (CUDA: its stream) writes into the receivers
        "emulated": "push",
        "nccl": "push",  # NCCL's P2P transport writes over PCIe
        "shm": "pull",  # each receiver copies from its senders' staging
        "cuda-ipc": "pull",  # each receiver's stream reads its senders' device staging
        "cuda-host": "pull",
    }
    with pytest.raises(VarioPathError, match="transport must be one of"):
        op_config.transport_direction("carrier-pigeon")


def _pulled(schedule: Schedule) -> Schedule:
    steps = [
        dataclasses.replace(
            st, transfers=tuple(dataclasses.replace(t, pull=True) for t in st.transfers)
        )
        for st in schedule.steps
    ]
    return dataclasses.replace(schedule, steps=steps)


def test_op_plan_refuses_pulls_where_the_transport_pushes() -> None:
    model = PathModel(tiny4())
    demand = np.full((4, 4), 4096)
    np.fill_diagonal(demand, 0)
    pushed = get_scheduler("variopath").plan(PlanRequest(demand, model, PCIE.barrier_s))
    pulled = _pulled(pushed)
    for transport in ("memcpy", "emulated", "nccl"):
        with pytest.raises(VarioPathError, match=f"transport '{transport}' pushes .* pulls the"):
            op_plan(pulled, transport)
        assert op_plan(pushed, transport) == op_plan(pushed)
    for transport in ("shm", "cuda-ipc", "cuda-host"):  # readers run pulls (and pushes) as reads
        assert op_plan(pulled, transport) == op_plan(pushed, transport) == op_plan(pushed)


def test_a_pulled_plan_fails_the_call_on_a_pushing_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The model-aware callback lays out the plan for the configured transport: a plan that pulls
    fails the call with an error naming the transport, instead of running the reads as writes."""
    import variopath_jax.schedulers as schedulers

    real = schedulers.get_scheduler

    class Pulling:
        def plan(self, request):
            return _pulled(real("variopath").plan(request))

    monkeypatch.setattr(schedulers, "get_scheduler", lambda name: Pulling())
    configure("r5080-bf3", execution="model-aware", transport="memcpy")
    try:
        counts = np.full((N, N), 8)
        x = np.zeros((N, 128, 4), np.float32)
        with pytest.raises(Exception, match="transport 'memcpy' pushes"):
            exchange(x, counts)
    finally:
        configure(devices=N)
