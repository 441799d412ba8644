"""Plan, validate and simulate one AlltoAllv call with a named scheduler: what ``variopath run``,
``variopath demo`` and the benchmarks share."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from variopath_jax.schedule import Schedule, Validation, validate
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import DEFAULT_COALESCE, PCIE, FluidSimulator, NetworkModel, SimResult
from variopath_jax.sim.network import load_network
from variopath_jax.topology import PathModel
from variopath_jax.workloads import validate_demand


@dataclass
class RunResult:
    scheduler: str
    schedule: Schedule
    validation: Validation
    sim: SimResult
    plan_s: float

    def summary(self) -> dict[str, Any]:
        """The JSON contract of ``variopath run``."""
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
            "plan_us_per_activation": self.plan_s / len(self.schedule.steps) * 1e6
            if self.schedule.steps
            else 0.0,
        }


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
) -> RunResult:
    """Plan ``demand`` with ``scheduler``, validate the schedule and simulate it under the
    ``network`` model (``lambda_s``: the barrier cost λ, planned with and charged, default the
    model's; ``coalesce``: the simulator's event-coalescing tolerance, 0 for the exact
    simulation)."""
    topo = model.topology
    network = load_network(network)
    if lambda_s is not None:
        network = network.replace(barrier_s=lambda_s)
    demand = validate_demand(demand, topo.num_ranks)
    info = get_scheduler(scheduler)
    request = PlanRequest(demand, model, network.barrier_s, seed, dict(options or {}), network)
    start = time.perf_counter()
    schedule = info.plan(request)
    plan_s = schedule.meta.get(
        "plan_s", time.perf_counter() - start
    )  # the planner's own time if it keeps one
    validation = validate(schedule, demand, topo)
    sim = FluidSimulator(topo, network, record_links=record_links, coalesce=coalesce)
    return RunResult(scheduler, schedule, validation, sim.run(schedule), plan_s)
