"""FAST (Lei et al., NSDI'26, ``papers/fast-paper.tex`` §4.1–4.3) on PCIe servers.

FAST schedules an AlltoAllv in two phases (§4.1–4.3); we reimplement it from the paper, on the
project's fixed paths:

1. **Intra-server balancing** (§4.1 "Mitigating sender skew"). For every source server s and
   destination server t, the bytes the GPUs of s hold for t (the tile's row sums) are equalised:
   each GPU ends up carrying ⌊Σ/M⌋ or ⌈Σ/M⌉ bytes (M GPUs per server; the ⌈⌉ shares go to the
   GPUs that held most). Overloaded GPUs hand their excess to underloaded ones (surpluses matched
   to deficits in GPU order). *Our choice* of which bytes move: a GPU handing bytes to GPU g first
   gives its bytes for GPU g of t (they then land at their destination), last its bytes for its
   own peer on t. These hand-offs are relayed transfers: one concurrent step of intra-node
   transfers before any scale-out stage.
2. **Merged peer transfers** (§4.1 "Mitigating receiver skew"): GPU g of s sends all it carries
   for t to GPU g of t, so every scale-out transfer is one-to-one between same-index GPUs.
3. **Server-level Birkhoff–von Neumann stages** (§4.2). The server matrix S[s][t] is the
   per-GPU volume ⌈Σ_st/M⌉. As in FAST's implementation (``research/peer-systems.md`` §3 step 4)
   it is scaled to units of q bytes, q the smallest with every line sum of ⌈S/q⌉ at most
   ``MAX_UNITS`` (FAST's ``MAX_SUM_LIMIT`` = 100; at least N−1), which bounds the number of stages.
   The unit matrix is padded to equal line sums (§4.4 "Adapting an arbitrary matrix": deficits of
   the lighter rows and columns are matched in order; padding is virtual and never sent) and
   decomposed into weighted permutations. *Our matching rule* (§4.4 allows any perfect matching
   on the positive support): the bottleneck matching (largest minimum entry, found by bisection
   with ``scipy.optimize.linear_sum_assignment``), ties broken by the largest total; stages then
   run heaviest first (as RailWave's reading of FAST). In stage k with weight w_k every GPU of s
   sends up to w_k·q bytes of what it carries to its peer on π_k(s), filling the stages of a
   server pair in order. Every GPU sends through its rail NIC as NCCL would
   (:func:`~variopath_jax.baselines.nccl.nccl_route`: GPUDirect RDMA up to PXB, else staged).
4. **Per-stage redistribution** (§4.2 step 3, §4.3): bytes that reached the right server at the
   wrong GPU go from the receiving GPU to their destination GPU. Redistribution k depends on
   stage k and on redistribution k−1; stage k+1 depends on stage k and on redistribution k−1 (two
   receive buffers, FAST's ping-pong), so stage k+1's scale-out overlaps redistribution k (§4.3
   "Pipeline structure"). A carrier sends the bytes it must redistribute first, so the last
   stage's exposed redistribution is as small as we can make it.
5. **Intra-server demand** (the diagonal tiles) runs directly alongside the first stage (§4.3).

Scale-up phases (balancing, redistribution, intra-server demand) are each one concurrent step of
direct intra-node transfers on NCCL's GPU-GPU route (P2P up to PXB, else through host memory).
FAST runs them with SpreadOut (§4.4 "Exclusion of ..."); on PCIe the fluid simulator shares the
links max-min among concurrent transfers, which we take as the same total time while saving
M−2 step overheads per phase. Unlike on NVLink, these PCIe transfers share switch uplinks, root
ports and the GPU links with the NIC traffic, and the simulator charges them for it: nothing is
free. With one server, or no demand across servers, FAST degenerates to the direct intra-node
transfers of step 5.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from variopath_jax.baselines._common import (
    Router,
    StepGraph,
    demand_matrix,
    make_schedule,
)
from variopath_jax.schedule import Schedule
from variopath_jax.schedulers import PlanRequest, register

MAX_UNITS = 100  # FAST's MAX_SUM_LIMIT: the largest line sum of the scaled server matrix


def unit_bytes(server: np.ndarray, max_units: int = MAX_UNITS) -> int:
    """The smallest unit q (bytes) with every line sum of ⌈server/q⌉ at most ``max_units``
    (raised to N−1 when smaller: a line has N−1 entries of at least one unit)."""
    limit = max(max_units, len(server) - 1)

    def fits(q: int) -> bool:
        units = -(-server // q)
        return max(units.sum(0).max(), units.sum(1).max()) <= limit

    lo, hi = 1, max(int(server.max()), 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def pad_to_doubly_stochastic(matrix: np.ndarray) -> np.ndarray:
    """Add to the lighter rows and columns until every line sums to the largest line sum
    (FAST §4.4): the i-th row deficit is matched to column deficits in order."""
    padded = np.array(matrix, dtype=np.int64)
    top = max(padded.sum(0).max(), padded.sum(1).max())
    row_need = top - padded.sum(1)
    col_need = top - padded.sum(0)
    i = j = 0
    n = len(padded)
    while i < n and j < n:
        if row_need[i] == 0:
            i += 1
        elif col_need[j] == 0:
            j += 1
        else:
            x = min(row_need[i], col_need[j])
            padded[i, j] += x
            row_need[i] -= x
            col_need[j] -= x
    return padded


def _perfect(allowed: np.ndarray) -> np.ndarray | None:
    """A perfect matching (column of each row) using only allowed entries, or None."""
    rows, cols = linear_sum_assignment((~allowed).astype(np.float64))
    return cols if allowed[rows, cols].all() else None


def birkhoff(matrix: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Birkhoff–von Neumann decomposition of an integer matrix with equal line sums (FAST §4.2,
    §4.4): ``[(weight, perm), ...]`` with ``Σ weight · P(perm) == matrix``, heaviest first.

    Each permutation is a bottleneck matching on the positive support (the largest possible
    minimum entry), ties broken by the largest total; its weight is that minimum.
    """
    rest = np.array(matrix, dtype=np.int64)
    n = len(rest)
    sums = np.concatenate([rest.sum(0), rest.sum(1)])
    if (sums != sums[0]).any():
        raise ValueError("birkhoff: the matrix's row and column sums are not all equal")
    stages: list[tuple[int, np.ndarray]] = []
    while rest.any():
        values = np.unique(rest[rest > 0])
        lo, hi = 0, len(values) - 1  # values[0] is always feasible (Birkhoff's theorem)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _perfect(rest >= values[mid]) is None:
                hi = mid - 1
            else:
                lo = mid
        allowed = rest >= values[lo]
        big = float(n * rest.max() + 1)
        cost = np.where(allowed, -rest.astype(np.float64), big)
        rows, cols = linear_sum_assignment(cost)
        weight = int(rest[rows, cols].min())
        rest[rows, cols] -= weight
        stages.append((weight, cols.astype(np.int64)))
    order = sorted(range(len(stages)), key=lambda k: -stages[k][0])
    return [stages[k] for k in order]


def balance_tile(tile: np.ndarray) -> tuple[list[list[tuple[int, int, int]]], np.ndarray]:
    """FAST's sender balancing of one M×M tile (rows: GPUs of s, columns: GPUs of t; §4.1).

    Returns, per carrier GPU g, the pieces ``(a, b, bytes)`` of D[a][b] it sends to GPU g of t
    (a != g: handed over by GPU a), and each carrier's load.
    """
    m = len(tile)
    rest = np.array(tile, dtype=np.int64)
    load = rest.sum(1)
    total = int(load.sum())
    order = np.argsort(-load, kind="stable")
    target = np.full(m, total // m, dtype=np.int64)
    target[order[: total % m]] += 1
    surplus = [(int(a), int(load[a] - target[a])) for a in range(m) if load[a] > target[a]]
    deficit = [(int(g), int(target[g] - load[g])) for g in range(m) if load[g] < target[g]]
    handed: list[list[tuple[int, int, int]]] = [[] for _ in range(m)]
    si = di = 0
    while si < len(surplus) and di < len(deficit):
        (a, extra), (g, need) = surplus[si], deficit[di]
        x = min(extra, need)
        left = x
        for b in [g, *(b for b in range(m) if b not in (a, g)), a]:
            take = min(left, int(rest[a, b]))
            if take:
                handed[g].append((a, b, take))
                rest[a, b] -= take
                left -= take
        surplus[si], deficit[di] = (a, extra - x), (g, need - x)
        si += extra == x
        di += need == x
    pieces = []
    for g in range(m):
        own = [(g, b, int(rest[g, b])) for b in range(m) if rest[g, b]]
        mine = own + handed[g]
        # bytes to redistribute at t first, bytes for GPU g of t itself last
        pieces.append(sorted(mine, key=lambda p: (p[1] == g, p[1], p[0])))
    return pieces, target


@register(
    "fast",
    "FAST (NSDI'26): intra-server balancing, server-level Birkhoff stages, pipelined "
    "redistribution (§4), on NCCL's PCIe paths",
)
def plan(req: PlanRequest) -> Schedule:
    """FAST's two-phase schedule (paper §4.1–4.3; modeling choices in the module docstring)."""
    demand = demand_matrix(req)
    topo = req.model.topology
    nodes, m = topo.nodes, topo.gpus_per_node
    router = Router(req.model)
    graph = StepGraph()
    blocks = demand.reshape(nodes, m, nodes, m)
    tiles = blocks.transpose(0, 2, 1, 3)  # [s, t, a, b]
    balance = graph.add()
    cross = tiles.sum(axis=(2, 3))
    np.fill_diagonal(cross, 0)
    first = (balance,)
    meta: dict = {"scheduler": "fast", "stages": 0, "unit_bytes": 0}

    # intra-server demand, alongside the first stage
    intra = graph.add(first)
    for s in range(nodes):
        base = s * m
        for a, b in zip(*np.nonzero(tiles[s, s]), strict=True):
            i, j = base + int(a), base + int(b)
            graph.put(intra, router.transfer(i, j, router.nccl(i, j), demand[i, j], (i, j)))

    if cross.any():
        # phase 1: balance every cross-server tile; hand-offs are relayed intra-node transfers
        carried: dict[tuple[int, int], list[list[tuple[int, int, int]]]] = {}
        server = np.zeros((nodes, nodes), dtype=np.int64)
        for s, t in zip(*np.nonzero(cross), strict=True):
            s, t = int(s), int(t)
            pieces, target = balance_tile(tiles[s, t])
            carried[(s, t)] = pieces
            server[s, t] = target.max()
            for g, plist in enumerate(pieces):
                for a, b, x in plist:
                    if a != g:
                        i, j, via = s * m + a, t * m + b, s * m + g
                        graph.put(balance, router.transfer(i, via, router.nccl(i, via), x, (i, j)))

        # phase 2: Birkhoff stages of the scaled, padded server matrix
        q = unit_bytes(server)
        stages = birkhoff(pad_to_doubly_stochastic(-(-server // q)))
        meta.update(stages=len(stages), unit_bytes=q)
        capacity: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for k, (weight, perm) in enumerate(stages):
            for s, t in enumerate(perm):
                if cross[s, t]:
                    capacity.setdefault((s, int(t)), []).append((k, weight * q))
        net = [0] * len(stages)
        redis = [0] * len(stages)
        for k in range(len(stages)):
            prev_net = net[k - 1] if k else None
            older_redis = redis[k - 2] if k >= 2 else None
            net[k] = graph.add((prev_net, older_redis) if k else first)
            redis[k] = graph.add((net[k], redis[k - 1] if k else None))
        for (s, t), pieces in carried.items():
            for g, plist in enumerate(pieces):
                src, peer = s * m + g, t * m + g
                slots = iter(capacity[(s, t)])
                k, room = next(slots)
                for a, b, x in plist:
                    i, j = s * m + a, t * m + b
                    while x:
                        if not room:
                            k, room = next(slots)
                        y = min(x, room)
                        graph.put(
                            net[k], router.transfer(src, peer, router.nccl(src, peer), y, (i, j))
                        )
                        if peer != j:
                            graph.put(
                                redis[k], router.transfer(peer, j, router.nccl(peer, j), y, (i, j))
                            )
                        x -= y
                        room -= y
    return make_schedule(req, graph.steps(), meta)
