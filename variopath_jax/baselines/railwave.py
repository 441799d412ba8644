"""RailWave's Joint path (``papers/railwave-summary.txt`` §3.1–3.2; ``research/peer-systems.md``
§6) on PCIe servers.

RailWave is DeepEP plus two mechanisms, both modeled here (its calibrated selector, §3.3, picks
among Native / Rail-only / Permutation-only / Joint from measured anchors; we model Joint, the
fallback):

- **RailBalance** (§3.1, source-local): every source GPU i spreads its bytes for each other node
  evenly over the node's eligible rails (the NICs NCCL gives to at least one GPU,
  :func:`~variopath_jax.baselines.nccl.rail_nics`), using only its own counts: ⌊X/R⌋ bytes per
  rail, one more on X mod R rails taken in turn from position i mod R of the rail list (so the
  remainders of different sources land on different rails; aggregate equality depends on them, as
  the summary says). *Our choice* of which bytes go on which rail: bytes for a destination GPU on rail r fill
  rail r's share first, the rest fill the remaining shares in rail and rank order. Rail r's bytes
  leave from a GPU that owns rail r (the proxy): i itself when i owns r; otherwise the GPU of the
  destination's local index when that GPU owns r (its peer on the destination node is then the
  destination itself), else the rail's GPUs in turn. Moving bytes to a proxy is a relayed
  intra-node transfer on NCCL's GPU-GPU route.
- **Reusable cyclic waves** (§3.2, the Joint path): in wave k = 1 … N−1, node n sends only to node
  n+k mod N, so every node has one outgoing and one incoming peer per wave and every ordered node
  pair appears once. Rails keep a fixed egress–ingress correspondence (§3.1): a proxy sends to the
  GPU with its local index on the destination node (DeepEP's RDMA to the same index, through the
  rail NIC on both sides, NCCL's ``NET`` route), which forwards to the destination GPU on NCCL's
  GPU-GPU route (DeepEP's hybrid forwarding).

Steps, per wave k: rail balancing B_k (after B_{k−1}: RailWave packs wave k+1 while wave k
communicates, its A.4), the wave's network transfers W_k (after B_k and W_{k−1}: waves execute in
order) and the forwarding F_k (after W_k and F_{k−1}), which overlaps wave k+1. Intra-node demand
goes directly on NCCL's GPU-GPU route in one step with no dependencies, as DeepEP sends it. With
one node only that step remains.
"""

from __future__ import annotations

import numpy as np

from variopath_jax.baselines._common import Router, StepGraph, demand_matrix, make_schedule
from variopath_jax.schedule import Schedule
from variopath_jax.schedulers import PlanRequest, register


def rail_split(
    row: np.ndarray, rail_of: list[int], rails: list[int], first: int
) -> list[tuple[int, int, int]]:
    """Source-local RailBalance of one source's bytes for one node (§3.1).

    ``row[b]``: bytes for the destination node's GPU b; ``rail_of[b]``: its rail; ``rails``: the
    eligible rails; ``first``: where the remainder bytes start. Returns ``(rail, b, bytes)``.
    """
    total = int(row.sum())
    share = {r: total // len(rails) for r in rails}
    for k in range(total % len(rails)):
        share[rails[(first + k) % len(rails)]] += 1
    rest = [int(x) for x in row]
    out: list[tuple[int, int, int]] = []
    for b, x in enumerate(rest):  # bytes for a GPU on rail r fill rail r's share first
        r = rail_of[b]
        take = min(x, share.get(r, 0))
        if take:
            out.append((r, b, take))
            share[r] -= take
            rest[b] -= take
    for r in rails:
        for b in range(len(rest)):
            take = min(rest[b], share[r])
            if take:
                out.append((r, b, take))
                share[r] -= take
                rest[b] -= take
    return out


@register(
    "railwave",
    "RailWave Joint: source-local RailBalance over the rail NICs, then cyclic node-level waves "
    "n -> n+k with forwarding",
)
def plan(req: PlanRequest) -> Schedule:
    """RailWave's Joint path (summary §3.1–3.2; modeling choices in the module docstring)."""
    demand = demand_matrix(req)
    topo = req.model.topology
    nodes, m = topo.nodes, topo.gpus_per_node
    router = Router(req.model)
    per_nic = max(topo.nics_per_node, 1)
    rail_of = [router.nics[b] % per_nic for b in range(m)]
    rails = sorted(set(rail_of))
    owners = {r: [b for b in range(m) if rail_of[b] == r] for r in rails}
    graph = StepGraph()
    direct = graph.add()
    for s in range(nodes):
        block = demand[s * m : (s + 1) * m, s * m : (s + 1) * m]
        for a, b in zip(*np.nonzero(block), strict=True):
            i, j = s * m + int(a), s * m + int(b)
            graph.put(direct, router.transfer(i, j, router.nccl(i, j), demand[i, j], (i, j)))
    balance: list[int] = []
    wave: list[int] = []
    forward: list[int] = []
    for k in range(nodes - 1):
        balance.append(graph.add((balance[k - 1],) if k else ()))
        wave.append(graph.add((balance[k], wave[k - 1] if k else None)))
        forward.append(graph.add((wave[k], forward[k - 1] if k else None)))
    for k in range(1, nodes):
        for s in range(nodes):
            t = (s + k) % nodes
            for a in range(m):
                i = s * m + a
                row = demand[i, t * m : (t + 1) * m]
                if not row.any():
                    continue
                for r, b, x in rail_split(row, rail_of, rails, i):
                    j = t * m + b
                    if rail_of[a] == r:
                        local = a
                    elif rail_of[b] == r:
                        local = b
                    else:
                        local = owners[r][a % len(owners[r])]
                    proxy, peer = s * m + local, t * m + local
                    if proxy != i:
                        graph.put(
                            balance[k - 1],
                            router.transfer(i, proxy, router.nccl(i, proxy), x, (i, j)),
                        )
                    graph.put(
                        wave[k - 1],
                        router.transfer(proxy, peer, router.nccl(proxy, peer), x, (i, j)),
                    )
                    if peer != j:
                        graph.put(
                            forward[k - 1],
                            router.transfer(peer, j, router.nccl(peer, j), x, (i, j)),
                        )
    return make_schedule(req, graph.steps(), {"scheduler": "railwave", "rails": len(rails)})
