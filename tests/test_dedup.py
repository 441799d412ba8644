"""Per-node deduplication (issue 30): the demand form, the deepep peer with it, and any
scheduler planning it in two phases (dedup.py)."""

from __future__ import annotations

import numpy as np
import pytest

from variopath_jax import dedup, workloads
from variopath_jax.errors import VarioPathError
from variopath_jax.schedule import Schedule, Step, Transfer, signal_driven, validate
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import NONE, FluidSimulator
from variopath_jax.topology import PathModel, preset


def brute_force(ranks: int, tokens: int, m: int, seed: int, **kw) -> tuple[np.ndarray, ...]:
    """pairs, node bytes and crossings recounted from the routing itself, token by token."""
    nodes = ranks // m
    tb = kw.get("hidden", 7168) * kw.get("dtype_bytes", 2)
    pairs = np.zeros((ranks, ranks), np.int64)
    node = np.zeros((ranks, nodes), np.int64)
    single = np.zeros((ranks, ranks), np.int64)
    crossed = np.zeros(2, np.int64)
    experts, top_k = kw.get("experts", 256), kw.get("top_k", 8)
    for src, hit in workloads._moe_hits(ranks, tokens, experts, top_k, seed):
        for t in range(tokens):
            dests = {int(j) for j in np.flatnonzero(hit[t]) if j != src}
            for j in dests:
                pairs[src, j] += tb
            for n in {j // m for j in dests}:
                node[src, n] += tb
                here = [j for j in dests if j // m == n]
                if len(here) == 1:
                    single[src, here[0]] += tb
            crossed[0] += sum(j // m != src // m for j in dests)
            crossed[1] += len({j // m for j in dests} - {src // m})
    return pairs, node, single, crossed


@pytest.mark.parametrize(("ranks", "m"), [(16, 8), (8, 2)])
def test_node_demand_counts_each_token_once_per_node(ranks: int, m: int) -> None:
    nodes = workloads.moe_nodes(ranks, 40, m, seed=3, experts=32, top_k=4, hidden=8)
    pairs, node, single, crossed = brute_force(ranks, 40, m, 3, experts=32, top_k=4, hidden=8)
    np.testing.assert_array_equal(nodes.pairs, pairs)
    np.testing.assert_array_equal(
        nodes.pairs, workloads.moe(ranks, 40, seed=3, experts=32, top_k=4, hidden=8)
    )
    np.testing.assert_array_equal(nodes.node, node)
    np.testing.assert_array_equal(nodes.single, single)
    ranks_per, nodes_per = nodes.crossings_per_token()
    assert ranks_per == pytest.approx(crossed[0] / (ranks * 40))
    assert nodes_per == pytest.approx(crossed[1] / (ranks * 40))
    assert nodes.inter_node_bytes(True) <= nodes.inter_node_bytes(False)


def test_every_token_to_every_expert() -> None:
    """top_k = experts: a token goes to all 3 other ranks, 2 of them on the other node."""
    nodes = workloads.moe_nodes(4, 5, 2, experts=4, top_k=4, hidden=1, dtype_bytes=1)
    assert nodes.crossings_per_token() == (2.0, 1.0)
    assert nodes.inter_node_bytes(False) == 2 * nodes.inter_node_bytes(True) == 4 * 2 * 5


def test_two_phase_moves_every_byte_to_its_destination() -> None:
    nodes = workloads.moe_nodes(16, 30, 4, seed=1, experts=64, hidden=4)
    first, second = nodes.two_phase()
    m = nodes.gpus_per_node
    assert not np.diagonal(first).any() and not np.diagonal(second).any()
    node_of = np.arange(16) // m
    # phase 2 stays inside nodes; phase 1 crosses nodes only to relays, deduplicated
    assert not second[node_of[:, None] != node_of[None, :]].any()
    remote = node_of[:, None] != node_of[None, :]
    assert first[remote].sum() == nodes.inter_node_bytes(True)
    # what each destination gets from each source: directly, from its relay, or as the relay
    for i in range(16):
        for n in range(nodes.nodes):
            if n == i // m:
                np.testing.assert_array_equal(
                    first[i, n * m : (n + 1) * m], nodes.pairs[i, n * m : (n + 1) * m]
                )
                continue
            r = nodes.relay(i, n)
            assert r // m == n and r % m == i % m
    relayed = sum(
        nodes.pairs[i, j]
        for i in range(16)
        for j in range(16)
        if node_of[i] != node_of[j] and j != nodes.relay(i, node_of[j])
    )
    assert second.sum() == relayed


def plan(name: str, topo, nodes, options=None):
    req = PlanRequest(nodes.pairs, PathModel(topo), NONE.barrier_s, 0, options or {}, network=NONE)
    return get_scheduler(name).plan(req), req


def inter_node_bytes(schedule: Schedule, m: int) -> int:
    return sum(t.nbytes for st in schedule.steps for t in st.transfers if t.src // m != t.dst // m)


def test_deepep_with_node_demand_sends_each_token_once_per_node() -> None:
    topo = preset("r5080-cx8", 2)
    nodes = workloads.moe_nodes(topo.num_ranks, 32, topo.gpus_per_node, seed=0)
    plain, _ = plan("deepep", topo, nodes)
    deduped, _ = plan("deepep", topo, nodes, {"node_demand": nodes})
    validate(plain, nodes.pairs, topo).raise_if_invalid()
    assert dedup.validate_two_phase(deduped, nodes, topo) == []
    assert deduped.meta["dedup"] and "dedup" not in plain.meta
    m = topo.gpus_per_node
    assert inter_node_bytes(plain, m) == nodes.inter_node_bytes(False)
    assert inter_node_bytes(deduped, m) == nodes.inter_node_bytes(True)
    assert nodes.inter_node_bytes(True) * 2 < nodes.inter_node_bytes(False)
    result = FluidSimulator(topo, NONE).run(deduped)
    assert dedup.algbw_gbps(result, nodes) > 0


def test_deepep_refuses_a_node_demand_of_another_demand() -> None:
    topo = preset("r5080-cx8", 2)
    nodes = workloads.moe_nodes(topo.num_ranks, 8, topo.gpus_per_node, seed=0)
    other = workloads.moe_nodes(topo.num_ranks, 8, topo.gpus_per_node, seed=1)
    with pytest.raises(VarioPathError, match="node_demand"):
        plan("deepep", topo, nodes, {"node_demand": other})


def test_variopath_plans_both_phases_phase_two_after_phase_one() -> None:
    topo = preset("r5080-cx8", 2)
    nodes = workloads.moe_nodes(topo.num_ranks, 16, topo.gpus_per_node, seed=2)
    req = PlanRequest(nodes.pairs, PathModel(topo), NONE.barrier_s, 0, {}, network=NONE)
    schedule = dedup.plan_two_phase("variopath", req, nodes)
    assert dedup.validate_two_phase(schedule, nodes, topo) == []
    first = nodes.two_phase()[0]
    lead = get_scheduler("variopath").plan(
        PlanRequest(first, PathModel(topo), NONE.barrier_s, 0, {}, network=NONE)
    )
    k = len(lead.steps)
    # the first phase-2 step waits for every phase-1 step; no phase-1 step waits for phase 2
    assert set(schedule.dependencies(k)) == set(range(k))
    assert all(max(schedule.dependencies(s), default=-1) < k for s in range(k))
    m = topo.gpus_per_node
    phase1 = Schedule(topo.num_ranks, schedule.steps[:k], topo.fingerprint, NONE.barrier_s)
    assert inter_node_bytes(phase1, m) >= nodes.inter_node_bytes(True)
    assert inter_node_bytes(schedule, m) == inter_node_bytes(phase1, m)  # phase 2 stays inside
    result = FluidSimulator(topo, NONE).run(schedule)
    assert result.completion_s > result.step_end[k - 1] > 0
    with pytest.raises(ValueError, match="demand"):
        dedup.plan_two_phase(
            "variopath", PlanRequest(first, PathModel(topo), NONE.barrier_s), nodes
        )


def test_compose_renumbers_signals_and_dependencies() -> None:
    topo = preset("r5080-cx8", 1)
    route = PathModel(topo)
    demand = np.zeros((8, 8), np.int64)
    demand[0, 1] = demand[1, 2] = 100
    req = PlanRequest(demand, route, 1e-5)
    a = signal_driven(get_scheduler("nccl").plan(req))
    b = signal_driven(get_scheduler("nccl").plan(req))
    joined = dedup.compose(a, b)
    off = len(a.steps)
    assert len(joined.steps) == 2 * off
    for s, st in enumerate(b.steps):
        mine = joined.steps[off + s]
        assert mine.deps == tuple(range(off)) and mine.overhead is None
        for t, u in zip(st.transfers, mine.transfers, strict=True):
            assert u.after == tuple((x + off, y) for x, y in t.after)
    validate(joined, 2 * demand, topo).raise_if_invalid()
    t = Transfer(0, 1, (0,), 1, (0, 1), 1.0)
    other = Schedule(4, [Step((t,))], "elsewhere", 1e-5)
    with pytest.raises(ValueError, match="different topologies"):
        dedup.compose(a, other)


def test_direct_single_sends_lone_tokens_straight_and_forwards_less() -> None:
    nodes = workloads.moe_nodes(32, 30, 8, seed=4, experts=64, hidden=4)
    m, node_of = 8, np.arange(32) // 8
    remote = node_of[:, None] != node_of[None, :]
    relayed, direct = nodes.two_phase(), nodes.two_phase(direct_single=True)
    for first, _ in (relayed, direct):
        assert first[remote].sum() == nodes.inter_node_bytes(True)
    skipped = sum(
        nodes.single[i, j]
        for i in range(32)
        for j in range(32)
        if remote[i, j] and j != nodes.relay(i, j // m)
    )
    assert skipped > 0
    assert direct[1].sum() == relayed[1].sum() - skipped
    assert (direct[1] <= relayed[1]).all()
    topo = preset("r5080-cx8", 4)
    req = PlanRequest(nodes.pairs, PathModel(topo), NONE.barrier_s, 0, {})
    schedule = dedup.plan_two_phase("nccl", req, nodes, direct_single=True)
    assert dedup.validate_two_phase(schedule, nodes, topo, direct_single=True) == []
    assert dedup.validate_two_phase(schedule, nodes, topo) != []  # a different demand
