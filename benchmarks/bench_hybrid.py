"""The hybrid plans against the plans they are meant to replace, at the prototype's four points.

research/hybrid-prototype.md measured a throwaway prototype of the ``phased`` and ``chained``
plans (planner/hybrid.py) at four points; this prints ours at the same points, each plan
simulated under ``pcie`` (root-complex links lose by flow count, paced or not), ``pcie-fair``
(caps that fit lose nothing) and ``none``, with its planning time (this process, one run):

- r5080-bf3 x 2, MoE dispatch (``variopath run --workload moe``: M = 128 tokens, 256 experts,
  top-8, seed 0);
- r5080-bf3 x 8, the same MoE;
- r5080-cx8 x 2, the same MoE;
- r5080-bf3 x 2, uniform AlltoAll of 1 MiB per pair (``--workload uniform``'s default).

Plans: ``variopath`` (its robust choice over the three models, as an unprofiled machine gets it;
the plan it chose in brackets), ``phased``, ``chained``, the all-concurrent ``paced`` and ``staged`` candidates of
``variopath`` and the ``nccl`` peer, and the flow-LP lower bound (data time only: no λ, o or L).
``phased`` is built here even where ``variopath`` leaves it out for the size of its LP
(``PHASED_MAX_VARIABLES``). Run:
``python benchmarks/bench_hybrid.py [--points bf3x2-moe,...] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np

from variopath_jax import workloads
from variopath_jax.planner.hybrid import chained, phased
from variopath_jax.planner.model_aware import concurrent, paced
from variopath_jax.schedule import Schedule, validate
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import FluidSimulator
from variopath_jax.sim.network import load_network
from variopath_jax.solver.bound import lower_bound
from variopath_jax.topology import PathModel, preset

LAMBDA_S = 20e-6
MODELS = ("pcie", "pcie-fair", "none")
POINTS = {
    "bf3x2-moe": ("r5080-bf3", 2, "moe"),
    "bf3x8-moe": ("r5080-bf3", 8, "moe"),
    "cx8x2-moe": ("r5080-cx8", 2, "moe"),
    "bf3x2-uniform": ("r5080-bf3", 2, "uniform"),
}
# the prototype's times (µs), research/hybrid-prototype.md, under its conservative rule
PROTOTYPE = {
    "bf3x2-moe": {"phased": 288.4, "chained": 322.6},
    "bf3x8-moe": {"phased": 834.4, "chained": 556.3},
    "cx8x2-moe": {"phased": 228.0, "chained": 228.5},
    "bf3x2-uniform": {"phased": 373.8, "chained": 430.7},
}


def demand_of(workload: str, ranks: int) -> np.ndarray:
    if workload == "moe":
        return workloads.moe(ranks, 128, seed=0)
    return workloads.uniform(ranks, 1 << 20)


def plans(model: PathModel, demand: np.ndarray) -> dict[str, Callable[[], Schedule]]:
    nccl = get_scheduler("nccl").plan
    variopath = get_scheduler("variopath").plan
    return {
        "variopath": lambda: variopath(PlanRequest(demand, model, LAMBDA_S)),
        "phased": lambda: phased(model, demand, LAMBDA_S),
        "chained": lambda: chained(model, demand, LAMBDA_S),
        "paced": lambda: paced(model, demand, LAMBDA_S),
        "staged": lambda: concurrent(model, demand, LAMBDA_S, 1, staged=True),
        "nccl": lambda: nccl(PlanRequest(demand, model, LAMBDA_S)),
    }


def run_point(name: str) -> dict:
    topo_name, nodes, workload = POINTS[name]
    topo = preset(topo_name, nodes)
    model = PathModel(topo)
    demand = demand_of(workload, topo.num_ranks)
    sims = {m: FluidSimulator(topo, load_network(m)) for m in MODELS}
    rows = {}
    for plan, build in plans(model, demand).items():
        start = time.perf_counter()
        schedule = build()
        plan_s = time.perf_counter() - start
        validate(schedule, demand, topo).raise_if_invalid()
        rows[plan] = {
            "plan_s": plan_s,
            "choice": schedule.meta.get("plan"),
            **{m: sim.run(schedule).completion_s for m, sim in sims.items()},
        }
    bound = lower_bound(demand, topo).best_s
    return {"point": name, "bound_s": bound, "plans": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--points", default=",".join(POINTS), help="comma-separated, of " + ", ".join(POINTS)
    )
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args()
    results = [run_point(p) for p in args.points.split(",")]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for res in results:
        print(f"\n{res['point']}  (LP bound {res['bound_s'] * 1e6:.1f} µs)")
        print(f"{'plan':20} {'pcie µs':>10} {'pcie-fair':>11} {'none':>9} {'plan s':>8}  prototype")
        nccl = res["plans"]["nccl"]["pcie"]
        for plan, row in res["plans"].items():
            proto = PROTOTYPE[res["point"]].get(plan)
            note = f"{proto:.1f}" if proto else ""
            label = f"{plan} ({row['choice']})" if row["choice"] else plan
            print(
                f"{label:20} {row['pcie'] * 1e6:10.1f} {row['pcie-fair'] * 1e6:11.1f} "
                f"{row['none'] * 1e6:9.1f} {row['plan_s']:8.2f}  {note:>9}"
                f"   (nccl / this under pcie: {nccl / row['pcie']:.2f}x)"
            )


if __name__ == "__main__":
    main()
