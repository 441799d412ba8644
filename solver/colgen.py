"""A lower bound on every channel schedule by column generation on the configuration LP, with a
Lagrangian bound at every iteration (issue 31; the configuration LP of Gilmore & Gomory,
Operations Research 9(6), 1961; the Lagrangian bound of column generation: Lübbecke &
Desrosiers, "Selected Topics in Column Generation", Operations Research 53(6), 2005, §2.1).

A column is one *activation* a of the paper's execution model (§3, Eq. 2): a partial channel
(lanes on distinct senders and receivers, footprints in U disjoint), a fraction f_ap ∈ [0, 1] of
each lane's pair demand D_p, and its cost c + d_a, where c = λ + α_min and
d_a = max over its lanes of (f_ap·D_p / bw_l + δ_l) (δ_l = α_l − α_min): exactly what the K-slot
model (:mod:`solver.kslot`) charges an activation. The master LP

    min Σ_a (c + d_a)·λ_a   s.t.   Σ_a f_ap·λ_a ≥ 1  (every pair p, dual π_p ≥ 0)
                                   Σ_a λ_a ≥ K_min   (dual μ ≥ 0)
                                   Σ_a λ_a ≤ K_max   (dual ν ≤ 0)

has every channel schedule with K_min ≤ K ≤ K_max activations as an integral point (λ_a = 1 per
activation) of the same cost, so its optimum bounds them all; a schedule with more than K_max
activations costs more than the best known UB, hence min(UB, LP) bounds every channel schedule.

Pricing finds the activation of least reduced cost c − μ − ν + d − Σ_p π_p·f_p:

- *exactly, by enumeration*, on one node of at most 8 GPUs: every maximal partial channel
  (:func:`~solver.channels.enumerate_channels`; every partial channel is a subset of one, and a
  lane's gain is never negative, so none prices better). Per channel
  g(d) = Σ_lanes π_p·min(1, d·bw_l / D_p) − d is concave and piecewise linear, its maximum at a
  lane's saturation time D_p / bw_l, so every channel is priced exactly in closed form. Here
  δ_l is dropped (every lane charged α_min, as the channel pool does): a relaxation, so the
  bound stays valid, and the enumeration's rate dominance (which ignores δ) loses nothing;
- *by a MILP* (SCIP) elsewhere: binaries z_l (lanes; the channel rules of Eq. 1), f_l ≤ z_l,
  d ≥ f_l·D_p / bw_l + δ_l·z_l, its proven bound used.

For any duals, every feasible λ of the full LP satisfies
cost ≥ Σ_p π_p + μ·K_min + ν·K_max + K_max·min(0, rc*), rc* a proven lower bound on the reduced
costs: that Lagrangian bound is valid at every iteration, converged or not, and equals the
master's value when pricing proves rc* ≥ 0.

*Branching on K* (a one-level branch-and-price; the number of activations is integral). The
LP amortises the fixed cost c over fractional activations; a schedule has an integral number K
of them. Child K is the master with Σ_a λ_a = K and the *duration cuts* of K activations
(:func:`duration_cuts`): with the K durations sorted longest first and d_(m) ≥ s_m
(:func:`~solver.kslot.sorted_durations`), Σ_a min(d_a, θ)·λ_a ≥ Σ_m min(s_m, θ) for each θ among
the s_m, and Σ_a d_a·λ_a ≥ max(Σ_m s_m, L) (dual η_θ ≥ 0 each). Pricing adds
Σ_θ η_θ·min(d, θ) to the gain (still concave and piecewise linear in d: the θ are breakpoints
too; the MILP gets w_θ ≤ d, w_θ ≤ θ), and the Lagrangian bound Σ_θ η_θ·rhs_θ. Columns stop at
d ≤ UB (no activation of a schedule faster than UB lasts longer): the gain stays bounded where
η_∞ > 1, and a child bounds the schedules with K activations faster than UB, which is all
min(UB, ·) needs. A child's restricted master may be infeasible on the columns so far; an
artificial cover per row at a prohibitive cost keeps it feasible (the Lagrangian bound holds
for any duals, so they change no bound). The branched bound is min over K of the largest of
the root's, the child's and any other bound on K activations (the K-slot model's, from CP-SAT
or closed form): at least the root's and the per-K bounds' minimum, and more where the K that
the LP prefers is not the K that the other bounds prefer.

*Branching below K* (branch-and-price, Barnhart et al., "Branch-and-Price: Column Generation
for Solving Huge Integer Programs", Operations Research 46(3), 1998, on a rule for general
integer columns). With K fixed the LP still mixes fractions of many activations: at 8 MiB,
seed 1, K = 8, 51 columns, and a pair served by 1.5 activations where a schedule serves it by
one or two. The number of activations that serve pair p, n_p = Σ_{a serves p} λ_a, is an
integer in every schedule, so a node whose n_p is fractional splits into n_p ≤ ⌊n_p⌋ and
n_p ≥ ⌈n_p⌉ (rows of the master, dual σ_p, ≥ 0 on a least count and ≤ 0 on a most one). A
column then gains σ_p for each pair it serves: a lane of σ_p < 0 is served only where its cover
outweighs it (past d = −σ·sat/π, one more breakpoint of the closed form), and a lane of
σ_p > 0 may be served at f = 0 (a relaxation: a schedule serves p with some bytes). The
Lagrangian bound gains Σ σ_p·(lo_p or hi_p). Nodes of every K are expanded best first; a node
whose counts are all integral is not branched further (its λ may still be fractional: which
pairs share an activation is not branched on). Rate dominance in the enumeration stays exact,
as the σ are per pair, not per route.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.linear_solver import linear_solver_pb2, pywraplp

from variopath_jax.schedule import Schedule
from variopath_jax.sim.network import NetworkModel
from variopath_jax.solver.channels import (
    Channel,
    Lane,
    SolverError,
    candidate_lanes,
    enumerate_channels,
)
from variopath_jax.solver.kslot import durations_lower_bound, sorted_durations
from variopath_jax.solver.milp import channels_of, min_activations
from variopath_jax.topology import PathModel

MB = 1e6  # bytes per unit; time in µs (a rate of C GB/s is C·1e-3 MB/µs)
PRICED_PER_ROUND = 20  # columns of negative reduced cost added per round (enumeration)
# channels a partial pricing round looks at: those that gained most at the last full pricing
HOT_CHANNELS = 4000
PRICED_CHUNK = 4096  # channels a full pricing evaluates at once, best upper bounds first
CUT_PENALTY = 1e3  # per µs of a duration cut left unmet by the restricted master's columns


@dataclass
class ColgenBound:
    """The configuration LP's bound on every channel schedule (seconds)."""

    bound_s: float  # max over iterations of the Lagrangian bound, capped by ``upper_s``
    lp_s: float  # the last master LP's value (an upper estimate of the LP optimum)
    converged: bool  # pricing proved no column of negative reduced cost
    iterations: int
    columns: int
    seconds: float
    pricing: str = "milp"  # "enumeration" (every channel, exact) or "milp" (SCIP)
    # the channels of the master's columns (one-lane seeds and warm activations included): a
    # small pool of the channels the LP found useful, for a schedule search
    # (``milp.search_pool``); not a bound
    channels: list[Channel] = field(default_factory=list)
    root_s: float = 0.0  # the root's bound (every K_min ≤ K ≤ K_max), before branching on K
    # the bounds by K (exactly K activations, seconds), where the branching reached that K
    per_k: dict[int, float] = field(default_factory=dict)
    nodes: int = 0  # LPs the branching solved (one per K reached, two per count branched on)
    master: ConfigLP | None = None  # the master with its columns, to re-solve (``lp_model``)


class _Enumerated:
    """Every channel as arrays for closed-form pricing: per channel and lane, the demand pair
    (-1: no demand) and the saturation time D_p / bw_l (µs)."""

    def __init__(self, model: PathModel, pair_index: dict, volume: np.ndarray) -> None:
        channels = enumerate_channels(model)
        self.channels = channels
        n = model.topology.num_ranks
        self.pair = np.full((len(channels), n), -1, dtype=np.int64)
        self.sat = np.ones((len(channels), n))
        for a, ch in enumerate(channels):
            for k, (pr, rate) in enumerate(zip(ch.pairs, ch.rates, strict=True)):
                p = pair_index.get(pr)
                if p is not None:
                    self.pair[a, k] = p
                    self.sat[a, k] = volume[p] / (rate * 1e-3)
        self.hot: np.ndarray | None = None  # the channels partial pricing looks at

    def price(
        self,
        pi: np.ndarray,
        count: int,
        d_max: float,
        cuts: list[tuple[float, float]] = (),
        sigma: np.ndarray | None = None,
        *,
        hot: bool = False,
    ) -> tuple[float, list[tuple[dict, float, int, float]]]:
        """max over columns of d ≤ ``d_max`` of the gain Σ_p (π_p f_p + σ_p [p served]) − d
        + Σ_j η_j min(d, θ_j) (exact; ``cuts``: the (θ_j, η_j) of the duration cuts, θ = inf
        for Σ d; ``sigma``: the duals of the pairs' count rows), and the ``count`` best columns
        of positive gain (cover, d, the index of their channel, gain). ``hot``: only the
        channels that gained most at the last full pricing (partial pricing: a heuristic round,
        its maximum no bound). A full pricing evaluates the channels in decreasing order of a
        cheap upper bound on their gain (:meth:`_upper_bounds`) and stops where that bound
        meets the ``count``-th gain found, so its maximum stays exact; it refreshes the hot
        channels."""
        sigma = sigma if sigma is not None and sigma.any() else None
        if hot and self.hot is not None:
            rows = self.hot
            value, dur = self._gains(rows, pi, d_max, cuts, sigma)
        else:
            bound = self._upper_bounds(pi, d_max, cuts, sigma)
            order = np.argsort(-bound, kind="stable")
            values, durs, done = [], [], 0
            while done < len(order):
                found = np.concatenate(values) if values else np.zeros(0)
                enough = np.partition(found, -count)[-count] if len(found) >= count else 0.0
                if bound[order[done]] <= max(enough, 0.0):
                    break  # no channel left can gain more than the count-th found
                chunk = order[done : done + PRICED_CHUNK]
                v, d = self._gains(chunk, pi, d_max, cuts, sigma)
                values.append(v)
                durs.append(d)
                done += len(chunk)
            rows = order[:done]
            value = np.concatenate(values) if values else np.zeros(0)
            dur = np.concatenate(durs) if durs else np.zeros(0)
            ranked = np.argsort(-value, kind="stable")
            self.hot = np.concatenate([rows[ranked], order[done:]])[:HOT_CHANNELS]
        top = np.argsort(-value, kind="stable")[:count]
        out = []
        for a in top:
            if value[a] <= 0:
                break
            channel = int(rows[a])
            col = {}
            for p, sat in zip(self.pair[channel], self.sat[channel], strict=True):
                f = min(1.0, float(dur[a]) / sat)
                if p >= 0 and (sigma is None or sigma[p] >= 0 or pi[p] * f + sigma[p] > 0):
                    col[int(p)] = f
            out.append((col, float(dur[a]), channel, float(value[a])))
        return float(value.max(initial=0.0)), out

    def _gains(
        self,
        rows: np.ndarray,
        pi: np.ndarray,
        d_max: float,
        cuts: list[tuple[float, float]],
        sigma: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each channel of ``rows``: its greatest gain (see :meth:`price`) and the duration d
        that gives it. Without σ the gain is concave and piecewise linear in d, so its maximum
        lies at a lane's saturation time, a θ_j or d_max (where η_inf > 1 makes the gain grow
        without end); a lane of σ < 0 is served only past d = −σ·sat/π, a breakpoint too."""
        pair, sat_all = self.pair[rows], self.sat[rows]
        has = pair >= 0
        w = np.where(has, pi[np.maximum(pair, 0)], 0.0)
        sat = np.where(has, sat_all, 0.0)  # idle lanes: the empty column, d = 0
        finite = [min(t, d_max) for t, _ in cuts if math.isfinite(t)] + [d_max]
        points = [sat, np.broadcast_to(finite, (len(sat), len(finite)))]
        s = None
        if sigma is not None:
            s = np.where(has, sigma[np.maximum(pair, 0)], 0.0)
            paying = (s < 0) & (w > 0)
            points.append(np.where(paying, -s * sat_all / np.where(paying, w, 1.0), 0.0))
        points = np.minimum(np.concatenate(points, axis=1), d_max)
        d = points[:, :, None]  # (channels, breakpoint m, 1)
        lane = w[:, None, :] * np.minimum(1.0, d / sat_all[:, None, :])
        if s is not None:  # a lane is left out where its count's dual outweighs its cover
            lane = np.maximum(lane + s[:, None, :], 0.0)
        g = lane.sum(axis=2) - points
        for theta, eta in cuts:
            g = g + eta * np.minimum(points, theta)
        m = g.argmax(axis=1)
        at = np.arange(len(g))
        return g[at, m], points[at, m]

    def _upper_bounds(
        self,
        pi: np.ndarray,
        d_max: float,
        cuts: list[tuple[float, float]],
        sigma: np.ndarray | None,
    ) -> np.ndarray:
        """Per channel, an upper bound on its gain, cheap to evaluate: each lane gains at most
        max(π + σ, 0) and at most π·d/sat + max(σ, 0), so the gain is at most
        min(A, R·d + S) − d + Σ_j η_j min(d, θ_j) (A, R, S the sums over the lanes), a concave
        function whose maximum lies at d = 0, (A − S)/R, a θ_j or d_max."""
        has = self.pair >= 0
        where = np.maximum(self.pair, 0)
        w = np.where(has, pi[where], 0.0)
        s = np.where(has, sigma[where], 0.0) if sigma is not None else np.zeros_like(w)
        whole = np.maximum(w + s, 0.0).sum(axis=1)
        slope = (w / self.sat).sum(axis=1)
        lift = np.maximum(s, 0.0).sum(axis=1)
        cross = np.where(slope > 0, (whole - lift) / np.where(slope > 0, slope, 1.0), d_max)
        fixed = [0.0, d_max] + [min(t, d_max) for t, _ in cuts if math.isfinite(t)]
        points = np.column_stack([np.clip(cross, 0.0, d_max), *[np.full(len(w), t) for t in fixed]])
        g = np.minimum(whole[:, None], slope[:, None] * points + lift[:, None]) - points
        for theta, eta in cuts:
            g = g + eta * np.minimum(points, theta)
        return g.max(axis=1)


@dataclass
class _Pricing:
    solver: pywraplp.Solver
    z: list
    f: list
    d: pywraplp.Variable
    w: list = field(default_factory=list)  # w_j ≤ min(d, θ_j), one per finite duration cut


def _pricing_model(lanes: list[Lane], volume: np.ndarray, pair_of: list[int], n: int) -> _Pricing:
    """The pricing MILP's constraints (objective set per iteration)."""
    solver = pywraplp.Solver.CreateSolver("SCIP")
    if solver is None:
        raise SolverError("OR-Tools was built without SCIP")
    solver.SetNumThreads(1)
    alpha_min = min(lane.alpha_s for lane in lanes)
    d = solver.NumVar(0.0, solver.infinity(), "d")
    z, f = [], []
    for k, lane in enumerate(lanes):
        zk = solver.BoolVar(f"z{k}")
        fk = solver.NumVar(0.0, 1.0, f"f{k}")
        solver.Add(fk <= zk)
        rate = lane.route.rate * 1e-3  # MB/µs
        delta = (lane.alpha_s - alpha_min) * 1e6
        solver.Add(fk * (volume[pair_of[k]] / rate) + delta * zk <= d)
        z.append(zk)
        f.append(fk)
    for rank in range(n):
        out = [zk for lane, zk in zip(lanes, z, strict=True) if lane.i == rank]
        inn = [zk for lane, zk in zip(lanes, z, strict=True) if lane.j == rank]
        if len(out) > 1:
            solver.Add(sum(out) <= 1)
        if len(inn) > 1:
            solver.Add(sum(inn) <= 1)
    by_link: dict[int, list] = {}
    for lane, zk in zip(lanes, z, strict=True):
        for link in lane.route.links:
            by_link.setdefault(link, []).append(zk)
    for zs in by_link.values():
        if len(zs) > 1:
            solver.Add(sum(zs) <= 1)
    return _Pricing(solver, z, f, d)


def _columns_of(
    schedule: Schedule,
    lanes: list[Lane],
    volume: np.ndarray,
    pair_index: dict[tuple[int, int], int],
) -> list[tuple[dict[int, float], float, Channel]]:
    """A barrier schedule's activations as columns ({pair: fraction}, d in µs, their channel);
    steps that are not channels (two lanes from one sender, say) are skipped."""
    alpha_min = min(lane.alpha_s for lane in lanes)
    alpha = {(lane.i, lane.j, lane.route.cls, lane.path): lane.alpha_s for lane in lanes}
    out = []
    for step, channel in zip(schedule.steps, channels_of(schedule), strict=True):
        cover: dict[int, float] = {}
        d = 0.0
        senders, receivers = set(), set()
        ok = True
        for t in step.transfers:
            p = pair_index.get((t.src, t.dst))
            if p is None or t.src in senders or t.dst in receivers:
                ok = False
                break
            senders.add(t.src)
            receivers.add(t.dst)
            cover[p] = min(1.0, cover.get(p, 0.0) + t.nbytes / MB / volume[p])
            delta = alpha.get((t.src, t.dst, t.cls, tuple(t.path)), alpha_min) - alpha_min
            d = max(d, t.nbytes / MB / (t.rate * 1e-3) + delta * 1e6)
        if ok and cover:
            out.append((cover, d, channel))
    return out


class ConfigLP:
    """The configuration LP's master (GLOP) and its exact pricing, kept between solves so that
    the LP can be re-solved, warm, with the number of activations restricted to a range and
    the pairs' counts of activations to bounds: the root over K_min..K_max, then the nodes of
    the module's branching on K and below it."""

    def __init__(
        self,
        demand: np.ndarray,
        model: PathModel,
        network: NetworkModel,
        *,
        upper_s: float,
        warm: list[Schedule] = (),
        pricing: str = "auto",
        pricing_limit_s: float = 10.0,
    ) -> None:
        if pricing not in ("auto", "enumeration", "milp"):
            raise SolverError(f"pricing {pricing!r}: auto, enumeration or milp")
        off = np.asarray(demand, dtype=np.int64).copy()
        np.fill_diagonal(off, 0)
        self.model = model
        self.pricing_limit_s = pricing_limit_s
        self.lanes = lanes = candidate_lanes(model, off, network)
        self.columns: list = []
        self.covers: list[dict[int, float]] = []  # each column's {pair: fraction}
        self.keys: set[tuple] = set()  # each column's (cover, d), to add none twice
        self.durations: list[float] = []  # each column's d (µs)
        # each column's channel (its lanes' routes): the pool of the channels the LP found
        # useful, and what a dive's activations run on
        self.channels: list[Channel] = []
        self.cut_rows: list = []  # the duration cuts in force: (θ_j, row)
        self.cut_sets: dict[tuple, list] = {}  # every set of cuts put in force: its rows
        # per pair, the row counting the activations that serve it (branching below K)
        self.count_rows: dict[int, pywraplp.Constraint] = {}
        self.counts: dict[int, tuple[int, float]] = {}  # the count bounds in force
        self.k_min = self.k_max = 0
        self.c = 0.0
        self.enumerated: _Enumerated | None = None
        if not lanes:
            return
        pairs = sorted({(lane.i, lane.j) for lane in lanes})
        self.pair_index = pair_index = {p: k for k, p in enumerate(pairs)}
        self.volume = volume = np.array([off[i, j] / MB for i, j in pairs])
        self.pair_of = [pair_index[lane.i, lane.j] for lane in lanes]
        alpha_min = min(lane.alpha_s for lane in lanes)
        self.c = c = (network.barrier_s + alpha_min) * 1e6  # µs
        # no activation of a schedule faster than upper_s lasts longer: columns stop there
        self.d_max = upper_s * 1e6
        self.k_min = min_activations(off)
        # more activations cost more than upper_s
        self.k_max = max(self.k_min, math.floor(upper_s * 1e6 / c))
        self.master = master = pywraplp.Solver.CreateSolver("GLOP")
        self.cover = [master.Constraint(1.0, master.infinity(), f"p{p}") for p in range(len(pairs))]
        # per pair, its number of activations in the last master solution (what is branched on)
        self.served = np.zeros(len(pairs))
        # artificial cover at a prohibitive cost keeps every restricted master feasible (a child
        # with exactly K activations may not be, on the columns so far); the Lagrangian bound
        # holds for any duals, so they change no bound
        self.lo = master.Constraint(float(self.k_min), master.infinity(), "kmin")
        self.hi = master.Constraint(0.0, float(self.k_max), "kmax")
        self.objective = master.Objective()
        self.objective.SetMinimization()
        self.artificials = []
        for row in self.cover:
            artificial = master.NumVar(0.0, master.infinity(), "")
            row.SetCoefficient(artificial, 1.0)
            self.objective.SetCoefficient(artificial, 10.0 * upper_s * 1e6)
            self.artificials.append(artificial)
        for p, (i, j) in enumerate(pairs):  # one lane per pair, its fastest route
            best = min(
                (lane for lane in lanes if (lane.i, lane.j) == (i, j)),
                key=lambda lane: volume[p] / (lane.route.rate * 1e-3) + lane.alpha_s * 1e6,
            )
            d = volume[p] / (best.route.rate * 1e-3) + (best.alpha_s - alpha_min) * 1e6
            self._add({p: 1.0}, d, Channel.from_routes(model, [(i, j, best.route)]))
        for schedule in warm:
            for col, d, channel in _columns_of(schedule, lanes, volume, pair_index):
                self._add(col, d, channel)
        topo = model.topology
        if pricing == "enumeration" or (
            pricing == "auto" and topo.nodes == 1 and topo.num_ranks <= 8
        ):
            self.enumerated = _Enumerated(model, pair_index, volume)
        else:
            self.milp = _pricing_model(lanes, volume, self.pair_of, len(off))
            self.milp.d.SetUb(self.d_max)

    def _add(self, col: dict[int, float], d: float, channel: Channel) -> None:
        key = (tuple(sorted(col.items())), d)  # channels of equal lane rates give equal columns
        if key in self.keys:
            return
        self.keys.add(key)
        v = self.master.NumVar(0.0, self.master.infinity(), f"a{len(self.columns)}")
        for p, frac in col.items():
            self.cover[p].SetCoefficient(v, frac)
        self.lo.SetCoefficient(v, 1.0)
        self.hi.SetCoefficient(v, 1.0)
        self.objective.SetCoefficient(v, self.c + d)
        for rows in self.cut_sets.values():
            for theta, row in rows:
                row.SetCoefficient(v, min(d, theta))
        for p, row in self.count_rows.items():
            if p in col:
                row.SetCoefficient(v, 1.0)
        self.columns.append(v)
        self.covers.append(col)
        self.durations.append(d)
        self.channels.append(channel)

    def _solve_master(self) -> int:
        """GLOP on the master, warm from the last basis; solved anew without presolve where
        that ends ABNORMAL (GLOP's presolve did on r5080-bf3, 8 MiB, seed 0, at the root's
        15th round, cold or warm; without it the same LP solves)."""
        status = self.master.Solve()
        if status == pywraplp.Solver.ABNORMAL:
            plain = pywraplp.MPSolverParameters()
            plain.SetIntegerParam(plain.PRESOLVE, plain.PRESOLVE_OFF)
            plain.SetIntegerParam(plain.INCREMENTALITY, plain.INCREMENTALITY_OFF)
            status = self.master.Solve(plain)
        if status == pywraplp.Solver.ABNORMAL:
            status = self._solve_afresh()
        return status

    def _solve_afresh(self) -> int:
        """The master solved by a new GLOP from an export of the model, its solution and duals
        loaded back: what an incremental solve that ends ABNORMAL twice leaves (seen in an
        ad-hoc script at 8 MiB, seed 1, the child of K = 8's second round: the same LP,
        exported, solved at once)."""
        request = linear_solver_pb2.MPModelRequest()
        self.master.ExportModelToProto(request.model)
        request.solver_type = linear_solver_pb2.MPModelRequest.GLOP_LINEAR_PROGRAMMING
        response = linear_solver_pb2.MPSolutionResponse()
        pywraplp.Solver.SolveWithProto(request, response)
        if response.status != linear_solver_pb2.MPSOLVER_OPTIMAL:
            return pywraplp.Solver.ABNORMAL
        self.master.LoadSolutionFromProto(response)
        return pywraplp.Solver.OPTIMAL

    def _set_cuts(self, cuts: list[tuple[float, float]]) -> None:
        """Put the duration cuts Σ_a min(d_a, θ_j)·λ_a ≥ rhs_j in force (``cuts``: (θ_j, rhs_j),
        µs; θ = inf for Σ d), those of the last solve out (their rows left free, kept for the
        next solve with the same cuts)."""
        inf = self.master.infinity()
        for _, row in self.cut_rows:
            row.SetBounds(-inf, inf)
        key = tuple(cuts)
        if key not in self.cut_sets:
            rows = []
            for theta, _ in cuts:
                row = self.master.Constraint(-inf, inf)
                artificial = self.master.NumVar(0.0, inf, "")
                row.SetCoefficient(artificial, 1.0)
                self.objective.SetCoefficient(artificial, CUT_PENALTY)
                for v, d in zip(self.columns, self.durations, strict=True):
                    row.SetCoefficient(v, min(d, theta))
                rows.append((theta, row))
            self.cut_sets[key] = rows
        self.cut_rows = self.cut_sets[key]
        for (_, rhs), (_, row) in zip(cuts, self.cut_rows, strict=True):
            row.SetBounds(rhs, inf)

    def _served(self) -> np.ndarray:
        """Per pair, the number of activations that serve it in the master's solution."""
        out = np.zeros(len(self.cover))
        for v, cover in zip(self.columns, self.covers, strict=True):
            x = v.solution_value()
            if x > 1e-9:
                for p in cover:
                    out[p] += x
        return out

    def _set_counts(self, counts: dict[int, tuple[int, float]]) -> None:
        """Put the bounds lo ≤ Σ_{a serves p} λ_a ≤ hi in force for each pair p of ``counts``
        ({p: (lo, hi)}, hi may be inf), the other pairs' rows left free. A row gets an
        artificial each way at a prohibitive cost, so the restricted master stays feasible."""
        inf = self.master.infinity()
        for p, row in self.count_rows.items():
            if p not in counts:
                row.SetBounds(-inf, inf)
        for p, (lo, hi) in counts.items():
            if p not in self.count_rows:
                row = self.count_rows[p] = self.master.Constraint(-inf, inf, f"n{p}")
                for sign in (1.0, -1.0):
                    artificial = self.master.NumVar(0.0, inf, "")
                    row.SetCoefficient(artificial, sign)
                    self.objective.SetCoefficient(artificial, 10.0 * self.d_max)
                for v, cover in zip(self.columns, self.covers, strict=True):
                    if p in cover:
                        row.SetCoefficient(v, 1.0)
            self.count_rows[p].SetBounds(float(lo), hi if math.isfinite(hi) else inf)
        self.counts = dict(counts)

    def _count_duals(self) -> tuple[np.ndarray, float]:
        """The count rows' duals σ_p (≥ 0 where only a least count binds, ≤ 0 where only a most
        count does) and their part Σ σ_p·(lo_p or hi_p) of the Lagrangian bound."""
        sigma = np.zeros(len(self.cover))
        part = 0.0
        for p, (lo, hi) in self.counts.items():
            value = self.count_rows[p].dual_value()
            value = min(value, 0.0) if lo <= 0 else value
            value = max(value, 0.0) if not math.isfinite(hi) else value
            sigma[p] = value
            part += value * (lo if value > 0 else hi) if value else 0.0
        return sigma, part

    def solve(
        self,
        k_lo: int,
        k_hi: int,
        *,
        deadline: float,
        cuts: list[tuple[float, float]] = (),
        counts: dict[int, tuple[int, float]] | None = None,
        max_iterations: int = 500,
    ) -> tuple[float, float, bool, int]:
        """Column generation on the master with k_lo ≤ Σ λ_a ≤ k_hi, the duration ``cuts``
        ((θ_j, rhs_j), µs; valid for the schedules of that range only) and the pairs' count
        bounds ``counts`` ({p: (lo, hi)}: lo ≤ n_p ≤ hi; enumeration pricing only) until
        pricing proves no column of negative reduced cost, ``deadline`` (perf_counter) or
        ``max_iterations``: (the best Lagrangian bound, the last master value, converged,
        iterations), in µs; ``served`` holds the last master solution's n_p."""
        c = self.c
        self.lo.SetBounds(float(k_lo), self.master.infinity())
        self.hi.SetBounds(0.0, float(k_hi))
        self._set_cuts(list(cuts))
        if counts and self.enumerated is None:
            raise SolverError("counts of activations per pair need pricing by enumeration")
        self._set_counts(counts or {})
        bound, lp, converged, iterations = 0.0, math.inf, False, 0
        while iterations < max_iterations and time.perf_counter() < deadline:
            iterations += 1
            if self._solve_master() != pywraplp.Solver.OPTIMAL:
                break  # (not seen; infeasible only if k_hi < k_lo) the bound so far stands
            lp = self.objective.Value()
            self.served = self._served()
            pi = np.array([max(row.dual_value(), 0.0) for row in self.cover])
            mu, nu = max(self.lo.dual_value(), 0.0), min(self.hi.dual_value(), 0.0)
            eta = [(theta, max(row.dual_value(), 0.0)) for theta, row in self.cut_rows]
            # Σ π_p + Σ η_j rhs_j + μ k_lo + ν k_hi: the dual side of the Lagrangian bound
            dual = float(pi.sum()) + mu * k_lo + nu * k_hi
            dual += sum(e * row.lb() for (_, e), (_, row) in zip(eta, self.cut_rows, strict=True))
            if self.enumerated is not None:
                sigma, part = self._count_duals()
                dual += part
                price, pays = self.enumerated.price, c - mu - nu + 1e-9 * c  # gain that pays
                # a partial round first; a full one (exact, hence a bound) when it finds none
                _, found = price(pi, PRICED_PER_ROUND, self.d_max, eta, sigma, hot=True)
                if not any(gain > pays for *_, gain in found):
                    best_value, found = price(pi, PRICED_PER_ROUND, self.d_max, eta, sigma)
                    rc_lower = c - mu - nu - best_value  # exact
                    bound = max(bound, dual + k_hi * min(0.0, rc_lower))
                    if rc_lower >= -1e-9 * c:
                        converged = True
                        break
                for col, dur, a, gain in found:
                    if gain > pays:
                        self._add(col, dur, self.enumerated.channels[a])
                continue
            milp = self.milp
            price = milp.solver.Objective()
            price.Clear()
            for k, fk in enumerate(milp.f):
                price.SetCoefficient(fk, float(pi[self.pair_of[k]]))
            slope = -1.0
            finite = [(theta, e) for theta, e in eta if math.isfinite(theta)]
            while len(milp.w) < len(finite):
                w = milp.solver.NumVar(0.0, milp.solver.infinity(), f"w{len(milp.w)}")
                milp.solver.Add(w <= milp.d)
                milp.w.append(w)
            for (theta, e), w in zip(finite, milp.w, strict=False):
                w.SetUb(theta)
                price.SetCoefficient(w, e)
            slope += sum(e for theta, e in eta if not math.isfinite(theta))
            price.SetCoefficient(milp.d, slope)
            price.SetMaximization()
            left = deadline - time.perf_counter()
            milp.solver.SetTimeLimit(max(1, int(min(self.pricing_limit_s, left) * 1000)))
            code = milp.solver.Solve()
            if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
                break
            best_value = price.Value()
            proven_max = best_value if code == pywraplp.Solver.OPTIMAL else price.BestBound()
            rc_lower = c - mu - nu - proven_max  # no column has a smaller reduced cost
            bound = max(bound, dual + k_hi * min(0.0, rc_lower))
            rc_found = c - mu - nu - best_value
            if rc_lower >= -1e-9 * c:
                converged = True
                break
            if rc_found >= -1e-9 * c:
                break  # the best found prices out but is not proven: no column to add
            col, chosen = {}, []
            for k, fk in enumerate(milp.f):
                if milp.z[k].solution_value() > 0.5 and fk.solution_value() > 0:
                    col[self.pair_of[k]] = max(col.get(self.pair_of[k], 0.0), fk.solution_value())
                    lane = self.lanes[k]
                    chosen.append((lane.i, lane.j, lane.route))
            self._add(col, milp.d.solution_value(), Channel.from_routes(self.model, chosen))
        return bound, lp, converged, iterations

    def dive(
        self, k_hi: int, *, deadline: float, flexible: bool = False
    ) -> list[tuple[Channel, float]]:
        """A channel schedule from the LP by diving (a primal heuristic of column generation:
        Lübbecke & Desrosiers 2005, §4.2; no bound). Re-solve the master by column generation
        with Σ λ ≤ k_hi (no least K: it would activate columns of no use), activate the column
        of largest λ once (all of them where they are all integral) and repeat until the LP
        uses no other column. An activated column
        leaves the master and takes its cover off the pairs' rows; with ``flexible`` its
        channel's duration stays free instead (a variable of cost 1 per µs serving bw·t of
        each lane's pair). Past ``deadline`` every column the LP uses is activated at once; a
        pair the LP leaves to its artificial cover gets its seed (one lane, the whole pair).
        Returns the activations (channel, duration in seconds) for
        :func:`~solver.milp.schedule_of`; the master is left as it was."""
        if not self.lanes:
            return []
        need = np.ones(len(self.cover))
        fixed: list[int] = []  # activated columns, durations fixed
        free: list[tuple[pywraplp.Variable, Channel]] = []  # activated channels, durations free

        def activate(a: int) -> None:
            self.columns[a].SetUb(0.0)
            if not flexible:
                fixed.append(a)
                for p, frac in self.covers[a].items():
                    need[p] -= frac
                    self.cover[p].SetLb(max(need[p], 0.0))
                return
            t = self.master.NumVar(0.0, self.master.infinity(), "")
            self.objective.SetCoefficient(t, 1.0)
            channel = self.channels[a]
            for pair, rate in zip(channel.pairs, channel.rates, strict=True):
                p = self.pair_index.get(pair)
                if p is not None:  # the share of the pair one µs serves
                    self.cover[p].SetCoefficient(t, rate * 1e-3 / self.volume[p])
            free.append((t, channel))

        try:
            while True:
                left = len(fixed) + len(free)
                # past k_hi activations the dive goes on with any number of them
                hi = k_hi - left if k_hi > left else max(self.k_max - left, 1)
                late = time.perf_counter() >= deadline
                if not late:
                    self.solve(0, hi, deadline=deadline)
                if self._solve_master() != pywraplp.Solver.OPTIMAL:
                    return []
                used = [(v.solution_value(), a) for a, v in enumerate(self.columns)]
                used = [(x, a) for x, a in used if x > 1e-9]
                if not used:
                    short = [p for p, v in enumerate(self.artificials) if v.solution_value() > 1e-9]
                    if not short:
                        break
                    for p in short:
                        activate(p)  # the first columns are the seeds, pair p's at p
                elif late or all(x > 1 - 1e-6 for x, _ in used):
                    for x, a in used:
                        for _ in range(1 if flexible else max(round(x), 1)):
                            activate(a)
                else:
                    activate(max(used, key=lambda u: (u[0], -u[1]))[1])
            out = [(self.channels[a], self.durations[a] * 1e-6) for a in fixed]
            return out + [
                (ch, t.solution_value() * 1e-6) for t, ch in free if t.solution_value() > 0
            ]
        finally:
            for v in self.columns:
                v.SetUb(self.master.infinity())
            for row in self.cover:
                row.SetLb(1.0)
            for t, _ in free:
                t.SetUb(0.0)  # GLOP keeps its variables: this one now stays at 0
                self.objective.SetCoefficient(t, 0.0)


def channel_config_bound(
    demand: np.ndarray,
    model: PathModel,
    network: NetworkModel,
    *,
    upper_s: float,
    warm: list[Schedule] = (),
    time_limit_s: float = 60.0,
    pricing_limit_s: float = 10.0,
    max_iterations: int = 500,
    pricing: str = "auto",
    branch: bool = False,
    per_k: dict[int, float] | None = None,
    flow_bound_s: float = 0.0,
    lp_model: ConfigLP | None = None,
    max_nodes: int | None = None,
) -> ColgenBound:
    """The configuration LP's Lagrangian bound on every channel schedule (module docstring),
    columns seeded with one lane per pair at its fastest route and the activations of the
    ``warm`` schedules; K_max from ``upper_s``, the best known time. ``pricing``: "auto"
    (enumeration where the channels can be enumerated, else the MILP), "enumeration" or
    "milp". ``branch``: branch-and-price on K and below it (module docstring;
    :func:`_branch_on_k`) within what is left of ``time_limit_s``, each K's nodes with its
    duration cuts (``flow_bound_s`` in the Σ d cut) and ``per_k`` (other proven bounds on the
    schedules of exactly K activations, seconds, e.g. the K-slot model's CP-SAT bounds) as a
    floor, until the least bound meets ``upper_s`` (or ``max_nodes`` LPs are solved); ``per_k``
    of the result holds each K's bound (to prune a schedule search's K). ``lp_model``: a
    master of an earlier call, re-solved with its columns (its K_max and column durations from
    that call's ``upper_s``, which must be no lower; ``warm`` and ``pricing`` unused).
    ``time_limit_s`` starts once the master is set up (the enumeration of channels, kept per
    topology, is not counted; ``seconds`` includes it)."""
    start = time.perf_counter()
    if lp_model is None:
        lp_model = ConfigLP(
            demand,
            model,
            network,
            upper_s=upper_s,
            warm=warm,
            pricing=pricing,
            pricing_limit_s=pricing_limit_s,
        )
    if not lp_model.lanes:
        return ColgenBound(0.0, 0.0, True, 0, 0, 0.0)
    deadline = time.perf_counter() + time_limit_s  # the master's set-up not counted
    k_min, k_max = lp_model.k_min, lp_model.k_max
    bound, lp, converged, iterations = lp_model.solve(
        k_min, k_max, deadline=deadline, max_iterations=max_iterations
    )
    root_s = min(upper_s, bound * 1e-6)
    children: dict[int, float] = {}
    bound_s, nodes = root_s, 0
    if branch:
        floor = {} if per_k is None else per_k
        bound_s, children, nodes = _branch_on_k(
            lp_model, demand, floor, flow_bound_s, root_s, upper_s, deadline, max_nodes
        )
    return ColgenBound(
        max(root_s, bound_s),
        lp * 1e-6,
        converged,
        iterations,
        len(lp_model.columns),
        time.perf_counter() - start,
        "milp" if lp_model.enumerated is None else "enumeration",
        lp_model.channels,
        root_s,
        children,
        nodes,
        lp_model,
    )


def duration_cuts(
    demand: np.ndarray, lanes: list[Lane], slots: int, flow_bound_s: float
) -> list[tuple[float, float]]:
    """The duration cuts of the schedules with exactly ``slots`` activations, (θ, rhs) in µs:
    with durations sorted longest first d_(1) ≥ … ≥ d_(K) and d_(m) ≥ s_m
    (:func:`~solver.kslot.sorted_durations`), Σ_m min(d_(m), θ) ≥ Σ_m min(s_m, θ) for every θ
    (one cut per distinct s_m), and Σ_m d_(m) ≥ max(Σ s_m, L) (θ = inf; L:
    :func:`~solver.kslot.durations_lower_bound`). Durations here are transfer times without δ,
    which the bounds on s and L are of too."""
    s = sorted_durations(demand, lanes, slots) * 1e6
    base = durations_lower_bound(demand, lanes, flow_bound_s) * 1e6
    cuts = [(float(t), float(np.minimum(s, t).sum())) for t in sorted(set(s[s > 0].tolist()))]
    return [*cuts, (math.inf, max(float(s.sum()), base))]


def _branch_on_k(
    lp_model: ConfigLP,
    demand: np.ndarray,
    per_k: dict[int, float],
    flow_bound_s: float,
    root_s: float,
    upper_s: float,
    deadline: float,
    max_nodes: int | None = None,
) -> tuple[float, dict[int, float], int]:
    """min over K_min ≤ K ≤ K_max of a bound on the schedules of exactly K activations, by
    best-first branch-and-price (module docstring): a node is K with bounds on some pairs'
    counts of activations; its bound the largest of its parent's and its LP's (exactly K, with
    :func:`duration_cuts` and its count bounds); a K not yet solved stands at its floor, the
    largest of ``per_k[K]``, the root's and K·c + the Σ d cut's rhs. The node of least bound is
    expanded first (a K's child LP solved, or a solved node branched on its most fractional
    count n_p: n_p ≤ ⌊n_p⌋ or n_p ≥ ⌈n_p⌉) until that bound meets ``upper_s``, ``deadline``
    or ``max_nodes`` LPs. Returns the least bound of the nodes left, each K's (seconds) and the number
    of LPs solved."""
    off = np.asarray(demand, dtype=np.int64).copy()
    np.fill_diagonal(off, 0)
    cuts = {
        k: duration_cuts(off, lp_model.lanes, k, flow_bound_s)
        for k in range(lp_model.k_min, lp_model.k_max + 1)
    }
    floor = {
        k: max(per_k.get(k, 0.0), root_s, (k * lp_model.c + cut[-1][1]) * 1e-6)
        for k, cut in cuts.items()
    }
    order = itertools.count()
    # (bound in s, K, tie-break, count bounds, the LP's counts or None where not solved yet)
    open_nodes = [(floor[k], k, next(order), {}, None) for k in sorted(floor)]
    heapq.heapify(open_nodes)
    settled: list[tuple[float, int]] = []  # nodes whose counts are all integral
    solved = 0
    while (
        open_nodes
        and open_nodes[0][0] < upper_s
        and time.perf_counter() < deadline
        and (max_nodes is None or solved < max_nodes)
    ):
        bound, k, _, counts, served = heapq.heappop(open_nodes)
        if served is None:
            branches = [counts]
        else:  # counts are branched on where pricing is exact (enumeration) only
            p = _most_fractional(served, counts) if lp_model.enumerated is not None else None
            if p is None:
                settled.append((bound, k))
                continue
            lo, hi = counts.get(p, (0, math.inf))
            down, up = math.floor(served[p]), math.ceil(served[p])
            branches = [{**counts, p: (lo, down)}, {**counts, p: (up, hi)}]
        for branch in branches:
            child, _, _, _ = lp_model.solve(k, k, deadline=deadline, cuts=cuts[k], counts=branch)
            solved += 1
            node = (max(bound, child * 1e-6), k, next(order), branch, lp_model.served)
            heapq.heappush(open_nodes, node)
    by_k: dict[int, float] = {}
    for bound, k, *_ in [*open_nodes, *settled]:
        by_k[k] = min(by_k.get(k, math.inf), bound)
    by_k = {k: min(b, upper_s) for k, b in by_k.items()}
    return min([upper_s, *by_k.values()]), by_k, solved


def _most_fractional(served: np.ndarray, counts: dict[int, tuple[int, float]]) -> int | None:
    """The pair whose count of activations is farthest from an integer, among those whose count
    lies within its bounds (both branches then narrow them; a count outside leans on an
    artificial); None where there is none."""
    frac = served - np.floor(served)
    distance = np.minimum(frac, 1.0 - frac)
    for p, (lo, hi) in counts.items():
        if not lo < served[p] < hi:
            distance[p] = 0.0
    p = int(np.argmax(distance))
    return p if distance[p] > 1e-6 else None
