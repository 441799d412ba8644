"""NCCL's AlltoAll(v) on a PCIe server: every pair at once, on NCCL's default paths.

NCCL runs alltoallv as one group of ``ncclSend``/``ncclRecv`` to every peer, all concurrent. Its
transport per pair follows its default rules on PCIe (research/topology-formats.md §2.4):

- same node: peer-to-peer only when the path class is at most PXB (``NCCL_P2P_LEVEL`` default;
  the ``nccl_p2p_level`` option sets it: ``LOC`` never, ``NVL`` NVLink only, ``PIX`` ... ``SYS``)
  and P2P is allowed; otherwise the SHM transport through host memory (NVLink when bonded);
- different nodes: each rank uses its rail-local NIC (the NICs of the best relation class,
  spread over the GPUs that share them), the receiver its own; GPUDirect RDMA only when the
  GPU-NIC class is at most PXB (``NCCL_NET_GDR_LEVEL`` default), otherwise staged in host memory.
NCCL never loops intra-node traffic through NICs, and its paths are fixed at setup.
"""

from __future__ import annotations

from variopath_jax.errors import VarioPathError
from variopath_jax.schedule import Schedule, Step
from variopath_jax.schedulers import PlanRequest, register, transfer
from variopath_jax.topology import PathModel, Route
from variopath_jax.topology.model import RELATION_ORDER

# NCCL_P2P_LEVEL values, nearest first: the largest path class that may still use P2P
P2P_LEVELS = ("LOC", "NVL", *RELATION_ORDER)
DEFAULT_P2P_LEVEL = "PXB"
_GDR_LEVEL = RELATION_ORDER.index("PXB")


def p2p_level(value: str | None) -> str:
    """An ``NCCL_P2P_LEVEL`` value, checked (None: NCCL's default, PXB)."""
    level = DEFAULT_P2P_LEVEL if value is None else str(value).upper()
    if level not in P2P_LEVELS:
        raise VarioPathError(
            f"unknown NCCL P2P level {value!r}; expected one of {', '.join(P2P_LEVELS)}"
        )
    return level


def rail_nics(model: PathModel) -> list[int]:
    """The NIC (global index) NCCL would give each rank: among the NICs of the best relation
    class to the GPU, the k-th GPU sharing that set takes the (k mod count)-th NIC."""
    topo = model.topology
    node = topo.node
    per_node, nics_per_node = topo.gpus_per_node, topo.nics_per_node
    if not nics_per_node:
        return [-1] * topo.num_ranks
    local: list[int] = []
    seen: dict[tuple[int, ...], int] = {}
    for gpu in node.gpus:
        classes = [RELATION_ORDER.index(node.relation(gpu.name, nic.name)) for nic in node.nics]
        best = tuple(k for k, c in enumerate(classes) if c == min(classes))
        k = seen.get(best, 0)
        seen[best] = k + 1
        local.append(best[k % len(best)])
    return [(r // per_node) * nics_per_node + local[r % per_node] for r in range(topo.num_ranks)]


def nccl_route(
    model: PathModel, i: int, j: int, nics: list[int], level: str = DEFAULT_P2P_LEVEL
) -> Route:
    """The route NCCL would use from rank i to rank j with ``NCCL_P2P_LEVEL=level``."""
    topo = model.topology
    node = topo.node
    a, d = int(model.group_of[i]), int(model.group_of[j])
    gi, gj = node.gpus[i % topo.gpus_per_node].name, node.gpus[j % topo.gpus_per_node].name
    if topo.node_of_rank(i) == topo.node_of_rank(j):
        nv = [r for r in model.routes(a, d) if r.cls.startswith("NV") and r.cls != "NET"]
        if nv and level != "LOC":
            return nv[0]
        tree = model.tree_route(a, d)
        if topo.p2p and P2P_LEVELS.index(tree.cls) <= P2P_LEVELS.index(level):
            return tree
        return model.memory_route(a, d)
    s, r = nics[i], nics[j]
    per = topo.nics_per_node
    ns, nr = node.nics[s % per].name, node.nics[r % per].name
    staged_send = not topo.gdr or RELATION_ORDER.index(node.relation(gi, ns)) > _GDR_LEVEL
    staged_recv = not topo.gdr or RELATION_ORDER.index(node.relation(gj, nr)) > _GDR_LEVEL
    return model.nic_route(a, d, s, r, (staged_send, staged_recv))


@register(
    "nccl", "NCCL: every pair at once on NCCL's default PCIe paths (P2P/GDR up to PXB, rail NIC)"
)
def plan(req: PlanRequest) -> Schedule:
    model = req.model
    nics = rail_nics(model)
    level = p2p_level(req.options.get("nccl_p2p_level"))
    n = len(req.demand)
    transfers = tuple(
        transfer(model, i, j, nccl_route(model, i, j, nics, level), req.demand[i, j])
        for i in range(n)
        for j in range(n)
        if req.demand[i, j] > 0
    )
    steps = [Step(transfers)] if transfers else []
    return Schedule(
        n,
        steps,
        model.topology.fingerprint,
        req.lambda_s,
        "general",
        {"scheduler": "nccl", "nccl_p2p_level": level},
    )
