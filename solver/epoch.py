"""The TE-CCL epoch model of the execution model, solved to proven optimality (TE-CCL: Liu et
al., SIGCOMM'24, §3 "time-expanded graph", §4 epochs and chunks; paper §6.3 "Scheduler quality").

TE-CCL discretises time into epochs of fixed duration τ and data into chunks; a link carries at
most its capacity × τ per epoch. The paper's MILP "follows the modeling approach of TE-CCL" and
optimises "concrete peer matchings, physical paths, transfer sizes and their execution order";
we write exactly that on TE-CCL's grid. For epochs k = 1..K:

    z[k, l] ∈ {0, 1}    lane l = (i, j, route) is active in epoch k
    x[k, l] ∈ ℕ          chunks lane l carries in epoch k,  x ≤ ⌊bw(l)·(τ − δ_l) / q⌋ · z
    Σ_{k,l ∋ (i,j)} x[k, l] ≥ ⌈D_ij / q⌉                          (every pair served)
    per epoch: each rank sends on ≤ 1 lane and receives on ≤ 1,
               each link of U carries ≤ 1 lane (paper Eq. 1: each epoch is one channel)
    y[k] ≥ z[k, l],  y[k] ≥ y[k+1]                                (used epochs come first)
    minimise Σ_k y[k]

Each epoch is one activation, a barrier step of the network model: λ, then the lanes, each taking
α_l (issue overhead plus its path's latency, :class:`~solver.channels.Lane`) plus its bytes over
bw. With α_min the least α_l and δ_l = α_l − α_min, a lane that carries at most bw·(τ − δ_l)
ends within α_min + τ: every epoch takes at most λ + α_min + τ, and the model's time is
T_τ = (Σ y)·(λ + α_min + τ). (A NIC lane's longer latency costs it capacity, not the epoch time.)

Buffering and relaying at GPUs (TE-CCL's b[s, n, k]) are left out: without them an epoch
schedule is a channel schedule, comparable with VarioPath's.

*Relation to the continuous model.* An epoch schedule is a valid schedule of the paper's
execution model (Eq. 2): each epoch becomes one activation whose lanes move at most bw·τ bytes,
so its simulated time is at most T_τ (shorter where an epoch's slowest lane is not full). Hence
T_τ ≥ the continuous optimum ≥ every proven bound of :mod:`solver.kslot` and :mod:`solver.milp`.
The grid is a restriction: every epoch pays λ + α_min, so refining τ to τ/m does not contain the
τ-schedules at the same cost (it would if a channel could be held across epochs without a new
barrier); of the τ tried, the one with the smallest time is kept (a proven one on a tie).

*Proof.* CP-SAT proves Σ y minimal; the degree bound max over ranks of Σ_j ⌈chunks_ij / (the
pair's most chunks per epoch)⌉ (one peer per epoch) and ⌈(the flow-LP bound) / τ⌉ are added as
valid cuts. ``status`` is "OPTIMAL" only when CP-SAT proves it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from variopath_jax import progress
from variopath_jax.schedule import Schedule, Step, Transfer
from variopath_jax.sim.network import NetworkModel
from variopath_jax.solver.channels import Lane, SolverError, add_channel_rules, candidate_lanes
from variopath_jax.topology import PathModel

DEFAULT_CHUNK_BYTES = 4096


@dataclass
class EpochProblem:
    """The epoch model for one demand, τ and chunk size, built but not solved."""

    demand: np.ndarray
    tau_s: float
    chunk_bytes: int
    lambda_s: float
    lanes: list[Lane]
    capacity: list[int]  # chunks per epoch, per lane
    lower: int  # a valid lower bound on the epochs
    greedy: list[dict[int, int]]  # a feasible schedule: per epoch, lane index -> chunks
    sat: cp_model.CpModel
    x: list[list[cp_model.IntVar]]
    y: list[cp_model.IntVar]

    @property
    def epoch_cost_s(self) -> float:
        """λ + α_min + τ: what every epoch costs in the model."""
        return self.lambda_s + min(lane.alpha_s for lane in self.lanes) + self.tau_s


@dataclass
class EpochResult:
    """A solve of the epoch model: ``time_s`` its model time T_τ, ``bound_s`` a proven lower
    bound on T_τ at this τ; ``status`` "OPTIMAL" only with a proof, else "FEASIBLE"."""

    schedule: Schedule
    status: str
    time_s: float
    bound_s: float
    epochs: int
    tau_s: float
    chunk_bytes: int
    seconds: float
    stats: dict = field(default_factory=dict)


def _greedy(
    lanes: list[Lane], capacity: list[int], need: dict[tuple[int, int], int]
) -> list[dict[int, int]]:
    """Epochs packed greedily: pairs with most epochs left first, each on its fastest free lane."""
    left = dict(need)
    by_pair: dict[tuple[int, int], list[int]] = {}
    for k, lane in enumerate(lanes):
        by_pair.setdefault((lane.i, lane.j), []).append(k)
    for ks in by_pair.values():
        ks.sort(key=lambda k: (-capacity[k], lanes[k].alpha_s))
    epochs: list[dict[int, int]] = []
    while any(left.values()):
        order = sorted(
            (p for p, c in left.items() if c > 0),
            key=lambda p: (-left[p] / capacity[by_pair[p][0]], p),
        )
        sending, receiving, links = set(), set(), set()
        epoch: dict[int, int] = {}
        for p in order:
            if p[0] in sending or p[1] in receiving:
                continue
            for k in by_pair[p]:
                if links.isdisjoint(lanes[k].route.links):
                    epoch[k] = min(capacity[k], left[p])
                    left[p] -= epoch[k]
                    sending.add(p[0])
                    receiving.add(p[1])
                    links.update(lanes[k].route.links)
                    break
        epochs.append(epoch)
    return epochs


def _degree(epochs_of: dict[tuple[int, int], int], n: int) -> int:
    """The most epochs any rank needs: it sends to (receives from) one peer per epoch."""
    out, inn = [0] * n, [0] * n
    for (i, j), e in epochs_of.items():
        out[i] += e
        inn[j] += e
    return max(max(out), max(inn))


def build_epoch_problem(
    demand: np.ndarray,
    model: PathModel,
    network: NetworkModel,
    *,
    tau_s: float,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    flow_bound_s: float = 0.0,
) -> EpochProblem:
    """The CP-SAT model above; K = the greedy schedule's epochs (an optimum never needs more)."""
    demand = np.asarray(demand, dtype=np.int64).copy()
    np.fill_diagonal(demand, 0)
    n = model.topology.num_ranks
    lanes = candidate_lanes(model, demand, network)
    alpha_min = min((lane.alpha_s for lane in lanes), default=0.0)
    capacity = [
        math.floor(lane.route.rate * 1e9 * (tau_s - lane.alpha_s + alpha_min) / chunk_bytes)
        for lane in lanes
    ]
    keep = [m for m, cap in enumerate(capacity) if cap >= 1]
    lanes, capacity = [lanes[m] for m in keep], [capacity[m] for m in keep]
    if {(lane.i, lane.j) for lane in lanes} != set(zip(*np.nonzero(demand), strict=True)):
        raise SolverError(f"epoch {tau_s:g} s is too short to carry one {chunk_bytes}-byte chunk")
    need = {
        (i, j): -(-int(demand[i, j]) // chunk_bytes)
        for i, j in zip(*np.nonzero(demand), strict=False)
    }
    best_cap: dict[tuple[int, int], int] = {}
    for lane, cap in zip(lanes, capacity, strict=True):
        best_cap[(lane.i, lane.j)] = max(best_cap.get((lane.i, lane.j), 0), cap)
    degree = _degree({p: -(-c // best_cap[p]) for p, c in need.items()}, n)
    lower = max(degree, math.ceil(flow_bound_s / tau_s * (1 - 1e-9)))
    greedy = _greedy(lanes, capacity, need)
    horizon = len(greedy)
    sat = cp_model.CpModel()
    y = [sat.new_bool_var(f"y{k}") for k in range(horizon)]
    x = []
    for k in range(horizon):
        z = [sat.new_bool_var(f"z{k}_{m}") for m in range(len(lanes))]
        add_channel_rules(sat, lanes, z, n)
        row = []
        for m, (lane, cap) in enumerate(zip(lanes, capacity, strict=True)):
            top = min(cap, need[(lane.i, lane.j)])
            row.append(sat.new_int_var(0, top, f"x{k}_{m}"))
            sat.add(row[m] <= top * z[m])
            sat.add_implication(z[m], y[k])
        x.append(row)
        if k + 1 < horizon:
            sat.add_implication(y[k + 1], y[k])
    served: dict[tuple[int, int], list] = {}
    for k in range(horizon):
        for m, lane in enumerate(lanes):
            served.setdefault((lane.i, lane.j), []).append(x[k][m])
    for p, terms in served.items():
        sat.add(sum(terms) >= need[p])
    sat.add(sum(y) >= min(lower, horizon))
    sat.minimize(sum(y))
    for k, epoch in enumerate(greedy):
        sat.add_hint(y[k], True)
        for m in range(len(lanes)):
            sat.add_hint(x[k][m], epoch.get(m, 0))
    return EpochProblem(
        demand, tau_s, chunk_bytes, network.barrier_s, lanes, capacity, lower, greedy, sat, x, y
    )


def solve_epoch_problem(
    problem: EpochProblem, *, time_limit_s: float, workers: int = 2
) -> tuple[str, list[dict[int, int]], int]:
    """CP-SAT on the epoch model: (status, per-epoch lane chunks, proven lower bound on the
    epochs). The greedy schedule is returned when the solver finds nothing better in time."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    status = solver.solve(problem.sat)
    lower = problem.lower
    best = problem.greedy
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        lower = max(lower, math.ceil(solver.best_objective_bound - 1e-6))
        found = []
        for k in range(len(problem.y)):
            epoch = {m: v for m, var in enumerate(problem.x[k]) if (v := solver.value(var)) > 0}
            if epoch:
                found.append(epoch)
        if len(found) <= len(best):
            best = found
    lower = min(lower, len(best))
    return ("OPTIMAL" if len(best) <= lower else "FEASIBLE"), best, lower


def epoch_schedule(
    problem: EpochProblem, epochs: list[dict[int, int]], model: PathModel
) -> Schedule:
    """The epochs as a channel schedule: one barrier step per epoch, each lane's bytes its
    chunks × q, the pair's last chunk cut so that the steps sum to D exactly."""
    topo = model.topology
    left = {
        (int(i), int(j)): int(problem.demand[i, j])
        for i, j in zip(*np.nonzero(problem.demand), strict=False)
    }
    steps = []
    for epoch in epochs:
        transfers = []
        for m, chunks in sorted(epoch.items()):
            lane = problem.lanes[m]
            p = (lane.i, lane.j)
            nbytes = min(chunks * problem.chunk_bytes, left[p])
            if nbytes > 0:
                left[p] -= nbytes
                r = lane.route
                transfers.append(
                    Transfer(lane.i, lane.j, lane.path, nbytes, p, r.rate, r.cls, r.staged)
                )
        if transfers:
            steps.append(Step(tuple(transfers)))
    if any(left.values()):
        raise SolverError("the epoch solution does not serve the demand (a solver bug)")
    meta = {"scheduler": "epoch", "epoch_s": problem.tau_s, "chunk_bytes": problem.chunk_bytes}
    return Schedule(topo.num_ranks, steps, topo.fingerprint, problem.lambda_s, "channel", meta)


def epoch_candidates(
    demand: np.ndarray, model: PathModel, network: NetworkModel, count: int = 3
) -> list[float]:
    """Epoch lengths to try, best first by a lower bound on their time: τ = (the longest pair's
    time on its fastest route) / m, m = 1..16, ranked by the degree bound × (λ + τ + α_min)."""
    off = np.asarray(demand, dtype=np.int64).copy()
    np.fill_diagonal(off, 0)
    lanes = candidate_lanes(model, off, network)
    if not lanes:
        return []
    fastest: dict[tuple[int, int], float] = {}
    for lane in lanes:
        fastest[(lane.i, lane.j)] = max(fastest.get((lane.i, lane.j), 0.0), lane.route.rate * 1e9)
    times = {p: off[p] / bw for p, bw in fastest.items()}
    longest = max(times.values())
    alpha_min = min(lane.alpha_s for lane in lanes)
    n = len(off)

    def estimate(tau: float) -> float:
        epochs_of = {p: math.ceil(t / tau * (1 - 1e-12)) for p, t in times.items()}
        return _degree(epochs_of, n) * (network.barrier_s + tau + alpha_min)

    taus = [longest / m for m in range(1, 17)]
    return sorted(taus, key=lambda tau: (estimate(tau), tau))[:count]


def solve_epoch(
    demand: np.ndarray,
    model: PathModel,
    network: NetworkModel,
    *,
    tau_s: float | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    flow_bound_s: float = 0.0,
    time_limit_s: float = 60.0,
    workers: int = 2,
    candidates: int = 3,
) -> EpochResult:
    """The epoch model's optimum at ``tau_s``, or at the best of :func:`epoch_candidates`
    (each solved within its share of ``time_limit_s``; the smallest model time kept, a proven
    one before an unproven one of equal time)."""
    start = time.perf_counter()
    topo = model.topology
    off = np.asarray(demand, dtype=np.int64).copy()
    np.fill_diagonal(off, 0)
    if not off.any():
        meta = {"scheduler": "epoch"}
        empty = Schedule(topo.num_ranks, [], topo.fingerprint, network.barrier_s, "channel", meta)
        return EpochResult(empty, "OPTIMAL", 0.0, 0.0, 0, tau_s or 0.0, chunk_bytes, 0.0)
    taus = [tau_s] if tau_s is not None else epoch_candidates(off, model, network, candidates)
    best: EpochResult | None = None
    with progress.task("epoch model", total=len(taus)) as task:
        for number, tau in enumerate(taus):
            task.update(number, f"epoch model: τ = {tau * 1e6:.2f} µs")
            problem = build_epoch_problem(
                off, model, network, tau_s=tau, chunk_bytes=chunk_bytes, flow_bound_s=flow_bound_s
            )
            remaining = time_limit_s - (time.perf_counter() - start)
            share = max(remaining / (len(taus) - number), 1.0)
            status, epochs, lower = solve_epoch_problem(
                problem, time_limit_s=share, workers=workers
            )
            result = EpochResult(
                epoch_schedule(problem, epochs, model),
                status,
                len(epochs) * problem.epoch_cost_s,
                lower * problem.epoch_cost_s,
                len(epochs),
                tau,
                chunk_bytes,
                0.0,
                {"lower_epochs": problem.lower, "horizon": len(problem.greedy)},
            )
            key = (result.time_s, result.status != "OPTIMAL")
            if best is None or key < (best.time_s, best.status != "OPTIMAL"):
                best = result
            task.update(number + 1)
    if best is None:
        raise SolverError("no epoch length to try")
    best.seconds = time.perf_counter() - start
    best.stats["tried_s"] = [float(t) for t in taus]
    return best
