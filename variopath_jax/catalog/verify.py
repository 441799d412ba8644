"""Catalog verification against brute force on tiny topologies (paper §4.1's claims).

Soundness: every family of the catalog can be realized as a feasible channel (concrete routes
with pairwise-disjoint footprints, one send and one receive lane per rank). Completeness: the
shapes of all feasible channels are exactly the catalog's shapes, and every feasible channel
(over all candidate paths, dominated ones included) is matched by a family of its shape whose lane
rates are no lower, cell by cell.

``VERIFIERS`` is the seam for other verifiers: the solver package registers an OR-Tools CP-SAT
verifier there.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from variopath_jax.catalog.build import Family
from variopath_jax.catalog.catalog import Catalog
from variopath_jax.catalog.instances import CatalogError
from variopath_jax.topology import PathModel, Route


@dataclass
class VerifyReport:
    method: str
    sound: bool
    complete: bool
    channels: int = 0  # feasible channels enumerated (brute force)
    shapes_found: int = 0
    shapes_checked: int = 0  # admissible shapes proven present or unrealizable (CP-SAT)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.sound and self.complete


def feasible_channels(
    model: PathModel, limit: int = 2_000_000
) -> Iterator[list[tuple[int, int, Route]]]:
    """Every feasible channel of a small one-node topology: a derangement of the ranks and one
    candidate route per lane (PRUNEPATHS not applied), footprints pairwise disjoint."""
    n = model.topology.num_ranks
    if model.topology.nodes != 1 or n > 8:
        raise CatalogError("brute force enumerates channels of one node with at most 8 GPUs")
    group = model.group_of
    options = {
        (a, d): model.unpruned_routes(a, d)
        for a in range(len(model.groups))
        for d in range(len(model.groups))
    }
    count = 0
    for perm in itertools.permutations(range(n)):
        if any(perm[i] == i for i in range(n)):
            continue
        lanes = [(i, perm[i]) for i in range(n)]
        choices = [options[(int(group[i]), int(group[j]))] for i, j in lanes]
        for channel in _place(lanes, choices, 0, frozenset(), []):
            count += 1
            if count > limit:
                raise CatalogError(
                    f"more than {limit} feasible channels: too large for brute force"
                )
            yield channel


def _place(
    lanes: list, choices: list, k: int, used: frozenset[int], chosen: list
) -> Iterator[list]:
    """Every choice of one route per lane with pairwise-disjoint footprints."""
    if k == len(lanes):
        yield list(chosen)
        return
    for r in choices[k]:
        fp = frozenset(r.links)
        if fp & used:
            continue
        chosen.append((*lanes[k], r))
        yield from _place(lanes, choices, k + 1, used | fp, chosen)
        chosen.pop()


def _realizable(catalog: Catalog, model: PathModel, family) -> bool:
    """Concrete routes for every lane of a family with disjoint footprints (pooled NICs resolved)."""
    items = catalog.instances.instances
    lanes = [items[i] for i, c in family for _ in range(c)]

    def place(k: int, used: frozenset[int]) -> bool:
        if k == len(lanes):
            return True
        return any(
            not (frozenset(r.links) & used) and place(k + 1, used | frozenset(r.links))
            for r in lanes[k].routes
        )

    return place(0, frozenset())


def check_families(
    catalog: Catalog, report: VerifyReport, realizable: Callable[[Family], bool]
) -> None:
    """Soundness: every family has group degrees g and ``realizable`` holds for it; failures go
    into ``report``."""
    g, groups = catalog.group_size, catalog.num_groups
    items = catalog.instances.instances
    for k, fam in enumerate(catalog.families):
        out = np.zeros(groups, dtype=int)
        inn = np.zeros(groups, dtype=int)
        for i, c in fam:
            out[items[i].src_group] += c
            inn[items[i].dst_group] += c
        if not (out == g).all() or not (inn == g).all():
            report.sound = False
            report.problems.append(
                f"family {k}: group degrees {out.tolist()}/{inn.tolist()}, expected {g}"
            )
        if not realizable(fam):
            report.sound = False
            report.problems.append(f"family {k}: no disjoint concrete routes")


def bruteforce(catalog: Catalog, model: PathModel) -> VerifyReport:
    """Check a flat catalog of a small one-node topology against every feasible channel."""
    if catalog.kind != "flat":
        raise CatalogError("brute force verifies flat catalogs")
    catalog.check_topology(model.topology, model)
    report = VerifyReport("bruteforce", sound=True, complete=True)
    check_families(catalog, report, lambda fam: _realizable(catalog, model, fam))
    n_groups = catalog.num_groups
    items = catalog.instances.instances
    # completeness
    fam_lanes: dict[bytes, list[dict]] = {}
    for k, fam in enumerate(catalog.families):
        key = catalog.shapes[catalog.family_shape[k]].astype(np.int64).tobytes()
        cells: dict[tuple[int, int], list[float]] = {}
        for i, c in fam:
            cells.setdefault((items[i].src_group, items[i].dst_group), []).extend(
                [items[i].rate] * c
            )
        fam_lanes.setdefault(key, []).append(
            {cell: sorted(r, reverse=True) for cell, r in cells.items()}
        )
    seen: set[bytes] = set()
    group = model.group_of
    for channel in feasible_channels(model):
        report.channels += 1
        shape = np.zeros((n_groups, n_groups), dtype=np.int64)
        cells: dict[tuple[int, int], list[float]] = {}
        for i, j, r in channel:
            a, d = int(group[i]), int(group[j])
            shape[a, d] += 1
            cells.setdefault((a, d), []).append(r.rate)
        key = shape.tobytes()
        seen.add(key)
        lanes = {cell: sorted(r, reverse=True) for cell, r in cells.items()}
        covered = any(
            all(
                all(x >= y for x, y in zip(f.get(cell, []), rates, strict=False))
                and len(f.get(cell, [])) == len(rates)
                for cell, rates in lanes.items()
            )
            for f in fam_lanes.get(key, [])
        )
        if not covered:
            report.complete = False
            if len(report.problems) < 20:
                report.problems.append(
                    f"channel {[(i, j, r.cls) for i, j, r in channel]} matches no family"
                )
    report.shapes_found = len(seen)
    known = {s.astype(np.int64).tobytes() for s in catalog.shapes}
    if seen != known:
        report.complete = False
        report.problems.append(
            f"shapes: brute force finds {len(seen)}, catalog has {len(known)}, "
            f"{len(seen - known)} missing, {len(known - seen)} unrealizable"
        )
    return report


VERIFIERS: dict[str, Callable[[Catalog, PathModel], VerifyReport]] = {"bruteforce": bruteforce}
