"""Offline analyzer: the channel-family catalog (paper §4.1, Algorithm 1) and its factored form."""

from __future__ import annotations

from collections.abc import Mapping

from variopath_jax.catalog import store
from variopath_jax.catalog.catalog import (
    Catalog,
    build_catalog,
    global_links,
    node_pattern,
    path_key,
    realizable,
)
from variopath_jax.catalog.instances import CatalogError, Instance, InstanceSet, build_instances
from variopath_jax.catalog.verify import VERIFIERS, VerifyReport
from variopath_jax.topology import PathModel, Topology

__all__ = [
    "VERIFIERS",
    "Catalog",
    "CatalogError",
    "Instance",
    "InstanceSet",
    "VerifyReport",
    "build_catalog",
    "build_instances",
    "catalog_for",
    "get_catalog",
    "global_links",
    "node_pattern",
    "path_key",
    "realizable",
    "store",
]


def get_catalog(
    topo: Topology,
    kind: str = "auto",
    method: str = "profiles",
    nic_policy: str = "nearest",
    efficiency: float | Mapping[str, float] | tuple[tuple[str, float], ...] = 1.0,
    cache: bool = True,
    only_nearest: bool = False,
    rate_gbs: Mapping[str, float] | tuple[tuple[str, float], ...] = (),
) -> Catalog:
    """The catalog of ``topo`` from the disk cache (keyed by fingerprint and parameters), built and
    cached on a miss. A cache entry that fails to load (corrupt, old version) is rebuilt; a build
    that failed is remembered (until the builder's sources change) and its error raised again
    without rebuilding."""
    if kind == "auto":
        kind = "flat" if topo.nodes == 1 or topo.oversubscription > 1.0 else "factored"
    fingerprint = topo.fingerprint if kind == "flat" else topo.with_nodes(1).fingerprint
    model = PathModel(
        topo,
        nic_policy=nic_policy,
        efficiency=efficiency,
        only_nearest=only_nearest,
        rate_gbs=rate_gbs,
    )
    path = store.cache_path(fingerprint, kind, method, path_key(model))
    if cache and path.is_file():
        try:
            return store.load(path, fingerprint)
        except CatalogError:
            path.unlink(missing_ok=True)
    if cache and (error := store.load_failure(path)) is not None:
        raise CatalogError(error)
    try:
        catalog = build_catalog(
            topo, kind, method, nic_policy, efficiency, only_nearest=only_nearest, rate_gbs=rate_gbs
        )
    except CatalogError as err:
        if cache:
            store.save_failure(path, str(err))
        raise
    if cache:
        store.save(catalog, path)
    return catalog


def catalog_for(model: PathModel, cache: bool = True) -> Catalog:
    """The catalog of a path model's deployment, under its paths (``get_catalog`` with every
    parameter of the model)."""
    return get_catalog(
        model.topology,
        nic_policy=model.nic_policy,
        efficiency=model.efficiency,
        only_nearest=model.only_nearest,
        rate_gbs=model.rate_gbs,
        cache=cache,
    )
