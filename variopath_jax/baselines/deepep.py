"""DeepEP's normal-mode dispatch adapted to PCIe servers (``research/peer-systems.md`` §5).

``deepep`` — V1 normal kernels (``docs/legacy.md``: "RDMA goes to the GPU with the same local
index in the destination node, then NVLink forwarding"), with PCIe standing in for NVLink:

- bytes of D[i][j] for a rank j on another node go by RDMA from i to the GPU of j's node with
  i's local index (i's rail NIC to the same rail on that node: NCCL's ``NET`` route from
  :func:`~variopath_jax.baselines.nccl.nccl_route`, GPUDirect RDMA up to PXB, else staged through
  host memory), then from that GPU to j on the node's GPU-GPU route NCCL would use (P2P up to PXB,
  else through host memory); when that GPU is j itself there is no second hop;
- bytes for ranks of the same node go directly on that GPU-GPU route;
- everything starts at once: DeepEP has no stages, its senders, forwarders and receivers run
  concurrently and stream tokens in chunks. We model the streaming as ``CHUNKS`` = 4 chunks:
  every cross-node D[i][j] is cut into 4 near-equal parts; RDMA step c carries part c of every
  pair and depends on RDMA step c−1 (a sender's queue), forwarding step c carries part c's second
  hops and depends on RDMA step c and forwarding step c−1. Forwarding of chunk c thus overlaps
  the RDMA of chunk c+1, and only a quarter of one forwarding pass is exposed at the end, for
  2·4+1 = 9 steps (4 λ of chained RDMA steps): more chunks would hide more forwarding but pay a
  λ each, fewer would expose more. The intra-node transfers are one step with no dependencies.

DeepEP sends a token once per destination node and fans it out there; the schedule IR serves a
rank-pair demand, so that deduplication (top-k experts on one node) is not modeled: each D[i][j]
travels on its own. With one node, DeepEP's intranode kernel is the direct step alone.

``deepep-rdma`` — the non-NVLink normal mode of DeepEP PR #375 ("1D": all traffic, intra-node
included, goes through the RDMA NIC): every D[i][j] goes from i through i's rail NIC to j's rail
NIC and on to j (a loopback through one NIC when both ranks share it), GPUDirect RDMA as above;
one concurrent step. It needs NICs, even on one node.
"""

from __future__ import annotations

import numpy as np

from variopath_jax.baselines._common import (
    Router,
    StepGraph,
    demand_matrix,
    make_schedule,
    split_even,
)
from variopath_jax.schedule import Schedule
from variopath_jax.schedulers import PlanRequest, register

CHUNKS = 4


@register(
    "deepep",
    "DeepEP normal mode on PCIe: RDMA to the same-index GPU of the destination node, then "
    "PCIe forwarding; chunk-pipelined",
)
def plan(req: PlanRequest) -> Schedule:
    """DeepEP normal-mode dispatch (peer-systems.md §5; modeling choices in the module
    docstring)."""
    demand = demand_matrix(req)
    topo = req.model.topology
    m = topo.gpus_per_node
    router = Router(req.model)
    graph = StepGraph()
    direct = graph.add()
    rdma: list[int] = []
    forward: list[int] = []
    for c in range(CHUNKS):
        rdma.append(graph.add((rdma[c - 1],) if c else ()))
        forward.append(graph.add((rdma[c], forward[c - 1] if c else None)))
    for i, j in zip(*np.nonzero(demand), strict=True):
        i, j, x = int(i), int(j), int(demand[i, j])
        if i // m == j // m:
            graph.put(direct, router.transfer(i, j, router.nccl(i, j), x, (i, j)))
            continue
        proxy = (j // m) * m + i % m
        for c, part in enumerate(split_even(x, CHUNKS)):
            if part:
                graph.put(rdma[c], router.transfer(i, proxy, router.nccl(i, proxy), part, (i, j)))
                if proxy != j:
                    graph.put(
                        forward[c], router.transfer(proxy, j, router.nccl(proxy, j), part, (i, j))
                    )
    return make_schedule(req, graph.steps(), {"scheduler": "deepep", "chunks": CHUNKS})


@register(
    "deepep-rdma",
    "DeepEP non-NVLink normal mode (PR #375): every pair through the rail NICs, intra-node too; "
    "one step",
)
def plan_rdma(req: PlanRequest) -> Schedule:
    """DeepEP's RDMA-only normal mode (peer-systems.md §5, PR #375): one concurrent step."""
    demand = demand_matrix(req)
    router = Router(req.model)
    graph = StepGraph()
    step = graph.add()
    for i, j in zip(*np.nonzero(demand), strict=True):
        i, j = int(i), int(j)
        graph.put(step, router.transfer(i, j, router.rdma(i, j), demand[i, j], (i, j)))
    return make_schedule(req, graph.steps(), {"scheduler": "deepep-rdma"})
