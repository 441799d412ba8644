"""The chained hybrid plan (ffi/chained.cc, issue 27 item 2), built by the C++ core: valid, serves
the demand exactly, never puts two flows on a root-complex link at once, deterministic; checked
exhaustively on small topologies. (The phased plan, the hybrid MILP's warm start, is tested with
the MILP: tests/test_hybrid_milp.py, which shares this file's helpers.)"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import tiny4

from variopath_jax import workloads
from variopath_jax.planner import PlannerParams
from variopath_jax.planner.schedulers import chooser_for
from variopath_jax.schedule import Schedule, validate
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import FluidSimulator
from variopath_jax.sim.network import PCIE, load_network
from variopath_jax.solver.phases import root_links
from variopath_jax.topology import PathModel, Topology
from variopath_jax.topology.presets import preset

LAM = 20e-6


def _topology(name: str) -> Topology:
    return tiny4() if name == "tiny4" else preset(name, 1)


def _demands(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    skewed = rng.integers(0, 3 << 20, size=(n, n))
    np.fill_diagonal(skewed, 0)
    skewed[0] = 0  # a rank that sends nothing
    return {
        "uniform": workloads.uniform(n, 1 << 20),
        "moe": workloads.moe(n, 16, seed=3),
        "skewed": skewed.astype(np.int64),
    }


def _ancestors(schedule: Schedule) -> list[int]:
    """Per transfer (schedule order), the bitmask of transfers that must have ended before it
    starts: its ``after`` references, transitively (every step here starts with the plan)."""
    first = np.cumsum([0] + [len(st.transfers) for st in schedule.steps])
    out: list[int] = []
    for s, st in enumerate(schedule.steps):
        assert schedule.dependencies(s) in ((), (s - 1,)) and (
            s == 0 or schedule.steps[s].deps == ()
        ), "a hybrid plan has no barrier between its steps"
        for t in st.transfers:
            mask = 0
            for a, b in t.after:
                ref = int(first[a] + b)
                assert ref < len(out), "a signal names an earlier transfer"
                mask |= (1 << ref) | out[ref]
            out.append(mask)
    return out


def _root_sharing(schedule: Schedule, topo: Topology) -> list[tuple[int, int]]:
    """Every pair of transfers that cross a common root-complex link and are not ordered by
    signals (so may run at the same time): brute force over all pairs."""
    root = root_links(topo)
    flat = [t for st in schedule.steps for t in st.transfers]
    crossing = [frozenset(lid for lid in t.path if root[lid]) for t in flat]
    anc = _ancestors(schedule)
    bad = []
    for u, v in itertools.combinations(range(len(flat)), 2):
        if crossing[u] & crossing[v] and not (anc[v] >> u) & 1 and not (anc[u] >> v) & 1:
            bad.append((u, v))
    return bad


def _chained(
    topo: Topology, demand: np.ndarray, network=PCIE, floor_s: float = 0.0
) -> Schedule | None:
    """The C++ core's chained plan of ``demand`` (gaps of ``network``; rates tried until one is
    within the split's tolerance of ``floor_s``), or None where it has none."""
    chooser = chooser_for(PathModel(topo), PlannerParams(lambda_s=LAM))
    return chooser.chained(demand, network, floor_s)


CASES = [
    (topo, workload)
    for topo in ("tiny4", "r5080-bf3", "r5080-cx8")  # fig1 has no root entry: tested below
    for workload in ("uniform", "moe", "skewed")
]


@pytest.mark.parametrize(("topo_name", "workload"), CASES)
def test_chained_plan_is_valid_exact_and_never_shares_a_root_link(
    topo_name: str, workload: str
) -> None:
    topo = _topology(topo_name)
    demand = _demands(topo.num_ranks)[workload]
    sch = _chained(topo, demand)
    check = validate(sch, demand, topo)
    assert check.ok, check.errors[:3]
    assert np.array_equal(sch.served(), demand)
    assert sch.meta["hybrid"] == "chained" and sch.meta["paced"]
    assert _root_sharing(sch, topo) == []
    # so the conservative model charges it nothing the optimistic one does not: every transfer
    # ends at the same time under pcie and pcie-fair
    ends = {
        m: FluidSimulator(topo, load_network(m)).run(sch).transfer_end
        for m in ("pcie", "pcie-fair")
    }
    np.testing.assert_allclose(ends["pcie"], ends["pcie-fair"], rtol=1e-9, atol=1e-12)


def test_chained_plan_is_deterministic() -> None:
    topo = preset("r5080-bf3", 1)
    demand = _demands(8)["moe"]
    a = _chained(topo, demand)
    fresh = chooser_for(PathModel(preset("r5080-bf3", 1)), PlannerParams(lambda_s=LAM, seed=1))
    b = fresh.chained(demand, PCIE, 0.0)  # another core (Algorithm 2's seed plays no part)
    a.meta.pop("core_s"), b.meta.pop("core_s")
    assert a.to_dict() == b.to_dict()


def test_two_flows_through_one_root_complex_take_turns() -> None:
    """tiny4, demand 0 -> 2 and 1 -> 3 only: both pairs' PHB routes cross cpu0's root ports in
    the same directions, so the plan puts them in turn, the second waiting for the first by a
    signal (their NIC-loop routes may carry the rest concurrently)."""
    topo = tiny4()
    demand = np.zeros((4, 4), dtype=np.int64)
    demand[0, 2] = demand[1, 3] = 8 << 20
    sch = _chained(topo, demand)
    assert validate(sch, demand, topo).ok and _root_sharing(sch, topo) == []
    root = root_links(topo)
    on_root = [t for st in sch.steps for t in st.transfers if root[list(t.path)].any()]
    assert {t.carries for t in on_root} == {(0, 2), (1, 3)}
    assert sum(1 for t in on_root if t.after) == len(on_root) - 1


def test_empty_demand_gives_an_empty_chained_plan() -> None:
    sch = _chained(tiny4(), np.zeros((4, 4), dtype=np.int64))
    assert sch.steps == [] and sch.num_transfers == 0


def test_variopath_builds_chained_where_it_may_pay() -> None:
    """``variopath`` (the C++ choice) builds chained only where it may pay for its planning,
    and predicts it under every model it plans for: for Zipf traffic of 8 GiB per rank on
    direct-8 × 1 (under ``pcie`` every plan built before it stays far above the split's bound),
    not for a 16-token MoE dispatch on r5080-bf3 × 1 (some 40 µs to gain at most)."""
    for name, demand, wanted in (
        ("direct-8", workloads.zipf(8, 0.8, 8 << 30, seed=0), {"chained"}),
        ("r5080-bf3", workloads.moe(8, 16, seed=0), set()),
    ):
        topo = preset(name, 1)
        req = PlanRequest(demand, PathModel(topo), LAM, network=["pcie", "pcie-fair"])
        sch = get_scheduler("variopath").plan(req)
        for model in ("pcie", "pcie-fair"):
            assert set(sch.meta["predicted_s"][model]) & {"chained"} == wanted, name
        assert validate(sch, demand, topo).ok


def _reserved_gbs(schedule: Schedule, topo: Topology) -> float:
    """The rate the plan reserves on the root-complex links: its root entries' pacing rate."""
    root = root_links(topo)
    return max(t.rate for st in schedule.steps for t in st.transfers if root[list(t.path)].any())


def test_chained_stops_its_rates_within_the_tolerance_of_the_bound() -> None:
    """``chained`` tries its reserved rates largest first, keeping the fastest plan; given a data
    time no plan beats (``floor_s``), it stops once its best is within ``kSplitTolerance`` of
    it. On r5080-bf3 × 1, Zipf 1 GiB per rank, the best rate is below the first that fits (24
    against 48 GB/s here), and its plan is faster; a floor the best plan's own time certifies
    keeps it, and a floor every plan meets keeps the first rate that fits."""
    topo = preset("r5080-bf3", 1)
    demand = workloads.zipf(8, 0.6, 1 << 30, seed=0)
    sim = FluidSimulator(topo, PCIE)
    full = _chained(topo, demand)
    full_s = sim.run(full).completion_s  # above its data time: λ, o and L on top
    kept = _chained(topo, demand, floor_s=full_s)
    first = _chained(topo, demand, floor_s=np.inf)
    assert _reserved_gbs(full, topo) == _reserved_gbs(kept, topo) < _reserved_gbs(first, topo)
    assert [t.nbytes for t in full.steps[0].transfers] == [
        t.nbytes for t in kept.steps[0].transfers
    ]
    assert full_s < sim.run(first).completion_s
    assert validate(first, demand, topo).ok and validate(full, demand, topo).ok


def test_chained_on_l20_cx7() -> None:
    """On l20-cx7 (16 GPUs, Gen4), where HiGHS's interior point once called one of chained's LPs
    infeasible, the first-order split's plan is valid and shares no root-complex link."""
    topo = preset("l20-cx7", 1)
    demand = workloads.moe(16, 32, seed=1)
    sch = _chained(topo, demand)
    assert validate(sch, demand, topo).ok and _root_sharing(sch, topo) == []


def test_chained_needs_a_root_entry() -> None:
    """Where no column crosses a root complex (fig1's paths), ``chained`` would be ``paced``
    over the same routes: the core builds none, the choice never has it among its candidates
    (whatever its planning costs), and applying a decision for it falls back to ``staged``."""
    from variopath_jax import _native

    topo = _topology("fig1")
    model = PathModel(topo)
    demand = _demands(topo.num_ranks)["uniform"]
    assert _chained(topo, demand) is None
    chooser = chooser_for(model, PlannerParams(lambda_s=LAM))
    _, record = chooser.choose(demand, (PCIE,), every=True)
    assert "paced" in record["regret"] and "chained" not in record["regret"]
    assert chooser.apply(_native.Decision("chained"), demand, (PCIE,)).meta["plan"] == "staged"
