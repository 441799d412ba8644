"""Algorithm 1 of the paper: the channel-family catalog tree (§4.1).

A *family* B is a multiset of group-level instances with pairwise-disjoint footprints in which
every group has exactly g outgoing and g incoming lanes (Eq. 3-4); its *shape* M counts its lanes
per ordered group pair. The DFS walks the instances in a fixed order, branching on excluding or
including (with a count, for multi-lane instances) the next one; CANADD keeps footprints
disjoint and group degrees within g, SUFFIXOK stops when the remaining instances cannot fill
every group's slots, COMPLETE records a family under its shape. PRUNEFAMILIES then drops exact
duplicates and families dominated within their shape.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from variopath_jax.catalog.instances import CatalogError, InstanceSet

Family = tuple[tuple[int, int], ...]  # ((instance index, lane count), ...), instance order


@dataclass
class FamilyTree:
    """Shapes and their families, as Algorithm 1 leaves them."""

    shapes: list[tuple[int, ...]]  # flattened G×G lane counts, in discovery order
    families: list[list[Family]]  # per shape
    visited: int  # DFS states visited
    seconds: float


def enumerate_families(
    inst: InstanceSet,
    max_families: int = 2_000_000,
    progress: Callable[[int], None] | None = None,
) -> FamilyTree:
    """Run Algorithm 1's DFS over ``inst`` and bucket every complete family by shape.

    CANADD also keeps every NIC pool within its capacity (see ``instances``).

    ``max_families`` bounds the work: exceeding it raises :class:`CatalogError` (the factored
    catalog is the answer for large deployments).
    """
    start = time.perf_counter()
    if inst.free_group is not None:
        raise CatalogError(
            "Algorithm 1's DFS builds flat catalogs; node-local sets use the compact search"
        )
    n_groups = len(inst.groups)
    g = inst.group_size
    items = inst.instances
    m = len(items)
    src = [it.src_group for it in items]
    dst = [it.dst_group for it in items]
    mask = [it.mask for it in items]
    mult = [it.multiplicity for it in items]
    pools = [it.pools for it in items]
    pool_left = [p.capacity for p in inst.pools]
    # suffix capacities: lanes the instances t.. can still add per group
    suf_out = [[0] * n_groups for _ in range(m + 1)]
    suf_in = [[0] * n_groups for _ in range(m + 1)]
    for t in range(m - 1, -1, -1):
        suf_out[t] = suf_out[t + 1].copy()
        suf_in[t] = suf_in[t + 1].copy()
        suf_out[t][src[t]] += mult[t]
        suf_in[t][dst[t]] += mult[t]

    out_left = [g] * n_groups
    in_left = [g] * n_groups
    remaining = [2 * g * n_groups]  # total open slots
    chosen: list[tuple[int, int]] = []
    shape = [0] * (n_groups * n_groups)
    buckets: dict[tuple[int, ...], list[Family]] = {}
    order: list[tuple[int, ...]] = []
    counters = {"visited": 0, "families": 0}

    def suffix_ok(t: int) -> bool:
        so, si = suf_out[t], suf_in[t]
        return all(not (out_left[a] > so[a] or in_left[a] > si[a]) for a in range(n_groups))

    def explore(t: int, used: int) -> None:
        counters["visited"] += 1
        if remaining[0] == 0:  # COMPLETE
            key = tuple(shape)
            if key not in buckets:
                buckets[key] = []
                order.append(key)
            buckets[key].append(tuple(chosen))
            counters["families"] += 1
            if counters["families"] > max_families:
                raise CatalogError(
                    f"more than {max_families} channel families: too large for a flat catalog; "
                    "use the factored catalog (kind='factored')"
                )
            if progress is not None and counters["families"] % 10000 == 0:
                progress(counters["families"])
            return
        if t == m or not suffix_ok(t):
            return
        explore(t + 1, used)  # exclude r_t
        if mask[t] & used:  # CANADD: footprints must stay disjoint
            return
        a, d = src[t], dst[t]
        most = min(mult[t], out_left[a], in_left[d], *(pool_left[p] for p in pools[t]))
        cell = a * n_groups + d
        for count in range(1, most + 1):  # include r_t with `count` lanes
            out_left[a] -= count
            in_left[d] -= count
            for p in pools[t]:
                pool_left[p] -= count
            remaining[0] -= 2 * count
            shape[cell] += count
            chosen.append((t, count))
            explore(t + 1, used | mask[t])
            chosen.pop()
            shape[cell] -= count
            remaining[0] += 2 * count
            for p in pools[t]:
                pool_left[p] += count
            in_left[d] += count
            out_left[a] += count

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 2 * m + 1000))
    try:
        explore(0, 0)
    finally:
        sys.setrecursionlimit(limit)
    return FamilyTree(
        order, [buckets[k] for k in order], counters["visited"], time.perf_counter() - start
    )


def prune_families(inst: InstanceSet, families: list[Family]) -> list[Family]:
    """PRUNEFAMILIES within one shape: drop exact duplicates, and a family dominated by another
    whose instances pair with its own within every group pair with identical footprints and no
    lower rates, one rate strictly higher (paper §4.1)."""
    items = inst.instances
    unique = list(dict.fromkeys(families))

    def profile(fam: Family) -> tuple[tuple, tuple]:
        per_pair: dict[tuple[int, int], list[tuple[int, float]]] = {}
        for idx, count in fam:
            it = items[idx]
            per_pair.setdefault((it.src_group, it.dst_group), []).extend(
                [((it.mask, it.pools), it.rate)] * count
            )
        keys = sorted(per_pair)
        lanes = [sorted(per_pair[k]) for k in keys]
        footprints = tuple((k, tuple(m for m, _ in ls)) for k, ls in zip(keys, lanes, strict=True))
        rates = tuple(r for ls in lanes for _, r in ls)
        return footprints, rates

    by_footprint: dict[tuple, list[tuple[tuple, Family]]] = {}
    for fam in unique:
        fp, rates = profile(fam)
        by_footprint.setdefault(fp, []).append((rates, fam))
    kept: list[Family] = []
    for fam in unique:
        fp, rates = profile(fam)
        dominated = any(
            other is not fam and all(x >= y for x, y in zip(r2, rates, strict=True)) and r2 != rates
            for r2, other in by_footprint[fp]
        )
        if not dominated:
            kept.append(fam)
    return kept


def shape_matrix(key: tuple[int, ...], n_groups: int) -> np.ndarray:
    return np.array(key, dtype=np.int64).reshape(n_groups, n_groups)
