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

DeepEP sends a token once per destination node and fans it out there. A rank-pair demand hides
that (it counts a token once per destination rank), so by default each D[i][j] travels on its
own. Given the routing's per-node multiplicity (``options["node_demand"]``, a
:class:`~variopath_jax.workloads.NodeDemand` whose ``pairs`` is the request's demand, issue 30),
the RDMA steps carry each token once per destination node instead: ``node[i][n]`` bytes from i to
its proxy on node n (entry (i, proxy) of the deduplicated demand's first phase,
``NodeDemand.two_phase``), and the forwarding steps carry ``D[i][j]`` from the proxy to every
other destination rank j of that node (entry (proxy, j) of its second phase), chunked and
pipelined as above. The schedule then serves the two phases' sum, not the request's demand; its
meta says ``dedup``. With one node, DeepEP's intranode kernel is the direct step alone.

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
from variopath_jax.errors import VarioPathError
from variopath_jax.schedule import Schedule
from variopath_jax.schedulers import PlanRequest, register
from variopath_jax.workloads import NodeDemand

CHUNKS = 4


def _chunk_steps() -> tuple[StepGraph, int, list[int], list[int]]:
    """The step graph both plans share: one step of direct intra-node sends, then per chunk an
    RDMA step (after the previous chunk's) and a forwarding step (after its RDMA step and the
    previous chunk's forwarding)."""
    graph = StepGraph()
    direct = graph.add()
    rdma: list[int] = []
    forward: list[int] = []
    for c in range(CHUNKS):
        rdma.append(graph.add((rdma[c - 1],) if c else ()))
        forward.append(graph.add((rdma[c], forward[c - 1] if c else None)))
    return graph, direct, rdma, forward


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
    nodes = req.options.get("node_demand")
    if nodes is not None:
        return _plan_dedup(req, demand, nodes)
    router = Router(req.model)
    graph, direct, rdma, forward = _chunk_steps()
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


def _plan_dedup(req: PlanRequest, demand: np.ndarray, nodes: NodeDemand) -> Schedule:
    """DeepEP normal mode with its per-node deduplication (module docstring)."""
    topo = req.model.topology
    m = topo.gpus_per_node
    if nodes.gpus_per_node != m or not np.array_equal(nodes.pairs, demand):
        raise VarioPathError(
            "deepep: options['node_demand'] must describe the request's demand on nodes of "
            f"{m} GPUs (its pairs equal to the demand, gpus_per_node {m}), got "
            f"gpus_per_node {nodes.gpus_per_node}"
        )
    router = Router(req.model)
    graph, direct, rdma, forward = _chunk_steps()
    for i, j in zip(*np.nonzero(demand), strict=True):  # one node: directly
        i, j = int(i), int(j)
        if i // m == j // m:
            graph.put(direct, router.transfer(i, j, router.nccl(i, j), demand[i, j], (i, j)))
    for i, n in zip(*np.nonzero(nodes.node), strict=True):  # once per node, to the proxy
        i, n = int(i), int(n)
        if n == i // m:
            continue
        proxy = nodes.relay(i, n)
        route = router.nccl(i, proxy)
        for c, part in enumerate(split_even(int(nodes.node[i, n]), CHUNKS)):
            if part:
                graph.put(rdma[c], router.transfer(i, proxy, route, part, (i, proxy)))
        for j in range(n * m, (n + 1) * m):  # then to every other destination on that node
            if j == proxy or not demand[i, j]:
                continue
            for c, part in enumerate(split_even(int(demand[i, j]), CHUNKS)):
                if part:
                    graph.put(
                        forward[c],
                        router.transfer(proxy, j, router.nccl(proxy, j), part, (proxy, j)),
                    )
    meta = {"scheduler": "deepep", "chunks": CHUNKS, "dedup": True}
    return make_schedule(req, graph.steps(), meta)
