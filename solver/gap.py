"""The optimality-gap study (paper §6.3, Figure 12), with two oracles, on dense Zipf demands.
``variopath gap`` runs it.

Per instance, every time simulated under one network model:

- **VarioPath**: ``variopath-paper`` (Algorithm 2, ``variopath_s``) and ``variopath`` with its
  plans built whatever their planning costs (``variopath_tuned_s``; ``options={"hybrid":
  "all"}``).
- **The epoch model** (:mod:`solver.epoch`, TE-CCL's fixed epochs and chunks): its optimum
  ``epoch_opt_s`` at epoch length ``epoch_s``, ``epoch_status`` "OPTIMAL" only when CP-SAT proved
  it (``epoch_bound_s``: the proven lower bound at that epoch length); ``ratio`` =
  ``epoch_opt_s / variopath_s`` (VarioPath's bandwidth over the epoch optimum's).
- **The channel-sequence model** (the continuous execution model, paper Eq. 2): the best schedule
  found (``channel_best_s``: the K-slot model solved for each activation count K at small
  payloads, :mod:`solver.kslot`, for the first ``max_solves`` values of K, and the channel pool
  where more K remain, :mod:`solver.milp`, dives on the configuration LP, VarioPath's
  and the epoch schedules too, each improved by the swap search, :mod:`solver.swap`, which also
  hints the K-slot searches, and the best of them refined by CP-SAT at its own K and one fewer,
  :func:`~solver.kslot.refine_channel_schedule`) and a proven lower bound ``channel_bound_s``
  on every channel schedule (per-K bounds, the channel pool's and the configuration LP's by
  column generation, ``channel_config_s``, :mod:`solver.colgen`, branched on K: per K the
  largest of the K-slot model's bound and the child LP's, the least over K), hence
  ``channel_gap``.
- **The hybrid model** (:mod:`solver.hybrid_milp`, the phase model of :mod:`solver.phases`,
  exclusive links per the network model's ``paced_lossless`` rule): the simulated time of its best
  schedule ``hybrid_opt_s``, its model time ``hybrid_model_s`` (λ + Σ t_k), ``hybrid_status``
  ("OPTIMAL" only when SCIP proved it) and ``hybrid_bound_s`` (the proven bound on the model time
  of every assignment with at most ``hybrid_phases`` phases); ``variopath_of_hybrid`` =
  ``hybrid_opt_s / variopath_tuned_s``; ``hybrid_any_k_bound_s`` bounds the model time whatever
  the number of phases (all phases merged, nothing exclusive: the paced LP), so an optimum that
  meets it is optimal for every K (``hybrid_any_k`` counts them).
- **What the op runs** (``variopath_op_s``, ``variopath_op_plan``, ``variopath_op_core_s``): the
  C++ core's choice, as ``execution="planned"`` makes it (``chained`` and Algorithm 2's plans only
  where the gates expect them to pay for their planning), its simulated time, plan and planning
  time in C++; ``op_of_hybrid`` = ``hybrid_opt_s / variopath_op_s``.
- ``bound_s``: the flow-LP bound on every schedule (:mod:`solver.bound`).

``oracles`` chooses which of ``epoch``, ``channel`` and ``hybrid`` run (the channel model needs
the epoch schedule); the fields of one not run are NaN (``null`` in JSON), its status
"NOT_RUN".

Proven inequalities: ``channel_bound_s ≤ channel_best_s ≤ epoch_sim_s ≤ epoch_opt_s`` and
``channel_bound_s ≤ variopath_s`` (a channel schedule); ``bound_s`` bounds every schedule.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from variopath_jax import progress, workloads
from variopath_jax.runner import RunResult, run_one
from variopath_jax.schedule import Schedule, validate
from variopath_jax.sim import DEFAULT_COALESCE, PCIE, FluidSimulator, NetworkModel
from variopath_jax.solver.bound import lower_bound
from variopath_jax.solver.channels import candidate_lanes
from variopath_jax.solver.colgen import ColgenBound, channel_config_bound
from variopath_jax.solver.epoch import solve_epoch
from variopath_jax.solver.hybrid_milp import solve_hybrid
from variopath_jax.solver.kslot import refine_channel_schedule, solve_channel_model
from variopath_jax.solver.milp import polish, schedule_of, search_pool, solve_milp
from variopath_jax.solver.swap import SwapSearch
from variopath_jax.topology import PathModel, Topology

PAPER = {"mean_ratio": 0.9918, "worst_ratio": 0.9192, "certified": "all"}


@dataclass
class GapRow:
    """One instance (times in seconds; see the module for every field's meaning)."""

    mib_per_rank: float
    seed: int
    variopath_s: float
    variopath_tuned_s: float
    variopath_activations: int
    epoch_opt_s: float
    epoch_status: str
    epoch_s: float
    epoch_bound_s: float  # proven lower bound of the epoch model at epoch_s
    epoch_sim_s: float
    epochs: int
    epoch_seconds: float
    channel_best_s: float
    channel_bound_s: float
    channel_gap: float
    channel_solver: str  # "kslot" (every K solved) or "kslot+pool" (K beyond the first
    # max_solves left to the channel pool)
    channel_status: str  # "OPTIMAL" when the best schedule meets the proven bound
    # the best schedule's source: kslot, pool, dive, colgen, epoch or variopath
    channel_source: str
    channel_seconds: float
    bound_s: float
    ratio: float
    ratio_tuned: float
    variopath_of_channel: float
    variopath_of_bound: float
    hybrid_opt_s: float = math.nan  # simulated time of the hybrid model's best schedule
    hybrid_model_s: float = math.nan  # its model time λ + Σ t_k
    hybrid_status: str = "NOT_RUN"
    hybrid_bound_s: float = math.nan  # proven bound on the model time (≤ K phases)
    hybrid_phases: int = 0
    hybrid_seconds: float = 0.0
    variopath_of_hybrid: float = math.nan  # hybrid_opt_s / variopath_tuned_s
    channel_config_s: float = math.nan  # the configuration LP's bound (solver/colgen.py)
    hybrid_any_k_bound_s: float = math.nan  # the hybrid model's bound for any number of phases
    variopath_op_s: float = math.nan  # the op's plan (the C++ core's choice), simulated
    variopath_op_plan: str = ""  # its plan family
    variopath_op_core_s: float = math.nan  # its planning in the C++ core
    op_of_hybrid: float = math.nan  # hybrid_opt_s / variopath_op_s


ORACLES = ("epoch", "channel", "hybrid")


def run_gap(
    topo: Topology,
    sizes_mib: list[float],
    seeds: int,
    *,
    skew: float = 0.6,
    time_limit_s: float = 60.0,
    max_solves: int = 12,
    backend: str = "CP-SAT",
    coalesce: float = DEFAULT_COALESCE,
    network: NetworkModel = PCIE,
    workers: int = 2,
    oracles: tuple[str, ...] = ORACLES,
) -> list[GapRow]:
    """The study on ``seeds`` Zipf(``skew``) demands per size (MiB per rank); ``time_limit_s``
    per solve (the epoch model, then the channel model: the K-slot model on each K when there
    are at most ``max_solves`` of them, else the channel pool; the hybrid model). ``oracles``:
    which of :data:`ORACLES` run ("channel" needs "epoch")."""
    unknown = set(oracles) - set(ORACLES)
    if unknown or ("channel" in oracles and "epoch" not in oracles):
        raise ValueError(f"oracles {oracles!r}: choose among {ORACLES}; channel needs epoch")
    model = PathModel(topo)
    sim = FluidSimulator(topo, network, coalesce=coalesce)
    rows: list[GapRow] = []
    with progress.task("gap study", total=len(sizes_mib) * seeds) as task:
        for size in sizes_mib:
            for seed in range(seeds):
                task.update(len(rows), f"gap study: {size:g} MiB/rank, seed {seed}")
                demand = workloads.zipf(topo.num_ranks, skew, int(size * 2**20), seed=seed)
                rows.append(
                    _instance(
                        demand,
                        model,
                        sim,
                        size,
                        seed,
                        time_limit_s,
                        max_solves,
                        backend,
                        workers,
                        oracles,
                    )
                )
                task.update(len(rows))
    return rows


def _simulate(sim: FluidSimulator, schedule: Schedule, demand: np.ndarray) -> float:
    validate(schedule, demand, sim.topology).raise_if_invalid()
    return sim.run(schedule).completion_s


def _instance(
    demand: np.ndarray,
    model: PathModel,
    sim: FluidSimulator,
    size: float,
    seed: int,
    time_limit_s: float,
    max_solves: int,
    backend: str,
    workers: int,
    oracles: tuple[str, ...] = ORACLES,
) -> GapRow:
    """One instance: VarioPath, the oracles and the bounds on one demand."""
    topo, network = model.topology, sim.network
    kw = {"network": network, "coalesce": sim.coalesce}
    vario = run_one(model, "variopath-paper", demand, **kw)
    tuned = run_one(model, "variopath", demand, options={"hybrid": "all"}, **kw)
    op = run_one(model, "variopath", demand, **kw)
    variopath_s = vario.sim.completion_s
    bound = lower_bound(demand, topo)
    flow_direct = bound.lp_direct_s or bound.simple_s
    nan = math.nan
    epoch_row: tuple = (nan, "NOT_RUN", nan, nan, nan, 0, 0.0)
    channel_row: tuple = (nan, nan, nan, "none", "NOT_RUN", "none", 0.0)
    config_s = nan
    if "epoch" in oracles:
        epoch, epoch_sim, channel_row, config_s = _epoch_and_channel(
            demand, model, sim, vario, variopath_s, flow_direct, time_limit_s, max_solves,
            backend, workers, "channel" in oracles,
        )  # fmt: skip
        epoch_row = (
            epoch.time_s,
            epoch.status,
            epoch.tau_s,
            epoch.bound_s,
            epoch_sim,
            epoch.epochs,
            epoch.seconds,
        )
    hybrid_row: tuple = (nan, nan, "NOT_RUN", nan, 0, 0.0, nan)
    any_k_s = nan
    if "hybrid" in oracles:
        hy = solve_hybrid(demand, model, network, time_limit_s=time_limit_s)
        hy_sim = _simulate(sim, hy.schedule, demand) if hy.schedule is not None else hy.time_s
        any_k_s = hy.any_k_bound_s
        hybrid_row = (
            hy_sim,
            hy.time_s,
            hy.status,
            hy.bound_s,
            hy.phases,
            hy.seconds,
            hy_sim / tuned.sim.completion_s,
        )
    best = channel_row[0]
    return GapRow(
        size,
        seed,
        variopath_s,
        tuned.sim.completion_s,
        len(vario.schedule.steps),
        *epoch_row,
        *channel_row,
        bound.best_s,
        epoch_row[0] / variopath_s,
        epoch_row[0] / tuned.sim.completion_s,
        best / variopath_s,
        bound.best_s / variopath_s,
        *hybrid_row,
        config_s,
        any_k_s,
        op.sim.completion_s,
        op.schedule.meta["plan"],
        op.schedule.meta["core_s"],
        hybrid_row[0] / op.sim.completion_s,
    )


def _epoch_and_channel(
    demand: np.ndarray,
    model: PathModel,
    sim: FluidSimulator,
    vario: RunResult,
    variopath_s: float,
    flow_direct: float,
    time_limit_s: float,
    max_solves: int,
    backend: str,
    workers: int,
    channel_too: bool,
) -> tuple:
    """The epoch model's result and simulated time, and the channel model's row fields
    (best, bound, gap, solver, status, source, seconds; NaN and "NOT_RUN" when not asked)."""
    network = sim.network
    epoch = solve_epoch(
        demand,
        model,
        network,
        flow_bound_s=flow_direct,
        time_limit_s=time_limit_s,
        workers=workers,
    )
    epoch_sim = _simulate(sim, epoch.schedule, demand)
    if not channel_too:
        nan = math.nan
        return epoch, epoch_sim, (nan, nan, nan, "none", "NOT_RUN", "none", 0.0), nan
    found = {"variopath": (variopath_s, vario.schedule), "epoch": (epoch_sim, epoch.schedule)}
    swap = SwapSearch(demand, model, network) if SwapSearch.applies(model) else None

    def improve(schedule: Schedule, slots: int | None = None) -> Schedule | None:
        return swap.improve(schedule, slots) if swap is not None else None

    def swapped(schedules: list[Schedule]) -> None:
        """The swap search from each of ``schedules``; the best it finds joins ``found``."""
        better = [(_simulate(sim, s, demand), s) for s in map(improve, schedules) if s is not None]
        if "swap" in found:
            better.append(found["swap"])
        if better:
            found["swap"] = min(better, key=lambda f: f[0])

    swapped([s for _, s in found.values()])  # better warm starts for the K-slot searches
    upper = min(t for t, _ in found.values())
    # the configuration LP branched on K and below it, first: the per-K search prunes the K
    # the branching lifts to the best known time and spends the time on the rest
    early = channel_config_bound(
        demand,
        model,
        network,
        upper_s=upper,
        warm=[s for _, s in found.values()],
        time_limit_s=time_limit_s / 2,
        branch=True,
        flow_bound_s=flow_direct,
    )
    channel = solve_channel_model(
        demand,
        model,
        network,
        upper_s=upper,
        warm=[s for _, s in sorted(found.values(), key=lambda f: f[0])],
        flow_bound_s=flow_direct,
        max_solves=max_solves,
        time_limit_s=time_limit_s,
        workers=workers,
        lower_k=early.per_k,
        improve=improve,
    )
    channel_bound, seconds = channel.bound_s, channel.seconds
    solver = "kslot"
    if channel.schedule is not None:
        found["kslot"] = (_simulate(sim, channel.schedule, demand), channel.schedule)
    if any(k.status == "NOT_SOLVED" for k in channel.per_k):
        # K beyond the first max_solves are not searched per K: the channel pool searches too
        solver = "kslot+pool"
        milp = solve_milp(
            demand,
            model,
            lambda_s=network.barrier_s,
            alpha_s=min(lane.alpha_s for lane in candidate_lanes(model, demand, network)),
            warm=vario.schedule,
            time_limit_s=time_limit_s,
            backend=backend,
            workers=workers,
        )
        schedule, seconds = milp.schedule, seconds + milp.seconds
        # the pool charges every lane α_min, a relaxation of the simulated cost: its bound holds
        channel_bound = max(channel_bound, milp.bound_s)
        if schedule is not None:
            found["pool"] = (_simulate(sim, schedule, demand), schedule)
    source = min(found, key=lambda k: found[k][0])
    best = found[source][0]
    config = channel_config_bound(
        demand,
        model,
        network,
        upper_s=best,
        time_limit_s=time_limit_s,
        branch=True,
        per_k={**early.per_k, **{k.slots: k.bound_s for k in channel.per_k}},
        flow_bound_s=flow_direct,
        lp_model=early.master,
    )
    dive_start = time.perf_counter()
    dives = _dives(config, demand, model, sim, time_limit_s / 4)
    if dives:
        found["dive"] = min(dives, key=lambda f: f[0])
    dive_s = time.perf_counter() - dive_start
    source = min(found, key=lambda k: found[k][0])
    best = found[source][0]
    if source != "swap":
        swapped([found[source][1]])
        source = min(found, key=lambda k: found[k][0])
    # CP-SAT at the best schedule's own K, hinted with it, and the swap search, in turn
    refined = refine_channel_schedule(
        demand,
        model,
        network,
        found[source][1],
        improve=improve,
        flow_bound_s=flow_direct,
        time_limit_s=time_limit_s,
        workers=workers,
    )
    if refined is not None:
        found["refined"] = (_simulate(sim, refined, demand), refined)
    source = min(found, key=lambda k: found[k][0])
    best = found[source][0]
    pool_s = 0.0
    if config.channels:
        # a schedule search over the channels the configuration LP found useful (no bound)
        pool_start = time.perf_counter()
        pooled = search_pool(
            demand,
            model,
            config.channels,
            lambda_s=network.barrier_s,
            alpha_s=min(lane.alpha_s for lane in candidate_lanes(model, demand, network)),
            warm=[s for _, s in found.values()],
            time_limit_s=time_limit_s,
            workers=workers,
        )
        pool_s = time.perf_counter() - pool_start
        if pooled is not None and not any(pooled is s for _, s in found.values()):
            found["colgen"] = (_simulate(sim, pooled, demand), pooled)
            source = min(found, key=lambda k: found[k][0])
            best = found[source][0]
    channel_bound = min(max(channel_bound, config.bound_s), best)
    status = "OPTIMAL" if channel_bound >= best * (1 - 1e-6) else "FEASIBLE"
    return (
        epoch,
        epoch_sim,
        (
            best,
            channel_bound,
            (best - channel_bound) / best if best > 0 else 0.0,
            solver,
            status,
            source,
            seconds + early.seconds + config.seconds + dive_s + pool_s,
        ),
        config.bound_s,
    )


def _dives(
    config: ColgenBound,
    demand: np.ndarray,
    model: PathModel,
    sim: FluidSimulator,
    time_limit_s: float,
) -> list[tuple[float, Schedule]]:
    """Schedules from dives on the configuration LP's master (:meth:`ConfigLP.dive`, durations
    fixed and free; no bound), up to K_max activations and up to the K of the least bound,
    ``time_limit_s`` each, simulated, with their LP polish (:func:`~solver.milp.polish`)."""
    if config.master is None or not config.master.lanes:
        return []
    limits = [config.master.k_max]
    if config.per_k:
        limits.append(min(config.per_k, key=lambda k: (config.per_k[k], k)))
    fingerprint, lambda_s = model.topology.fingerprint, sim.network.barrier_s
    out = []
    for k_hi in limits:
        for flexible in (False, True):
            deadline = time.perf_counter() + time_limit_s
            activations = config.master.dive(k_hi, deadline=deadline, flexible=flexible)
            if not activations:
                continue
            schedule = schedule_of(activations, demand, fingerprint, lambda_s, len(demand))
            polished = polish([ch for ch, _ in activations], demand, fingerprint, lambda_s)
            for found in (schedule, polished):
                if found is not None:
                    found.meta["scheduler"] = "colgen-dive"
                    out.append((_simulate(sim, found, demand), found))
    return out


def _finite(group: list[GapRow], field: str) -> list[float]:
    return [v for v in (getattr(r, field) for r in group) if math.isfinite(v)]


def _stats(group: list[GapRow]) -> dict:
    """Mean and worst of a group's ratios; how many epoch optima were proven (``certified``);
    ``reference``: "certified optimum" when all were, else "best found". The hybrid model's:
    ``hybrid_certified`` (proven optima), ``hybrid_gap`` (model time over its proven bound,
    mean and worst), ``variopath_of_hybrid`` and ``op_of_hybrid``. A figure no row has (its
    oracle not run) is None."""
    proven = sum(r.epoch_status == "OPTIMAL" for r in group)

    def mean(field: str) -> float | None:
        values = _finite(group, field)
        return float(np.mean(values)) if values else None

    def worst(field: str, pick=min) -> float | None:
        values = _finite(group, field)
        return float(pick(values)) if values else None

    hybrid = [r for r in group if r.hybrid_status != "NOT_RUN"]
    gaps = [(r.hybrid_model_s - r.hybrid_bound_s) / r.hybrid_model_s for r in hybrid]
    return {
        "instances": len(group),
        "certified": proven,
        "reference": "certified optimum" if proven == len(group) else "best found",
        "mean_ratio": mean("ratio"),
        "worst_ratio": worst("ratio"),
        "mean_ratio_tuned": mean("ratio_tuned"),
        "worst_ratio_tuned": worst("ratio_tuned"),
        "mean_channel_gap": mean("channel_gap"),
        "worst_channel_gap": worst("channel_gap", max),
        "mean_variopath_of_channel": mean("variopath_of_channel"),
        "worst_variopath_of_channel": worst("variopath_of_channel"),
        "mean_variopath_of_bound": mean("variopath_of_bound"),
        "hybrid_instances": len(hybrid),
        "hybrid_certified": sum(r.hybrid_status == "OPTIMAL" for r in hybrid),
        "hybrid_any_k": sum(
            r.hybrid_model_s <= r.hybrid_any_k_bound_s * (1 + 1e-9) for r in hybrid
        ),
        "mean_hybrid_gap": float(np.mean(gaps)) if gaps else None,
        "worst_hybrid_gap": float(max(gaps)) if gaps else None,
        "mean_variopath_of_hybrid": mean("variopath_of_hybrid"),
        "worst_variopath_of_hybrid": worst("variopath_of_hybrid"),
        "mean_op_of_hybrid": mean("op_of_hybrid"),
        "worst_op_of_hybrid": worst("op_of_hybrid"),
    }


def summarize(rows: list[GapRow]) -> dict:
    """Per size and overall statistics, the paper's figures, and every row."""
    by_size: dict[float, list[GapRow]] = {}
    for r in rows:
        by_size.setdefault(r.mib_per_rank, []).append(r)
    out_rows = []
    for r in rows:
        row = asdict(r)
        out_rows.append(
            {
                k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in row.items()
            }
        )
    return {
        "overall": _stats(rows) if rows else {},
        "by_size": {f"{size:g}": _stats(group) for size, group in by_size.items()},
        "paper": PAPER,
        "rows": out_rows,
    }
