"""``variopath run|plan|simulate``: one AlltoAllv call, through :mod:`variopath_jax.runner`."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from variopath_jax import runner, workloads
from variopath_jax.cli.common import (
    command,
    load_from_args,
    make_demand,
    model_options,
    network_from_args,
    network_options,
    network_summary,
    path_model_from_args,
    path_profile_option,
    plan_for_option,
    planner_dict,
    planner_options,
    sim_options,
    topology_options,
    workload_options,
)
from variopath_jax.errors import VarioPathError
from variopath_jax.sim import NetworkModel
from variopath_jax.topology import Topology


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``run``, ``plan`` and ``simulate``."""
    run = command(sub, "run", cmd_run, "plan, validate and simulate one AlltoAllv call", human_run)
    run.add_argument("--topology", required=True, help="preset name, 'sysfs', or a topology file")
    topology_options(run)
    run.add_argument(
        "--scheduler", required=True, help="a registered scheduler (nccl, pairwise, ...)"
    )
    workload_options(run)
    model_options(run)
    plan_for_option(run)
    previous_option(run)
    run.add_argument("--save-schedule", default=None, help="write the schedule (JSON IR) here")
    path_profile_option(run)
    planner_options(run)
    sim_options(run)

    plan = command(
        sub,
        "plan",
        cmd_plan,
        "plan and validate one AlltoAllv call; predict its time under the network model",
        human_plan,
    )
    plan.add_argument("--topology", required=True, help="preset name, 'sysfs', or a topology file")
    topology_options(plan)
    plan.add_argument(
        "--scheduler", default="variopath", help="a registered scheduler (default variopath)"
    )
    workload_options(plan)
    model_options(plan)
    plan_for_option(plan)
    previous_option(plan)
    plan.add_argument("--save-schedule", default=None, help="write the schedule (JSON IR) here")
    path_profile_option(plan)
    planner_options(plan)
    sim_options(plan)

    sim = command(
        sub, "simulate", cmd_simulate, "validate and simulate a saved schedule", human_run
    )
    sim.add_argument("--topology", required=True, help="the topology the schedule was planned for")
    topology_options(sim)
    sim.add_argument("--schedule", required=True, help="a schedule file (from run --save-schedule)")
    sim.add_argument(
        "--demand", default=None, help="the demand it must serve (default: what it serves)"
    )
    network_options(sim)
    sim_options(sim)


def previous_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--previous",
        default=None,
        help="--scheduler op: the call site's previous demand (.npy or CSV, as --demand), from "
        "which the op decided ahead what it applies to this one (default: this very demand)",
    )


def previous_demand(args: argparse.Namespace, topo: Topology) -> np.ndarray | None:
    """The demand of ``--previous`` (None when not given); refused for a scheduler other than
    ``op`` and for a matrix that is not a demand for this topology."""
    if args.previous is None:
        return None
    if args.scheduler != "op":
        raise VarioPathError(
            f"--previous is the call site's previous demand, from which the op decides ahead: "
            f"it needs --scheduler op, not {args.scheduler!r}, which decides nothing ahead"
        )
    try:
        return workloads.load_demand(args.previous, topo.num_ranks, args.drop_self)
    except workloads.DemandError as err:
        raise workloads.DemandError(f"--previous {err}") from None


def _context(topo: Topology, network: NetworkModel, workload: dict[str, Any]) -> dict[str, Any]:
    """The fields every document of these commands starts with: what ran, on what, judged by
    which network model."""
    return {"topology": topo.name, "fingerprint": topo.fingerprint, **workload} | network_summary(
        network
    )


def _planned(args: argparse.Namespace, invalid: str) -> tuple[dict[str, Any], runner.RunResult]:
    topo = load_from_args(args, args.topology)
    runner.check_size(topo)  # before the N×N demand exists
    model = path_model_from_args(args, topo)
    demand, workload = make_demand(args, topo)
    previous = previous_demand(args, topo)
    network = network_from_args(args)
    options = planner_dict(args) | ({} if previous is None else {"previous": previous})
    result = runner.run_one(
        model,
        args.scheduler,
        demand,
        network=network,
        seed=args.seed,
        options=options,
        coalesce=args.coalesce,
        invalid=invalid,
        plan_for=args.plan_for,
    )
    if args.save_schedule:
        result.schedule.save(args.save_schedule)
    meta = result.schedule.meta  # a model-aware scheduler's models, choice and predictions
    planned = {
        "planned_for": meta.get("networks"),
        "plan_choice": meta.get("plan"),
        "plan_regret": meta.get("regret"),
        "predicted_by_model": meta.get("predicted_s") if "networks" in meta else None,
    }
    if "decided_from" in meta:  # op: what it decided ahead, from which demand
        planned |= {
            "decided_from": meta["decided_from"],
            "previous": args.previous,
            "decision": meta["decision"],
        }
    return _context(topo, network, workload) | planned, result


def cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    context, result = _planned(args, invalid="simulate")
    return context | result.summary()


def cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    context, result = _planned(args, invalid="skip")
    return context | result.plan_summary() | {"saved": args.save_schedule}


def cmd_simulate(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax.schedule import Schedule

    topo = load_from_args(args, args.topology)
    schedule = Schedule.load(args.schedule)
    demand = workloads.load_demand(args.demand, topo.num_ranks) if args.demand else None
    network = network_from_args(args)
    result = runner.simulate_saved(topo, schedule, network, demand, coalesce=args.coalesce)
    workload = {"schedule": args.schedule} | ({"demand": args.demand} if args.demand else {})
    return _context(topo, network, workload) | result.summary()


def human_plan(out: dict[str, Any]) -> None:
    predicted = (
        f"predicted {out['predicted_s'] * 1e3:.3f} ms under {out['contention']}, "
        if out["predicted_s"] is not None
        else ""
    )
    ratio = f", O/C {out['plan_over_comm']:.1%}" if out["plan_over_comm"] is not None else ""
    saved = f", saved to {out['saved']}" if out["saved"] else ""
    if runner.plans_on_call_path(out["scheduler"]):
        planned = (
            f"planned in {out['plan_s'] * 1e3:.2f} ms "
            f"({out['plan_us_per_activation']:.1f} µs/activation{ratio}; catalog and setup "
            f"{out['setup_s'] * 1e3:.1f} ms)"
        )
    else:  # a peer's fixed algorithm: nothing is planned per call, so no O/C
        planned = (
            f"its schedule built here in {out['plan_s'] * 1e3:.2f} ms (to simulate it; "
            f"{out['scheduler']} plans nothing per call)"
        )
    print(
        f"{out['scheduler']} on {out['topology']} ({out['ranks']} ranks): "
        f"{out['activations']} activations, modeled {out['modeled_s'] * 1e3:.3f} ms (Eq. 2), "
        f"{predicted}{planned}, valid={out['valid']}{saved}"
    )
    for e in out["errors"][:5]:
        print("  invalid:", e)


def human_run(out: dict[str, Any]) -> None:
    planned = f"planned in {out['plan_s'] * 1e3:.2f} ms; " if out["plan_s"] is not None else ""
    if out.get("decided_from"):  # op: the planning left on its call path
        planned = (
            f"{out['plan_choice']} (decided ahead from the {out['decided_from']}), "
            f"{out['plan_s'] * 1e6:.1f} µs of planning on the call path (cold); "
        )
    print(
        f"{out['scheduler']} on {out['topology']} ({out['ranks']} ranks): {out['steps']} steps, "
        f"{out['transfers']} transfers, {out['total_bytes'] / 2**20:.2f} MiB in "
        f"{out['completion_s'] * 1e3:.3f} ms = {out['algbw_gbps']:.2f} GB/s algbw under "
        f"{out['contention']}; {planned}valid={out['valid']}"
    )
    for e in out["errors"][:5]:
        print("  invalid:", e)
