"""The channel model's schedule searches (issue 31): the swap search (``solver/swap.py``) and
the K-slot refinement (``kslot.refine_channel_schedule``), on tiny4, whose catalog is small."""

from __future__ import annotations

import numpy as np
from helpers import tiny4

from variopath_jax import workloads
from variopath_jax.runner import run_one
from variopath_jax.schedule import validate
from variopath_jax.sim import PCIE, FluidSimulator
from variopath_jax.solver.bound import lower_bound
from variopath_jax.solver.channels import candidate_lanes
from variopath_jax.solver.kslot import (
    build_kslot_problem,
    hint_kslot,
    model_time,
    refine_channel_schedule,
    solve_kslot_problem,
)
from variopath_jax.solver.milp import channels_of, min_activations
from variopath_jax.solver.swap import SwapSearch
from variopath_jax.topology import PathModel


def _instance(seed: int):
    model = PathModel(tiny4())
    demand = workloads.zipf(4, 0.6, 32 << 20, seed=seed)
    np.fill_diagonal(demand, 0)
    vario = run_one(model, "variopath-paper", demand, network=PCIE)
    return model, demand, vario.schedule


def _lp_cost(search: SwapSearch, schedule) -> float:
    """K·c + LP(S) of a schedule's channels, as the search values them (µs)."""
    cost, *_ = search._cost([search._vector(ch) for ch in channels_of(schedule)])
    return cost


def test_the_swap_search_finds_a_cheaper_valid_schedule_and_finds_it_again() -> None:
    """From VarioPath's schedule the search reaches channels the LP values lower, their schedule
    delivers every byte, stays above the flow-LP bound on every schedule, and a second search
    finds the same schedule (no randomness, no clock)."""
    model, demand, start = _instance(seed=1)
    search = SwapSearch(demand, model, PCIE)
    found = search.improve(start)
    assert found is not None and found.meta["scheduler"] == "swap"
    validate(found, demand, model.topology).raise_if_invalid()
    assert _lp_cost(search, found) < _lp_cost(search, start) - 1e-6
    simulated = FluidSimulator(model.topology, PCIE).run(found).completion_s
    assert simulated >= lower_bound(demand, model.topology).best_s * (1 - 1e-9)
    again = SwapSearch(demand, model, PCIE).improve(start)
    assert again is not None and again.to_dict() == found.to_dict()


def test_a_reduced_schedule_fits_its_slots() -> None:
    """``improve(schedule, slots)`` returns a valid schedule of at most ``slots`` activations
    for every K from the schedule's own down to the least any schedule needs, or None, and one
    for one activation fewer."""
    model, demand, start = _instance(seed=2)
    search = SwapSearch(demand, model, PCIE)
    steps = len(start.steps)
    fitted = {k: search.improve(start, k) for k in range(min_activations(demand), steps + 1)}
    assert fitted[steps - 1] is not None
    for k, schedule in fitted.items():
        if schedule is not None:
            assert len(schedule.steps) <= k
            validate(schedule, demand, model.topology).raise_if_invalid()


def test_model_time_is_the_k_slot_objective_and_the_simulated_time() -> None:
    """A K-slot schedule's :func:`model_time` is CP-SAT's objective (durations in whole ns) and
    what the simulator reports for it."""
    model, demand, start = _instance(seed=0)
    problem = build_kslot_problem(demand, model, PCIE, slots=len(start.steps))
    assert hint_kslot(problem, start)
    result, schedule = solve_kslot_problem(problem, model, time_limit_s=2, workers=1)
    assert schedule is not None
    lanes = candidate_lanes(model, demand, PCIE)
    timed = model_time(schedule, lanes, PCIE.barrier_s)
    assert abs(timed - result.objective_s) <= len(schedule.steps) * 2e-9
    simulated = FluidSimulator(model.topology, PCIE).run(schedule).completion_s
    assert abs(timed - simulated) <= 1e-9 * simulated


def test_refinement_returns_only_faster_valid_schedules() -> None:
    """The refinement (CP-SAT at the schedule's K and one fewer, with the swap search) returns a
    valid schedule faster in the model than the one it started from."""
    model, demand, start = _instance(seed=3)
    search = SwapSearch(demand, model, PCIE)
    lanes = candidate_lanes(model, demand, PCIE)
    refined = refine_channel_schedule(
        demand, model, PCIE, start, improve=search.improve, time_limit_s=4, workers=1
    )
    assert refined is not None  # the swap search alone improves this start
    validate(refined, demand, model.topology).raise_if_invalid()
    faster = model_time(refined, lanes, PCIE.barrier_s)
    assert faster < model_time(start, lanes, PCIE.barrier_s)


def test_the_swap_search_has_nothing_to_do_without_demand() -> None:
    """No pair with demand: nothing to improve, and no error."""
    model, _, start = _instance(seed=0)
    empty = np.zeros((4, 4), dtype=np.int64)
    assert SwapSearch(empty, model, PCIE).improve(start) is None
