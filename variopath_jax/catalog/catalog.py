"""The catalog tree (shapes → families) and how it is built: flat or factored.

- ``flat`` (paper §4.1): instances over every rank group of the deployment; every realizable
  shape M (G×G) with its families.
- ``factored`` (beyond the paper, DESIGN.md "Offline"): with a non-blocking fabric and identical
  nodes, a channel is one node-local pattern per node (lanes inside the node, lanes leaving
  through a NIC, lanes arriving through a NIC) plus a matching of leaving to arriving lanes across
  nodes, which the fabric always admits. The catalog is built once per node type over the node's
  groups and a virtual group O standing for all other nodes (R_aO: leaving halves, R_Od: arriving
  halves, O without degree limit), so its cost does not grow with the node count; multi-node
  shapes are composed at planning time. A multi-node shape is realizable exactly when every node's
  pattern (its diagonal block, plus its off-node row and column sums as the O column and row) is.
  With an oversubscribed fabric the nodes share the spine, the factorisation does not hold, and
  only the flat catalog is correct.

Families: by default one witness per rate profile, dominated profiles dropped (``compact``);
``method="dfs"`` runs Algorithm 1 itself and keeps every family PRUNEFAMILIES keeps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from variopath_jax import progress as reporting
from variopath_jax.catalog.build import Family, enumerate_families, prune_families
from variopath_jax.catalog.compact import enumerate_profiles
from variopath_jax.catalog.instances import CatalogError, InstanceSet, build_instances
from variopath_jax.topology import PathModel, Topology

KINDS = ("flat", "factored")
METHODS = ("profiles", "dfs")

# A flat catalog of several nodes is refused past this many rank groups, before any search: two
# nodes of four groups (fig1, balanced-8) build in a second, two r5080-bf3 nodes (eight groups of
# two) pass 2 M rate profiles after minutes. One node has no such limit (its factored catalog is
# no smaller), and the factored catalog's cost does not grow with the node count.
FLAT_MAX_GROUPS = 4


def path_key(model: PathModel) -> str:
    """The path-model parameters a catalog depends on, as a stable string."""
    return model.identity()


@dataclass
class Catalog:
    """A catalog tree: realizable shapes, and per shape the families that realize it.

    Attributes
    ----------
    kind : {"flat", "factored"}
    fingerprint : str
        Fingerprint of the topology (flat) or of one node of it (factored).
    paths : str
        The path-model parameters the instances come from (``path_key``).
    instances : InstanceSet
        For a factored catalog: one node's groups plus the free group O.
    shapes : np.ndarray
        (S, G', G') lane counts, G' = number of groups (+1 for O).
    families : list of Family
        Every family, as ((instance, lanes), ...).
    family_shape : np.ndarray
        Shape index of each family.
    link_offset : int
        Factored only: local link ids at or above this are network-block ids (see ``global_links``).
    """

    kind: str
    fingerprint: str
    paths: str
    instances: InstanceSet
    shapes: np.ndarray
    families: list[Family]
    family_shape: np.ndarray
    method: str = "profiles"
    seconds: float = 0.0
    link_offset: int = 0
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def num_groups(self) -> int:
        return self.instances.num_groups

    @property
    def group_size(self) -> int:
        return self.instances.group_size

    def families_of(self, shape: int) -> list[int]:
        return [int(k) for k in np.flatnonzero(self.family_shape == shape)]

    def check_topology(self, topo: Topology, model: PathModel | None = None) -> None:
        """Refuse to serve a topology the catalog was not built for."""
        want = topo.fingerprint if self.kind == "flat" else topo.with_nodes(1).fingerprint
        if want != self.fingerprint:
            raise CatalogError(
                f"this {self.kind} catalog was built for topology {self.fingerprint}, not {want} ({topo.name}); "
                "rebuild it for this topology"
            )
        if self.kind == "factored" and topo.oversubscription > 1.0:
            raise CatalogError("a factored catalog needs a non-blocking fabric; use a flat catalog")
        if model is not None and path_key(model) != self.paths:
            raise CatalogError(
                f"catalog built with paths {self.paths!r}, model has {path_key(model)!r}"
            )

    def summary(self) -> dict[str, Any]:
        groups = [list(g) for g in self.instances.groups]
        return {
            "kind": self.kind,
            "fingerprint": self.fingerprint,
            "method": self.method,
            "groups": groups,
            "group_size": self.group_size,
            "instances": len(self.instances.instances),
            "shapes": len(self.shapes),
            "families": len(self.families),
            "seconds": self.seconds,
            **self.stats,
        }


def build_catalog(
    topo: Topology,
    kind: str = "auto",
    method: str = "profiles",
    nic_policy: str = "nearest",
    efficiency: float | Mapping[str, float] = 1.0,
    max_families: int = 2_000_000,
    progress: Callable[[int], None] | None = None,
    only_nearest: bool = False,
    rate_gbs: Mapping[str, float] | tuple[tuple[str, float], ...] = (),
) -> Catalog:
    """Build the catalog tree of ``topo`` (paths: ``PathModel``'s parameters).

    ``kind="auto"`` picks ``flat`` for one node or an oversubscribed fabric, else ``factored``.
    """
    if kind == "auto":
        kind = "flat" if topo.nodes == 1 or topo.oversubscription > 1.0 else "factored"
    if kind not in KINDS:
        raise CatalogError(f"unknown catalog kind {kind!r}; expected one of {KINDS} or 'auto'")
    if method not in METHODS:
        raise CatalogError(f"unknown method {method!r}; expected one of {METHODS}")
    if kind == "factored" and topo.oversubscription > 1.0:
        raise CatalogError(
            f"the fabric is oversubscribed ({topo.oversubscription:g}:1): nodes share the spine, so channels do "
            "not factor into node-local patterns; build a flat catalog"
        )
    if method == "dfs" and kind == "factored":
        raise CatalogError(
            "Algorithm 1's DFS builds flat catalogs; use method='profiles' for factored ones"
        )
    if kind == "flat" and topo.nodes > 1:
        check_flat_size(topo, nic_policy)
    start = time.perf_counter()
    if kind == "flat":
        model = PathModel(
            topo,
            nic_policy=nic_policy,
            efficiency=efficiency,
            only_nearest=only_nearest,
            rate_gbs=rate_gbs,
        )
        inst = build_instances(model)
        fingerprint, offset = topo.fingerprint, 0
    else:
        node_topo = topo.with_nodes(1)
        model = PathModel(
            node_topo,
            nic_policy=nic_policy,
            efficiency=efficiency,
            only_nearest=only_nearest,
            rate_gbs=rate_gbs,
        )
        inst = build_instances(model, list(range(model.groups_per_node)), outside=True)
        fingerprint, offset = node_topo.fingerprint, node_topo.graph.links_per_node
    n = inst.num_groups
    what = "families" if method == "dfs" else "rate profiles"
    with reporting.task(f"building the {kind} catalog of {topo.name} ({method})") as task:
        if progress is None:

            def progress(found: int) -> None:
                task.update(found, f"{kind} catalog: {found:,} {what} (limit {max_families:,})")

        shapes, families, family_shape, stats = _search(inst, n, method, max_families, progress)
    if not len(shapes):
        raise CatalogError(
            f"topology {topo.name!r} admits no channel: some rank group cannot send to or receive from any other"
        )
    catalog = Catalog(
        kind=kind,
        fingerprint=fingerprint,
        paths=path_key(model),
        instances=inst,
        shapes=shapes.astype(np.int16, copy=False),
        families=families,
        family_shape=np.asarray(family_shape, dtype=np.int32),
        method=method,
        seconds=time.perf_counter() - start,
        link_offset=offset,
        stats=stats,
    )
    return catalog


def check_flat_size(topo: Topology, nic_policy: str = "nearest") -> None:
    """Refuse a flat catalog of several nodes past ``FLAT_MAX_GROUPS`` rank groups, naming what
    works instead."""
    groups = PathModel(topo, nic_policy=nic_policy).groups
    if len(groups) <= FLAT_MAX_GROUPS:
        return
    instead = (
        "the fabric is oversubscribed, so only a flat catalog is correct here: plan with a peer "
        "scheduler (nccl, pairwise, fast, ...), which needs no catalog"
        if topo.oversubscription > 1.0
        else "build the factored catalog (kind 'factored', the default for several nodes), whose "
        "cost does not grow with the node count"
    )
    raise CatalogError(
        f"a flat catalog of {topo.name} x {topo.nodes} spans {len(groups)} rank groups, past the "
        f"{FLAT_MAX_GROUPS} a flat catalog of several nodes is built for (its shapes are "
        f"{len(groups)}x{len(groups)} matrices; two r5080-bf3 nodes, 8 groups, exceed 2 M rate "
        f"profiles after minutes); {instead}"
    )


def _search(
    inst: InstanceSet,
    n: int,
    method: str,
    max_families: int,
    progress: Callable[[int], None],
) -> tuple[np.ndarray, list[Family], list[int], dict[str, int]]:
    """Shapes, families, each family's shape and search statistics, by ``method``."""
    if method == "dfs":
        tree = enumerate_families(inst, max_families=max_families, progress=progress)
        shapes = np.array(tree.shapes, dtype=np.int16).reshape(len(tree.shapes), n, n)
        families: list[Family] = []
        family_shape: list[int] = []
        for s, fams in enumerate(tree.families):
            kept = prune_families(inst, fams)
            families += kept
            family_shape += [s] * len(kept)
        stats = {"found": sum(len(f) for f in tree.families), "visited": tree.visited}
        return shapes, families, family_shape, stats
    compact = enumerate_profiles(inst, max_profiles=max_families, progress=progress)
    stats = {"found": len(compact.families), "visited": compact.visited, "reused": compact.reused}
    return compact.shapes, compact.families, compact.family_shape, stats


def global_links(
    catalog: Catalog, local_links: tuple[int, ...], node: int, topo: Topology
) -> tuple[int, ...]:
    """Map a factored catalog's node-local link ids onto node ``node`` of ``topo``."""
    layout = topo.graph.layout
    if catalog.link_offset != layout.links_per_node:
        raise CatalogError(
            f"the catalog's node has {catalog.link_offset} links, the topology's {layout.links_per_node}"
        )
    return tuple(layout.global_link(lid, node) for lid in local_links)


def node_pattern(shape: np.ndarray, node: int, groups_per_node: int) -> np.ndarray:
    """The node-local shape of ``node`` inside a multi-node shape: its diagonal block, with its
    off-node row sums as the O column and off-node column sums as the O row."""
    lo, hi = node * groups_per_node, (node + 1) * groups_per_node
    out = np.zeros((groups_per_node + 1, groups_per_node + 1), dtype=np.int64)
    out[:-1, :-1] = shape[lo:hi, lo:hi]
    out[:-1, -1] = shape[lo:hi, :].sum(axis=1) - shape[lo:hi, lo:hi].sum(axis=1)
    out[-1, :-1] = shape[:, lo:hi].sum(axis=0) - shape[lo:hi, lo:hi].sum(axis=0)
    return out


def realizable(catalog: Catalog, shape: np.ndarray) -> bool:
    """Whether a shape (of the deployment) is realizable under this catalog."""
    shape = np.asarray(shape)
    known = {s.tobytes() for s in catalog.shapes.astype(np.int64)}
    if catalog.kind == "flat":
        return shape.astype(np.int64).tobytes() in known
    per_node = catalog.num_groups - 1
    nodes = shape.shape[0] // per_node
    return all(node_pattern(shape, k, per_node).tobytes() in known for k in range(nodes))
