"""The hybrid plans against the plans they are meant to replace, at the prototype's four points.

research/hybrid-prototype.md measured a throwaway prototype of the ``phased`` and ``chained``
plans at four points; this prints ours at the same points, each plan simulated under ``pcie``
(root-complex links lose by flow count, paced or not), ``pcie-fair`` (caps that fit lose nothing)
and ``none``, with its planning time (this process, one run, the call from Python):

- r5080-bf3 x 2, MoE dispatch (``variopath run --workload moe``: M = 128 tokens, 256 experts,
  top-8, seed 0);
- r5080-bf3 x 8, the same MoE;
- r5080-cx8 x 2, the same MoE;
- r5080-bf3 x 2, uniform AlltoAll of 1 MiB per pair (``--workload uniform``'s default).

Plans: ``variopath`` (the C++ core's robust choice over the unprofiled models, ``pcie`` and
``pcie-fair``, as an unprofiled machine gets it; the plan it chose in brackets, its paced
families from this demand's own split); the C++ core's ``chained`` (ffi/chained.cc), ``paced``,
``rot-paced`` and ``staged`` families as the op applies a decision of that family without a
split (``NativeChooser.apply``: the paced families from the deployment's reference split, the
split of uniform demand; chained's gaps those of the unprofiled model of largest o + L + σ; a
family the demand does not fit, which the core replaces by ``staged``, shows that in brackets);
``phased``, the hybrid MILP's phase model (``variopath_jax.solver.phases.phased``: its LP by
HiGHS in Python, under ``pcie``'s gaps), which no scheduler runs, built here as a study; the
``nccl`` peer; and the flow-LP lower bound (data time only: no λ, o or L). Run:
``python benchmarks/bench_hybrid.py [--points bf3x2-moe,...] [--json]`` (``bf3x8-moe``'s
``phased`` LP takes tens of seconds).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import numpy as np

from variopath_jax import workloads
from variopath_jax.planner.native import _native
from variopath_jax.planner.schedulers import chooser_for, params_of
from variopath_jax.schedule import Schedule, validate
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import FluidSimulator
from variopath_jax.sim.network import load_network
from variopath_jax.solver.bound import lower_bound
from variopath_jax.solver.phases import phased
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
    req = PlanRequest(demand, model, LAMBDA_S)  # the unprofiled models at λ
    chooser = chooser_for(model, params_of(req))
    # built and screened before any plan is timed (variopath's first call would pay it: a
    # deployment pays it once)
    chooser.algorithm2_pays(req.networks)

    def family(name: str) -> Callable[[], Schedule]:
        decision = _native().Decision(name)
        return lambda: chooser.apply(decision, demand, req.networks)

    return {
        "variopath": lambda: variopath(req),
        "phased": lambda: phased(model, demand, LAMBDA_S),
        "chained": family("chained"),
        "paced": family("paced"),
        "rot-paced": family("rot-paced"),
        "staged": family("staged"),
        "nccl": lambda: nccl(req),
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
        made = schedule.meta.get("plan")
        rows[plan] = {
            "plan_s": plan_s,
            # what variopath chose, or the family the core ran where the demand did not fit
            "choice": made if made != plan else None,
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
        print(
            f"{'plan':22} {'pcie µs':>10} {'pcie-fair':>11} {'none':>9} {'plan ms':>9}  prototype"
        )
        nccl = res["plans"]["nccl"]["pcie"]
        for plan, row in res["plans"].items():
            proto = PROTOTYPE[res["point"]].get(plan)
            note = f"{proto:.1f}" if proto else ""
            label = f"{plan} ({row['choice']})" if row["choice"] else plan
            print(
                f"{label:22} {row['pcie'] * 1e6:10.1f} {row['pcie-fair'] * 1e6:11.1f} "
                f"{row['none'] * 1e6:9.1f} {row['plan_s'] * 1e3:9.2f}  {note:>9}"
                f"   (nccl / this under pcie: {nccl / row['pcie']:.2f}x)"
            )


if __name__ == "__main__":
    main()
