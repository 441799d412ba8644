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

- *exactly, by enumeration*, on one node of at most 8 GPUs: every channel
  (:func:`~solver.channels.enumerate_channels`, the complete channel space; a partial channel is
  a channel with some lanes idle). Per channel g(d) = Σ_lanes π_p·min(1, d·bw_l / D_p) − d is
  concave and piecewise linear, its maximum at a lane's saturation time D_p / bw_l, so every
  channel is priced exactly in closed form. Here δ_l is dropped (every lane charged α_min, as
  the channel pool does): a relaxation, so the bound stays valid, and the enumeration's rate
  dominance (which ignores δ) loses nothing;
- *by a MILP* (SCIP) elsewhere: binaries z_l (lanes; the channel rules of Eq. 1), f_l ≤ z_l,
  d ≥ f_l·D_p / bw_l + δ_l·z_l, its proven bound used.

For any duals, every feasible λ of the full LP satisfies
cost ≥ Σ_p π_p + μ·K_min + ν·K_max + K_max·min(0, rc*), rc* a proven lower bound on the reduced
costs: that Lagrangian bound is valid at every iteration, converged or not, and equals the
master's value when pricing proves rc* ≥ 0.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.linear_solver import pywraplp

from variopath_jax.schedule import Schedule
from variopath_jax.sim.network import NetworkModel
from variopath_jax.solver.channels import (
    Channel,
    Lane,
    SolverError,
    candidate_lanes,
    enumerate_channels,
)
from variopath_jax.solver.milp import min_activations
from variopath_jax.topology import PathModel

MB = 1e6  # bytes per unit; time in µs (a rate of C GB/s is C·1e-3 MB/µs)
PRICED_PER_ROUND = 20  # columns of negative reduced cost added per round (enumeration)


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
    # the channels of the generated columns (one-lane seeds included): a small pool of the
    # channels the LP found useful, for a schedule search (``milp.search_pool``); not a bound
    channels: list[Channel] = field(default_factory=list)


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

    def price(self, pi: np.ndarray, count: int) -> tuple[float, list[tuple[dict, float, int]]]:
        """max over columns of Σ π_p f_p − d (exact), and the ``count`` best columns (with
        the index of their channel)."""
        w = np.where(self.pair >= 0, pi[np.maximum(self.pair, 0)], 0.0)
        # g at every breakpoint d = sat[a, m]: Σ_k w_k min(1, d / sat_k) − d
        d = self.sat[:, :, None]  # (channels, breakpoint m, 1)
        g = (w[:, None, :] * np.minimum(1.0, d / self.sat[:, None, :])).sum(axis=2) - self.sat
        g = np.where(self.pair >= 0, g, 0.0)  # breakpoints of idle lanes: the empty column
        m = g.argmax(axis=1)
        value = g[np.arange(len(g)), m]
        top = np.argsort(-value, kind="stable")[:count]
        out = []
        for a in top:
            dur = float(self.sat[a, m[a]])
            col = {
                int(p): float(min(1.0, dur / sat))
                for p, sat in zip(self.pair[a], self.sat[a], strict=True)
                if p >= 0
            }
            out.append((col, dur, int(a)))
        return float(value.max(initial=0.0)), [
            c for c, v in zip(out, value[top], strict=True) if v > 0
        ]


@dataclass
class _Pricing:
    solver: pywraplp.Solver
    z: list
    f: list
    d: pywraplp.Variable


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
) -> list[tuple[dict[int, float], float]]:
    """A barrier schedule's activations as columns ({pair: fraction}, d in µs); steps that are
    not channels (two lanes from one sender, say) are skipped."""
    alpha_min = min(lane.alpha_s for lane in lanes)
    alpha = {(lane.i, lane.j, lane.route.cls, lane.path): lane.alpha_s for lane in lanes}
    out = []
    for step in schedule.steps:
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
            out.append((cover, d))
    return out


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
) -> ColgenBound:
    """The configuration LP's Lagrangian bound on every channel schedule (module docstring),
    columns seeded with one lane per pair at its fastest route and the activations of the
    ``warm`` schedules; K_max from ``upper_s``, the best known time. ``pricing``: "auto"
    (enumeration where the channels can be enumerated, else the MILP), "enumeration" or
    "milp"."""
    if pricing not in ("auto", "enumeration", "milp"):
        raise SolverError(f"pricing {pricing!r}: auto, enumeration or milp")
    start = time.perf_counter()
    off = np.asarray(demand, dtype=np.int64).copy()
    np.fill_diagonal(off, 0)
    lanes = candidate_lanes(model, off, network)
    if not lanes:
        return ColgenBound(0.0, 0.0, True, 0, 0, 0.0)
    pairs = sorted({(lane.i, lane.j) for lane in lanes})
    pair_index = {p: k for k, p in enumerate(pairs)}
    volume = np.array([off[i, j] / MB for i, j in pairs])
    pair_of = [pair_index[lane.i, lane.j] for lane in lanes]
    alpha_min = min(lane.alpha_s for lane in lanes)
    c = (network.barrier_s + alpha_min) * 1e6  # µs
    k_min = min_activations(off)
    k_max = max(k_min, math.floor(upper_s * 1e6 / c))  # more activations cost more than upper_s
    master = pywraplp.Solver.CreateSolver("GLOP")
    cover = [master.Constraint(1.0, master.infinity(), f"p{p}") for p in range(len(pairs))]
    lo = master.Constraint(float(k_min), master.infinity(), "kmin")
    hi = master.Constraint(0.0, float(k_max), "kmax")
    objective = master.Objective()
    objective.SetMinimization()
    columns: list = []
    channels: list[Channel] = []

    def add(col: dict[int, float], d: float) -> None:
        v = master.NumVar(0.0, master.infinity(), f"a{len(columns)}")
        for p, frac in col.items():
            cover[p].SetCoefficient(v, frac)
        lo.SetCoefficient(v, 1.0)
        hi.SetCoefficient(v, 1.0)
        objective.SetCoefficient(v, c + d)
        columns.append(v)

    for p, (i, j) in enumerate(pairs):  # one lane per pair, its fastest route
        best = min(
            (lane for lane in lanes if (lane.i, lane.j) == (i, j)),
            key=lambda lane: volume[p] / (lane.route.rate * 1e-3) + lane.alpha_s * 1e6,
        )
        add({p: 1.0}, volume[p] / (best.route.rate * 1e-3) + (best.alpha_s - alpha_min) * 1e6)
        channels.append(Channel.from_routes(model, [(i, j, best.route)]))
    for schedule in warm:
        for col, d in _columns_of(schedule, lanes, volume, pair_index):
            add(col, d)
    topo = model.topology
    enumerated = None
    if pricing == "enumeration" or (pricing == "auto" and topo.nodes == 1 and topo.num_ranks <= 8):
        enumerated = _Enumerated(model, pair_index, volume)
    else:
        milp = _pricing_model(lanes, volume, pair_of, len(off))
    bound, lp, converged, iterations = 0.0, math.inf, False, 0
    while iterations < max_iterations and time.perf_counter() - start < time_limit_s:
        iterations += 1
        if master.Solve() != pywraplp.Solver.OPTIMAL:
            break  # (not seen) the bound so far stands
        lp = objective.Value()
        pi = np.array([max(row.dual_value(), 0.0) for row in cover])
        mu, nu = max(lo.dual_value(), 0.0), min(hi.dual_value(), 0.0)
        if enumerated is not None:
            best_value, found = enumerated.price(pi, PRICED_PER_ROUND)
            rc_lower = c - mu - nu - best_value  # exact
            lagrange = float(pi.sum()) + mu * k_min + nu * k_max + k_max * min(0.0, rc_lower)
            bound = max(bound, lagrange)
            if rc_lower >= -1e-9 * c:
                converged = True
                break
            for col, dur, a in found:
                if c - mu - nu - (sum(pi[p] * f for p, f in col.items()) - dur) < 0:
                    add(col, dur)
                    channels.append(enumerated.channels[a])
            continue
        price = milp.solver.Objective()
        price.Clear()
        for k, fk in enumerate(milp.f):
            price.SetCoefficient(fk, float(pi[pair_of[k]]))
        price.SetCoefficient(milp.d, -1.0)
        price.SetMaximization()
        left = time_limit_s - (time.perf_counter() - start)
        milp.solver.SetTimeLimit(max(1, int(min(pricing_limit_s, left) * 1000)))
        code = milp.solver.Solve()
        if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
            break
        best_value = price.Value()
        proven_max = best_value if code == pywraplp.Solver.OPTIMAL else price.BestBound()
        rc_lower = c - mu - nu - proven_max  # no column has a smaller reduced cost
        lagrange = float(pi.sum()) + mu * k_min + nu * k_max + k_max * min(0.0, rc_lower)
        bound = max(bound, lagrange)
        rc_found = c - mu - nu - best_value
        if rc_lower >= -1e-9 * c:
            converged = True
            break
        if rc_found >= -1e-9 * c:
            break  # the best found prices out but is not proven: no column to add
        col, chosen = {}, []
        for k, fk in enumerate(milp.f):
            if milp.z[k].solution_value() > 0.5 and fk.solution_value() > 0:
                col[pair_of[k]] = max(col.get(pair_of[k], 0.0), fk.solution_value())
                chosen.append((lanes[k].i, lanes[k].j, lanes[k].route))
        add(col, milp.d.solution_value())
        if chosen:
            channels.append(Channel.from_routes(model, chosen))
    bound_s = min(upper_s, bound * 1e-6)
    return ColgenBound(
        bound_s,
        lp * 1e-6,
        converged,
        iterations,
        len(columns),
        time.perf_counter() - start,
        "milp" if enumerated is None else "enumeration",
        channels,
    )
