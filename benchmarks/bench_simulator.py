"""Simulator speed: all-concurrent AlltoAll(v) (NCCL's schedule: every pair at once in one step).

Goals: the 64-GPU cases (4,032 transfers) simulate in under 1 s and the 256-GPU MoE AlltoAllv
(about 64,000 transfers of distinct sizes) in under 10 s, on a 2-core machine, under the
calibrated `pcie` network model; each case is timed under `pcie` and beside it under `none`. Also
prints how far the default coalescing tolerance moves the 64-GPU MoE result from the exact
simulation, under both models.
Run: ``python benchmarks/bench_simulator.py`` (``--json`` for machine-readable output,
``--coalesce EPS`` to time another tolerance, 0 for the exact simulation).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from variopath_jax import workloads
from variopath_jax.schedule import Schedule
from variopath_jax.schedulers import PlanRequest, get_scheduler
from variopath_jax.sim import DEFAULT_COALESCE, DEFAULT_LAMBDA_S, FluidSimulator, SimResult
from variopath_jax.topology import PathModel, Topology, preset

MODELS = ("pcie", "none")

CASES = [  # (preset, nodes, workload, MoE tokens per rank)
    ("r5080-bf3", 8, "uniform", 0),
    ("r5080-cx8", 32, "uniform", 0),
    ("r5080-bf3", 2, "moe", 128),
    ("r5080-bf3", 8, "moe", 128),
    ("r5080-cx8", 32, "moe", 1),
    ("r5080-cx8", 32, "moe", 128),
]
GOALS = {64: 1.0, 256: 10.0}  # GPUs -> seconds


def nccl_schedule(topo: Topology, kind: str, tokens: int) -> Schedule:
    n = topo.num_ranks
    demand = workloads.uniform(n, 1 << 20) if kind == "uniform" else workloads.moe(n, tokens)
    return get_scheduler("nccl").plan(PlanRequest(demand, PathModel(topo), DEFAULT_LAMBDA_S))


def timed(sim: FluidSimulator, schedule: Schedule, repeats: int) -> tuple[SimResult, float]:
    """The result and the best wall time of ``repeats`` runs."""
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        result = sim.run(schedule)
        best = min(best, time.perf_counter() - start)
    return result, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--coalesce", type=float, default=DEFAULT_COALESCE)
    args = parser.parse_args()
    rows = []
    for name, nodes, kind, tokens in CASES:
        topo = preset(name, nodes)
        schedule = nccl_schedule(topo, kind, tokens)
        for model in MODELS:
            sim = FluidSimulator(topo, model, coalesce=args.coalesce)
            result, wall = timed(sim, schedule, args.repeats)
            rows.append(
                {
                    "topology": name,
                    "gpus": topo.num_ranks,
                    "workload": kind if kind == "uniform" else f"moe M={tokens}",
                    "contention": model,
                    "transfers": schedule.num_transfers,
                    "events": result.events,
                    "sim_s": wall,
                    "simulated_ms": result.completion_s * 1e3,
                }
            )
    # the approximation: default tolerance against the exact simulation, 64-GPU MoE
    topo = preset("r5080-bf3", 8)
    schedule = nccl_schedule(topo, "moe", 128)
    errors = []
    for model in MODELS:
        exact, exact_s = timed(FluidSimulator(topo, model, coalesce=0), schedule, 1)
        approx, approx_s = timed(FluidSimulator(topo, model), schedule, 1)
        errors.append(
            {
                "gpus": topo.num_ranks,
                "contention": model,
                "coalesce": DEFAULT_COALESCE,
                "exact_ms": exact.completion_s * 1e3,
                "exact_events": exact.events,
                "exact_s": exact_s,
                "coalesced_ms": approx.completion_s * 1e3,
                "coalesced_events": approx.events,
                "coalesced_s": approx_s,
                "completion_rel_error": (approx.completion_s - exact.completion_s)
                / exact.completion_s,
                "transfer_max_rel_error": float(
                    np.max(np.abs(approx.transfer_end - exact.transfer_end) / exact.transfer_end)
                ),
            }
        )
    if args.json:
        print(json.dumps({"cases": rows, "coalescing_error": errors}))
        return
    print(f"coalesce = {args.coalesce:g}")
    print(
        f"{'topology':<12}{'GPUs':>6}{'workload':>14}{'model':>7}{'transfers':>11}{'events':>8}"
        f"{'wall s':>10}{'sim ms':>9}"
    )
    for r in rows:
        print(
            f"{r['topology']:<12}{r['gpus']:>6}{r['workload']:>14}{r['contention']:>7}"
            f"{r['transfers']:>11}{r['events']:>8}{r['sim_s']:>10.3f}{r['simulated_ms']:>9.4f}"
        )
    for r in rows:
        goal = GOALS.get(r["gpus"])
        if goal is not None:
            verdict = "met" if r["sim_s"] < goal else "NOT met"
            print(
                f"{r['gpus']}-GPU {r['workload']} ({r['contention']}): {r['transfers']} "
                f"transfers in {r['sim_s']:.3f} s (goal < {goal:g} s: {verdict})"
            )
    for e in errors:
        print(
            f"{e['gpus']}-GPU moe M=128 ({e['contention']}), exact: {e['exact_ms']:.6f} ms, "
            f"{e['exact_events']} events, {e['exact_s']:.3f} s; coalesce={e['coalesce']:g}: "
            f"{e['coalesced_ms']:.6f} ms, {e['coalesced_events']} events, "
            f"{e['coalesced_s']:.3f} s; completion {e['completion_rel_error']:+.1e}, worst "
            f"transfer {e['transfer_max_rel_error']:.1e} (relative)"
        )


if __name__ == "__main__":
    main()
