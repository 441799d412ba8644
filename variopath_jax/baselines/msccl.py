"""MSCCL-style ordered pairwise AlltoAll (``research/peer-systems.md`` §7) on NCCL's paths.

MSCCL runs an algorithm fixed ahead of time (an XML of ordered send/receive steps) on NCCL's
transports: it controls the order and concurrency of the transfers, not their paths. Our
algorithm is the classic pairwise exchange (the ``pairwise`` scheduler's cyclic shifts, the MPI
algorithm FAST §4.2 calls SpreadOut): stage k = 1 … N−1 moves every D[i][i+k mod N] at once, the
stages in order with λ each. Every pair takes the route NCCL's transports would
(:func:`~variopath_jax.baselines.nccl.nccl_route` with
:func:`~variopath_jax.baselines.nccl.rail_nics`: P2P up to PXB else host memory inside a node, the
rail NICs with GPUDirect RDMA up to PXB across nodes). Stages without bytes are skipped.
"""

from __future__ import annotations

from variopath_jax.baselines._common import Router, StepGraph, demand_matrix, make_schedule
from variopath_jax.schedule import Schedule
from variopath_jax.schedulers import PlanRequest, register


@register(
    "msccl",
    "MSCCL-style ordered pairwise stages i -> i+k on NCCL's fixed paths, lambda per stage",
)
def plan(req: PlanRequest) -> Schedule:
    """N−1 ordered cyclic-shift stages on NCCL's routes (peer-systems.md §7)."""
    demand = demand_matrix(req)
    n = len(demand)
    router = Router(req.model)
    graph = StepGraph()
    prev = None
    for k in range(1, n):
        step = graph.add((prev,))
        for i in range(n):
            j = (i + k) % n
            if demand[i, j]:
                graph.put(step, router.transfer(i, j, router.nccl(i, j), demand[i, j], (i, j)))
        prev = step
    return make_schedule(req, graph.steps(), {"scheduler": "msccl"})
