"""The MILP optimum of the paper's execution model (§3 Eq. 2; §6.3 "Scheduler quality").

The paper follows TE-CCL (Liu et al., SIGCOMM'24) and jointly optimises, for activations
k = 1..K, peer matching, one path per lane, bytes per lane and durations, minimising
Σ_k (λ + duration_k). Written that way the model needs a bound on K and is riddled with symmetry
(any reordering of activations is another optimum). We solve an exact reformulation instead:

    minimise   Σ_C (c·u_C + t_C)
    subject to Σ_{C ∋ (i,j)} bw_C(i,j) · t_C ≥ D_ij        for every pair (bytes served)
               Σ_{C ∋ (i,j)} u_C ≥ 1                        for every pair with D_ij > 0
               0 ≤ t_C ≤ T_C · u_C,   u_C ∈ {0, 1}

over a pool of concrete channels C (:mod:`solver.channels`), with t_C the activation's duration,
c = λ + α its fixed cost (the simulator's per-step cost, so the objective is the simulated time),
and T_C = max over C's lanes of D_ij / bw_C(i,j) (running a channel longer never helps).

*Equivalence.* A schedule of K activations maps to a solution of no higher cost: activating one
channel twice is never better than once for the summed duration (it saves c), so the activations
may be merged per channel, and the bytes each lane carried fit in bw·t. Conversely every solution
is a schedule: one activation per used channel, bytes split so that Σ = D exactly. No bound on K
is needed and activation order, which does not change the objective, is gone from the model:
that is the symmetry breaking.

*The pool.* On one node of at most 8 GPUs the pool is every maximal partial channel
(:func:`~solver.channels.enumerate_channels`; every channel an activation may use is a subset of
one, idle lanes cost nothing), so a certified optimum of the pool is the optimum of the
execution model. Larger topologies use column generation: the LP relaxation with c = 0
(the time-sharing LP over channels) is solved with GLOP, and CP-SAT prices new channels against
its duals (:func:`~solver.channels.price_channel`) until none improves; that LP's value plus
c × (the most distinct peers of any rank, a lower bound on the number of activations) is a
valid lower bound, and the MILP over the generated pool gives the upper bound. The warm start's
activations (VarioPath's schedule, usually) are always in the pool, so the MILP is never worse.

*Solver.* OR-Tools CP-SAT, times in integer nanoseconds and rates in integer MB/s: on an 8-GPU
instance it improved on the warm start where SCIP (through ``pywraplp``) did not; neither proves
optimality at 8 GPUs within a minute (docs/solver.md has the measurement). ``backend="SCIP"``
(or any ``pywraplp`` MIP backend) is kept for comparison.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

from variopath_jax import progress
from variopath_jax.schedule import Schedule, Step, Transfer
from variopath_jax.solver.channels import Channel, SolverError, enumerate_channels, price_channel
from variopath_jax.topology import PathModel


@dataclass
class MilpResult:
    """What a MILP solve found.

    Attributes
    ----------
    schedule : Schedule
        The best solution, as a channel schedule (empty for an all-zero demand).
    status : str
        "OPTIMAL" (certified for the execution model) or "FEASIBLE" (time limit or restricted
        pool: ``gap`` says how far from the bound). The best of the solver's solution, the LP
        relaxation's channels activated once each, and the warm start is returned.
    objective_s : float
        Σ (c + t) of the solution (= its simulated time with the same λ and α).
    bound_s : float
        A lower bound on every schedule of the execution model.
    pool : int
        Channels the MILP chose from; ``complete_pool`` says whether that is every channel.
    """

    schedule: Schedule
    status: str
    objective_s: float
    bound_s: float
    pool: int
    complete_pool: bool
    backend: str
    seconds: float
    stats: dict = field(default_factory=dict)

    @property
    def gap(self) -> float:
        """Relative gap (objective − bound) / objective."""
        if self.objective_s <= 0:
            return 0.0
        return max(0.0, (self.objective_s - self.bound_s) / self.objective_s)


def channels_of(schedule: Schedule) -> list[Channel]:
    """The concrete channel every activation of a schedule uses (direct transfers only)."""
    out = []
    for step in schedule.steps:
        lanes = sorted(step.transfers, key=lambda t: (t.src, t.dst))
        out.append(
            Channel(
                tuple((t.src, t.dst) for t in lanes),
                tuple(t.path for t in lanes),
                tuple(t.rate for t in lanes),
                tuple(t.cls for t in lanes),
            )
        )
    return out


def min_activations(demand: np.ndarray) -> int:
    """A lower bound on the activations of any channel schedule: each rank sends to and receives
    from one peer per activation."""
    nz = (demand > 0) & ~np.eye(len(demand), dtype=bool)
    return int(max(nz.sum(axis=1).max(initial=0), nz.sum(axis=0).max(initial=0)))


def _covers(pool: list[Channel], demand: np.ndarray) -> bool:
    """Whether the channels of ``pool`` hold every pair with demand (and no other)."""
    have = {p for ch in pool for p in ch.pairs}
    return have == {tuple(int(x) for x in p) for p in np.argwhere(demand > 0)}


def _useful(channels: list[Channel], demand: np.ndarray) -> list[Channel]:
    """Channels restricted to lanes with demand, empty ones dropped, duplicates merged."""
    seen: dict[tuple, Channel] = {}
    for ch in channels:
        keep = [k for k, (i, j) in enumerate(ch.pairs) if demand[i, j] > 0]
        if not keep:
            continue
        sub = Channel(
            tuple(ch.pairs[k] for k in keep),
            tuple(ch.paths[k] for k in keep),
            tuple(ch.rates[k] for k in keep),
            tuple(ch.classes[k] for k in keep),
        )
        seen.setdefault((sub.pairs, sub.rates), sub)
    return list(seen.values())


@dataclass
class ChannelLp:
    """The time-sharing LP over channels: a lower bound, the (grown) pool, whether pricing proved
    the LP optimal over every channel, and its solution as channel key → duration (seconds)."""

    bound_s: float
    pool: list[Channel]
    proven: bool
    durations: dict[tuple, float]


def channel_lp(
    demand: np.ndarray,
    model: PathModel | None,
    pool: list[Channel],
    *,
    price: bool = True,
    time_limit_s: float = 60.0,
    max_rounds: int = 500,
) -> ChannelLp:
    """The time-sharing LP over channels (c = 0): GLOP over ``pool``, and with ``price`` column
    generation with CP-SAT pricing over every channel of ``model``; without, ``pool`` must be
    every channel for the value to be a bound (``model`` unused)."""
    start = time.perf_counter()
    n = len(demand)
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j and demand[i, j] > 0]
    pool = _useful(pool, demand)
    best_bound = 0.0
    for _ in range(max_rounds):
        lp = pywraplp.Solver.CreateSolver("GLOP")
        t = [lp.NumVar(0, lp.infinity(), "") for _ in pool]
        rows = {p: lp.Constraint(demand[p] / 1e3, lp.infinity()) for p in pairs}  # kB
        for var, ch in zip(t, pool, strict=True):
            for p, rate in zip(ch.pairs, ch.rates, strict=True):
                if p in rows:
                    rows[p].SetCoefficient(var, rate)  # GB/s × µs = kB
        lp.Minimize(sum(t))
        if lp.Solve() != pywraplp.Solver.OPTIMAL:
            raise SolverError("the channel LP has no solution: some pair has no channel")
        value_us = lp.Objective().Value()
        durations = {
            (ch.pairs, ch.rates): var.solution_value() * 1e-6
            for var, ch in zip(t, pool, strict=True)
            if var.solution_value() > 1e-9
        }
        if not price:  # the pool is every channel: its LP value is the bound
            return ChannelLp(value_us * 1e-6, pool, True, durations)
        duals = np.zeros((n, n))
        for p, row in rows.items():
            duals[p] = max(row.dual_value(), 0.0)
        remaining = time_limit_s - (time.perf_counter() - start)
        best, channel, proven = price_channel(model, duals, time_limit_s=max(remaining, 1.0))
        if proven and best > 0:  # Farley: duals / best is dual feasible over all channels
            best_bound = max(best_bound, value_us / max(best, 1.0) * 1e-6)
        if channel is None or best <= 1.0 + 1e-7 or remaining <= 0:
            return ChannelLp(best_bound, pool, proven and best <= 1.0 + 1e-7, durations)
        pool += _useful([channel], demand)
    return ChannelLp(best_bound, pool, False, durations)


def solve_milp(
    demand: np.ndarray,
    model: PathModel,
    *,
    lambda_s: float,
    alpha_s: float = 0.0,
    warm: Schedule | None = None,
    time_limit_s: float = 60.0,
    backend: str = "CP-SAT",
    workers: int = 2,
) -> MilpResult:
    """The minimum Σ (λ + α + duration) schedule of the paper's execution model (see module)."""
    start = time.perf_counter()
    demand = np.asarray(demand, dtype=np.int64)
    topo = model.topology
    n = topo.num_ranks
    cost_s = lambda_s + alpha_s
    off = demand.copy()
    np.fill_diagonal(off, 0)
    if not off.any():
        empty = Schedule(n, [], topo.fingerprint, lambda_s, "channel", {"scheduler": "milp"})
        return MilpResult(empty, "OPTIMAL", 0.0, 0.0, 0, True, backend, 0.0)
    warm_channels = channels_of(warm) if warm is not None else []
    complete = topo.nodes == 1 and n <= 8
    stats: dict = {}
    if complete:
        with progress.task("MILP: the channel LP over every channel"):
            relaxed = channel_lp(off, model, enumerate_channels(model) + warm_channels, price=False)
    else:
        if not warm_channels:
            raise SolverError("column generation needs a warm start (a schedule) to begin from")
        with progress.task("MILP: the channel LP by column generation"):
            relaxed = channel_lp(off, model, warm_channels, time_limit_s=time_limit_s / 2)
        stats["lp_proven"] = relaxed.proven
    pool = relaxed.pool
    bound = relaxed.bound_s + cost_s * min_activations(off)
    # Two starting points: the warm start, and the LP's own solution (every channel it uses
    # activated once), far better at large payloads where λ matters little. Hint the cheaper.
    hints = [_durations(warm), relaxed.durations]
    hint = min(hints, key=lambda h: sum(h.values()) + cost_s * len(h) if h else math.inf)
    stats["setup_s"] = time.perf_counter() - start
    remaining = max(time_limit_s - stats["setup_s"], 1.0)
    solve = _solve_cpsat if backend == "CP-SAT" else _solve_mip
    with progress.task(f"MILP over {len(pool):,} channels ({backend}, limit {remaining:.0f} s)"):
        chosen, objective_bound_s, optimal = solve(
            off, pool, cost_s, hint, remaining, backend, workers
        )
    # A solver may drop a hint it cannot repair: the starting points stay candidates.
    candidates = _found(chosen, pool, relaxed.durations, off, topo.fingerprint, lambda_s, n)
    if warm is not None:
        candidates.append(
            schedule_of(list(_hint_channels(warm, off)), off, topo.fingerprint, lambda_s, n)
        )
    schedule = min(candidates, key=lambda c: c.modeled_time(alpha_s))
    optimal = optimal and schedule is candidates[0]
    objective = schedule.modeled_time(alpha_s)
    if complete:
        bound = max(bound, objective_bound_s)
    status = "OPTIMAL" if complete and optimal else "FEASIBLE"
    if status == "OPTIMAL":
        bound = min(bound, objective)
    stats["milp_bound_s"] = objective_bound_s
    return MilpResult(
        schedule,
        status,
        objective,
        bound,
        len(pool),
        complete,
        backend,
        time.perf_counter() - start,
        stats,
    )


def search_pool(
    demand: np.ndarray,
    model: PathModel,
    channels: list[Channel],
    *,
    lambda_s: float,
    alpha_s: float = 0.0,
    warm: list[Schedule] = (),
    time_limit_s: float = 60.0,
    workers: int = 2,
) -> Schedule | None:
    """A schedule search, no bound: the pool model of this module (CP-SAT) over a small pool,
    ``channels`` (e.g. those column generation found useful,
    :attr:`~solver.colgen.ColgenBound.channels`) plus the channels of the ``warm`` schedules,
    hinted with the cheaper of the best warm schedule and the pool's LP solution. Its LP and
    MILP bounds are over a restricted pool and bound nothing: only the schedule is returned
    (the best of CP-SAT's, the LP's channels once each and the warm schedules), None when the
    pool does not cover every pair."""
    off = np.asarray(demand, dtype=np.int64).copy()
    np.fill_diagonal(off, 0)
    topo = model.topology
    n = topo.num_ranks
    if not off.any():
        return None
    pool = list(channels)
    for schedule in warm:
        pool += channels_of(schedule)
    pool = _useful(pool, off)
    if not _covers(pool, off):
        return None
    relaxed = channel_lp(off, model, pool, price=False)  # over this pool only: a hint, no bound
    cost_s = lambda_s + alpha_s
    best_warm = min(warm, key=lambda s: s.modeled_time(alpha_s), default=None)
    hints = [_durations(best_warm), relaxed.durations]
    hint = min(hints, key=lambda h: sum(h.values()) + cost_s * len(h) if h else math.inf)
    chosen, _, _ = _solve_cpsat(off, relaxed.pool, cost_s, hint, time_limit_s, "CP-SAT", workers)
    candidates = _found(chosen, relaxed.pool, relaxed.durations, off, topo.fingerprint, lambda_s, n)
    for schedule in candidates:
        schedule.meta["scheduler"] = "colgen-pool"
    return min([*candidates, *warm], key=lambda c: c.modeled_time(alpha_s))


def polish(
    channels: list[Channel], demand: np.ndarray, fingerprint: str, lambda_s: float
) -> Schedule | None:
    """The schedule of ``channels`` once each, their durations by the time-sharing LP over
    them alone (:func:`channel_lp`: Σ t least, bytes moved between a pair's channels, a channel
    of no use left out); None when they do not cover every pair. A schedule, no bound."""
    off = np.asarray(demand, dtype=np.int64).copy()
    np.fill_diagonal(off, 0)
    pool = _useful(channels, off)
    if not _covers(pool, off):
        return None
    relaxed = channel_lp(off, None, pool, price=False)
    by_key = {(ch.pairs, ch.rates): ch for ch in relaxed.pool}
    chosen = [(by_key[k], t) for k, t in relaxed.durations.items()]
    return schedule_of(chosen, off, fingerprint, lambda_s, len(off))


def _found(
    chosen: list | None,
    pool: list[Channel],
    durations: dict,
    off: np.ndarray,
    fingerprint: str,
    lambda_s: float,
    n: int,
) -> list[Schedule]:
    """The schedules a pool solve found: the MILP's (if any) and the LP's channels once each
    (``durations``, keyed by a pool channel's pairs and rates)."""
    by_key = {(ch.pairs, ch.rates): ch for ch in pool}
    out = [schedule_of(chosen, off, fingerprint, lambda_s, n)] if chosen else []
    out.append(
        schedule_of([(by_key[k], t) for k, t in durations.items()], off, fingerprint, lambda_s, n)
    )
    return out


def _upper(ch: Channel, demand: np.ndarray) -> float:
    """T_C in seconds: the longest a channel can usefully run."""
    return max(demand[p] / (rate * 1e9) for p, rate in zip(ch.pairs, ch.rates, strict=True))


def channel_cpsat(time_limit_s: float, workers: int) -> cp_model.CpSolver:
    """CP-SAT as the channel-model searches run it (the channel pool, the K-slot model): seeded,
    and with one worker its portfolio (LNS included) interleaved on that one thread, which found
    413.3 µs on 8 MiB seed 0, K = 8, in 15 s where the lone default search kept VarioPath's
    542.2 µs (issue 31; docs/solver.md)."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    solver.parameters.interleave_search = workers == 1
    solver.parameters.random_seed = 0
    return solver


def _solve_cpsat(demand, pool, cost_s, warm, time_limit_s, _backend, workers):
    """CP-SAT with t in integer ns and rates in integer MB/s (bytes scaled by 1e3 to match)."""
    sat = cp_model.CpModel()
    cost_ns = round(cost_s * 1e9)
    u = [sat.new_bool_var(f"u{k}") for k in range(len(pool))]
    upper_ns = [math.ceil(_upper(ch, demand) * 1e9) for ch in pool]
    t = [sat.new_int_var(0, upper, f"t{k}") for k, upper in enumerate(upper_ns)]
    for k, upper in enumerate(upper_ns):
        sat.add(t[k] <= upper * u[k])
    served: dict[tuple[int, int], list] = {}
    used: dict[tuple[int, int], list] = {}
    for k, ch in enumerate(pool):
        for p, rate in zip(ch.pairs, ch.rates, strict=True):
            served.setdefault(p, []).append(math.floor(rate * 1e3) * t[k])  # MB/s × ns
            used.setdefault(p, []).append(u[k])
    for p, terms in served.items():
        sat.add(sum(terms) >= int(demand[p]) * 1000)
        sat.add_bool_or(used[p])
    if set(served) != {tuple(p) for p in np.argwhere(demand > 0)}:
        raise SolverError("some pair with demand is on no channel of the pool")
    sat.add(sum(u) >= min_activations(demand))
    sat.minimize(sum(t) + cost_ns * sum(u))
    for k in range(len(pool)):
        dur = warm.get((pool[k].pairs, pool[k].rates))
        sat.add_hint(u[k], dur is not None)
        # 1e-4 of slack absorbs the rounding of rates to MB/s, so the hint stays feasible
        sat.add_hint(t[k], 0 if dur is None else min(math.ceil(dur * 1.0001e9), upper_ns[k]))
    solver = channel_cpsat(time_limit_s, workers)
    status = solver.solve(sat)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return [], 0.0, False
    chosen = [(pool[k], solver.value(t[k]) * 1e-9) for k in range(len(pool)) if solver.value(u[k])]
    # Rates rounded down to MB/s make this model at most ~1e-4 slower than the real one, so its
    # bound is lowered by that much to stay a bound on the real model.
    return chosen, solver.best_objective_bound * 1e-9 * (1 - 1e-4), status == cp_model.OPTIMAL


def _solve_mip(demand, pool, cost_s, warm, time_limit_s, backend, workers):
    """The same model with a ``pywraplp`` MIP backend (SCIP, CBC, HiGHS), t in µs."""
    mip = pywraplp.Solver.CreateSolver(backend)
    if mip is None:
        raise SolverError(f"OR-Tools has no MIP backend {backend!r}")
    mip.SetTimeLimit(int(time_limit_s * 1000))
    mip.SetNumThreads(workers)
    cost_us = cost_s * 1e6
    u = [mip.BoolVar(f"u{k}") for k in range(len(pool))]
    t = []
    for k, ch in enumerate(pool):
        upper = _upper(ch, demand) * 1e6
        t.append(mip.NumVar(0, upper, f"t{k}"))
        mip.Add(t[k] <= upper * u[k])
    served: dict[tuple[int, int], list] = {}
    used: dict[tuple[int, int], list] = {}
    for k, ch in enumerate(pool):
        for p, rate in zip(ch.pairs, ch.rates, strict=True):
            served.setdefault(p, []).append(rate * t[k])  # GB/s × µs = kB
            used.setdefault(p, []).append(u[k])
    for p, terms in served.items():
        mip.Add(sum(terms) >= demand[p] / 1e3)
        mip.Add(sum(used[p]) >= 1)
    mip.Add(sum(u) >= min_activations(demand))
    mip.Minimize(sum(t) + cost_us * sum(u))
    hint_vars, hint_vals = [], []
    for k, ch in enumerate(pool):
        dur = warm.get((ch.pairs, ch.rates))
        hint_vars += [u[k], t[k]]
        hint_vals += [
            float(dur is not None),
            0.0 if dur is None else min(dur, _upper(ch, demand)) * 1e6,
        ]
    mip.SetHint(hint_vars, hint_vals)
    status = mip.Solve()
    if status not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return [], 0.0, False
    chosen = [
        (pool[k], t[k].solution_value() * 1e-6)
        for k in range(len(pool))
        if u[k].solution_value() > 0.5
    ]
    return chosen, mip.Objective().BestBound() * 1e-6, status == pywraplp.Solver.OPTIMAL


def _hint_channels(warm: Schedule, demand: np.ndarray):
    """The warm start's channels (restricted to lanes with demand) with their durations."""
    for ch, step in zip(channels_of(warm), warm.steps, strict=True):
        for sub in _useful([ch], demand):
            yield sub, max(t.nbytes / (t.rate * 1e9) for t in step.transfers)


def _durations(warm: Schedule | None) -> dict[tuple, float]:
    """The warm start as channel → its summed activation durations (the MILP's hint)."""
    out: dict[tuple, float] = {}
    if warm is None:
        return out
    for ch, step in zip(channels_of(warm), warm.steps, strict=True):
        dur = max(t.nbytes / (t.rate * 1e9) for t in step.transfers)
        out[(ch.pairs, ch.rates)] = out.get((ch.pairs, ch.rates), 0.0) + dur
    return out


def schedule_of(
    chosen: list[tuple[Channel, float]],
    demand: np.ndarray,
    fingerprint: str,
    lambda_s: float,
    n: int,
) -> Schedule:
    """One activation per chosen channel; each pair's bytes split over its channels in
    proportion to their capacity bw·t (largest remainder), so the activations sum to D."""
    chosen = sorted(chosen, key=lambda c: (-c[1], c[0].pairs, c[0].rates))
    caps: dict[tuple[int, int], list[tuple[int, int, float]]] = {}
    for k, (ch, dur) in enumerate(chosen):
        for lane, (p, rate) in enumerate(zip(ch.pairs, ch.rates, strict=True)):
            caps.setdefault(p, []).append((k, lane, rate * 1e9 * dur))
    nbytes: dict[tuple[int, int], int] = {}
    for p, entries in caps.items():
        total = sum(c for *_, c in entries) or 1.0
        share = [int(demand[p]) * c / total for *_, c in entries]
        parts = [math.floor(s) for s in share]
        order = sorted(range(len(parts)), key=lambda m: (parts[m] - share[m], m))
        for m in order[: int(demand[p]) - sum(parts)]:
            parts[m] += 1
        for (k, lane, _), part in zip(entries, parts, strict=True):
            nbytes[(k, lane)] = part
    steps = []
    for k, (ch, _) in enumerate(chosen):
        transfers = tuple(
            Transfer(
                p[0], p[1], ch.paths[lane], nbytes[(k, lane)], p, ch.rates[lane], ch.classes[lane]
            )
            for lane, p in enumerate(ch.pairs)
            if nbytes[(k, lane)] > 0
        )
        if transfers:
            steps.append(Step(transfers))
    return Schedule(n, steps, fingerprint, lambda_s, "channel", {"scheduler": "milp"})
