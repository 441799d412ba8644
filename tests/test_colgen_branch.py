"""Branching the configuration LP on the number of activations K (solver/colgen.py, issue 31):
each child's bound (exactly K activations, with its duration cuts) stays below CP-SAT's proven
optimum of the K-slot model with those K, and the branched bound below every schedule found. A
proof is checked only where CP-SAT's status claims one; nothing depends on a time limit."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from helpers import tiny4

from variopath_jax import workloads
from variopath_jax.runner import run_one
from variopath_jax.sim import PCIE, FluidSimulator
from variopath_jax.solver.bound import lower_bound
from variopath_jax.solver.channels import candidate_lanes
from variopath_jax.solver.colgen import ConfigLP, channel_config_bound, duration_cuts
from variopath_jax.solver.kslot import solve_channel_model, sorted_durations
from variopath_jax.topology import PathModel


def _instance(mib: int, seed: int):
    topo = tiny4()
    model = PathModel(topo)
    demand = workloads.zipf(4, 0.6, mib << 20, seed=seed)
    vario = run_one(model, "variopath-paper", demand)
    flow = lower_bound(demand, topo).lp_direct_s
    return topo, model, demand, vario, flow


@pytest.mark.parametrize(
    ("mib", "seed", "how"),
    [(1, 2, "enumeration"), (8, 1, "milp"), (128, 1, "enumeration"), (128, 1, "milp")],
)
def test_each_child_is_below_the_proven_optimum_with_its_k(mib: int, seed: int, how: str) -> None:
    """Children bound the schedules faster than ``upper`` (columns stop at d = upper), so the
    comparison is with the proven optima below it."""
    _, model, demand, vario, flow = _instance(mib, seed)
    upper = 1.5 * vario.sim.completion_s  # room for several K
    channel = solve_channel_model(
        demand, model, PCIE, upper_s=upper, warm=[vario.schedule], flow_bound_s=flow,
        time_limit_s=20, workers=1,
    )  # fmt: skip
    lp = ConfigLP(demand, model, PCIE, upper_s=upper, warm=[vario.schedule], pricing=how)
    proven = [k for k in channel.per_k if k.status == "OPTIMAL" and k.objective_s <= upper]
    for k in proven:
        cuts = duration_cuts(demand, lp.lanes, k.slots, flow)
        child, _, _, _ = lp.solve(k.slots, k.slots, deadline=time.perf_counter() + 60, cuts=cuts)
        assert child * 1e-6 <= k.objective_s * (1 + 1e-9)


@pytest.mark.parametrize(("mib", "seed"), [(8, 1), (32, 0), (128, 1)])
def test_branching_below_k_stays_below_the_proven_optimum_with_each_k(mib: int, seed: int) -> None:
    """Branch-and-price on K and on the pairs' counts of activations: each K's bound stays below
    CP-SAT's proven optimum of the K-slot model with that K (a schedule with K activations
    serves every pair a whole number of times, so it lies in one branch of every count), and
    the least bound below every schedule found."""
    topo, model, demand, vario, flow = _instance(mib, seed)
    upper = 1.5 * vario.sim.completion_s
    channel = solve_channel_model(
        demand, model, PCIE, upper_s=upper, warm=[vario.schedule], flow_bound_s=flow,
        time_limit_s=20, workers=1,
    )  # fmt: skip
    cg = channel_config_bound(
        demand, model, PCIE, upper_s=upper, warm=[vario.schedule], time_limit_s=600,
        branch=True, flow_bound_s=flow, max_nodes=40,
    )  # fmt: skip
    assert cg.master.count_rows  # some count was branched on
    proven = [k for k in channel.per_k if k.status == "OPTIMAL" and k.objective_s <= upper]
    assert proven
    for k in proven:
        assert cg.per_k.get(k.slots, 0.0) <= k.objective_s * (1 + 1e-9), k.slots
    assert cg.bound_s <= vario.sim.completion_s * (1 + 1e-9)
    if channel.schedule is not None:
        simulated = FluidSimulator(topo, PCIE).run(channel.schedule).completion_s
        assert cg.bound_s <= simulated * (1 + 1e-9)


def test_duration_cuts_hold_for_variopath_schedules() -> None:
    """Σ_m min(d_(m), θ) ≥ rhs for every cut, on schedules the solvers did not build (durations
    without δ, as the cuts are stated)."""
    topo = tiny4()
    model = PathModel(topo)
    for seed in range(3):
        demand = workloads.zipf(4, 0.6, 8 << 20, seed=seed)
        off = demand.copy()
        np.fill_diagonal(off, 0)
        lanes = candidate_lanes(model, off, PCIE)
        schedule = run_one(model, "variopath-paper", demand).schedule
        d = np.array([max(t.nbytes / t.rate * 1e-3 for t in st.transfers) for st in schedule.steps])
        for theta, rhs in duration_cuts(off, lanes, len(d), lower_bound(demand, topo).lp_direct_s):
            assert float(np.minimum(d, theta).sum()) >= rhs * (1 - 1e-9)
        assert len(duration_cuts(off, lanes, len(d), 0.0)) <= len(d) + 1
        assert sorted_durations(off, lanes, len(d)).max() * 1e6 <= d.max() * (1 + 1e-9)


@pytest.mark.parametrize("mib", [1, 32])
def test_branched_bound_is_below_every_schedule(mib: int) -> None:
    topo, model, demand, vario, flow = _instance(mib, 2)
    sim = FluidSimulator(topo, PCIE)
    times = [vario.sim.completion_s]
    channel = solve_channel_model(
        demand, model, PCIE, upper_s=times[0], warm=[vario.schedule], flow_bound_s=flow,
        time_limit_s=10, workers=1,
    )  # fmt: skip
    if channel.schedule is not None:
        times.append(sim.run(channel.schedule).completion_s)
    per_k = {k.slots: k.bound_s for k in channel.per_k}
    cg = channel_config_bound(
        demand, model, PCIE, upper_s=min(times), warm=[vario.schedule], time_limit_s=60,
        branch=True, per_k=per_k, flow_bound_s=flow,
    )  # fmt: skip
    assert cg.root_s <= cg.bound_s <= min(times) * (1 + 1e-9)
    assert cg.per_k  # at least one child solved
    # a child bounds every schedule with its K activations, the ones found included
    for schedule, t in zip([vario.schedule, channel.schedule], times, strict=False):
        child = cg.per_k.get(len(schedule.steps))
        assert child is None or child <= t * (1 + 1e-9)


def test_children_lift_and_prune_the_per_k_search() -> None:
    """The children of every K as the per-K search's ``lower_k``: each K's bound is
    at least its child's (up to its own schedule), a pruned K's at least the best found, and
    the search's bound stays below every schedule."""
    topo, model, demand, vario, flow = _instance(128, 1)
    sim = FluidSimulator(topo, PCIE)
    upper = vario.sim.completion_s
    early = channel_config_bound(
        demand, model, PCIE, upper_s=upper, warm=[vario.schedule], time_limit_s=10,
        branch=True, flow_bound_s=flow,
    )  # fmt: skip
    assert early.per_k and early.master is not None
    result = solve_channel_model(
        demand, model, PCIE, upper_s=upper, warm=[vario.schedule], flow_bound_s=flow,
        time_limit_s=10, workers=1, lower_k=early.per_k,
    )  # fmt: skip
    times = [upper]
    if result.schedule is not None:
        times.append(sim.run(result.schedule).completion_s)
    assert result.bound_s <= min(times) * (1 + 1e-9)
    for k in result.per_k:
        assert k.bound_s >= min(early.per_k.get(k.slots, 0.0), k.objective_s) * (1 - 1e-9)
        if k.status == "PRUNED":
            assert k.bound_s >= min(times) * (1 - 1e-9)
    # the master re-solved with its columns: the same root, no lower
    again = channel_config_bound(
        demand, model, PCIE, upper_s=min(times), time_limit_s=60, lp_model=early.master
    )
    assert again.bound_s >= min(early.root_s, min(times)) * (1 - 1e-6)
    assert again.bound_s <= min(times) * (1 + 1e-9)


@pytest.mark.parametrize("how", ["enumeration", "milp"])
def test_a_dive_gives_a_valid_schedule_and_leaves_the_master_as_it_was(how: str) -> None:
    """A dive (``ConfigLP.dive``, durations fixed or free) up to K_max and up to one K returns
    activations whose schedule (and its LP polish over the same channels) serves the demand
    exactly and simulates no faster than the LP's bound; the master then re-solves to the same
    root."""
    from variopath_jax.schedule import validate
    from variopath_jax.solver.milp import polish, schedule_of

    topo, model, demand, vario, _ = _instance(32, 0)
    sim = FluidSimulator(topo, PCIE)
    upper = vario.sim.completion_s
    lp = ConfigLP(demand, model, PCIE, upper_s=upper, warm=[vario.schedule], pricing=how)
    root, _, converged, _ = lp.solve(lp.k_min, lp.k_max, deadline=time.perf_counter() + 60)
    assert converged
    for k_hi, flexible in itertools.product((lp.k_max, lp.k_min + 1), (False, True)):
        activations = lp.dive(k_hi, deadline=time.perf_counter() + 60, flexible=flexible)
        assert activations
        dived = schedule_of(activations, demand, topo.fingerprint, PCIE.barrier_s, 4)
        polished = polish([ch for ch, _ in activations], demand, topo.fingerprint, PCIE.barrier_s)
        for schedule in (dived, polished):
            assert validate(schedule, demand, topo).ok
            assert sim.run(schedule).completion_s >= root * 1e-6 * (1 - 1e-9)
    again, _, _, _ = lp.solve(lp.k_min, lp.k_max, deadline=time.perf_counter() + 60)
    assert again == pytest.approx(root, rel=1e-6)


def test_a_master_solved_afresh_carries_its_solution_and_duals_back() -> None:
    """Where GLOP's warm solve ends ABNORMAL twice, the master is exported and solved by a new
    GLOP (``ConfigLP._solve_afresh``): the objective and the duals pricing reads are those of
    the warm solve, and the solution loaded back (a vertex of the same optimum, not
    necessarily the same one) serves every pair with K activations."""
    _, model, demand, vario, flow = _instance(32, 1)
    lp = ConfigLP(demand, model, PCIE, upper_s=vario.sim.completion_s, warm=[vario.schedule])
    cuts = duration_cuts(demand, lp.lanes, lp.k_min + 1, flow)
    lp.solve(lp.k_min + 1, lp.k_min + 1, deadline=time.perf_counter() + 60, cuts=cuts)
    assert lp._solve_master() == 0  # OPTIMAL
    rows = lp.cover + [row for _, row in lp.cut_rows]
    before = (lp.objective.Value(), [row.dual_value() for row in rows])
    assert lp._solve_afresh() == 0
    assert lp.objective.Value() == pytest.approx(before[0], rel=1e-9)
    assert [row.dual_value() for row in rows] == pytest.approx(before[1], rel=1e-6, abs=1e-9)
    x = np.array([v.solution_value() for v in lp.columns])
    assert x.sum() == pytest.approx(lp.k_min + 1, rel=1e-9)
    served = np.zeros(len(lp.cover))
    for value, cover in zip(x, lp.covers, strict=True):
        for p, f in cover.items():
            served[p] += value * f
    assert served.min() >= 1 - 1e-6
