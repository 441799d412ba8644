"""The hybrid plans (planner/hybrid.py, issue 27 item 2): valid, serve the demand exactly, never put
two flows on a root-complex link at once, deterministic; checked exhaustively on small
topologies."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import tiny4

from variopath_jax import workloads
from variopath_jax.planner import hybrid, split
from variopath_jax.planner.lp import route_columns
from variopath_jax.planner.model_aware import paced
from variopath_jax.planner.predict import Links, predict
from variopath_jax.schedule import Schedule, validate
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import FluidSimulator
from variopath_jax.sim.network import PCIE, load_network
from variopath_jax.topology import PathModel, Topology
from variopath_jax.topology.presets import preset

LAM = 20e-6
BUILDERS = {"phased": hybrid.phased, "chained": hybrid.chained}


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


CASES = [
    (topo, workload, builder)
    for topo in ("tiny4", "fig1", "r5080-bf3", "r5080-cx8")
    for workload in ("uniform", "moe", "skewed")
    for builder in BUILDERS
    if (topo, builder)
    != ("fig1", "chained")  # no root entry there: test_chained_needs_a_root_entry
]


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
    root = hybrid.root_links(topo)
    flat = [t for st in schedule.steps for t in st.transfers]
    crossing = [frozenset(lid for lid in t.path if root[lid]) for t in flat]
    anc = _ancestors(schedule)
    bad = []
    for u, v in itertools.combinations(range(len(flat)), 2):
        if crossing[u] & crossing[v] and not (anc[v] >> u) & 1 and not (anc[u] >> v) & 1:
            bad.append((u, v))
    return bad


def _plan(topo_name: str, workload: str, builder: str) -> tuple[Topology, np.ndarray, Schedule]:
    topo = _topology(topo_name)
    demand = _demands(topo.num_ranks)[workload]
    return topo, demand, BUILDERS[builder](PathModel(topo), demand, LAM)


@pytest.mark.parametrize(("topo_name", "workload", "builder"), CASES)
def test_hybrid_plan_is_valid_exact_and_never_shares_a_root_link(
    topo_name: str, workload: str, builder: str
) -> None:
    topo, demand, sch = _plan(topo_name, workload, builder)
    check = validate(sch, demand, topo)
    assert check.ok, check.errors[:3]
    assert np.array_equal(sch.served(), demand)
    assert sch.meta["hybrid"] == builder and sch.meta["paced"]
    assert _root_sharing(sch, topo) == []
    # so the conservative model charges it nothing the optimistic one does not: every transfer
    # ends at the same time under pcie and pcie-fair
    ends = {
        m: FluidSimulator(topo, load_network(m)).run(sch).transfer_end
        for m in ("pcie", "pcie-fair")
    }
    np.testing.assert_allclose(ends["pcie"], ends["pcie-fair"], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("builder", BUILDERS)
def test_hybrid_plan_is_deterministic(builder: str) -> None:
    a = _plan("r5080-bf3", "moe", builder)[2]
    b = _plan("r5080-bf3", "moe", builder)[2]
    assert a.to_dict() == b.to_dict()


def _greedy_span_ns(model: PathModel, demand: np.ndarray) -> float:
    """Σ t_k of the phased LP over the greedy colouring of every root entry (``phased`` before
    issue 31 dropped the entries not worth their gaps)."""
    col = route_columns(model, demand)
    ph = hybrid.colour(col, model.topology)
    return hybrid.phase_lp(
        col, ph, model.topology, hybrid._gaps(col, ph, model.topology, PCIE)
    ).span_ns


@pytest.mark.parametrize("topo_name", ["tiny4", "r5080-bf3", "r5080-cx8"])
def test_phased_is_never_slower_than_the_greedy_colouring(topo_name: str) -> None:
    """Issue 31: on random demands ``phased`` (the entries worth their gaps, coloured by
    duration, or the greedy colouring of all of them, whichever LP is faster) takes no longer
    than the greedy colouring's LP, and the merged bounds that spare one of the two LPs are
    below them; its plan validates, shares no root-complex link, and the simulator runs it
    within the analytic predictor's tolerance."""
    topo = _topology(topo_name)
    model = PathModel(topo)
    n = topo.num_ranks
    sim = FluidSimulator(topo, load_network("pcie"))
    links = Links.of(topo)
    demands = [workloads.zipf(n, 0.6, (8 << 20) * (1 + s % 3), seed=s) for s in range(3)]
    rng = np.random.default_rng(31)
    for _ in range(3):
        d = rng.integers(0, 4 << 20, size=(n, n)) * (rng.random((n, n)) < 0.7)
        np.fill_diagonal(d, 0)
        demands.append(d.astype(np.int64))
    for demand in demands:
        sch = hybrid.phased(model, demand, LAM)
        greedy_ns = _greedy_span_ns(model, demand)
        assert sch.meta["span_s"] * 1e9 <= greedy_ns * (1 + 1e-5)
        # the merged bounds that spare an LP bound each colouring's LP from below
        col = route_columns(model, demand)
        ph = hybrid.colour(col, topo)
        gap = hybrid._gaps(col, ph, topo, PCIE)
        every = np.arange(len(ph.entry))
        assert hybrid.entries_bound(col, ph, topo, gap, every) <= greedy_ns * (1 + 1e-6)
        keep, duration = hybrid.used_entries(col, ph, topo, gap)
        used = hybrid.phase_lp(col, hybrid.colour_by_duration(ph, keep, duration), topo, gap[keep])
        assert hybrid.entries_bound(col, ph, topo, gap, keep) <= used.span_ns * (1 + 1e-6)
        assert validate(sch, demand, topo).ok and _root_sharing(sch, topo) == []
        predicted = predict(sch, links, load_network("pcie"))
        assert sim.run(sch).completion_s == pytest.approx(predicted, rel=0.03)


def test_phased_drops_the_entries_not_worth_their_gaps_on_r5080_bf3() -> None:
    """Issue 31's worst point (r5080-bf3, Zipf 8 MiB per rank, seed 0): the greedy colouring
    puts all 32 cross-socket entries in 16 phases, each paying its gap o + L + σ; ``phased``
    keeps the few worth their gaps, in far fewer phases, and its LP is over 4% shorter."""
    topo = preset("r5080-bf3", 1)
    model = PathModel(topo)
    demand = workloads.zipf(8, 0.6, 8 << 20, seed=0)
    col = route_columns(model, demand)
    ph = hybrid.colour(col, topo)
    keep, duration = hybrid.used_entries(col, ph, topo, hybrid._gaps(col, ph, topo, PCIE))
    assert 0 < len(keep) < len(ph.entry) == 32 and (duration > 0).all()
    used = hybrid.colour_by_duration(ph, keep, duration)
    for u, v in itertools.combinations(range(len(used.entry)), 2):
        assert used.phase[u] != used.phase[v] or not used.root_of[u] & used.root_of[v]
    sch = hybrid.phased(model, demand, LAM)
    assert sch.meta["phases"] == used.count < ph.count == 16
    assert sch.meta["span_s"] * 1e9 < _greedy_span_ns(model, demand) * 0.96


def _min_colours(hits: list[frozenset[int]]) -> int:
    """The fewest phases that keep entries sharing a root-complex link apart, by brute force."""
    n = len(hits)
    for k in range(1, n + 1):
        for assign in itertools.product(range(k), repeat=n):
            if all(
                assign[u] != assign[v] or not hits[u] & hits[v]
                for u, v in itertools.combinations(range(n), 2)
            ):
                return k
    return 0


def test_phase_colouring_reaches_the_brute_force_minimum_on_tiny4() -> None:
    """tiny4's cross-switch pairs (PHB through the CPU) are its root entries; the greedy
    colouring needs no more phases than an exhaustive search."""
    topo = tiny4()
    demand = workloads.uniform(4, 1 << 20)
    col = route_columns(PathModel(topo), demand)
    ph = hybrid.colour(col, topo)
    assert 0 < len(ph.entry) <= 8
    assert ph.count == _min_colours(ph.root_of)
    for u, v in itertools.combinations(range(len(ph.entry)), 2):
        assert ph.phase[u] != ph.phase[v] or not ph.root_of[u] & ph.root_of[v]


def test_phase_count_meets_the_busiest_root_link_on_r5080_bf3() -> None:
    """On r5080-bf3 every cross-socket pair is a root entry (SYS); no colouring can use fewer
    phases than the busiest root-complex link has entries (16: 4 x 4 pairs per direction), and
    the greedy one uses exactly that many."""
    topo = preset("r5080-bf3", 1)
    col = route_columns(PathModel(topo), workloads.uniform(8, 1 << 20))
    ph = hybrid.colour(col, topo)
    load: dict[int, int] = {}
    for hit in ph.root_of:
        for lid in hit:
            load[lid] = load.get(lid, 0) + 1
    assert ph.count == max(load.values()) == 16


def test_two_flows_through_one_root_complex_take_turns() -> None:
    """tiny4, demand 0 -> 2 and 1 -> 3 only: both pairs' PHB routes cross cpu0's root ports in
    the same directions, so each plan puts them in turn, the second waiting for the first by a
    signal (their NIC-loop routes may carry the rest concurrently)."""
    topo = tiny4()
    demand = np.zeros((4, 4), dtype=np.int64)
    demand[0, 2] = demand[1, 3] = 8 << 20
    for builder in BUILDERS.values():
        sch = builder(PathModel(topo), demand, LAM)
        assert validate(sch, demand, topo).ok and _root_sharing(sch, topo) == []
        root = hybrid.root_links(topo)
        on_root = [t for st in sch.steps for t in st.transfers if root[list(t.path)].any()]
        assert {t.carries for t in on_root} == {(0, 2), (1, 3)}
        assert sum(1 for t in on_root if t.after) == len(on_root) - 1


def test_phased_without_root_links_is_the_paced_plan() -> None:
    """fig1 has no root-complex route (its cross-switch path is PXB): one phase, which is the
    paced LP, at the same simulated time."""
    topo = preset("fig1", 1)
    demand = workloads.moe(6, 32, seed=1)
    sch = hybrid.phased(PathModel(topo), demand, LAM)
    assert sch.meta["phases"] == 1
    sim = FluidSimulator(topo, load_network("none"))
    want = sim.run(paced(PathModel(topo), demand, LAM)).completion_s
    assert sim.run(sch).completion_s == pytest.approx(want, rel=1e-3)


def test_empty_demand_gives_empty_hybrid_plans() -> None:
    topo = tiny4()
    for builder in BUILDERS.values():
        sch = builder(PathModel(topo), np.zeros((4, 4), dtype=np.int64), LAM)
        assert sch.steps == [] and sch.num_transfers == 0


def test_variopath_builds_the_hybrid_candidates_where_they_may_pay() -> None:
    """``variopath`` builds chained and phased only where they may pay for their planning
    (``planning_pays``, ``phased_pays``) and predicts them under every model it plans for:
    chained for Zipf traffic of 8 GiB per rank on direct-8 × 1 (under ``pcie`` every plan built
    before it stays far above the split's bound; on l20-cx7 rot-paced now comes near it), not
    for a 16-token MoE dispatch on
    r5080-bf3 × 1 (some 40 µs to gain at most); phased (2 ms per LP variable from above) for
    neither, but on fig1 (48 variables, 96 ms) for uniform traffic of 1 TiB per rank, whose best
    plan is seconds from the endpoint bound; the C++ core and the Python reference alike."""
    for name, demand, wanted in (
        ("direct-8", workloads.zipf(8, 0.8, 8 << 30, seed=0), {"chained"}),
        ("r5080-bf3", workloads.moe(8, 16, seed=0), set()),
        ("fig1", workloads.uniform(6, 1 << 40), {"phased"}),
    ):
        topo = preset(name, 1)
        for planner in ("cpp", "python"):
            req = PlanRequest(
                demand,
                PathModel(topo),
                LAM,
                network=["pcie", "pcie-fair"],
                options={"planner": planner},
            )
            sch = get_scheduler("variopath").plan(req)
            for model in ("pcie", "pcie-fair"):
                assert set(sch.meta["predicted_s"][model]) & {"phased", "chained"} == wanted
            assert validate(sch, demand, topo).ok


def test_phased_pays_only_where_even_its_least_cost_may_pay() -> None:
    """``phased_pays`` asks ``planning_pays`` twice: against ``PHASED_LEAST_S`` first (sizing its
    LP costs milliseconds), then against its cost from above (``phased_work_s``)."""
    from variopath_jax.planner.model_aware import phased_pays
    from variopath_jax.sim.network import NONE

    model = PathModel(preset("r5080-bf3", 1))
    demand = workloads.zipf(8, 0.8, 1 << 30, seed=0)
    req = PlanRequest(demand, model, LAM, network=["pcie", "none"])
    work, bound = hybrid.phased_work_s(model, demand), split.endpoint_bound_s(model, demand)
    assert hybrid.PHASED_LEAST_S < work < np.inf
    floor = PCIE.barrier_s + PCIE.issue_s + bound + min(PCIE.latency_pcie_s, PCIE.latency_net_s)
    assert NONE.barrier_s + NONE.issue_s <= PCIE.barrier_s + PCIE.issue_s
    assert phased_pays(req, [floor + 2 * work, floor], bound)
    assert not phased_pays(req, [floor + work / 2, floor], bound)
    calls = []
    original = hybrid.phased_variables
    hybrid.phased_variables = lambda *a: calls.append(a) or original(*a)
    try:  # under its least cost: decided without sizing its LP
        assert not phased_pays(req, [floor + hybrid.PHASED_LEAST_S / 2, floor], bound)
        assert calls == []
    finally:
        hybrid.phased_variables = original


@pytest.mark.parametrize("topo_name", ["tiny4", "fig1", "r5080-bf3", "l20-cx7"])
def test_the_phased_lp_size_is_bounded_without_sizing_it(topo_name: str) -> None:
    """``phased_variables_bound`` (from the deployment's ``phased_shape``) never exceeds the
    LP's size, and meets it where the greedy colouring needs no more phases than the busiest
    root-complex link has columns (every preset demand here)."""
    model = PathModel(_topology(topo_name))
    n = model.topology.num_ranks
    rng = np.random.default_rng(11)
    for demand in [*_demands(n).values(), *(_sparse(rng, n) for _ in range(5))]:
        bound = hybrid.phased_variables_bound(model, demand)
        assert bound <= hybrid.phased_variables(model, demand)
    if topo_name != "tiny4":
        demand = workloads.zipf(n, 0.6, 1 << 30, seed=0)
        assert hybrid.phased_variables_bound(model, demand) == hybrid.phased_variables(
            model, demand
        )


def _sparse(rng: np.random.Generator, n: int) -> np.ndarray:
    demand = rng.integers(1, 1 << 20, size=(n, n)) * (rng.random((n, n)) < 0.4)
    np.fill_diagonal(demand, 0)
    return demand


@pytest.mark.parametrize("builder", ["phased", "paced"])
def test_the_phased_and_paced_lps_plan_a_terabyte_per_rank(builder: str) -> None:
    """Their LPs keep their coefficients near 1 at any volume. With time in ns and bytes in
    units of the largest pair, a link's capacity fell under HiGHS's 1e-9 past some 40 GiB per
    pair and was dropped: the LP was infeasible and ``variopath plan --bytes-per-rank 64GiB``
    failed on r5080-bf3. Now 1 TiB per rank plans, and in 1024 times the time of 1 GiB."""
    build = {"phased": hybrid.phased, "paced": paced}[builder]
    topo = preset("r5080-bf3", 1)
    model, sim = PathModel(topo), FluidSimulator(topo, PCIE)
    small = workloads.zipf(8, 0.6, 1 << 30, seed=0)
    times = []
    for demand in (small, small << 10):
        sch = build(model, demand, LAM)
        assert validate(sch, demand, topo).ok
        times.append(sim.run(sch).completion_s)
    assert times[1] == pytest.approx(1024 * times[0], rel=0.01)


def test_chained_pays_only_where_it_can_gain_its_planning() -> None:
    """``planning_pays`` for chained: the best plan so far minus the least chained could take
    (λ + o + the endpoint bound + L) must exceed its planning, under one model at least."""
    from variopath_jax.planner.model_aware import planning_pays
    from variopath_jax.sim.network import NONE, PCIE

    topo = preset("r5080-bf3", 1)
    model = PathModel(topo)
    demand = workloads.zipf(8, 0.8, 64 << 20, seed=0)
    work, bound = hybrid.chained_work_s(model, demand), split.endpoint_bound_s(model, demand)
    assert 0 < work < 0.01 and bound > 0
    floor = PCIE.barrier_s + PCIE.issue_s + bound + min(PCIE.latency_pcie_s, PCIE.latency_net_s)
    assert planning_pays([floor + 2 * work, floor], (PCIE, NONE), work, bound)
    assert not planning_pays([floor + work / 2, floor], (PCIE, NONE), work, bound)


def test_chained_stops_its_rates_within_the_tolerance_of_the_bound() -> None:
    """``chained`` tries its reserved rates largest first; given a data time no plan beats
    (``floor_s``), it stops once its best is within ``SPLIT_TOLERANCE`` of it. On r5080-bf3 × 1,
    Zipf 1 GiB per rank, the best of four rates tried is the third (24 GB/s): a floor certifying
    that plan keeps it, and a floor every plan meets keeps the first rate that fits."""
    model = PathModel(preset("r5080-bf3", 1))
    demand = workloads.zipf(8, 0.6, 1 << 30, seed=0)
    times = []
    original = hybrid.chain_time

    def timed(*args):
        times.append(original(*args))
        return times[-1]

    hybrid.chain_time = timed
    try:
        full = hybrid.chained(model, demand, LAM)
        tried = list(times)
        certified = tried[2] * 1e-9 / (1 + split.SPLIT_TOLERANCE)
        times.clear()
        kept = hybrid.chained(model, demand, LAM, floor_s=certified)
        assert len(times) == 3  # the fourth rate is not tried
        times.clear()
        first = hybrid.chained(model, demand, LAM, floor_s=np.inf)
        assert len(times) == 1
    finally:
        hybrid.chain_time = original
    assert len(tried) == 4 and min(tried) == tried[2]
    assert full.meta["reserved_gbs"] == kept.meta["reserved_gbs"] == 24.0
    assert [t.nbytes for t in full.steps[0].transfers] == [
        t.nbytes for t in kept.steps[0].transfers
    ]
    assert first.meta["reserved_gbs"] == 48.0 and validate(first, demand, model.topology).ok


def test_chained_on_l20_cx7() -> None:
    """On l20-cx7 (16 GPUs, Gen4), where HiGHS's interior point once called one of chained's LPs
    infeasible, the first-order split's plan is valid and shares no root-complex link."""
    topo = preset("l20-cx7", 1)
    demand = workloads.moe(16, 32, seed=1)
    sch = hybrid.chained(PathModel(topo), demand, LAM)
    assert validate(sch, demand, topo).ok and _root_sharing(sch, topo) == []


def test_phased_node_without_root_traffic_runs_one_window() -> None:
    """r5080-bf3 x 2 with no cross-socket traffic on node 1: node 1 has no root entries, so its
    clock never ticks and each of its columns runs as one transfer from the start (no signals),
    while node 0 still phases; the plan stays valid and unshared and loses nothing under pcie."""
    topo = preset("r5080-bf3", 2)
    demand = workloads.moe(16, 128, seed=5)
    for i in range(8, 16):
        for j in range(8, 16):
            if (i < 12) != (j < 12):
                demand[i, j] = 0
    sch = hybrid.phased(PathModel(topo), demand, LAM)
    assert validate(sch, demand, topo).ok and _root_sharing(sch, topo) == []
    from_node1 = [t for st in sch.steps for t in st.transfers if t.src >= 8]
    assert from_node1 and not any(t.after for t in from_node1)
    assert len({t.carries + t.path for t in from_node1}) == len(from_node1)
    assert any(t.after for st in sch.steps for t in st.transfers if t.src < 8)
    ends = {
        m: FluidSimulator(topo, load_network(m)).run(sch).completion_s
        for m in ("pcie", "pcie-fair")
    }
    assert ends["pcie"] == pytest.approx(ends["pcie-fair"], rel=1e-9)


def test_chained_needs_a_root_entry() -> None:
    """Where no column crosses a root complex (fig1's paths), ``chained`` would be ``paced`` over
    the same routes: it is refused, and ``hybrid_candidates`` leaves it out."""
    from variopath_jax.errors import TopologyError
    from variopath_jax.planner.hybrid import chained, hybrid_candidates

    topo = _topology("fig1")
    demand = _demands(topo.num_ranks)["uniform"]
    with pytest.raises(TopologyError, match="root entry"):
        chained(PathModel(topo), demand, LAM)
    assert "chained" not in hybrid_candidates(PlanRequest(demand, PathModel(topo), LAM))
