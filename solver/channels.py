"""Concrete channels of the paper's execution model (§3), found without the catalog.

A channel is a derangement π of the ranks plus one candidate path per lane i → π(i), the paths'
footprints in U pairwise disjoint (paper Eq. 1); a *partial* channel leaves some ranks idle, as
an activation may (§3, Eq. 2), and need not extend to a full one. What an activation of a
channel can do depends only on its lane rates, so a channel is kept here as ``(pairs, rates)``.
Two sources:

- :func:`enumerate_channels`: every maximal partial channel of a small one-node topology (the
  maximal cliques of the lanes' compatibility graph, with PRUNEPATHS' surviving routes, which
  lose nothing: a pruned route has a superset footprint and no higher rate), then per set of
  lanes only the rate vectors no other one dominates. Every partial channel is a subset of one:
  this is the complete channel space the MILP oracle searches at 8 GPUs.
- :func:`price_channel`: the partial channel maximising Σ w_ij·bw over all of them, by OR-Tools
  CP-SAT (the pricing problem of column generation, for topologies too large to enumerate).

:func:`candidate_lanes` and :func:`add_channel_rules` state Eq. 1 for one slot of a CP-SAT model
(the epoch model, :mod:`solver.epoch`, and the K-slot model, :mod:`solver.kslot`).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np
from ortools.sat.python import cp_model

from variopath_jax.errors import VarioPathError
from variopath_jax.sim.network import NetworkModel, through_nic
from variopath_jax.topology import PathModel, Route


class SolverError(VarioPathError):
    """An optimisation problem is malformed, infeasible or too large."""


@dataclass(frozen=True)
class Channel:
    """One concrete channel: lane k moves ``pairs[k] = (i, j)`` along the directed links
    ``paths[k]`` (endpoint links included) at ``rates[k]`` GB/s."""

    pairs: tuple[tuple[int, int], ...]
    paths: tuple[tuple[int, ...], ...]
    rates: tuple[float, ...]
    classes: tuple[str, ...]

    @classmethod
    def from_routes(cls, model: PathModel, lanes: list[tuple[int, int, Route]]) -> Channel:
        lanes = sorted(lanes, key=lambda lane: lane[:2])
        return cls(
            tuple((i, j) for i, j, _ in lanes),
            tuple(model.path(i, j, r).links for i, j, r in lanes),
            tuple(r.rate for *_, r in lanes),
            tuple(r.cls for *_, r in lanes),
        )


def _options(model: PathModel) -> dict[tuple[int, int], tuple[Route, ...]]:
    groups = len(model.groups)
    return {(a, d): model.routes(a, d) for a in range(groups) for d in range(groups)}


_ENUMERATED: dict[tuple[str, str, int], list[Channel]] = {}  # by topology, paths and limit


def enumerate_channels(model: PathModel, limit: int = 1_000_000) -> list[Channel]:
    """Every maximal partial channel of a one-node topology with at most 8 GPUs: the maximal
    cliques of the lanes' compatibility graph (networkx's Bron–Kerbosch with pivoting; two
    lanes are compatible when their senders, receivers and footprints differ), dominated rate
    vectors of the same lanes dropped. Every partial channel is a subset of one of them, and a
    lane left idle costs nothing, so no schedule needs another; full channels (derangements)
    alone would not do: a partial channel need not extend to one (on tiny4, 0→3, 1→0, 3→1
    leaves rank 2 only itself). Kept per topology and path model (157,433 channels and 4 s on
    r5080-bf3): a study enumerates them once."""
    key = (model.topology.fingerprint, model.identity(), limit)
    if key not in _ENUMERATED:
        _ENUMERATED.clear()  # one topology at a time: a study's instances share it
        _ENUMERATED[key] = _maximal_channels(model, limit)
    return list(_ENUMERATED[key])


def _maximal_channels(model: PathModel, limit: int) -> list[Channel]:
    topo = model.topology
    n = topo.num_ranks
    if topo.nodes != 1 or n > 8:
        raise SolverError("channels are enumerated for one node of at most 8 GPUs; use pricing")
    group = [int(x) for x in model.group_of]
    options = _options(model)
    lanes = [
        (i, j, route, model.path(i, j, route).links)
        for i in range(n)
        for j in range(n)
        if i != j
        for route in options[(group[i], group[j])]
    ]
    compatible = nx.Graph()
    compatible.add_nodes_from(range(len(lanes)))
    compatible.add_edges_from(
        (a, b)
        for a, (i, j, route, _) in enumerate(lanes)
        for b in range(a + 1, len(lanes))
        if i != lanes[b][0] and j != lanes[b][1] and route.footprint.isdisjoint(lanes[b][2].links)
    )
    by_pairs: dict[tuple[tuple[int, int], ...], list[tuple[int, ...]]] = {}
    for count, clique in enumerate(nx.find_cliques(compatible), 1):
        if count > limit:
            raise SolverError(f"more than {limit} channels: too many to enumerate")
        clique.sort(key=lambda a: lanes[a][:2])
        by_pairs.setdefault(tuple(lanes[a][:2] for a in clique), []).append(tuple(clique))
    channels = []
    for pairs, variants in by_pairs.items():
        rates = np.array([[lanes[a][2].rate for a in v] for v in variants])
        for k in _pareto(rates) if len(variants) > 1 else [0]:
            chosen = [lanes[a] for a in variants[k]]
            channels.append(
                Channel(
                    pairs,
                    tuple(links for *_, links in chosen),
                    tuple(route.rate for _, _, route, _ in chosen),
                    tuple(route.cls for _, _, route, _ in chosen),
                )
            )
    return channels


def _pareto(rates: np.ndarray) -> list[int]:
    """Rows of ``rates`` no other row dominates (≥ everywhere, > somewhere); first of equals."""
    keep = []
    for k in range(len(rates)):
        ge = (rates >= rates[k]).all(axis=1)
        gt = (rates > rates[k]).any(axis=1)
        dominated = (ge & gt).any() or any((rates[m] == rates[k]).all() for m in keep)
        if not dominated:
            keep.append(k)
    return keep


def price_channel(
    model: PathModel, weights: np.ndarray, time_limit_s: float = 10.0, workers: int = 1
) -> tuple[float, Channel | None, bool]:
    """The partial channel maximising Σ_lanes weights[i, j]·bw(p) (CP-SAT, weights scaled to
    integers; a rank may stay idle: a partial channel need not extend to a full one).

    Returns ``(value, channel, proven)``: the best value found, its channel (None when no
    channel exists) and whether CP-SAT proved it optimal within the time limit.
    """
    n = model.topology.num_ranks
    group = [int(x) for x in model.group_of]
    options = _options(model)
    scale = 1e6 / max(float(np.max(weights)) * 100.0, 1e-30)  # ~1e6 resolution on the best lane
    sat = cp_model.CpModel()
    lanes: list[tuple[int, int, Route, cp_model.IntVar]] = []
    for i in range(n):
        for j in range(n):
            if i != j:
                for k, route in enumerate(options[(group[i], group[j])]):
                    lanes.append((i, j, route, sat.new_bool_var(f"z{i}_{j}_{k}")))
    for i in range(n):
        sat.add_at_most_one(z for s, _, _, z in lanes if s == i)
        sat.add_at_most_one(z for _, d, _, z in lanes if d == i)
    by_link: dict[int, list[cp_model.IntVar]] = {}
    for _, _, route, z in lanes:
        for link in route.links:
            by_link.setdefault(link, []).append(z)
    for zs in by_link.values():
        if len(zs) > 1:
            sat.add_at_most_one(zs)
    sat.maximize(sum(round(weights[i, j] * r.rate * scale) * z for i, j, r, z in lanes))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    status = solver.solve(sat)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return 0.0, None, status == cp_model.INFEASIBLE
    picked = [(i, j, r) for i, j, r, z in lanes if solver.value(z)]
    channel = Channel.from_routes(model, picked)
    value = float(sum(weights[i, j] * r.rate for i, j, r in picked))
    return value, channel, status == cp_model.OPTIMAL


@dataclass(frozen=True)
class Lane:
    """A candidate lane of a channel: pair ``(i, j)`` on ``route``, ``path`` its directed links
    (endpoint links included), ``alpha_s`` what the network model adds to its data time when it
    runs alone from its sender: the issue overhead o plus the latency L of its kind of path."""

    i: int
    j: int
    route: Route
    path: tuple[int, ...]
    alpha_s: float


def candidate_lanes(model: PathModel, demand: np.ndarray, network: NetworkModel) -> list[Lane]:
    """Every (pair, route) a channel may use for the pairs with demand (PRUNEPATHS' routes)."""
    topo = model.topology
    n = topo.num_ranks
    group = [int(x) for x in model.group_of]
    options = _options(model)
    nic = through_nic(topo)
    lanes = []
    for i in range(n):
        for j in range(n):
            if i == j or demand[i, j] <= 0:
                continue
            for r in options[(group[i], group[j])]:
                path = model.path(i, j, r).links
                latency = network.latency_net_s if nic[list(path)].any() else network.latency_pcie_s
                lanes.append(Lane(i, j, r, path, network.issue_s + latency))
    return lanes


def add_channel_rules(sat: cp_model.CpModel, lanes: list[Lane], z: list, n: int) -> None:
    """Paper Eq. 1 for one slot: the chosen lanes (booleans ``z``) form a partial permutation
    whose footprints in U are pairwise disjoint."""
    for rank in range(n):
        out = [v for lane, v in zip(lanes, z, strict=True) if lane.i == rank]
        inn = [v for lane, v in zip(lanes, z, strict=True) if lane.j == rank]
        if len(out) > 1:
            sat.add_at_most_one(out)
        if len(inn) > 1:
            sat.add_at_most_one(inn)
    by_link: dict[int, list] = {}
    for lane, v in zip(lanes, z, strict=True):
        for link in lane.route.links:
            by_link.setdefault(link, []).append(v)
    for vs in by_link.values():
        if len(vs) > 1:
            sat.add_at_most_one(vs)
