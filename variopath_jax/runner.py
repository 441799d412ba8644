"""Plan, validate and simulate one AlltoAllv call with a named scheduler: what ``variopath run``,
``plan``, ``simulate`` and ``demo``, the gap study and the benchmarks share.

:func:`run_one` plans and then :func:`evaluate` s the schedule (validation, then the simulator);
``variopath simulate`` evaluates a saved schedule the same way. :class:`RunResult` builds the JSON
documents: :meth:`~RunResult.summary` for ``run`` and ``simulate``,
:meth:`~RunResult.plan_summary` for ``plan``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from variopath_jax import progress
from variopath_jax.errors import VarioPathError
from variopath_jax.schedule import Schedule, Validation, validate
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import DEFAULT_COALESCE, PCIE, FluidSimulator, NetworkModel, SimResult
from variopath_jax.sim.network import NetworkSpec, load_network, load_networks
from variopath_jax.topology import PathModel, Topology
from variopath_jax.workloads import validate_demand

# A run holds the N×N demand and plans, validates and simulates per GPU pair: 1,024 ranks take
# about a minute and 1.4 GB on a 2-core machine (nccl, uniform), 8,000 would not fit in memory.
MAX_RANKS = 1024

INVALID_POLICIES = ("simulate", "skip", "raise")


def plans_on_call_path(scheduler: str) -> bool:
    """Whether ``scheduler`` plans each call on its call path (VarioPath and its variants, and
    ``op``, whose ``plan_s`` is what is left of its planning there), so its planning counts
    against the call (O/C); a peer runs a fixed algorithm (NCCL plans nothing per call), and
    building its schedule here is the simulator's work, not its cost."""
    return scheduler.startswith("variopath") or scheduler == "op"


def check_size(topo: Topology) -> None:
    """Refuse, before anything is allocated, a deployment too large to plan and simulate."""
    n = topo.num_ranks
    if n <= MAX_RANKS:
        return
    raise VarioPathError(
        f"{topo.name} x {topo.nodes} has {n:,} ranks: a run holds the {n:,}x{n:,} demand matrix "
        f"and plans, validates and simulates every GPU pair, which this tool does up to "
        f"{MAX_RANKS:,} ranks (--nodes {MAX_RANKS // topo.gpus_per_node} here); at any size, "
        "`variopath topo show --summary` describes the deployment and `variopath catalog build` "
        "builds its factored catalog, whose cost does not grow with the node count"
    )


@dataclass
class RunResult:
    """One planned (or loaded) schedule, its validation and its simulation.

    ``sim`` is None when the schedule did not validate and was not simulated (``plan``);
    ``total_bytes`` is the demand's payload (the JSON of ``run`` reports what the simulated
    schedule moves); ``plan_s`` is the planner's own time (None for a saved schedule that records none) and
    ``setup_s`` the time around it (catalog loads and builds, path models)."""

    scheduler: str
    schedule: Schedule
    validation: Validation
    sim: SimResult | None
    total_bytes: int
    plan_s: float | None
    setup_s: float = 0.0

    def _per_activation_us(self) -> float | None:
        if self.plan_s is None:
            return None
        steps = len(self.schedule.steps)
        return self.plan_s / steps * 1e6 if steps else 0.0

    def summary(self) -> dict[str, Any]:
        """The JSON contract of ``variopath run`` and ``variopath simulate``."""
        if self.sim is None:
            raise VarioPathError("summary() needs a simulated schedule")
        return {
            "scheduler": self.scheduler,
            "contention": self.sim.network,
            "ranks": self.schedule.ranks,
            "total_bytes": self.sim.total_bytes,
            "completion_s": self.sim.completion_s,
            "algbw_gbps": self.sim.algbw_gbps,
            "steps": len(self.schedule.steps),
            "transfers": self.schedule.num_transfers,
            "valid": self.validation.ok,
            "errors": list(self.validation.errors),
            "plan_s": self.plan_s,
            "activations": len(self.schedule.steps),
            "plan_us_per_activation": self._per_activation_us(),
            "modeled_s": self.schedule.modeled_time(),
        }

    def plan_summary(self) -> dict[str, Any]:
        """The JSON contract of ``variopath plan``: planning time, modeled (Eq. 2) and predicted
        (simulated, None when the schedule is invalid) completion."""
        steps = len(self.schedule.steps)
        predicted = self.sim
        return {
            "scheduler": self.scheduler,
            "ranks": self.schedule.ranks,
            "total_bytes": self.total_bytes,
            "steps": steps,
            "activations": steps,
            "transfers": self.schedule.num_transfers,
            "valid": self.validation.ok,
            "errors": list(self.validation.errors),
            "plan_s": self.plan_s,
            "setup_s": self.setup_s,
            "plan_us_per_activation": self._per_activation_us(),
            "plan_over_comm": self.plan_s / predicted.completion_s
            if predicted
            and self.plan_s is not None
            and predicted.completion_s
            and plans_on_call_path(self.scheduler)
            else None,
            "modeled_s": self.schedule.modeled_time(),
            "predicted_s": predicted.completion_s if predicted else None,
            "predicted_algbw_gbps": predicted.algbw_gbps if predicted else None,
        }


def evaluate(
    topo: Topology,
    schedule: Schedule,
    demand: np.ndarray,
    network: NetworkModel,
    *,
    invalid: str = "simulate",
    record_links: bool = False,
    coalesce: float = DEFAULT_COALESCE,
) -> tuple[Validation, SimResult | None]:
    """Validate ``schedule`` against ``demand`` on ``topo`` and simulate it under ``network``.
    ``invalid`` says what happens to a schedule that does not validate: ``"simulate"`` it
    anyway, ``"skip"`` the simulation (None) or ``"raise"`` a ScheduleError naming the
    problems."""
    if invalid not in INVALID_POLICIES:
        raise VarioPathError(f"invalid={invalid!r}; expected one of {INVALID_POLICIES}")
    with progress.task(f"validating {schedule.num_transfers:,} transfers"):
        validation = validate(schedule, demand, topo)
    if not validation.ok and invalid == "raise":
        validation.raise_if_invalid()
    if not validation.ok and invalid == "skip":
        return validation, None
    sim = FluidSimulator(topo, network, record_links=record_links, coalesce=coalesce)
    with progress.task(f"simulating under {network.name}"):
        return validation, sim.run(schedule)


def run_one(
    model: PathModel,
    scheduler: str,
    demand: np.ndarray,
    *,
    network: NetworkModel | str = PCIE,
    lambda_s: float | None = None,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    record_links: bool = False,
    coalesce: float = DEFAULT_COALESCE,
    invalid: str = "simulate",
    plan_for: NetworkSpec | Sequence[NetworkSpec] | None = None,
) -> RunResult:
    """Plan ``demand`` with ``scheduler``, validate the schedule and simulate it under the
    ``network`` model (``lambda_s``: the barrier cost λ, planned with and charged, default the
    model's; ``coalesce``: the simulator's event-coalescing tolerance, 0 for the exact
    simulation; ``invalid``: see :func:`evaluate`). Model-aware schedulers plan for
    ``network`` unless ``plan_for`` names other models (several: the robust choice); the others
    are told no model (``PlanRequest.network`` None: ``op`` then decides under its default
    models) unless ``plan_for`` names some."""
    topo = model.topology
    check_size(topo)
    network = load_network(network)
    if lambda_s is not None:
        network = network.replace(barrier_s=lambda_s)
    info = get_scheduler(scheduler)
    planned: NetworkModel | tuple[NetworkModel, ...] | None = network if info.model_aware else None
    if plan_for is not None:
        planned = tuple(m.replace(barrier_s=network.barrier_s) for m in load_networks(plan_for))
    demand = validate_demand(demand, topo.num_ranks)
    request = PlanRequest(demand, model, network.barrier_s, seed, dict(options or {}), planned)
    start = time.perf_counter()
    with progress.task(f"planning with {scheduler}"):
        schedule = info.plan(request)
    total_s = time.perf_counter() - start
    plan_s = schedule.meta.get("plan_s", total_s)  # the planner's own time, when it keeps one
    validation, sim = evaluate(
        topo,
        schedule,
        demand,
        network,
        invalid=invalid,
        record_links=record_links,
        coalesce=coalesce,
    )
    total = int(demand.sum())
    return RunResult(scheduler, schedule, validation, sim, total, plan_s, total_s - plan_s)


def simulate_saved(
    topo: Topology,
    schedule: Schedule,
    network: NetworkModel,
    demand: np.ndarray | None = None,
    *,
    coalesce: float = DEFAULT_COALESCE,
) -> RunResult:
    """Validate a saved schedule against ``demand`` (default: what it serves) and simulate it;
    an invalid schedule raises. ``plan_s`` is the planning time the schedule records, if any."""
    check_size(topo)
    if schedule.ranks != topo.num_ranks:
        raise VarioPathError(
            f"the schedule is for {schedule.ranks} ranks, the topology has {topo.num_ranks}"
        )
    demand = schedule.served() if demand is None else validate_demand(demand, topo.num_ranks)
    validation, sim = evaluate(topo, schedule, demand, network, invalid="raise", coalesce=coalesce)
    name = schedule.meta.get("scheduler", "?")
    total = int(demand.sum())
    return RunResult(name, schedule, validation, sim, total, schedule.meta.get("plan_s"))
