"""The solver package: the LP lower bound, the MILP optimum of the execution model, the CP-SAT
catalog verifier and the gap study (small instances only; the study itself is a benchmark)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from helpers import tiny4

from variopath_jax import workloads
from variopath_jax.catalog import build_catalog
from variopath_jax.catalog.verify import bruteforce
from variopath_jax.cli import main
from variopath_jax.runner import run_one
from variopath_jax.schedule import validate
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import DEFAULT_LAMBDA_S, FluidSimulator, legacy_model
from variopath_jax.solver import milp as milp_module
from variopath_jax.solver.bound import lower_bound
from variopath_jax.solver.channels import SolverError, enumerate_channels, price_channel
from variopath_jax.solver.milp import min_activations, solve_milp
from variopath_jax.solver.verify import admissible_shapes, verify_catalog
from variopath_jax.topology import PathModel, preset

GB = 1e9
ALPHA_S = 2e-6  # per-activation cost the MILP charges, all of it as issue overhead


# ----- bound ----------------------------------------------------------------------------------
def test_bound_by_hand_on_tiny4() -> None:
    """Two cross-switch pairs share the switch uplink (64 GB/s) but may also use the NIC path
    (400 Gb/s = 50 GB/s): the LP finds 2X / 114 GB/s, above the endpoint bound X / 64 GB/s."""
    topo = tiny4()
    x = 1 << 30
    demand = np.zeros((4, 4), dtype=np.int64)
    demand[0, 2] = demand[1, 3] = x
    b = lower_bound(demand, topo)
    assert b.simple_s == pytest.approx(x / (64 * GB))
    assert b.lp_relay_s == pytest.approx(2 * x / (114 * GB), rel=1e-6)
    assert b.lp_direct_s == pytest.approx(2 * x / (114 * GB), rel=1e-6)
    assert b.best_s == b.lp_relay_s


@pytest.mark.parametrize("topo", [preset("fig1"), preset("r5080-bf3", 2)], ids=lambda t: t.name)
def test_bound_is_below_every_scheduler(topo) -> None:
    model = PathModel(topo)
    demand = workloads.zipf(topo.num_ranks, 0.6, 4 << 20, seed=2)
    b = lower_bound(demand, topo)
    assert b.simple_s <= b.lp_relay_s * (1 + 1e-9) <= b.lp_direct_s * (1 + 1e-6)
    for name in ("variopath", "nccl", "fast", "deepep", "pairwise"):
        result = run_one(model, name, demand)
        assert b.best_s <= result.sim.completion_s * (1 + 1e-9), name


def test_bound_rejects_a_demand_of_the_wrong_size() -> None:
    with pytest.raises(SolverError, match="ranks"):
        lower_bound(np.ones((3, 3)), preset("fig1"))


# ----- channels -------------------------------------------------------------------------------
def _every_partial_channel(model: PathModel) -> list[tuple[tuple[int, int, tuple[int, ...]], ...]]:
    """Brute force: every set of lanes (i, j, links) on distinct senders and receivers with
    disjoint footprints, idle ranks allowed."""
    lanes = _every_lane(model)
    out = []
    for size in range(1, model.topology.num_ranks + 1):
        for combo in itertools.combinations(lanes, size):
            senders = {i for i, *_ in combo}
            receivers = {j for _, j, *_ in combo}
            shared = [link for *_, links, _ in combo for link in links[1:-1]]
            if len(senders) == len(receivers) == size and len(shared) == len(set(shared)):
                out.append(tuple((i, j, links) for i, j, links, _ in combo))
    return out


def _every_lane(model: PathModel) -> list[tuple[int, int, tuple[int, ...], float]]:
    """(i, j, links, rate) for every pair and candidate route (links: endpoint links included)."""
    n = model.topology.num_ranks
    group = [int(x) for x in model.group_of]
    return [
        (i, j, model.path(i, j, route).links, route.rate)
        for i in range(n)
        for j in range(n)
        if i != j
        for route in model.routes(group[i], group[j])
    ]


def test_enumerated_channels_are_maximal_and_contain_every_partial_channel() -> None:
    """Every enumerated channel is a partial permutation with disjoint footprints to which no
    lane can be added, and every partial channel of tiny4 (brute force) is a subset of one, at
    no lower rate; among them 0→3, 1→0, 3→1, which no full channel contains (rank 2 would
    have to send to itself)."""
    model = PathModel(tiny4())
    channels = enumerate_channels(model)
    up = {model.endpoint_links(r)[0] for r in range(4)}
    down = {model.endpoint_links(r)[1] for r in range(4)}
    lanes_of = []
    for ch in channels:
        assert len({i for i, _ in ch.pairs}) == len(ch.pairs) == len({j for _, j in ch.pairs})
        assert all(i != j for i, j in ch.pairs)
        shared = [link for p in ch.paths for link in p if link not in up | down]
        assert len(shared) == len(set(shared))
        lanes_of.append(set(zip(ch.pairs, ch.paths, strict=True)))
    rate = {(i, j, links): r for i, j, links, r in _every_lane(model)}
    rates_of = [dict(zip(ch.pairs, ch.rates, strict=True)) for ch in channels]
    for partial in _every_partial_channel(model):
        lanes = {((i, j), links) for i, j, links in partial}
        assert not any(lanes > have for have in lanes_of)  # the enumerated ones are maximal
        assert any(
            all(have.get((i, j), 0.0) >= rate[i, j, links] for i, j, links in partial)
            for have in rates_of
        ), partial
    assert any(set(have) == {(0, 3), (1, 0), (3, 1)} for have in rates_of)


def _tiny4_pricing(seed: int):
    """tiny4 with a 32 MiB Zipf demand: its model, pairs, volumes (MB), pair index and the
    enumerated channels ready for pricing (solver/colgen.py)."""
    from variopath_jax.solver.colgen import MB, _Enumerated

    model = PathModel(tiny4())
    demand = workloads.zipf(4, 0.6, 32 << 20, seed=seed)
    pairs = [(i, j) for i in range(4) for j in range(4) if i != j]
    volume = np.array([demand[p] / MB for p in pairs])
    index = {p: k for k, p in enumerate(pairs)}
    return model, pairs, volume, index, _Enumerated(model, index, volume)


def test_enumerated_pricing_is_exact_over_every_partial_channel() -> None:
    """The configuration LP's pricing by enumeration (solver/colgen.py) finds, for any duals,
    the largest gain Σ π_p·min(1, d·bw_l / D_p) − d over every partial channel (brute force;
    the gain peaks at a lane's saturation time): with full channels only it fell short."""
    model, pairs, volume, index, enumerated = _tiny4_pricing(seed=0)
    lanes = _every_lane(model)
    rate = {(i, j, links): r for i, j, links, r in lanes}
    best_rate = {(i, j): max(r for a, b, _, r in lanes if (a, b) == (i, j)) for i, j in pairs}
    fastest = volume / (np.array([best_rate[p] for p in pairs]) * 1e-3)  # µs
    every = _every_partial_channel(model)
    # duals of the order of each pair's fastest time: random, and on 0→3, 1→0 and 3→1 alone
    # (no full channel holds all three)
    alone = np.array([1.5 if p in ((0, 3), (1, 0), (3, 1)) else 0.0 for p in pairs]) * fastest
    rng = np.random.default_rng(0)
    duals = [rng.uniform(0.3, 1.5, len(pairs)) * fastest for _ in range(20)]
    for case, pi in enumerate([alone, *duals]):
        best = 0.0
        for partial in every:
            sat = [
                (pi[index[i, j]], volume[index[i, j]] / (rate[i, j, links] * 1e-3))
                for i, j, links in partial
            ]
            for d in (s for _, s in sat):
                best = max(best, sum(w * min(1.0, d / s) for w, s in sat) - d)
        value, _ = enumerated.price(pi, 1, d_max=1e9)
        assert best > 0
        assert value == pytest.approx(best, rel=1e-9, abs=1e-9), case


def test_enumerated_pricing_with_count_duals_and_cuts_is_exact() -> None:
    """With the duals σ_p of the pairs' count rows (branching below K) and duration cuts η_j,
    a column gains Σ_lanes (π_p·min(1, d/sat) + σ_p) − d + Σ_j η_j·min(d, θ_j) over the lanes
    it serves: the enumeration's maximum (with its upper-bound order and early stop) equals the
    brute-force maximum over every partial channel of tiny4 (for a fixed set of lanes the gain
    is concave in d, so it peaks at 0, a saturation time, a θ_j or d_max), and the partial
    pricing over the hot channels never exceeds it."""
    model, pairs, volume, index, enumerated = _tiny4_pricing(seed=1)
    rate = {(i, j, links): r for i, j, links, r in _every_lane(model)}
    every = _every_partial_channel(model)
    rng = np.random.default_rng(3)
    d_max = 2.0 * float(volume.max() / (max(rate.values()) * 1e-3))
    for case in range(30):
        pi = rng.uniform(0.0, 1.5, len(pairs)) * volume / 10.0
        sigma = rng.normal(0.0, 2.0, len(pairs)) * (rng.random(len(pairs)) < 0.4)
        cuts = [(float(t), float(rng.uniform(0, 0.4))) for t in rng.uniform(0, d_max, 2)]
        cuts.append((math.inf, float(rng.uniform(0, 1.3))))
        best = 0.0
        for partial in every:
            lanes = [
                (index[i, j], volume[index[i, j]] / (rate[i, j, links] * 1e-3))
                for i, j, links in partial
            ]
            points = [0.0, d_max] + [s for _, s in lanes] + [t for t, _ in cuts if t < d_max]
            for d in (min(x, d_max) for x in points):
                gain = sum(pi[p] * min(1.0, d / s) + sigma[p] for p, s in lanes) - d
                best = max(best, gain + sum(e * min(d, t) for t, e in cuts))
        value, columns = enumerated.price(pi, 3, d_max, cuts, sigma)
        assert value == pytest.approx(best, rel=1e-9, abs=1e-9), case
        for col, dur, _, said in columns:  # a column's own gain is what pricing says it is
            gain = sum(pi[p] * f + sigma[p] for p, f in col.items()) - dur
            gain += sum(e * min(dur, t) for t, e in cuts)
            assert gain == pytest.approx(said, rel=1e-9, abs=1e-9)
            assert said <= value + 1e-9
        assert enumerated.price(pi, 3, d_max, cuts, sigma, hot=True)[0] <= value + 1e-9


def test_pricing_finds_the_best_enumerated_channel() -> None:
    model = PathModel(tiny4())
    weights = np.random.default_rng(0).random((4, 4))
    np.fill_diagonal(weights, 0)
    best = max(
        sum(weights[p] * r for p, r in zip(ch.pairs, ch.rates, strict=True))
        for ch in enumerate_channels(model)
    )
    value, channel, proven = price_channel(model, weights)
    assert proven and channel is not None
    assert value == pytest.approx(best, rel=1e-5)


# ----- MILP -----------------------------------------------------------------------------------
def _vario(model: PathModel, demand: np.ndarray):
    return get_scheduler("variopath-paper").plan(PlanRequest(demand, model, DEFAULT_LAMBDA_S))


@pytest.mark.parametrize("mib", [1, 32])
def test_milp_certifies_tiny4_and_beats_variopath(mib: int) -> None:
    topo = tiny4()
    model = PathModel(topo)
    demand = workloads.zipf(4, 0.6, mib << 20, seed=0)
    vario = _vario(model, demand)
    result = solve_milp(demand, model, lambda_s=DEFAULT_LAMBDA_S, alpha_s=ALPHA_S, warm=vario)
    assert result.status == "OPTIMAL" and result.complete_pool
    assert result.gap <= 2e-4  # the rounding tolerance of the CP-SAT model
    assert result.objective_s <= vario.modeled_time(ALPHA_S) * (1 + 1e-9)
    assert validate(result.schedule, demand, topo).ok
    simulated = (
        FluidSimulator(topo, legacy_model(ALPHA_S, DEFAULT_LAMBDA_S))
        .run(result.schedule)
        .completion_s
    )
    assert simulated == pytest.approx(result.objective_s, rel=1e-9)  # contention-free
    assert lower_bound(demand, topo).best_s <= result.objective_s


def test_milp_respects_its_time_limit_and_never_claims_what_it_has_not_proven(
    monkeypatch,
) -> None:
    topo = preset("fig1")
    model = PathModel(topo)
    demand = workloads.zipf(6, 0.6, 8 << 20, seed=1)
    vario = _vario(model, demand)
    # the limit reaches the solver (checked on its arguments, not on the clock)
    limits: list[float] = []
    real = milp_module._solve_cpsat

    def spy(demand, pool, cost_s, warm, time_limit_s, *rest):
        limits.append(time_limit_s)
        return real(demand, pool, cost_s, warm, time_limit_s, *rest)

    monkeypatch.setattr(milp_module, "_solve_cpsat", spy)
    result = solve_milp(
        demand,
        model,
        lambda_s=DEFAULT_LAMBDA_S,
        alpha_s=ALPHA_S,
        warm=vario,
        time_limit_s=2.0,
    )
    assert len(limits) == 1 and 0 < limits[0] <= 2.0
    assert result.bound_s <= result.objective_s * (1 + 1e-9)
    assert result.objective_s <= vario.modeled_time(ALPHA_S) * (1 + 1e-9)
    if result.status == "OPTIMAL":
        assert result.gap <= 2e-4  # the rounding tolerance of the CP-SAT model
    else:
        assert result.status == "FEASIBLE" and result.gap > 0
    # the bound never exceeds the physical optimum's lower bound's purpose: below the solution
    assert lower_bound(demand, topo).best_s <= result.objective_s


def test_milp_by_column_generation_on_two_nodes() -> None:
    topo = preset("fig1", 2)
    model = PathModel(topo)
    demand = workloads.zipf(12, 0.6, 2 << 20, seed=3)
    vario = _vario(model, demand)
    result = solve_milp(
        demand,
        model,
        lambda_s=DEFAULT_LAMBDA_S,
        alpha_s=ALPHA_S,
        warm=vario,
        time_limit_s=10.0,
    )
    # whether pricing finished within its share of the limit depends on the machine's load
    assert not result.complete_pool and isinstance(result.stats["lp_proven"], bool)
    assert result.status == "FEASIBLE"
    assert result.bound_s <= result.objective_s <= vario.modeled_time(ALPHA_S) * (1 + 1e-9)
    assert validate(result.schedule, demand, topo).ok


def test_milp_edge_cases() -> None:
    model = PathModel(tiny4())
    empty = solve_milp(np.zeros((4, 4), np.int64), model, lambda_s=DEFAULT_LAMBDA_S)
    assert empty.status == "OPTIMAL" and not empty.schedule.steps
    one = np.zeros((4, 4), np.int64)
    one[0, 3] = 1
    single = solve_milp(one, model, lambda_s=DEFAULT_LAMBDA_S)
    assert single.status == "OPTIMAL" and len(single.schedule.steps) == 1
    assert min_activations(workloads.uniform(4, 10)) == 3
    with pytest.raises(SolverError, match="warm start"):
        solve_milp(workloads.uniform(12, 10), PathModel(preset("fig1", 2)), lambda_s=5e-6)


# ----- verifier -------------------------------------------------------------------------------
def test_admissible_shapes() -> None:
    assert len(list(admissible_shapes(2, 2))) == 3
    assert [s.tolist() for s in admissible_shapes(2, 1)] == [[[0, 1], [1, 0]]]
    assert all(
        (s.sum(axis=0) == 3).all() and (s.sum(axis=1) == 3).all() for s in admissible_shapes(3, 3)
    )


@pytest.mark.parametrize(
    "topo", [preset("fig1"), tiny4(), preset("balanced-8")], ids=lambda t: t.name
)
def test_cpsat_verifier_agrees_with_brute_force(topo) -> None:
    model = PathModel(topo)
    catalog = build_catalog(topo)
    cpsat = verify_catalog(catalog, model)
    brute = bruteforce(catalog, model)
    assert cpsat.ok and brute.ok
    assert cpsat.shapes_found == brute.shapes_found == len(catalog.shapes)


def test_cpsat_verifier_catches_a_missing_shape_and_a_bad_family() -> None:
    topo = preset("r5080-bf3")
    model = PathModel(topo)
    catalog = build_catalog(topo)
    keep = catalog.family_shape != 0
    catalog.shapes = catalog.shapes[1:]
    catalog.families = [f for f, k in zip(catalog.families, keep, strict=True) if k]
    catalog.family_shape = catalog.family_shape[keep] - 1
    report = verify_catalog(catalog, model)
    assert report.sound and not report.complete
    assert "is realizable" in report.problems[0]
    catalog.families[0] = catalog.families[0][:-1]  # a lane short
    assert not verify_catalog(catalog, model).sound


def test_cli_verify_and_gap() -> None:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["catalog", "verify", "fig1", "--verifier", "cpsat", "--json"]) == 0
    out = json.loads(buf.getvalue())
    assert out["ok"] and out["verifier"] == "cpsat" and out["shapes_checked"] == 4
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["gap", "--topology", "tiny4-unused", "--sizes", "1", "--seeds", "1", "--json"])
    assert code == 2
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(
            [
                "gap",
                "--topology",
                "fig1",
                "--sizes",
                "1",
                "--seeds",
                "1",
                "--time-limit",
                "2",
                "--json",
            ]
        )
    assert code == 0
    out = json.loads(buf.getvalue())
    row = out["rows"][0]
    contract = ("variopath_s", "epoch_opt_s", "epoch_status", "epoch_s", "channel_best_s")
    assert set(contract) | {"channel_bound_s", "bound_s", "ratio"} <= set(row)
    assert row["epoch_status"] in ("OPTIMAL", "FEASIBLE")
    assert row["ratio"] == pytest.approx(row["epoch_opt_s"] / row["variopath_s"])
    assert row["channel_bound_s"] <= row["channel_best_s"] <= row["epoch_sim_s"] * (1 + 1e-9)
    assert row["epoch_sim_s"] <= row["epoch_opt_s"] * (1 + 1e-9)
    assert row["epoch_bound_s"] <= row["epoch_opt_s"]
    if row["epoch_status"] == "OPTIMAL":
        assert row["epoch_bound_s"] == pytest.approx(row["epoch_opt_s"])
    assert row["channel_bound_s"] <= row["variopath_s"] * (1 + 1e-9)
    assert row["bound_s"] <= row["channel_best_s"]
    certified = out["overall"]["certified"]
    assert (out["overall"]["reference"] == "certified optimum") == (certified == 1)


@pytest.mark.parametrize("mib", [1, 8])
def test_config_lp_bound_is_below_every_channel_schedule(mib: int) -> None:
    """Column generation on the configuration LP (solver/colgen.py): its Lagrangian bound never
    exceeds a channel schedule, with exact pricing by enumeration or by the MILP; dropping δ
    (enumeration) only relaxes it."""
    from helpers import tiny4

    from variopath_jax import workloads
    from variopath_jax.runner import run_one
    from variopath_jax.schedule import validate
    from variopath_jax.sim import PCIE, FluidSimulator
    from variopath_jax.solver.bound import lower_bound
    from variopath_jax.solver.colgen import channel_config_bound
    from variopath_jax.solver.kslot import solve_channel_model

    topo = tiny4()
    model = PathModel(topo)
    sim = FluidSimulator(topo, PCIE)
    demand = workloads.zipf(4, 0.6, mib << 20, seed=2)
    vario = run_one(model, "variopath-paper", demand)
    times = [vario.sim.completion_s]
    flow = lower_bound(demand, topo).lp_direct_s
    channel = solve_channel_model(
        demand,
        model,
        PCIE,
        upper_s=times[0],
        warm=[vario.schedule],
        flow_bound_s=flow,
        time_limit_s=10,
    )
    if channel.schedule is not None:
        assert validate(channel.schedule, demand, topo).ok
        times.append(sim.run(channel.schedule).completion_s)
    got = {
        how: channel_config_bound(
            demand,
            model,
            PCIE,
            upper_s=min(times),
            warm=[vario.schedule],
            pricing=how,
            time_limit_s=60,
        )
        for how in ("enumeration", "milp")
    }
    for how, cg in got.items():
        assert cg.pricing == how and cg.bound_s > 0
        assert cg.bound_s <= min(times) * (1 + 1e-9)
        if cg.converged:
            assert cg.bound_s == pytest.approx(min(cg.lp_s, min(times)), rel=1e-6)
    if all(cg.converged for cg in got.values()):
        assert got["enumeration"].bound_s <= got["milp"].bound_s * (1 + 1e-6)


def test_the_per_k_search_solves_the_first_values_of_k() -> None:
    """CP-SAT solves the first ``max_solves`` values of K; the K beyond keep their closed-form
    bound (status NOT_SOLVED), and the bound over all of them stays below every schedule."""
    from helpers import tiny4

    from variopath_jax import workloads
    from variopath_jax.runner import run_one
    from variopath_jax.sim import PCIE
    from variopath_jax.solver.kslot import solve_channel_model

    model = PathModel(tiny4())
    demand = workloads.zipf(4, 0.6, 128 << 20, seed=1)  # K = 3..7
    vario = run_one(model, "variopath-paper", demand)
    upper = vario.sim.completion_s
    result = solve_channel_model(
        demand, model, PCIE, upper_s=upper, warm=[vario.schedule], max_solves=1, time_limit_s=5
    )
    assert len(result.per_k) >= 2  # more K than the one solved
    assert result.per_k[0].status != "NOT_SOLVED"
    assert all(k.status == "NOT_SOLVED" for k in result.per_k[1:])
    assert result.bound_s <= min(upper, result.objective_s) * (1 + 1e-9)


def test_the_per_k_search_prunes_only_k_whose_bound_meets_the_best() -> None:
    """The per-K search goes smallest LB_K first; a K it skips ("PRUNED") has a bound no lower
    than the best schedule found, so skipping it loses nothing, and the K are listed in order."""
    from helpers import tiny4

    from variopath_jax import workloads
    from variopath_jax.runner import run_one
    from variopath_jax.sim import PCIE
    from variopath_jax.solver.kslot import solve_channel_model

    model = PathModel(tiny4())
    demand = workloads.zipf(4, 0.6, 128 << 20, seed=1)  # K = 3..7
    vario = run_one(model, "variopath-paper", demand)
    upper = vario.sim.completion_s
    result = solve_channel_model(
        demand, model, PCIE, upper_s=upper, warm=[vario.schedule], time_limit_s=5
    )
    slots = [k.slots for k in result.per_k]
    assert slots == list(range(slots[0], slots[0] + len(slots)))
    for k in result.per_k:
        assert k.status in ("OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN", "PRUNED")
        assert k.bound_s <= k.objective_s * (1 + 1e-9)
        if k.status == "PRUNED":
            assert k.bound_s >= min(upper, result.objective_s) * (1 - 1e-9)
    assert result.bound_s <= min(upper, result.objective_s) * (1 + 1e-9)


@pytest.mark.parametrize("how", ["enumeration", "milp"])
def test_search_over_the_config_lp_channels_gives_valid_schedules(how: str) -> None:
    """The channels column generation found (both pricings) are channels with demand on every
    lane; the schedule search over them (``milp.search_pool``) returns a valid channel schedule
    no slower (modeled) than its warm start and never below the configuration LP's bound."""
    from helpers import tiny4

    from variopath_jax import workloads
    from variopath_jax.runner import run_one
    from variopath_jax.schedule import validate
    from variopath_jax.sim import PCIE, FluidSimulator
    from variopath_jax.solver.colgen import channel_config_bound
    from variopath_jax.solver.milp import search_pool

    topo = tiny4()
    model = PathModel(topo)
    sim = FluidSimulator(topo, PCIE)
    demand = workloads.zipf(4, 0.6, 32 << 20, seed=2)
    vario = run_one(model, "variopath-paper", demand)
    upper = vario.sim.completion_s
    cg = channel_config_bound(
        demand, model, PCIE, upper_s=upper, warm=[vario.schedule], pricing=how, time_limit_s=60
    )
    assert cg.channels
    for ch in cg.channels:
        assert len({i for i, _ in ch.pairs}) == len(ch.pairs) == len({j for _, j in ch.pairs})
        assert all(demand[p] > 0 for p in ch.pairs)
    alpha = PCIE.issue_s + PCIE.latency_pcie_s
    got = search_pool(
        demand,
        model,
        cg.channels,
        lambda_s=PCIE.barrier_s,
        alpha_s=alpha,
        warm=[vario.schedule],
        time_limit_s=10,
    )
    assert got is not None
    assert validate(got, demand, topo).ok
    assert got.modeled_time(alpha) <= vario.schedule.modeled_time(alpha) * (1 + 1e-9)
    assert cg.bound_s <= sim.run(got).completion_s * (1 + 1e-9)
    # a pool that misses a pair gives no schedule
    assert search_pool(demand, model, [], lambda_s=PCIE.barrier_s, warm=[]) is None
