"""VarioPath against NCCL and pairwise in the simulator, and the cost of planning.

``results``: the points of issue 5 — MoE AlltoAllv with M in {8, 64, 128} tokens per rank and
Zipf s in {0.4, 0.6, 0.8} at 32 MiB per rank, on r5080-bf3, r5090-bf3 and l20-cx7 at 2 nodes (and
1 node, where the flat catalog applies) — with every scheduler simulated under the same λ and α,
printing VarioPath's completion-time speedup over each peer and its fraction of the lower bound
(``variopath_jax.solver.bound``: the flow LP or the endpoint bound, whichever is tighter).

``planning``: planning time per emitted activation and total planning time over simulated
communication time (O/C) for the paper's Table 4 deployments, 1 GiB per source (Zipf 0.6), with
the C++ core and the Python reference of Algorithm 2 (``planner/reference.py``), beside the
paper's figures.

``choice`` (issue 28 item 6): the default ``variopath`` scheduler's planning per call on the same
seven deployments, for Zipf 0.6 at 1 GiB per rank and MoE dispatch at M = 128. First what the op
pays: the C++ core's call, timed in C++ (``core µs``: the median of ``CALLS`` calls, with its
parts, and ``min µs`` the fastest; Algorithm 2 only where the deployment's screen keeps it and,
call by call, where its plans may pay for their planning, ``alg2``: ``ran``, ``kept`` by the
screen but not worth its planning this call, or ``out``; the paced split ``split µs``; deciding
on and building the chained plan ``chain µs``, with the core's planning estimate of it ``est
µs`` (``ChoiceCore::chained_work_s``, reproduced here from ffi/choice.h's constants), ``*``
where it was built; the other families and the predictions the rest), over the communication
time of the plan it chooses (its ``op plan``, predicted under ``pcie``, and O/C under
``pcie-fair`` and ``none`` beside, ``-`` under a model the choice was not made for: it is made
for the unprofiled models, ``pcie`` and ``pcie-fair``); then the same call as a process of the multi-host NCCL
transport makes it, for one rank (rank 0: every decision every rank's, a chosen paced plan
expanded only for the transfers the rank sends or receives; ``rank µs``, median, and its O/C
under ``pcie``). Then the whole registered ``variopath`` (the median of ``CALLS`` calls after a
first: finding its chooser and the core's call; ``plan µs``) over its chosen plan's
communication time, and what reading its schedule's steps as Python objects then costs (``IR
µs``, and per transfer ``µs/tr``: the transfers are built when first read,
``schedule.LazySteps``), beside the paper's µs per activation.

The cost benchmarks below measure the C++ core against the planning estimates it gates its
costly candidates with (ffi/choice.h: ``kChainedSPerColumnIteration``, ``kAlgorithm2SPerRank``,
``kAlgorithm2SPerScoredCell``, ``kSplitSPerUnit``, read from that header at run time, and the
estimates of ffi/choice.cc and ffi/chained.cc reproduced here from the deployment's routes):
the measurements behind those constants, each of which no measurement may exceed.

``chained``: what building the chained hybrid plan costs in the C++ core (``chain µs``: the
median of ``CALLS`` calls of ``NativeChooser.chained``, timed in C++, under the gaps of the
request's model of largest o + L + σ as the choice takes them, its rates stopped at the
endpoint bound: the choice stops them at the paced split's bound, never lower, so no earlier than
here) on the deployments where it exists (r5080-bf3 and l20-cx7, 1 and 2 nodes), for Zipf 0.6 at
64 MiB and 1 GiB per rank and MoE dispatch at M = 128 and 1024, per column and capped iteration
(``columns × iteration caps``, the units of ``ChoiceCore::chained_work_s``, from
``NativeChooser.planning_estimates``): the measurement
behind ``kChainedSPerColumnIteration``, which the largest of them must not exceed. Beside it
``in choice µs``: the choice's own ``hybrid_s`` (deciding, building and predicting ``chained``,
the median of ``CALLS`` calls with ``every=True``; ``-`` where the choice built none).

``algorithm2``: what one activation of Algorithm 2 costs in the C++ core (``NativePlanner``, the
median of 5 calls) on r5080-bf3 x 1, 2, 4 and 8, r5090-bf3 x 1 and 2 and l20-cx7 x 1 and 2, for MoE
dispatch at M = 128 and Zipf 0.6 at 8 MiB and 1 GiB per rank, against the per-activation estimate
of ``ChoiceCore::algorithm2_work_s`` (``kAlgorithm2SPerRank`` per rank plus
``kAlgorithm2SPerScoredCell`` per scored shape cell, ``native.scored_cells``), which no measured
activation may exceed, and the activations against their lower bound (the most peers a rank
sends to or receives from, the activations ``algorithm2_work_s`` counts): the measurement behind
the gate that runs Algorithm 2 only where its plans may pay for their planning.

``split``: what solving the paced split and summing its pieces costs in the C++ core (its
``split_s``, the median of ``CALLS`` calls, built whatever it costs: ``every=True``) on r5080-bf3
x 1, 2 and 8, r5090-bf3 x 1 and 2, l20-cx7 x 1 and 2 and r5080-cx8 x 1 and 32, for MoE dispatch at
M = 128 and 1024 and Zipf 0.6 at 64 MiB and 1 GiB per rank, against the estimate from above of
the units ``ChoiceCore::split_iterations`` counts at ``kSplitSPerUnit`` each (per iteration,
``kSplitIterations`` at most, every column's links and every link; then twice that and every
rank pair with demand), which no median may exceed, and the most iterations a call gives it
(``call its``: as many as may pay for their planning against the concurrent families; -1: not
solved): the measurement behind the gate on ``paced``. ``split_s`` times the paced plan's
prediction under every model too and, where a model has the posted-write trigger and the
deployment several root complexes, the rotation ``rot-paced`` (``rot``); ``alone µs`` is the
same median under the request's models without the trigger (``pcie-fair``): the split, its
pieces and their prediction, no rotation. ``rot µs`` (their difference) is the rotation's part,
against its own gate's estimate ``rot est µs`` (``kRotationSPerUnit`` per unit of its phase
aggregate), which it must not exceed.

``choice`` also runs R5080-BF3-64 (r5080-bf3 x 8, not in the paper's Table 4), where Algorithm 2
costs tens of milliseconds a call.

Run: ``python benchmarks/bench_planner.py results`` / ``... planning`` / ``... choice
[--only R5080-BF3-8,...]`` / ``... chained [--only r5080-bf3x1,...]`` / ``... algorithm2
[--only ...]`` / ``... split [--only ...]`` (``--json`` for JSON; ``--calls`` the calls timed
per point).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from variopath_jax import workloads
from variopath_jax.catalog import CatalogError, get_catalog
from variopath_jax.planner import PlannerParams, ReferencePlanner
from variopath_jax.planner.native import NativePlanner, scored_cells
from variopath_jax.runner import run_one
from variopath_jax.sim import FluidSimulator
from variopath_jax.solver.bound import lower_bound
from variopath_jax.topology import PathModel, preset

PEERS = ("nccl", "pairwise")
# ``choice`` times this many calls of the core per point and reports the median one (and the
# fastest): on a shared machine the least of a few calls swung 2.6x from run to run; ``chained``
# and ``split`` their medians too (``--calls``)
CALLS = 25


def gap_network(networks: tuple) -> object:
    """The model whose o + L + σ is largest, the first such: the chained plan's gaps take it
    (ffi/choice.cc ``ChoiceCore::choose``, ffi/decision.cc ``ChoiceCore::apply``)."""
    return max(
        networks, key=lambda m: m.issue_s + max(m.latency_pcie_s, m.latency_net_s) + m.signal_s
    )


def results(nodes_list: list[int]) -> list[dict]:
    rows = []
    for name in ("r5080-bf3", "r5090-bf3", "l20-cx7"):
        for nodes in nodes_list:
            topo = preset(name, nodes)
            model = PathModel(topo)
            try:
                get_catalog(topo)
            except CatalogError as err:
                rows.append({"topology": name, "nodes": nodes, "error": str(err)})
                continue
            n = topo.num_ranks
            points = [(f"moe M={m}", workloads.moe(n, m, seed=1)) for m in (8, 64, 128)]
            points += [
                (f"zipf s={s}", workloads.zipf(n, s, 32 << 20, seed=1)) for s in (0.4, 0.6, 0.8)
            ]
            for label, demand in points:
                per_rank = demand.sum() / n
                vario = run_one(model, "variopath", demand)
                row = {
                    "topology": name,
                    "nodes": nodes,
                    "workload": label,
                    "mib_per_rank": per_rank / 2**20,
                    "variopath_ms": vario.sim.completion_s * 1e3,
                    "activations": len(vario.schedule.steps),
                    "bound_fraction": lower_bound(demand, topo).best_s / vario.sim.completion_s,
                }
                for peer in PEERS:
                    t = run_one(model, peer, demand).sim.completion_s
                    row[f"{peer}_ms"] = t * 1e3
                    row[f"speedup_vs_{peer}"] = t / vario.sim.completion_s
                rows.append(row)
    return rows


# (label, preset, nodes, paper µs/activation, paper O/C %) from the paper's Table 4
TABLE4 = [
    ("R5080-BF3-8", "r5080-bf3", 1, 3.2, 0.0715),
    ("R5080-BF3-16", "r5080-bf3", 2, 20.6, 0.7554),
    ("R5080-CX8-256", "r5080-cx8", 32, 78.12, 4.1241),
    ("R5090-BF3-16", "r5090-bf3", 1, 8.3, 0.3249),
    ("R5090-BF3-32", "r5090-bf3", 2, 21.1, 1.1051),
    ("L20-CX7-16", "l20-cx7", 1, 6.8, 0.1476),
    ("L20-CX7-32", "l20-cx7", 2, 20.8, 0.7504),
]
# ``choice`` runs these too: user deployments the paper does not report
CHOICE_EXTRA = [("R5080-BF3-64", "r5080-bf3", 8, None, None)]


def planning(demands: int) -> list[dict]:
    rows = []
    for label, name, nodes, paper_us, paper_oc in TABLE4:
        topo = preset(name, nodes)
        model = PathModel(topo)
        row = {
            "deployment": label,
            "paper_us_per_activation": paper_us,
            "paper_oc_percent": paper_oc,
        }
        try:
            catalog = get_catalog(topo)
        except CatalogError as err:
            rows.append({**row, "error": str(err)})
            continue
        sim = FluidSimulator(topo)
        for impl, cls, count in (("cpp", NativePlanner, demands), ("python", ReferencePlanner, 1)):
            if impl == "python" and topo.num_ranks > 32:
                continue
            planner = cls(catalog, model, PlannerParams())
            plan_s = comm_s = 0.0
            acts = 0
            for seed in range(count):
                demand = workloads.zipf(topo.num_ranks, 0.6, 1 << 30, seed=seed)
                schedule = planner.plan(demand)
                plan_s += planner.stats.seconds
                acts += len(schedule.steps)
                comm_s += (
                    schedule.modeled_time()
                    if topo.num_ranks > 32
                    else sim.run(schedule).completion_s
                )
            row[f"{impl}_us_per_activation"] = plan_s / acts * 1e6
            row[f"{impl}_oc_percent"] = plan_s / comm_s * 100
            row[f"{impl}_activations"] = acts / count
        rows.append(row)
    return rows


def choice(only: list[str] | None) -> list[dict]:
    """Issue 28 item 6: µs per call of the default scheduler (module docstring)."""
    from variopath_jax.planner.schedulers import chooser_for, params_of
    from variopath_jax.schedulers import PlanRequest, get_scheduler

    rows = []
    for label, name, nodes, paper_us, _ in TABLE4 + CHOICE_EXTRA:
        if only and label not in only:
            continue
        topo = preset(name, nodes)
        model = PathModel(topo)
        n = topo.num_ranks
        for workload, demand in (
            ("zipf 1GiB", workloads.zipf(n, 0.6, 1 << 30, seed=0)),
            ("moe M=128", workloads.moe(n, 128, seed=0)),
        ):
            row = {"deployment": label, "workload": workload, "paper_us_per_activation": paper_us}
            try:
                req = PlanRequest(demand, model, 20e-6)
                chooser = chooser_for(model, params_of(req))
                kept = chooser.algorithm2_pays(req.networks)  # the deployment's screen
                chooser.choose(demand, req.networks, algorithm2=kept)  # warm: tables, workspace
                calls = sorted(
                    (
                        chooser.choose(demand, req.networks, algorithm2=kept)[1]
                        for _ in range(CALLS)
                    ),
                    key=lambda r: r["core_s"],
                )
                rec = calls[len(calls) // 2]  # the median call, with its parts
                # one rank's call, as each process of the NCCL transport makes it
                rank_s = sorted(
                    chooser.choose(demand, req.networks, algorithm2=kept, rank=0)[1]["core_s"]
                    for _ in range(CALLS)
                )[CALLS // 2]
                # the registered scheduler warm too: its per-deployment tables (catalog, the
                # core's) are built by its first call; then its median call
                # (each dropped before the next: 25 whole 256-GPU plans held at once slowed the
                # calls, 5.7 ms against 2.8 ms in two runs of this benchmark)
                get_scheduler("variopath").plan(req)
                plan_times = []
                for _ in range(CALLS):
                    sch = get_scheduler("variopath").plan(req)
                    plan_times.append(sch.meta["plan_s"])
                plan_s = sorted(plan_times)[CALLS // 2]
                read = time.perf_counter()
                transfers = sum(len(step.transfers) for step in sch.steps)
                ir_s = time.perf_counter() - read
            except (CatalogError, MemoryError) as err:
                rows.append({**row, "error": str(err)})
                continue
            comm = sch.meta["predicted_s"]["pcie"][sch.meta["plan"]]
            core_comm = rec["predicted_s"]["pcie"][rec["plan"]]
            # the op's plan under every model it chose for, and its core O/C under each
            by_model = {m: t[rec["plan"]] for m, t in rec["predicted_s"].items()}
            row |= {
                "core_comm_us_by_model": {m: t * 1e6 for m, t in by_model.items()},
                "core_oc_percent_by_model": {
                    m: rec["core_s"] / t * 100 for m, t in by_model.items()
                },
                "chained_built": "chained" in rec["predicted_s"]["pcie"],
                "chained_estimate_us": chooser.planning_estimates(demand)["chained_s"] * 1e6,
                "plan": sch.meta["plan"],
                "comm_us": comm * 1e6,
                "algorithm2": kept,
                "algorithm2_run": "barrier" in rec["predicted_s"]["pcie"],  # and it paid
                "core_plan": rec["plan"],
                "core_comm_us": core_comm * 1e6,
                "core_us": rec["core_s"] * 1e6,
                "core_min_us": calls[0]["core_s"] * 1e6,
                "alg2_us": rec["paper_s"] * 1e6,
                "split_us": rec["split_s"] * 1e6,
                "chained_us": rec["hybrid_s"] * 1e6,
                "core_oc_percent": rec["core_s"] / core_comm * 100,
                "core_rank_us": rank_s * 1e6,
                "core_rank_oc_percent": rank_s / core_comm * 100,
                "plan_us": plan_s * 1e6,
                "transfers": transfers,
                "ir_us": ir_s * 1e6,
                "ir_us_per_transfer": ir_s * 1e6 / max(transfers, 1),
                "plan_oc_percent": plan_s / comm * 100,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def deployments(points: list[tuple[str, int]], only: list[str] | None) -> list[tuple[str, int]]:
    """``points`` (preset, nodes), those ``only`` names (``r5080-bf3x2``) where it names any."""
    return [(n, k) for n, k in points if not only or f"{n}x{k}" in only]


def chained_cost(only: list[str] | None = None) -> list[dict]:
    """The chained plan's C++ planning per column and capped iteration (module docstring)."""
    from variopath_jax.planner.schedulers import chooser_for, params_of
    from variopath_jax.schedulers import PlanRequest

    rows = []
    points = [(name, nodes) for name in ("r5080-bf3", "l20-cx7") for nodes in (1, 2)]
    for name, nodes in deployments(points, only):
        model = PathModel(preset(name, nodes))
        n = model.topology.num_ranks
        for workload, demand in (
            ("zipf 64MiB", workloads.zipf(n, 0.6, 64 << 20, seed=1)),
            ("zipf 1GiB", workloads.zipf(n, 0.6, 1 << 30, seed=0)),
            ("moe M=128", workloads.moe(n, 128, seed=0)),
            ("moe M=1024", workloads.moe(n, 1024, seed=0)),
        ):
            req = PlanRequest(demand, model, 20e-6)
            chooser = chooser_for(model, params_of(req))
            network = gap_network(req.networks)
            # the endpoint bound: the choice's floor, the paced split's bound, is never lower
            rec = chooser.choose(demand, req.networks, algorithm2=False, every=True)[1]
            floor_s = rec["endpoint_s"]
            row = {"deployment": f"{name} x {nodes}", "workload": workload}
            if chooser.chained(demand, network, floor_s) is None:
                rows.append({**row, "error": "no chained plan (no root entry or no rate fits)"})
                continue
            seconds = sorted(
                chooser.chained(demand, network, floor_s).meta["core_s"] for _ in range(CALLS)
            )[CALLS // 2]
            # the same, as the choice pays it (built whatever it costs)
            calls = [
                chooser.choose(demand, req.networks, algorithm2=False, every=True)[1]
                for _ in range(CALLS)
            ]
            in_choice = [r["hybrid_s"] for r in calls if "chained" in r["regret"]]
            estimates = chooser.planning_estimates(demand)
            column_iterations = estimates["chained_column_iterations"]
            row |= {
                "column_iterations": column_iterations,
                "chained_us": seconds * 1e6,
                "in_choice_us": (
                    sorted(in_choice)[len(in_choice) // 2] * 1e6 if in_choice else None
                ),
                "estimate_us": estimates["chained_s"] * 1e6,
                "ns_per_column_iteration": seconds / column_iterations * 1e9,
                "estimate_ns": estimates["chained_s"] / column_iterations * 1e9,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def algorithm2_cost(only: list[str] | None = None) -> list[dict]:
    """Algorithm 2's cost per activation against the core's estimate (module docstring)."""
    from variopath_jax.planner.schedulers import _catalog, chooser_for, make_planner, params_of
    from variopath_jax.schedulers import PlanRequest

    rows = []
    points = [
        ("r5080-bf3", 1),
        ("r5080-bf3", 2),
        ("r5080-bf3", 4),
        ("r5080-bf3", 8),
        ("r5090-bf3", 1),
        ("r5090-bf3", 2),
        ("l20-cx7", 1),
        ("l20-cx7", 2),
    ]
    for name, nodes in deployments(points, only):
        model = PathModel(preset(name, nodes))
        n = model.topology.num_ranks
        cells = scored_cells(_catalog(model), model.topology)
        for workload, demand in (
            ("moe M=128", workloads.moe(n, 128, seed=0)),
            ("zipf 8MiB", workloads.zipf(n, 0.6, 8 << 20, seed=0)),
            ("zipf 1GiB", workloads.zipf(n, 0.6, 1 << 30, seed=0)),
        ):
            params = params_of(PlanRequest(demand, model, 20e-6))
            planner = make_planner(model, params)
            estimates = chooser_for(model, params).planning_estimates(demand)
            # the core's estimate per activation (its activations counted from below)
            estimate = estimates["algorithm2_s"] / estimates["algorithm2_activations"]
            planner.plan(demand)  # warm
            seconds = []
            for _ in range(5):
                planner.plan(demand)
                seconds.append(planner.stats.seconds)
            activations = planner.stats.activations
            per = sorted(seconds)[2] / activations
            row = {
                "deployment": f"{name} x {nodes}",
                "workload": workload,
                "scored_cells": cells,
                "activations": activations,
                "activations_bound": estimates["algorithm2_activations"],
                "us_per_activation": per * 1e6,
                "estimate_us_per_activation": estimate * 1e6,
                "measured_of_estimate": per / estimate,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def split_cost(only: list[str] | None = None) -> list[dict]:
    """The paced split's C++ cost against the core's estimate (module docstring)."""
    from variopath_jax.planner.schedulers import chooser_for, params_of
    from variopath_jax.schedulers import PlanRequest

    rows = []
    points = [
        ("r5080-bf3", 1),
        ("r5080-bf3", 2),
        ("r5080-bf3", 8),
        ("r5090-bf3", 1),
        ("r5090-bf3", 2),
        ("l20-cx7", 1),
        ("l20-cx7", 2),
        ("r5080-cx8", 1),
        ("r5080-cx8", 32),
    ]
    for name, nodes in deployments(points, only):
        model = PathModel(preset(name, nodes))
        n = model.topology.num_ranks
        for workload, demand in (
            ("moe M=128", workloads.moe(n, 128, seed=0)),
            ("moe M=1024", workloads.moe(n, 1024, seed=0)),
            ("zipf 64MiB", workloads.zipf(n, 0.6, 64 << 20, seed=1)),
            ("zipf 1GiB", workloads.zipf(n, 0.6, 1 << 30, seed=0)),
        ):
            req = PlanRequest(demand, model, 20e-6)
            chooser = chooser_for(model, params_of(req))
            kept = chooser.algorithm2_pays(req.networks)
            chooser.choose(demand, req.networks, algorithm2=kept, every=True)  # warm
            calls = [
                chooser.choose(demand, req.networks, algorithm2=kept, every=True)[1]
                for _ in range(CALLS)
            ]
            seconds = sorted(r["split_s"] for r in calls)[CALLS // 2]
            # the same under the request's models without the posted-write trigger: no rotation
            fair = tuple(m for m in req.networks if not m.trigger)
            chooser.choose(demand, fair, algorithm2=kept, every=True)  # warm
            alone = sorted(
                chooser.choose(demand, fair, algorithm2=kept, every=True)[1]["split_s"]
                for _ in range(CALLS)
            )[CALLS // 2]
            cap = chooser.choose(demand, req.networks, algorithm2=kept)[1]["split_iterations"]
            estimates = chooser.planning_estimates(demand)
            estimate = estimates["split_s"]
            row = {
                "deployment": f"{name} x {nodes}",
                "workload": workload,
                "units": round(estimates["split_units"]),
                "split_us": seconds * 1e6,
                "rotation": "yes" if "rot-paced" in calls[0]["regret"] else "no",
                "alone_us": alone * 1e6,
                "estimate_us": estimate * 1e6,
                "measured_of_estimate": seconds / estimate,
                "alone_of_estimate": alone / estimate,
                # the rotation's part (its phase aggregate, split and expansion) against the
                # gate's estimate of it (None: no rotation for this demand)
                "rotation_us": (seconds - alone) * 1e6,
                "rotation_estimate_us": (
                    None
                    if estimates["rotation_s"] is None
                    else round(estimates["rotation_s"] * 1e6, 1)
                ),
                "call_iterations": cap,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """``rows`` as a table: per column its header, the row's key and a format spec (width
    first: ``"<15"``, ``">10.1f"``); a row with an ``error`` prints its first two cells and it."""
    print("".join(f"{head:{spec.split('.')[0].rstrip('df')}}" for head, _, spec in columns))
    for r in rows:
        if "error" in r:
            first = "".join(f"{r[key]:{spec}}" for _, key, spec in columns[:2])
            print(f"{first}  {r['error']}")
            continue
        print("".join(f"{r[key]:{spec}}" for _, key, spec in columns))


def print_cost(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """A cost benchmark's ``rows`` as a table (``print_table``), then its row of the most
    ``measured_of_estimate``."""
    print_table(rows, columns)
    top = max(rows, key=lambda r: r["measured_of_estimate"])
    print(
        f"most of the estimate: {top['measured_of_estimate']:.2f} ({top['deployment']}, "
        f"{top['workload']})"
    )


# The cost suites printed alike (print_cost): what measures them and their columns
COST_SUITES = {
    "algorithm2": (
        algorithm2_cost,
        [
            ("deployment", "deployment", "<15"),
            ("workload", "workload", "<11"),
            ("cells", "scored_cells", ">10"),
            ("acts", "activations", ">6"),
            ("≥ acts", "activations_bound", ">7"),
            ("µs/act", "us_per_activation", ">10.1f"),
            ("est µs/act", "estimate_us_per_activation", ">11.1f"),
            ("of est", "measured_of_estimate", ">8.2f"),
        ],
    ),
    "split": (
        split_cost,
        [
            ("deployment", "deployment", "<15"),
            ("workload", "workload", "<12"),
            ("units", "units", ">9"),
            ("split µs", "split_us", ">10.1f"),
            ("rot", "rotation", ">6"),
            ("alone µs", "alone_us", ">10.1f"),
            ("est µs", "estimate_us", ">9.1f"),
            ("of est", "measured_of_estimate", ">8.2f"),
            ("alone", "alone_of_estimate", ">7.2f"),
            ("rot µs", "rotation_us", ">9.1f"),
            ("rot est µs", "rotation_estimate_us", ">11"),
            ("call its", "call_iterations", ">10"),
        ],
    ),
}


def main() -> None:
    global CALLS
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "what", choices=("results", "planning", "choice", "chained", "algorithm2", "split")
    )
    parser.add_argument(
        "--only",
        default="",
        help="choice: comma-separated deployment labels (R5080-BF3-8,...); chained, algorithm2, "
        "split: comma-separated deployments (r5080-bf3x1,...)",
    )
    parser.add_argument(
        "--nodes", default="2", help="comma-separated node counts for results (default 2)"
    )
    parser.add_argument(
        "--demands", type=int, default=5, help="demands per deployment for planning (default 5)"
    )
    parser.add_argument(
        "--calls",
        type=int,
        default=CALLS,
        help=f"choice, chained, split: calls timed per point, the median reported (default {CALLS})",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    CALLS = max(args.calls, 1)
    only = [x for x in args.only.split(",") if x] or None
    if args.what == "chained":
        rows = chained_cost(only)
        if args.json:
            print(json.dumps(rows))
            return
        print(
            f"{'deployment':<15}{'workload':<12}{'col×its':>9}{'chain µs':>10}{'est µs':>10}"
            f"{'in choice µs':>14}{'ns/col/it':>10}"
        )
        for r in rows:
            if "error" in r:
                print(f"{r['deployment']:<15}{r['workload']:<12}  {r['error']}")
                continue
            in_choice = (
                f"{r['in_choice_us']:>14.1f}" if r["in_choice_us"] is not None else f"{'-':>14}"
            )
            print(
                f"{r['deployment']:<15}{r['workload']:<12}{r['column_iterations']:>9.0f}"
                f"{r['chained_us']:>10.1f}"
                f"{r['estimate_us']:>10.1f}{in_choice}{r['ns_per_column_iteration']:>10.1f}"
            )
        ok = [r for r in rows if "error" not in r]
        if ok:
            top = max(ok, key=lambda r: r["ns_per_column_iteration"])
            print(
                f"most: {top['ns_per_column_iteration']:.1f} ns ({top['deployment']}, "
                f"{top['workload']}); kChainedSPerColumnIteration (ffi/choice.h): "
                f"{top['estimate_ns']:.0f} ns"
            )
        return
    if args.what in COST_SUITES:
        measure, columns = COST_SUITES[args.what]
        rows = measure(only)
        if args.json:
            print(json.dumps(rows))
            return
        print_cost(rows, columns)
        if args.what == "split":
            top = max(rows, key=lambda r: r["alone_of_estimate"])
            print(
                f"most of the estimate without the rotation: {top['alone_of_estimate']:.2f} "
                f"({top['deployment']}, {top['workload']})"
            )
        return
    if args.what == "choice":
        rows = choice(only)
        if args.json:
            print(json.dumps(rows))
            return
        print(
            f"{'deployment':<15}{'workload':<11}{'op plan':<16}{'comm µs':>9}{'core µs':>10}"
            f"{'min µs':>9}{'alg2':>6}{'split µs':>10}{'chain µs':>10}{'est µs':>10}{'core O/C %':>11}"
            f"{'O/C pcie-fair':>15}{'O/C none':>10}{'rank µs':>9}{'rank O/C %':>11}"
            f"{'variopath':>16}{'plan µs':>11}{'plan O/C %':>11}{'IR µs':>11}{'µs/tr':>7}{'paper µs/act':>13}"
        )
        for r in rows:
            if "error" in r:
                print(f"{r['deployment']:<15}{r['workload']:<11}  {r['error']}")
                continue

            def oc(model: str, width: int, r: dict = r) -> str:
                """The core's O/C under ``model``, ``-`` where the choice was not made for it."""
                value = r["core_oc_percent_by_model"].get(model)
                return f"{'-':>{width}}" if value is None else f"{value:>{width}.2f}"

            print(
                f"{r['deployment']:<15}{r['workload']:<11}{r['core_plan']:<16}"
                f"{r['core_comm_us']:>9.1f}{r['core_us']:>10.1f}{r['core_min_us']:>9.1f}"
                f"{('ran' if r['algorithm2_run'] else 'kept' if r['algorithm2'] else 'out'):>6}"
                f"{r['split_us']:>10.1f}"
                f"{r['chained_us']:>10.1f}"
                f"{r['chained_estimate_us']:>9.1f}{'*' if r['chained_built'] else ' '}"
                f"{r['core_oc_percent']:>11.2f}"
                f"{oc('pcie-fair', 15)}{oc('none', 10)}"
                f"{r['core_rank_us']:>9.1f}{r['core_rank_oc_percent']:>11.2f}{r['plan']:>16}"
                f"{r['plan_us']:>11.1f}{r['plan_oc_percent']:>11.2f}{r['ir_us']:>11.1f}{r['ir_us_per_transfer']:>7.2f}"
                + (
                    f"{r['paper_us_per_activation']:>13.2f}"
                    if r["paper_us_per_activation"] is not None
                    else f"{'-':>13}"
                )
            )
        return
    if args.what == "results":
        rows = results([int(x) for x in args.nodes.split(",")])
        if args.json:
            print(json.dumps(rows))
            return
        print(
            f"{'topology':<12}{'n':>3} {'workload':<11}{'MiB/rank':>9}{'vario ms':>10}{'acts':>6}"
            f"{'x nccl':>8}{'x pairwise':>11}{'of bound':>9}"
        )
        for r in rows:
            if "error" in r:
                print(f"{r['topology']:<12}{r['nodes']:>3}  no catalog: {r['error']}")
                continue
            print(
                f"{r['topology']:<12}{r['nodes']:>3} {r['workload']:<11}{r['mib_per_rank']:>9.2f}"
                f"{r['variopath_ms']:>10.3f}"
                f"{r['activations']:>6}{r['speedup_vs_nccl']:>8.2f}{r['speedup_vs_pairwise']:>11.2f}"
                f"{r['bound_fraction']:>9.2f}"
            )
        ok = [r for r in rows if "error" not in r and r["mib_per_rank"] >= 1]
        wins = sum(r["speedup_vs_nccl"] > 1 and r["speedup_vs_pairwise"] > 1 for r in ok)
        geo = (
            float(np.exp(np.mean([np.log(r["speedup_vs_nccl"]) for r in ok])))
            if ok
            else float("nan")
        )
        print(
            f"VarioPath beats both peers on {wins}/{len(ok)} points with >= 1 MiB per rank; "
            f"geomean speedup over NCCL {geo:.2f}"
        )
    else:
        rows = planning(args.demands)
        if args.json:
            print(json.dumps(rows))
            return
        print(
            f"{'deployment':<15}{'C++ µs/act':>11}{'O/C %':>8}{'acts':>7}{'Py µs/act':>11}{'O/C %':>8}"
            f"   {'paper µs/act':>12}{'O/C %':>8}"
        )
        for r in rows:
            if "error" in r:
                print(f"{r['deployment']:<15}  no catalog: {r['error']}")
                continue
            py = (
                f"{r['python_us_per_activation']:>11.1f}{r['python_oc_percent']:>8.3f}"
                if "python_us_per_activation" in r
                else f"{'-':>11}{'-':>8}"
            )
            print(
                f"{r['deployment']:<15}{r['cpp_us_per_activation']:>11.1f}{r['cpp_oc_percent']:>8.3f}"
                f"{r['cpp_activations']:>7.0f}{py}   {r['paper_us_per_activation']:>12.2f}{r['paper_oc_percent']:>8.3f}"
            )


if __name__ == "__main__":
    main()
