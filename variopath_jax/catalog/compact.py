"""The compact catalog: one witness family per shape and rate profile.

Algorithm 2 reads a family only through its lanes' group pairs and rates: endpoint binding scores
h_ijr = min(D_ij/τ, bw(r)), and volumes and utility use bw(r) (paper Eq. 7-10). Two families of
one shape whose lanes have the same rates per group pair (the same *rate profile*) therefore
yield the same activations, and one of them suffices. Algorithm 1 enumerates every family and
explodes on richly connected nodes (16 GPUs with NICs and switch rings: millions of families);
this search visits rate profiles instead.

It walks the group pairs (cells) in order and, per cell, the number of lanes of each rate; for
every prefix it keeps the Pareto-minimal set of concrete realisations (resources used, NIC pool
units used), since a realisation that uses a superset of another's resources can only complete
to a subset of its profiles. A prefix with no realisation is infeasible and pruned; one whose
remaining cells cannot fill every group's g slots too (SUFFIXOK). Every complete profile comes
with a witness family, a feasible multiset of instances.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from variopath_jax.catalog.build import Family
from variopath_jax.catalog.instances import InstanceSet

Profile = tuple[
    tuple[int, int, tuple[tuple[float, int], ...]], ...
]  # ((a, d, ((rate, lanes), ...)), ...)


@dataclass
class CompactTree:
    """Shapes, and per shape the distinct rate profiles with a witness family each."""

    shapes: list[tuple[int, ...]]
    profiles: list[list[Profile]]
    witnesses: list[list[Family]]
    visited: int
    seconds: float


@dataclass(frozen=True)
class _State:
    used: int
    pools: tuple[int, ...]
    chosen: tuple[tuple[int, int], ...]


def _dominates(y: _State, x: _State) -> bool:
    return (y.used & ~x.used) == 0 and all(p <= q for p, q in zip(y.pools, x.pools, strict=True))


def _minimal(states: list[_State]) -> list[_State]:
    states = sorted(states, key=lambda s: (s.used.bit_count(), sum(s.pools), s.chosen))
    kept: list[_State] = []
    for s in states:
        if not any(_dominates(k, s) for k in kept):
            kept.append(s)
    return kept


def enumerate_profiles(inst: InstanceSet, max_profiles: int = 5_000_000) -> CompactTree:
    """Every realizable (shape, rate profile) of ``inst`` with one witness family each."""
    from variopath_jax.catalog.instances import CatalogError

    start = time.perf_counter()
    n_groups = inst.num_groups
    g = inst.group_size
    free = inst.free_group
    capacity = tuple(p.capacity for p in inst.pools)
    items = inst.instances
    # cells in (a, d) order; per cell its rate classes, fastest first, and their instances
    cells: list[tuple[int, int, list[tuple[float, list[int]]]]] = []
    by_cell: dict[tuple[int, int], dict[float, list[int]]] = {}
    for it in items:
        by_cell.setdefault((it.src_group, it.dst_group), {}).setdefault(it.rate, []).append(
            it.index
        )
    for a, d in sorted(by_cell):
        classes = sorted(by_cell[(a, d)].items(), key=lambda kv: -kv[0])
        cells.append((a, d, classes))
    # most lanes each cell can hold, and the suffix sums per group (SUFFIXOK)
    cell_max = [
        min(g, sum(items[i].multiplicity for _, ids in cl for i in ids)) for _, _, cl in cells
    ]
    suf_out = [[0] * n_groups for _ in range(len(cells) + 1)]
    suf_in = [[0] * n_groups for _ in range(len(cells) + 1)]
    for c in range(len(cells) - 1, -1, -1):
        suf_out[c] = suf_out[c + 1].copy()
        suf_in[c] = suf_in[c + 1].copy()
        a, d, _ = cells[c]
        suf_out[c][a] += cell_max[c]
        suf_in[c][d] += cell_max[c]

    unbounded = 2 * g * n_groups  # O, the other nodes, takes any number of lanes
    out_left = [g] * n_groups
    in_left = [g] * n_groups
    if free is not None:
        out_left[free] = in_left[free] = unbounded
        for c in range(len(cells) + 1):
            suf_out[c][free] = suf_in[c][free] = unbounded
    shape = [0] * (n_groups * n_groups)
    profile: list[tuple[int, int, tuple[tuple[float, int], ...]]] = []
    buckets: dict[tuple[int, ...], list[tuple[Profile, Family]]] = {}
    order: list[tuple[int, ...]] = []
    counters = {"visited": 0, "profiles": 0}

    def selections(
        ids: list[int], count: int
    ) -> list[tuple[int, tuple[tuple[int, int], ...], tuple[int, ...]]]:
        """Ways to put ``count`` lanes on the instances ``ids`` (same cell and rate):
        (exclusive mask, chosen (instance, lanes), pool units) with disjoint masks."""
        out = []

        def rec(k: int, left: int, mask: int, chosen: tuple, pools: dict) -> None:
            if left == 0:
                out.append((mask, chosen, tuple(sorted(pools.items()))))
                return
            if k == len(ids):
                return
            rec(k + 1, left, mask, chosen, pools)
            it = items[ids[k]]
            if it.mask & mask:
                return
            for c in range(1, min(it.multiplicity, left) + 1):
                new_pools = dict(pools)
                for p in it.pools:
                    new_pools[p] = new_pools.get(p, 0) + c
                rec(k + 1, left - c, mask | it.mask, (*chosen, (ids[k], c)), new_pools)

        rec(0, count, 0, (), {})
        return out

    def extend(states: list[_State], choice: list[list[tuple]]) -> list[_State]:
        new = []
        for s in states:
            for combo in itertools.product(*choice):
                used, pools, chosen = s.used, list(s.pools), s.chosen
                ok = True
                for mask, picked, units in combo:
                    if mask & used:
                        ok = False
                        break
                    used |= mask
                    for p, u in units:
                        pools[p] += u
                        if pools[p] > capacity[p]:
                            ok = False
                    if not ok:
                        break
                    chosen += picked
                if ok:
                    new.append(_State(used, tuple(pools), chosen))
        return _minimal(new)

    def suffix_ok(c: int) -> bool:
        so, si = suf_out[c], suf_in[c]
        return all(out_left[a] <= so[a] and in_left[a] <= si[a] for a in range(n_groups))

    def explore(c: int, states: list[_State]) -> None:
        counters["visited"] += 1
        if c == len(cells):
            if any(out_left[a] or in_left[a] for a in range(n_groups) if a != free):
                return
            key = tuple(shape)
            if key not in buckets:
                buckets[key] = []
                order.append(key)
            buckets[key].append((tuple(p for p in profile if p[2]), states[0].chosen))
            counters["profiles"] += 1
            if counters["profiles"] > max_profiles:
                raise CatalogError(
                    f"more than {max_profiles} rate profiles"
                    + ("" if free is not None else ": use the factored catalog (kind='factored')")
                )
            return
        if not suffix_ok(c):
            return
        a, d, classes = cells[c]
        room = min(out_left[a], in_left[d])
        for counts in _count_vectors([len(ids) * g for _, ids in classes], room):
            total = sum(counts)
            if total:
                choice = []
                for (_rate, ids), k in zip(classes, counts, strict=True):
                    if k:
                        sel = selections(ids, k)
                        if not sel:
                            choice = None
                            break
                        choice.append(sel)
                if choice is None:
                    continue
                nxt = extend(states, choice)
                if not nxt:
                    continue
            else:
                nxt = states
            out_left[a] -= total
            in_left[d] -= total
            shape[a * n_groups + d] += total
            profile.append(
                (a, d, tuple((rate, k) for (rate, _), k in zip(classes, counts, strict=True) if k))
            )
            explore(c + 1, nxt)
            profile.pop()
            shape[a * n_groups + d] -= total
            in_left[d] += total
            out_left[a] += total

    explore(0, [_State(0, tuple(0 for _ in capacity), ())])
    shapes = order
    return CompactTree(
        shapes,
        [[p for p, _ in buckets[k]] for k in shapes],
        [[w for _, w in buckets[k]] for k in shapes],
        counters["visited"],
        time.perf_counter() - start,
    )


def lanes_of(profile: Profile) -> dict[tuple[int, int], list[float]]:
    """Per cell, the lane rates of a profile, fastest first."""
    return {
        (a, d): sorted((r for r, k in classes for _ in range(k)), reverse=True)
        for a, d, classes in profile
    }


def rate_dominates(p: Profile, q: Profile) -> bool:
    """p dominates q (same shape): per cell, p's lane rates paired fastest-first are no lower
    than q's, one strictly higher. Algorithm 2's binding credits, volumes and utility never
    decrease when a lane's rate grows (Eq. 7-10), so a dominated profile is never needed."""
    lp, lq = lanes_of(p), lanes_of(q)
    strict = False
    for cell, rates in lq.items():
        for x, y in zip(lp.get(cell, []), rates, strict=False):
            if x < y:
                return False
            strict = strict or x > y
    return strict


def prune_dominated_profiles(profiles: list[Profile]) -> list[int]:
    """Indices of the profiles no other profile of the same shape dominates (``rate_dominates``,
    vectorised: profiles of one shape have the same lanes per cell, so each is a vector of lane
    rates in a common slot order)."""
    if len(profiles) < 2:
        return list(range(len(profiles)))
    slots = [
        [r for cell in sorted(lanes) for r in lanes[cell]] for lanes in map(lanes_of, profiles)
    ]
    v = np.array(slots, dtype=np.float64)
    keep = []
    for k in range(len(v)):
        ge = (v >= v[k]).all(axis=1)
        gt = (v > v[k]).any(axis=1)
        if not (ge & gt).any():
            keep.append(k)
    return keep


def _count_vectors(limits: list[int], room: int):
    """Vectors n with 0 <= n_i <= limits_i and sum(n) <= room, in a fixed order (zero first)."""
    if not limits:
        yield ()
        return
    for first in range(min(limits[0], room) + 1):
        for rest in _count_vectors(limits[1:], room - first):
            yield (first, *rest)
