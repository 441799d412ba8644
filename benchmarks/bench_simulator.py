"""Simulator speed: an all-concurrent AlltoAll (NCCL's schedule: every pair at once in one step).

Goal (issue 3): the 64-GPU case (4,032 transfers) simulates in under 1 s on a 2-core machine.
Run: ``python benchmarks/bench_simulator.py`` (``--json`` for machine-readable output).
"""

from __future__ import annotations

import argparse
import json
import time

from variopath_jax import workloads
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import DEFAULT_LAMBDA_S, FluidSimulator
from variopath_jax.topology import PathModel, preset

CASES = [  # (preset, nodes, workload)
    ("r5080-bf3", 8, "uniform"),
    ("r5080-cx8", 32, "uniform"),
    ("r5080-bf3", 2, "moe"),
    ("r5080-bf3", 8, "moe"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for name, nodes, kind in CASES:
        topo = preset(name, nodes)
        model = PathModel(topo)
        n = topo.num_ranks
        demand = (
            workloads.uniform(n, 1 << 20) if kind == "uniform" else workloads.moe(n, 128, seed=0)
        )
        schedule = get_scheduler("nccl").plan(PlanRequest(demand, model, DEFAULT_LAMBDA_S))
        sim = FluidSimulator(topo)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            result = sim.run(schedule)
            times.append(time.perf_counter() - start)
        rows.append(
            {
                "topology": name,
                "gpus": n,
                "workload": kind,
                "transfers": schedule.num_transfers,
                "events": len(result.throughput),
                "sim_s": min(times),
                "simulated_ms": result.completion_s * 1e3,
            }
        )
    if args.json:
        print(json.dumps(rows))
        return
    print(
        f"{'topology':<12}{'GPUs':>6}{'workload':>10}{'transfers':>11}{'events':>8}{'wall s':>10}{'sim ms':>9}"
    )
    for r in rows:
        print(
            f"{r['topology']:<12}{r['gpus']:>6}{r['workload']:>10}{r['transfers']:>11}{r['events']:>8}"
            f"{r['sim_s']:>10.3f}{r['simulated_ms']:>9.3f}"
        )
    goal = next(r for r in rows if r["gpus"] == 64 and r["workload"] == "uniform")
    print(
        f"64-GPU all-concurrent AlltoAll: {goal['transfers']} transfers in {goal['sim_s']:.3f} s "
        f"(goal < 1 s: {'met' if goal['sim_s'] < 1 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
