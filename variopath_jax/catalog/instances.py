"""Group-level path instances R_ad with footprints and rates (paper §4.1).

An instance is a route between two rank groups (``PathModel.routes``, already pruned by
PRUNEPATHS). Its footprint L(r) ⊆ U splits into

- *exclusive* resources, packed as a bitmask: directed links one lane of a channel may use;
- *pooled* resources: the send side or the receive side of a class of interchangeable NICs.

NICs under the same parent with identical links are topology-equivalent, as GPUs of a rank group
are: routes that differ only in which NIC of a class they use are one instance that consumes one
unit of the class's send (or receive) pool per lane, a pool holding as many units as the class
has NICs. Feasibility is unchanged (any within-capacity use of a pool is realised by distinct
NICs), and the catalog no longer enumerates every relabelling of equivalent NICs: the same
symmetry the paper exploits for GPUs (§4.1, "rank groups"), applied to NICs.

An instance whose exclusive footprint is empty (same-switch PIX, or a pooled NIC route that only
touches endpoint and NIC links) can carry several lanes of one channel; its *multiplicity* is the
most lanes it can hold (g, capped by its pools), and the DFS treats it as a count.
"""

from __future__ import annotations

from dataclasses import dataclass

from variopath_jax.errors import VarioPathError
from variopath_jax.topology import PathModel, Route


class CatalogError(VarioPathError):
    """A catalog cannot be built, loaded or used; the message says why."""


@dataclass(frozen=True)
class Instance:
    """One group-level path instance r ∈ R_ad (possibly standing for several NIC choices)."""

    index: int
    src_group: int
    dst_group: int
    cls: str
    rate: float
    mask: int  # exclusive footprint, as a bitmask over resource indices
    pools: tuple[
        int, ...
    ]  # pooled resources one lane consumes one unit of (send pool, receive pool)
    multiplicity: int  # the most lanes of one channel this instance can carry
    routes: tuple[Route, ...]  # the concrete routes it stands for (one per NIC pair; one if no NIC)

    def route_for(self, nics: tuple[int, int] | None) -> Route:
        for r in self.routes:
            if r.nics == nics:
                return r
        raise CatalogError(f"instance {self.index} has no route through NICs {nics}")


@dataclass(frozen=True)
class Pool:
    """The send or receive side of a class of interchangeable NICs (global NIC indices)."""

    nics: tuple[int, ...]
    side: str  # "send" or "recv"

    @property
    def capacity(self) -> int:
        return len(self.nics)


@dataclass(frozen=True)
class InstanceSet:
    """All instances of a set of groups, with the resource numbering of their footprints."""

    groups: tuple[tuple[int, ...], ...]  # ranks of each group, in group order
    instances: tuple[Instance, ...]
    resources: tuple[int, ...]  # link id of each exclusive resource bit
    pools: tuple[Pool, ...]
    free_group: int | None = None  # the virtual "other nodes" group O of a node-local set

    @property
    def group_size(self) -> int:
        return len(self.groups[0])

    @property
    def num_groups(self) -> int:
        """Groups including O, if present."""
        return len(self.groups) + (self.free_group is not None)


def check_groups(model: PathModel) -> int:
    """The common group size g; a clear error for topologies the catalog cannot serve."""
    topo = model.topology
    if topo.num_ranks < 2:
        raise CatalogError(
            f"topology {topo.name!r} has {topo.num_ranks} GPU: an AlltoAll needs at least two"
        )
    if model.group_size is None:
        sizes = sorted({len(g) for g in model.groups})
        raise CatalogError(
            f"topology {topo.name!r} has rank groups of unequal size {sizes}: channel shapes (paper Eq. 3) need "
            "every group to hold the same number of topology-equivalent GPUs"
        )
    return model.group_size


def nic_classes(model: PathModel) -> list[tuple[int, ...]]:
    """Classes of interchangeable NICs (global indices): same node, same parent, same links."""
    topo = model.topology
    node = topo.node
    classes: dict[tuple, list[int]] = {}
    for k in range(topo.nodes):
        for n, nic in enumerate(node.nics):
            key = (k, nic.parent, nic.up_gbs, nic.down_gbs, nic.nic_gbps)
            classes.setdefault(key, []).append(k * topo.nics_per_node + n)
    return [tuple(v) for v in classes.values()]


def nic_links(model: PathModel, nic: int) -> frozenset[int]:
    """The links private to one NIC: to and from its parent and its network hub."""
    g = model.graph
    v = g.nics[nic]
    p, hub = g.parent[v], g.hub[v]
    return frozenset({g.link(p, v), g.link(v, p), g.link(v, hub), g.link(hub, v)})


def build_instances(
    model: PathModel, groups: list[int] | None = None, outside: bool = False
) -> InstanceSet:
    """Instances R_ad for every ordered pair of the given groups (default: all groups).

    With ``outside``, the groups must be one node's, and a virtual group O (index len(groups))
    stands for every other node: R_aO holds the leaving halves of group a's network routes and
    R_Od the arriving halves of group d's (``PathModel.nic_halves``); O has no degree limit.
    Instances are ordered by (source group, destination group), then fastest first: the fixed
    order Algorithm 1 walks.
    """
    g = check_groups(model)
    groups = list(range(len(model.groups))) if groups is None else groups
    local = {grp: k for k, grp in enumerate(groups)}
    free = len(groups) if outside else None
    classes = nic_classes(model)
    class_of = {nic: c for c, members in enumerate(classes) for nic in members}
    private = {nic: nic_links(model, nic) for members in classes for nic in members}
    pool_ids: dict[tuple[int, str], int] = {}
    pools: list[Pool] = []

    def pool(cls_id: int, side: str) -> int:
        if (cls_id, side) not in pool_ids:
            pool_ids[(cls_id, side)] = len(pools)
            pools.append(Pool(classes[cls_id], side))
        return pool_ids[(cls_id, side)]

    routes: list[tuple[int, int, Route]] = [
        (local[a], local[d], r) for a in groups for d in groups for r in model.routes(a, d)
    ]
    if outside:
        for a in groups:
            leaving, arriving = model.nic_halves(a)
            routes += [(local[a], free, r) for r in leaving] + [
                (free, local[a], r) for r in arriving
            ]
        routes.sort(key=lambda x: (x[0], x[1]))

    # merge routes that differ only in which NIC of a class they use
    merged: dict[tuple, list[Route]] = {}
    for a, d, r in routes:
        if r.nics is None:
            key = (a, d, r.cls, r.links, None)
        else:
            s, t = r.nics
            mine = (private[s] if s >= 0 else frozenset()) | (private[t] if t >= 0 else frozenset())
            shared = tuple(lid for lid in r.links if lid not in mine)
            key = (a, d, r.cls, shared, (class_of.get(s, -1), class_of.get(t, -1)))
        merged.setdefault(key, []).append(r)

    exclusive = sorted({lid for (_, _, _, links, _) in merged for lid in links})
    bit = {lid: k for k, lid in enumerate(exclusive)}
    instances = []
    for (a, d, cls, links, nic_cls), same in merged.items():
        mask = 0
        for lid in links:
            mask |= 1 << bit[lid]
        used_pools: list[int] = []
        mult = 1 if links else g
        if nic_cls is not None:
            send, recv = nic_cls
            if send >= 0:
                used_pools.append(pool(send, "send"))
                mult = min(mult, len(classes[send]))
            if recv >= 0:
                used_pools.append(pool(recv, "recv"))
                mult = min(mult, len(classes[recv]))
            if send == recv and len(classes[send]) < 2:  # a loop needs two different NICs
                mult = 0
        if mult == 0:
            continue
        rate = max(r.rate for r in same)
        kept = tuple(r for r in same if r.rate == rate)
        instances.append(
            Instance(len(instances), a, d, cls, rate, mask, tuple(used_pools), mult, kept)
        )
    groups_out = tuple(model.groups[k] for k in groups)
    return InstanceSet(groups_out, tuple(instances), tuple(exclusive), tuple(pools), free)
