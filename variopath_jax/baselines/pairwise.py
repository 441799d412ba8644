"""Pairwise exchange: N−1 cyclic-shift stages (rank i sends to rank i+k in stage k), each pair on
its nearest fixed path, λ per stage (Bruck et al. 1997; Thakur et al. 2005, the MPI pairwise
algorithm the paper cites in §2.1). Stages with no bytes at all are skipped."""

from __future__ import annotations

from variopath_jax.schedule import Schedule, Step
from variopath_jax.schedulers import PlanRequest, register, transfer


@register("pairwise", "N-1 cyclic-shift stages i -> i+k, nearest fixed path per pair")
def plan(req: PlanRequest) -> Schedule:
    model, demand = req.model, req.demand
    n = len(demand)
    steps = []
    for k in range(1, n):
        stage = []
        for i in range(n):
            j = (i + k) % n
            if demand[i, j] > 0:
                route = model.nearest(int(model.group_of[i]), int(model.group_of[j]))
                stage.append(transfer(model, i, j, route, demand[i, j]))
        if stage:
            steps.append(Step(tuple(stage)))
    return Schedule(
        n, steps, model.topology.fingerprint, req.lambda_s, "general", {"scheduler": "pairwise"}
    )
