"""The channel-sequence model (paper §3 Eq. 2) with exactly K activations, searched and bounded
by CP-SAT for every K that could matter: the compact per-slot formulation TE-CCL writes per epoch
(Liu et al., SIGCOMM'24 §4), with free slot durations instead of fixed epochs.

For slots k = 1..K, over the candidate lanes l = (i, j, route) of :mod:`solver.channels`:

    z[k, l] ∈ {0, 1}, x[k, l] ∈ ℕ (bytes), d[k] ∈ ℕ (ns)
    per slot: each rank sends on ≤ 1 lane and receives on ≤ 1; each link of U carries ≤ 1 lane
    x[k, l] ≤ D_ij · z[k, l],   x[k, l] / bw(l) + δ_l · z[k, l] ≤ d[k]     (the slowest lane)
    Σ_{k, l ∋ (i,j)} x[k, l] = D_ij                                        (exact service)
    d[k] ≥ d[k+1]                                                          (symmetry broken)
    d[k] ≥ the k-th of :func:`sorted_durations`;  Σ_k d[k] ≥ L
    minimise K·(λ + α_min) + Σ_k d[k]

δ_l = α_l − α_min (see :mod:`solver.epoch`): the objective is the network model's time of the
schedule (barrier steps, contention-free lanes), what the simulator reports. L is the largest
of the flow-LP bound and each rank's sends (receives) one peer at a time at its fastest rate.

*The bound (per K).* LB_K = K·(λ + α_min) + max(L, Σ sorted_durations(K)), raised to CP-SAT's
proven bound on the model with exactly K slots where it is solved (less K ns for the rounding of
durations), +∞ where CP-SAT proves it infeasible. A schedule with more than
K_max = ⌊(UB − L) / (λ + α_min)⌋ activations costs more than the best found, UB, so
min(UB, min_{K_min ≤ K ≤ K_max} LB_K) is a lower bound on every channel schedule
(K_min: the most peers of any rank, :func:`~solver.milp.min_activations`). CP-SAT searches the
first ``max_solves`` (12) values of K, the smallest LB_K first, pruning every K whose bound meets
the best schedule found and repeating over the K still open while time is left; beyond them LB_K
stays closed-form. Other proven per-K bounds (``lower_k``: the configuration LP's children,
:mod:`solver.colgen`) raise LB_K before the search, so the K they lift to the best known time
are pruned at once. With one worker CP-SAT interleaves its portfolio on the one thread.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from variopath_jax import progress
from variopath_jax.schedule import Schedule, Step, Transfer
from variopath_jax.sim.network import NetworkModel
from variopath_jax.solver.channels import Lane, add_channel_rules, candidate_lanes
from variopath_jax.solver.milp import channel_cpsat, min_activations
from variopath_jax.topology import PathModel

NS = 1e-9


@dataclass
class KSlotProblem:
    """The model with exactly ``slots`` activations for one demand, built but not solved."""

    demand: np.ndarray
    lanes: list[Lane]
    slots: int
    cost_s: float  # λ + α_min
    lower_s: float  # the closed-form LB_K
    sat: cp_model.CpModel
    x: list[list[cp_model.IntVar]]
    d: list[cp_model.IntVar]
    lambda_s: float


@dataclass
class SlotSolve:
    """One K: CP-SAT's status, the objective of its schedule (inf: none) and LB_K."""

    slots: int
    status: str
    objective_s: float
    bound_s: float


@dataclass
class ChannelResult:
    """The channel-sequence model: the best schedule found (None: none beat the warm starts),
    its model time, and the proven lower bound on every channel schedule (see module)."""

    schedule: Schedule | None
    objective_s: float
    bound_s: float
    status: str  # "OPTIMAL" when the bound meets the best schedule, else "FEASIBLE"
    per_k: list[SlotSolve] = field(default_factory=list)
    seconds: float = 0.0


def durations_lower_bound(demand: np.ndarray, lanes: list[Lane], flow_bound_s: float) -> float:
    """Σ of activation durations, at least: the flow LP, and each rank's sends (receives) one
    peer at a time at the pair's fastest rate."""
    fastest: dict[tuple[int, int], float] = {}
    for lane in lanes:
        fastest[(lane.i, lane.j)] = max(fastest.get((lane.i, lane.j), 0.0), lane.route.rate * 1e9)
    n = len(demand)
    out, inn = np.zeros(n), np.zeros(n)
    for (i, j), bw in fastest.items():
        out[i] += demand[i, j] / bw
        inn[j] += demand[i, j] / bw
    return max(flow_bound_s, float(out.max(initial=0)), float(inn.max(initial=0)))


def sorted_durations(demand: np.ndarray, lanes: list[Lane], slots: int) -> np.ndarray:
    """For schedules of exactly ``slots`` activations, durations sorted longest first: the m-th
    is at least max over ranks of t_r(m + K − deg_r), t_r(·) the rank's pair times (fastest
    route) sorted longest first. A rank of deg_r peers splits at most K − deg_r pairs over two or
    more activations, so at least m of its m + K − deg_r longest pairs run whole, in m distinct
    activations (it sends, and receives, one lane per activation)."""
    fastest: dict[tuple[int, int], float] = {}
    for lane in lanes:
        fastest[(lane.i, lane.j)] = max(fastest.get((lane.i, lane.j), 0.0), lane.route.rate * 1e9)
    n = len(demand)
    times = np.zeros((n, n))
    for (i, j), bw in fastest.items():
        times[i, j] = demand[i, j] / bw
    out = np.zeros(slots)
    for matrix in (times, times.T):
        for row in matrix:
            mine = np.sort(row[row > 0])[::-1]
            spare = slots - len(mine)
            if spare < 0:
                continue  # more peers than activations: no such schedule
            for m in range(len(mine) - spare):
                out[m] = max(out[m], mine[m + spare])
    return out


def slots_needed(upper_s: float, cost_s: float, durations_lb_s: float) -> int:
    """K_max: the most activations a schedule faster than ``upper_s`` can have."""
    return max(1, math.floor((upper_s - durations_lb_s) / cost_s + 1e-9))


def build_kslot_problem(
    demand: np.ndarray,
    model: PathModel,
    network: NetworkModel,
    *,
    slots: int,
    flow_bound_s: float = 0.0,
) -> KSlotProblem:
    """The model above with exactly ``slots`` activations."""
    demand = np.asarray(demand, dtype=np.int64).copy()
    np.fill_diagonal(demand, 0)
    n = model.topology.num_ranks
    lanes = candidate_lanes(model, demand, network)
    alpha_min = min(lane.alpha_s for lane in lanes)
    cost_s = network.barrier_s + alpha_min
    ordered = sorted_durations(demand, lanes, slots)
    lower = max(durations_lower_bound(demand, lanes, flow_bound_s), float(ordered.sum()))
    rate = [round(lane.route.rate * 1e3) for lane in lanes]  # MB/s: bytes·1000 ≤ MB/s · ns
    delta = [math.floor((lane.alpha_s - alpha_min) / NS) for lane in lanes]
    d_max = max(
        math.ceil(int(demand[lane.i, lane.j]) * 1000 / r) + dl
        for lane, r, dl in zip(lanes, rate, delta, strict=True)
    )
    sat = cp_model.CpModel()
    d = [sat.new_int_var(0, d_max, f"d{k}") for k in range(slots)]
    x = []
    for k in range(slots):
        z = [sat.new_bool_var(f"z{k}_{m}") for m in range(len(lanes))]
        add_channel_rules(sat, lanes, z, n)
        row = []
        for m, lane in enumerate(lanes):
            need = int(demand[lane.i, lane.j])
            row.append(sat.new_int_var(0, need, f"x{k}_{m}"))
            sat.add(row[m] <= need * z[m])
            sat.add(1000 * row[m] + rate[m] * delta[m] * z[m] <= rate[m] * d[k])
        x.append(row)
        sat.add(d[k] >= math.floor(ordered[k] / NS))
        if k + 1 < slots:
            sat.add(d[k] >= d[k + 1])
    served: dict[tuple[int, int], list] = {}
    for k in range(slots):
        for m, lane in enumerate(lanes):
            served.setdefault((lane.i, lane.j), []).append(x[k][m])
    for (i, j), terms in served.items():
        sat.add(sum(terms) == int(demand[i, j]))
    sat.add(sum(d) >= math.floor(lower / NS))
    sat.minimize(sum(d))
    return KSlotProblem(
        demand, lanes, slots, cost_s, slots * cost_s + lower, sat, x, d, network.barrier_s
    )


def hint_kslot(problem: KSlotProblem, schedule: Schedule) -> bool:
    """Hint a channel schedule (its steps, longest first) if it fits the slots and lanes."""
    by_path = {(lane.i, lane.j, lane.path): m for m, lane in enumerate(problem.lanes)}
    alpha_min = problem.cost_s - problem.lambda_s
    steps = []
    for st in schedule.steps:
        lanes = {}
        for t in st.transfers:
            m = by_path.get((t.src, t.dst, t.path))
            if m is None or m in lanes:
                return False
            lanes[m] = t.nbytes
        alpha = {m: problem.lanes[m].alpha_s - alpha_min for m in lanes}
        rate = {m: problem.lanes[m].route.rate * 1e9 for m in lanes}
        steps.append((max(b / rate[m] + alpha[m] for m, b in lanes.items()), lanes))
    if len(steps) > problem.slots:
        return False
    steps.sort(key=lambda s: -s[0])
    for k in range(problem.slots):
        dur, lanes = steps[k] if k < len(steps) else (0.0, {})
        problem.sat.add_hint(problem.d[k], math.ceil(dur / NS) + 1 if lanes else 0)
        for m, var in enumerate(problem.x[k]):
            problem.sat.add_hint(var, lanes.get(m, 0))
    return True


def solve_kslot_problem(
    problem: KSlotProblem, model: PathModel, *, time_limit_s: float, workers: int = 2
) -> tuple[SlotSolve, Schedule | None]:
    """CP-SAT on one K: LB_K and the schedule of its best solution (None when none)."""
    solver = channel_cpsat(time_limit_s, workers)
    status = solver.solve(problem.sat)
    name = solver.status_name(status)
    fixed = problem.slots * problem.cost_s
    if status == cp_model.INFEASIBLE:
        return SlotSolve(problem.slots, name, math.inf, math.inf), None
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SlotSolve(problem.slots, name, math.inf, problem.lower_s), None
    bound = max(problem.lower_s, fixed + (solver.best_objective_bound - problem.slots) * NS)
    topo = model.topology
    steps = []
    for row in problem.x:
        transfers = []
        for m, var in enumerate(row):
            if (nbytes := solver.value(var)) > 0:
                lane = problem.lanes[m]
                r = lane.route
                pair = (lane.i, lane.j)
                transfers.append(
                    Transfer(lane.i, lane.j, lane.path, nbytes, pair, r.rate, r.cls, r.staged)
                )
        if transfers:
            steps.append(Step(tuple(transfers)))
    meta = {"scheduler": "kslot", "slots": problem.slots}
    schedule = Schedule(topo.num_ranks, steps, topo.fingerprint, problem.lambda_s, "channel", meta)
    objective = fixed + solver.objective_value * NS
    return SlotSolve(problem.slots, name, objective, min(bound, objective)), schedule


def model_time(schedule: Schedule, lanes: list[Lane], lambda_s: float) -> float:
    """A channel schedule's time in this model: Σ_k (λ + max over its lanes of α_l + x / bw);
    inf where a lane is not among ``lanes``."""
    alpha = {(lane.i, lane.j, lane.path): lane.alpha_s for lane in lanes}
    total = 0.0
    for st in schedule.steps:
        keys = [(t.src, t.dst, t.path) for t in st.transfers]
        if any(key not in alpha for key in keys):
            return math.inf
        if keys:
            times = zip(keys, st.transfers, strict=True)
            total += lambda_s + max(alpha[key] + t.nbytes / (t.rate * 1e9) for key, t in times)
    return total


def solve_channel_model(
    demand: np.ndarray,
    model: PathModel,
    network: NetworkModel,
    *,
    upper_s: float,
    warm: list[Schedule] = (),
    flow_bound_s: float = 0.0,
    max_solves: int = 12,
    time_limit_s: float = 60.0,
    workers: int = 2,
    lower_k: dict[int, float] | None = None,
    improve: Callable[[Schedule, int | None], Schedule | None] | None = None,
) -> ChannelResult:
    """LB_K for K = K_min..K_max (closed form), and CP-SAT on each of the first ``max_solves``
    values of K, smallest LB_K first: each solve gets half the time left (the last K all of
    it), in passes over the K still open while time is left, warm-started from the best
    schedule so far where it fits, else from the first of ``warm`` that fits. A K whose bound
    meets the best schedule found is not searched (status "PRUNED": no schedule with K
    activations beats it); the K beyond the first ``max_solves`` keep their closed-form bound,
    status "NOT_SOLVED"; K_max shrinks as better schedules are found. ``upper_s``: the best
    known time. ``lower_k``: other proven bounds on the schedules with exactly K activations
    faster than ``upper_s`` (e.g. the configuration LP's children, :mod:`solver.colgen`), raising
    LB_K where higher: a K they lift to the best schedule is pruned, its time left to the rest.
    ``improve(schedule, slots)``: a search (e.g. :meth:`~solver.swap.SwapSearch.improve`) that
    may turn a schedule CP-SAT found into a faster one (``slots`` None; kept as the best where
    it is, its number of activations may differ), and that reduces the best schedule to K
    activations to hint K where it has more (``slots`` = K); its time (bounded by its own work
    limit) comes on top of ``time_limit_s``, which stays CP-SAT's."""
    start = time.perf_counter()
    improving = 0.0  # seconds spent in ``improve``: not counted against ``time_limit_s``
    off = np.asarray(demand, dtype=np.int64).copy()
    np.fill_diagonal(off, 0)
    lanes = candidate_lanes(model, off, network)
    cost_s = network.barrier_s + min(lane.alpha_s for lane in lanes)
    base = durations_lower_bound(off, lanes, flow_bound_s)
    k_min = min_activations(off)
    best_s, best = upper_s, None

    lifted = lower_k or {}

    def closed(k: int) -> float:
        own = k * cost_s + max(base, float(sorted_durations(off, lanes, k).sum()))
        return max(own, lifted.get(k, 0.0))

    searched = range(k_min, min(slots_needed(best_s, cost_s, base), k_min + max_solves - 1) + 1)
    lb = {k: closed(k) for k in searched}
    results: dict[int, SlotSolve] = {}
    # most promising K first (smallest LB_K): a good schedule found early prunes every K whose
    # bound it meets, and the time goes to the K that can still beat it; passes repeat over the
    # K still open (neither proven nor pruned) while time is left, each warm-started from the
    # best schedule so far where it fits
    open_k = sorted(searched, key=lambda k: (lb[k], k))
    with progress.task("channel model, per K", total=max(len(open_k), 0)) as task:
        first = True
        while open_k and (first or time_limit_s - (time.perf_counter() - start - improving) >= 1.0):
            order = list(open_k)
            for index, k in enumerate(order):
                known = results.get(k)
                floor = max(lb[k], known.bound_s if known else 0.0)
                if k > slots_needed(best_s, cost_s, base) or floor >= best_s * (1 - 1e-9):
                    results[k] = known or SlotSolve(k, "PRUNED", math.inf, lb[k])
                    open_k.remove(k)  # no schedule with K activations beats the best found
                    continue
                left = time_limit_s - (time.perf_counter() - start - improving)
                if not first and left < 1.0:
                    break
                task.update(len(results), f"channel model: K = {k} activations")
                problem = build_kslot_problem(
                    off, model, network, slots=k, flow_bound_s=flow_bound_s
                )
                # the best so far, else it reduced to K activations by ``improve``, else the
                # first warm schedule that fits; none may
                first_choice = best if best is not None else next(iter(warm), None)
                if first_choice is None or not hint_kslot(problem, first_choice):
                    clock = time.perf_counter()
                    fitted = improve(first_choice, k) if improve and first_choice else None
                    improving += time.perf_counter() - clock
                    hints = [fitted, *warm] if fitted is not None else warm
                    any(hint_kslot(problem, h) for h in hints)
                # half of what is left to the most promising K still to go (all of it to the
                # last): a schedule found there prunes the K behind it
                behind = any(q in open_k for q in order[index + 1 :])
                share = max(left / 2 if behind else left, 1.0)
                result, schedule = solve_kslot_problem(
                    problem, model, time_limit_s=share, workers=workers
                )
                lifted_k = min(max(result.bound_s, lb[k]), result.objective_s)
                result = SlotSolve(k, result.status, result.objective_s, lifted_k)
                if known is not None:  # every solve's bound holds: keep the best of each
                    result = SlotSolve(
                        k,
                        result.status,
                        min(result.objective_s, known.objective_s),
                        max(result.bound_s, known.bound_s),
                    )
                results[k] = result
                if result.status in ("OPTIMAL", "INFEASIBLE"):
                    open_k.remove(k)
                if schedule is not None and result.objective_s < best_s:
                    best_s, best = result.objective_s, schedule
                clock = time.perf_counter()
                better = improve(schedule, None) if improve and schedule is not None else None
                improving += time.perf_counter() - clock
                if (
                    better is not None
                    and (faster := model_time(better, lanes, network.barrier_s)) < best_s
                ):
                    best_s, best = faster, better
            first = False
        task.update(len(results))
    per_k: list[SlotSolve] = []
    for k in range(k_min, slots_needed(best_s, cost_s, base) + 1):
        if k in results:
            per_k.append(results[k])
        else:  # beyond the first max_solves values (or not reached): the closed form only
            per_k.append(SlotSolve(k, "NOT_SOLVED", math.inf, closed(k)))
    bound = min([best_s, *(r.bound_s for r in per_k)])
    status = "OPTIMAL" if bound >= best_s * (1 - 1e-6) else "FEASIBLE"
    return ChannelResult(best, best_s, bound, status, per_k, time.perf_counter() - start)


def refine_channel_schedule(
    demand: np.ndarray,
    model: PathModel,
    network: NetworkModel,
    schedule: Schedule,
    *,
    improve: Callable[[Schedule, int | None], Schedule | None] | None = None,
    flow_bound_s: float = 0.0,
    time_limit_s: float = 30.0,
    workers: int = 2,
) -> Schedule | None:
    """A schedule search (no bound) from a good channel schedule of K activations: rounds of
    CP-SAT on the K-slot model, hinted, alternately with the best schedule's own K (hinted with
    it) and with one activation fewer (hinted with ``improve(best, K − 1)``, e.g. the swap
    search's reduction), each followed by ``improve`` on what it found; each round half of the
    time left, until two rounds in a row gain nothing. None where nothing faster than
    ``schedule`` turned up. The hint matters more than the time: at 64 MiB seed 1, K = 9, hinted
    with the swap search's 2,144.0 µs, 15 s found 2,084.2 µs (an ad-hoc script; docs/solver.md)."""
    start = time.perf_counter()
    off = np.asarray(demand, dtype=np.int64).copy()
    np.fill_diagonal(off, 0)
    lanes = candidate_lanes(model, off, network)
    current, current_s = schedule, model_time(schedule, lanes, network.barrier_s)
    best, idle = None, 0
    for fewer in itertools.cycle((False, True)):
        left = time_limit_s - (time.perf_counter() - start)
        if idle == 2 or left < 1.0:
            break
        idle += 1
        slots = len(current.steps) - fewer
        hint = current if not fewer else improve(current, slots) if improve and slots else None
        if hint is None:
            continue
        problem = build_kslot_problem(off, model, network, slots=slots, flow_bound_s=flow_bound_s)
        if not hint_kslot(problem, hint):
            continue
        _, found = solve_kslot_problem(
            problem, model, time_limit_s=max(left / 2, 1.0), workers=workers
        )
        if found is None:
            continue
        further = improve(found, None) if improve is not None else None
        candidates = [s for s in (found, further) if s is not None]
        timed = [(model_time(s, lanes, network.barrier_s), s) for s in candidates]
        found_s, found = min(timed, key=lambda f: f[0])
        if found_s < current_s * (1 - 1e-4):
            current, current_s, best, idle = found, found_s, found, 0
    return best
