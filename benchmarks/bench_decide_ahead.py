"""What deciding ahead costs (issue 51 goal: at most 3% geomean on moving traces): the op applies
the decision made from its call site's previous demand (``NativeChooser.decide`` of call k - 1,
applied to call k's demand), not one made from the current demand.

Per deployment and kind of motion, MoE dispatch at M = 128 tokens per rank on a moving trace
(``traces.moving_trace``: 256 experts, top-8, 14 KiB tokens; ``slow``: its defaults, popularity
drifting 5% a step with rare bursts; ``fast``: drifting 30% a step with bursts at 5%), the
decision made under the op's default models (``pcie`` and ``pcie-fair``), each call's stale plan
(decided from the previous call) and fresh plan (decided from its own demand) simulated under
every named model: ``stale ÷ fresh`` geomean and worst call, and the calls whose family
changed from the previous call's (``switches``). The first call of a trace is not counted (the
op runs the safe plan there, which is not a stale decision).

Run: ``python benchmarks/bench_decide_ahead.py [--steps 30] [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from variopath_jax.planner.reference import PlannerParams
from variopath_jax.planner.schedulers import chooser_for
from variopath_jax.runner import evaluate
from variopath_jax.schedulers import unprofiled_networks
from variopath_jax.sim.network import NETWORK_MODELS
from variopath_jax.topology import PathModel
from variopath_jax.topology.presets import preset
from variopath_jax.traces import moving_trace

DEPLOYMENTS = (
    ("r5080-bf3", 2),
    ("l20-cx7", 1),
    ("r5090-bf3", 2),
    ("r5080-cx8", 2),
    ("r5080-bf3", 8),
)
MOTIONS = {"slow": {}, "fast": {"drift": 0.3, "burst_rate": 0.05}}
TOKENS, EXPERTS, TOP_K, TOKEN_BYTES = 128, 256, 8, 7168 * 2
LAMBDA_S = 20e-6


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def run(name: str, nodes: int, motion: str, steps: int) -> list[dict]:
    """One row per judging model for one deployment and kind of motion."""
    topo = preset(name, nodes)
    chooser = chooser_for(PathModel(topo), PlannerParams())
    planned_for = unprofiled_networks(LAMBDA_S)
    judges = list(NETWORK_MODELS.values())
    trace = moving_trace(
        steps + 1, topo.num_ranks, TOKENS, experts=EXPERTS, top_k=TOP_K, seed=0, **MOTIONS[motion]
    )
    ratios: dict[str, list[float]] = {j.name: [] for j in judges}
    switches = 0
    previous = None
    for k in range(steps + 1):
        demand = trace.demand(k, TOKEN_BYTES)
        fresh_decision, _ = chooser.decide(demand, planned_for)
        if previous is not None:
            switches += previous.plan != fresh_decision.plan
            stale = chooser.apply(previous, demand, planned_for)
            fresh = chooser.apply(fresh_decision, demand, planned_for)
            for judge in judges:
                net = judge.replace(barrier_s=LAMBDA_S)
                _, s = evaluate(topo, stale, demand, net, invalid="raise")
                _, f = evaluate(topo, fresh, demand, net, invalid="raise")
                ratios[judge.name].append(s.completion_s / f.completion_s)
        previous = fresh_decision
        print(f"  {name} x{nodes} {motion}: call {k}", file=sys.stderr, flush=True)
    return [
        {
            "topology": name,
            "nodes": nodes,
            "gpus": topo.num_ranks,
            "motion": motion,
            "model": model,
            "calls": len(r),
            "switches": switches,
            "stale_over_fresh": geomean(r),
            "worst": max(r),
        }
        for model, r in ratios.items()
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="calls counted per trace")
    ap.add_argument("--quick", action="store_true", help="r5080-bf3 x 2 and l20-cx7 x 1 only")
    ap.add_argument("--json", action="store_true", help="one JSON document")
    args = ap.parse_args(argv)
    deployments = DEPLOYMENTS[:2] if args.quick else DEPLOYMENTS
    rows = [
        row
        for name, nodes in deployments
        for motion in MOTIONS
        for row in run(name, nodes, motion, args.steps)
    ]
    by_model: dict[str, list[float]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r["stale_over_fresh"])
    summary = {m: geomean(v) for m, v in by_model.items()}
    if args.json:
        print(json.dumps({"rows": rows, "stale_over_fresh_geomean": summary}, indent=1))
        return 0
    print(
        f"{'deployment':<16} {'motion':<6} {'model':<10} {'switches':>8} {'stale÷fresh':>12} {'worst':>7}"
    )
    for r in rows:
        label = f"{r['topology']} x{r['nodes']}"
        print(
            f"{label:<16} {r['motion']:<6} {r['model']:<10} {r['switches']:>4}/{r['calls']:<3} "
            f"{r['stale_over_fresh']:>12.4f} {r['worst']:>7.3f}"
        )
    for model, g in summary.items():
        print(f"{model}: stale ÷ fresh, geomean over deployments and motions: {g:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
