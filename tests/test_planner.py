"""The online planner (Algorithm 2): exact reconstruction, feasibility, termination, the C++ core's
identity with the Python reference, determinism, and the ablations."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from helpers import tiny4
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from variopath_jax import _native, workloads
from variopath_jax.catalog import get_catalog, store
from variopath_jax.planner import PlannerParams, ReferencePlanner
from variopath_jax.planner.native import NativePlanner, native_deployment, native_params
from variopath_jax.planner.reference import GRANULARITIES, LEAVING_PRICES
from variopath_jax.schedule import validate
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import (
    NONE,
    PCIE,
    PCIE_FAIR,
    FluidSimulator,
    NetworkModelError,
    legacy_model,
)
from variopath_jax.topology import PathModel, preset

TOPOLOGIES = {
    "fig1": preset("fig1"),
    "fig1x2": preset("fig1", 2),
    "fig1x4": preset("fig1", 4),
    "tiny4": tiny4(),
    "r5080-bf3": preset("r5080-bf3"),
    "balanced-8x2": preset("balanced-8", 2),
    "r5080-bf3x2": preset("r5080-bf3", 2),
    "r5080-bf3x3": preset("r5080-bf3", 3),
    "r5090-bf3": preset("r5090-bf3"),
}
SMALL = ["balanced-8x2", "fig1", "fig1x2", "r5080-bf3", "r5080-bf3x2", "tiny4"]
_planners: dict = {}
_catalogs: dict = {}


def catalog(name: str):
    if name not in _catalogs:
        _catalogs[name] = get_catalog(TOPOLOGIES[name], cache=False)
    return _catalogs[name]


def planners(name: str, params: PlannerParams):
    key = (name, params)
    if key not in _planners:
        topo = TOPOLOGIES[name]
        model = PathModel(topo)
        cat = catalog(name)
        _planners[key] = (
            model,
            ReferencePlanner(cat, model, params),
            NativePlanner(cat, model, params),
        )
    return _planners[key]


DEFAULT = PlannerParams()


def check(name: str, demand: np.ndarray, params: PlannerParams = DEFAULT) -> None:
    model, ref, core = planners(name, params)
    a = ref.plan(demand)
    b = core.plan(demand)
    assert a.to_dict() == b.to_dict()  # byte-identical schedules
    v = validate(a, demand, model.topology)
    assert v.ok, v.errors  # every byte served exactly once; every step a feasible channel
    assert a.kind == "channel"
    assert core.plan(demand).to_dict() == b.to_dict()  # deterministic
    if a.steps:
        res = FluidSimulator(model.topology, legacy_model(1e-6, a.lambda_s)).run(a)
        assert res.completion_s == pytest.approx(a.modeled_time(1e-6), rel=1e-9)  # contention-free


@st.composite
def demands(draw):
    name = draw(st.sampled_from(SMALL))
    n = TOPOLOGIES[name].num_ranks
    kind = draw(st.sampled_from(["dense", "sparse", "skew", "tiny"]))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    if kind == "dense":
        d = rng.integers(1, 1 << 22, size=(n, n))
    elif kind == "sparse":
        d = rng.integers(1, 1 << 22, size=(n, n)) * (rng.random((n, n)) < 0.2)
    elif kind == "skew":
        d = (rng.pareto(0.7, size=(n, n)) * 1e5).astype(np.int64) + (
            rng.random((n, n)) < 0.05
        ) * 10**9
    else:
        d = rng.integers(0, 3, size=(n, n))
    np.fill_diagonal(d, 0)
    return name, d.astype(np.int64)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(demands())
def test_random_demands(case) -> None:
    name, demand = case
    check(name, demand)


@pytest.mark.parametrize("name", ["fig1", "r5080-bf3x2"])
def test_edge_demands(name: str) -> None:
    n = TOPOLOGIES[name].num_ranks
    zero = np.zeros((n, n), dtype=np.int64)
    _model, ref, core = planners(name, PlannerParams())
    assert core.plan(zero).steps == [] and ref.plan(zero).steps == []
    single = zero.copy()
    single[n - 1, 0] = 12345
    check(name, single)
    ones = np.ones((n, n), dtype=np.int64) - np.eye(n, dtype=np.int64)
    check(name, ones)
    huge = ones.copy()
    huge[0, n - 1] = 10**12  # a terabyte among single bytes
    check(name, huge)


@pytest.mark.parametrize(
    "params",
    [
        PlannerParams(k_target=40, granularity="fixed"),
        PlannerParams(starts=1, sweeps=1),
        PlannerParams(seed=7, lambda_s=0.0),
        PlannerParams(max_candidates=1),
    ],
)
def test_parameters(params: PlannerParams) -> None:
    demand = workloads.zipf(16, 0.8, 1 << 20, seed=3)
    check("r5080-bf3x2", demand, params)


knobs = st.builds(
    PlannerParams,
    lambda_s=st.sampled_from([0.0, 5e-6, 20e-6]),
    k_target=st.one_of(st.none(), st.integers(1, 48)),
    starts=st.integers(1, 5),
    sweeps=st.integers(1, 4),
    seed=st.integers(0, 2**64 - 1),
    granularity=st.sampled_from(GRANULARITIES),
    max_candidates=st.integers(1, 10),
    leaving_price=st.sampled_from(LEAVING_PRICES),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["r5080-bf3x2", "r5080-bf3x3", "fig1x4", "r5090-bf3", "balanced-8x2"]),
    knobs,
    st.sampled_from(["zipf", "moe", "sparse"]),
    st.integers(0, 2**31),
)
def test_every_knob_on_every_scale(name: str, params: PlannerParams, kind: str, seed: int) -> None:
    """The C++ core and the reference agree for every knob (the leaving price included), on 3-
    and 4-node factored deployments and on r5090-bf3's large flat catalog."""
    n = TOPOLOGIES[name].num_ranks
    if kind == "zipf":
        demand = workloads.zipf(n, 1.2, 4 << 20, seed=seed)
    elif kind == "moe":
        demand = workloads.moe(n, 64, seed=seed)
    else:
        rng = np.random.default_rng(seed)
        demand = rng.integers(1, 1 << 20, (n, n)) * (rng.random((n, n)) < 0.15)
        np.fill_diagonal(demand, 0)
    check(name, demand.astype(np.int64), params)


def test_the_boundary_mirrors_the_reference() -> None:
    """Every planner knob exists on both sides of the typed boundary, and lane kinds agree."""
    from variopath_jax.planner.reference import LaneKind

    native = {a for a in dir(_native.PlanParams()) if not a.startswith("_")}
    assert native == {f.name for f in fields(PlannerParams)}
    assert {k.name: int(k) for k in LaneKind} == {
        k: v.value for k, v in _native.LaneKind.__members__.items()
    }
    p = native_params(PlannerParams(leaving_price="sum", granularity="fixed", k_target=12))
    assert (p.leaving_price, p.granularity, p.k_target) == (
        _native.LeavingPrice.SUM,
        _native.Granularity.FIXED,
        12,
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("starts", 0, "starts must be >= 1"),
        ("sweeps", -1, "sweeps must be >= 1"),
        ("max_candidates", 0, "max_candidates must be >= 1"),
        ("lambda_s", -1e-6, "lambda_s must be finite"),
        ("granularity", "coarse", "granularity must be one of"),
        ("leaving_price", "median", "leaving_price must be one of"),
        ("k_target", 0, "k_target must be >= 1"),
    ],
)
def test_bad_parameters_are_refused_on_both_sides(field: str, value, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlannerParams(**{field: value})
    if field in ("granularity", "leaving_price", "k_target"):
        return  # the native struct's types cannot even hold these
    _, _, core = planners("r5080-bf3", PlannerParams())
    bad = native_params(PlannerParams())
    setattr(bad, field, value)
    with pytest.raises(ValueError, match=message):
        core._core.plan(np.ones((8, 8), dtype=np.int64), bad)


def test_an_inconsistent_deployment_is_refused() -> None:
    from variopath_jax._native import Planner

    model = PathModel(TOPOLOGIES["r5080-bf3x2"])
    cat = catalog("r5080-bf3x2")
    blob = store.dumps(cat)
    for field, value, message in [
        ("group_of", list(range(15)), "per-rank arrays"),
        ("group_ranks", [0, 1], "group_ranks has 2 entries"),
        ("near_ptr", [0], "near_ptr must index"),
        ("endpoint_up", [10**6] * 16, "outside the layout"),
    ]:
        dep = native_deployment(cat, model)
        setattr(dep, field, value)
        with pytest.raises(ValueError, match=message):
            Planner(blob, cat.fingerprint, dep)
    dep = native_deployment(cat, model)
    layout = dep.layout
    layout.links_per_node += 1
    dep.layout = layout
    with pytest.raises(ValueError, match="the catalog's node has"):
        Planner(blob, cat.fingerprint, dep)


@pytest.mark.parametrize(
    ("array", "edit", "message"),
    [
        ("fam_inst", lambda a: a.__setitem__(0, 10**6), "fam_inst holds 1000000"),
        ("fam_ptr", lambda a: a.__setitem__(-1, a[-1] + 5), "fam_ptr does not index"),
        ("route_links", lambda a: a.__setitem__(0, -3), "route_links holds -3"),
        ("route_inst_ptr", lambda a: a.__setitem__(1, a[2] + 1), "route_inst_ptr decreases"),
        ("inst_dst", lambda a: a.__setitem__(0, 99), "inst_dst holds 99"),
        ("fam_count", lambda a: a.__setitem__(0, a[0] + 1), "does not realize its shape"),
        ("fam_shape", lambda a: a.__setitem__(slice(None), 0), "has no family|does not realize"),
        ("inst_rate", lambda a: a.__setitem__(0, -1.0), "rate is not a positive"),
    ],
)
def test_a_corrupt_catalog_is_refused(array: str, edit, message: str) -> None:
    """Catalog bytes with a valid checksum but inconsistent arrays: a clear error, no crash."""
    from variopath_jax._native import Planner

    for name in ("r5080-bf3", "r5080-bf3x2"):
        cat = catalog(name)
        arrays = store._arrays(cat)
        edit(arrays[array])
        blob = store.encode_arrays(arrays)
        dep = native_deployment(cat, PathModel(TOPOLOGIES[name]))
        with pytest.raises(ValueError, match=f"corrupt catalog: .*({message})"):
            Planner(blob, cat.fingerprint, dep)


def test_granularity_follows_the_demand() -> None:
    _model, _, core = planners("r5080-bf3", PlannerParams())
    small = workloads.uniform(8, 4096)  # λ dominates: few, coarse activations
    large = workloads.uniform(8, 64 << 20)
    assert core.plan(small).meta["k"] < core.plan(large).meta["k"] == 8
    _, _, fixed = planners("r5080-bf3", PlannerParams(granularity="fixed"))
    assert fixed.plan(small).meta["k"] == 8


@pytest.mark.parametrize("name", ["variopath", "variopath-fixed-path", "variopath-fixed-peer"])
def test_registered_schedulers(name: str) -> None:
    topo = preset("r5080-bf3", 2)
    model = PathModel(topo)
    demand = workloads.zipf(16, 0.6, 1 << 20, seed=1)
    sch = get_scheduler(name).plan(PlanRequest(demand, model, 1e-5, 0, {"planner": "python"}))
    assert validate(sch, demand, topo).ok
    if name == "variopath-fixed-peer":
        n = 16
        for step in sch.steps:  # every activation is one cyclic shift
            assert len({(t.dst - t.src) % n for t in step.transfers}) == 1
    if name == "variopath-fixed-path":
        nearest = {(a, d): PathModel(topo).nearest(a, d).cls for a in range(8) for d in range(8)}
        for step in sch.steps:
            for t in step.transfers:
                assert t.cls == nearest[(int(model.group_of[t.src]), int(model.group_of[t.dst]))]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 9).flatmap(
        lambda rows: st.tuples(
            st.just(rows),
            st.integers(rows, 10),
            st.integers(0, 2**31 - 1),
            st.sampled_from([3, 20, 10**6]),
        )
    )
)
def test_assignment_solvers_agree(case) -> None:
    """The C++ Hungarian + tight-graph solver and the reference (scipy + row fixing) return the
    same lexicographically smallest optimum, ties and forbidden pairs included."""
    from variopath_jax._native import canonical_assignment as native_assignment
    from variopath_jax.planner.determinism import FORBIDDEN, canonical_assignment

    rows, cols, seed, spread = case
    rng = np.random.default_rng(seed)
    w = rng.integers(0, spread, (rows, cols)).astype(np.int64)  # few values: many ties
    w[rng.random((rows, cols)) < 0.1] = FORBIDDEN
    got = native_assignment(w.ravel().tolist(), rows, cols)
    assert got == canonical_assignment(w)
    assert len(set(got)) == rows


def test_assignment_refuses_bad_shapes() -> None:
    from variopath_jax._native import canonical_assignment as native_assignment

    with pytest.raises(ValueError, match="rows <= cols"):
        native_assignment([1, 2, 3, 4, 5, 6], 3, 2)
    with pytest.raises(ValueError, match="rows <= cols"):
        native_assignment([1, 2, 3], 2, 2)


def test_demand_of_the_wrong_shape_is_refused() -> None:
    """Both planners check the demand against their deployment; the C++ boundary does too."""
    from variopath_jax.workloads import DemandError

    _, ref, core = planners("r5080-bf3", PlannerParams())
    for planner in (ref, core):
        with pytest.raises(DemandError, match="the topology has 8 ranks"):
            planner.plan(np.ones((2, 2), dtype=np.int64))
        with pytest.raises(DemandError, match="negative"):
            planner.plan(-np.ones((8, 8), dtype=np.int64))
    with pytest.raises(ValueError, match="demand is 2x2 but the planner's deployment has 8 ranks"):
        core._core.plan(np.ones((2, 2), dtype=np.int64), core._params)


@pytest.mark.parametrize("efficiency", [0.9, {"NET": 0.8, "PXB": 0.95}])
def test_variopath_plans_with_a_path_efficiency(efficiency) -> None:
    """The catalog is keyed by the path model's efficiency, so a derated model can be planned."""
    topo = preset("r5080-bf3", 2)
    model = PathModel(topo, efficiency=efficiency)
    demand = workloads.zipf(16, 0.6, 8 << 20, seed=0)
    sch = get_scheduler("variopath").plan(PlanRequest(demand, model, 20e-6))
    assert validate(sch, demand, topo).ok
    for t in (t for step in sch.steps for t in step.transfers):
        factor = efficiency.get(t.cls, 1.0) if isinstance(efficiency, dict) else efficiency
        links = [topo.graph.links[lid].gbs for lid in t.path]
        if sch.meta.get("paced"):  # a pacing rate: never above the path's
            assert t.rate <= min(links) * factor * (1 + 1e-12)
        else:
            assert t.rate == pytest.approx(min(links) * factor)


def test_assignment_refuses_weights_out_of_range() -> None:
    from variopath_jax._native import canonical_assignment as native_assignment

    with pytest.raises(ValueError, match="2\\^50"):
        native_assignment([1 << 62, 0, 0, 1], 2, 2)


# the families the C++ core's predictor (ffi/predict.cc) predicts exactly: contention-free
# activations behind barriers or signal-driven (overlapping only where they share no link), the
# paced plans (caps that fit) and the chained plan; not oversubscribed concurrent steps (the link
# bound)
EXACTLY_PREDICTED = {"barrier", "signal", "paced", "rot-paced", "chained"}
FAMILIES = set(_native.FAMILIES)


@pytest.mark.parametrize("network", ["pcie", "pcie-fair", "none"])
@pytest.mark.parametrize(("name", "nodes"), [("r5080-bf3", 1), ("r5080-bf3", 2), ("l20-cx7", 2)])
def test_model_aware_variopath_returns_its_fastest_prediction(name, nodes, network) -> None:
    """variopath predicts every candidate under the request's network model (analytically, in
    the C++ core), returns the fastest, and the judge then measures its prediction to within 3%
    (issue 28's goal for the chosen plan) where the predictor is exact, and finds it within 2% of
    the fastest candidate (each built by the core for the demand, ``NativeChooser.apply``; the
    paced families with the deployment's reference split, the choice's own is the demand's);
    screened out or not, Algorithm 2's plan never beats it."""
    from variopath_jax import _native
    from variopath_jax.planner.schedulers import chooser_for, params_of
    from variopath_jax.runner import run_one
    from variopath_jax.sim.network import load_network

    model = PathModel(preset(name, nodes))
    demand = workloads.zipf(model.topology.num_ranks, 0.8, 8 << 20, seed=4)
    res = run_one(model, "variopath", demand, network=network)
    assert res.validation.ok, res.validation.errors
    assert res.schedule.meta["networks"] == [network]
    predicted = res.schedule.meta["predicted_s"][network]
    # the concurrent families always; the others where they may pay for their planning
    assert {"concurrent", "multipath", "staged", "staged-balanced"} <= set(predicted) <= FAMILIES
    assert ("barrier" in predicted) is res.schedule.meta["algorithm2_run"]
    assert not res.schedule.meta["algorithm2_run"] or res.schedule.meta["algorithm2"]
    assert res.schedule.meta["plan"] == min(predicted, key=predicted.get)
    if res.schedule.meta["plan"] in EXACTLY_PREDICTED:
        assert res.sim.completion_s == pytest.approx(min(predicted.values()), rel=0.03)
    # and the choice is the judge's: within 2% of the best candidate by simulation (issue 28
    # item 3), here even where the prediction is not exact (multipath on r5080-bf3 x 1: 1.8%
    # over the simulation)
    net = load_network(network)
    chooser = chooser_for(model, params_of(PlanRequest(demand, model, 20e-6, network=network)))
    sim = FluidSimulator(model.topology, net)
    judged = []
    for family in predicted:
        built = chooser.apply(_native.Decision(family), demand, (net,))
        assert built.meta["plan"] == family
        judged.append(sim.run(built).completion_s)
    assert res.sim.completion_s <= min(judged) * 1.02
    paper = run_one(model, "variopath-paper", demand, network=network)
    assert res.sim.completion_s <= paper.sim.completion_s


@pytest.mark.parametrize(
    ("name", "nodes", "workload"),
    [
        ("r5080-bf3", 1, "uniform"),
        ("r5080-bf3", 2, "moe"),
        ("l20-cx7", 2, "zipf"),
        ("fig1", 1, "zipf"),
    ],
)
def test_paced_plan_fits_every_link_and_ends_together(name, nodes, workload) -> None:
    """The paced plan serves the demand, every link's pacing caps add up to at most its capacity
    (so it simulates identically with and without contention), every transfer is paced to end at
    one horizon, and that horizon is never below the flow
    LP's (the LP over every path, a relaxation of the plan's). The C++ core's paced plan, with the
    deployment's reference split (``NativeChooser.apply``) and with the demand's own (the
    choice's, where it chooses ``paced``)."""
    from solver.bound import lower_bound
    from variopath_jax import _native
    from variopath_jax.planner.schedulers import chooser_for

    topo = preset(name, nodes)
    model = PathModel(topo)
    n = topo.num_ranks
    demand = {
        "uniform": lambda: workloads.uniform(n, 3 << 20),
        "moe": lambda: workloads.moe(n, 64, seed=2),
        "zipf": lambda: workloads.zipf(n, 0.8, 16 << 20, seed=1),
    }[workload]()
    np.fill_diagonal(demand, 0)
    chooser = chooser_for(model, PlannerParams(lambda_s=20e-6))
    plans = [chooser.apply(_native.Decision("paced"), demand, (PCIE_FAIR,))]
    chosen, record = chooser.choose(demand, (PCIE_FAIR,), algorithm2=False, every=True)
    if record["plan"] == "paced":  # under pcie-fair: all but fig1's (multipath, as fast)
        plans.append(chosen)
    for sch in plans:
        _check_paced(sch, demand, topo, lower_bound(demand, topo).lp_direct_s)


def _check_paced(sch, demand, topo, lp_s: float) -> None:
    assert sch.meta["paced"] and len(sch.steps) == 1
    assert validate(sch, demand, topo).ok
    transfers = sch.steps[0].transfers
    load = np.zeros(len(topo.graph.links))
    for t in transfers:
        load[list(t.path)] += t.rate
    assert (load <= np.array([lk.gbs for lk in topo.graph.links]) * (1 + 1e-9)).all()
    ends = np.array([t.nbytes / t.rate for t in transfers])  # ns
    horizon = ends.max()
    assert ends == pytest.approx(np.full(len(ends), horizon), rel=1e-6)
    assert horizon * 1e-9 == pytest.approx(sch.meta["horizon_s"], rel=1e-6)
    assert horizon * 1e-9 >= lp_s * (1 - 1e-6)
    # caps fit: pcie-fair charges nothing; pcie charges the root links its flows share
    paced_s, none_s, pcie_s = (
        FluidSimulator(topo, net).run(sch).completion_s for net in (PCIE_FAIR, NONE, PCIE)
    )
    assert paced_s == pytest.approx(none_s, rel=1e-12)
    assert pcie_s >= paced_s * (1 - 1e-12)


def test_variopath_unprofiled_returns_the_minimax_regret_plan() -> None:
    """With no model named, variopath plans over pcie and pcie-fair (``none`` is a reference, not
    a machine): it records every
    candidate under every model, returns the candidate whose worst ratio to each model's best is
    least (checked by brute force over the recorded times), and each model's simulator measures
    the chosen plan within 3% of its predicted time. variopath-robust is the same plan whatever the request's model,
    and a model list may be a comma-separated string or a sequence."""
    from variopath_jax.sim import load_network

    model = PathModel(preset("r5080-bf3", 2))
    demand = workloads.moe(16, 64, seed=0)
    sch = get_scheduler("variopath").plan(PlanRequest(demand, model, 20e-6))
    meta = sch.meta
    assert meta["networks"] == ["pcie", "pcie-fair"]
    predicted = meta["predicted_s"]
    names = list(predicted["pcie"])
    best = {m: min(t.values()) for m, t in predicted.items()}
    worst = {c: max(predicted[m][c] / best[m] for m in predicted) for c in names}
    assert meta["regret"] == pytest.approx(worst, rel=1e-12)
    assert worst[meta["plan"]] == min(worst.values())
    for m, times in predicted.items():
        judged = FluidSimulator(model.topology, load_network(m)).run(sch).completion_s
        assert judged == pytest.approx(times[meta["plan"]], rel=0.03), m
    robust = get_scheduler("variopath-robust").plan(
        PlanRequest(demand, model, 20e-6, network="none")
    )
    assert robust.meta["plan"] == meta["plan"] and robust.meta["scheduler"] == "variopath-robust"
    for m, times in predicted.items():
        assert robust.meta["predicted_s"][m] == pytest.approx(times, rel=1e-12)
    listed = PlanRequest(demand, model, 20e-6, network="pcie, pcie-fair,none")
    assert [n.name for n in listed.networks] == ["pcie", "pcie-fair", "none"]
    sequence = PlanRequest(demand, model, 20e-6, network=[PCIE, "none"]).networks
    assert [n.name for n in sequence] == ["pcie", "none"]
    with pytest.raises(NetworkModelError, match="unknown network model 'nope'"):
        _ = PlanRequest(demand, model, 20e-6, network="pcie,nope").networks
