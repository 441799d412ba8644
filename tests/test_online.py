"""Issue 28, in the C++ core (ffi/choice.h, the only implementation of ``variopath``'s choice):
its analytic predictor against the simulator; its paced split, solved online by mirror prox over
group pairs, against the LPs it approximates (HiGHS); the choice's record (every candidate's
prediction, the regret, the split, the endpoint bound) and the trigger-free rotation."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from variopath_jax import _native, workloads
from variopath_jax.planner import PlannerParams
from variopath_jax.planner.schedulers import chooser_for
from variopath_jax.schedule import Schedule, validate
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import FluidSimulator
from variopath_jax.sim.network import NONE, PCIE, PCIE_FAIR, through_nic
from variopath_jax.solver.phases import PACED_ROUTES, route_columns
from variopath_jax.topology import PathModel, preset

LAM = 20e-6
# ideal sharing and no fixed cost (barrier, posting, latency, signals): a paced plan's predicted
# time under it is its horizon, whatever split the choice solved
BARE = NONE.replace(
    name="bare", barrier_s=0.0, issue_s=0.0, latency_pcie_s=0.0, latency_net_s=0.0, signal_s=0.0
)
CONCURRENT = ("concurrent", "multipath", "staged", "staged-balanced")


def _chooser(model: PathModel):
    return chooser_for(model, PlannerParams(lambda_s=LAM))


def _built(chooser, family: str, demand: np.ndarray, networks) -> Schedule:
    """The C++ core's plan of ``family`` for ``demand`` (the paced families with the
    deployment's reference split), with its predicted time under each of ``networks``."""
    plan = chooser.apply(_native.Decision(family), demand, tuple(networks))
    assert plan.meta["plan"] == family, (family, plan.meta["plan"])  # built, not the fallback
    return plan


def _latency_s(plan: Schedule, topo, network) -> float:
    """The latency the plan's last transfer pays: the network's where some transfer crosses a
    NIC, else PCIe's."""
    nic = through_nic(topo)
    crossing = any(nic[list(t.path)].any() for st in plan.steps for t in st.transfers)
    return network.latency_net_s if crossing else network.latency_pcie_s


@pytest.mark.parametrize(("name", "nodes"), [("r5080-bf3", 2), ("r5080-cx8", 1), ("l20-cx7", 1)])
def test_predictor_is_exact_where_the_family_allows(name, nodes) -> None:
    """Algorithm 2's activations, behind barriers (Eq. 2 plus o and L per step) or signal-driven
    (overlapping only where they share no link), the chained hybrid and rot-paced (where built:
    it writes toward one root complex at a time), under every model; the paced plan under the
    models whose rules let its caps share (its horizon plus λ + o + L): the C++ core's
    prediction equals the simulation."""
    topo = preset(name, nodes)
    model = PathModel(topo)
    chooser = _chooser(model)
    demand = workloads.moe(topo.num_ranks, 64, seed=1)
    networks = (PCIE, PCIE_FAIR, NONE)
    plans = {f: _built(chooser, f, demand, networks) for f in ("barrier", "signal", "chained")}
    plans["paced"] = _built(chooser, "paced", demand, networks)
    rotated = chooser.apply(_native.Decision("rot-paced"), demand, networks)
    assert (rotated.meta["plan"] == "rot-paced") is (name != "r5080-bf3")  # no trigger there
    if rotated.meta["plan"] == "rot-paced":
        plans["rot-paced"] = rotated
    for network in networks:
        sim = FluidSimulator(topo, network)
        for family, plan in plans.items():
            if family == "paced" and network is PCIE:
                continue  # its caps fit, but the trigger may fire (r5080-cx8, l20-cx7)
            assert plan.meta["predicted_s"][network.name] == pytest.approx(
                sim.run(plan).completion_s, rel=1e-6
            ), (network.name, family)
    paced = plans["paced"]
    fixed = PCIE_FAIR.barrier_s + PCIE_FAIR.issue_s + _latency_s(paced, topo, PCIE_FAIR)
    assert paced.meta["predicted_s"]["pcie-fair"] == pytest.approx(
        paced.meta["horizon_s"] + fixed, rel=1e-9
    )


def test_predictor_bounds_contended_plans() -> None:
    """Unpaced concurrent plans are estimates (the link bound): within a stated band of the
    simulation on one deployment (docs/planner.md has the benchmark)."""
    topo = preset("r5080-bf3", 2)
    model = PathModel(topo)
    demand = workloads.moe(16, 128, seed=0)
    plan = _built(_chooser(model), "concurrent", demand, (PCIE, NONE))
    for network in (PCIE, NONE):
        ratio = (
            plan.meta["predicted_s"][network.name]
            / FluidSimulator(topo, network).run(plan).completion_s
        )
        assert abs(ratio - 1) <= 0.02, (network.name, ratio)


@pytest.mark.parametrize(
    ("name", "nodes"), [("r5080-bf3", 2), ("l20-cx7", 1), ("fig1", 1), ("direct-8", 2)]
)
def test_one_step_plans_are_predicted_in_closed_form_as_by_their_transfers(name, nodes) -> None:
    """The choice predicts the concurrent families from the demand's per-rank and per-group
    sums, without building them (``ChoiceCore::concurrent_tallies``; direct-8's group pairs of
    one route through a root complex tallied rank pair by rank pair), and the paced plan from
    its pieces (``paced_tally``); built (``NativeChooser.apply``, a decision made ahead for the
    paced split), each plan's own transfers predict the same time under every model."""
    topo = preset(name, nodes)
    model = PathModel(topo)
    chooser = _chooser(model)
    n = topo.num_ranks
    rng = np.random.default_rng(7)
    demand = rng.integers(0, 8 << 20, size=(n, n)).astype(np.int64)
    demand[rng.random((n, n)) > 0.6] = 0
    np.fill_diagonal(demand, 0)
    networks = (PCIE, PCIE_FAIR, NONE)
    _, record = chooser.choose(demand, networks, algorithm2=False)
    for family in CONCURRENT:
        built = _built(chooser, family, demand, networks)
        for network in networks:
            assert built.meta["predicted_s"][network.name] == pytest.approx(
                record["predicted_s"][network.name][family], rel=1e-12
            ), (family, network.name)
    decision, ahead = chooser.decide(demand, (PCIE_FAIR,), algorithm2=False)
    assert (decision.plan == "paced") is (name != "fig1")  # fig1: multipath, as fast
    if decision.plan == "paced":
        built = chooser.apply(decision, demand, (PCIE_FAIR,))
        assert built.meta["predicted_s"]["pcie-fair"] == pytest.approx(
            ahead["predicted_s"]["pcie-fair"]["paced"], rel=1e-12
        )


# ----- the paced split against HiGHS ------------------------------------------------------------
def _split_lp(model: PathModel, demand: np.ndarray) -> tuple[float, Callable]:
    """The LP the paced split solves (docs/planner.md; ``aggregate`` of the Python reference
    removed in 2048aca): per group pair with demand, its bytes V_ad = Σ D_ij split over its
    ``PACED_ROUTES`` fastest candidate routes (fastest first, stable) so that the most loaded
    link is least loaded: min T s.t. base_l + Σ_c V_c p_c [l ∈ c] ≤ C_l T, Σ_{c of a pair} p_c
    = 1, p ≥ 0, over the routes' links (the endpoint links carry every rank's row and column
    sums whatever the split: not in it); a group pair of one route is a fixed base load. Its
    optimum (s), solved by HiGHS, and the most loaded link's time (s) of a split given as the
    C++ core's column fractions (pairs in row-major order, the routes of each pair of
    several)."""
    group_of = np.asarray(model.group_of)
    g = int(group_of.max()) + 1
    grouped = np.zeros((g, g))
    np.add.at(grouped, (group_of[:, None], group_of[None, :]), demand.astype(np.float64))
    cap = np.array([lk.gbs * 1e9 for lk in model.topology.graph.links])
    base = np.zeros(len(cap))
    cols, pair_of, volume = [], [], []
    for a, d in zip(*np.nonzero(grouped), strict=True):
        routes = sorted(model.routes(int(a), int(d)), key=lambda r: -r.rate)[:PACED_ROUTES]
        if len(routes) == 1:
            base[list(routes[0].links)] += grouped[a, d]
            continue
        for r in routes:
            cols.append(r.links)
            pair_of.append(len(volume))
        volume.append(grouped[a, d])
    volume = np.array(volume)
    inc = np.zeros((len(cap), len(cols)))  # bytes on each link per unit of each column
    for c, links in enumerate(cols):
        inc[list(links), c] += volume[pair_of[c]]
    used = np.flatnonzero((inc.any(axis=1) | (base > 0)) & (cap > 0))
    # bytes in units of the largest pair, T in units of its time on the fastest link: the
    # coefficients stay near 1 at any volume (HiGHS drops matrix entries under 1e-9)
    scale, fastest = float(volume.max(initial=1.0)), float(cap.max())
    a_eq = np.zeros((len(volume), len(cols) + 1))
    a_eq[pair_of, np.arange(len(cols))] = 1.0
    lp = scipy.optimize.linprog(
        np.r_[np.zeros(len(cols)), 1.0],
        A_ub=np.hstack([inc[used] / scale, -cap[used, None] / fastest]),
        b_ub=-base[used] / scale,
        A_eq=a_eq,
        b_eq=np.ones(len(volume)),
        bounds=(0, None),
        method="highs",
    )
    assert lp.status == 0, lp.message

    def max_time(frac: np.ndarray) -> float:
        assert len(frac) == len(cols)
        return float(((base + inc @ frac)[used] / cap[used]).max(initial=0.0))

    return lp.fun * scale / fastest, max_time


def _paced_lp_s(model: PathModel, demand: np.ndarray) -> float:
    """The paced plan's rank-level LP (the paced family's statement, which the Python ``paced``
    solved with HiGHS before issue 28 solved it online): every rank pair's bytes split over its
    ``PACED_ROUTES`` fastest candidate routes, min T s.t. every link's bytes ≤ C_l T (endpoint
    links included) and every piece ≤ bw(r) T. Its optimum (s) by HiGHS: no paced plan,
    whatever its split and rounding, has a shorter horizon."""
    col = route_columns(model, demand)
    cap = np.array([lk.gbs for lk in model.topology.graph.links])  # GB/s = B/ns
    k = col.size
    scale, fastest = float(col.volume.max()), float(cap.max())
    used = np.flatnonzero(col.links.getnnz(axis=1))
    a_ub = scipy.sparse.vstack(
        [
            scipy.sparse.hstack([col.links[used], -cap[used, None] / fastest]),
            scipy.sparse.hstack([scipy.sparse.eye(k), -col.rate[:, None] / fastest]),
        ]
    )
    a_eq = scipy.sparse.hstack(
        [
            scipy.sparse.csr_matrix(
                (np.ones(k), (col.pair_of, range(k))), shape=(len(col.pairs), k)
            ),
            scipy.sparse.csr_matrix((len(col.pairs), 1)),
        ]
    )
    lp = scipy.optimize.linprog(
        np.r_[np.zeros(k), 1.0],
        A_ub=a_ub.tocsr(),
        b_ub=np.zeros(a_ub.shape[0]),
        A_eq=a_eq.tocsr(),
        b_eq=col.volume / scale,
        bounds=(0, None),
        method="highs",
    )
    assert lp.status == 0, lp.message
    return lp.fun * scale / fastest * 1e-9


def _endpoint_s(model: PathModel, demand: np.ndarray) -> float:
    """No plan moves ``demand`` faster (s): every byte a GPU sends crosses its uplink and every
    byte it receives its downlink."""
    links = model.topology.graph.links
    n = len(demand)
    up = np.array([links[model.endpoint_links(i)[0]].gbs * 1e9 for i in range(n)])
    down = np.array([links[model.endpoint_links(i)[1]].gbs * 1e9 for i in range(n)])
    out = demand.sum(axis=1) - np.diag(demand)
    into = demand.sum(axis=0) - np.diag(demand)
    return float(max((out / up).max(initial=0.0), (into / down).max(initial=0.0)))


def _paced_horizon_s(chooser, demand: np.ndarray, warm=None) -> tuple[float, dict, Schedule]:
    """The C++ core's paced plan of ``demand``, its split solved in full (``every``): its
    horizon (its predicted time under ``BARE``), the choice's record and its chosen plan."""
    schedule, record = chooser.choose(
        demand, (BARE,), warm=warm, algorithm2=False, hybrid=False, every=True
    )
    assert record["split_iterations"] == 150  # kSplitIterations: whatever it costs
    return record["predicted_s"]["bare"]["paced"], record, schedule


def _check_split(model: PathModel, demand: np.ndarray, chooser=None) -> dict:
    """The C++ core's paced split of ``demand`` against the two LPs: the group-level split LP it
    solves (its column fractions no better than the optimum, and, with the endpoint bound it
    stops at, within the split's 1% tolerance of it) and the paced family's rank-level LP (its
    plan's horizon never below the optimum, within 1% of it); the endpoint bound is the test's
    and below both optima. Where the choice takes the paced plan, it is the horizon's, serves
    the demand and keeps every link's caps within its capacity. Returns the choice's record."""
    topo = model.topology
    chooser = chooser or _chooser(model)
    horizon, record, schedule = _paced_horizon_s(chooser, demand)
    split_s, max_time = _split_lp(model, demand)
    lp_s = _paced_lp_s(model, demand)
    endpoint = record["endpoint_s"]
    assert endpoint == pytest.approx(_endpoint_s(model, demand), rel=1e-12)
    assert endpoint <= lp_s * (1 + 1e-9) and split_s <= lp_s * (1 + 1e-9)
    frac = np.asarray(record["fractions"])
    assert (frac >= 0).all()
    found = max_time(frac)
    assert found >= split_s * (1 - 1e-9)
    assert max(found, endpoint) <= max(split_s, endpoint) * 1.01, (found, split_s, endpoint)
    assert lp_s * (1 - 1e-9) <= horizon <= lp_s * 1.01, (horizon, lp_s)
    if record["plan"] == "paced":
        assert schedule.meta["horizon_s"] == pytest.approx(horizon, rel=1e-12)
        assert validate(schedule, demand, topo).ok
        load = np.zeros(len(topo.graph.links))
        for t in schedule.steps[0].transfers:
            load[list(t.path)] += t.rate
        assert (load <= np.array([lk.gbs for lk in topo.graph.links]) * (1 + 1e-9)).all()
    return record


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topo_name=st.sampled_from(
        [("r5080-bf3", 1), ("r5080-bf3", 2), ("r5080-cx8", 2), ("l20-cx7", 1), ("fig1", 1)]
    ),
    seed=st.integers(0, 2**16),
    skew=st.floats(0.0, 1.2),
    kib=st.integers(1024, 65536),
)
def test_online_split_within_one_percent_of_highs(topo_name, seed, skew, kib) -> None:
    """The mirror-prox split aggregated by group pair paces the demand within 1% of the
    rank-level LP's horizon (HiGHS) and within its tolerance of the group-level LP it solves
    (``_check_split``); a warm start from the split of another demand does as well. From 1 MiB
    per rank: below, whole pieces of at least ``PACED_MIN_BYTES`` make the rank-level LP's
    per-pair choice matter (eight Zipf demands each, 2026-12-07: 256 KiB per rank up to 2.2%
    over on l20-cx7 x 2; 16 KiB up to 10.8% on r5080-bf3 x 1, a fraction of a µs against a
    20 µs barrier)."""
    model = PathModel(preset(*topo_name))
    n = model.topology.num_ranks
    demand = workloads.zipf(n, skew, kib << 10, seed=seed)
    np.fill_diagonal(demand, 0)
    chooser = _chooser(model)
    record = _check_split(model, demand, chooser)
    other = workloads.zipf(n, skew, kib << 10, seed=seed + 1)
    np.fill_diagonal(other, 0)
    assert np.array_equal(other > 0, demand > 0)  # Zipf: every pair, the same columns
    warm, _, _ = _paced_horizon_s(chooser, other, warm=record["fractions"])
    assert warm <= _paced_lp_s(model, other) * 1.01


@pytest.mark.parametrize(("name", "nodes"), [("l20-cx7", 2), ("r5090-bf3", 1)])
def test_online_split_on_larger_deployments(name, nodes) -> None:
    """Where volume-weighted route costs once left the split 5.6% over the LP (l20-cx7 x 2,
    MoE M = 128): within 1% of HiGHS."""
    model = PathModel(preset(name, nodes))
    _check_split(model, workloads.moe(model.topology.num_ranks, 128, seed=0))


@pytest.mark.parametrize(("name", "nodes"), [("r5090-bf3", 2), ("l20-cx7", 2), ("r5080-bf3", 2)])
def test_the_split_does_not_depend_on_the_calls_before_it(name, nodes) -> None:
    """The paced split starts from the deployment's reference split (the uniform demand's,
    solved once per topology), not from the last call's: a demand's fractions are the same
    before and after the chooser split other demands, and within 1% of HiGHS (the split solved
    whatever its planning costs: ``every``). The reference split itself, applied to the uniform
    demand it was solved for (``NativeChooser.apply`` of a decision without a split), is within
    1% of HiGHS too."""
    model = PathModel(preset(name, nodes))
    n = model.topology.num_ranks
    chooser = _chooser(model)
    demands = [workloads.moe(n, 128, seed=1), workloads.zipf(n, 0.9, 64 << 20, seed=2)]
    for demand in demands:
        np.fill_diagonal(demand, 0)
    first = [chooser.choose(d, (PCIE,), every=True)[1]["fractions"] for d in demands]
    chooser.choose(workloads.moe(n, 8, seed=9), (PCIE,))
    for demand, before in zip(reversed(demands), reversed(first), strict=True):
        assert np.array_equal(chooser.choose(demand, (PCIE,), every=True)[1]["fractions"], before)
        _check_split(model, demand, chooser)
    uniform = workloads.uniform(n, 1 << 20)
    reference = _built(chooser, "paced", uniform, (BARE,))
    lp_s = _paced_lp_s(model, uniform)
    assert lp_s * (1 - 1e-9) <= reference.meta["predicted_s"]["bare"] <= lp_s * 1.01


def test_the_paced_plan_of_a_terabyte_per_rank() -> None:
    """The paced plan at any volume (its split in fractions, its pieces in whole bytes): 1 TiB
    per rank on r5080-bf3 is paced, valid and simulated in 1024 times the time of 1 GiB, with
    the reference split and with the demand's own (its predicted horizon)."""
    topo = preset("r5080-bf3", 1)
    model, sim = PathModel(topo), FluidSimulator(topo, PCIE)
    chooser = _chooser(model)
    small = workloads.zipf(8, 0.6, 1 << 30, seed=0)
    times, horizons = [], []
    for demand in (small, small << 10):
        sch = _built(chooser, "paced", demand, (PCIE,))
        assert validate(sch, demand, topo).ok
        times.append(sim.run(sch).completion_s)
        horizons.append(_paced_horizon_s(chooser, demand)[0])
    assert times[1] == pytest.approx(1024 * times[0], rel=0.01)
    assert horizons[1] == pytest.approx(1024 * horizons[0], rel=0.01)


@pytest.mark.parametrize(
    ("name", "nodes", "workload"),
    [("l20-cx7", 2, "moe8"), ("r5080-bf3", 1, "moe128"), ("r5080-bf3", 1, "uniform")],
)
def test_the_split_runs_only_as_long_as_it_may_pay(name, nodes, workload) -> None:
    """Planning is on the call's critical path: the paced split gets as many mirror-prox
    iterations as the planning slack the concurrent families leave pays for (at most 150), none
    where even its fixed cost does not pay (no ``paced`` then, nor its rotation). The slack
    grows with the data, its cost does not: the same pattern scaled up gets as many iterations
    or more, from none (4 KiB a pair: too little to gain) to all of them; ``every`` gives all
    of them whatever the size."""
    model = PathModel(preset(name, nodes))
    n = model.topology.num_ranks
    base = {
        "moe8": workloads.moe(n, 8, seed=0),
        "moe128": workloads.moe(n, 128, seed=0),
        "uniform": workloads.uniform(n, 4096),
    }[workload]
    chooser = _chooser(model)
    got = []
    for shift in range(0, 12, 2):
        demand = base << shift
        record = chooser.choose(demand, (NONE,))[1]
        iterations = record["split_iterations"]
        assert -1 <= iterations <= 150
        assert ("paced" in record["regret"]) is (iterations >= 0)
        assert "rot-paced" not in record["regret"] or iterations >= 0
        assert record["endpoint_s"] == pytest.approx(_endpoint_s(model, demand), rel=1e-12)
        assert chooser.choose(demand, (NONE,), every=True)[1]["split_iterations"] == 150
        got.append(iterations)
    assert got == sorted(got) and got[-1] == 150, got
    assert workload != "uniform" or got[0] == -1, got


def test_rank_filter_expands_each_ranks_share_of_the_same_plan() -> None:
    """Every rank derives the same split and horizon and builds only its own transfers, those it
    sends or receives, in the plan's order: the ones it sends, over every rank, are the whole
    plan; as the choice's paced plan (``rank``) and as a paced decision applied (the op's call
    path, here the deployment's reference split)."""
    topo = preset("r5080-bf3", 2)
    model = PathModel(topo)
    chooser = _chooser(model)
    demand = workloads.moe(16, 64, seed=5)
    networks = (PCIE_FAIR,)
    whole, record = chooser.choose(demand, networks)
    assert record["plan"] == "paced"
    decision = _native.Decision("paced")
    applied = _built(chooser, "paced", demand, networks)
    for plan, share in (
        (whole, lambda rank: chooser.choose(demand, networks, rank=rank)),
        (applied, lambda rank: (chooser.apply(decision, demand, networks, rank=rank), None)),
    ):
        union = []
        for rank in range(16):
            mine, mine_record = share(rank)
            if mine_record is not None:
                assert np.array_equal(mine_record["fractions"], record["fractions"])
            assert mine.meta["horizon_s"] == plan.meta["horizon_s"]
            assert list(mine.steps[0].transfers) == [
                t for t in plan.steps[0].transfers if rank in (t.src, t.dst)
            ]
            union += [t for t in mine.steps[0].transfers if t.src == rank]
        assert union == list(plan.steps[0].transfers)


def test_cpp_choice_checks_its_input() -> None:
    """Malformed input is a clear error: a demand of another size, a warm start of the wrong
    size (a previous call's split of other columns), a rank the topology lacks."""
    model = PathModel(preset("r5080-bf3", 1))
    demand = workloads.moe(8, 32, seed=0)
    chooser = _chooser(model)
    with pytest.raises(ValueError, match="topology has 8 ranks"):
        chooser.choose(np.zeros((4, 4), dtype=np.int64), (PCIE,))
    with pytest.raises(ValueError, match="warm start"):
        chooser.choose(demand, (PCIE,), warm=np.ones(3))
    with pytest.raises(ValueError, match="rank 9"):
        chooser.choose(demand, (PCIE,), rank=9)


# ----- the choice --------------------------------------------------------------------------------
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topo_name=st.sampled_from([("r5080-bf3", 1), ("r5080-bf3", 2), ("fig1", 1)]),
    seed=st.integers(0, 2**16),
    density=st.floats(0.02, 1.0),
)
def test_algorithm2_takes_at_least_the_activations_its_gate_counts(topo_name, seed, density):
    """The activation count the gate on Algorithm 2's planning multiplies
    (``ChoiceCore::algorithm2_work_s``: the most peers a rank sends to or receives from) never
    exceeds what Algorithm 2 takes: a channel serves a rank once."""
    from variopath_jax.planner.schedulers import make_planner, params_of

    model = PathModel(preset(*topo_name))
    n = model.topology.num_ranks
    rng = np.random.default_rng(seed)
    demand = rng.integers(1, 1 << 20, size=(n, n)).astype(np.int64)
    demand[rng.random((n, n)) > density] = 0
    np.fill_diagonal(demand, 0)
    planner = make_planner(model, params_of(PlanRequest(demand, model, LAM)))
    schedule = planner.plan(demand)
    peers = demand > 0
    counted = max(peers.sum(axis=1).max(initial=0), peers.sum(axis=0).max(initial=0))
    assert len(schedule.steps) >= counted


def test_algorithm2_runs_only_where_its_plans_may_pay() -> None:
    """Algorithm 2's plans are candidates only where the best plan without them minus a lower
    bound on any plan exceeds their estimated planning: on one direct-8 node MoE dispatch at
    M = 512 (where the trigger slows every concurrent family, rot-paced keeps well above the
    endpoint bound and signal-driven activations win) runs it; on eight r5080-bf3 nodes at
    M = 128 (tens of milliseconds of planning against about 1 ms) it is never run."""
    from variopath_jax.planner.schedulers import params_of

    models = (PCIE, PCIE_FAIR, NONE)
    for name, nodes, tokens, runs in (("direct-8", 1, 512, True), ("r5080-bf3", 8, 128, False)):
        model = PathModel(preset(name, nodes))
        demand = workloads.moe(model.topology.num_ranks, tokens, seed=0)
        chooser = chooser_for(model, params_of(PlanRequest(demand, model, LAM)))
        _, record = chooser.choose(demand, models, algorithm2=True)
        assert ("barrier" in record["predicted_s"]["pcie"]) is runs, nodes
        assert (record["paper_s"] > 0) is runs, nodes
        req = PlanRequest(demand, model, LAM, network=list(models))
        assert get_scheduler("variopath").plan(req).meta["algorithm2_run"] is runs, nodes
        if runs:
            assert record["plan"] == "signal", record["plan"]


def _transfers(schedule) -> list[tuple]:
    return [
        (t.src, t.dst, t.path, t.nbytes, t.carries, t.cls, t.staged, t.after)
        for st in schedule.steps
        for t in st.transfers
    ]


def _least_regret(predicted: dict[str, dict[str, float]]) -> tuple[str, dict[str, float]]:
    """The robust choice by its statement (ffi/choice.h ``robust_choice``): a candidate's regret
    is its time over the model's best, worst over the models (1 where both are 0); the least
    regret wins, ties to the smaller sum of ratios, then to the earlier candidate; only among
    the candidates predicted no slower than ``staged`` (NCCL's own plan) under the first model."""
    models = list(predicted.values())
    names = list(models[0])
    ratios = {c: [] for c in names}
    for times in models:
        best = min(times.values())
        for c in names:
            t = times[c]
            ratios[c].append(t / best if best > 0 else (1.0 if t <= 0 else np.inf))
    regret = {c: max(r) for c, r in ratios.items()}
    first = models[0]
    allowed = [c for c in names if first[c] <= first["staged"]]
    return min(allowed, key=lambda c: (regret[c], sum(ratios[c]), names.index(c))), regret


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    topo_name=st.sampled_from(
        [("r5080-bf3", 1), ("r5080-bf3", 2), ("r5080-cx8", 2), ("fig1", 1), ("direct-8", 2)]
    ),
    seed=st.integers(0, 2**16),
    density=st.floats(0.05, 1.0),
    kib=st.integers(1, 1 << 16),
    models=st.sampled_from([(PCIE,), (NONE,), (PCIE_FAIR,), (PCIE, PCIE_FAIR, NONE)]),
)
def test_cpp_choice_is_its_records_least_regret(topo_name, seed, density, kib, models) -> None:
    """The C++ choice's record holds every candidate's prediction under every model, the
    regrets they give, and the candidate of least regret among those no slower than ``staged``
    under the first model (the rule written out here); its schedule serves the demand, paces
    only a paced family's transfers (at their rates) and, for ``rank``, holds that rank's
    transfers of a paced plan (the whole plan otherwise). Without Algorithm 2's plans (a
    deployment whose screen drops them): the same rule over the other candidates."""
    topo = preset(*topo_name)
    model = PathModel(topo)
    n = topo.num_ranks
    rng = np.random.default_rng(seed)
    demand = rng.integers(0, kib << 10, size=(n, n)).astype(np.int64)
    demand[rng.random((n, n)) > density] = 0
    np.fill_diagonal(demand, 0)
    chooser = _chooser(model)
    for algorithm2 in (True, False):
        schedule, record = chooser.choose(demand, models, algorithm2=algorithm2)
        predicted = record["predicted_s"]
        assert list(predicted) == [m.name for m in models]
        assert all(list(times) == list(record["regret"]) for times in predicted.values())
        assert set(CONCURRENT) <= set(record["regret"])
        assert algorithm2 or not {"barrier", "signal"} & set(record["regret"])
        choice, regret = _least_regret(predicted)
        assert record["regret"] == pytest.approx(regret, rel=1e-12)
        assert record["plan"] == choice
        assert predicted[models[0].name][choice] <= predicted[models[0].name]["staged"]
        assert validate(schedule, demand, topo).ok
        paced = choice in ("paced", "rot-paced", "chained")
        moving = [t for step in schedule.steps for t in step.transfers]
        for t, cap in zip(moving, record["cap_bps"], strict=True):
            assert cap == (pytest.approx(t.rate * 1e9, rel=1e-12) if paced else 0.0)
        mine, _ = chooser.choose(demand, models, rank=1, algorithm2=algorithm2)
        assert _transfers(mine) == [
            t for t in _transfers(schedule) if 1 in t[:2] or choice != "paced"
        ]


def test_cpp_choice_of_an_all_zero_demand_moves_nothing() -> None:
    """With no byte to move every candidate is predicted at 0 (no step), none as NaN, and the
    chosen plan has no transfer."""
    model = PathModel(preset("r5080-bf3", 2))
    demand = np.zeros((16, 16), dtype=np.int64)
    schedule, record = _chooser(model).choose(demand, (PCIE, PCIE_FAIR, NONE))
    for times in record["predicted_s"].values():
        assert all(t == 0.0 for t in times.values()), times
    assert schedule is not None and not any(st.transfers for st in schedule.steps)


@pytest.mark.parametrize("network", [None, "pcie"])
def test_variopath_scheduler_plans_in_the_cpp_core(network) -> None:
    """The registered ``variopath`` is the C++ core's choice for the request's models (the
    unprofiled ones by default), Algorithm 2's plans as the deployment's screen says, its call
    timed in C++ within the scheduler's own time."""
    from variopath_jax.planner.schedulers import params_of

    model = PathModel(preset("r5080-bf3", 2))
    demand = workloads.moe(16, 128, seed=0)
    req = PlanRequest(demand, model, LAM, network=network)
    cpp = get_scheduler("variopath").plan(req)
    chooser = chooser_for(model, params_of(req))
    algorithm2 = chooser.algorithm2_pays(req.networks)
    schedule, record = chooser.choose(demand, req.networks, algorithm2=algorithm2)
    assert cpp.meta["plan"] == record["plan"] and cpp.meta["algorithm2"] is algorithm2
    assert cpp.meta["networks"] == [n.name for n in req.networks]
    assert cpp.meta["predicted_s"] == record["predicted_s"]
    assert cpp.meta["regret"] == record["regret"]
    assert _transfers(cpp) == _transfers(schedule)
    assert "core_s" in cpp.meta and cpp.meta["plan_s"] >= cpp.meta["core_s"]
    assert validate(cpp, demand, model.topology).ok


def test_the_registered_choice_finds_its_chooser_and_models_without_rebuilding_them() -> None:
    """Every call of ``variopath`` looks up its chooser and converts its network models: the
    model object of the last call finds its chooser before the topology is hashed, an equal
    model built anew finds the same one by content, each tuple of network models is converted
    once (a changed model is converted anew), and ``plan_s`` counts these lookups but not the
    first call's building (the catalog, the screen)."""
    from variopath_jax.planner.native import converted_networks, native_network
    from variopath_jax.planner.schedulers import chooser_for, last_chooser, params_of

    model = PathModel(preset("r5080-bf3", 1))
    demand = workloads.moe(8, 16, seed=3)
    params = params_of(PlanRequest(demand, model, LAM))
    chooser = chooser_for(model, params)
    assert last_chooser(model, params) is chooser
    twin = PathModel(preset("r5080-bf3", 1))
    assert last_chooser(twin, params) is None
    assert chooser_for(twin, params) is chooser  # equal content: the same core
    assert last_chooser(model, params) is None and last_chooser(twin, params) is chooser

    networks = (PCIE, PCIE_FAIR)
    models, key = converted_networks(networks)
    assert converted_networks(networks)[0] is models
    assert [m.name for m in models] == [native_network(n).name for n in networks]
    slower = PCIE.replace(barrier_s=2 * PCIE.barrier_s)
    other, other_key = converted_networks((slower, PCIE_FAIR))
    assert other_key != key and other[0].barrier_s == 2 * PCIE.barrier_s

    # models no other test screens this deployment under: the first call screens, uncounted
    req = PlanRequest(demand, twin, LAM, network=(slower, PCIE_FAIR))
    before = time.perf_counter()
    first = get_scheduler("variopath").plan(req)
    used = last_chooser(twin, params_of(req))
    assert used is not None and used.ready_at > before  # readied during the call
    readied = used.ready_at
    again = get_scheduler("variopath").plan(req)
    assert used.ready_at == readied  # nothing built or screened: every lookup counted
    assert again.meta["plan_s"] > 0 and again.meta["core_s"] <= again.meta["plan_s"]
    assert first.meta["plan"] == again.meta["plan"]
    # requests that do not name their models share the defaults' objects, per λ
    assert PlanRequest(demand, model, LAM).networks is PlanRequest(demand, twin, LAM).networks


@pytest.mark.parametrize(
    ("name", "nodes", "triggers"),
    [("l20-cx7", 1, True), ("r5080-cx8", 1, True), ("r5080-cx8", 2, True), ("r5080-bf3", 2, False)],
)
def test_the_choice_charges_the_trigger_where_it_fires(name, nodes, triggers) -> None:
    """MoE dispatch (M = 128): where a node has two root ports a switch's uplink writes to, the
    one-step concurrent and paced plans push writes toward two or more root complexes at once,
    the predictor charges the trigger under ``pcie`` (several times their ``pcie-fair`` time),
    and ``rot-paced`` is a candidate, predicted alike under both (it never triggers); on
    r5080-bf3 every uplink writes only toward the other socket's root complex: nothing
    triggers, no rot-paced. The simulator agrees on the trigger: the paced plan (caps that fit)
    is predicted as it runs under both models."""
    model = PathModel(preset(name, nodes))
    topo = model.topology
    demand = workloads.moe(topo.num_ranks, 128, seed=0)
    chooser = _chooser(model)
    # every candidate, whatever its planning costs: what is predicted, not what pays
    _, record = chooser.choose(demand, (PCIE, PCIE_FAIR), every=True)
    pcie, fair = record["predicted_s"]["pcie"], record["predicted_s"]["pcie-fair"]
    assert ("rot-paced" in pcie) is triggers
    for plan in ("concurrent", "paced"):
        if triggers:
            assert pcie[plan] > 3 * fair[plan], plan
        else:
            assert pcie[plan] == pytest.approx(fair[plan], rel=1e-12), plan
    if triggers:
        assert pcie["rot-paced"] == pytest.approx(fair["rot-paced"], rel=1e-12)
    paced = _built(chooser, "paced", demand, (PCIE, PCIE_FAIR))
    ratio = {
        network.name: paced.meta["predicted_s"][network.name]
        / FluidSimulator(topo, network).run(paced).completion_s
        for network in (PCIE, PCIE_FAIR)
    }
    assert ratio["pcie-fair"] == pytest.approx(1.0, rel=1e-6)
    assert 0.9 <= ratio["pcie"] <= 1.5, ratio  # the trigger's charge: not optimistic


def _trigger_watch(monkeypatch) -> list[int]:
    """Wraps the simulator's trigger state (``_Run._recount``): after every change of the live
    flows, the most root complexes one uplink's writes target, appended to the list returned."""
    from variopath_jax.sim import fluid

    seen: list[int] = []
    recount = fluid._Run._recount

    def watched(self, flows, sign):
        recount(self, flows, sign)
        if self.trigger_factor is not None:
            seen.append(int((self.writes_to > 0.5).sum(axis=1).max(initial=0)))

    monkeypatch.setattr(fluid._Run, "_recount", watched)
    return seen


@pytest.mark.parametrize("name", ["r5080-cx8", "l20-cx7", "trpro-4sw"])
def test_rot_paced_never_triggers(name, monkeypatch) -> None:
    """Brute force over small topologies and demands: in the simulator (its own trigger state,
    after every change of the live flows) no uplink of a rot-paced plan ever writes toward two
    root complexes at once, while the paced plan of the same demand does; it serves the demand
    (validated), its transfers' rates never above their routes' (the pieces' own times are in
    its horizon). Both rot-paced plans of the C++ core: a decision's applied (its phases split
    by route rate) and the choice's (its phase split solved from the paced one's)."""
    model = PathModel(preset(name, 1))
    topo, n = model.topology, model.topology.num_ranks
    chooser = _chooser(model)
    demands = [
        workloads.moe(n, 128, seed=0),
        workloads.moe(n, 32, seed=1),
        workloads.zipf(n, 0.8, 16 << 20, seed=2),
        workloads.uniform(n, 1 << 20),
    ]
    seen = _trigger_watch(monkeypatch)
    chosen = 0
    for demand in demands:
        np.fill_diagonal(demand, 0)
        plan = _built(chooser, "paced", demand, (PCIE,))
        rotated = [_built(chooser, "rot-paced", demand, (PCIE,))]
        schedule, record = chooser.choose(demand, (PCIE,), algorithm2=False, every=True)
        assert "rot-paced" in record["regret"]
        if record["plan"] == "rot-paced":
            rotated.append(schedule)
            chosen += 1
        for rot in rotated:
            assert validate(rot, demand, topo).ok
            rates = {path.links: r.rate for path, r in _paths(model, rot)}
            assert all(t.rate <= rates[t.path] for t in rot.steps[0].transfers)
            seen.clear()
            FluidSimulator(topo, PCIE).run(rot)
            assert seen and max(seen) == 1
        seen.clear()
        FluidSimulator(topo, PCIE).run(plan)
        assert max(seen) >= 2
    assert chosen >= 2  # the choice under pcie takes rot-paced for most of them


def _paths(model, schedule):
    """Every transfer's path and the candidate route it takes."""
    g = model.group_of
    for t in schedule.steps[0].transfers:
        for r in model.routes(int(g[t.src]), int(g[t.dst])):
            path = model.path(t.src, t.dst, r)
            if path.links == t.path:
                yield path, r
                break


def test_rot_paced_beats_the_triggering_plans_on_l20_cx7() -> None:
    """l20-cx7 MoE dispatch (M = 128) under ``pcie``: with its planning free (``hybrid="all"``,
    a study of plans; per call, rot-paced's planning does not pay for itself here since c53fd36
    gated it, and ``staged`` is chosen) the choice takes rot-paced, which the simulator runs at
    under a third of the time of the one-step plans it rotates (concurrent, and paced with the
    demand's own split, ``pcie-fair``'s choice: the trigger), within 5% of that paced plan
    without the trigger (``pcie-fair``)."""
    for nodes in (1, 2):
        model = PathModel(preset("l20-cx7", nodes))
        topo = model.topology
        demand = workloads.moe(topo.num_ranks, 128, seed=0)
        request = PlanRequest(demand, model, LAM, options={"hybrid": "all"})
        chosen = get_scheduler("variopath").plan(request)
        assert chosen.meta["plan"] == "rot-paced", nodes
        assert validate(chosen, demand, topo).ok
        chooser = _chooser(model)
        plan, record = chooser.choose(demand, (PCIE_FAIR,), algorithm2=False)
        assert record["plan"] == "paced", nodes
        concurrent = _built(chooser, "concurrent", demand, (PCIE,))
        pcie = FluidSimulator(topo, PCIE)
        rotated = pcie.run(chosen).completion_s
        one_step = min(pcie.run(p).completion_s for p in (plan, concurrent))
        assert rotated < one_step / 3, nodes
        assert rotated <= FluidSimulator(topo, PCIE_FAIR).run(plan).completion_s * 1.05, nodes


@pytest.mark.parametrize(
    ("name", "nodes"), [("l20-cx7", 1), ("l20-cx7", 2), ("r5080-cx8", 1), ("r5080-cx8", 2)]
)
def test_the_choice_is_not_optimistic_where_the_trigger_fires(name, nodes) -> None:
    """The chosen plan (the default models, the C++ core) of MoE dispatch (M = 128) and of a
    uniform 64 MiB per rank on the topologies where one-step plans trigger: its predicted time
    under ``pcie`` is at least 0.9 of what the simulator measures (the predictor never sells a
    triggering plan as fast), and at most 1.5 of it."""
    model = PathModel(preset(name, nodes))
    topo, n = model.topology, model.topology.num_ranks
    for demand in (workloads.moe(n, 128, seed=0), workloads.uniform(n, (64 << 20) // (n - 1))):
        chosen = get_scheduler("variopath").plan(PlanRequest(demand, model, LAM))
        predicted = chosen.meta["predicted_s"]["pcie"][chosen.meta["plan"]]
        simulated = FluidSimulator(topo, PCIE).run(chosen).completion_s
        assert 0.9 <= predicted / simulated <= 1.5, (chosen.meta["plan"], predicted, simulated)
