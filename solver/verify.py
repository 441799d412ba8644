"""Catalog verification by CP-SAT (paper §4.1's soundness and completeness claims).

Independent of how the catalog was built, from the path model alone:

- *completeness*: every admissible shape M (G×G, rows and columns summing to g, no intra-group
  lanes when g = 1) that the catalog lacks has no resource-disjoint family. The model: an integer
  count n_r of lanes per candidate route r (every route, PRUNEPATHS not applied), Σ_{r∈R_ad} n_r
  = M_ad, and Σ_{r∋ℓ} n_r ≤ 1 for every resource ℓ in U. CP-SAT proving it infeasible proves the
  shape unrealizable; a feasible answer is a missing shape.
- *soundness*: every family of the catalog has concrete routes (one per lane, NIC pools resolved)
  with pairwise-disjoint footprints, and its group degrees are g.

Registered as ``cpsat`` in :data:`variopath_jax.catalog.VERIFIERS` (``variopath catalog verify
--verifier cpsat``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from ortools.sat.python import cp_model

from variopath_jax.catalog import VERIFIERS, Catalog, CatalogError, VerifyReport
from variopath_jax.catalog.verify import check_families
from variopath_jax.topology import PathModel, Route


def admissible_shapes(groups: int, g: int) -> Iterator[np.ndarray]:
    """Every G×G non-negative integer matrix with all row and column sums g (zero diagonal when
    g = 1: a lone GPU has no peer in its own group)."""
    shape = np.zeros((groups, groups), dtype=np.int64)
    col_left = np.full(groups, g)

    def cell(a: int, d: int, row_left: int) -> Iterator[np.ndarray]:
        if d == groups:
            if row_left == 0:
                yield from (cell(a + 1, 0, g) if a + 1 < groups else iter([shape.copy()]))
            return
        top = min(row_left, col_left[d])
        if a == d and g == 1:
            top = 0
        for count in range(top, -1, -1):
            shape[a, d] = count
            col_left[d] -= count
            yield from cell(a, d + 1, row_left - count)
            col_left[d] += count
        shape[a, d] = 0

    yield from cell(0, 0, g)


def _solve(model: cp_model.CpModel, seconds: float) -> int:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 1
    return solver.solve(model)


def shape_realizable(routes: dict[tuple[int, int], list[Route]], shape: np.ndarray) -> int:
    """CP-SAT status of "some resource-disjoint choice of routes realizes ``shape``"."""
    sat = cp_model.CpModel()
    by_link: dict[int, list] = {}
    for (a, d), options in routes.items():
        want = int(shape[a, d])
        counts = []
        for r in options:
            n_r = sat.new_int_var(0, want if not r.links else min(want, 1), "")
            counts.append(n_r)
            for link in r.links:
                by_link.setdefault(link, []).append(n_r)
        sat.add(sum(counts) == want)
    for terms in by_link.values():
        sat.add(sum(terms) <= 1)
    return _solve(sat, 30.0)


def family_realizable(catalog: Catalog, family) -> int:
    """CP-SAT status of "the family's lanes have concrete routes with disjoint footprints"."""
    items = catalog.instances.instances
    sat = cp_model.CpModel()
    by_link: dict[int, list] = {}
    for index, lanes in family:
        for _ in range(lanes):
            choice = [sat.new_bool_var("") for _ in items[index].routes]
            sat.add_exactly_one(choice)
            for z, r in zip(choice, items[index].routes, strict=True):
                for link in r.links:
                    by_link.setdefault(link, []).append(z)
    for terms in by_link.values():
        sat.add_at_most_one(terms)
    return _solve(sat, 30.0)


def verify_catalog(catalog: Catalog, model: PathModel) -> VerifyReport:
    """Soundness and shape completeness of a flat one-node catalog, by CP-SAT (see module)."""
    if catalog.kind != "flat" or model.topology.nodes != 1:
        raise CatalogError("the CP-SAT verifier checks flat catalogs of one node")
    catalog.check_topology(model.topology, model)
    report = VerifyReport("cpsat", sound=True, complete=True)
    check_families(
        catalog, report, lambda family: family_realizable(catalog, family) == cp_model.OPTIMAL
    )
    g, groups = catalog.group_size, catalog.num_groups
    routes = {(a, d): model.unpruned_routes(a, d) for a in range(groups) for d in range(groups)}
    known = {s.astype(np.int64).tobytes() for s in catalog.shapes}
    for shape in admissible_shapes(groups, g):
        report.shapes_checked += 1
        if shape.tobytes() in known:
            report.shapes_found += 1
            continue
        status = shape_realizable(routes, shape)
        if status == cp_model.INFEASIBLE:
            continue
        report.complete = False
        verdict = "is realizable" if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else "unproven"
        report.problems.append(f"shape {shape.tolist()} missing from the catalog {verdict}")
    return report


VERIFIERS["cpsat"] = verify_catalog
