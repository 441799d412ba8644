"""Rank groups, candidate paths and their footprints (paper §3 "Model setup", §4.1).

For an ordered GPU pair the candidate concrete paths are (DESIGN.md "Paths"):

- ``PIX``/``PXB``/``PHB``/``NODE``/``SYS``: direct peer-to-peer over PCIe, classed by the tree;
  the tree route, plus routes over switch-to-switch fabric links where a node has them (a ring);
- ``NV#``: an NVLink bond between the two GPUs;
- ``SHM``: a bounce through the source socket's host memory, when peer-to-peer is off;
- ``NIC``: a loop through two different NICs of the node and the network;
- ``NET``: between nodes, through a send NIC, the fabric and a receive NIC.

NIC legs follow the PCIe tree; without GPUDirect RDMA they are staged through the GPU's socket
memory. Which NICs a GPU may use is the ``nic_policy``: ``"nearest"`` (the NICs of the best
relation class to the GPU, the default: a rail-local NIC), ``"socket"`` (its socket's NICs) or
``"all"``.

A path is its ordered directed links and its rate ``bw(p)``: the minimum capacity along it times
an efficiency factor (one number, or a per-class profile), capped by a measured rate per class
where one is given (a *path profile* file, :func:`load_path_profile`). Its footprint ``L(p)`` is its links
minus the two GPU endpoint links (DESIGN.md "Resources U"). Paths of topology-equivalent GPUs
differ only in their endpoint links, so candidates are computed once per ordered pair of rank
groups as *routes* (the paper's group-level path instances ``r ∈ R_ad``) and pruned by
PRUNEPATHS: a route is dropped when another for the same group pair uses a subset of its
resources at no lower rate, one of the two strictly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

import numpy as np

from variopath_jax.errors import TopologyError
from variopath_jax.topology.model import RELATION_ORDER, Topology

CLASS_ORDER = ("NVL", *RELATION_ORDER, "SHM", "NIC", "NET", "OUT", "IN")
NIC_POLICIES = ("nearest", "socket", "all")


def class_rank(cls: str) -> int:
    """Position of a path class in nearest-first order (``NV#`` counts as ``NVL``)."""
    return CLASS_ORDER.index("NVL" if cls.startswith("NV") else cls)


@dataclass(frozen=True)
class Route:
    """A group-level path instance: the part of a path between the two endpoint GPU links.

    Attributes
    ----------
    src_group, dst_group : int
        Ordered rank-group pair (a, d).
    cls : str
        Path class (``PIX`` ... ``NET``, ``NV#``).
    links : tuple of int
        Directed link ids in order, endpoint links excluded: exactly the footprint in U.
    rate : float
        bw(r) in GB/s, endpoint links included.
    nics : tuple of int or None
        Global (send NIC, receive NIC) indices for ``NIC``/``NET`` routes.
    via_endpoints : bool
        False only for NVLink routes, which bypass the GPUs' PCIe links.
    staged : bool
        The bytes bounce through host memory on the way (SHM, or a NIC leg without GPUDirect
        RDMA); see :func:`staged_class` for the candidate routes.
    """

    src_group: int
    dst_group: int
    cls: str
    links: tuple[int, ...]
    rate: float
    nics: tuple[int, int] | None = None
    via_endpoints: bool = True
    staged: bool = False

    @cached_property
    def footprint(self) -> frozenset[int]:
        return frozenset(self.links)

    def sort_key(self) -> tuple:
        return (-self.rate, class_rank(self.cls), len(self.links), self.links)


@dataclass(frozen=True)
class Path:
    """A concrete path between two ranks: a route plus the endpoints' GPU links."""

    src: int
    dst: int
    route: Route
    links: tuple[int, ...]

    @property
    def cls(self) -> str:
        return self.route.cls

    @property
    def rate(self) -> float:
        return self.route.rate

    @property
    def footprint(self) -> frozenset[int]:
        return self.route.footprint


def staged_class(topo: Topology, cls: str) -> bool:
    """Whether a candidate route of class ``cls`` bounces through host memory: SHM always, NIC
    legs when the topology has no GPUDirect RDMA (baselines' own routes say it themselves)."""
    return cls == "SHM" or (cls in ("NIC", "NET", "OUT", "IN") and not topo.gdr)


def prune_dominated(routes: list[Route]) -> list[Route]:
    """PRUNEPATHS (paper §4.1): drop r when some r' has L(r') ⊆ L(r) and bw(r') ≥ bw(r), with
    at least one strict; of exact duplicates (same footprint and rate) keep the first in
    ``Route.sort_key`` order."""
    ordered = sorted(routes, key=Route.sort_key)
    kept: list[Route] = []
    for r in ordered:
        dominated = False
        for q in ordered:
            if q is r:
                continue
            if q.footprint <= r.footprint and q.rate >= r.rate:
                strict = q.footprint < r.footprint or q.rate > r.rate
                duplicate = q.footprint == r.footprint and q.rate == r.rate
                if strict or (duplicate and q.sort_key() < r.sort_key()):
                    dominated = True
                    break
        if not dominated and all(k.links != r.links for k in kept):
            kept.append(r)
    return kept


class PathModel:
    """Candidate paths of a topology, grouped by rank group (paper §4.1).

    Parameters
    ----------
    topo : Topology
    nic_policy : {"nearest", "socket", "all"}
        Which NICs a GPU may send and receive through.
    efficiency : float, mapping of class to float, or (class, float) pairs
        Factor applied to the minimum link capacity of a path; a mapping is a per-class profile
        (``{"NET": 0.9, "SHM": 0.5}``), missing classes get 1.0. ``self.efficiency`` is the same
        in a hashable form (a float or sorted pairs), accepted here too.
    only_nearest : bool
        Keep only each group pair's nearest route (the paper's fixed-path ablation, Table 3).
    rate_gbs : mapping of class to GB/s, or (class, GB/s) pairs
        Measured or hand-set rates: a path of a listed class runs at no more than its rate.
        ``self.rate_gbs`` is the sorted pairs.
    """

    def __init__(
        self,
        topo: Topology,
        nic_policy: str = "nearest",
        efficiency: float | Mapping[str, float] | tuple[tuple[str, float], ...] = 1.0,
        only_nearest: bool = False,
        rate_gbs: Mapping[str, float] | tuple[tuple[str, float], ...] = (),
    ) -> None:
        if isinstance(efficiency, tuple):
            efficiency = dict(efficiency)
        caps = dict(rate_gbs)
        if nic_policy not in NIC_POLICIES:
            raise TopologyError(
                f"unknown nic_policy {nic_policy!r}; expected one of {NIC_POLICIES}"
            )
        factors = efficiency if isinstance(efficiency, Mapping) else {}
        default = 1.0 if isinstance(efficiency, Mapping) else float(efficiency)
        _check_rates(factors, default, caps)
        self.topology = topo
        self.graph = topo.graph
        self.nic_policy = nic_policy
        self.only_nearest = only_nearest
        # one factor, or the per-class profile as sorted (class, factor) pairs: hashable
        self.efficiency: float | tuple[tuple[str, float], ...] = (
            tuple(sorted(factors.items())) if isinstance(efficiency, Mapping) else default
        )
        self.rate_gbs: tuple[tuple[str, float], ...] = tuple(
            sorted((c, float(g)) for c, g in caps.items())
        )
        self._factors = dict(factors)
        self._default_factor = default
        self._caps = dict(self.rate_gbs)
        self._capacity = np.array([lk.gbs for lk in self.graph.links])
        self._nic_ids = {v: k for k, v in enumerate(self.graph.nics)}
        self._templates: dict[tuple[int, int, bool], tuple[Route, ...]] = {}
        self._routes: dict[tuple[int, int], tuple[Route, ...]] = {}
        self._build_groups()

    # ----- rank groups ----------------------------------------------------------------------
    def _build_groups(self) -> None:
        node = self.topology.node
        local_groups: list[list[int]] = []
        keys: dict[tuple, int] = {}
        for idx, gpu in enumerate(node.gpus):
            bonded = any(gpu.name in (lk.a, lk.b) for lk in node.links)  # only NVLink touches a GPU
            # GPUs are topology-equivalent when they hang off the same parent through identical
            # links and carry no links of their own (swapping them is then an automorphism).
            key = ("solo", idx) if bonded else (gpu.parent, gpu.up_gbs, gpu.down_gbs)
            if key not in keys:
                keys[key] = len(local_groups)
                local_groups.append([])
            local_groups[keys[key]].append(idx)
        self.local_groups = local_groups
        self.groups_per_node = len(local_groups)
        per_node = self.topology.gpus_per_node
        self.groups: list[tuple[int, ...]] = [
            tuple(k * per_node + i for i in grp)
            for k in range(self.topology.nodes)
            for grp in local_groups
        ]
        self.group_of = np.empty(self.topology.num_ranks, dtype=np.int64)
        for g, ranks in enumerate(self.groups):
            self.group_of[list(ranks)] = g
        sizes = {len(g) for g in self.groups}
        self.group_size: int | None = sizes.pop() if len(sizes) == 1 else None
        g = self.graph
        self._attach = [g.parent[g.gpus[grp[0]]] for grp in self.groups]

    def group_node(self, group: int) -> int:
        return group // self.groups_per_node

    def endpoint_links(self, rank: int) -> tuple[int, int]:
        """(GPU→parent, parent→GPU) link ids of a rank: the links outside U."""
        g = self.graph
        v = g.gpus[rank]
        return g.link(v, g.parent[v]), g.link(g.parent[v], v)

    # ----- routes ---------------------------------------------------------------------------
    def routes(self, a: int, d: int) -> tuple[Route, ...]:
        """Pruned group-level instances R_ad (empty for a == d when the group has one GPU)."""
        key = (a, d)
        if key not in self._routes:
            na, nd = self.group_node(a), self.group_node(d)
            la, ld = a % self.groups_per_node, d % self.groups_per_node
            same = na == nd
            tkey = (la, ld, same)
            if tkey not in self._templates:
                ta, td = la, (ld if same else self.groups_per_node + ld)
                routes = prune_dominated(self._enumerate(ta, td))
                if self.only_nearest and routes:  # the fixed-path ablation: one path per pair
                    routes = [min(routes, key=_nearest_key)]
                self._templates[tkey] = tuple(routes)
            self._routes[key] = tuple(
                self._translate(r, a, d, na, nd) for r in self._templates[tkey]
            )
        return self._routes[key]

    def unpruned_routes(self, a: int, d: int) -> list[Route]:
        """Every candidate route between two groups of a one- or two-node template, before
        PRUNEPATHS (for verification on small topologies)."""
        if max(self.group_node(a), self.group_node(d)) > 1 or self.group_node(a) != 0:
            raise TopologyError("unpruned routes are available for groups of nodes 0 and 1 only")
        return self._enumerate(a, d)

    def paths(self, i: int, j: int) -> list[Path]:
        """Candidate concrete paths from rank i to rank j (i ≠ j), fastest first."""
        if i == j:
            raise TopologyError(f"no path from rank {i} to itself: self traffic stays local")
        return [
            self.path(i, j, r) for r in self.routes(int(self.group_of[i]), int(self.group_of[j]))
        ]

    def path(self, i: int, j: int, route: Route) -> Path:
        if not route.via_endpoints:
            return Path(i, j, route, route.links)
        up, _ = self.endpoint_links(i)
        _, down = self.endpoint_links(j)
        return Path(i, j, route, (up, *route.links, down))

    def nearest(self, a: int, d: int) -> Route:
        """The pair's nearest path: best class, then highest rate, then fewest links."""
        routes = self.routes(a, d)
        if not routes:
            raise TopologyError(f"no path between rank groups {a} and {d}")
        return min(routes, key=_nearest_key)

    def class_counts(self) -> dict[str, int]:
        """Number of candidate rank-level paths per class over all ordered rank pairs.

        Every node is identical, so a group pair's routes depend only on the groups' places in
        their nodes and whether the nodes are the same: the count is taken over node 0's pairs
        within node 0 and with node 1 and scaled, at a cost that does not grow with the node
        count."""
        nodes, per = self.topology.nodes, self.groups_per_node
        counts: dict[str, int] = {}
        for other, weight in ((0, nodes), (1, nodes * (nodes - 1))):
            if not weight:
                continue
            for a in range(per):
                for d in range(other * per, (other + 1) * per):
                    size_a, size_d = len(self.groups[a]), len(self.groups[d])
                    pairs = size_a * size_d - (size_a if a == d else 0)
                    if not pairs:
                        continue
                    for r in self.routes(a, d):
                        counts[r.cls] = counts.get(r.cls, 0) + pairs * weight
        return {c: counts[c] for c in sorted(counts, key=class_rank)}

    # ----- enumeration on template nodes (0, 0) or (0, 1) ---------------------------------
    def _rate(self, cls: str, links: list[int]) -> float:
        factor = self._factors.get(cls, self._default_factor)
        return min(float(self._capacity[links].min()) * factor, self._caps.get(cls, float("inf")))

    def replace(self, **changes) -> PathModel:
        """The same path model with some parameters changed (``only_nearest=True``, ...)."""
        params = {
            "nic_policy": self.nic_policy,
            "efficiency": self.efficiency,
            "only_nearest": self.only_nearest,
            "rate_gbs": self.rate_gbs,
        }
        return PathModel(self.topology, **{**params, **changes})

    def identity(self) -> str:
        """Everything the paths depend on besides the topology, as a stable string: what a
        catalog built from this model is keyed by (NIC policy, efficiency, rate caps,
        nearest-only)."""
        eff_text = ",".join(f"{k}={v:g}" for k, v in sorted(self._factors.items()))
        caps = ";cap=" + ",".join(f"{k}={v:g}" for k, v in self.rate_gbs) if self.rate_gbs else ""
        nearest = ";nearest-only" if self.only_nearest else ""
        return f"nic={self.nic_policy};eff={self._default_factor:g};{eff_text}{caps}{nearest}"

    def _enumerate(self, a: int, d: int) -> list[Route]:
        """All candidate routes between template groups a and d (d may sit on node 1)."""
        g = self.graph
        ranks_a, ranks_d = self.groups[a], self.groups[d]
        if a == d and len(ranks_a) < 2:
            return []
        src, dst = g.gpus[ranks_a[0]], g.gpus[ranks_d[0]]
        A, B = self._attach[a], self._attach[d]
        up, down = g.link(src, A), g.link(B, dst)
        routes: list[Route] = []

        def add(cls: str, links: list[int], nics: tuple[int, int] | None = None) -> None:
            if len(set(links)) != len(links):
                return  # a route may not use a directed link twice
            rate = self._rate(cls, [up, *links, down])
            staged = staged_class(self.topology, cls)
            routes.append(Route(a, d, cls, tuple(links), rate, nics, True, staged))

        if g.node_of[src] == g.node_of[dst]:
            node = self.topology.node
            local_src = g.vertices[src].split("/", 1)[1]
            local_dst = g.vertices[dst].split("/", 1)[1]
            bonds = node.nvlinks(local_src, local_dst) if src != dst else 0
            if bonds:
                lid = g.link(src, dst)
                routes.append(
                    Route(a, d, f"NV{bonds}", (lid,), self._rate("NVL", [lid]), None, False)
                )
            if self.topology.p2p:
                for links in self._direct_routes(A, B):
                    add(self._classify(A, links), links)
            else:
                add("SHM", self._via_memory(A, B))
            for s in self._usable_nics(A):
                for r in self._usable_nics(B):
                    if s != r:
                        hub = g.hub[s]
                        add(
                            "NIC",
                            [
                                *self._to_nic(A, s),
                                g.link(s, hub),
                                g.link(hub, r),
                                *self._from_nic(r, B),
                            ],
                            (self._nic_index(s), self._nic_index(r)),
                        )
        else:
            for s in self._usable_nics(A):
                for r in self._usable_nics(B):
                    hs, hr = g.hub[s], g.hub[r]
                    middle = [g.link(s, hs)]
                    if hs != hr:  # oversubscribed: through each node's uplink to the spine
                        middle += [g.link(hs, g.net), g.link(g.net, hr)]
                    middle.append(g.link(hr, r))
                    add(
                        "NET",
                        self._to_nic(A, s) + middle + self._from_nic(r, B),
                        (self._nic_index(s), self._nic_index(r)),
                    )
        return routes

    def _nic_index(self, nic_vertex: int) -> int:
        return self._nic_ids[nic_vertex]

    def _socket(self, v: int) -> int:
        return self.graph.up_chain(v)[-1]

    def _via_memory(self, A: int, B: int) -> list[int]:
        """A bounce through the host memory of A's socket."""
        g = self.graph
        cpu = self._socket(A)
        return g.tree_route(A, cpu) + g.tree_route(cpu, B)

    def _to_nic(self, A: int, nic: int, staged: bool | None = None) -> list[int]:
        """GPU side (attached at A) to a NIC: direct (GPUDirect RDMA) or staged in host memory."""
        staged = not self.topology.gdr if staged is None else staged
        return self._via_memory(A, nic) if staged else self.graph.tree_route(A, nic)

    def _from_nic(self, nic: int, B: int, staged: bool | None = None) -> list[int]:
        g = self.graph
        staged = not self.topology.gdr if staged is None else staged
        if not staged:
            return g.tree_route(nic, B)
        cpu = self._socket(B)
        return g.tree_route(nic, cpu) + g.tree_route(cpu, B)

    # ----- routes outside the candidate set, for baselines that follow other rules -----------
    def tree_route(self, a: int, d: int) -> Route:
        """The PCIe tree route between two groups of one node, as direct P2P, whatever its class."""
        A, B = self._attach[a], self._attach[d]
        links = self.graph.tree_route(A, B)
        cls = self._classify(A, links)
        return self._custom(a, d, cls, links)

    def memory_route(self, a: int, d: int) -> Route:
        """A bounce through the source socket's host memory (NCCL's SHM transport)."""
        links = self._via_memory(self._attach[a], self._attach[d])
        return self._custom(a, d, "SHM", links, staged=True)

    def nic_route(
        self,
        a: int,
        d: int,
        send_nic: int,
        recv_nic: int,
        staged: tuple[bool, bool] = (False, False),
    ) -> Route:
        """Through NIC ``send_nic`` and NIC ``recv_nic`` (global indices); ``staged`` says whether
        the send / receive side goes through host memory instead of GPUDirect RDMA."""
        g = self.graph
        A, B = self._attach[a], self._attach[d]
        s, r = g.nics[send_nic], g.nics[recv_nic]
        hs, hr = g.hub[s], g.hub[r]
        middle = [g.link(s, hs)]
        if hs != hr:
            middle += [g.link(hs, g.net), g.link(g.net, hr)]
        middle.append(g.link(hr, r))
        links = [*self._to_nic(A, s, staged[0]), *middle, *self._from_nic(r, B, staged[1])]
        cls = "NIC" if g.node_of[A] == g.node_of[B] else "NET"
        return self._custom(a, d, cls, links, (send_nic, recv_nic), any(staged))

    def nic_halves(self, group: int) -> tuple[list[Route], list[Route]]:
        """The two halves of this group's network routes, for node-local catalogs.

        A leaving half runs from the group's GPUs to a usable NIC and onto the network
        (class ``OUT``, ``nics = (s, -1)``); an arriving half from the network through a NIC to the
        group's GPUs (``IN``, ``nics = (-1, r)``). With a non-blocking fabric every NET route is
        one leaving half plus one arriving half, its rate the smaller of theirs. Both are pruned by
        dominance among themselves.
        """
        g = self.graph
        A = self._attach[group]
        gpu = g.gpus[self.groups[group][0]]
        up, down = g.link(gpu, A), g.link(A, gpu)
        leaving, arriving = [], []
        for s in self._usable_nics(A):
            links = [*self._to_nic(A, s), g.link(s, g.hub[s])]
            leaving.append(
                Route(
                    group,
                    -1,
                    "OUT",
                    tuple(links),
                    self._rate("NET", [up, *links]),
                    (self._nic_index(s), -1),
                    staged=staged_class(self.topology, "OUT"),
                )
            )
            links = [g.link(g.hub[s], s), *self._from_nic(s, A)]
            arriving.append(
                Route(
                    -1,
                    group,
                    "IN",
                    tuple(links),
                    self._rate("NET", [*links, down]),
                    (-1, self._nic_index(s)),
                    staged=staged_class(self.topology, "IN"),
                )
            )
        leaving, arriving = prune_dominated(leaving), prune_dominated(arriving)
        if self.only_nearest:
            leaving, arriving = leaving[:1], arriving[:1]
        return leaving, arriving

    def usable_nics(self, group: int) -> list[int]:
        """Global indices of the NICs a group may use under ``nic_policy``."""
        return [self._nic_index(v) for v in self._usable_nics(self._attach[group])]

    def _custom(
        self,
        a: int,
        d: int,
        cls: str,
        links: list[int],
        nics: tuple[int, int] | None = None,
        staged: bool = False,
    ) -> Route:
        g = self.graph
        up = g.link(g.gpus[self.groups[a][0]], self._attach[a])
        down = g.link(self._attach[d], g.gpus[self.groups[d][0]])
        rate = self._rate(cls, [up, *links, down])
        return Route(a, d, cls, tuple(links), rate, nics, True, staged)

    def _usable_nics(self, A: int) -> list[int]:
        """NIC vertices of A's node a GPU attached at A may use, by ``nic_policy``."""
        g = self.graph
        node = self.topology.node
        k = g.node_of[A]
        local_A = g.vertices[A].split("/", 1)[1]
        nics = [(g.index[f"n{k}/{n.name}"], n.name) for n in node.nics]
        if self.nic_policy == "all":
            return [v for v, _ in nics]
        if self.nic_policy == "socket":
            sock = node.socket_of(local_A)
            return [v for v, name in nics if node.socket_of(name) == sock]
        # nearest: the NICs whose relation to A's GPUs is the best class present
        probe = next(gpu.name for gpu in node.gpus if gpu.parent == local_A)
        rel = {v: RELATION_ORDER.index(node.relation(probe, name)) for v, name in nics}
        best = min(rel.values(), default=None)
        return [v for v, _ in nics if rel[v] == best]

    def _direct_routes(self, A: int, B: int) -> list[list[int]]:
        """Peer-to-peer routes between attachments A and B.

        Peer traffic stays inside the switches when it can: the candidates are the tree route if it
        never reaches a host bridge, and the routes over switch-to-switch fabric links (up to a
        switch X above A, across the fabric to a switch Y above B, down to B), of which the
        shortest are kept, as a fabric-mode switch routes them. Only when no switch-only route
        exists does P2P go up through the host (the tree route: PHB, NODE or SYS).
        """
        g = self.graph
        tree = g.tree_route(A, B)
        switch_only = (
            [tree]
            if all(g.kinds[g.links[lid].dst] in ("switch", "gpu", "nic") for lid in tree)
            else []
        )
        fabric: dict[int, list[int]] = {}
        for lk in g.links:
            if lk.kind == "fabric" and g.node_of[lk.src] == g.node_of[A]:
                fabric.setdefault(lk.src, []).append(lk.dst)
        if fabric:
            ups_a = [v for v in g.up_chain(A) if g.kinds[v] == "switch"]
            ups_b = [v for v in g.up_chain(B) if g.kinds[v] == "switch"]
            for X in ups_a:
                for Y in ups_b:
                    if X == Y:
                        continue
                    for walk in _simple_paths(fabric, X, Y):
                        links = (
                            g.tree_route(A, X)
                            + [g.link(u, v) for u, v in pairwise(walk)]
                            + g.tree_route(Y, B)
                        )
                        if all(
                            g.kinds[g.links[lid].dst] in ("switch", "gpu", "nic") for lid in links
                        ):
                            switch_only.append(links)
        if not switch_only:
            return [tree]
        shortest = min(len(r) for r in switch_only)
        return [r for r in switch_only if len(r) == shortest]

    def _classify(self, A: int, links: list[int]) -> str:
        """PCIe class of a direct route from its visited vertices (see model.NodeSpec.relation)."""
        g = self.graph
        visited = [A] + [g.links[lid].dst for lid in links]
        kinds = [g.kinds[v] for v in visited]
        if any(g.links[lid].kind == "socket" for lid in links):
            return "SYS"
        if "cpu" in kinds:
            return "NODE" if "hostbridge" in kinds else "PHB"
        if "hostbridge" in kinds:
            return "PHB"
        return (
            "PXB"
            if len({v for v, k in zip(visited, kinds, strict=True) if k == "switch"}) > 1
            else "PIX"
        )

    def _translate(self, r: Route, a: int, d: int, na: int, nd: int) -> Route:
        """Move a template route from nodes (0, 0|1) to nodes (na, nd)."""
        if (r.src_group, r.dst_group) == (a, d):
            return r
        layout = self.graph.layout

        def move(lid: int) -> int:
            k, local = layout.local_link(lid)
            return layout.global_link(local, na if k == 0 else nd)

        nics = None
        if r.nics is not None:
            per = self.topology.nics_per_node
            s, t = r.nics
            nics = (na * per + s % per, nd * per + t % per)
        links = tuple(move(lid) for lid in r.links)
        return Route(a, d, r.cls, links, r.rate, nics, r.via_endpoints, r.staged)


def _nearest_key(r: Route) -> tuple:
    return (class_rank(r.cls), -r.rate, len(r.links), r.links)


def _simple_paths(adj: dict[int, list[int]], start: int, goal: int) -> list[list[int]]:
    """Every simple path from start to goal in a small graph (switch fabrics), vertices listed."""
    out: list[list[int]] = []
    stack = [(start, [start])]
    while stack:
        v, walk = stack.pop()
        for w in adj.get(v, ()):
            if w in walk:
                continue
            if w == goal:
                out.append([*walk, w])
            else:
                stack.append((w, [*walk, w]))
    return sorted(out, key=lambda w: (len(w), w))


PATH_PROFILE_FORMAT = "variopath-path-profile"
PATH_PROFILE_VERSION = 1
PROFILE_CLASSES = tuple(c for c in CLASS_ORDER if c not in ("NVL", "OUT", "IN"))


@dataclass(frozen=True)
class PathProfile:
    """Measured or hand-set path rates (docs/topology.md "Path profiles"): an efficiency (one
    factor or one per class) and absolute rate caps per class, with where they came from."""

    efficiency: float | tuple[tuple[str, float], ...] = 1.0
    rate_gbs: tuple[tuple[str, float], ...] = ()
    source: str = ""

    def model(self, topo: Topology, nic_policy: str = "nearest") -> PathModel:
        return PathModel(
            topo, nic_policy=nic_policy, efficiency=self.efficiency, rate_gbs=self.rate_gbs
        )


def load_path_profile(path: str) -> PathProfile:
    """Read a path profile file; every problem is a TopologyError naming the file and the key."""
    import json

    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as err:
        raise TopologyError(f"path profile {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise TopologyError(f"path profile {path}: not JSON ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != PATH_PROFILE_FORMAT:
        raise TopologyError(f"path profile {path}: 'format' must be {PATH_PROFILE_FORMAT!r}")
    if doc.get("version") != PATH_PROFILE_VERSION:
        raise TopologyError(
            f"path profile {path}: version {doc.get('version')!r}; this library reads "
            f"version {PATH_PROFILE_VERSION}"
        )
    unknown = set(doc) - {"format", "version", "source", "efficiency", "rate_gbs"}
    if unknown:
        raise TopologyError(f"path profile {path}: unknown keys {sorted(unknown)}")

    def classes(table: object, key: str) -> tuple[tuple[str, float], ...]:
        if not isinstance(table, dict):
            raise TopologyError(f"path profile {path}: {key!r} must map path classes to numbers")
        for cls, value in table.items():
            if cls not in PROFILE_CLASSES and not cls.startswith("NV"):
                raise TopologyError(
                    f"path profile {path}: {key}[{cls!r}]: unknown path class; expected one of "
                    f"{PROFILE_CLASSES} or NV#"
                )
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TopologyError(f"path profile {path}: {key}[{cls!r}] must be a number")
        return tuple(sorted((c, float(v)) for c, v in table.items()))

    eff = doc.get("efficiency", 1.0)
    if isinstance(eff, bool) or not isinstance(eff, int | float | dict):
        raise TopologyError(f"path profile {path}: 'efficiency' must be a number or a mapping")
    profile = PathProfile(
        float(eff) if not isinstance(eff, dict) else classes(eff, "efficiency"),
        classes(doc.get("rate_gbs", {}), "rate_gbs"),
        str(doc.get("source", "")),
    )
    try:  # the model's own checks: factors in (0, 1], positive rates
        eff = profile.efficiency
        _check_rates(
            dict(eff) if isinstance(eff, tuple) else {},
            float(eff) if not isinstance(eff, tuple) else 1.0,
            dict(profile.rate_gbs),
        )
    except TopologyError as err:
        raise TopologyError(f"path profile {path}: {err}") from None
    return profile


def _check_rates(factors: Mapping[str, float], default: float, caps: Mapping[str, float]) -> None:
    """Efficiency factors in (0, 1] and positive finite rate caps."""
    for cls, f in {**dict(factors), "*": default}.items():
        if not 0 < f <= 1.0:
            raise TopologyError(f"efficiency for {cls} must be in (0, 1], got {f}")
    for cls, gbs in caps.items():
        if isinstance(gbs, bool) or not isinstance(gbs, int | float) or not 0 < gbs < float("inf"):
            raise TopologyError(f"rate_gbs for {cls} must be a positive number, got {gbs!r}")
