"""Deciding ahead (issue 51; docs/planner.md "Deciding ahead"): the decision made from a call
site's previous demand, applied on the call path to the current one (``ChoiceCore::apply``)."""

from __future__ import annotations

import numpy as np
import pytest

from variopath_jax import _native, workloads
from variopath_jax.planner.reference import PlannerParams
from variopath_jax.planner.schedulers import chooser_for
from variopath_jax.schedule import validate
from variopath_jax.schedulers import unprofiled_networks
from variopath_jax.topology import PathModel
from variopath_jax.topology.presets import preset

NETWORKS = unprofiled_networks(20e-6)


def _chooser(name: str, nodes: int = 1):
    topo = preset(name, nodes)
    return topo, chooser_for(PathModel(topo), PlannerParams())


def _transfers(schedule) -> list[tuple]:
    return [
        (t.src, t.dst, t.nbytes, t.rate, t.path, t.after)
        for step in schedule.steps
        for t in step.transfers
    ]


@pytest.mark.parametrize(
    "name,nodes,tokens,plan",
    [
        ("r5080-bf3", 1, 128, "paced"),
        ("r5080-bf3", 2, 1024, "paced"),
        ("l20-cx7", 1, 1024, "rot-paced"),
        ("r5080-cx8", 2, 128, "staged"),
    ],
)
def test_applied_to_its_own_demand_a_decision_is_the_choice(name, nodes, tokens, plan) -> None:
    """In steady state (the same demand again) the applied plan is the core's choice, transfer
    for transfer, rates exactly: nothing is lost by deciding ahead when the demand holds."""
    topo, chooser = _chooser(name, nodes)
    demand = workloads.moe(topo.num_ranks, tokens, seed=1)
    decision, record = chooser.decide(demand, NETWORKS)
    assert decision.plan == record["plan"] == plan
    chosen, _ = chooser.choose(demand, NETWORKS, every=True)
    assert _transfers(chooser.apply(decision, demand, NETWORKS)) == _transfers(chosen)


def test_a_decision_is_deterministic() -> None:
    topo, chooser = _chooser("r5080-bf3", 2)
    demand = workloads.moe(topo.num_ranks, 128, seed=3)
    a, _ = chooser.decide(demand, NETWORKS)
    b, _ = chooser.decide(demand.copy(), NETWORKS)
    assert (a.plan, a.id, a.route_frac) == (b.plan, b.id, b.route_frac)
    assert a.id != _native.safe_decision().id


@pytest.mark.parametrize("name,nodes", [("r5080-bf3", 2), ("l20-cx7", 1), ("r5090-bf3", 1)])
def test_a_stale_decision_gives_a_valid_plan_for_any_demand(name, nodes) -> None:
    """A decision made from one demand applied to unlike ones (other routing, a rank silent, one
    pair alone, Zipf traffic) gives a plan that moves exactly the current demand, every family."""
    topo, chooser = _chooser(name, nodes)
    n = topo.num_ranks
    rng = np.random.default_rng(0)
    silent = workloads.moe(n, 64, seed=5)
    silent[2, :] = 0
    silent[:, 2] = 0
    one = np.zeros((n, n), dtype=np.int64)
    one[0, n - 1] = 3 << 20
    noise = rng.integers(0, 1 << 16, size=(n, n)) * (1 - np.eye(n, dtype=np.int64))
    demands = [workloads.moe(n, 1024, seed=7), silent, one, workloads.zipf(n, 0.8, 64 << 20), noise]
    decisions = {}
    for seed in range(3):
        for tokens in (16, 128, 1024):
            d, _ = chooser.decide(workloads.moe(n, tokens, seed=seed), NETWORKS)
            decisions.setdefault(d.plan, d)
    decisions["staged"] = _native.safe_decision()
    for decision in decisions.values():
        for demand in demands:
            schedule = chooser.apply(decision, demand, NETWORKS)
            assert validate(schedule, demand, topo).ok, decision.plan
            for rank in (0, n - 1):  # a rank's transfers: its row and column, exactly
                mine = chooser.apply(decision, demand, NETWORKS, rank=rank)
                moved = np.zeros_like(demand)
                for step in mine.steps:
                    for t in step.transfers:  # the rotation's plan is every rank's
                        assert rank in (t.src, t.dst) or decision.plan == "rot-paced"
                        moved[t.src, t.dst] += t.nbytes
                np.testing.assert_array_equal(moved[rank], demand[rank])
                np.testing.assert_array_equal(moved[:, rank], demand[:, rank])


def test_the_choice_is_never_predicted_slower_than_staged_under_the_default_model() -> None:
    """Whatever the hedge across models, the op's plan plus its call path's cost is never
    predicted slower than NCCL's own (staged) under the first model, the default (issue 51 item
    4); each candidate is charged what applying it costs."""
    for name, nodes in [("r5080-bf3", 8), ("r5080-cx8", 2), ("l20-cx7", 2)]:
        topo, chooser = _chooser(name, nodes)
        for tokens in (16, 128, 1024):
            demand = workloads.moe(topo.num_ranks, tokens, seed=0)
            decision, record = chooser.decide(demand, NETWORKS)
            default = record["predicted_s"][NETWORKS[0].name]
            cost = record["call_path_s"]
            assert cost["paced"] > cost["staged"] > 0
            total = {c: default[c] + cost[c] for c in default}
            assert total[decision.plan] <= total["staged"], (name, nodes, tokens)
            one, record = chooser.decide(demand, NETWORKS[:1])  # one model: its least total
            times, cost = record["predicted_s"][NETWORKS[0].name], record["call_path_s"]
            assert one.plan == min(times, key=lambda c: times[c] + cost[c])


def test_critical_path_is_timed_and_refuses_bad_input() -> None:
    topo, chooser = _chooser("r5080-bf3", 1)
    demand = workloads.moe(topo.num_ranks, 128, seed=0)
    decision, _ = chooser.decide(demand, NETWORKS)
    seconds = chooser.critical_path_s(
        decision, demand, NETWORKS, rank=0, repeats=3, flush_bytes=1 << 20
    )
    assert len(seconds) == 3 and all(s > 0 for s in seconds)
    with pytest.raises(ValueError, match="rank 99 is out of range"):
        chooser.critical_path_s(decision, demand, NETWORKS, rank=99, repeats=1)
    with pytest.raises(ValueError, match="repeats"):
        chooser.critical_path_s(decision, demand, NETWORKS, repeats=0)
    _, other = _chooser("r5080-bf3", 2)
    big, _ = other.decide(workloads.moe(16, 1024, seed=0), NETWORKS)
    assert big.plan == "paced"  # a decision of another deployment: its table does not fit
    with pytest.raises(ValueError, match="fractions"):
        chooser.apply(big, demand, NETWORKS)
