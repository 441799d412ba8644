"""Channel-guided demand decomposition, the readable Python reference (paper §4.2, Algorithm 2).

Each iteration aggregates the residual demand by rank-group pair (Eq. 5), selects the shape of
highest bottleneck pressure s(M) = Σ D̂_ad M_ad (Eq. 6), binds every family of that shape to
endpoints with the multi-start Alternating Algorithm (the first start optimistic: every lane's
destination chosen for its best credit over any source of its group; the others random) on the
useful-rate credits
h_ijr = min(D_ij/τ, bw(r)) (Eq. 7-8), gives each lane x = min(τ·bw, D_ij) bytes (Eq. 9), and
appends the activation of highest utility Σx / (λ + max x/bw) (Eq. 10), until the residual is zero.

Factored catalogs (multi-node) do shape selection at node level, the equivalent of Eq. 6 for
node-local patterns: a lane leaving node k from group a is priced at half the largest off-node
pressure of a, an arriving lane at half the largest off-node pressure into its group; each node
takes its best pattern under these prices; leaving and arriving lanes are then matched across
nodes greedily by pressure, and a node whose leaving or arriving lanes find no partner re-selects
among patterns with no more of them, until every cross lane is matched. The candidates are the
aligned combinations of the chosen patterns' families (family c of every node).

Everything that decides the schedule is exact and ordered (integer credits and pressures, the
lexicographically smallest optimal assignment, SplitMix64 for starts, first index on ties), so
the C++ core reproduces it byte for byte.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from variopath_jax.catalog import Catalog, CatalogError, global_links
from variopath_jax.planner.determinism import (
    FORBIDDEN,
    SplitMix64,
    canonical_assignment,
    credit_units,
)
from variopath_jax.schedule import Schedule, Step, Transfer
from variopath_jax.topology import PathModel
from variopath_jax.topology.paths import staged_class
from variopath_jax.workloads import validate_demand

GRANULARITIES = ("auto", "fixed")
LEAVING_PRICES = ("max", "sum")


@dataclass(frozen=True)
class PlannerParams:
    """Knobs of Algorithm 2 (paper §4.2, §5 "Global execution granularity"); the C++ core's
    ``PlanParams`` has the same fields (planner/native.py crosses them).

    ``k_target``: the target number of rounds K (τ = T_est / K); None means N. The paper sets
    it between N and 3N. With ``granularity="auto"`` the planner never plans more rounds than keep
    the per-activation overhead under a tenth of the estimated time (K ≤ T_est / (10 λ)), so
    small payloads get fewer, coarser activations. ``starts`` and ``sweeps`` are N_start and I_AA.
    ``max_candidates`` bounds the family combinations a factored catalog tries per activation;
    ``leaving_price`` prices a lane that leaves or enters a node by the largest (``"max"``) or
    the total (``"sum"``) off-node pressure of its group.
    """

    lambda_s: float = 5e-6
    k_target: int | None = None
    starts: int = 4
    sweeps: int = 3
    seed: int = 0
    granularity: str = "auto"
    max_candidates: int = 8
    leaving_price: str = "max"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lambda_s) and self.lambda_s >= 0):
            raise ValueError(f"lambda_s must be finite and >= 0, got {self.lambda_s}")
        if self.k_target is not None and self.k_target < 1:
            raise ValueError(f"k_target must be >= 1 or None (N rounds), got {self.k_target}")
        for name in ("starts", "sweeps", "max_candidates"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        if self.granularity not in GRANULARITIES:
            raise ValueError(
                f"granularity must be one of {GRANULARITIES}, got {self.granularity!r}"
            )
        if self.leaving_price not in LEAVING_PRICES:
            raise ValueError(
                f"leaving_price must be one of {LEAVING_PRICES}, got {self.leaving_price!r}"
            )


class LaneKind(IntEnum):
    """What a lane of a candidate channel is; the same values as the C++ core's ``LaneKind``."""

    FLAT = 0  # a flat catalog's instance: parts (inst,)
    INTRA = 1  # a factored catalog's node-local instance: parts (node, inst)
    NET = 2  # a leaving half joined to an arriving half: parts (node_s, out_inst, node_d, in_inst)
    ROUTE = 3  # the fallback, the nearest route of a group pair: parts (route,)


@dataclass
class GLane:
    """A lane of a candidate channel at group level."""

    src_group: int
    dst_group: int
    rate: float
    kind: LaneKind
    parts: tuple


@dataclass
class PlanStats:
    activations: int = 0
    seconds: float = 0.0
    tau_s: float = 0.0
    k: int = 0
    fallbacks: int = 0
    candidates: int = 0
    extra: dict = field(default_factory=dict)


def endpoint_time_s(demand: np.ndarray, model: PathModel) -> float:
    """The simple bound: the largest row or column sum over its GPU's endpoint link rate."""
    g = model.graph
    best = 0.0
    for i in range(len(demand)):
        up, down = model.endpoint_links(i)
        best = max(
            best,
            demand[i].sum() / (g.links[up].gbs * 1e9),
            demand[:, i].sum() / (g.links[down].gbs * 1e9),
        )
    return best


def quantum(demand: np.ndarray, model: PathModel, params: PlannerParams) -> tuple[float, int]:
    """τ and the number of rounds it aims at."""
    n = len(demand)
    t_est = endpoint_time_s(demand, model)
    k = params.k_target or n
    if params.granularity == "auto" and params.lambda_s > 0:
        k = min(k, max(1, int(t_est / (10 * params.lambda_s))))
    return (t_est / k if t_est > 0 else 1.0), k


class ReferencePlanner:
    """Algorithm 2 over a flat or factored catalog (pure Python, numpy and scipy)."""

    def __init__(self, catalog: Catalog, model: PathModel, params: PlannerParams) -> None:
        catalog.check_topology(model.topology, model)
        self.catalog = catalog
        self.model = model
        self.params = params
        self.topo = model.topology
        self.groups = [list(g) for g in model.groups]
        self.n_groups = len(self.groups)
        self.g = catalog.group_size
        self.items = catalog.instances.instances
        self.shapes = catalog.shapes.astype(np.int64).reshape(len(catalog.shapes), -1)
        self.families_by_shape: dict[int, list[int]] = {}
        for k, s in enumerate(catalog.family_shape):
            self.families_by_shape.setdefault(int(s), []).append(k)
        if catalog.kind == "factored":
            self.per_node = catalog.num_groups - 1
            self.node_of_group = [a // self.per_node for a in range(self.n_groups)]

    # ----- Algorithm 2 ------------------------------------------------------------------------
    def plan(self, demand: np.ndarray) -> Schedule:
        rem = validate_demand(demand, self.topo.num_ranks).copy()
        start = time.perf_counter()  # the planner's own time, after the input check
        params = self.params
        n = len(rem)
        tau, k = quantum(rem, self.model, params)
        rng = SplitMix64(params.seed)
        stats = PlanStats(tau_s=tau, k=k)
        steps: list[Step] = []
        while rem.any():
            dhat = self._aggregate(rem)
            best = None
            for channel in self._candidates(dhat):
                stats.candidates += 1
                binding = self._multistart_aa(channel, rem, tau, rng)
                volumes, utility = self._evaluate(channel, binding, rem, tau)
                if best is None or utility > best[0]:
                    best = (utility, channel, binding, volumes)
            if best is None or best[0] <= 0:
                # The binding found no lane with demand (a local optimum of the Alternating
                # Algorithm): serve the largest residual entry alone on its nearest path.
                stats.fallbacks += 1
                channel, binding = self._single_lane(rem)
                volumes, utility = self._evaluate(channel, binding, rem, tau)
                best = (utility, channel, binding, volumes)
            _, channel, binding, volumes = best
            steps.append(self._activation(channel, binding, volumes))
            for (i, j), x in zip(binding, volumes, strict=True):
                if x:
                    rem[i, j] -= x
        stats.activations = len(steps)
        stats.seconds = time.perf_counter() - start
        meta = {
            "scheduler": "variopath",
            "tau_s": tau,
            "k": k,
            "activations": len(steps),
            "fallbacks": stats.fallbacks,
            "candidates": stats.candidates,
            "catalog": self.catalog.kind,
        }
        self.stats = stats
        return Schedule(n, steps, self.topo.fingerprint, params.lambda_s, "channel", meta)

    def _aggregate(self, rem: np.ndarray) -> np.ndarray:
        """D̂_ad = Σ_{i∈V_a, j∈V_d} D_rem[i, j] (Eq. 5)."""
        group_of = self.model.group_of
        dhat = np.zeros((self.n_groups, self.n_groups), dtype=np.int64)
        np.add.at(dhat, (group_of[:, None], group_of[None, :]), rem)
        return dhat

    def _single_lane(self, rem: np.ndarray) -> tuple[list[GLane], list[tuple[int, int]]]:
        """A one-lane channel for the largest residual entry (first in row-major order)."""
        i, j = divmod(int(np.argmax(rem)), rem.shape[1])
        a, d = int(self.model.group_of[i]), int(self.model.group_of[j])
        route = self.model.nearest(a, d)
        return [GLane(a, d, route.rate, LaneKind.ROUTE, (route,))], [(i, j)]

    # ----- candidates ------------------------------------------------------------------------
    def _candidates(self, dhat: np.ndarray) -> list[list[GLane]]:
        if self.catalog.kind == "flat":
            return self._flat_candidates(dhat)
        return self._factored_candidates(dhat)

    def _flat_candidates(self, dhat: np.ndarray) -> list[list[GLane]]:
        shape = int(np.argmax(self.shapes @ dhat.reshape(-1)))
        out = []
        for f in self.families_by_shape[shape]:
            lanes = []
            for inst, count in self.catalog.families[f]:
                it = self.items[inst]
                lanes += [
                    GLane(it.src_group, it.dst_group, it.rate, LaneKind.FLAT, (inst,))
                    for _ in range(count)
                ]
            out.append(lanes)
        return out

    def _factored_candidates(self, dhat: np.ndarray) -> list[list[GLane]]:
        """Node-level shape selection and the aligned combinations of the chosen patterns'
        families (family c, cyclically, of every node's pattern)."""
        price_out, price_in = self._prices(dhat)
        choice, pairs = self._select_patterns(dhat, price_out, price_in)
        fams = [self.families_by_shape[s] for s in choice]
        count = min(max(len(f) for f in fams), self.params.max_candidates)
        return [self._combine([f[c % len(f)] for f in fams], pairs) for c in range(count)]

    def _prices(self, dhat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The price of a leaving (arriving) lane of each group: the largest, or the total,
        off-node pressure out of (into) it."""
        node_of = np.array(self.node_of_group)
        cross = np.where(node_of[:, None] != node_of[None, :], dhat, 0)
        if self.params.leaving_price == "sum":
            return cross.sum(axis=1), cross.sum(axis=0)
        return cross.max(axis=1), cross.max(axis=0)

    def _select_patterns(
        self, dhat: np.ndarray, price_out: np.ndarray, price_in: np.ndarray
    ) -> tuple[list[int], list[tuple[int, int, int]]]:
        """Each node's best pattern under the prices; nodes whose leaving or arriving lanes find
        no partner across nodes re-select among patterns with no more of them, until every cross
        lane is matched. Returns the pattern of each node and the matched pairs."""
        gl, nodes = self.per_node, self.topo.nodes
        node_of = np.array(self.node_of_group)
        pats = self.shapes.reshape(len(self.shapes), gl + 1, gl + 1)
        scores, choice = [], []
        for k in range(nodes):
            blk = slice(k * gl, (k + 1) * gl)
            w = np.zeros((gl + 1, gl + 1), dtype=np.int64)
            w[:gl, :gl] = 2 * dhat[blk, blk]
            w[:gl, gl] = price_out[blk]
            w[gl, :gl] = price_in[blk]
            scores.append(self.shapes @ w.reshape(-1))
            choice.append(int(np.argmax(scores[k])))
        limit_out = np.full((nodes, gl), self.g)
        limit_in = np.full((nodes, gl), self.g)
        for _ in range(nodes * gl * self.g + 1):
            outs = np.concatenate([pats[s, :gl, gl] for s in choice])
            ins = np.concatenate([pats[s, gl, :gl] for s in choice])
            pairs, left_out, left_in = _match(dhat, outs, ins, node_of)
            if not left_out.any() and not left_in.any():
                break
            for k in range(nodes):
                blk = slice(k * gl, (k + 1) * gl)
                if left_out[blk].any() or left_in[blk].any():
                    limit_out[k] = np.minimum(limit_out[k], outs[blk] - left_out[blk])
                    limit_in[k] = np.minimum(limit_in[k], ins[blk] - left_in[blk])
                    ok = (pats[:, :gl, gl] <= limit_out[k]).all(axis=1) & (
                        pats[:, gl, :gl] <= limit_in[k]
                    ).all(axis=1)
                    choice[k] = int(np.argmax(np.where(ok, scores[k], np.iinfo(np.int64).min)))
        return choice, pairs

    def _combine(self, node_families: list[int], pairs: list[tuple[int, int, int]]) -> list[GLane]:
        gl = self.per_node
        lanes: list[GLane] = []
        outs: dict[int, list[tuple[float, int]]] = {}
        ins: dict[int, list[tuple[float, int]]] = {}
        for k, f in enumerate(node_families):
            for inst, count in self.catalog.families[f]:
                it = self.items[inst]
                for _ in range(count):
                    if it.dst_group == gl:
                        outs.setdefault(k * gl + it.src_group, []).append((-it.rate, inst))
                    elif it.src_group == gl:
                        ins.setdefault(k * gl + it.dst_group, []).append((-it.rate, inst))
                    else:
                        lanes.append(
                            GLane(
                                k * gl + it.src_group,
                                k * gl + it.dst_group,
                                it.rate,
                                LaneKind.INTRA,
                                (k, inst),
                            )
                        )
        for v in (*outs.values(), *ins.values()):
            v.sort()
        for a, d, m in pairs:
            for _ in range(m):
                (ro, oi), (ri, ii) = outs[a].pop(0), ins[d].pop(0)
                rate = min(-ro, -ri)
                lanes.append(GLane(a, d, rate, LaneKind.NET, (a // gl, oi, d // gl, ii)))
        return lanes

    # ----- endpoint binding (multi-start Alternating Algorithm) ---------------------------------
    def _multistart_aa(
        self, lanes: list[GLane], rem: np.ndarray, tau: float, rng: SplitMix64
    ) -> list[tuple[int, int]]:
        out_lanes: dict[int, list[int]] = {}
        in_lanes: dict[int, list[int]] = {}
        for k, lane in enumerate(lanes):
            out_lanes.setdefault(lane.src_group, []).append(k)
            in_lanes.setdefault(lane.dst_group, []).append(k)
        groups = self.groups

        def credit(k: int, i: int, j: int) -> int:
            if i == j:
                return FORBIDDEN
            return credit_units(min(rem[i, j] / (tau * 1e9), lanes[k].rate))

        best_f, best = None, None
        for start in range(self.params.starts):
            dst = [0] * len(lanes)
            src = [0] * len(lanes)
            for d in sorted(in_lanes):
                ks = in_lanes[d]
                if start == 0:  # optimistic start: each lane's best credit over any of its sources
                    w = np.array(
                        [
                            [
                                max(credit(k, i, j) for i in groups[lanes[k].src_group])
                                for j in groups[d]
                            ]
                            for k in ks
                        ],
                        dtype=np.int64,
                    )
                    perm = canonical_assignment(w)
                else:
                    perm = rng.permutation(len(ks))
                for k, p in zip(ks, perm, strict=True):
                    dst[k] = groups[d][p]
            score = None
            for _ in range(self.params.sweeps):
                for a in sorted(out_lanes):
                    ks = out_lanes[a]
                    w = np.array(
                        [[credit(k, i, dst[k]) for i in groups[a]] for k in ks], dtype=np.int64
                    )
                    for k, col in zip(ks, canonical_assignment(w), strict=True):
                        src[k] = groups[a][col]
                for d in sorted(in_lanes):
                    ks = in_lanes[d]
                    w = np.array(
                        [[credit(k, src[k], j) for j in groups[d]] for k in ks], dtype=np.int64
                    )
                    for k, col in zip(ks, canonical_assignment(w), strict=True):
                        dst[k] = groups[d][col]
                f = sum(credit(k, src[k], dst[k]) for k in range(len(lanes)))
                if score is not None and f <= score:
                    break
                score = f
            if best_f is None or score > best_f:
                best_f, best = score, list(zip(src, dst, strict=True))
        return best

    def _evaluate(
        self, lanes: list[GLane], binding, rem: np.ndarray, tau: float
    ) -> tuple[list[int], float]:
        """x = min(τ·bw, D_rem) per lane (at least one byte of capacity); U = Σx / (λ + max x/bw)."""
        volumes = []
        slowest = 0.0
        for lane, (i, j) in zip(lanes, binding, strict=True):
            cap = max(1, math.floor(tau * lane.rate * 1e9))
            x = min(cap, int(rem[i, j]))
            volumes.append(x)
            if x:
                slowest = max(slowest, x / (lane.rate * 1e9))
        total = sum(volumes)
        return volumes, (total / (self.params.lambda_s + slowest) if total else 0.0)

    # ----- activation to transfers -----------------------------------------------------------
    def _activation(self, lanes: list[GLane], binding, volumes) -> Step:
        live = [k for k, x in enumerate(volumes) if x]
        options = [self._route_options(lanes[k]) for k in live]
        chosen = _disjoint(options)
        transfers = []
        for k, (links, rate, cls, via) in zip(live, chosen, strict=True):
            i, j = binding[k]
            if via:
                up, _ = self.model.endpoint_links(i)
                _, down = self.model.endpoint_links(j)
                links = (up, *links, down)
            staged = staged_class(self.topo, cls)
            transfers.append(Transfer(i, j, links, volumes[k], (i, j), rate, cls, staged))
        return Step(tuple(transfers))

    def _route_options(self, lane: GLane) -> list[tuple[tuple[int, ...], float, str, bool]]:
        """The concrete routes a lane may take: (links, rate, class, via endpoints)."""
        if lane.kind == LaneKind.ROUTE:
            (r,) = lane.parts
            return [(r.links, r.rate, r.cls, r.via_endpoints)]
        if lane.kind == LaneKind.FLAT:
            it = self.items[lane.parts[0]]
            return [(r.links, it.rate, it.cls, r.via_endpoints) for r in it.routes]
        if lane.kind == LaneKind.INTRA:
            node, inst = lane.parts
            it = self.items[inst]
            return [
                (
                    global_links(self.catalog, r.links, node, self.topo),
                    it.rate,
                    it.cls,
                    r.via_endpoints,
                )
                for r in it.routes
            ]
        ns, oi, nd, ii = lane.parts
        out_routes = [
            global_links(self.catalog, r.links, ns, self.topo) for r in self.items[oi].routes
        ]
        in_routes = [
            global_links(self.catalog, r.links, nd, self.topo) for r in self.items[ii].routes
        ]
        return [(o + i, lane.rate, "NET", True) for o in out_routes for i in in_routes]


def _match(dhat: np.ndarray, outs: np.ndarray, ins: np.ndarray, node_of: np.ndarray):
    """Greedy cross-node matching of leaving to arriving lanes by pressure: pairs (a, d, lanes)
    in order of decreasing D̂_ad (then a, then d), and the lanes left without a partner."""
    left_out, left_in = outs.astype(np.int64).copy(), ins.astype(np.int64).copy()
    cand = [
        (-int(dhat[a, d]), a, d)
        for a in np.flatnonzero(left_out)
        for d in np.flatnonzero(left_in)
        if node_of[a] != node_of[d]
    ]
    pairs = []
    for _, a, d in sorted(cand):
        m = int(min(left_out[a], left_in[d]))
        if m:
            pairs.append((int(a), int(d), m))
            left_out[a] -= m
            left_in[d] -= m
    return pairs, left_out, left_in


def _disjoint(options: list[list[tuple]]) -> list[tuple]:
    """One option per lane with pairwise-disjoint link sets, first in order (backtracking)."""
    chosen: list[tuple] = []
    used: set[int] = set()

    def place(k: int) -> bool:
        if k == len(options):
            return True
        for opt in options[k]:
            links = set(opt[0])
            if links & used:
                continue
            used.update(links)
            chosen.append(opt)
            if place(k + 1):
                return True
            chosen.pop()
            used.difference_update(links)
        return False

    if not place(0):
        raise CatalogError(
            "no disjoint concrete routes for a catalog family: the catalog is inconsistent"
        )
    return chosen
