"""Per-node deduplication of MoE dispatch, planned by any scheduler (issue 30).

DeepEP's normal mode sends a token once per destination node and fans it out inside the node
(research/peer-systems.md §5). :class:`~variopath_jax.workloads.NodeDemand` carries what that
needs; :meth:`~variopath_jax.workloads.NodeDemand.two_phase` turns it into two rank-pair demands:
phase 1 the pairs on one node plus each token once per other node, to a relay GPU of that node,
phase 2 each relay's fan-out inside its node. :func:`plan_two_phase` plans both phases with one
registered scheduler (``variopath`` included, unchanged) and :func:`compose` joins them into one
schedule in which phase 2 starts once phase 1 has ended (a barrier: phase 2's first steps depend
on every step of phase 1). That is simpler than DeepEP's chunk pipelining, which the ``deepep``
peer models; both move the same bytes over the network.

:func:`algbw_gbps` reports the paper's metric for such a schedule on the logical payload (the
rank-pair demand, a token once per destination rank), so deduplicated and plain schedules of one
routing compare like with like; the simulator's own figure counts the bytes the schedule serves,
which for a two-phase schedule are phase 1's and phase 2's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from variopath_jax.schedule import Schedule, Step, Transfer, validate
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import SimResult
from variopath_jax.topology import Topology
from variopath_jax.workloads import NodeDemand


def _shifted(t: Transfer, offset: int) -> Transfer:
    if not t.after:
        return t
    return dataclasses.replace(t, after=tuple((s + offset, k) for s, k in t.after))


def compose(first: Schedule, second: Schedule, meta: dict | None = None) -> Schedule:
    """``second`` after ``first``: one schedule with ``first``'s steps, then ``second``'s (their
    dependencies and signal references renumbered); every step of ``second`` that depends on
    nothing within it depends on every step of ``first`` and pays the barrier λ."""
    if (first.ranks, first.fingerprint) != (second.ranks, second.fingerprint):
        raise ValueError("compose: the schedules are for different topologies")
    offset = len(first.steps)
    steps = [
        Step(st.transfers, first.dependencies(s), st.overhead) for s, st in enumerate(first.steps)
    ]
    everything = tuple(range(offset))
    for s, st in enumerate(second.steps):
        deps = tuple(d + offset for d in second.dependencies(s))
        overhead = st.overhead
        if not deps and offset:
            deps, overhead = everything, None
        transfers = tuple(_shifted(t, offset) for t in st.transfers)
        steps.append(Step(transfers, deps, overhead))
    kind = "general"
    merged = {"phases": [first.meta, second.meta], **(meta or {})}
    return Schedule(first.ranks, steps, first.fingerprint, first.lambda_s, kind, merged)


def plan_two_phase(
    scheduler: str, req: PlanRequest, nodes: NodeDemand, direct_single: bool = False
) -> Schedule:
    """The deduplicated dispatch of ``nodes`` planned by ``scheduler``: each phase of
    :meth:`NodeDemand.two_phase` (``direct_single`` passed on) as its own request (the same
    model, λ, seed, options and network), composed (:func:`compose`). The request's demand must
    be ``nodes.pairs``."""
    if not np.array_equal(np.asarray(req.demand), nodes.pairs):
        raise ValueError("plan_two_phase: the request's demand is not nodes.pairs")
    if req.model.topology.gpus_per_node != nodes.gpus_per_node:
        raise ValueError(
            f"plan_two_phase: the topology has {req.model.topology.gpus_per_node} GPUs per node, "
            f"the demand {nodes.gpus_per_node}"
        )
    info = get_scheduler(scheduler)
    first, second = nodes.two_phase(direct_single)
    plans = [info.plan(dataclasses.replace(req, demand=d)) for d in (first, second)]
    if second.any():
        meta = {"scheduler": scheduler, "dedup": True, "direct_single": direct_single}
        schedule = compose(*plans, meta=meta)
    else:
        schedule = plans[0]
        schedule.meta = {**schedule.meta, "dedup": True, "direct_single": direct_single}
    return schedule


def validate_two_phase(
    schedule: Schedule, nodes: NodeDemand, topo: Topology, direct_single: bool = False
) -> list[str]:
    """What is wrong with a deduplicated schedule (empty: nothing): it must serve phase 1 + phase
    2 of ``nodes`` (:func:`~variopath_jax.schedule.validate`)."""
    first, second = nodes.two_phase(direct_single)
    return list(validate(schedule, first + second, topo).errors)


def algbw_gbps(result: SimResult, nodes: NodeDemand) -> float:
    """The paper's algbw on the logical payload: ``nodes.pairs`` bytes / (N × completion)."""
    if result.completion_s <= 0:
        return 0.0
    return float(nodes.pairs.sum()) / (nodes.ranks * result.completion_s) / 1e9
