"""Run a suite: every system on every point, in the simulator, under every network model asked
for (default the conservative ``pcie``, ``pcie-fair`` without the trigger and the ideal ``none``, side
by side).

A point's runs share one demand and one lower bound (model-free: it bounds every schedule under
either model); each system plans once and its schedule is simulated under each model. A run that
fails (no catalog, a planner or simulator error) becomes a row with an ``error`` and the suite
goes on. Whether a deployment has a
catalog is asked once per process; a failed build (it can take minutes before the builder gives
up) is also remembered on disk, keyed by the catalog code, so later runs skip it until that code
changes.
"""

from __future__ import annotations

import csv
import dataclasses
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from variopath_jax.bench.suites import Point, Suite, System
from variopath_jax.catalog import CatalogError, catalog_for
from variopath_jax.runner import run_one
from variopath_jax.schedulers import get_scheduler
from variopath_jax.sim import NETWORK_MODELS, FluidSimulator, NetworkModel, load_network
from variopath_jax.solver.bound import lower_bound
from variopath_jax.topology import PathModel, Topology, preset

CSV_COLUMNS = (
    "suite",
    "topology",
    "nodes",
    "ranks",
    "workload",
    "tokens",
    "mib_per_rank",
    "skew",
    "step",
    "seed",
    "payload_per_rank",
    "total_bytes",
    "scheduler",
    "contention",
    "completion_s",
    "algbw_gbps",
    "bound_s",
    "bound_kind",
    "bound_gbps",
    "valid",
    "plan_s",
    "plan_comm_s",
    "steps",
    "wall_s",
    "error",
)

# called with (label, 0) before a run and (label, 1) after it
Progress = Callable[[str, int], None]


def catalog_error(topo: Topology, model: PathModel) -> str | None:
    """Why ``model``'s deployment has no catalog, or None when it has one (built if needed; the
    catalog cache remembers failed builds too)."""
    try:
        catalog_for(model)
    except CatalogError as err:
        return f"no catalog: {err}"
    return None


def _run_system(
    system: System, model: PathModel, demand, networks: list[NetworkModel], seed: int
) -> list[dict[str, Any]]:
    """The system's run under each network model (planned once, under the first)."""
    if system.catalog:
        reason = catalog_error(model.topology, model)
        if reason is not None:
            return [{"contention": net.name, "error": reason} for net in networks]
    start = time.perf_counter()
    try:
        if get_scheduler(system.scheduler).model_aware:  # it plans for each model anew
            runs = [
                run_one(model, system.scheduler, demand, network=n, seed=seed) for n in networks
            ]
        else:
            res = run_one(model, system.scheduler, demand, network=networks[0], seed=seed)
            runs = [res] + [
                dataclasses.replace(res, sim=FluidSimulator(model.topology, net).run(res.schedule))
                for net in networks[1:]
            ]
    except Exception as err:  # one failing point must not abort the suite
        wall_s = time.perf_counter() - start
        error = f"{type(err).__name__}: {err}"
        return [{"contention": net.name, "error": error, "wall_s": wall_s} for net in networks]
    wall_s = time.perf_counter() - start
    return [
        {
            "contention": res.sim.network,
            "completion_s": res.sim.completion_s,
            "algbw_gbps": res.sim.algbw_gbps,
            "valid": res.validation.ok,
            "plan_s": res.plan_s,
            "plan_comm_s": res.sim.completion_s + (res.plan_s or 0.0),
            "steps": len(res.schedule.steps),
            "wall_s": wall_s,
            "error": "; ".join(res.validation.errors[:3]) if not res.validation.ok else "",
        }
        for res in runs
    ]


def run_points(
    suite: Suite,
    points: Iterable[Point],
    *,
    networks: Iterable[NetworkModel | str] = tuple(NETWORK_MODELS),
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """One row per (point, system, network model), in the CSV's columns (missing values are
    None). Every model must charge the same barrier cost: a system plans once, for all."""
    nets = [load_network(n) for n in networks]
    if len({n.barrier_s for n in nets}) > 1:
        raise ValueError("the network models of one bench run must share their barrier cost λ")
    rows: list[dict[str, Any]] = []
    models: dict[tuple[str, int, bool], PathModel] = {}
    for point in points:
        topo = preset(point.topology, point.nodes)
        n = topo.num_ranks
        demand = suite.demand(point, n)
        total = int(demand.sum())
        bound = lower_bound(demand, topo, lp=suite.bound_lp)
        base = {
            "suite": suite.name,
            "topology": point.topology,
            "nodes": point.nodes,
            "ranks": n,
            "workload": suite.workload,
            **suite.params(point),
            "seed": point.seed,
            "payload_per_rank": total / n,
            "total_bytes": total,
            "bound_s": bound.best_s,
            "bound_kind": "lp" if bound.lp_relay_s is not None else "simple",
            "bound_gbps": total / (n * bound.best_s) / 1e9 if bound.best_s > 0 else None,
        }
        for system in suite.systems:
            key = (point.topology, point.nodes, system.nearest)
            if key not in models:
                models[key] = PathModel(topo, only_nearest=system.nearest)
            label = f"{suite.name} {point.topology}x{point.nodes} {point.value:g} {system.label}"
            if progress is not None:
                progress(label, 0)
            results = _run_system(system, models[key], demand, nets, point.seed)
            if progress is not None:
                progress(label, 1)
            for result in results:
                rows.append(
                    {col: None for col in CSV_COLUMNS} | base | {"scheduler": system.label} | result
                )
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    """Every row, columns as :data:`CSV_COLUMNS` (empty cells for missing values)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in CSV_COLUMNS})
    return path
